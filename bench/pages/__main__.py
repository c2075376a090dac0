"""``python -m bench.pages [--check]`` (see bench/pages/__init__.py)."""

from bench.pages import main

raise SystemExit(main())
