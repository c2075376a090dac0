"""Warmup-stable-decay (WSD) LR schedules (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
Fixed Training Durations"): warm-up, the peak held, then a cooldown over the last ``cooldown`` fraction of the
schedule's steps, linear or 1-sqrt, for the baseline and every method; where a method runs one schedule over its
stages (Apollo's ``schedule: global``, the V-cycle's ``schedule: global``) the cooldown is the end of the whole run.
Late expansion (Bu, ICML 2026, arXiv 2511.04981) is the named variant that trains under it. A cooldown enters a
bench run's cache key only where a WSD decay makes it count."""

import json
import math
import signal

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from bench.lib.runs import config_hash
from bench.lib.variants import VARIANTS, WSD, WSD_SQRT, overrides
from progressive import cli
from progressive.config import ConfigError, dump_yaml, load_config, resume_diff, to_dict, validate
from progressive.methods import LRSchedule, get_method, phase_schedule
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.run.checkpoint import list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import ROOT, assert_same_rows, rows, tiny_cfg, train_cli, train_here

# steps 100, warm-up 0.1 (10 steps), cooldown 0.2 (the last 20 steps: from step 80), min_lr_ratio 0.1
AT = (0, 5, 10, 50, 79, 80, 85, 90, 96, 99, 100)
LINEAR = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.775, 0.55, 0.28, 0.145, 0.1]  # 0.1 + 0.9 (1 - t)
# 1 - sqrt(t), t = (s - 80) / 20; floored at 0.1 from t = 0.81 on (s = 96.2)
SQRT = [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 1 - math.sqrt(0.5), 1 - math.sqrt(0.8), 0.1, 0.1]


def _plan(cfg):
    fam = get_family(cfg.model.family)
    base = fam.build_config(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    return get_method(cfg, fam).plan(base, lambda c: step_flops(cfg, fam, c))


def _multipliers(phases):
    """The LR multiplier of every step of the run, phase after phase."""
    return [phase_schedule(p)(s) for p in phases for s in range(p.steps)]


# ------------------------------------------------------------------------------------------- the schedule


def test_wsd_warms_up_holds_the_peak_then_cools_down_linearly_over_the_last_fifth():
    wsd = LRSchedule(steps=100, warmup=0.1, decay="wsd", min_lr_ratio=0.1, cooldown=0.2)
    assert [wsd(s) for s in AT] == pytest.approx(LINEAR, abs=1e-12)


def test_wsd_sqrt_cools_down_as_one_minus_sqrt_floored_at_the_min_lr_ratio():
    sqrt = LRSchedule(steps=100, warmup=0.1, decay="wsd_sqrt", min_lr_ratio=0.1, cooldown=0.2)
    assert [sqrt(s) for s in AT] == pytest.approx(SQRT, abs=1e-12)
    assert sqrt(96) == pytest.approx(0.105573, abs=1e-6) and sqrt(97) == 0.1  # 1 - sqrt(0.85) < 0.1: the floor


def test_a_cooldown_that_rounds_to_no_step_still_gets_one_and_never_starts_inside_the_warmup():
    short = LRSchedule(steps=10, warmup=0.0, decay="wsd", min_lr_ratio=0.0, cooldown=0.01)  # 0.1 step -> 1
    assert [short(s) for s in (0, 8, 9, 10)] == [1.0, 1.0, 1.0, 0.0]
    assert short.cool_from == 9
    overlap = LRSchedule(steps=3, warmup=0.5, decay="wsd", min_lr_ratio=0.0, cooldown=0.5)  # round 2 + round 2 > 3
    assert overlap.cool_from == overlap.warm == 2 and [overlap(s) for s in range(4)] == [0.0, 0.5, 1.0, 0.0]


def test_the_train_sections_wsd_reaches_the_baselines_phase(tmp_path):
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=20, train__warmup=0.1, train__decay="wsd_sqrt",
                   train__cooldown=0.25, train__min_lr_ratio=0.0)
    (phase,) = _plan(cfg)
    assert (phase.decay, phase.cooldown) == ("wsd_sqrt", 0.25)
    lrs = _multipliers([phase])
    # warm-up 2 steps; the peak up to step 15, the cooldown's first (t = 0) of the last 5 steps
    assert lrs[:2] == [0.0, 0.5] and lrs[2:16] == [1.0] * 14
    assert lrs[16:] == pytest.approx([1 - math.sqrt(t / 5) for t in range(1, 5)], abs=1e-12)


