"""Apollo's pieces without training: depth samplers against their closed form and the table in
docs/papers.md, the layer maps, growth exactness for every family, optimizer-state mapping, the
plan (stages, budget, one LR schedule), validation errors and dry runs of the recipes."""

import re

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from operators import (
    OperatorError,
    SharedDepth,
    depth_map,
    grow_depth,
    map_depth_state,
    named_optimizer_state,
)
from progressive.config import ConfigError, load_config
from progressive.methods import get_method, phase_flops, phase_schedule
from progressive.methods.apollo.method import depth_probabilities, expected_depth, sample_depth, uniforms
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.report.dryrun import plan_table
from tests.tiny_models import ALL_CLASSES, LLAMA_CLASSES, Shape, main_output, make_inputs, make_model
from tests.train_utils import ROOT, tiny_cfg

# docs/papers.md, LVPS with L = 12: N -> (P(depth = N), P(depth = 12), mean depth), from a
# 200k-draw simulation rounded to 3 decimals (2 for the mean).
PAPER_TABLE = {1: (0.735, 0.002, 1.77), 3: (0.637, 0.016, 4.22), 6: (0.647, 0.065, 7.13)}
SIGMOID_MEANS = {1: 6.3, 3: 7.4, 6: 8.9}  # docs/papers.md, rounded to 1 decimal


@pytest.mark.parametrize("n", [1, 3, 6])
def test_lvps_closed_form_matches_the_papers_distribution_table(n):
    p = depth_probabilities("lvps", n, 12)
    low, high, mean = PAPER_TABLE[n]
    # the table's own error: binomial sd <= 0.0011 at 200k draws, plus 0.0005 rounding -> 3 sd + rounding
    assert p[n] == pytest.approx(low, abs=0.004) and p[12] == pytest.approx(high, abs=0.004)
    assert expected_depth("lvps", n, 12) == pytest.approx(mean, abs=0.02)
    assert p.sum() == pytest.approx(1.0) and p[:n].sum() == 0.0
    assert expected_depth("sigmoid", n, 12) == pytest.approx(SIGMOID_MEANS[n], abs=0.05)
    assert expected_depth("uniform", n, 12) == pytest.approx((n + 12) / 2)


@pytest.mark.parametrize("sampler", ["lvps", "sigmoid", "uniform"])
@pytest.mark.parametrize("n", [1, 3, 6])
def test_sampled_depths_follow_the_closed_form(sampler, n):
    # 100k steps x 2 micro-batches = 200k draws from the counter-based hash. Every bin's frequency must lie
    # within 5 binomial sd of the closed form (sd <= 0.0012; a 5-sd miss has probability ~6e-7 per bin).
    d = sample_depth(sampler, n, 12, uniforms(3, np.arange(100_000), np.arange(2))).ravel()
    p = depth_probabilities(sampler, n, 12)
    freq = np.bincount(d, minlength=13) / d.size
    assert d.min() >= n and d.max() <= 12
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / d.size) + 1e-9), (freq, p)
    assert abs(d.mean() - expected_depth(sampler, n, 12)) <= 5 * d.std() / np.sqrt(d.size)


def test_depth_is_a_pure_function_of_seed_step_and_micro_batch():
    a = uniforms(0, np.arange(1000), np.arange(4))
    assert np.array_equal(a, uniforms(0, np.arange(1000), np.arange(4)))  # no hidden generator state
    assert np.array_equal(a[500:, 2:], uniforms(0, np.arange(500, 1000), np.arange(2, 4)))  # any order
    assert not np.array_equal(a, uniforms(1, np.arange(1000), np.arange(4)))  # the seed matters
    assert abs(np.corrcoef(a[:, 0], a[:, 1])[0, 1]) < 0.1  # micro-batches of one step are not coupled
    for s in ("none", "constant_high", "lvps", "sigmoid", "uniform"):  # the last stage (N = L) is plain
        assert set(sample_depth(s, 12, 12, a).ravel()) == {12}
    assert (set(sample_depth("none", 3, 12, a).ravel()) == {3}
            and set(sample_depth("constant_high", 3, 12, a).ravel()) == {12})


