"""train.compile: Accelerate compiles the model with inductor in prepare (so again after every change);
methods still see the plain module; the compiled steps compute what the eager ones compute."""

import numpy as np
from accelerate.utils import is_compiled_module

from progressive.trainer import Trainer
from tests.train_utils import rows, tiny_cfg


def test_compiled_training_matches_eager_and_reports_compile_time(tmp_path):
    runs = {}
    for compile_ in (False, True):
        cfg = tiny_cfg(tmp_path / str(compile_), method="baseline", train__steps=3, train__compile=compile_,
                       train__eval_every=100)
        tr = Trainer(cfg)
        tr.run()
        runs[compile_] = rows(cfg.run_dir, "train")
        assert is_compiled_module(tr.model) == compile_ and not is_compiled_module(tr.raw)
    assert np.allclose([r["loss"] for r in runs[False]], [r["loss"] for r in runs[True]], rtol=0, atol=1e-5)
    assert "compile_s" not in runs[False][-1]
    assert 0 < runs[True][-1]["compile_s"] <= runs[True][-1]["wall"]  # the first step's time, part of wall