def test_the_lr_scheduler_state_resumed_mid_cooldown_continues_the_same_values():
    def scheduler():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
        return opt, LambdaLR(opt, LRSchedule(20, 0.1, "wsd", 0.0, cooldown=0.5))

    opt, sched = scheduler()
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    opt2, sched2 = scheduler()
    for _ in range(13):  # 3 steps into the cooldown (from step 10)
        opt2.step()
        sched2.step()
    state = json.loads(json.dumps(sched2.state_dict()))  # what a checkpoint keeps (JSON, no pickle)
    opt3, sched3 = scheduler()
    sched3.load_state_dict(state)
    opt3.param_groups[0]["lr"] = sched3.get_last_lr()[0]
    resumed = []
    for _ in range(7):
        resumed.append(opt3.param_groups[0]["lr"])
        opt3.step()
        sched3.step()
    assert resumed == lrs[13:] and lrs[13] == pytest.approx(2.0 * 0.7)


# ------------------------------------------------------------------------- methods: one schedule, one cooldown


def _apollo(tmp_path, **over):
    base = dict(model__num_layers=4, train__steps=40, method__apollo__layers=[1, 2, 4],
                method__apollo__boundaries=[0.1, 0.25], train__decay="wsd", train__cooldown=0.2,
                train__min_lr_ratio=0.0)
    return tiny_cfg(tmp_path, method="apollo", **{**base, **over})


def test_apollos_global_schedule_cools_down_once_at_the_end_of_the_whole_run(tmp_path):
    phases = _plan(_apollo(tmp_path))
    total = sum(p.steps for p in phases)
    one = LRSchedule(total, 0.05, "wsd", 0.0, cooldown=0.2)
    lrs = _multipliers(phases)
    assert lrs == [one(s) for s in range(total)]
    start = total - round(0.2 * total)
    assert phases[-1].schedule_offset < start  # the cooldown lies inside the last stage
    assert lrs[2:start + 1] == [1.0] * (start - 1) and lrs[-1] == pytest.approx(1 / round(0.2 * total))
    assert {phase_schedule(p).cool_from for p in phases} == {start}
    # per stage: every stage cools down at its own end instead
    per_stage = _plan(_apollo(tmp_path, method__apollo__schedule="per_stage"))
    assert [phase_schedule(p).cool_from for p in per_stage] == [
        p.steps - max(1, round(0.2 * p.steps)) for p in per_stage]
    assert [p.steps for p in per_stage[:2]] == [4, 6]


def test_the_vcycles_global_schedule_is_one_wsd_over_all_phases_each_at_its_own_peak(tmp_path):
    cfg = tiny_cfg(tmp_path, method="vcycle", train__steps=20, train__decay="wsd", train__cooldown=0.3,
                   train__warmup=0.1, train__min_lr_ratio=0.0, method__vcycle__schedule="global")
    phases = _plan(cfg)
    assert [p.name for p in phases] == ["L0-down", "L1", "L0-up"]
    total = sum(p.steps for p in phases)
    one = LRSchedule(total, 0.1, "wsd", 0.0, cooldown=0.3)
    assert _multipliers(phases) == [one(s) for s in range(total)]
    assert [p.schedule_offset for p in phases] == [0, phases[0].steps, phases[0].steps + phases[1].steps]
    assert [p.peak_lr for p in phases] == [3e-3, 6e-3, 3e-3]  # lr_scale 2 on the coarse level stays
    assert phases[2].schedule_offset < total - round(0.3 * total)  # the cooldown: the last phase's end
    # per phase (the default): each phase its own schedule, the recipe's levels as before
    own = _plan(tiny_cfg(tmp_path, method="vcycle", train__steps=20))
    assert [(p.warmup, p.decay, p.schedule_offset, p.schedule_steps) for p in own] == [
        (0.5, "linear", 0, None), (0.0, "linear", 0, None), (0.0, "linear", 0, None)]


