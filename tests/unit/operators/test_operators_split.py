"""Symmetry-breaking exact de-coalescing (``width_split="asymmetric"``, after LEMON, ICLR 2024).

The symmetric split (W/k per copy) is exact but keeps the copies of a duplicated neuron identical under
training for ever; the asymmetric split (W/k + N_j, sum_j N_j = 0) is exact too, and the copies diverge.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import Shape, main_output, make_inputs, make_model, shapes
from transformers import (
    BertForMaskedLM,
    BertForSequenceClassification,
    DeiTForImageClassification,
    DeiTForImageClassificationWithTeacher,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    Qwen2ForCausalLM,
    ViTForImageClassification,
)

import operators as ops
from operators.cli import main as cli
from operators.spec import IN
from tests.unit.operators.test_operators import SETTINGS, assert_same_function, rel_err

ASYM = {"width_split": "asymmetric", "split_noise": 0.1, "seed": 0}
# (class, tied): GPT-2 tied and untied, BERT (tied MLM decoder), Llama with GQA tied and untied, ViT, DeiT.
TRAINED = [(GPT2LMHeadModel, True), (GPT2LMHeadModel, False), (BertForMaskedLM, True),
           (LlamaForCausalLM, True), (LlamaForCausalLM, False), (ViTForImageClassification, True),
           (DeiTForImageClassificationWithTeacher, True)]
HEADED = [GPT2LMHeadModel, BertForMaskedLM, BertForSequenceClassification, ViTForImageClassification,
          DeiTForImageClassification, DeiTForImageClassificationWithTeacher, LlamaForCausalLM, Qwen2ForCausalLM]


def _ids(p) -> str:
    return f"{p[0].__name__}-{'tied' if p[1] else 'untied'}" if isinstance(p, tuple) else p.__name__


def has_in_axis(model, name: str) -> bool:
    return any(a is not None and a.side == IN for a in ops.family_of(model).rule_for(name).axes)


def copy_gaps(model, k: int = 2) -> dict[str, float]:
    """For every tensor, max |copy_0 - copy_j| over the k copies of each width axis (stride pairing):
    0 means the duplicated units of that tensor are still bit-identical."""
    spec = ops.family_of(model)
    sizes = spec.sizes(model.config)
    gaps = {}
    for name, t in model.state_dict().items():
        gap = 0.0
        for d, ax in enumerate(spec.rule_for(name).axes):
            if ax is None:
                continue
            units, unit = spec.space_units(sizes, ax.space)
            v = t.reshape(*t.shape[:d], ax.chunks, k, units // k * unit, *t.shape[d + 1:])
            for j in range(1, k):
                gap = max(gap, (v.select(d + 1, 0) - v.select(d + 1, j)).abs().max().item())
        gaps[name] = gap
    return gaps


# ---- exactness at the moment of growth -----------------------------------------------------------------
@SETTINGS
@given(shape=shapes(k=1, depth=1), k=st.sampled_from([2, 3]), pairing=st.sampled_from(["stride", "adjacent"]),
       noise=st.sampled_from([0.01, 0.1, 1.0]), seed=st.integers(0, 2**31))
def test_asymmetric_decoalesce_preserves_outputs_every_family(shape, k, pairing, noise, seed):
    small = make_model(shape)
    large = ops.decoalesce(small, width=k, pairing=pairing, width_split="asymmetric", split_noise=noise, seed=seed)
    assert_same_function(small, large, k, pairing)


@pytest.mark.parametrize("cls", [GPT2LMHeadModel, BertForMaskedLM, LlamaForCausalLM], ids=_ids)
def test_tied_head_stays_tied_unsplit_and_exact(cls):
    small = make_model(Shape(cls, heads=2, head_dim=4, layers=2, ffn_mult=2, tied=True))
    sym, asym = ops.decoalesce(small, 2), ops.decoalesce(small, 2, **ASYM)
    assert ops.head_is_tied(asym)
    emb = asym.get_input_embeddings().weight
    assert torch.equal(emb, sym.get_input_embeddings().weight)  # the tied head cannot take noise
    assert asym.get_output_embeddings().weight is emb
    assert_same_function(small, asym, 2, "stride")


def test_only_weights_that_read_a_duplicated_group_get_noise():
    small = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2, tied=False))
    sym, asym = ops.decoalesce(small, 2).state_dict(), ops.decoalesce(small, 2, **ASYM).state_dict()
    noised = sorted(n for n in sym if not torch.equal(sym[n], asym[n]))
    assert noised == sorted(n for n in sym if has_in_axis(small, n))
    assert "lm_head.weight" in noised and "model.layers.0.mlp.down_proj.weight" in noised


@pytest.mark.parametrize("k", [2, 3])
def test_noise_sums_to_zero_over_the_copies_and_has_the_requested_std(k):
    small = make_model(Shape(GPT2LMHeadModel, heads=4, head_dim=16, layers=1, ffn_mult=4, tied=False))
    name = "transformer.h.0.mlp.c_proj.weight"  # Conv1D (in=ffn, out=hidden): the in axis is dim 0
    sym = ops.decoalesce(small, k).state_dict()[name]
    asym = ops.decoalesce(small, k, width_split="asymmetric", split_noise=0.3, seed=5).state_dict()[name]
    noise = asym - sym
    n_small = small.state_dict()[name].shape[0]
    group_sum = noise.reshape(k, n_small, -1).sum(0)  # stride pairing: copies of unit i are i + j * n_small
    assert group_sum.abs().max().item() <= 1e-6 * sym.abs().max().item()
    ratio = noise.std().item() / sym.std(correction=0).item()
    assert 0.27 <= ratio <= 0.33, ratio  # 0.3 requested; ~65k draws


def test_noise_is_reproducible_from_the_seed():
    small = make_model(Shape(BertForMaskedLM, heads=2, head_dim=4, layers=2, ffn_mult=2))
    a = ops.decoalesce(small, 2, width_split="asymmetric", split_noise=0.1, seed=11).state_dict()
    b = ops.decoalesce(small, 2, width_split="asymmetric", split_noise=0.1, seed=11).state_dict()
    c = ops.decoalesce(small, 2, width_split="asymmetric", split_noise=0.1, seed=12).state_dict()
    sym = ops.decoalesce(small, 2).state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)
    noised = {n for n in a if not torch.equal(a[n], sym[n])}
    assert noised == {n for n in a if has_in_axis(small, n)} - {"cls.predictions.decoder.weight"}  # tied head
    assert {n for n in a if not torch.equal(a[n], c[n])} == noised


def test_depth_copies_of_one_layer_get_different_noise():
    small = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=1, ffn_mult=2))
    big = ops.decoalesce(small, 2, 2, **ASYM)  # depth "copy": layers 0 and 1 both come from small layer 0
    w0, w1 = (big.transformer.h[i].mlp.c_fc.weight for i in (0, 1))
    assert not torch.equal(w0, w1)
    assert torch.equal(big.transformer.h[0].mlp.c_fc.bias, big.transformer.h[1].mlp.c_fc.bias)


@SETTINGS
@given(shape=shapes(k=1, depth=1), pairing=st.sampled_from(["stride", "adjacent"]), k=st.sampled_from([2, 3]))
def test_round_trip_after_asymmetric_split_holds_to_fp32_rounding(shape, pairing, k):
    """Coalescing sums the in-axis copies: (W/k + N_1) + ... + (W/k + N_k) = W exactly in real arithmetic,
    but each W/k + N_j is rounded to fp32, so the round trip is ~1e-7 relative, not bit for bit. Tensors
    without an in axis carry no noise and come back bit-exact (k = 2; k = 3 divides by 3 in fp32)."""
    m = make_model(shape)
    back = ops.coalesce(ops.decoalesce(m, k, pairing=pairing, **ASYM), k, pairing=pairing)
    assert back.config.to_dict() == m.config.to_dict()
    for name, t in m.state_dict().items():
        got = back.state_dict()[name]
        if k == 2 and not has_in_axis(m, name):
            assert torch.equal(got, t), name
        else:
            assert (got - t).abs().max().item() <= 1e-6 * max(t.abs().max().item(), 1e-30), name


# ---- training: the copies diverge only with the asymmetric split -----------------------------------------
def _loss(model, x, w):
    return (main_output(model, x) * w).sum() / w.numel()


@pytest.mark.parametrize("case", TRAINED, ids=_ids)
def test_training_breaks_symmetry_only_with_asymmetric_split(case):
    """5 AdamW steps after an exact up-step at alpha = 1 (the V-cycle's interpolate(kept, grown, 1) returns
    ``grown``'s weights exactly), with the small model's AdamW state mapped over as the V-cycle does.
    Symmetric: every pair of copies is still bit-identical, in every tensor, so the extra width is unused.
    Asymmetric: parameters that carry no noise (biases, norms, embeddings) start identical and diverge."""
    cls, tied = case
    small = make_model(Shape(cls, heads=2, head_dim=4, layers=2, ffn_mult=2, kv_heads=1, tied=tied)).train()
    torch.manual_seed(3)
    batches = [make_inputs(small, seed=10 + i) for i in range(7)]
    with torch.no_grad():
        weights = [torch.randn_like(main_output(small, x)) for x in batches]
    opt = torch.optim.AdamW(small.parameters(), lr=1e-2)
    for x, w in zip(batches[:2], weights[:2]):  # a small-model history, so there is state to map
        opt.zero_grad()
        _loss(small, x, w).backward()
        opt.step()
    state = ops.map_optimizer_state(ops.named_optimizer_state(small, opt), small, "decoalesce")
    gaps = {}
    for split in ("symmetric", "asymmetric"):
        large = ops.decoalesce(small, 2, width_split=split, split_noise=0.1, seed=0)
        no_noise = [n for n in large.state_dict() if not has_in_axis(large, n)]
        assert max(copy_gaps(large)[n] for n in no_noise) == 0.0  # identical copies at the moment of growth
        big_opt = torch.optim.AdamW(large.parameters(), lr=1e-2)
        ops.load_named_optimizer_state(large, big_opt, state)
        for x, w in zip(batches[2:], weights[2:]):
            big_opt.zero_grad()
            _loss(large, x, w).backward()
            big_opt.step()
        gaps[split] = copy_gaps(large)
        gaps[split + "_no_noise"] = max(gaps[split][n] for n in no_noise)
    assert max(gaps["symmetric"].values()) == 0.0, {n: g for n, g in gaps["symmetric"].items() if g}
    assert gaps["asymmetric_no_noise"] > 1e-3, gaps["asymmetric"]


def test_duplicated_hidden_units_compute_different_activations_after_training():
    small = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2)).train()
    x = make_inputs(small)
    acts = {}
    for split in ("symmetric", "asymmetric"):
        large = ops.decoalesce(small, 2, width_split=split, split_noise=0.1, seed=0)
        opt = torch.optim.AdamW(large.parameters(), lr=1e-2)
        for i in range(5):
            y = make_inputs(small, seed=20 + i)
            opt.zero_grad()
            large(**y, labels=y["input_ids"]).loss.backward()
            opt.step()
        with torch.no_grad():
            h = large.transformer(**x).last_hidden_state  # (B, T, 2 * n_embd): unit i and i + n_embd are copies
        acts[split] = (h[..., :8] - h[..., 8:]).abs().max().item() / h.abs().max().item()
    assert acts["symmetric"] == 0.0
    assert acts["asymmetric"] > 1e-3


# ---- optimizer state: the dual map stays the right one -------------------------------------------------
def _grads(model, inputs, weights):
    model.zero_grad()
    (main_output(model, inputs) * weights).sum().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cls", HEADED, ids=_ids)
@pytest.mark.parametrize("tied", [True, False])
def test_asymmetric_split_keeps_the_gradient_relations_the_state_map_relies_on(cls, tied):
    """Phi(M theta + N) = phi(theta) for every theta, so M^T g_L = g_s still holds exactly (coalescing the
    large gradient gives the small one), and the mapped small gradient M (M^T M)^-1 g_s equals P g_L, the
    projection of the large gradient onto the duplicated subspace. What the map cannot give (and no small
    model history has) is the zero-sum rest (I - P) g_L: it is nonzero, linear in the noise, and it is
    exactly the symmetry-breaking signal. Same bound as the symmetric test in test_operators_optim."""
    small = make_model(Shape(cls, heads=2, head_dim=4, layers=2, ffn_mult=2, kv_heads=1, tied=tied))
    large = ops.decoalesce(small, 2, **ASYM)
    x = make_inputs(small)
    with torch.no_grad():
        w = torch.randn_like(main_output(small, x))
    g_s, g_l = _grads(small, x, w), _grads(large, x, w)
    mapped = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in g_s.items()}, small, "decoalesce")
    merged = ops.map_optimizer_state({n: {"exp_avg": g} for n, g in g_l.items()}, large, "coalesce")  # M^T g_L
    projected = ops.map_optimizer_state(merged, small, "decoalesce")  # P g_L
    s_scale = max(g.abs().max().item() for g in g_s.values())
    l_scale = max(g.abs().max().item() for g in g_l.values())
    for name, g in g_s.items():
        torch.testing.assert_close(merged[name]["exp_avg"], g, rtol=0, atol=2e-6 * s_scale, msg=name)
    for name in g_l:
        torch.testing.assert_close(mapped[name]["exp_avg"], projected[name]["exp_avg"], rtol=0,
                                   atol=2e-6 * l_scale, msg=name)
    rest = max((g - mapped[n]["exp_avg"]).abs().max().item() for n, g in g_l.items()) / l_scale
    assert rest > 1e-3  # the symmetry-breaking part: with the symmetric split it is ~1e-7 (rounding)


# ---- arguments and CLI ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"width_split": "lemon"}, "width_split must be one of"),
    ({"split_noise": -0.1}, "split_noise must be a finite number >= 0"),
    ({"split_noise": float("nan")}, "split_noise"),
    ({"split_noise": "0.1"}, "split_noise"),
    ({"split_noise": True}, "split_noise"),
    ({"seed": 1.5}, "seed must be an integer"),
    ({"seed": None}, "seed"),
])
def test_bad_split_arguments_name_the_argument(kwargs, match):
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    with pytest.raises(ops.OperatorError, match=match):
        ops.decoalesce(m, width=2, **kwargs)
    with pytest.raises(ops.OperatorError, match=match):
        ops.validate_resize(m.config, 2, direction="decoalesce", **kwargs)


def test_zero_noise_or_width_one_is_the_symmetric_split():
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    for a, b in ((ops.decoalesce(m, 2, width_split="asymmetric", split_noise=0.0), ops.decoalesce(m, 2)),
                 (ops.decoalesce(m, 1, 2, **ASYM), ops.decoalesce(m, 1, 2))):
        assert all(torch.equal(t, b.state_dict()[n]) for n, t in a.state_dict().items())


def test_cli_decoalesce_asymmetric_is_exact_and_reproducible(tmp_path):
    m = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2, tied=False))
    m.save_pretrained(tmp_path / "small")
    args = ["--width", "2", "--width-split", "asymmetric", "--split-noise", "0.01", "--seed", "0"]
    for out in ("a", "b"):
        assert cli(["decoalesce", str(tmp_path / "small"), str(tmp_path / out), *args]) == 0
    a, b = (LlamaForCausalLM.from_pretrained(tmp_path / o).eval() for o in ("a", "b"))
    expect = ops.decoalesce(m, 2, width_split="asymmetric", split_noise=0.01, seed=0).state_dict()
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name]) and torch.equal(t, expect[name]), name
    x = make_inputs(m)
    with torch.no_grad():
        assert rel_err(main_output(a, x), main_output(m, x)) <= 1e-5
    assert cli(["interpolate", str(tmp_path / "a"), str(tmp_path / "small"), str(tmp_path / "mix"), "--alpha", "1",
                *args]) == 0
    mix = LlamaForCausalLM.from_pretrained(tmp_path / "mix")
    assert all(torch.equal(t, expect[n]) for n, t in mix.state_dict().items())


def test_cli_rejects_negative_split_noise(tmp_path, capsys):
    m = make_model(Shape(GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2))
    m.save_pretrained(tmp_path / "small")
    assert cli(["decoalesce", str(tmp_path / "small"), str(tmp_path / "big"), "--width-split", "asymmetric",
                "--split-noise", "-1"]) == 2
    assert "split_noise" in capsys.readouterr().err
    assert not (tmp_path / "big").exists()

