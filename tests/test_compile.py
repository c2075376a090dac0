"""train.compile: Accelerate compiles the model with inductor in prepare (so again after every change);
methods still see the plain module; the compiled steps compute what the eager ones compute. Accelerate's
settings hold per process, so the compiled run gets its own process."""

import json
import subprocess
import sys

import numpy as np
import pytest
from accelerate.utils import is_compiled_module

from progressive.config import dump_yaml
from progressive.run.trainer import Trainer
from tests.train_utils import ROOT, rows, tiny_cfg


@pytest.mark.slow
def test_compiled_training_matches_eager_and_reports_compile_time(tmp_path):
    over = dict(method="baseline", train__steps=3, train__eval_every=100)
    eager = tiny_cfg(tmp_path / "eager", **over)
    tr = Trainer(eager)
    tr.run()
    assert not is_compiled_module(tr.model)
    compiled = tiny_cfg(tmp_path / "compiled", train__compile=True, **over)
    path = tmp_path / "compiled.yaml"
    path.write_text(dump_yaml(compiled))
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(path)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = rows(eager.run_dir, "train"), rows(compiled.run_dir, "train")
    assert np.allclose([r["loss"] for r in a], [r["loss"] for r in b], rtol=0, atol=1e-5)
    assert "compile_s" not in a[-1] and 0 < b[-1]["compile_s"] <= b[-1]["wall"]  # the first step, part of wall
    assert json.loads((compiled.run_dir / "summary.json").read_text())["steps"] == 3
