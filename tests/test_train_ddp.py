"""DDP on CPU: torchrun with 2 processes (gloo) through V-cycle level changes."""

import json

import numpy as np

from progressive.run.trainer import Trainer
from tests.train_utils import rows, tiny_cfg, torchrun


def test_ddp_two_processes_run_a_vcycle_and_match_one_process(tmp_path):
    over = dict(train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
    cfg = tiny_cfg(tmp_path / "ddp", **over)
    torchrun(cfg, nproc=2)
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert [t["to"] for t in summary["transitions"]] == ["L1", "L0-up"]
    one = tiny_cfg(tmp_path / "one", **over)
    Trainer(one).run()
    # Same global batch per step, split over the ranks: the losses agree up to reduction order.
    la = [r["loss"] for r in rows(cfg.run_dir, "train")]
    lb = [r["loss"] for r in rows(one.run_dir, "train")]
    assert len(la) == len(lb) and np.allclose(la, lb, rtol=0, atol=1e-4), (la, lb)


def test_processes_that_see_a_finished_run_differently_exit_together(tmp_path):
    """One rank decided "finished run, exit 0" while the other saw no summary yet and waited in a collective for
    minutes: the main process decides finished / resume / fresh once, for every process."""
    from pathlib import Path

    from progressive.run.faults import UNSEEN_ENV
    from tests.train_utils import train_cli

    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True, train__threads=1, train__steps=4)
    torchrun(cfg, nproc=2)
    recipe = Path(cfg.output_dir) / f"{cfg.name}.yaml"
    for flag in ("--resume", "--resume=auto"):
        proc = train_cli(recipe, *flag.split("="), env={UNSEEN_ENV: "1"}, nproc=2, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "is a finished run" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
