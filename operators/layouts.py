"""The model families the operators support, as data (see ``operators.spec`` for the vocabulary).

Adding a family that shares a layout (e.g. another Llama-style decoder) means adding its model_type and
class names here; adding a new layout means adding a FamilySpec, not code paths.
"""

from __future__ import annotations

from typing import Any

from operators.spec import (
    F_IN,
    F_OUT,
    H_IN,
    H_OUT,
    KV_OUT,
    Q_IN,
    Q_OUT,
    QKV_OUT,
    ConfigFields,
    FamilySpec,
    OperatorError,
    Rule,
)

# GPT-2 stores its projections as transformers' Conv1D: weight is (in, out), the transpose of nn.Linear.
GPT2 = FamilySpec(
    name="gpt2",
    model_types=("gpt2",),
    classes=("GPT2LMHeadModel", "GPT2Model"),
    fields=ConfigFields(hidden="n_embd", heads="n_head", layers="n_layer", ffn="n_inner", ffn_default_ratio=4,
                        layer_index_flags=("scale_attn_by_inverse_layer_idx",)),
    layer_pattern=r"^((?:transformer\.)?h)\.(\d+)\.(.+)$",
    pre_ln=True,
    rules=(
        Rule(r"wte\.weight", (None, H_OUT)),
        Rule(r"wpe\.weight", (None, H_OUT)),
        Rule(r"ln_[12]\.(?:weight|bias)", (H_OUT,)),
        Rule(r"attn\.c_attn\.weight", (H_IN, QKV_OUT)),
        Rule(r"attn\.c_attn\.bias", (QKV_OUT,)),
        Rule(r"attn\.c_proj\.weight", (Q_IN, H_OUT), residual_out=True),
        Rule(r"attn\.c_proj\.bias", (H_OUT,), residual_out=True),
        Rule(r"mlp\.c_fc\.weight", (H_IN, F_OUT)),
        Rule(r"mlp\.c_fc\.bias", (F_OUT,)),
        Rule(r"mlp\.c_proj\.weight", (F_IN, H_OUT), residual_out=True),
        Rule(r"mlp\.c_proj\.bias", (H_OUT,), residual_out=True),
        Rule(r"ln_f\.(?:weight|bias)", (H_OUT,), head_norm=True),
        Rule(r"^lm_head\.weight", (None, H_IN)),
    ),
)

# BERT is post-LN: LayerNorm(x + sublayer(x)). Depth "identity" cannot be exact for it (LN(x) != x).
BERT = FamilySpec(
    name="bert",
    model_types=("bert",),
    classes=("BertForMaskedLM", "BertModel", "BertForSequenceClassification"),
    fields=ConfigFields(hidden="hidden_size", heads="num_attention_heads", layers="num_hidden_layers",
                        ffn="intermediate_size"),
    layer_pattern=r"^((?:bert\.)?encoder\.layer)\.(\d+)\.(.+)$",
    pre_ln=False,
    rules=(
        Rule(r"embeddings\.(?:word|position|token_type)_embeddings\.weight", (None, H_OUT)),
        Rule(r"embeddings\.LayerNorm\.(?:weight|bias)", (H_OUT,)),
        Rule(r"attention\.self\.(?:query|key|value)\.weight", (Q_OUT, H_IN)),
        Rule(r"attention\.self\.(?:query|key|value)\.bias", (Q_OUT,)),
        Rule(r"attention\.output\.dense\.weight", (H_OUT, Q_IN), residual_out=True),
        Rule(r"attention\.output\.dense\.bias", (H_OUT,), residual_out=True),
        Rule(r"attention\.output\.LayerNorm\.(?:weight|bias)", (H_OUT,)),
        Rule(r"intermediate\.dense\.weight", (F_OUT, H_IN)),
        Rule(r"intermediate\.dense\.bias", (F_OUT,)),
        Rule(r"layer\.\d+\.output\.dense\.weight", (H_OUT, F_IN), residual_out=True),
        Rule(r"layer\.\d+\.output\.dense\.bias", (H_OUT,), residual_out=True),
        Rule(r"layer\.\d+\.output\.LayerNorm\.(?:weight|bias)", (H_OUT,)),
        Rule(r"pooler\.dense\.weight", (H_OUT, H_IN)),
        Rule(r"pooler\.dense\.bias", (H_OUT,)),
        Rule(r"^classifier\.weight", (None, H_IN)),
        Rule(r"^classifier\.bias", (None,)),
        Rule(r"predictions\.transform\.dense\.weight", (H_OUT, H_IN)),
        Rule(r"predictions\.transform\.dense\.bias", (H_OUT,)),
        Rule(r"predictions\.transform\.LayerNorm\.(?:weight|bias)", (H_OUT,), head_norm=True),
        Rule(r"predictions\.decoder\.weight", (None, H_IN)),
        Rule(r"predictions\.(?:decoder\.)?bias", (None,)),
    ),
)

