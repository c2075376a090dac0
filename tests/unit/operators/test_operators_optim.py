"""Optimizer state across a size change: moments map like gradients (the dual map)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import (
    ALL_CLASSES,
    GPT2_CLASSES,
    LLAMA_CLASSES,
    VIT_CLASSES,
    Shape,
    main_output,
    make_inputs,
    make_model,
)
from transformers import GPT2LMHeadModel, LlamaForCausalLM

import operators as ops

HEADED = [c for c in ALL_CLASSES if c.__name__.endswith(("LMHeadModel", "ForMaskedLM", "Classification",
                                                          "CausalLM", "WithTeacher"))]


def grads(model, inputs, weights):
    """Gradients of a fixed scalar function of the output (identical for both models if outputs are)."""
    model.zero_grad()
    (main_output(model, inputs) * weights).sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cls", HEADED, ids=lambda c: c.__name__)
@pytest.mark.parametrize("tied", [True, False])
def test_mapped_small_gradient_equals_large_gradient_every_family(cls, tied):
    small = make_model(Shape(cls, heads=2, head_dim=4, layers=2, ffn_mult=2, kv_heads=1, tied=tied))
    depth_mode = "identity" if cls in GPT2_CLASSES + VIT_CLASSES + LLAMA_CLASSES else "copy"
    depth = 2 if depth_mode == "identity" else 1
    large = ops.decoalesce(small, width=2, depth=depth, depth_mode=depth_mode)
    x = make_inputs(small)
    with torch.no_grad():
        w = torch.randn_like(main_output(small, x))
    g_s, g_l = grads(small, x, w), grads(large, x, w)
    state = {n: {"exp_avg": g, "exp_avg_sq": g * g, "step": torch.tensor(7.0)} for n, g in g_s.items()}
    mapped = ops.map_optimizer_state(state, small, "decoalesce", width=2, depth=depth, depth_mode=depth_mode)
    scale = max(g.abs().max().item() for g in g_l.values())
    assert mapped, "nothing mapped"
    for name, st in mapped.items():
        if name not in g_l:  # a parameter this head does not use (no gradient in either model)
            continue
        torch.testing.assert_close(st["exp_avg"], g_l[name], rtol=0, atol=2e-6 * scale, msg=name)
        torch.testing.assert_close(st["exp_avg_sq"], g_l[name] ** 2, rtol=0, atol=2e-6 * scale**2, msg=name)
        assert st["step"].item() == 7.0
    # In depth "identity" mode the new identity layers have no mapped state: they start fresh.
    n_fresh = len(g_l) - len(set(mapped) & set(g_l))
    assert (n_fresh > 0) == (depth_mode == "identity" and depth > 1)


def test_moment_coalesce_after_decoalesce_returns_first_moment():
    m = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2))
    state = {n: {"exp_avg": torch.randn_like(p), "step": torch.tensor(3.0)} for n, p in m.named_parameters()}
    big = ops.decoalesce(m, 2, 2)
    up = ops.map_optimizer_state(state, m, "decoalesce", 2, 2)
    down = ops.map_optimizer_state(up, big, "coalesce", 2, 2)
    for n, st in state.items():
        torch.testing.assert_close(down[n]["exp_avg"], st["exp_avg"], rtol=1e-6, atol=1e-7)


def test_duplicated_embedding_gets_half_the_gradient():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    g = torch.ones_like(m.transformer.wte.weight)
    st = ops.map_optimizer_state({"transformer.wte.weight": {"exp_avg": g, "exp_avg_sq": g}}, m, "decoalesce")
    assert torch.equal(st["transformer.wte.weight"]["exp_avg"], torch.full((61, 16), 0.5))
    assert torch.equal(st["transformer.wte.weight"]["exp_avg_sq"], torch.full((61, 16), 0.25))


def test_optimizer_state_installs_into_new_optimizer_and_steps():
    small = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
    x = make_inputs(small)
    small(**x, labels=x["input_ids"]).loss.backward()
    opt.step()
    named = ops.named_optimizer_state(small, opt)
    assert set(named) == {n for n, _ in small.named_parameters()}
    large = ops.decoalesce(small, 2, 2)
    new_opt = torch.optim.AdamW(large.parameters(), lr=1e-3)
    n = ops.load_named_optimizer_state(large, new_opt, ops.map_optimizer_state(named, small, "decoalesce", 2, 2))
    assert n == len(list(large.parameters()))
    large(**x, labels=x["input_ids"]).loss.backward()
    new_opt.step()
    assert all(new_opt.state[p]["step"].item() == 2.0 for p in large.parameters())


def test_interpolate_state_is_convex_in_moments():
    a = {"w": {"exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3), "step": torch.tensor(5.0)}}
    b = {"w": {"exp_avg": torch.ones(3), "exp_avg_sq": torch.full((3,), 3.0), "step": torch.tensor(9.0)}}
    out = ops.interpolate_state(a, b, 0.25)["w"]
    assert torch.equal(out["exp_avg"], torch.full((3,), 0.25))
    assert torch.equal(out["exp_avg_sq"], torch.full((3,), 1.5))
    assert out["step"].item() == 9.0


def test_state_for_parameters_outside_the_optimizer_is_skipped():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    frozen = {"transformer.wpe.weight"}
    opt = torch.optim.AdamW([p for n, p in m.named_parameters() if n not in frozen], lr=1e-3)
    state = {n: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p), "step": torch.tensor(1.0)}
             for n, p in m.named_parameters()}
    assert ops.load_named_optimizer_state(m, opt, state) == len(state) - 1
    assert len(opt.state_dict()["state"]) == len(state) - 1  # serialisable: no state outside the groups


def test_interpolate_state_keeps_moments_that_only_the_kept_model_has():
    base = {"new": {"exp_avg": torch.full((2,), 4.0), "exp_avg_sq": torch.full((2,), 8.0), "step": torch.tensor(6.0)}}
    out = ops.interpolate_state(base, {}, 0.25)["new"]
    assert torch.equal(out["exp_avg"], torch.full((2,), 3.0)) and torch.equal(out["exp_avg_sq"], torch.full((2,), 6.0))
    assert out["step"].item() == 6.0
    assert ops.interpolate_state(base, {}, 1.0) == {}  # alpha 1: the new layer starts fresh (step 0)
