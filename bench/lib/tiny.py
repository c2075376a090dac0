"""Tiny random models of every supported family (fp32, dropout 0) and their inputs: what the exactness benches
measure the operators on, and the tests prove them on (tests/tiny_models.py adds the random shapes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    DeiTModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
)

VOCAB = 61


@dataclass
class Shape:
    """Sizes of one tiny model: hidden = heads * head_dim."""

    cls: type
    heads: int
    head_dim: int
    layers: int
    ffn_mult: int
    kv_heads: int | None = None
    tied: bool = True


GPT2_CLASSES = (GPT2LMHeadModel, GPT2Model)
BERT_CLASSES = (BertForMaskedLM, BertModel, BertForSequenceClassification)
VIT_CLASSES = (ViTForImageClassification, DeiTForImageClassification, DeiTForImageClassificationWithTeacher,
               ViTModel, DeiTModel)
LLAMA_CLASSES = (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, Qwen3ForCausalLM, LlamaModel)
ALL_CLASSES = GPT2_CLASSES + BERT_CLASSES + VIT_CLASSES + LLAMA_CLASSES


def make_config(s: Shape):
    """The config for ``s`` with every dropout at 0."""
    hidden, ffn = s.heads * s.head_dim, s.heads * s.head_dim * s.ffn_mult
    if s.cls in GPT2_CLASSES:
        return GPT2Config(n_embd=hidden, n_head=s.heads, n_layer=s.layers, n_inner=ffn, vocab_size=VOCAB,
                          n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          bos_token_id=0, eos_token_id=0, tie_word_embeddings=s.tied)
    common = dict(hidden_size=hidden, num_attention_heads=s.heads, num_hidden_layers=s.layers,
                  intermediate_size=ffn)
    if s.cls in BERT_CLASSES:
        return BertConfig(**common, vocab_size=VOCAB, max_position_embeddings=32, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, num_labels=3, pad_token_id=0,
                          tie_word_embeddings=s.tied)
    if s.cls in VIT_CLASSES:
        cfg_cls = ViTConfig if s.cls in (ViTForImageClassification, ViTModel) else DeiTConfig
        return cfg_cls(**common, image_size=8, patch_size=4, num_channels=3, num_labels=5,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    cfg_cls = {LlamaForCausalLM: LlamaConfig, LlamaModel: LlamaConfig, Qwen2ForCausalLM: Qwen2Config,
               MistralForCausalLM: MistralConfig, Qwen3ForCausalLM: Qwen3Config}
    return cfg_cls[s.cls](**common, num_key_value_heads=s.kv_heads or s.heads, head_dim=s.head_dim, vocab_size=VOCAB,
                          max_position_embeddings=64, tie_word_embeddings=s.tied, attention_dropout=0.0,
                          bos_token_id=1, eos_token_id=2, pad_token_id=0)


def make_model(s: Shape, seed: int = 0) -> torch.nn.Module:
    """A random model for ``s`` in eval mode, with non-trivial norm parameters (so scales matter)."""
    torch.manual_seed(seed)
    model = s.cls(make_config(s)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def make_inputs(model: torch.nn.Module, batch: int = 2, seq: int = 7, seed: int = 1) -> dict:
    """A batch the model accepts (token ids, or pixel values for ViT/DeiT)."""
    g = torch.Generator().manual_seed(seed)
    if type(model) in VIT_CLASSES:
        return {"pixel_values": torch.randn(batch, 3, 8, 8, generator=g)}
    ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
    out = {"input_ids": ids}
    if type(model) in BERT_CLASSES:
        out["token_type_ids"] = torch.randint(0, 2, (batch, seq), generator=g)
    return out


def main_output(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """The tensor a test compares: logits for models with a head, else the last hidden state."""
    out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
