"""Test-wide settings: offline, quiet, deterministic, small thread count (CI has 2 cores; under pytest-xdist the
workers share them)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # -n N: N test processes share the cores
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

import pytest  # noqa: E402


class _DDPRuns:
    """``ddp_reference(**overrides)``: the tiny run of ``tests.train_utils.tiny_cfg(**overrides)`` trained by 2
    torchrun processes (DDP over gloo), once per test session; the tests that compare with it only read it.
    Two requests whose configs are equal (the output folder aside) get the same run. ``many`` trains several
    references, and more 2-process runs of the caller's, in one launch."""

    def __init__(self, tmp_path_factory):
        self.tmp, self.runs = tmp_path_factory, {}

    def __call__(self, **overrides):
        return self.many([overrides])[0]

    def many(self, overrides: list[dict], *others):
        from pathlib import Path

        from progressive.config import dump_yaml
        from tests.train_utils import tiny_cfg, torchrun

        keys = [dump_yaml(tiny_cfg(Path("/ddp"), **over)) for over in overrides]
        todo = {}
        for key, over in zip(keys, overrides):
            if key not in self.runs and key not in todo:
                todo[key] = tiny_cfg(self.tmp.mktemp("ddp"), **over)
        if todo or others:
            torchrun(*todo.values(), *others, nproc=2)
        self.runs.update(todo)
        return [self.runs[key] for key in keys]


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """The session's DDP reference runs (``_DDPRuns``)."""
    return _DDPRuns(tmp_path_factory)
