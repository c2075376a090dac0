"""Properties of coalesce / de-coalesce / interpolate on random small models of every family."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import (
    ALL_CLASSES,
    BERT_CLASSES,
    GPT2_CLASSES,
    LLAMA_CLASSES,
    VIT_CLASSES,
    Shape,
    main_output,
    make_inputs,
    make_model,
    shapes,
)
from transformers import BertForMaskedLM, GPT2LMHeadModel, LlamaForCausalLM

import operators as ops
from operators import maps

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRE_LN = GPT2_CLASSES + VIT_CLASSES + LLAMA_CLASSES


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def expand_hidden(h_small: torch.Tensor, k: int, pairing: str) -> torch.Tensor:
    """What a duplicated residual stream looks like: unit i of the large model = unit small_of(i)."""
    return h_small.index_select(-1, maps.small_of(h_small.shape[-1] * k, k, pairing))


def assert_same_function(small, large, k: int, pairing: str, tol: float = 1e-5) -> float:
    x = make_inputs(small)
    with torch.no_grad():
        ref, out = main_output(small, x), main_output(large, x)
    if out.shape != ref.shape:  # base models: the large hidden state is the duplicated small one
        ref = expand_hidden(ref, k, pairing)
    err = rel_err(out, ref)
    assert err <= tol, f"{type(small).__name__}: max|diff|/max|ref| = {err:.2e}"
    return err


@SETTINGS
@given(shape=shapes(k=1, depth=1), k=st.sampled_from([2, 3]), pairing=st.sampled_from(["stride", "adjacent"]))
def test_decoalesce_width_preserves_outputs_every_family(shape, k, pairing):
    small = make_model(shape)
    large = ops.decoalesce(small, width=k, pairing=pairing)
    assert type(large) is type(small)
    assert_same_function(small, large, k, pairing)


@SETTINGS
@given(shape=shapes(classes=PRE_LN, k=1, depth=1), depth=st.sampled_from([2, 3]),
       pairing=st.sampled_from(["stride", "adjacent"]), depth_pairing=st.sampled_from(["stride", "adjacent"]))
def test_decoalesce_depth_identity_preserves_outputs_pre_ln(shape, depth, pairing, depth_pairing):
    small = make_model(shape)
    large = ops.decoalesce(small, width=2, depth=depth, pairing=pairing, depth_pairing=depth_pairing,
                           depth_mode="identity")
    assert ops.family_of(large).sizes(large.config)["layers"] == depth * shape.layers
    assert_same_function(small, large, 2, pairing)


@SETTINGS
@given(shape=shapes(k=1, depth=1), pairing=st.sampled_from(["stride", "adjacent"]),
       depth_pairing=st.sampled_from(["stride", "adjacent"]))
def test_coalesce_decoalesce_round_trip_is_exact(shape, pairing, depth_pairing):
    m = make_model(shape)
    back = ops.coalesce(ops.decoalesce(m, 2, 2, pairing, depth_pairing), 2, 2, pairing, depth_pairing)
    a, b = m.state_dict(), back.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert back.config.to_dict() == m.config.to_dict()


@pytest.mark.parametrize("k", [3, 4])
def test_round_trip_other_factors_to_fp32_rounding(k):
    m = make_model(Shape(LlamaForCausalLM, heads=2, head_dim=4, layers=2, ffn_mult=2, kv_heads=1))
    back = ops.coalesce(ops.decoalesce(m, k, 2), k, 2)
    for name, t in m.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], t, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_coalesce_shrinks_config_and_keeps_head_dim(cls):
    m = make_model(Shape(cls, heads=4, head_dim=8, layers=4, ffn_mult=2, kv_heads=2))
    small = ops.coalesce(m, width=2, depth=2)
    spec = ops.family_of(m)
    a, b = spec.sizes(m.config), spec.sizes(small.config)
    assert b == {**a, "hidden": a["hidden"] // 2, "heads": a["heads"] // 2, "kv_heads": a["kv_heads"] // 2,
                 "ffn": a["ffn"] // 2, "layers": a["layers"] // 2}
    assert b["head_dim"] == a["head_dim"] == 8
    with torch.no_grad():
        assert torch.isfinite(main_output(small, make_inputs(small))).all()


def test_gqa_shapes_after_coalesce_and_decoalesce():
    m = make_model(Shape(LlamaForCausalLM, heads=8, head_dim=4, layers=2, ffn_mult=2, kv_heads=4, tied=False))
    small = ops.coalesce(m, width=2)
    attn = small.model.layers[0].self_attn
    assert small.config.num_attention_heads == 4 and small.config.num_key_value_heads == 2
    assert attn.q_proj.weight.shape == (16, 16) and attn.k_proj.weight.shape == (8, 16)
    assert attn.v_proj.weight.shape == (8, 16) and attn.o_proj.weight.shape == (16, 16)
    mqa = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=1))
    big = ops.decoalesce(mqa, width=2)
    assert big.config.num_key_value_heads == 2 and big.model.layers[0].self_attn.k_proj.weight.shape == (8, 32)


@pytest.mark.parametrize("cls", [GPT2LMHeadModel, BertForMaskedLM, LlamaForCausalLM], ids=lambda c: c.__name__)
def test_tied_head_stays_tied_and_exact(cls):
    small = make_model(Shape(cls, heads=2, head_dim=4, layers=2, ffn_mult=2, tied=True))
    large = ops.decoalesce(small, width=2)
    assert ops.head_is_tied(large)
    assert len(list(large.parameters())) == len(list(small.parameters()))
    assert_same_function(small, large, 2, "stride")


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_interpolate_endpoints_are_exact(alpha):
    a = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2), seed=0)
    b = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2), seed=1)
    mixed = ops.interpolate(a, b, alpha)
    ref = (a if alpha == 0.0 else b).state_dict()
    for name, t in mixed.state_dict().items():
        assert torch.equal(t, ref[name]), name
    assert ops.head_is_tied(mixed)


def test_interpolate_is_convex_combination_by_name():
    a = make_model(Shape(BertForMaskedLM, heads=2, head_dim=4, layers=2, ffn_mult=2), seed=0)
    b = make_model(Shape(BertForMaskedLM, heads=2, head_dim=4, layers=2, ffn_mult=2), seed=1)
    mixed = ops.interpolate(a, b, 0.25)
    sa, sb = a.state_dict(), b.state_dict()
    for name, t in mixed.state_dict().items():
        torch.testing.assert_close(t, 0.75 * sa[name] + 0.25 * sb[name], rtol=1e-6, atol=1e-7)
    inplace = ops.interpolate(a, b, 0.25, inplace=True)
    assert inplace is a
    torch.testing.assert_close(a.state_dict()["cls.predictions.bias"], mixed.state_dict()["cls.predictions.bias"])


def test_decoalesced_model_round_trips_save_pretrained(tmp_path):
    small = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2))
    large = ops.decoalesce(small, width=2, depth=2, depth_mode="identity")
    large.save_pretrained(tmp_path / "ckpt")
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt").eval()
    x = make_inputs(small)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**x).logits, large(**x).logits)
        assert rel_err(loaded(**x).logits, small(**x).logits) <= 1e-5


def test_source_model_is_not_modified_and_shares_no_storage():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    same = ops.decoalesce(m, width=1, depth=1)
    big = ops.decoalesce(m, width=1, depth=2)
    ptrs = {p.data_ptr() for p in m.parameters()}
    assert not ptrs & {p.data_ptr() for p in same.parameters()}
    assert not ptrs & {p.data_ptr() for p in big.parameters()}
    layer_ptrs = [big.transformer.h[i].attn.c_attn.weight.data_ptr() for i in range(4)]
    assert len(set(layer_ptrs)) == 4
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])


def test_per_layer_config_fields_follow_depth_map():
    from transformers import Qwen2ForCausalLM

    m = make_model(Shape(Qwen2ForCausalLM, heads=2, head_dim=4, layers=2, ffn_mult=2))
    m.config.layer_types = ["full_attention", "sliding_attention"]
    big = ops.decoalesce(m, width=1, depth=2, depth_pairing="stride")
    assert big.config.layer_types == ["full_attention", "sliding_attention"] * 2
    assert ops.coalesce(big, width=1, depth=2, depth_pairing="stride").config.layer_types == m.config.layer_types


def test_bert_classes_share_one_spec():
    assert {ops.family_of(make_model(Shape(c, 2, 4, 2, 2))).name for c in BERT_CLASSES} == {"bert"}