# ViT and DeiT share one layout in transformers 5 (pre-LN encoder, {q,k,v,o}_proj, mlp.fc1/fc2).
VIT = FamilySpec(
    name="vit",
    model_types=("vit", "deit"),
    classes=("ViTForImageClassification", "ViTModel", "DeiTForImageClassification",
             "DeiTForImageClassificationWithTeacher", "DeiTModel"),
    fields=ConfigFields(hidden="hidden_size", heads="num_attention_heads", layers="num_hidden_layers",
                        ffn="intermediate_size", follow_hidden=("pooler_output_size",)),
    layer_pattern=r"^((?:(?:vit|deit)\.)?layers)\.(\d+)\.(.+)$",
    pre_ln=True,
    rules=(
        Rule(r"embeddings\.(?:cls_token|distillation_token|mask_token)", (None, None, H_OUT)),
        Rule(r"embeddings\.position_embeddings", (None, None, H_OUT)),
        Rule(r"patch_embeddings\.projection\.weight", (H_OUT, None, None, None)),
        Rule(r"patch_embeddings\.projection\.bias", (H_OUT,)),
        Rule(r"attention\.[qkv]_proj\.weight", (Q_OUT, H_IN)),
        Rule(r"attention\.[qkv]_proj\.bias", (Q_OUT,)),
        Rule(r"attention\.o_proj\.weight", (H_OUT, Q_IN), residual_out=True),
        Rule(r"attention\.o_proj\.bias", (H_OUT,), residual_out=True),
        Rule(r"layernorm_(?:before|after)\.(?:weight|bias)", (H_OUT,)),
        Rule(r"mlp\.fc1\.weight", (F_OUT, H_IN)),
        Rule(r"mlp\.fc1\.bias", (F_OUT,)),
        Rule(r"mlp\.fc2\.weight", (H_OUT, F_IN), residual_out=True),
        Rule(r"mlp\.fc2\.bias", (H_OUT,), residual_out=True),
        Rule(r"(?:^|vit\.|deit\.)layernorm\.(?:weight|bias)", (H_OUT,)),
        Rule(r"pooler\.dense\.weight", (H_OUT, H_IN)),
        Rule(r"pooler\.dense\.bias", (H_OUT,)),
        Rule(r"^(?:classifier|cls_classifier|distillation_classifier)\.weight", (None, H_IN)),
        Rule(r"^(?:classifier|cls_classifier|distillation_classifier)\.bias", (None,)),
    ),
)

# Llama-style decoders: RoPE (head_dim unchanged), GQA (kv heads merge with the same pairing),
# SwiGLU gate/up/down, RMSNorm, tied or untied head. Qwen2 adds q/k/v biases; Qwen3 per-head q/k norms.
LLAMA = FamilySpec(
    name="llama",
    model_types=("llama", "qwen2", "mistral", "qwen3"),
    classes=("LlamaForCausalLM", "LlamaModel", "Qwen2ForCausalLM", "Qwen2Model", "MistralForCausalLM",
             "MistralModel", "Qwen3ForCausalLM", "Qwen3Model"),
    fields=ConfigFields(hidden="hidden_size", heads="num_attention_heads", layers="num_hidden_layers",
                        ffn="intermediate_size", kv_heads="num_key_value_heads"),
    layer_pattern=r"^((?:model\.)?layers)\.(\d+)\.(.+)$",
    pre_ln=True,
    rules=(
        Rule(r"embed_tokens\.weight", (None, H_OUT)),
        Rule(r"(?:input_layernorm|post_attention_layernorm)\.weight", (H_OUT,)),
        Rule(r"self_attn\.q_proj\.weight", (Q_OUT, H_IN)),
        Rule(r"self_attn\.q_proj\.bias", (Q_OUT,)),
        Rule(r"self_attn\.[kv]_proj\.weight", (KV_OUT, H_IN)),
        Rule(r"self_attn\.[kv]_proj\.bias", (KV_OUT,)),
        Rule(r"self_attn\.o_proj\.weight", (H_OUT, Q_IN), residual_out=True),
        Rule(r"self_attn\.o_proj\.bias", (H_OUT,), residual_out=True),
        Rule(r"self_attn\.[qk]_norm\.weight", (None,)),
        Rule(r"mlp\.(?:gate|up)_proj\.weight", (F_OUT, H_IN)),
        Rule(r"mlp\.(?:gate|up)_proj\.bias", (F_OUT,)),
        Rule(r"mlp\.down_proj\.weight", (H_OUT, F_IN), residual_out=True),
        Rule(r"mlp\.down_proj\.bias", (H_OUT,), residual_out=True),
        Rule(r"(?:^|model\.)norm\.weight", (H_OUT,), head_norm=True),
        Rule(r"^lm_head\.weight", (None, H_IN)),
    ),
)

FAMILIES: tuple[FamilySpec, ...] = (GPT2, BERT, VIT, LLAMA)


def supported_classes() -> list[str]:
    """All supported transformers class names, by family."""
    return [c for f in FAMILIES for c in f.classes]


def family_of(model_or_config: Any) -> FamilySpec:
    """Return the spec for a model (checked by class) or a config (checked by model_type).

    Raises:
        OperatorError: the class or model_type is not supported; the message lists what is.
    """
    is_config = hasattr(model_or_config, "model_type") and not hasattr(model_or_config, "state_dict")
    if is_config:
        mt = model_or_config.model_type
        for fam in FAMILIES:
            if mt in fam.model_types:
                return fam
        known = ", ".join(f"{f.name} ({'/'.join(f.model_types)})" for f in FAMILIES)
        raise OperatorError(f"unsupported model_type {mt!r}; supported families: {known}")
    cls = type(model_or_config).__name__
    for fam in FAMILIES:
        if cls in fam.classes:
            return fam
    lines = "; ".join(f"{f.name}: {', '.join(f.classes)}" for f in FAMILIES)
    raise OperatorError(f"unsupported model class {cls}; supported families: {lines}")
