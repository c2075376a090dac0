"""WSD cooldown branches (progressive/run/branches.py, ``train.branches``): a branch of b steps forked off a run's
stable phase is the run of b steps with that run's warm-up, trained directly, loss for loss; the run it forks off
goes on as if no branch had run; a resumed run keeps the branches it recorded; a field added later keeps every
earlier run's cache key."""

import json
import signal

import pytest

from bench.lib.runs import config_hash
from progressive.config import ConfigError, dump_yaml, load_config, to_dict, validate
from progressive.config.schema import counted
from progressive.run.checkpoint import list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import ROOT, assert_same_rows, tiny_cfg, train_cli, train_here

# 40 steps, a warm-up of 4 (0.1), cooldown 0.2: the branches of 20 and 30 steps fork at steps 16 and 24
WSD = {"method": "baseline", "train__steps": 40, "train__warmup": 0.1, "train__decay": "wsd", "train__cooldown": 0.2,
       "train__min_lr_ratio": 0.0, "train__eval_every": 10, "train__checkpoint_every": 5, "data__test_fraction": 0.1}


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The run with branches of 20 and 30 steps, the same run without, and the 20- and 30-step runs with its
    warm-up (4 steps) trained directly."""
    out = tmp_path_factory.mktemp("branches")
    cfgs = {"branched": tiny_cfg(out, name="branched", train__branches=[20, 30], **WSD),
            "plain": tiny_cfg(out, name="plain", **WSD),
            **{b: tiny_cfg(out, name=f"direct{b}", **{**WSD, "train__steps": b, "train__warmup": 4 / b})
               for b in (20, 30)}}
    for cfg in cfgs.values():
        Trainer(cfg).run()
    return {k: cfg.run_dir for k, cfg in cfgs.items()}


def test_a_branch_is_the_run_of_its_length_with_the_runs_warm_up_trained_directly(runs):
    branches = json.loads((runs["branched"] / "branches.json").read_text())
    assert [(r["steps"], r["fork_step"], r["cooldown_steps"], r["warmup_steps"]) for r in branches] == [
        (20, 16, 4, 4), (30, 24, 6, 4)]
    for row in branches:
        direct = _summary(runs[row["steps"]])
        assert row["val_loss"] == pytest.approx(direct["final_val_loss"], abs=1e-6)
        assert row["test_loss"] == pytest.approx(direct["final_test_loss"], abs=1e-6)
        assert (row["flops"], row["tokens"]) == (direct["flops"], direct["tokens"])
        assert row["same_as"] == {"train.steps": row["steps"], "train.warmup": 4 / row["steps"]}
        assert row["extra_flops"] == direct["flops"] * row["cooldown_steps"] // row["steps"]
    # the branch is not the run itself cut short: a cooldown changed its loss
    assert abs(branches[0]["val_loss"] - _val_at(runs["plain"], 20)) > 1e-4
    assert _summary(runs["branched"])["branches"] == branches


def _val_at(run_dir, step):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r["val_loss"] for r in rows if r["kind"] == "val" and r["step"] == step)


def test_the_run_goes_on_as_if_no_branch_had_run(runs):
    assert assert_same_rows(runs["plain"], runs["branched"]) > 40
    a, b = _summary(runs["plain"]), _summary(runs["branched"])
    assert a["final_test_loss"] == b["final_test_loss"] and "branches" not in a


def test_a_resumed_run_keeps_its_branches_and_runs_the_rest_at_their_forks(tmp_path, runs):
    """Killed after step 22 (the branch of 20 recorded at its fork, step 16): the resume from the checkpoint at
    step 20 keeps that branch and runs the branch of 30 at its fork, step 24."""
    cfg = tiny_cfg(tmp_path, name="branched", train__branches=[20, 30], **{**WSD, "train__checkpoint_every": 10})
    path = tmp_path / "branched.yaml"
    path.write_text(dump_yaml(to_dict(cfg)))
    killed = train_cli(path, env={KILL_ENV: "22"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert read_state(list_checkpoints(cfg.run_dir)[-1])["step"] == 20
    assert [r["steps"] for r in json.loads((cfg.run_dir / "branches.json").read_text())] == [20]
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "branch of 20 steps" not in resumed.stderr and "branch of 30 steps: cooling down" in resumed.stderr
    assert _measured(cfg.run_dir) == _measured(runs["branched"])


def _measured(run_dir):
    """A run's branches.json without the seconds each branch took."""
    return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads((run_dir / "branches.json").read_text())]


def test_a_run_resumed_past_a_fork_says_which_branches_it_cannot_run(tmp_path):
    cfg = tiny_cfg(tmp_path, name="late", **WSD)
    path = tmp_path / "late.yaml"
    path.write_text(dump_yaml(to_dict(cfg)))
    killed = train_cli(path, env={KILL_ENV: "27"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    path.write_text(dump_yaml({**to_dict(cfg), "train": {**to_dict(cfg)["train"], "branches": [20, 30]}}))
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed at step 25, past the fork of the branches of [20, 30] steps" in resumed.stderr
    assert not (cfg.run_dir / "branches.json").exists()


@pytest.mark.parametrize("over, said", [
    ({"train__decay": "cosine"}, "train.branches: a cooldown branch forks off a WSD schedule's stable phase, and "
                                 "train.decay is 'cosine'"),
    ({"train__branches": [40]}, "train.branches: a branch is shorter than the run (40 steps), got 40"),
    ({"train__branches": [30, 20]}, "train.branches: step counts, increasing and distinct, got [30, 20]"),
    ({"train__branches": [4]}, "train.branches: the branch of 4 steps would cool down from step 3, inside the run's "
                               "warm-up (4 steps); the shortest is 5 steps"),
    ({"method": "vcycle"}, "train.branches: cooldown branches fork the baseline trained by data parallelism; the "
                           "method is 'vcycle'"),
])
def test_branches_that_cannot_fork_are_refused_in_one_line(tmp_path, over, said):
    cfg = tiny_cfg(tmp_path, **{**WSD, "train__branches": [20], **over})
    with pytest.raises(ConfigError) as e:
        validate(cfg)
        Trainer(cfg)
    assert str(e.value).startswith(said)


def test_branches_enter_the_cache_key_only_when_a_run_lists_some():
    recipe = ROOT / "configs" / "tiny_test.yaml"
    plain = load_config(recipe, {"train.decay": "wsd"})
    assert "branches" not in counted(to_dict(plain))["train"]
    branched = load_config(recipe, {"train.decay": "wsd", "train.branches": "[10]"})
    assert counted(to_dict(branched))["train"]["branches"] == [10]
    assert config_hash(branched) != config_hash(plain)


def test_the_grid_scale_check_runs_and_finds_each_branch_equal_to_its_twin(tmp_path):
    """bench/claims/wsd_branches.py on the smoke grid: the branch and the run it is, trained directly, agree."""
    from bench.claims import wsd_branches

    wsd_branches.main(["--smoke", "--out", str(tmp_path / "out")])
    got = json.loads((tmp_path / "out" / "wsd_branches.json").read_text())
    assert [r["branch_minus_twin"] for r in got["results"]] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert got["flops_with_branches"] < got["flops_trained_directly"]
