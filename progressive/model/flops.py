"""Analytic training FLOPs of the model that actually ran, from its config alone (works on the meta device).

Counted: every matrix multiply, at 2*m*n*k FLOPs (one multiply + one add per term), for B sequences of T tokens:

    per layer   q, o projections          2 * 2*B*T*d*(h*dh)
                k, v projections          2 * 2*B*T*d*(kv*dh)      (kv < h for grouped-query attention)
                scores Q K^T, weights * V 2 * 2*B*h*T*T*dh         (full T*T: causal masking skips no work)
                FFN                       m * 2*B*T*d*f             (m = 2; m = 3 for SwiGLU: gate, up, down)
    heads       LM head                   2*B*T*d*V
                BERT MLM head             2*B*T*(d*d + d*V)         (transform dense + decoder, every position)
                BERT pooler + classifier  2*B*(d*d + d*C)           (first token only)
                GPT-2 / Llama sequence    2*B*T*d*C                 (the score layer runs on every position;
                  classification                                      the last non-pad one is kept)
                ViT/DeiT classifier       2*B*d*C  (x2 with the DeiT distillation head)
                patch embedding (conv)    2*B*P*(c*p*p)*d           (P patches of p x p, c channels)

Training = forward + backward. The backward of a matmul computes the input gradient and the weight gradient,
two matmuls of the forward's size, so training counts 3x the forward. The one exception: the patch
embedding's input (pixels) needs no gradient, so its backward is the weight gradient only (2x in total).

Not counted: element-wise work (layer norms, softmax, GELU/SiLU, residual adds, dropout, rotary embeddings,
the loss) and embedding look-ups. These are O(B*T*d) against the O(B*T*d^2) matmuls, a few percent at the
tiny widths of the tests and less at real ones; torch.utils.flop_counter.FlopCounterMode does not count
them either, which is why the parity test compares like with like (tests/unit/model/test_flops.py).

Note: FlopCounterMode in torch 2.13 has no formula for the CPU fused attention kernel
(aten._scaled_dot_product_flash_attention_for_cpu), so on CPU it only sees attention when the model runs
with attn_implementation="eager"; the analytic count always includes attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["model_flops", "flops_breakdown", "frozen_training_flops", "tokens_per_step", "ModelShape",
           "model_shape", "Architecture", "ARCHITECTURES"]

@dataclass(frozen=True)
class ModelShape:
    """The sizes that determine FLOPs. extra_tokens: non-patch tokens (ViT: [CLS]; DeiT: [CLS] + distillation)."""

    arch: str
    d: int
    n_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    ffn_mats: int
    vocab: int
    num_labels: int
    head: str
    patches: int = 0
    patch_in: int = 0  # channels * patch_size**2
    extra_tokens: int = 0

    @property
    def label(self) -> str:
        """"4L/256d/4h": layers, width, heads."""
        return f"{self.n_layers}L/{self.d}d/{self.heads}h"


def model_shape(model_or_config, arch: str | None = None) -> ModelShape:
    """Read a ModelShape from an HF model (any device, meta included) or its config.

    Args:
        model_or_config: a transformers model or PretrainedConfig.
        arch: class name whose head to count; default: the model's class, else config.architectures[0],
            else the family's usual training class (GPT2LMHeadModel, BertForMaskedLM, ViTForImageClassification...).

    Raises:
        ValueError: unsupported model family or class.
    """
    config = getattr(model_or_config, "config", model_or_config)
    if arch is None and hasattr(model_or_config, "config"):
        arch = type(model_or_config).__name__
    if arch is None:
        known = ARCHITECTURES.get(config.model_type)
        arch = (getattr(config, "architectures", None) or [known.default if known else ""])[0]
    mt = config.model_type
    if arch not in _HEADS:
        raise ValueError(f"model_flops: unsupported class {arch!r} (model_type {mt!r}); supported: {sorted(_HEADS)}")
    if mt not in ARCHITECTURES:
        raise ValueError(f"model_flops: unsupported model_type {mt!r}; supported: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[mt].read(config, arch, _HEADS[arch], getattr(config, "num_labels", 2))


def _gpt2(config, arch: str, head: str, labels: int) -> ModelShape:
    d, h = config.n_embd, config.n_head
    return ModelShape(arch, d, config.n_layer, h, h, d // h, config.n_inner or 4 * d, 2, config.vocab_size, labels,
                      head)


def _llama(config, arch: str, head: str, labels: int) -> ModelShape:
    """Llama and its relatives (grouped-query attention, SwiGLU: three FFN matrices)."""
    d, h = config.hidden_size, config.num_attention_heads
    dh = getattr(config, "head_dim", None) or d // h
    kv = getattr(config, "num_key_value_heads", None) or h
    return ModelShape(arch, d, config.num_hidden_layers, h, kv, dh, config.intermediate_size, 3, config.vocab_size,
                      labels, head)


def _bert(config, arch: str, head: str, labels: int) -> ModelShape:
    d, h = config.hidden_size, config.num_attention_heads
    return ModelShape(arch, d, config.num_hidden_layers, h, h, d // h, config.intermediate_size, 2, config.vocab_size,
                      labels, head)


def _vision(extra_tokens: int):
    """ViT ([CLS]) and DeiT ([CLS] + distillation token): patches of p x p over c channels."""
    def read(config, arch: str, head: str, labels: int) -> ModelShape:
        d, h, p = config.hidden_size, config.num_attention_heads, config.patch_size
        return ModelShape(arch, d, config.num_hidden_layers, h, h, d // h, config.intermediate_size, 2, 0, labels,
                          head, patches=(config.image_size // p) ** 2, patch_in=config.num_channels * p * p,
                          extra_tokens=extra_tokens)
    return read


@dataclass(frozen=True)
class Architecture:
    """What the FLOPs count needs of one ``config.model_type``: ``read`` (its config -> ModelShape) and ``classes``,
    each class name with the head it puts on top of the trunk ("none": bare trunk; "pooler": BertModel/ViTModel
    pooler). The first class is the one counted when neither the model nor its config names one, and the one a
    family of progressive.model.build trains; a class whose head classifies text ("score", "pooler_cls") is the
    family's for ``model.task: classify``."""

    read: Callable[..., ModelShape]
    classes: dict[str, str]

    @property
    def default(self) -> str:
        return next(iter(self.classes))


