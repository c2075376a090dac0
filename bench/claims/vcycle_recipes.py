"""The V-cycle's recipe search: each variant against the baseline's frontier, at equal validation loss, in FLOPs
and time (how configs/default.yaml's V-cycle was chosen; python -m bench.frontier is the evidence).

    python -m bench.claims.vcycle_recipes                                 # everything (hours on 2 CPU cores)
    python -m bench.claims.vcycle_recipes --only vcycle_paper --seeds 0   # a subset; runs are cached by config hash
    python -m bench.claims.vcycle_recipes --budgets 300,600 --method_budgets 300 --train.eval_every 50   # any --key
    python -m bench.claims.vcycle_recipes --train.eval_every 50 --results bench/results
                                    # record vcycle_recipes.json and .png (python -m bench.pages renders the page)

The variants are bench/lib/variants.py's ``SWEEP``: one knob of the paper's GPT recipe changed at a time,
then the knobs that helped combined.

Protocol (Composer's Pareto frontier; Portes et al. 2022):
1. The baseline runs at every budget in ``--budgets`` (optimizer steps of the full model), each with its
   own complete LR schedule (warm-up and decay to the end of that budget), for every seed. Its final
   validation loss l_B against its training FLOPs C_B (and training wall-clock W_B) is the frontier.
2. Every method variant runs at every budget in ``--method_budgets`` (spending that many full-model steps'
   worth of FLOPs), for every seed, and ends at loss l_m with cost C_m (and W_m).
3. C_base(l) interpolates the frontier (mean over seeds at each budget) in log C vs log l, piecewise
   linearly between neighbouring budgets. The saving is 1 - C_m / C_base(l_m): what the method saves
   against a baseline scheduled to reach the same final loss, not against a baseline caught mid-schedule.
   A loss outside the frontier's range is reported as a bound (">= x%" below the lowest baseline loss,
   "<= x%" above the highest), never extrapolated. The same for wall-clock with W instead of C.
4. Savings are per seed (the method's seed-s run against the frontier), then mean and spread.

Wall-clock is training time (steps and transitions; no evaluation or checkpoint I/O), with runs interleaved
(seed, then budget, then variant), so load drifts touch every variant alike; the machine's load before and
after is recorded. FLOPs and losses are deterministic on one machine
(same CPU, threads and torch build); wall-clock is not.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import mean, pstdev

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from common.cli import check_flags, list_of, run_cli
from common.quiet import quiet_transformers

quiet_transformers()

from bench.lib.envelope import frontier, saving  # noqa: E402
from bench.lib.runs import finished, machine, output_folder, record, run, summary  # noqa: E402
from bench.lib.variants import SWEEP, overrides  # noqa: E402
from common.io import atomic_write_json, atomic_write_text  # noqa: E402
from common.table import format_table  # noqa: E402
from progressive.cli import parse  # noqa: E402
from progressive.config import load_config  # noqa: E402

CMD = "python -m bench.claims.vcycle_recipes"


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: an unknown variant, a budget < 1, a seed out of range, or a recipe or override that does not
            load, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", type=list_of(int), default="300,600,1200,2400",
                    help="baseline budgets (steps): the frontier")
    ap.add_argument("--method_budgets", type=list_of(int), default="600,1200", help="budgets every variant runs at")
    ap.add_argument("--seeds", type=list_of(int), default="0,1")
    ap.add_argument("--only", type=list_of(), default=",".join(SWEEP), help="comma-separated variants")
    ap.add_argument("--out", default="outputs/savings")
    ap.add_argument("--results", default=None, help="also record RESULTS/vcycle_recipes.json and its plot "
                                                    "vcycle_recipes.png (bench/results: what python -m bench.pages "
                                                    "renders)")
    ap.add_argument("--docs", default=None, help="also write the plot (vcycle_recipes.png) into this folder of yours")
    args, rest = ap.parse_known_args(argv)
    config, extra, _ = parse(rest)
    recipe = config  # configs/default.yaml unless --config: its model, data and V-cycle; baseline = method baseline
    names = args.only
    unknown = [n for n in names if n not in SWEEP]
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; choose from {', '.join(SWEEP)}")
    check_flags({"--budgets": tuple(args.budgets), "--method_budgets": tuple(args.method_budgets),
                 "--seeds": tuple(args.seeds)}, at_least_one=["--budgets", "--method_budgets"], seeds=["--seeds"])
    load_config(recipe, extra)  # a missing recipe or a bad override: one line, before any folder is made
    seeds, budgets, mbudgets = args.seeds, args.budgets, args.method_budgets
    out = output_folder(args.out, CMD, ["savings.*", "runs"])
    load_before = os.getloadavg()
    results: dict[tuple[str, int, int], dict] = {}
    reused = 0  # runs read from the cache: their wall-clock is that of the run that made them
    for seed in seeds:  # interleaved: every variant of a seed and budget runs close together in time
        for budget in sorted(set(budgets) | set(mbudgets)):
            todo = ([("baseline", {"method.name": "baseline"})] if budget in budgets else []) + \
                   ([(n, overrides(n)) for n in names] if budget in mbudgets else [])
            for name, over in todo:
                cfg = load_config(recipe, {"train.progress": False, "train.checkpoint_every": 10**6, **extra, **over,
                                           "train.steps": budget, "train.seed": seed})
                reused += finished(cfg, out / "runs")
                metrics, folder = run(cfg, out / "runs", f"{name} budget {budget} seed {seed}")
                s = summary(folder)
                results[(name, budget, seed)] = {"loss": s["final_val_loss"], "flops": s["flops"],
                                                 "wall": s["train_wall_s"], "curve": metrics}
    load_after = os.getloadavg()
    fronts = {}
    for axis in ("flops", "wall"):
        fronts[axis] = frontier([(mean(results[("baseline", b, s)]["loss"] for s in seeds),
                                  mean(results[("baseline", b, s)][axis] for s in seeds)) for b in budgets])
    rows = [{"variant": "baseline", "budget": b, "final val loss": round(mean(results[("baseline", b, s)]["loss"]
                                                                                for s in seeds), 4),
             "FLOPs": mean(results[("baseline", b, s)]["flops"] for s in seeds),
             "wall s": round(mean(results[("baseline", b, s)]["wall"] for s in seeds), 1),
             "FLOPs saved %": "frontier", "wall saved %": "frontier"} for b in budgets]
    for name in names:
        for b in mbudgets:
            per = [results[(name, b, s)] for s in seeds]
            row = {"variant": name, "budget": b, "final val loss": round(mean(p["loss"] for p in per), 4),
                   "FLOPs": mean(p["flops"] for p in per), "wall s": round(mean(p["wall"] for p in per), 1)}
            for axis, label in (("flops", "FLOPs saved %"), ("wall", "wall saved %")):
                vals = [saving(p[axis], fronts[axis], p["loss"]) for p in per]
                kinds = {k for _, k in vals}
                m, sd = 100 * mean(v for v, _ in vals), 100 * pstdev(v for v, _ in vals)
                mark = "" if kinds == {"="} else ("≥ " if kinds == {">="} else "≤ " if kinds == {"<="} else "~ ")
                row[label] = f"{mark}{m:.1f} ± {sd:.1f}"
            rows.append(row)
    text = format_table(rows)
    note = (f"seeds {seeds}; baseline budgets {budgets}; method budgets {mbudgets}; {len(results) - reused} runs "
            f"made on {machine()} (load average before {load_before[0]:.2f}, after {load_after[0]:.2f}), "
            f"{reused} read from the cache (their wall-clock is that of the run that made them)")
    payload = {"note": note, "extra": extra, "recipe": str(recipe), "results": rows,
               "runs": {f"{k[0]}|{k[1]}|{k[2]}": {kk: vv for kk, vv in v.items() if kk != "curve"}
                        for k, v in results.items()}}
    atomic_write_json(out / "savings.json", payload)
    atomic_write_text(out / "savings.md", f"{note}\n\n{text}\n")
    _plot(results, names, budgets, mbudgets, seeds, out / "savings.png")
    if args.results:
        record(args.results, "vcycle_recipes", {"note": note, "command": " ".join([CMD, *sys.argv[1:]]),
                                                "results": rows}, CMD)
        _plot(results, names, budgets, mbudgets, seeds, Path(args.results) / "vcycle_recipes.png")
    if args.docs:
        _plot(results, names, budgets, mbudgets, seeds, Path(args.docs) / "vcycle_recipes.png")
    print(f"{note}\n{text}")


def _plot(results, names, budgets, mbudgets, seeds, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    colors, markers = plt.cm.tab20.colors, "osD^v<>PX*"  # distinct (colour, marker) for up to 20 variants
    for ax, axis, label in zip(axes, ("flops", "wall"), ("training FLOPs", "training wall-clock (s)")):
        xs = [mean(results[("baseline", b, s)][axis] for s in seeds) for b in budgets]
        ys = [mean(results[("baseline", b, s)]["loss"] for s in seeds) for b in budgets]
        ax.plot(xs, ys, "k-o", lw=1.5, label="baseline frontier (one run per budget)")
        for i, name in enumerate(names):
            pts = [(results[(name, b, s)][axis], results[(name, b, s)]["loss"]) for b in mbudgets for s in seeds]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], markers[i % len(markers)], ms=5,
                    color=colors[i % len(colors)], label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set(xlabel=label, ylabel="final validation loss (seeds as separate points)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
