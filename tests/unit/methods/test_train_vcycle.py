"""The V-cycle method: plans (paper recipes exactly, K levels, budget), validation, transitions."""

import copy

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from operators import decoalesce, load_named_optimizer_state, map_optimizer_state, named_optimizer_state
from progressive.config import ConfigError, load_config, validate
from progressive.methods import get_method
from progressive.model.build import get_family, guess_data_info, step_flops
from tests.train_utils import ROOT, tiny_cfg


def _plan(cfg):
    fam = get_family(cfg.model.family)
    base = fam.build_config(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    return get_method(cfg, fam).plan(base, lambda c: step_flops(cfg, fam, c)), fam, base


def test_paper_gpt_base_recipe_is_expressed_exactly():
    cfg = load_config(ROOT / "launch" / "recipes" / "gpt2_base_vcycle.yaml")
    phases, _, _ = _plan(cfg)
    assert [p.name for p in phases] == ["L0-down", "L1", "L0-up"]
    assert [p.steps for p in phases] == [5000, 50000, 50000]  # E_a 5%, small 50%, large 50% of 100K
    assert [p.peak_lr for p in phases] == pytest.approx([1e-4, 4e-4, 1e-4])  # the small model at 4x
    assert [p.warmup for p in phases] == [1.0, 0.0, 0.0] and {p.decay for p in phases} == {"linear"}
    small = phases[1].config
    assert (small.n_layer, small.n_embd, small.n_head) == (6, 384, 6)
    assert cfg.method.vcycle.levels[0].alpha == 0.25 and cfg.method.vcycle.optimizer_state == "reset"


def test_three_level_bert_large_recipe_goes_down_and_back_up():
    cfg = load_config(ROOT / "launch" / "recipes" / "bert_large_vcycle3.yaml")
    phases, _, _ = _plan(cfg)
    assert [p.name for p in phases] == ["L0-down", "L1-down", "L2", "L1-up", "L0-up"]
    assert [p.config.num_hidden_layers for p in phases] == [24, 12, 6, 12, 24]
    assert [p.config.hidden_size for p in phases] == [1024, 512, 256, 512, 1024]
    assert [p.level for p in phases] == [0, 1, 2, 1, 0]


def test_open_last_phase_spends_exactly_the_rest_of_the_flops_budget(tmp_path):
    cfg = tiny_cfg(tmp_path, train__steps=50)
    phases, fam, base = _plan(cfg)
    spent = sum(p.steps * step_flops(cfg, fam, p.config) for p in phases)
    budget, large = 50 * step_flops(cfg, fam, base), step_flops(cfg, fam, base)
    assert budget - large < spent <= budget
    assert [p.steps for p in phases[:2]] == [10, 20]


@pytest.mark.parametrize("levels, field", [
    ([{"alpha": 0.5, "down": {"steps": 1}, "up": {}}], r"levels: a V-cycle needs at least 2"),
    ([{"width": 2, "alpha": 0.5, "down": {"steps": 1}, "up": {}}, {"width": 2, "down": {"steps": 1}}],
     r"levels\[0\]\.width"),
    ([{"down": {"steps": 1}, "up": {}}, {"width": 2, "down": {"steps": 1}}], r"levels\[0\]\.alpha"),
    ([{"alpha": 0.5, "down": {"steps": 1}}, {"width": 2, "down": {"steps": 1}}], r"levels\[0\]\.up"),
    ([{"alpha": 0.5, "down": {"steps": 1}, "up": {}}, {"width": 2, "alpha": 0.5, "down": {"steps": 1}}],
     r"levels\[1\]\.alpha/up"),
    ([{"alpha": 0.5, "down": {}, "up": {}}, {"width": 2, "down": {"steps": 1}}], r"levels\[0\]\.down: set steps"),
    ([{"alpha": 0.5, "down": {"steps": 1}, "up": {}}, {"width": 3, "down": {"steps": 1}}], r"levels\[1\]: "),
])
def test_invalid_levels_are_rejected_naming_the_field(tmp_path, levels, field):
    with pytest.raises(ConfigError, match=field):
        _plan(tiny_cfg(tmp_path, method__vcycle__levels=levels))


def test_identity_depth_mode_is_refused_for_post_ln_bert(tmp_path):
    with pytest.raises(ConfigError, match=r"levels\[1\].*identity"):
        _plan(tiny_cfg(tmp_path, "bert", method__vcycle__depth_mode="identity"))


def _tiny_vcycle(tmp_path, alpha, mode="mapped", **over):
    levels = [{"alpha": alpha, "down": {"steps": 1}, "up": {"steps": 1}},
              {"width": 2, "depth": 2, "down": {"steps": 1}}]
    cfg = tiny_cfg(tmp_path, method__vcycle__levels=levels, method__vcycle__optimizer_state=mode, **over)
    fam = get_family("gpt2")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16))
    method = get_method(cfg, fam)
    phases = method.plan(model.config, lambda c: step_flops(cfg, fam, c))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (2, 16))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    return method, phases, model, opt, x


