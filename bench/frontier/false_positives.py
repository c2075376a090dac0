"""The deciding rules' false-positive rates on null data: the percentile bootstrap the frontier used to decide with,
and the Welch test that decides now (bench/lib/verdict.py), each on the frontier's own estimator.

    python -m bench.frontier.false_positives     # the table in docs/frontier.md (minutes)
"""

from __future__ import annotations

import argparse

from bench.lib.verdict import ALPHA, CASES, null_rate


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description="The deciding rules' false-positive rates on null data (one-sided, "
                                             f"nominal {100 * ALPHA:g}%).")
    ap.add_argument("--sims", type=int, default=16000, help="null experiments per case for the Welch test")
    ap.add_argument("--boot_sims", type=int, default=200, help="null experiments per case for the bootstrap")
    ap.add_argument("--resamples", type=int, default=400, help="bootstrap draws per experiment")
    args = ap.parse_args(argv)
    print(f"| case | percentile bootstrap ({args.boot_sims} experiments, {args.resamples} draws) | "
          f"Welch t, variance pooled over the cells, as first fixed ({args.sims} experiments) | "
          f"Welch t, each cell's own variance: the rule ({args.sims} experiments) |\n|---|---|---|---|")
    for name, n, refs, at, ref_sd in CASES:
        boot = null_rate("bootstrap", n, refs, args.boot_sims, seed=1, at=at, resamples=args.resamples, ref_sd=ref_sd)
        pooled, t = (null_rate(rule, n, refs, args.sims, seed=2, at=at, ref_sd=ref_sd)
                     for rule in ("welch_pooled", "welch"))
        print(f"| {name} | {100 * boot:.1f}% | {100 * pooled:.1f}% | {100 * t:.1f}% |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