def test_late_expansion_grows_at_four_fifths_of_the_budget_then_cools_down_at_the_end(tmp_path):
    assert overrides("late_expansion", 4) == {
        "method.name": "apollo", "train.decay": "wsd",
        "method.apollo": {"layers": [2, 4], "boundaries": [0.8], "sampler": "none", "map": "stack",
                          "optimizer_state": "mapped", "schedule": "global"}}
    assert overrides("late_expansion_1", 4)["method.apollo"]["layers"] == [1, 4]
    assert overrides("late_expansion", 1)["method.apollo"]["layers"] == [1]  # nothing to grow from: trains 1
    for name, first in (("late_expansion", 2), ("late_expansion_1", 1)):
        over = {k.replace(".", "__"): v for k, v in overrides(name, 4).items() if k != "method.apollo"}
        apollo = {f"method__apollo__{k}": v for k, v in overrides(name, 4)["method.apollo"].items()}
        phases = _plan(tiny_cfg(tmp_path, model__num_layers=4, train__steps=40, **over, **apollo))
        assert [p.config.num_hidden_layers for p in phases] == [first, 4]
        assert phases[0].steps == 32  # grown at 0.8 of train.steps
        total = sum(p.steps for p in phases)
        lrs = _multipliers(phases)
        assert lrs[phases[1].schedule_offset] == 1.0  # the growth runs at the peak: the cooldown comes after
        assert lrs.index(min(lrs[2:])) == total - 1 and lrs[-1] < 1.0


