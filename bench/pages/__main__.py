"""``python -m bench.pages [--check]`` (see bench/pages/__init__.py)."""

from bench.pages import main
from common.cli import run_cli

raise SystemExit(run_cli(main))  # a damaged results file is one line naming it, not a traceback
