"""Apollo vs stacking vs the V-cycle vs the baseline: one model, one corpus, one seed, equal FLOPs budgets.

Every run uses the model, data and train settings of ``--config`` (configs/apollo.yaml: GPT-2 12 layers x
64, 4 heads, bundled corpus, batch 16 x 128); only the ``method`` section differs, taken from each
method's recipe. Each budget (train.steps of the full model, in FLOPs) is run separately and read like
``train.py --compare``: FLOPs and wall-clock to first reach the baseline's final validation loss, and the
final losses.

    python -m bench.claims.apollo [--budgets 300,1200] [--only vcycle,apollo,stackbert,gstack]
                           [--out outputs/apollo_bench] [--docs docs] [--dotted.key value ...]

Methods (their recipe's ``method`` section):
    baseline    the full model for the whole budget
    vcycle      configs/default.yaml's V-cycle (2 levels, width 2 / depth 2)
    apollo      configs/apollo.yaml (stages 1, 3, 6, 12 at 5/5/15/75%, LVPS, interpolation, mapped AdamW)
    stackbert   configs/stackbert.yaml (3 -> 6 -> 12 by stacking, no sampling)
    gstack      configs/gstack.yaml (3 -> 12 by stacking x4 after 10%, fresh AdamW, per-stage schedules)
Apollo ablations, one knob each: apollo_stack (map stack), apollo_nosample (sampler none),
apollo_stack_nosample (both), apollo_from3 (StackBERT's stages 3, 6, 12 at 12.5/30%), apollo_from3_nosample
and apollo_from3_stack (those stages without sampling / with the stack map), apollo_reset
(fresh AdamW at every growth), apollo_first_copy (moments only for the first copy of each layer);
stackbert_reset (StackBERT with fresh AdamW at every growth).
Besides the table, ``where`` rows say where a run gains or loses against the baseline: its validation
loss when it has spent 25/50/75/100% of the budget, and for every growth the train loss just before and
just after it. FLOPs are deterministic; wall-clock depends on the machine's load (the 1-minute load average is logged at
the start and end of every run). Outputs: <out>/steps<B>/{apollo_bench.md,json,png} per budget, and
<out>/apollo_bench.{md,json} for all budgets of the invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch loads: its CPU allocator reads it once

from common.cli import check_flags, list_of, run_cli
from common.quiet import quiet_transformers
from progressive.run.start import Start
from progressive.run.trainer import Trainer

quiet_transformers()

import yaml  # noqa: E402

from bench.lib.runs import output_folder  # noqa: E402
from common.io import atomic_write_json, atomic_write_text  # noqa: E402
from common.table import format_table  # noqa: E402
from progressive.cli import parse  # noqa: E402
from progressive.config import load_config  # noqa: E402
from progressive.report.compare import savings  # noqa: E402
from progressive.run.plots import plot_compare  # noqa: E402
from progressive.run.tracking import METRICS, read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# name -> (recipe whose method section runs, changes to that section)
RECIPES: dict[str, tuple[str | None, dict[str, object]]] = {
    "baseline": (None, {}),
    "vcycle": ("configs/default.yaml", {}),
    "apollo": ("configs/apollo.yaml", {}),
    "stackbert": ("configs/stackbert.yaml", {}),
    "gstack": ("configs/gstack.yaml", {}),
    # Apollo with one knob changed (where does it lose?)
    "apollo_stack": ("configs/apollo.yaml", {"map": "stack"}),
    "apollo_nosample": ("configs/apollo.yaml", {"sampler": "none"}),
    "apollo_stack_nosample": ("configs/apollo.yaml", {"map": "stack", "sampler": "none"}),
    "apollo_from3": ("configs/apollo.yaml", {"layers": [3, 6, 12], "boundaries": [0.125, 0.30]}),
    "apollo_from3_nosample": ("configs/apollo.yaml", {"layers": [3, 6, 12], "boundaries": [0.125, 0.30],
                                                      "sampler": "none"}),
    "apollo_from3_stack": ("configs/apollo.yaml", {"layers": [3, 6, 12], "boundaries": [0.125, 0.30],
                                                   "map": "stack"}),
    "apollo_reset": ("configs/apollo.yaml", {"optimizer_state": "reset"}),
    "apollo_first_copy": ("configs/apollo.yaml", {"optimizer_state": "first_copy"}),
    "stackbert_reset": ("configs/stackbert.yaml", {"optimizer_state": "reset"}),
}


def method_overrides(name: str) -> dict[str, object]:
    """The dotted overrides that put recipe ``name``'s method section (with its changes) on the common config."""
    recipe, changes = RECIPES[name]
    if recipe is None:
        return {"method.name": "baseline"}
    method = yaml.safe_load((ROOT / recipe).read_text())["method"]
    return {"method.name": method["name"], f"method.{method['name']}": {**method[method["name"]], **changes}}


