"""Analytic FLOPs vs torch.utils.flop_counter.FlopCounterMode, for every family, forward and forward+backward.

Models run with attn_implementation="eager": FlopCounterMode has no formula for the CPU fused attention
kernel, so only eager attention (plain matmuls) is visible to it; the analytic count always includes attention.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)

from progressive.model.flops import flops_breakdown, model_flops

B, T = 2, 32
EAGER = {"attn_implementation": "eager"}
GPT2 = dict(vocab_size=256, n_positions=64, n_embd=48, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
BERT = dict(vocab_size=256, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
            max_position_embeddings=64)
LLAMA = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=112, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
VIT = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=96, num_labels=10)

FAMILIES = {
    "GPT2LMHeadModel": lambda: GPT2LMHeadModel(GPT2Config(**GPT2, **EAGER)),
    "GPT2Model": lambda: GPT2Model(GPT2Config(**GPT2, **EAGER)),
    "BertForMaskedLM": lambda: BertForMaskedLM(BertConfig(**BERT, **EAGER)),
    "BertModel": lambda: BertModel(BertConfig(**BERT, **EAGER)),
    "BertForSequenceClassification": lambda: BertForSequenceClassification(BertConfig(**BERT, num_labels=3, **EAGER)),
    "LlamaForCausalLM": lambda: LlamaForCausalLM(LlamaConfig(**LLAMA, **EAGER)),
    "GPT2ForSequenceClassification": lambda: GPT2ForSequenceClassification(
        GPT2Config(**GPT2, num_labels=3, pad_token_id=0, **EAGER)),
    "LlamaForSequenceClassification": lambda: LlamaForSequenceClassification(
        LlamaConfig(**LLAMA, num_labels=3, pad_token_id=0, **EAGER)),
    "Qwen2ForCausalLM": lambda: Qwen2ForCausalLM(Qwen2Config(**LLAMA, **EAGER)),
    "MistralForCausalLM": lambda: MistralForCausalLM(MistralConfig(**LLAMA, **EAGER)),
    "Qwen3ForCausalLM": lambda: Qwen3ForCausalLM(Qwen3Config(**LLAMA, head_dim=16, **EAGER)),
    "ViTForImageClassification": lambda: ViTForImageClassification(ViTConfig(**VIT, **EAGER)),
    "DeiTForImageClassification": lambda: DeiTForImageClassification(DeiTConfig(**VIT, **EAGER)),
    "DeiTForImageClassificationWithTeacher": lambda: DeiTForImageClassificationWithTeacher(DeiTConfig(**VIT, **EAGER)),
}


def _inputs(model):
    if model.config.model_type in ("vit", "deit"):
        return {"pixel_values": torch.randn(B, 3, 32, 32)}
    return {"input_ids": torch.randint(1, 256, (B, T))}  # no pad (id 0): sequence classifiers pool the last token


def _output_sum(out):
    return sum(v.float().sum() for v in out.values() if torch.is_tensor(v))


def _counted(model, training: bool) -> int:
    inputs = _inputs(model)
    with FlopCounterMode(display=False) as fc:
        if training:
            _output_sum(model(**inputs)).backward()
        else:
            with torch.no_grad():
                model(**inputs)
    return fc.get_total_flops()


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("training", [False, True], ids=["forward", "train"])
def test_analytic_flops_match_flop_counter_within_5_percent(name, training):
    torch.manual_seed(0)
    model = FAMILIES[name]()
    assert type(model).__name__ == name
    tokens = None if model.config.model_type in ("vit", "deit") else T
    analytic = model_flops(model, B, tokens, training=training)
    counted = _counted(model, training)
    assert abs(analytic - counted) / counted < 0.05, (name, analytic, counted)


def test_attention_share_is_counted_for_long_sequences():
    model = GPT2LMHeadModel(GPT2Config(**{**GPT2, "n_positions": 256}, **EAGER))
    parts = flops_breakdown(model, 1, 256, training=False)
    with_attn = parts["total"]
    counted = _counted_at(model, 256)
    assert parts["attention"] / with_attn > 0.2  # at T=256, d=48 attention is a large share ...
    assert abs(with_attn - counted) / counted < 0.02  # ... and it is in the reference count too


def _counted_at(model, seq_len):
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(input_ids=torch.randint(0, 256, (1, seq_len)))
    return fc.get_total_flops()


def test_config_alone_on_meta_device_gives_the_same_count():
    cfg = LlamaConfig(**LLAMA)
    with torch.device("meta"):
        meta_model = LlamaForCausalLM(cfg)
    assert model_flops(cfg, 4, 128) == model_flops(meta_model, 4, 128) == model_flops(LlamaForCausalLM(cfg), 4, 128)
    assert model_flops(BertConfig(**BERT), 4, 128) == model_flops(BertForMaskedLM(BertConfig(**BERT)), 4, 128)


def test_gqa_counts_smaller_kv_projections():
    full = model_flops(LlamaConfig(**{**LLAMA, "num_key_value_heads": 4}), 1, 16, training=False)
    gqa = model_flops(LlamaConfig(**LLAMA), 1, 16, training=False)
    # k and v each shrink from d*d to d*d/2: 2 layers * 2 projections * 2*T*d*(d/2) FLOPs fewer
    assert full - gqa == 2 * 2 * 2 * 16 * 64 * 32


def test_n_layers_counts_only_those_layers():
    cfg = GPT2Config(**GPT2)
    one = GPT2Config(**{**GPT2, "n_layer": 1})
    assert model_flops(cfg, 2, 32, n_layers=1) == model_flops(one, 2, 32)
    assert model_flops(cfg, 2, 32, n_layers=0) == flops_breakdown(cfg, 2, 32)["head"]
    with pytest.raises(ValueError, match="n_layers=3"):
        model_flops(cfg, 2, 32, n_layers=3)


def test_training_is_three_times_forward_for_text():
    cfg = BertConfig(**BERT)
    assert model_flops(cfg, 2, 32, training=True) == 3 * model_flops(cfg, 2, 32, training=False)


def test_unsupported_family_and_missing_seq_len_are_errors():
    with pytest.raises(ValueError, match="unsupported"):
        model_flops(GPT2Config(**GPT2), 1, 8, arch="T5ForConditionalGeneration")
    with pytest.raises(ValueError, match="seq_len"):
        model_flops(GPT2Config(**GPT2), 1)


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("frozen", [1, 2])
def test_frozen_prefix_flops_match_flop_counter_exactly(name, frozen):
    """freeze_prefix runs the prefix without autograd; the counter sees every backward matmul that ran."""
    from operators import family_of
    from operators.freeze import freeze_prefix
    from progressive.model.flops import frozen_training_flops

    torch.manual_seed(0)
    model = FAMILIES[name]()
    freeze_prefix(model, frozen)
    tokens = None if model.config.model_type in ("vit", "deit") else T
    analytic = frozen_training_flops(model, B, tokens, frozen, family_of(model.config).pre_ln)
    assert analytic == _counted(model, training=True)
    assert analytic < model_flops(model, B, tokens, training=True)