# The architectures, by config.model_type: the one table of the model families' classes (progressive.model.build
# reads its families' classes from it and adds how to build and train them). A new family is a row here.
ARCHITECTURES = {
    "gpt2": Architecture(_gpt2, {"GPT2LMHeadModel": "lm", "GPT2Model": "none",
                                 "GPT2ForSequenceClassification": "score"}),
    "llama": Architecture(_llama, {"LlamaForCausalLM": "lm", "LlamaModel": "none",
                                   "LlamaForSequenceClassification": "score"}),
    "qwen2": Architecture(_llama, {"Qwen2ForCausalLM": "lm", "Qwen2Model": "none"}),
    "qwen3": Architecture(_llama, {"Qwen3ForCausalLM": "lm", "Qwen3Model": "none"}),
    "mistral": Architecture(_llama, {"MistralForCausalLM": "lm", "MistralModel": "none"}),
    "bert": Architecture(_bert, {"BertForMaskedLM": "mlm", "BertModel": "pooler",
                                 "BertForSequenceClassification": "pooler_cls"}),
    "vit": Architecture(_vision(1), {"ViTForImageClassification": "cls", "ViTModel": "pooler"}),
    "deit": Architecture(_vision(2), {"DeiTForImageClassification": "cls",
                                      "DeiTForImageClassificationWithTeacher": "cls2", "DeiTModel": "pooler"}),
}
_HEADS = {cls: head for a in ARCHITECTURES.values() for cls, head in a.classes.items()}  # class name -> its head
CLASSIFIES_TEXT = ("score", "pooler_cls")  # the heads of text classification (``model.task: classify``)