def where(rows: list[dict], ref: list[dict], budget: float) -> dict[str, object]:
    """Validation loss (run - baseline, at the first evaluation past each quarter of the budget) and the
    train loss around every growth/level change (mean of the 3 logged steps before vs the 3 after)."""
    val, ref_val = ([r for r in rs if r["kind"] == "val"] for rs in (rows, ref))
    out: dict[str, object] = {}
    for q in (0.25, 0.5, 0.75, 1.0):
        a = next((r for r in val if r["flops"] >= q * budget * 0.999), val[-1])
        b = next((r for r in ref_val if r["flops"] >= a["flops"]), ref_val[-1])
        out[f"val@{int(q * 100)}%"] = f"{a['val_loss']:.3f} ({a['val_loss'] - b['val_loss']:+.3f})"
    train = [r for r in rows if r["kind"] == "train"]
    jumps = []
    for i in range(1, len(train)):
        if train[i]["phase"] != train[i - 1]["phase"]:
            before = sum(r["loss"] for r in train[max(0, i - 3):i]) / len(train[max(0, i - 3):i])
            after = sum(r["loss"] for r in train[i:i + 3]) / len(train[i:i + 3])
            jumps.append(f"{train[i]['phase_name']}@{train[i - 1]['step']}: {before:.3f}->{after:.3f}")
    out["changes (train loss before->after)"] = "; ".join(jumps) or "-"
    return out


def run_budget(steps: int, names: list[str], args: argparse.Namespace, extra: dict) -> dict:

    root = Path(args.out) / f"steps{steps}"
    eval_every = max(1, steps // 25)
    runs, load = {}, {}
    for name in names:
        over = {"name": name, "output_dir": str(root), "train.progress": False, "train.steps": steps,
                "train.eval_every": eval_every, **extra, **method_overrides(name)}
        cfg = load_config(ROOT / args.config, over)
        print(f"== {steps} steps: {name} ({cfg.method.name})", flush=True)
        start = os.getloadavg()[0]
        t0 = time.time()
        if name == "baseline" and args.reuse_baseline and (root / name / METRICS).is_file():
            print("   reusing the earlier baseline run (runs are deterministic: same settings, same losses)")
        else:
            Trainer(cfg, Start("fresh", overwrite=True)).run()
        load[name] = {"load_start": round(start, 2), "load_end": round(os.getloadavg()[0], 2),
                      "elapsed_s": round(time.time() - t0, 1)}
        runs[name] = read_metrics(root / name / METRICS)
    target, table = savings(runs, "baseline")
    budget = float([r for r in runs["baseline"] if r["kind"] == "train"][-1]["flops"])
    for row in table:
        row.update(where(runs[row["method"]], runs["baseline"], budget), **load[row["method"]])
    plot = plot_compare(runs, root / "apollo_bench.png", target)
    if args.docs:
        plot = plot_compare(runs, Path(args.docs) / f"apollo_{steps}.png", target)
    result = {"steps": steps, "eval_every": eval_every, "target_val_loss": target, "results": table,
              "plot": str(plot)}
    atomic_write_json(root / "apollo_bench.json", {"config": args.config, "overrides": extra, **result})
    atomic_write_text(root / "apollo_bench.md", report(result))
    return result


def report(res: dict) -> str:
    """The Markdown tables of one budget: costs and savings, then where the loss is gained or lost."""
    cols = ["method", "final_val_loss", "flops", "flops_to_target", "flops_saved_%", "wall_s", "wall_to_target_s",
            "wall_saved_%", "load_start", "load_end"]
    diag = ["method", "val@25%", "val@50%", "val@75%", "val@100%", "changes (train loss before->after)"]
    return (f"## Budget {res['steps']} full-model steps (evaluation every {res['eval_every']}); target = "
            f"baseline's final validation loss {res['target_val_loss']:.4f}\n\n"
            f"{format_table(res['results'], cols)}\n\nWhere (validation loss, and its difference from the "
            f"baseline at the same FLOPs):\n\n{format_table(res['results'], diag)}\n")


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: an unknown method, a budget < 1, or a config or override that does not load, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/apollo.yaml", help="model, data and train settings of every run")
    ap.add_argument("--budgets", type=list_of(int), default="300,1200", help="comma-separated train.steps budgets")
    ap.add_argument("--only", type=list_of(), default="vcycle,apollo,stackbert,gstack",
                    help="methods besides the baseline")
    ap.add_argument("--out", default="outputs/apollo_bench")
    ap.add_argument("--docs", default=None, help="also write the plots to DOCS/apollo_<steps>.png")
    ap.add_argument("--reuse_baseline", action="store_true",
                    help="keep <out>/steps<B>/baseline/metrics.jsonl from an earlier run with the same settings")
    args, rest = ap.parse_known_args(argv)
    names = ["baseline"] + [n for n in args.only if n != "baseline"]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        raise ValueError(f"--only: unknown methods {unknown}; choose from {', '.join(RECIPES)}")
    check_flags({"--budgets": tuple(args.budgets)}, at_least_one=["--budgets"])
    _, extra, _ = parse(rest)  # the same --dotted.key value syntax as train.py
    load_config(ROOT / args.config, extra)  # a missing recipe or a bad override: one line, before any folder is made
    output_folder(args.out, "python -m bench.claims.apollo", ["apollo_bench.*", "steps[0-9]*"])
    results = [run_budget(int(b), names, args, extra) for b in args.budgets]
    text = "\n".join(report(res) for res in results)
    out = Path(args.out)
    atomic_write_json(out / "apollo_bench.json", {"config": args.config, "overrides": extra, "budgets": results})
    atomic_write_text(out / "apollo_bench.md", text)
    print("\n" + text)
    print(json.dumps({r["steps"]: {x["method"]: x["flops_saved_%"] for x in r["results"]} for r in results}))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
