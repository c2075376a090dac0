"""Test-wide settings: offline, quiet, deterministic, small thread count (CI has 2 cores)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """``ddp_reference(**overrides)``: the tiny run of ``tests.train_utils.tiny_cfg(**overrides)`` trained by 2
    torchrun processes (DDP over gloo), once per test session; the tests that compare with it only read it.
    Two requests whose configs are equal (the output folder aside) get the same run."""
    from pathlib import Path

    from progressive.config import dump_yaml
    from tests.train_utils import tiny_cfg, torchrun

    runs = {}

    def get(**overrides):
        key = dump_yaml(tiny_cfg(Path("/ddp"), **overrides))
        if key not in runs:
            cfg = tiny_cfg(tmp_path_factory.mktemp("ddp"), **overrides)
            torchrun(cfg, nproc=2)
            runs[key] = cfg
        return runs[key]

    return get