def flops_breakdown(model_or_config, batch_size: int, seq_len: int | None = None, training: bool = True,
                    n_layers: int | None = None, arch: str | None = None) -> dict[str, int]:
    """FLOPs by part: {"layers", "attention" (scores + values, included in layers), "head", "embed", "total",
    "head_input" (forward FLOPs of the head's matmuls that read the trunk's output)}.

    Same arguments as model_flops.
    """
    s = model_shape(model_or_config, arch)
    if s.patches:
        seq_len = s.patches + s.extra_tokens if seq_len is None else seq_len
    elif seq_len is None:
        raise ValueError("model_flops: seq_len is required for text models")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    L = s.n_layers if n_layers is None else n_layers
    if not 0 <= L <= s.n_layers:
        raise ValueError(f"n_layers={n_layers} outside [0, {s.n_layers}] for this model")
    B, T, d = batch_size, seq_len, s.d
    proj = 2 * B * T * d * (2 * s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim)
    attn = 2 * 2 * B * s.heads * T * T * s.head_dim
    ffn = s.ffn_mats * 2 * B * T * d * s.ffn
    head = {
        "none": 0,
        "lm": 2 * B * T * d * s.vocab,
        "mlm": 2 * B * T * (d * d + d * s.vocab),
        "pooler": 2 * B * d * d,
        "pooler_cls": 2 * B * (d * d + d * s.num_labels),
        "score": 2 * B * T * d * s.num_labels,
        "cls": 2 * B * d * s.num_labels,
        "cls2": 2 * 2 * B * d * s.num_labels,
    }[s.head]
    # the head's matmuls that read the trunk's output directly (the only ones that need its gradient)
    head_input = {"none": 0, "lm": head, "mlm": 2 * B * T * d * d, "pooler": head, "pooler_cls": 2 * B * d * d,
                  "score": head, "cls": head, "cls2": head}[s.head]
    embed = 2 * B * (T - s.extra_tokens) * s.patch_in * d if s.patches else 0
    f = 3 if training else 1
    qkv = 2 * B * T * d * (s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim)  # per layer, forward
    out = {"layers": f * L * (proj + attn + ffn), "attention": f * L * attn, "head": f * head,
           "embed": (2 if training else 1) * embed, "head_input": head_input, "qkv": qkv}
    out["total"] = out["layers"] + out["head"] + out["embed"]
    return out


def frozen_training_flops(model_or_config, batch_size: int, seq_len: int | None, frozen: int, pre_ln: bool,
                          skipped: int = 0, arch: str | None = None) -> int:
    """Training FLOPs of one step with the embeddings and the first ``frozen`` layers frozen and run without
    autograd (operators.freeze_prefix), of which the first ``skipped`` layers did not run at all (their
    output came from AutoCache).

    Frozen layers that run cost their forward (1x); trainable layers 3x. The prefix's output needs no
    gradient, so a matmul that reads it directly computes no input gradient: in a post-LN model (BERT)
    those are the first trainable layer's q, k, v projections, or, with every layer frozen, the head's
    first matmuls; in a pre-LN model (``pre_ln``: GPT-2, Llama, ViT) a trainable norm sits in between and
    nothing is saved. A frozen patch embedding costs its forward only. ``frozen = 0`` is plain training.
    Equal to torch's FlopCounterMode on every supported class (tests/unit/model/test_flops.py).
    """
    fwd = flops_breakdown(model_or_config, batch_size, seq_len, training=False, arch=arch)
    L = model_shape(model_or_config, arch).n_layers
    if not 0 <= skipped <= frozen <= L:
        raise ValueError(f"need 0 <= skipped <= frozen <= {L} layers, got skipped={skipped}, frozen={frozen}")
    if frozen == 0:
        return flops_breakdown(model_or_config, batch_size, seq_len, training=True, arch=arch)["total"]
    per_layer = fwd["layers"] // L
    layers = (frozen - skipped) * per_layer + 3 * (L - frozen) * per_layer
    head = 3 * fwd["head"]
    if not pre_ln:
        layers -= fwd["qkv"] if frozen < L else 0
        head -= fwd["head_input"] if frozen == L else 0
    return layers + head + fwd["embed"]


def model_flops(model_or_config, batch_size: int, seq_len: int | None = None, training: bool = True,
                n_layers: int | None = None, arch: str | None = None) -> int:
    """Analytic matmul FLOPs of one step on ``batch_size`` sequences of ``seq_len`` tokens.

    Args:
        model_or_config: a transformers model (meta device fine) or its config.
        batch_size: sequences (images) per step.
        seq_len: tokens per sequence; for ViT/DeiT the number of tokens (patches + [CLS] [+ distillation]),
            derived from the config when None.
        training: forward + backward (3x forward) if True, else forward only.
        n_layers: count only this many transformer layers (methods that run fewer); default all.
        arch: class name whose head to count when only a config is given (see model_shape).

    Returns:
        FLOPs as an int.

    Raises:
        ValueError: unsupported family/class, missing seq_len for text, n_layers out of range.
    """
    return flops_breakdown(model_or_config, batch_size, seq_len, training, n_layers, arch)["total"]


def tokens_per_step(batch_size: int, seq_len: int) -> int:
    """Tokens processed per optimizer step (batch_size * seq_len)."""
    return batch_size * seq_len
