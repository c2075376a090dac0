"""AutoFreeze across a crash and across processes: SIGKILL right after a freeze decision and between two
decisions, then --resume, gives the uninterrupted loss trajectory; torchrun with 2 processes (gloo)
freezes the same prefix on both ranks and matches one process."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from progressive.config import dump_yaml
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import ROOT, assert_same_rows, rows, tiny_cfg, torchrun, train_here

OVER = dict(method="autofreeze", model__num_layers=4, model__dropout=0.1, train__steps=12, train__eval_every=4,
            train__checkpoint_every=1, data__max_tokens=3000, method__autofreeze__freeze_every=3,
            method__autofreeze__criterion="argmin", method__autofreeze__alpha=0.5)


def _train(path, *extra, env=None):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(path), *extra],
                          capture_output=True, text=True, timeout=400, cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, trained once for both kill points (each test only reads it)."""
    ref = tiny_cfg(tmp_path_factory.mktemp("ref"), **OVER)
    Trainer(ref).run()
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [3, 5])  # 3: right after the first decision; 5: between decisions
def test_sigkill_then_resume_continues_the_same_run_bit_for_bit(tmp_path, reference, kill_after):
    ref = reference
    assert rows(ref.run_dir, "train")[3]["frozen"] > 0  # a decision happened after step 3
    cfg = tiny_cfg(tmp_path / "killed", **OVER)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    killed = _train(path, env={KILL_ENV: str(kill_after)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming gpt2-autofreeze from step {kill_after}" in resumed.stderr
    n = assert_same_rows(ref.run_dir, cfg.run_dir)  # every key but measured time, bit for bit
    print(f"resume matrix | autofreeze (kill after step {kill_after}) | rows compared {n} | rows equal {n}")


@pytest.mark.slow
def test_ddp_two_processes_freeze_the_same_prefix_and_match_one_process(tmp_path):
    over = {**OVER, "model__dropout": 0.0, "train__cpu": True, "train__threads": 1, "train__checkpoint_every": 100,
            "model__tie_word_embeddings": False, "method__autofreeze__cache__enabled": True,
            "train__steps": 24}  # about two epochs: samples come back
    cfg = tiny_cfg(tmp_path / "ddp", **over)
    torchrun(cfg, nproc=2)
    one = tiny_cfg(tmp_path / "one", **over)
    Trainer(one).run()
    a, b = rows(cfg.run_dir, "train"), rows(one.run_dir, "train")
    assert [r["frozen"] for r in a] == [r["frozen"] for r in b] and a[-1]["frozen"] > 0
    assert np.allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=0, atol=1e-4)
    # FLOPs count what ran, summed over ranks: a rank hits only samples it drew itself, one process any
    # sample it saw, so DDP runs at least as much prefix as one process, and its cache still saved some
    assert b[-1]["flops"] <= a[-1]["flops"] and a[-1]["cache_hit_rate"] > 0
