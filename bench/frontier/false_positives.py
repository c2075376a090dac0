"""The deciding rules' error rates: on stylised null data (the percentile bootstrap the frontier used to decide with,
and the Welch test, each on the frontier's own estimator), and with ``--pipeline`` on the whole pipeline of a grid
(bench/lib/simulate.py: a synthetic grid fitted to its rows, every LR chosen on seed 0, the hull on validation,
every test, Holm), the false-positive rate of each rule and its power.

    python -m bench.frontier.false_positives              # the stylised table in docs/frontier.md (minutes)
    python -m bench.frontier.false_positives --pipeline   # the whole pipeline, on the layer grid's rows (minutes)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.lib import simulate, verdict
from bench.lib.grid import GRIDS, ROOT
from bench.lib.rows import read_rows
from bench.lib.verdict import ALPHA, CASES, null_rate
from common.cli import run_cli

NAMES = {verdict.AMENDED: "the rule (hull, LR choice inside)", verdict.BEFORE: "until 401 runs (hull and law agree)",
         verdict.HULL_ONLY: "the hull alone, LR as chosen"}


def stylised(args: argparse.Namespace) -> None:
    """The stylised three-cell table (docs/frontier.md): each rule's share of null experiments finding a saving."""
    print(f"| case | percentile bootstrap ({args.boot_sims} experiments, {args.resamples} draws) | "
          f"Welch t, variance pooled over the cells, as first fixed ({args.sims} experiments) | "
          f"Welch t, each cell's own variance: the rule ({args.sims} experiments) |\n|---|---|---|---|")
    for name, n, refs, at, ref_sd in CASES:
        boot = null_rate("bootstrap", n, refs, args.boot_sims, seed=1, at=at, resamples=args.resamples, ref_sd=ref_sd)
        pooled, t = (null_rate(rule, n, refs, args.sims, seed=2, at=at, ref_sd=ref_sd)
                     for rule in ("welch_pooled", "welch"))
        print(f"| {name} | {100 * boot:.1f}% | {100 * pooled:.1f}% | {100 * t:.1f}% |", flush=True)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def null_table(truth: simulate.Truth, draws: int, seed: int) -> None:
    """Each rule's false-positive rate against each reference, both directions: the methods placed on the true
    reference (no saving), per test (before Holm) and family-wise (after Holm over the eligible cells)."""
    print(f"\nNull experiments: every method's true loss at its best LR on the true reference ({draws} draws each; "
          f"one-sided, nominal {_pct(ALPHA)} per test and family-wise)\n")
    print("| rule | reference | a saving: per test | a saving: family-wise | a loss: per test | a loss: family-wise |"
          "\n|---|---|---|---|---|---|")
    for reference in verdict.REFERENCES:
        tally = simulate.simulate(simulate.place(truth, reference), draws, seed)
        known = simulate.simulate(simulate.place(simulate.known_lr(truth), reference), draws, seed,
                                  rules=(verdict.HULL_ONLY,))
        for rule, t, name in [*((r, tally, NAMES[r]) for r in verdict.RULES),
                              (verdict.HULL_ONLY, known, "the hull alone, every LR known (each arm runs its best)")]:
            cells = [t.per_test(rule, reference, d) for d in (verdict.SAVES, verdict.LOSES)]
            fam = [t.familywise(rule, reference, d) for d in (verdict.SAVES, verdict.LOSES)]
            print(f"| {name} | {reference} | {_pct(cells[0])} | {_pct(fam[0])} | {_pct(cells[1])} | "
                  f"{_pct(fam[1])} |", flush=True)


def _at(curve: list[tuple[float, float]], level: float = verdict.POWER) -> str:
    """The saving at which a power curve [(saving, power)] first reaches ``level`` (linear between the savings
    simulated), or "> the largest"."""
    for (s0, p0), (s1, p1) in zip(curve, curve[1:]):
        if p0 < level <= p1:
            return _pct(s0 + (level - p0) / (p1 - p0) * (s1 - s0))
    if curve and curve[0][1] >= level:
        return f"<= {_pct(curve[0][0])}"
    return f"> {_pct(curve[-1][0])}" if curve else ""


