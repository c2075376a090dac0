"""Cooldown branches at the WSD grid's scale: is a branch the run of its length, and what does it save?

    python -m bench.claims.wsd_branches --results bench/results   # ~25 min on one core
    python -m bench.claims.wsd_branches --smoke --out outputs/smoke   # seconds: the script runs (numbers mean nothing)

The WSD grid's (``--grid layers_wsd``) 2x64 at its tuned LR (the grid's rows), seed 0, at its smallest budget
(9e12 FLOPs), trained once with ``train.branches`` at two smaller budgets (4.5e12 and 6.4e12, 1242 and 1757 steps
of 4x64), against each branch trained directly twice: as the run the branch is (``train.steps`` b, the run's
warm-up: ``same_as`` in branches.json) and as the grid trains a budget (a warm-up of 5% of its own steps). Per
branch: the test loss of each and their differences, and the FLOPs of the run with its branches against the run
plus the direct runs. The run itself is the grid's cell with branches added: its test loss is the grid row's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from common.cli import run_cli
from common.quiet import quiet_transformers

quiet_transformers()

from bench.lib import envelope  # noqa: E402
from bench.lib import grid as F  # noqa: E402
from bench.lib.rows import rows_or_exit  # noqa: E402
from bench.lib.runs import machine, output_folder, publish, run, summary  # noqa: E402
from progressive.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TOOL = "python -m bench.claims.wsd_branches"
SIZE, SEED = (2, 64), 0
BUDGETS = (1242, 1757)  # the branches' budgets, in steps of the grid's target (4x64)


def _steps(g: F.Grid, budget: int, flops: dict) -> int:
    return max(1, round(budget * flops[g.target] / flops[SIZE]))  # as bench.lib.grid.make_job counts them


def _train(g: F.Grid, over: dict[str, Any], out: Path, label: str) -> dict[str, Any]:
    _, folder = run(load_config(ROOT / g.recipe, over), out, label)
    return summary(folder)


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="outputs/bench_wsd_branches")
    ap.add_argument("--frontier_results", default=str(ROOT / "bench" / "results"),
                    help="folder of frontier_layers_wsd.csv (the grid's tuned LR and its row)")
    ap.add_argument("--results", default=None, help="also record RESULTS/wsd_branches.json (bench/results)")
    ap.add_argument("--smoke", action="store_true", help="the frontier's smoke grid under WSD, a few steps (tests)")
    args = ap.parse_args(argv)
    g = F.SMOKE if args.smoke else F.LAYERS_WSD
    wsd = {"train.decay": "wsd", "train.cooldown": 0.2}
    budgets, top = ((6, 9), 12) if args.smoke else (BUDGETS, min(g.budgets))
    rows = [] if args.smoke else rows_or_exit(Path(args.frontier_results) / f"frontier{g.stem}.csv")
    out = output_folder(args.out, TOOL, ["wsd_branches.*", "runs"])
    flops = {s: F.step_flops_of(g, s) for s in {SIZE, g.target}}
    lr = (envelope.tuned_lr(rows, SIZE, top) if rows else None) or g.lrs[len(g.lrs) // 2]
    base = {**F._base(g, SIZE, lr, SEED), **wsd, "method.name": "baseline"}
    steps = _steps(g, top, flops)
    lengths = [_steps(g, b, flops) for b in budgets]
    runs = out / "runs"
    main_run = _train(g, {**base, "train.steps": steps, "train.branches": lengths}, runs, "the run with branches")
    warm = main_run["branches"][0]["warmup_steps"]
    cell = next((r for r in rows if (r["layers"], r["width"], r["lr"], r["budget"], r["seed"], r["method"]) ==
                 (*SIZE, lr, top, SEED, "baseline")), None)
    results = []
    for budget, branch in zip(budgets, main_run["branches"]):
        b = branch["steps"]
        twin = _train(g, {**base, "train.steps": b, "train.warmup": warm / b}, runs, f"{b} steps, the run's warm-up")
        recipe = _train(g, {**base, "train.steps": b}, runs, f"{b} steps, 5% warm-up")
        results.append({"budget": budget, "steps": b, "fork_step": branch["fork_step"],
                        "branch_test": round(branch["test_loss"], 5), "twin_test": round(twin["final_test_loss"], 5),
                        "branch_minus_twin": branch["test_loss"] - twin["final_test_loss"],
                        "recipe_test": round(recipe["final_test_loss"], 5),
                        "recipe_minus_branch": round(recipe["final_test_loss"] - branch["test_loss"], 5),
                        "extra_flops_share": round(branch["extra_flops"] / twin["flops"], 4)})
    direct = main_run["flops"] + sum(r["flops"] for r in main_run["branches"])
    shared = main_run["flops"] + sum(r["extra_flops"] for r in main_run["branches"])
    payload = {"size": f"{SIZE[0]}x{SIZE[1]}", "lr": lr, "seed": SEED, "budget": top, "steps": steps,
               "warmup_steps": warm, "results": results,
               "run_test": main_run["final_test_loss"], "grid_row_test": None if cell is None else cell["test_loss"],
               "flops_with_branches": shared, "flops_trained_directly": direct,
               "flops_saved": round(1 - shared / direct, 4), "machine": machine(), "load_average": os.getloadavg(),
               "command": " ".join([TOOL, *sys.argv[1:]])}
    print(publish(out, "wsd_branches", payload, args.results, TOOL))
    print(json.dumps({k: payload[k] for k in ("run_test", "grid_row_test", "flops_saved")}))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
