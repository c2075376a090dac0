"""The check that no test leaves process-wide state changed (tests/global_state.py), run on tests of its own in a
pytest session inside this one (pytester)."""

# (what a test leaves changed, the line naming it in the failure)
_LEAKS = {
    "an environment variable": ('os.environ["GROWTRAIN_LEAK"] = "1"',
                                "*os.environ[[]'GROWTRAIN_LEAK']: '<missing>' -> '1'"),
    "the working directory": ("os.chdir(tmp_path)", "*the working directory: * -> *"),
    "torch's threads": ("torch.set_num_threads(torch.get_num_threads() + 1)", "*torch.get_num_threads(): * -> *"),
    "a dynamo setting": ("torch._dynamo.config.recompile_limit = 3", "*torch._dynamo.config.recompile_limit: * -> 3"),
    "a dynamo setting deleted": ("del torch._dynamo.config.recompile_limit",
                                 "*torch._dynamo.config.recompile_limit: * -> '<missing>'"),
    "the SIGTERM handler": ("signal.signal(signal.SIGTERM, lambda *a: None)", "*the SIGTERM handler: * -> <function*"),
    # a function of the test's own: SIG_IGN would change nothing where pytest itself started with SIGINT ignored
    # (a background job of a shell without job control, as `nohup ... &` or a CI runner may start it)
    "the SIGINT handler": ("signal.signal(signal.SIGINT, lambda *a: None)", "*the SIGINT handler: * -> <function*"),
    "the signal wake-up fd": ("r, w = os.pipe(); os.set_blocking(w, False); signal.set_wakeup_fd(w)",
                              "*signal.set_wakeup_fd: -1 -> *"),
    "the root logger's level": ("logging.getLogger().setLevel(logging.DEBUG)", "*the root logger's level: * -> 10"),
    "a root logger handler": ("logging.getLogger().addHandler(logging.NullHandler())",
                              "*the root logger's handlers: [[]] -> [[]<NullHandler (NOTSET)>]"),
    "logging disabled": ("logging.disable(logging.INFO)", "*logging.disable: 0 -> 20"),
    "a registered method": ("register_method('leaky_toy', type('Leaky', (Method,), {}))",
                            "*METHODS (entries from outside progressive/): '<missing>' -> [[]'leaky_toy'[]]"),
}

_STATE = """
import logging, os, signal
import torch
from progressive.methods import METHODS, Method, register_method


def _state():
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return (env, os.getcwd(), torch.get_num_threads(), torch._dynamo.config.recompile_limit,
            signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), logging.getLogger().level,
            [h for h in logging.getLogger().handlers if not type(h).__module__.startswith("_pytest")],
            logging.root.manager.disable, sorted(METHODS))


FOUND = _state()  # at collection, before any test runs
"""


def _pytest(pytester):
    """The tests written in ``pytester``'s folder run in order (no random order here), with the check loaded (it is
    imported already: no assertion rewriting for it)."""
    return pytester.runpytest("-p", "global_state", "-p", "no:randomly", "-p", "no:cacheprovider", "-q",
                              "-W", "ignore::pytest.PytestAssertRewriteWarning")


def test_a_test_that_leaves_global_state_changed_fails_naming_it_and_the_next_finds_it_restored(pytester):
    """One test per kind of state, each followed by one that finds everything as the session found it."""
    tests = [_STATE]
    for k, (leak, _) in enumerate(_LEAKS.values()):
        tests.append(f"def test_leaves_{k}(tmp_path):\n    {leak}\n\n\ndef test_after_{k}():\n"
                     "    assert _state() == FOUND\n")
    pytester.makepyfile(test_leaky="\n\n".join(tests))
    result = _pytest(pytester)
    result.assert_outcomes(passed=2 * len(_LEAKS), errors=len(_LEAKS))  # each leaky test errors at its teardown
    lines = []
    for k, (_, line) in enumerate(_LEAKS.values()):
        lines += [f"test_leaky.py::test_leaves_{k} left process-wide state changed (put back now; restore it in the "
                  "test: monkeypatch, torch._dynamo.config.patch, try/finally):", line]
    result.stdout.fnmatch_lines(lines)


def test_a_test_that_restores_what_it_changes_passes(pytester):
    """Restored by monkeypatch, dynamo's patch or by hand; and a variable a module sets when first imported
    (global_state.SET_ON_IMPORT) is put back without failing the test that imported it first."""
    restores = ['monkeypatch.setenv("GROWTRAIN_LEAK", "1")', "monkeypatch.chdir(tmp_path)",
                "with torch._dynamo.config.patch(recompile_limit=3): assert torch._dynamo.config.recompile_limit == 3",
                "old = signal.signal(signal.SIGTERM, lambda *a: None); signal.signal(signal.SIGTERM, old)",
                'os.environ["THP_MEM_ALLOC_ENABLE"] = "1"']  # as a module's import does: put back, not failed
    tests = [_STATE] + [f"def test_restores_{k}(tmp_path, monkeypatch):\n    {code}\n"
                        for k, code in enumerate(restores)]
    pytester.makepyfile(test_tidy="\n\n".join(tests) + "\n\ndef test_after():\n    assert _state() == FOUND\n")
    _pytest(pytester).assert_outcomes(passed=len(restores) + 1)


def test_a_module_fixture_that_leaves_global_state_changed_fails_its_module(pytester):
    pytester.makepyfile(test_module_leak='''
import os

import pytest


@pytest.fixture(scope="module")
def leaky():
    os.environ["GROWTRAIN_LEAK"] = "1"
    yield


def test_uses_it(leaky):
    pass
''', test_module_next='''  # collected after test_module_leak.py
import os


def test_finds_it_put_back():
    assert "GROWTRAIN_LEAK" not in os.environ
''')
    result = _pytest(pytester)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["test_module_leak.py (its module-scoped fixtures) left process-wide state changed *",
                                 "*os.environ[[]'GROWTRAIN_LEAK']: '<missing>' -> '1'"])
