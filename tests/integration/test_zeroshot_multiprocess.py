"""eval.zeroshot under torchrun with 2 CPU processes: requests are sharded, gathered, and the numbers equal
a single-process run (docs/cluster.md: `accelerate launch --cpu` starts only one process; torchrun gives 2)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from test_zeroshot_helpers import REPO, make_tiny_gpt2

from eval import zeroshot
from tests.procs import run_tree

pytestmark = pytest.mark.slow  # 2 torchrun processes


def test_two_process_run_equals_single_process(tmp_path):
    ckpt = make_tiny_gpt2(tmp_path / "ckpt", n_positions=64)
    args = [str(ckpt), "--tasks", "lambada,ptb", "--limit", "451", "--batch_size", "2", "--cpu"]  # words: 7 passages
    single = zeroshot.main([*args, "--output", str(tmp_path / "single.json")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "eval.zeroshot",
           *args, "--output", str(tmp_path / "multi.json")]
    run_tree(cmd, cwd=REPO, env=env, check=True, text=False, timeout=240)
    multi = json.loads((tmp_path / "multi.json").read_text())
    assert multi["num_processes"] == 2 and single["num_processes"] == 1
    for task in ("lambada", "ptb"):
        for metric, value in single["results"][task].items():
            if metric != "seconds":  # a number within rounding; text (what was scored) exactly: pytest 9.2's approx
                # refuses a string where 9.0 compared it
                want = pytest.approx(value, rel=1e-6) if isinstance(value, int | float) else value
                assert multi["results"][task][metric] == want, (task, metric)
