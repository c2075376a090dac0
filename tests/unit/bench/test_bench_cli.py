"""Every bench script of bench/claims, bench/exactness, bench/speed and bench/papers runs its ``main`` under
common/cli.py's ``run_cli``: a user's error is one ``error:`` line with exit code 2, ``--debug`` shows the traceback.
(tests/unit/project/test_bad_input.py's bench probes try one bad input of each room as a user would type it.)"""

import ast
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
ROOMS = ("claims", "exactness", "speed", "papers")


def _scripts() -> list[Path]:
    """The modules of ``ROOMS`` that run as ``python -m``: a ``__main__`` guard (``__main__.py`` has one too)."""
    return sorted(p for room in ROOMS for p in (ROOT / "bench" / room).glob("*.py")
                  if 'if __name__ == "__main__":' in p.read_text())


def _guard(path: Path) -> ast.If:
    """The ``if __name__ == "__main__":`` block of ``path``."""
    tree = ast.parse(path.read_text())
    return next(node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                and getattr(node.test.left, "id", "") == "__name__")


def test_the_rooms_scripts_are_all_found():
    names = {f"{p.parent.name}.{p.stem}" for p in _scripts()}
    assert {"claims.apollo", "claims.vcycle_recipes", "exactness.depth", "exactness.surgery", "speed.gpu",
            "speed.operators_timing", "papers.__main__"} <= names and len(names) >= 20


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: f"{p.parent.name}.{p.stem}")
def test_every_bench_script_runs_its_main_under_run_cli(path):
    """A script whose guard called ``main()`` itself let every error a user makes escape as a traceback (or a bare
    ``SystemExit`` message with exit code 1)."""
    calls = [n for n in ast.walk(_guard(path)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_cli"]
    assert [ast.unparse(c) for c in calls] == ["run_cli(main)"], ast.unparse(_guard(path))
    main = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert main.args.args and main.args.args[0].arg == "argv"  # run_cli hands it the arguments


def test_debug_shows_the_traceback_of_a_bench_scripts_error(tmp_path, monkeypatch, capsys):
    """``python -m bench.speed.operators_timing ...`` run as the shell runs it, in this process (its ``__main__``):
    the plain error is one line (exit 2); with --debug the error itself leaves, as a traceback does."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "bench.speed.operators_timing", raising=False)  # not a second copy of it
    monkeypatch.setattr(sys, "argv", ["bench.speed.operators_timing", "--threads", "0"])
    with pytest.raises(SystemExit) as plain:
        runpy.run_module("bench.speed.operators_timing", run_name="__main__", alter_sys=True)
    assert (plain.value.code, capsys.readouterr().err.strip()) == (2, "error: --threads must be >= 1, got 0")
    monkeypatch.setattr(sys, "argv", ["bench.speed.operators_timing", "--threads", "0", "--debug"])
    with pytest.raises(ValueError, match=r"^--threads must be >= 1, got 0$"):
        runpy.run_module("bench.speed.operators_timing", run_name="__main__", alter_sys=True)
