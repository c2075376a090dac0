"""Test-wide settings: offline, quiet, deterministic, one torch thread (CI has 2 cores, shared with other jobs, and
under pytest-xdist the workers share them too); and a check that no test leaves process-wide state changed
(``global_state``)."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch's threads in every process a test starts (see below)

import torch  # noqa: E402

# One thread: the tests' tensors are tiny, and a second thread only waits for a core. Where the cores are busy
# (pytest -n 2, other jobs) every parallel region waits a scheduler slice for it: a tiny training run took 8 s at
# two threads on a loaded 2-core machine and 0.7 s at one (tests/train_utils.tiny_cfg and configs/tiny_test.yaml
# run one thread too, so a run in a subprocess computes what one in here does).
torch.set_num_threads(1)

import pytest  # noqa: E402
from global_state import _no_global_state_left, _no_global_state_left_by_module  # noqa: E402, F401

# A test that changes process-wide state (environment, working directory, threads, signal handlers, the root
# logger, torch._dynamo.config, the method registry) and leaves it changed fails (tests/global_state.py).
pytest_plugins = ["pytester"]  # tests/unit/project/test_global_state.py runs the check on tests of its own


def pytest_collection_modifyitems(config, items):
    """The slow tier's files first, each file's slow tests first: under ``-n 2 --dist loadfile`` the long runs then
    start while the other worker is busy too, and the quick files even out the end, rather than one worker finishing
    a two-minute check alone while the other idles (the full suite's last 4% took 2.5 of its 15 minutes in the order
    of collection). The order within each tier is collection's, so a file's module-scoped runs are still shared.
    Under ``-p randomly`` the shuffled order stays as it is."""
    if config.pluginmanager.has_plugin("randomly"):
        return
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.nodeid.split("::")[0] not in slow, item.get_closest_marker("slow") is None))


@pytest.fixture
def registered_method():
    """``registered_method(name, cls)``: ``progressive.methods.register_method`` for a test's own method, undone after
    the test (the method and its recipe section), so the registry is as the next test expects."""
    from progressive.config.methods import METHOD_OPTIONS
    from progressive.methods import METHODS, register_method

    names: list[str] = []

    def register(name, cls):
        names.append(name)
        return register_method(name, cls)

    yield register
    for name in names:
        cls = METHODS.pop(name, None)
        if cls is not None and cls.options is not None and METHOD_OPTIONS.get(name) is cls.options:
            METHOD_OPTIONS.pop(name)


@pytest.fixture
def settled_dynamo():
    """torch._dynamo.config for a test that compiles in this process: ``progressive.run.compiled.settle_dynamo`` sets
    three of its settings process-wide (a run's process keeps them); here they are put back after the test, through
    dynamo's own patching (monkeypatch.setattr on the config deleted the setting under pytest 9.2). Yields the
    config; a test changes further settings with ``torch._dynamo.config.patch(...)``."""
    import torch._dynamo.config as dynamo

    names = ("recompile_limit", "accumulated_recompile_limit", "automatic_dynamic_shapes")
    with dynamo.patch({name: getattr(dynamo, name) for name in names}):
        yield dynamo


class _DDPRuns:
    """``ddp_reference(**overrides)``: the tiny run of ``tests.train_utils.tiny_cfg(**overrides)`` trained by 2
    torchrun processes (DDP over gloo), once per test session; the tests that compare with it only read it.
    Two requests whose configs are equal (the output folder aside) get the same run. ``many`` trains several
    references, and more 2-process runs of the caller's, in one launch (``resume="auto"``: with ``--resume auto``,
    so that a run of the caller's with a checkpoint resumes while the references start fresh; ``last_env``: the
    environment of the caller's last run alone, a kill or a stop that ends the launch, tests/train_many.py);
    ``launch`` is the last launch's finished process."""

    def __init__(self, tmp_path_factory):
        self.tmp, self.runs, self.launch = tmp_path_factory, {}, None

    def __call__(self, **overrides):
        return self.many([overrides])[0]

    def many(self, overrides: list[dict], *others, resume: bool | str = False, last_env: dict | None = None):

        from progressive.config import dump_yaml
        from tests.train_utils import tiny_cfg, torchrun

        keys = [dump_yaml(tiny_cfg(Path("/ddp"), **over)) for over in overrides]
        todo = {}
        for key, over in zip(keys, overrides):
            if key not in self.runs and key not in todo:
                todo[key] = tiny_cfg(self.tmp.mktemp("ddp"), **over)
        if todo or others:
            self.launch = torchrun(*todo.values(), *others, nproc=2, resume=resume, last_env=last_env)
        self.runs.update(todo)
        return [self.runs[key] for key in keys]


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory):
    """The session's DDP reference runs (``_DDPRuns``)."""
    return _DDPRuns(tmp_path_factory)
