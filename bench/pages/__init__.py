"""Every generated page, rendered from the data the benches record (bench/results/), never typed and never read back.

    python -m bench.pages            # write every page below
    python -m bench.pages --check    # exit 1 naming each page that differs from what the data gives (a test runs it)

The pages, each from the files beside it (each written by the command that measured it):
- README.md's results block, docs/results/index.md, docs/results/vcycle_recipes.md (``results``): savings.csv,
  savings_layers.csv, frontier.csv, vcycle_recipes.json, elastic.json, autofreeze*.json;
- docs/results/frontier.md, frontier_layers.md (``frontier``): frontier<stem>.csv, savings<stem>.csv,
  frontier_runs<stem>.json; the block of docs/frontier.md between its ``closest`` markers: the layer grid's
  deciding cells, from savings_layers.csv;
- docs/results/gpu.md (``gpu``): gpu.json;
- docs/results/multilevel.md, apollo.md, pipetransformer.md (``papers``): papers_<paper>.json, each page's figure
  (multilevel.png, apollo.png) linked where it lies, beside the json.
This room is the only code that writes them. Its paragraphs are templates (bench/pages/templates/*.md, filled by
``text.fill``); the modules compute the values, lines and tables that fill them. A bench command writes its data
and leaves its page to ``python -m bench.pages``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.pages import frontier, gpu, papers, results
from bench.pages.text import ROOT
from common.io import atomic_write_text


def render() -> dict[Path, str]:
    """{path: text} of every generated page."""
    return {**results.render(), **frontier.pages(), **gpu.pages(), **papers.pages()}


def stale(pages: dict[Path, str]) -> list[Path]:
    """The pages whose file is missing or differs from ``pages``' text."""
    return [p for p, text in pages.items() if not p.is_file() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    """Write every page (or, with ``--check``, name the stale ones and return 1)."""
    ap = argparse.ArgumentParser(prog="python -m bench.pages", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated page is out of date")
    args = ap.parse_args(argv)
    pages = render()
    if args.check:
        old = stale(pages)
        for p in old:
            print(f"{p.relative_to(ROOT)} differs from what python -m bench.pages generates", file=sys.stderr)
        return 1 if old else 0
    for p, text in pages.items():
        atomic_write_text(p, text)
    print(f"wrote {', '.join(str(p.relative_to(ROOT)) for p in pages)}")
    return 0