def test_layer_maps_interpolation_blocks_and_stack_cycles():
    assert depth_map(3, 8, "interpolation") == [0, 0, 0, 1, 1, 1, 2, 2]  # floor(j N / D), docs/papers.md
    assert depth_map(6, 12, "interpolation") == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert depth_map(3, 12, "stack") == [0, 1, 2] * 4
    assert depth_map(3, 8, "stack") == [0, 1, 2, 0, 1, 2, 0, 1]  # j mod N (the authors': ... 1, 2; see docstring)
    assert depth_map(5, 5, "interpolation") == depth_map(5, 5, "stack") == list(range(5))
    with pytest.raises(OperatorError, match="n <= depth"):
        depth_map(4, 3)
    with pytest.raises(OperatorError, match="depth map must be one of"):
        depth_map(2, 4, "zigzag")


def _shape(cls, layers):
    return Shape(cls, heads=2, head_dim=4, layers=layers, ffn_mult=2, kv_heads=1 if cls in LLAMA_CLASSES else None)


@pytest.mark.parametrize("kind", ["interpolation", "stack"])
@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_grown_model_computes_what_the_shared_model_computed(cls, kind):
    for n, depth in ((1, 3), (2, 5), (3, 6)):
        model = make_model(_shape(cls, n))
        x = make_inputs(model)
        shared = SharedDepth(model, kind)
        shared.set_depth(depth)
        with torch.no_grad():
            a = main_output(model, x)
        shared.restore()
        grown = grow_depth(model, depth, kind)
        with torch.no_grad():
            b = main_output(grown, x)
        assert (a - b).abs().max() / a.abs().max() <= 1e-6, (n, depth)
        assert len(shared.plain) == n and grown.config.num_hidden_layers == depth
        assert model.config.num_hidden_layers == n  # the shared run left the config as it was


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_a_copy_map_given_as_data_grows_as_the_shared_model_runs_it(cls):
    """The surgery takes any map, not only the named two: [0, 1, 1, 2] inserts a copy of the middle layer (a
    MIDAS-style growth); the grown model computes what the shared model computed with that map, and the moments
    follow it. A map that is not ``depth`` indices covering every stored layer is refused."""
    src = [0, 1, 1, 2]
    model = make_model(_shape(cls, 3))
    x = make_inputs(model)
    shared = SharedDepth(model, src)
    shared.set_depth(4)
    with torch.no_grad():
        a = main_output(model, x)
    shared.restore()
    grown = grow_depth(model, 4, src)
    with torch.no_grad():
        b = main_output(grown, x)
    assert (a - b).abs().max() / a.abs().max() <= 1e-6 and grown.config.num_hidden_layers == 4
    state = {name: {"exp_avg": torch.full_like(p, float(i))} for i, (name, p) in enumerate(model.named_parameters())}
    mapped = map_depth_state(state, model, 4, src)
    assert set(mapped) == {n for n, _ in grown.named_parameters()}
    for name, st in mapped.items():  # position j holds stored layer src[j]'s moments; the rest keep theirs
        m = re.search(r"\.(\d+)\.", name)
        source = name if m is None else f"{name[:m.start()]}.{src[int(m[1])]}.{name[m.end():]}"
        assert torch.equal(st["exp_avg"], state[source]["exp_avg"]), name
    for bad in ([0, 1, 1], [0, 1, 1, 3], [0, 0, 1, 1], [0, 1, 1.0, 2]):
        with pytest.raises(OperatorError, match="a depth map given as data"):
            depth_map(3, 4, bad)


def test_shared_layers_add_their_gradients_and_the_run_restores_the_plain_model():
    model = make_model(_shape(GPT2LMHeadModel, 2)).train()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    x = make_inputs(model)["input_ids"]
    shared = SharedDepth(model)
    shared.set_depth(5)
    assert model.config.use_cache is False  # repeats share a layer index: a KV cache would mix them
    model(input_ids=x, labels=x).loss.backward()
    shared.restore()
    grown = grow_depth(model, 5)
    grown.zero_grad()
    grown(input_ids=x, labels=x).loss.backward()
    for i, copies in ((0, (0, 1, 2)), (1, (3, 4))):  # floor(j * 2 / 5) = 0 0 0 1 1
        summed = sum(grown.transformer.h[j].attn.c_attn.weight.grad for j in copies)
        torch.testing.assert_close(model.transformer.h[i].attn.c_attn.weight.grad, summed)
    assert model.config.use_cache is True and len(model.transformer.h) == 2
    assert list(model.state_dict()) == list(before)
    with pytest.raises(OperatorError, match="scale_attn_by_inverse_layer_idx"):
        SharedDepth(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11,
                                               scale_attn_by_inverse_layer_idx=True)))