def power_table(truth: simulate.Truth, savings: list[float], draws: int, seed: int, reference: str) -> None:
    """Each rule's power against ``reference``: every method placed at a true FLOPs saving s, the share of draws in
    which each cell's verdict is a saving, and the saving at which it reaches 80%."""
    curves: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    shares: dict[tuple[str, float], float] = {}
    for s in savings:
        tally = simulate.simulate(simulate.place(truth, reference, s), draws, seed)
        for rule in verdict.RULES:
            got = []
            for a in truth.methods:
                n, k = tally.cells.get((rule, reference, verdict.SAVES, a.variant, a.budget), (0, 0))
                if n:
                    curves.setdefault((rule, a.variant, a.budget), []).append((s, k / n))
                    got.append(k / n)
            shares[(rule, s)] = sum(got) / len(got) if got else 0.0
    print(f"\nPower against the {reference}: every method's true saving s ({draws} draws each); the share of eligible "
          "cells found saving, on average\n")
    print("| rule | " + " | ".join(f"s = {_pct(s)}" for s in savings) + " |\n|---|" + "---|" * len(savings))
    for rule in verdict.RULES:
        print(f"| {NAMES[rule]} | " + " | ".join(_pct(shares[(rule, s)]) for s in savings) + " |")
    print(f"\nThe saving each cell is found at with {_pct(verdict.POWER)} power (against the {reference})\n")
    print("| cell | " + " | ".join(NAMES[r] for r in verdict.RULES) + " |\n|---|" + "---|" * len(verdict.RULES))
    for a in truth.methods:
        if (verdict.AMENDED, a.variant, a.budget) in curves:
            print(f"| {a.variant} at {a.budget} | " + " | ".join(_at(curves.get((r, a.variant, a.budget), []))
                                                                  for r in verdict.RULES) + " |")


def pipeline(args: argparse.Namespace) -> None:
    """The whole pipeline on the grid's rows: the truth fitted to them, the null tables, the power tables."""
    g = GRIDS[args.grid]
    path = Path(args.rows) if args.rows else ROOT / "bench" / "results" / f"frontier{g.stem}.csv"
    rows = read_rows(path)
    if not rows:
        raise ValueError(f"{path} holds no rows to fit the simulation's truth to")
    truth = simulate.fit_truth(rows, g.baseline_sizes, g.all_budgets, g.target)
    print(f"Truth fitted to {path} ({len(rows)} rows): {len(truth.baselines)} baseline cells, "
          f"{len(truth.methods)} method cells, validation noise {truth.val_sd:.4f} beside the seeds' "
          f"(bench/lib/simulate.py)")
    null_table(truth, args.draws, args.seed)
    for reference in args.power_reference:
        power_table(truth, args.savings, args.power_draws, args.seed + 1, reference)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.frontier.false_positives``: the stylised table, or ``--pipeline``'s."""
    ap = argparse.ArgumentParser(description="The deciding rules' false-positive rates and power (one-sided, "
                                             f"nominal {100 * ALPHA:g}%).")
    ap.add_argument("--sims", type=int, default=16000, help="null experiments per case for the Welch test")
    ap.add_argument("--boot_sims", type=int, default=200, help="null experiments per case for the bootstrap")
    ap.add_argument("--resamples", type=int, default=400, help="bootstrap draws per experiment")
    ap.add_argument("--pipeline", action="store_true", help="simulate the whole pipeline of a grid, fitted to its rows")
    ap.add_argument("--grid", default="layers", choices=sorted(GRIDS), help="the grid (--pipeline)")
    ap.add_argument("--rows", default="", help="its rows file (--pipeline; default bench/results/frontier<stem>.csv)")
    ap.add_argument("--draws", type=int, default=2000, help="null draws of the whole grid per reference (--pipeline)")
    ap.add_argument("--power_draws", type=int, default=200, help="draws per saving simulated (--pipeline)")
    ap.add_argument("--savings", type=lambda v: [float(x) for x in v.split(",")],
                    default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], help="the true savings the power is simulated at")
    ap.add_argument("--power_reference", type=lambda v: v.split(","), default=list(verdict.REFERENCES),
                    help="the references the power is simulated against")
    ap.add_argument("--seed", type=int, default=1, help="the simulation's RNG seed (--pipeline)")
    args = ap.parse_args(argv)
    if args.pipeline:
        pipeline(args)
    else:
        stylised(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
