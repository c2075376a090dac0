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