@pytest.mark.parametrize("alpha", [0.0, 0.25, 1.0])
def test_up_step_interpolates_with_the_level_model_from_before_coalescing(tmp_path, alpha):
    method, phases, model, opt, x = _tiny_vcycle(tmp_path, alpha)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    down = method.transition(1, phases, model, opt)
    small = down.model
    with torch.no_grad():  # stands in for training the small level
        for p in small.parameters():
            p.add_(0.01 * torch.randn_like(p))
    small_opt = torch.optim.AdamW(small.parameters(), lr=1e-3)
    up = method.transition(2, phases, small, small_opt)
    grown = decoalesce(small, 2, 2).state_dict()
    for n, t in up.model.state_dict().items():
        expect = (1 - alpha) * before[n] + alpha * grown[n]
        assert torch.allclose(t, expect, atol=1e-6), n
    assert method.kept == {}  # the kept copy is released after its up-step


def test_optimizer_state_is_mapped_to_the_new_model_or_reset(tmp_path):
    method, phases, model, opt, _ = _tiny_vcycle(tmp_path, 0.25, "mapped")
    change = method.transition(1, phases, model, opt)
    names = {n for n, _ in change.model.named_parameters()}
    assert set(change.optimizer_state) == names
    wte = change.optimizer_state["transformer.wte.weight"]
    assert wte["exp_avg"].shape == change.model.transformer.wte.weight.shape and float(wte["step"]) == 1.0
    # up-step: moments mapped from the small level, interpolated with the level's own kept moments
    kept = {n: st["exp_avg"].clone() for n, st in method.kept_opt[0].items()}
    small, small_opt = change.model, torch.optim.AdamW(change.model.parameters(), lr=1e-3)
    load_named_optimizer_state(small, small_opt, change.optimizer_state)
    mapped = map_optimizer_state(named_optimizer_state(small, small_opt), small, "decoalesce", 2, 2)
    up = method.transition(2, phases, small, small_opt)
    for n, st in up.optimizer_state.items():
        assert torch.allclose(st["exp_avg"], torch.lerp(kept[n], mapped[n]["exp_avg"], 0.25), atol=1e-7), n
    method, phases, model, opt, _ = _tiny_vcycle(tmp_path, 0.25, "reset")
    assert method.transition(1, phases, model, opt).optimizer_state is None


