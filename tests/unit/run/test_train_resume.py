"""Kill-and-resume: SIGKILL right after a level change, --resume, and the run continues step for step."""

import os
import signal
import subprocess
import sys

import pytest

from progressive.config import dump_yaml
from progressive.run.checkpoint import list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import ROOT, assert_same_rows, rows, tiny_cfg, train_here


def _train(config_path, *extra, env=None):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(config_path), *extra],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.slow
def test_sigkill_right_after_a_level_change_then_resume_matches_the_uninterrupted_run_exactly(tmp_path):
    # Dropout on, so the restored RNG state matters; checkpoints only at level changes (every 100 steps
    # otherwise), so the resume starts from the checkpoint written by the coalescing transition at step 2.
    over = dict(model__dropout=0.1, train__checkpoint_every=100, train__eval_every=3, train__steps=10)
    ref = tiny_cfg(tmp_path / "ref", **over)
    Trainer(ref).run()
    cfg = tiny_cfg(tmp_path / "killed", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    phases = [r["phase_name"] for r in rows(ref.run_dir, "train")]
    change = phases.index("L1")  # first step of the small level (0-based index = steps done before it)
    killed = _train(path, env={**os.environ, KILL_ENV: str(change + 1)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    ckpts = [read_state(p) for p in list_checkpoints(cfg.run_dir)]
    assert ckpts[-1]["step"] == change and ckpts[-1]["phase_name"] == "L1"  # the transition checkpoint
    assert rows(cfg.run_dir, "train")[-1]["step"] == change + 1  # it died after logging step change+1
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    n = assert_same_rows(ref.run_dir, cfg.run_dir)  # every key but measured time, bit for bit
    print(f"resume matrix | vcycle | rows compared {n} | rows equal {n}")
    assert {r["phase_name"] for r in rows(cfg.run_dir)} == {"L0-down", "L1", "L0-up"}