def test_optimizer_moments_follow_the_copy_map():
    model = make_model(_shape(GPT2LMHeadModel, 2)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = make_inputs(model)["input_ids"]
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    state = named_optimizer_state(model, opt)
    mapped = map_depth_state(state, model, 4, "stack")
    grown = grow_depth(model, 4, "stack")
    assert set(mapped) == {n for n, _ in grown.named_parameters()}
    for j, src in enumerate(depth_map(2, 4, "stack")):
        new, old = mapped[f"transformer.h.{j}.mlp.c_fc.weight"], state[f"transformer.h.{src}.mlp.c_fc.weight"]
        assert torch.equal(new["exp_avg"], old["exp_avg"]) and torch.equal(new["exp_avg_sq"], old["exp_avg_sq"])
        assert float(new["step"]) == 1.0 and new["exp_avg"].data_ptr() != old["exp_avg"].data_ptr()
    assert torch.equal(mapped["transformer.wte.weight"]["exp_avg"], state["transformer.wte.weight"]["exp_avg"])
    # "first_copy": only the first position copying a layer keeps its moments; the other copies start fresh
    first = map_depth_state(state, model, 5, "interpolation", duplicates="fresh")  # 0 0 0 1 1
    assert {n.split(".")[2] for n in first if n.startswith("transformer.h.")} == {"0", "3"}
    assert set(first) - {n for n in first if n.startswith("transformer.h.")} == \
        {n for n in state if not n.startswith("transformer.h.")}
    with pytest.raises(OperatorError, match="duplicates must be one of"):
        map_depth_state(state, model, 4, duplicates="average")


# ------------------------------------------------------------------------------------------- plan


def _plan(cfg):
    fam = get_family(cfg.model.family)
    base = fam.build_config(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    return get_method(cfg, fam).plan(base, lambda c: step_flops(cfg, fam, c)), fam, base


def _apollo(tmp_path, **over):
    base = dict(model__num_layers=4, train__steps=40, method__apollo__layers=[1, 2, 4],
                method__apollo__boundaries=[0.1, 0.25])
    return tiny_cfg(tmp_path, method="apollo", **{**base, **over})


def test_plan_stages_fill_the_flops_budget_and_continue_one_lr_schedule(tmp_path):
    cfg = _apollo(tmp_path, train__grad_accum=2)
    phases, fam, base = _plan(cfg)
    assert [p.name for p in phases] == ["stage0-1L", "stage1-2L", "stage2-4L"]
    assert [p.config.n_layer for p in phases] == [1, 2, 4] and [p.steps for p in phases[:2]] == [4, 6]
    full = step_flops(cfg, fam, base)
    spent = sum(phase_flops(p, lambda c: step_flops(cfg, fam, c)) for p in phases)
    assert 40 * full - full < spent <= 40 * full
    assert phases[-1].steps > 30  # the cheap early stages leave budget for more full-model steps
    method = get_method(cfg, fam)
    method.plan(base, lambda c: step_flops(cfg, fam, c))
    d = method.depths(np.arange(4, 10), np.arange(2), 2)  # stage 1's draws
    head, layer = step_flops(cfg, fam, base, n_layers=0), step_flops(cfg, fam, base, n_layers=1)
    assert phases[1].flops == sum((2 * head + (layer - head) * int(s)) // 2 for s in d.sum(1))
    assert phases[1].mean_layers == pytest.approx(d.mean())
    # one warm-up + cosine over all stages: the stages' multipliers concatenate to the single schedule
    lrs = [phase_schedule(p)(s) for p in phases for s in range(p.steps)]
    total = sum(p.steps for p in phases)
    one = phase_schedule(type(phases[0])("all", total, 1.0, cfg.train.warmup, cfg.train.decay,
                                         cfg.train.min_lr_ratio, base))
    assert lrs == [one(s) for s in range(total)]
    per_stage, _, _ = _plan(_apollo(tmp_path, method__apollo__schedule="per_stage", train__warmup=0.5))
    assert [phase_schedule(p)(0) for p in per_stage] == [0.0] * 3  # each stage warms up again
    assert [phase_schedule(p)(p.steps // 2) for p in per_stage] == [1.0] * 3


def test_paper_recipes_plan_stages_1_3_6_12_at_5_5_15_75_percent():
    for name in ("gpt2_base_apollo", "bert_base_apollo"):
        cfg = load_config(ROOT / "launch" / "recipes" / f"{name}.yaml")
        phases, _, _ = _plan(cfg)
        t = cfg.train.steps
        assert [p.config.num_hidden_layers for p in phases] == [1, 3, 6, 12]
        assert [p.steps for p in phases[:3]] == [round(0.05 * t), round(0.05 * t), round(0.15 * t)]
        assert phases[-1].steps > 0.75 * t and {p.schedule_steps for p in phases} == {sum(p.steps for p in phases)}
        assert cfg.method.apollo.sampler == "lvps" and cfg.method.apollo.map == "interpolation"
        assert cfg.train.lr == 1e-4 and cfg.train.warmup == 0.025 and cfg.train.decay == "cosine"


@pytest.mark.parametrize("recipe", ["configs/apollo.yaml", "configs/stackbert.yaml", "configs/gstack.yaml",
                                    "launch/recipes/gpt2_base_apollo.yaml", "launch/recipes/bert_base_apollo.yaml"])
def test_recipes_dry_run_with_flops_from_the_sampled_depths(recipe, capsys):
    from progressive.report.dryrun import dry_run

    plan = dry_run(load_config(ROOT / recipe))
    assert "config valid" in capsys.readouterr().out
    assert plan["method"] == "apollo" and 0.99 <= plan["flops_ratio"] <= 1.0  # equal compute, by design
    assert plan["phases"][-1]["depth"] == load_config(ROOT / recipe).model.num_layers
    assert all(r["depth"] >= int(r["shape"].split("L/")[0]) for r in plan["phases"])


def test_dry_run_depth_column_is_the_samplers_mean(tmp_path):
    plan = plan_table(_apollo(tmp_path, train__steps=40_000, method__apollo__layers=[1, 3, 6, 12],
                              method__apollo__boundaries=[0.05, 0.1, 0.25], model__num_layers=12))
    means = [r["depth"] for r in plan["phases"]]
    for got, n in zip(means, (1, 3, 6)):  # 2000-6000 draws per stage: sd of the mean <= 0.05
        assert got == pytest.approx(expected_depth("lvps", n, 12), abs=0.2)
    assert means[-1] == 12 and plan["flops_ratio"] == pytest.approx(1.0, abs=0.001)


@pytest.mark.parametrize("over, field", [
    ({"method__apollo__layers": [1, 4, 2]}, r"method\.apollo\.layers: stage layer counts must increase"),
    ({"method__apollo__layers": [1, 2, 3], "method__apollo__boundaries": [0.1, 0.2]},
     r"method\.apollo\.layers: the last stage must hold all 4 layers"),
    ({"method__apollo__boundaries": [0.3, 0.2]}, r"method\.apollo\.boundaries: must increase"),
    ({"method__apollo__boundaries": [0.1, 1.2]}, r"method\.apollo\.boundaries: fractions of the budget"),
    ({"method__apollo__boundaries": [0.1]}, r"method\.apollo\.boundaries: 3 stages need 2 boundaries"),
    ({"method__apollo__boundaries": [0.01, 0.02]},
     r"method\.apollo\.boundaries\[0\]: stage 0 \(1 layers\) gets no step"),
    ({"method__apollo__sampler": "lvp"}, r"method\.apollo\.sampler: one of lvps"),
    ({"method__apollo__map": "extend"}, r"method\.apollo\.map: one of interpolation, stack"),
    ({"method__apollo__optimizer_state": "stale"}, r"method\.apollo\.optimizer_state: one of mapped, first_copy"),
    ({"method__apollo__schedule": "restart"}, r"method\.apollo\.schedule"),
])
def test_bad_stage_settings_are_rejected_before_data_loads_naming_the_field(tmp_path, over, field):
    from progressive.run.trainer import Trainer

    with pytest.raises(ConfigError, match=field):
        Trainer(_apollo(tmp_path, **over))  # the constructor validates and plans; no data is read