def test_wsd_overrides_for_a_grid_make_the_baseline_cool_down(tmp_path):
    assert WSD == {"train.decay": "wsd", "train.cooldown": 0.2}
    assert WSD_SQRT == {"train.decay": "wsd_sqrt", "train.cooldown": 0.2}
    cfg = load_config(ROOT / "configs" / "default.yaml", {**WSD, "method.name": "baseline"})
    (phase,) = _plan(cfg)
    assert phase_schedule(phase)(phase.steps - 1) < 1.0 and phase_schedule(phase)(phase.steps // 2) == 1.0
    assert {"late_expansion", "late_expansion_1"} <= set(VARIANTS)


# ------------------------------------------------------------------------------------------------- the keys


def test_a_cooldown_enters_the_cache_key_only_under_a_wsd_decay():
    default = ROOT / "configs" / "default.yaml"
    cosine = config_hash(load_config(default))
    assert cosine == "24915ab4a57a98b4"  # tests/unit/config/test_config_marks.py's pinned key of the recipe
    assert config_hash(load_config(default, {"train.cooldown": "0.5"})) == cosine  # no effect under cosine
    assert config_hash(load_config(default, {"method.vcycle.levels.0.up.cooldown": "0.5"})) == cosine
    assert config_hash(load_config(default, {"method.vcycle.schedule": "per_phase"})) == cosine
    wsd = {"method.name": "baseline", "train.decay": "wsd"}
    a, b = (config_hash(load_config(default, {**wsd, "train.cooldown": c})) for c in ("0.2", "0.3"))
    assert a != b and a != config_hash(load_config(default, {"method.name": "baseline"}))
    assert config_hash(load_config(default, {"method.vcycle.schedule": "global"})) != cosine
    up = {"method.vcycle.levels.0.up.decay": "wsd"}
    assert config_hash(load_config(default, {**up, "method.vcycle.levels.0.up.cooldown": "0.3"})) != \
        config_hash(load_config(default, up))


def test_a_resume_may_change_a_cooldown_that_has_no_effect_but_not_one_that_has():
    saved = to_dict(load_config(None))
    assert resume_diff(saved, to_dict(load_config(None, {"train.cooldown": "0.5"}))) == ([], [])
    wsd = to_dict(load_config(None, {"train.decay": "wsd"}))
    refused, _ = resume_diff(wsd, to_dict(load_config(None, {"train.decay": "wsd", "train.cooldown": "0.5"})))
    assert refused == ["train.cooldown: 0.2 -> 0.5"]


# ----------------------------------------------------------------------------------------------- the errors


@pytest.mark.parametrize(("over", "message"), [
    ({"train.cooldown": "0"}, "train.cooldown: a fraction of the schedule's steps in (0, 1], got 0.0"),
    ({"train.cooldown": "1.5"}, "train.cooldown: a fraction of the schedule's steps in (0, 1], got 1.5"),
    ({"train.decay": "wsd", "train.warmup": "0.9"},
     "train.cooldown: warmup + cooldown must be at most 1 (the warm-up 0.9 and the cooldown 0.2 overlap), got 0.2"),
    ({"method.vcycle.levels.0.up.decay": "wsd_sqrt", "method.vcycle.levels.0.up.warmup": "0.5",
      "method.vcycle.levels.0.up.cooldown": "0.6"},
     "method.vcycle.levels[0].up.cooldown: warmup + cooldown must be at most 1 (the warm-up 0.5 and the cooldown "
     "0.6 overlap), got 0.6"),
    ({"method.vcycle.levels.1.down.cooldown": "-0.1"},
     "method.vcycle.levels[1].down.cooldown: a fraction of the schedule's steps in (0, 1], got -0.1"),
    ({"train.decay": "step"}, "train.decay: must be one of linear, cosine, constant, wsd, wsd_sqrt, got 'step'"),
    ({"method.vcycle.schedule": "once"}, "method.vcycle.schedule: 'per_phase' or 'global', got 'once'"),
])
def test_a_schedule_that_cannot_work_is_one_line_naming_the_field(over, message):
    with pytest.raises(ConfigError) as e:
        validate(load_config(None, over))
    assert str(e.value) == message


def test_the_command_line_refuses_an_overlapping_cooldown_in_one_line(tmp_path, capsys):
    code = cli.main(["--output_dir", str(tmp_path), "--train.decay", "wsd", "--train.warmup", "0.95"])
    err = capsys.readouterr().err
    assert code == 2 and err == ("error: train.cooldown: warmup + cooldown must be at most 1 (the warm-up 0.95 and "
                                 "the cooldown 0.2 overlap), got 0.2\n")
    assert cli.main(["--output_dir", str(tmp_path), "--train.warmup", "0.95", "--dry_run"]) == 0  # cosine: no cooldown


# ------------------------------------------------------------------------------------------------ the recipe


def test_the_wsd_late_expansion_recipe_plans_growth_then_one_cooldown():
    cfg = load_config(ROOT / "configs" / "wsd_late_expansion.yaml")
    validate(cfg)
    assert (cfg.method.name, cfg.train.decay, cfg.method.apollo.boundaries) == ("apollo", "wsd", [0.8])
    phases = _plan(cfg)
    assert [p.config.num_hidden_layers for p in phases] == [cfg.model.num_layers // 2, cfg.model.num_layers]
    assert {p.schedule_steps for p in phases} == {sum(p.steps for p in phases)}


@pytest.mark.slow
def test_sigkill_mid_cooldown_then_resume_matches_the_uninterrupted_run_row_for_row(tmp_path):
    """Late expansion under WSD (1 -> 2 layers at step 6 of 14; the cooldown over the last 6 steps, from step 8 on):
    killed after step 13, resumed from the checkpoint of step 12, inside the cooldown; every row equals the
    uninterrupted run's but measured time."""
    over = dict(method="apollo", model__num_layers=2, model__dropout=0.1, train__steps=12, train__decay="wsd",
                train__cooldown=0.4, train__warmup=0.1, train__checkpoint_every=12, train__eval_every=4,
                method__apollo__layers=[1, 2], method__apollo__boundaries=[0.5], method__apollo__sampler="none",
                method__apollo__map="stack", method__apollo__optimizer_state="mapped")
    ref = tiny_cfg(tmp_path / "ref", **over)
    Trainer(ref).run()
    train = rows(ref.run_dir, "train")
    total = len(train)
    cool_from = total - round(0.4 * total)
    assert 12 > cool_from and total > 13  # the checkpoint at step 12 is mid-cooldown, the kill after it
    lr = [r["lr"] for r in train]
    assert lr[cool_from] == lr[cool_from - 1] and lr[12] < lr[cool_from] and lr[-1] < lr[12]
    cfg = tiny_cfg(tmp_path / "killed", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    killed = train_cli(path, env={KILL_ENV: "13"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert read_state(list_checkpoints(cfg.run_dir)[-1])["step"] == 12
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert assert_same_rows(ref.run_dir, cfg.run_dir) > total
