"""DDP on CPU: torchrun with 2 processes (gloo) through V-cycle level changes."""

import json
from pathlib import Path

import numpy as np
import pytest

from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg, torchrun

pytestmark = pytest.mark.slow  # every test starts 2 torchrun processes


def test_ddp_two_processes_run_a_vcycle_and_match_one_process(ddp_reference, tmp_path):
    over = dict(train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
    cfg = ddp_reference(**over)  # the same run as tests/unit/run/test_fsdp.py's V-cycle reference: trained once
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert [t["to"] for t in summary["transitions"]] == ["L1", "L0-up"]
    one = tiny_cfg(tmp_path / "one", **over)
    Trainer(one).run()
    # Same global batch per step, split over the ranks: the losses agree up to reduction order.
    la = [r["loss"] for r in rows(cfg.run_dir, "train")]
    lb = [r["loss"] for r in rows(one.run_dir, "train")]
    assert len(la) == len(lb) and np.allclose(la, lb, rtol=0, atol=1e-4), (la, lb)


def test_compare_under_torchrun_trains_each_method_as_its_own_run_would(ddp_reference, tmp_path):
    """``train.py --compare`` under torchrun: the processes train every method in one process group (the first
    method's end once destroyed it, and the second found none), and only the main process checks the
    comparison's folder (another process found the folder the main one had just made, and refused)."""
    from progressive.config import dump_yaml
    from tests.train_utils import assert_same_rows, train_cli

    over = dict(train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
    ref = ddp_reference(**over)  # the V-cycle alone, on 2 processes
    cfg = tiny_cfg(tmp_path, **over, name="both")
    path = tmp_path / "both.yaml"
    path.write_text(dump_yaml(cfg))
    proc = train_cli(path, "--compare", "baseline,vcycle", nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((cfg.run_dir / "vcycle" / "summary.json").read_text())["world_size"] == 2
    assert assert_same_rows(ref.run_dir, cfg.run_dir / "vcycle") > 0
    assert {r["method"] for r in json.loads((cfg.run_dir / "compare.json").read_text())["results"]} == \
        {"baseline", "vcycle"}


def test_processes_that_see_a_finished_run_differently_exit_together(tmp_path):
    """One rank decided "finished run, exit 0" while the other saw no summary yet and waited in a collective for
    minutes: the main process decides finished / resume / fresh once, for every process."""

    from progressive.config import dump_yaml
    from progressive.run.faults import UNSEEN_ENV
    from tests.train_utils import train_cli

    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__threads=1, train__steps=4)
    Trainer(cfg).run()  # finished here: the decision reads its folder, not how many processes wrote it
    recipe = Path(cfg.output_dir) / f"{cfg.name}.yaml"
    recipe.write_text(dump_yaml(cfg))
    # --resume auto: its checks (no checkpoint here, so not "resume"; finished, so not "fresh") end where plain
    # --resume's does (progressive/run/start.py decide); plain --resume on one process: test_bad_input.py
    proc = train_cli(recipe, "--resume", "auto", env={UNSEEN_ENV: "1"}, nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is a finished run" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_sharded_checkpoint_resumes_under_plain_python(tmp_path):
    """A checkpoint written by 2 FSDP2 processes, resumed by one process started with ``python`` (no launcher):
    it said "RANK expected"; a group of one is made for it."""

    from progressive.run.faults import SIGNAL_ENV
    from tests.train_utils import train_cli

    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__threads=1, train__steps=6,
                   train__checkpoint_every=2, train__fsdp=True)
    recipe = Path(cfg.output_dir) / f"{cfg.name}.yaml"
    from progressive.config import dump_yaml

    recipe.write_text(dump_yaml(cfg))
    stopped = train_cli(recipe, env={SIGNAL_ENV: "4:SIGTERM"}, nproc=2)
    assert stopped.returncode != 0 and "stopped" in stopped.stderr.lower(), stopped.stderr[-2000:]
    resumed = train_cli(recipe, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((cfg.run_dir / "summary.json").read_text())["world_size"] == 1


def test_cooldown_branches_under_ddp_score_what_one_process_scores(tmp_path):
    """train.branches on two processes (progressive/run/branches.py): every rank forks, cools down and puts its
    state back together; the branches and the run score what they score on one process (the batch of a step is
    the same global batch whatever the world size). No train.cpu: on a host without a GPU, Accelerate once ran
    every process as rank 0 (one was refused the run folder's lock held by its sibling, the other failed in gloo);
    the processes now train on the CPU, together."""
    import torch

    wsd = {"method": "baseline", "train__steps": 40, "train__warmup": 0.1, "train__decay": "wsd",
           "train__cooldown": 0.2, "train__min_lr_ratio": 0.0, "train__eval_every": 10, "data__test_fraction": 0.1,
           "train__branches": [20, 30]}
    one, two = tiny_cfg(tmp_path / "one", name="b", **wsd), tiny_cfg(tmp_path / "two", name="b", **wsd)
    Trainer(one).run()
    proc = torchrun(two, nproc=2)  # asserts the summary's world size
    if not torch.cuda.is_available():
        assert "the 2 processes train on the CPU" in proc.stderr
    a, b = (json.loads((c.run_dir / "branches.json").read_text()) for c in (one, two))
    assert [r["steps"] for r in b] == [20, 30]
    for x, y in zip(a, b):
        assert (x["val_loss"], x["test_loss"]) == pytest.approx((y["val_loss"], y["test_loss"]), abs=1e-5)
    sa, sb = (json.loads((c.run_dir / "summary.json").read_text()) for c in (one, two))
    assert sb["world_size"] == 2 and sa["final_test_loss"] == pytest.approx(sb["final_test_loss"], abs=1e-5)