@pytest.mark.parametrize("split_seed, seed", [(None, 0), (7, 7)])  # None: train.seed (0 in tiny_cfg)
def test_asymmetric_width_split_reaches_the_up_step_and_stays_exact(tmp_path, split_seed, seed):
    method, phases, model, opt, x = _tiny_vcycle(
        tmp_path, 1.0, method__vcycle__depth_mode="identity", method__vcycle__width_split="asymmetric",
        method__vcycle__split_noise=0.05, method__vcycle__split_seed=split_seed)
    small = method.transition(1, phases, model, opt).model
    up = method.transition(2, phases, small, torch.optim.AdamW(small.parameters(), lr=1e-3))
    expect = decoalesce(small, 2, 2, depth_mode="identity", width_split="asymmetric", split_noise=0.05,
                        seed=seed + 0)  # + the level index (level 0 for the last up-step)
    symmetric = decoalesce(small, 2, 2, depth_mode="identity").state_dict()
    got = up.model.state_dict()
    assert all(torch.equal(t, expect.state_dict()[n]) for n, t in got.items())
    assert not torch.equal(got["transformer.h.0.mlp.c_fc.weight"], symmetric["transformer.h.0.mlp.c_fc.weight"])
    with torch.no_grad():
        ref, out = small.eval()(input_ids=x).logits, up.model.eval()(input_ids=x).logits
    assert ((out - ref).abs().max() / ref.abs().max()).item() <= 1e-5  # alpha 1 + identity: an exact up-step


@pytest.mark.parametrize("key, value, match", [
    ("width_split", "lemon", r"method\.vcycle\.width_split: 'symmetric' or 'asymmetric'"),
    ("split_noise", "-0.5", r"method\.vcycle\.split_noise: a finite number >= 0"),
    ("split_noise", "inf", r"method\.vcycle\.split_noise"),
    ("split_seed", "1.5", r"method\.vcycle\.split_seed: expected int"),
])
def test_width_split_fields_are_validated(tmp_path, key, value, match):
    with pytest.raises(ConfigError, match=match):
        validate(tiny_cfg(tmp_path, **{f"method__vcycle__{key}": value}))


def test_method_state_round_trips_the_kept_weights(tmp_path):
    method, phases, model, opt, _ = _tiny_vcycle(tmp_path, 0.25)
    method.transition(1, phases, model, opt)
    state = copy.deepcopy(method.state_dict())
    fresh = get_method(method.cfg, method.family)
    fresh.load_state_dict(state)
    assert fresh.kept.keys() == {0}
    assert all(torch.equal(fresh.kept[0][n], t) for n, t in method.kept[0].items())


@pytest.mark.parametrize("free_gb,cached_gb,where", [(10.0, 0.0, "device"), (3.0, 0.0, "host"), (3.0, 1.0, "device")])
def test_a_level_is_kept_on_the_accelerator_only_when_it_fits(monkeypatch, free_gb, cached_gb, where):
    """A 1 GB kept copy stays in accelerator memory when 4 GB are free there (the driver's free memory plus
    what PyTorch's allocator holds unused); else it goes to pinned host memory."""
    from progressive.methods.vcycle import method as vcycle

    gb = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gb * gb), 80 * gb))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: int((cached_gb + 2) * gb))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * gb)
    assert vcycle.park_on(torch.device("cuda"), gb) == where
    assert vcycle.park_on(torch.device("cpu"), 1) == "host"


def test_one_choice_of_place_holds_a_levels_whole_kept_copy(tmp_path, monkeypatch):
    """The weights and every parameter's moments are kept in one place, chosen once from their total size."""
    from progressive.methods.vcycle import method as vcycle

    asked = []
    monkeypatch.setattr(vcycle, "park_on", lambda device, nbytes: asked.append(nbytes) or "host")
    method, phases, model, opt, _ = _tiny_vcycle(tmp_path, 0.25)
    method.transition(1, phases, model, opt)
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    moments = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values())
    assert asked == [weights + moments]
    assert method.kept[0]["transformer.wte.weight"] is not model.transformer.wte.weight  # a copy, not the tensor


def test_level_change_bench_runs_both_places_on_a_tiny_model(tmp_path):
    from bench.speed import level_change

    res = level_change.main(["--tiny", "--repeats", "1", "--out", str(tmp_path / "lc.json")])
    assert set(res["median"]) == {"host", "device"} and all(v["down_s"] > 0 for v in res["median"].values())
    assert (tmp_path / "lc.json").is_file()
