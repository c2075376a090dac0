"""A pytest plugin: a test that changes process-wide state and leaves it changed fails, naming what changed.

A test that changes process-wide state and leaves it changed breaks the tests after it in the same worker, and only
in some orders: a monkeypatch.setattr on torch._dynamo.config under pytest 9.2 deleted the setting at teardown
(pytest restores what the module's ``__dict__`` held, and dynamo's settings live elsewhere), and every later
compile in that worker failed with "torch._dynamo.config.recompile_limit does not exist". Each test is checked: the
state ``_global_state`` reads must be as the test found it once its fixtures are torn down, or the test errors
naming what changed, and the state is put back (so the tests after it are not failed too). Change such state
through monkeypatch (setenv, chdir), ``torch._dynamo.config.patch(...)``, or try/finally.

tests/conftest.py imports the fixtures; ``pytest -p global_state`` loads them elsewhere
(tests/unit/project/test_global_state.py).
"""

import ast
import logging
import os
import signal
import sys
import threading

import pytest
import torch
import torch._dynamo.config  # loaded by transformers' models anyway

_MISSING = "<missing>"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Environment variables a module sets when it is first imported, which in a test process happens in whichever test
# imports it first: put back after each test without failing it, so that the tests after it (and the processes they
# start) find the same environment in any order.
SET_ON_IMPORT = {
    "HF_XET_HIGH_PERFORMANCE": "lm_eval's package",
    "KMP_DUPLICATE_LIB_OK": "scikit-learn's package",
    "KMP_INIT_AT_FORK": "scikit-learn's package",
    "CUBLAS_WORKSPACE_CONFIG": "torch._inductor.fx_passes.numeric_utils",
    "THP_MEM_ALLOC_ENABLE": "bench's claims and timing scripts, for the torch of their own process",
}


def _global_state() -> dict[str, object]:
    """The process-wide state a test must leave as it found it, one entry per thing to name in a failure."""
    state: dict[str, object] = {f"os.environ[{k!r}]": v for k, v in os.environ.items()
                                if k != "PYTEST_CURRENT_TEST"}  # pytest's own, set for each phase
    state["the working directory"] = os.getcwd()
    state["torch.get_num_threads()"] = torch.get_num_threads()
    state["torch.get_num_interop_threads()"] = torch.get_num_interop_threads()
    config = torch._dynamo.config.get_config_copy()
    for name, value in config.items():
        if not name.startswith("_"):  # hasattr: a deleted setting still has its value in the copy
            state[f"torch._dynamo.config.{name}"] = value if hasattr(torch._dynamo.config, name) else _MISSING
    for s in _SIGNALS:
        state[f"the {signal.Signals(s).name} handler"] = signal.getsignal(s)
    if threading.current_thread() is threading.main_thread():
        fd = signal.set_wakeup_fd(-1)  # reading it means setting it: put it straight back
        signal.set_wakeup_fd(fd)
        state["signal.set_wakeup_fd"] = fd
    root = logging.getLogger()
    state["the root logger's level"] = root.level
    state["the root logger's handlers"] = [h for h in root.handlers if not type(h).__module__.startswith("_pytest")]
    state["the root logger's filters"] = list(root.filters)
    state["logging.disable"] = logging.root.manager.disable
    state.update(_registered_outside())
    return state


# the registries a test's own method enters: (module, table)
_REGISTRIES = (("progressive.methods.base", "METHODS"), ("progressive.config.methods", "METHOD_OPTIONS"))


def _registered_outside() -> dict[str, object]:
    """The methods (and their recipe sections) registered by code outside progressive/, such as a test's toy method:
    one left registered changes which names the registry lists for every test after it in the worker."""
    state: dict[str, object] = {}
    for module, table in _REGISTRIES:
        if module in sys.modules:
            outside = sorted(name for name, cls in getattr(sys.modules[module], table).items()
                             if not cls.__module__.startswith("progressive."))
            if outside:  # none is no entry, so that a test which first imports the registry changes nothing
                state[f"{table} (entries from outside progressive/)"] = outside
    return state


def _restore(before: dict[str, object], changed: list[str]) -> None:
    """Put back each entry of ``before`` named in ``changed``."""
    for name in changed:
        value = before.get(name, _MISSING)
        if name.startswith("os.environ["):
            key = ast.literal_eval(name[len("os.environ["):-1])
            if value is _MISSING:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        elif name.startswith("torch._dynamo.config."):
            setattr(torch._dynamo.config, name.rsplit(".", 1)[1], value)  # a deleted setting comes back too
        elif name.startswith("the SIG") and value is not None:  # None: a handler set outside Python
            signal.signal(getattr(signal, name.split()[1]), value)
    if "the working directory" in changed:
        os.chdir(before["the working directory"])
    if "torch.get_num_threads()" in changed:
        torch.set_num_threads(before["torch.get_num_threads()"])
    if "signal.set_wakeup_fd" in changed:
        signal.set_wakeup_fd(before["signal.set_wakeup_fd"])
    root = logging.getLogger()
    if "the root logger's level" in changed:
        root.setLevel(before["the root logger's level"])
    if "the root logger's handlers" in changed:
        ours = [h for h in root.handlers if type(h).__module__.startswith("_pytest")]
        root.handlers[:] = before["the root logger's handlers"] + ours
    if "the root logger's filters" in changed:
        root.filters[:] = before["the root logger's filters"]
    if "logging.disable" in changed:
        logging.disable(before["logging.disable"])
    for module, table in _REGISTRIES:
        name = f"{table} (entries from outside progressive/)"
        if name in changed:
            entries = getattr(sys.modules[module], table)
            for extra in set(_registered_outside().get(name, [])) - set(before.get(name, [])):
                entries.pop(extra)


def _changes(before: dict[str, object], after: dict[str, object]) -> list[str]:
    return [k for k in {**before, **after} if before.get(k, _MISSING) != after.get(k, _MISSING)]


def _check_left_as_found(before: dict[str, object], who: str) -> None:
    """Fail ``who`` if the global state differs from ``before``, after putting it back."""
    after = _global_state()
    changed = _changes(before, after)
    _restore(before, changed)
    imported = {f"os.environ[{name!r}]" for name in SET_ON_IMPORT}
    changed = [k for k in changed if not (k in imported and k not in before)]
    if changed:
        lines = [f"  {k}: {before.get(k, _MISSING)!r} -> {after.get(k, _MISSING)!r}" for k in changed]
        pytest.fail(f"{who} left process-wide state changed (put back now; restore it in the test: monkeypatch, "
                    "torch._dynamo.config.patch, try/finally):\n" + "\n".join(lines), pytrace=False)


@pytest.fixture(autouse=True)
def _no_global_state_left(request):
    """Each test leaves the process-wide state (``_global_state``) as it found it, its fixtures torn down."""
    before = _global_state()
    yield
    _check_left_as_found(before, request.node.nodeid)


@pytest.fixture(autouse=True, scope="module")
def _no_global_state_left_by_module(request):
    """The same for a module's own module-scoped fixtures, checked once all its tests have run."""
    before = _global_state()
    yield
    _check_left_as_found(before, f"{request.node.nodeid} (its module-scoped fixtures)")
