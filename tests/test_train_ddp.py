"""DDP on CPU: torchrun with 2 processes (gloo) through V-cycle level changes."""

import json
import subprocess
import sys

import numpy as np

from progressive.config import dump_yaml
from progressive.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg


def test_ddp_two_processes_run_a_vcycle_and_match_one_process(tmp_path):
    # `accelerate launch --cpu --num_processes 2` starts ONE process with accelerate 1.15 (NOTES.md);
    # torchrun + Accelerator(cpu=True) gives a real 2-process gloo group.
    over = dict(train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
    cfg = tiny_cfg(tmp_path / "ddp", **over)
    path = tmp_path / "ddp.yaml"
    path.write_text(dump_yaml(cfg))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train.py"), "--config", str(path)],
                          capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert [t["to"] for t in summary["transitions"]] == ["L1", "L0-up"]
    one = tiny_cfg(tmp_path / "one", **over)
    Trainer(one).run()
    # Same global batch per step, split over the ranks: the losses agree up to reduction order.
    la = [r["loss"] for r in rows(cfg.run_dir, "train")]
    lb = [r["loss"] for r in rows(one.run_dir, "train")]
    assert len(la) == len(lb) and np.allclose(la, lb, rtol=0, atol=1e-4), (la, lb)
