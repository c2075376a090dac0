"""``python -m bench.papers {multilevel,apollo,pipetransformer} [--smoke]`` (see bench/papers/__init__.py)."""

from __future__ import annotations

import argparse
import importlib
import tempfile
from pathlib import Path

from bench.lib import tracking
from bench.papers import __doc__ as doc
from bench.papers import core
from common.cli import run_cli
from common.quiet import quiet_transformers
from common.table import format_table

PAPERS = ("multilevel", "apollo", "pipetransformer")


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``: sys.argv[1:] by default); returns the exit code.

    Raises:
        ValueError: --out or --results naming a file (or a folder under one), before any work or folder.
    """
    ap = argparse.ArgumentParser(prog="python -m bench.papers", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paper", choices=PAPERS)
    ap.add_argument("--smoke", action="store_true", help="tiny models, a few steps: seconds (tests)")
    ap.add_argument("--out", default=None, help="run folders (default outputs/papers/<paper>; --smoke: a temp dir)")
    ap.add_argument("--results", default=None, help="where papers_<paper>.json and its figure go "
                    "(default bench/results; --smoke: the --out folder)")
    ap.add_argument("--frontier_results", default=str(core.RESULTS),
                    help="folder of the frontier's frontier.csv (its rows are reused and extended)")
    ap.add_argument("--frontier_out", default="outputs/frontier", help="the frontier's run folders (checkpoints)")
    tracking.add_arguments(ap)
    args = ap.parse_args(argv)
    for flag, given in (("--out", args.out), ("--results", args.results)):
        if given is not None and _file_on_the_way(Path(given)):
            raise ValueError(f"{flag} {given}: a file, or under one; name a folder (it is made if missing)")

    quiet_transformers()
    out = Path(args.out or (tempfile.mkdtemp(prefix=f"papers_{args.paper}_") if args.smoke
                            else f"outputs/papers/{args.paper}"))
    out.mkdir(parents=True, exist_ok=True)
    smoke_frontier = args.smoke and args.frontier_results == str(core.RESULTS)
    ctx = core.Context(paper=args.paper, out=out, smoke=args.smoke,
                       frontier_results=out if smoke_frontier else Path(args.frontier_results),
                       frontier_out=out / "frontier" if args.smoke else Path(args.frontier_out))
    results = Path(args.results) if args.results else (out if args.smoke else core.RESULTS)
    results.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(f"bench.papers.{args.paper}")
    data = module.run(ctx, results)
    for name, rows in data["tables"].items():
        print(f"\n{name}:\n{format_table(rows)}")
    core.write_data(ctx, results, data)  # (it says where, on stderr)
    if results == core.RESULTS:
        print("\nthen its page: python -m bench.pages")
    tracking.log(args.report_to, args.project, out, f"papers-{args.paper}", core.tracker_entries(ctx, results))
    return 0


def _file_on_the_way(folder: Path) -> bool:
    """Whether ``folder`` or a path above it is a file, so it cannot be made (mkdir's FileExistsError, a traceback)."""
    return any(p.exists() and not p.is_dir() for p in (folder, *folder.parents))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
