"""Which V-cycle knobs matter? One baseline and several V-cycle variants on the same data, FLOPs budget
and seed (configs/default.yaml unless --config), each read like ``train.py --compare``: FLOPs and
wall-clock to first reach the baseline's final validation loss, and the final losses.

    python -m bench.claims.vcycle_ablation [--config configs/default.yaml] [--out outputs/ablation] [--only a,b]
                                    [--train.steps 1200 --train.eval_every 48 ...]

Any other ``--dotted.key value`` overrides every run's config, exactly as with train.py.

Variants (overrides on top of the config's V-cycle):
    paper        the paper's GPT recipe (alpha 0.25, mapped AdamW state, depth copy); the default's alpha is 0.5
    alpha0.5     alpha 0.5 (the authors' GPT-2 script; the paper's BERT value)
    alpha1       alpha 1: the de-coalesced model alone, no interpolation with the kept large model
    reset        fresh AdamW state at every level change (the papers' restarts)
    identity     depth de-coalescing "identity" (the grown model computes the small model's function)
    identity_a1  identity and alpha 1: an exactly function-preserving up-step
    asym_identity_a1  identity_a1 with the asymmetric (symmetry-breaking, still exact) width split
    asym_paper   the paper's recipe with the asymmetric width split
FLOPs are deterministic; wall-clock depends on the machine's load, so compare FLOPs first.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch loads: its CPU allocator reads it once

from common.cli import list_of, run_cli
from common.quiet import quiet_transformers
from progressive.run.start import Start
from progressive.run.trainer import Trainer

quiet_transformers()

from bench.lib.runs import output_folder  # noqa: E402
from common.io import atomic_write_json, atomic_write_text  # noqa: E402
from common.table import format_table  # noqa: E402
from progressive.cli import parse  # noqa: E402
from progressive.config import load_config  # noqa: E402
from progressive.report.compare import savings  # noqa: E402
from progressive.run.plots import plot_compare  # noqa: E402
from progressive.run.tracking import METRICS, read_metrics  # noqa: E402

VARIANTS: dict[str, dict[str, object]] = {
    "paper": {"method.vcycle.levels.0.alpha": 0.25},
    "alpha0.5": {"method.vcycle.levels.0.alpha": 0.5},
    "alpha1": {"method.vcycle.levels.0.alpha": 1.0},
    "reset": {"method.vcycle.levels.0.alpha": 0.25, "method.vcycle.optimizer_state": "reset"},
    "identity": {"method.vcycle.levels.0.alpha": 0.25, "method.vcycle.depth_mode": "identity"},
    "identity_a1": {"method.vcycle.depth_mode": "identity", "method.vcycle.levels.0.alpha": 1.0},
    "asym_identity_a1": {"method.vcycle.depth_mode": "identity", "method.vcycle.levels.0.alpha": 1.0,
                         "method.vcycle.width_split": "asymmetric"},
    "asym_paper": {"method.vcycle.levels.0.alpha": 0.25, "method.vcycle.width_split": "asymmetric"},
}


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: an unknown variant, or a recipe or override that does not load, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--out", default="outputs/ablation")
    ap.add_argument("--only", type=list_of(), default=",".join(VARIANTS), help="comma-separated variant names")
    ap.add_argument("--reuse_baseline", action="store_true",
                    help="keep <out>/baseline/metrics.jsonl from an earlier run with the same config")
    args, rest = ap.parse_known_args(argv)

    names = args.only
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"--only: unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    _, extra, _ = parse(rest)  # the same --dotted.key value syntax as train.py
    load_config(args.config, extra)  # a missing recipe or a bad override: one line, before any folder is made
    root = output_folder(args.out, "python -m bench.claims.vcycle_ablation", ["ablation.*"])
    runs = {}
    for name, over in [("baseline", {"method.name": "baseline"})] + [(n, VARIANTS[n]) for n in names]:
        cfg = load_config(args.config, {"name": name, "output_dir": str(root), "train.progress": False, **extra,
                                        **({"method.name": "vcycle"} if name != "baseline" else {}), **over})
        print(f"== {name}: {over or 'config as is'}", flush=True)
        if name == "baseline" and args.reuse_baseline and (root / name / METRICS).is_file():
            print("   reusing the earlier baseline run", flush=True)
        else:
            Trainer(cfg, Start("fresh", overwrite=True)).run()
        runs[name] = read_metrics(root / name / METRICS)
    target, table = savings(runs, "baseline")
    cols = ["method", "final_val_loss", "flops", "wall_s", "flops_to_target", "flops_saved_%", "wall_saved_%"]
    text = format_table(table, cols)
    atomic_write_json(root / "ablation.json", {"target_val_loss": target, "config": args.config, "set": extra,
                                               "variants": {n: VARIANTS[n] for n in names}, "results": table})
    atomic_write_text(root / "ablation.md", f"target: baseline final val loss {target:.4f}\n\n{text}\n")
    plot_compare(runs, root / "ablation.png", target)
    print(f"\ntarget = baseline's final validation loss {target:.4f}\n{text}")
    print(json.dumps({r["method"]: r["final_val_loss"] for r in table}))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
