"""AutoFreeze and AutoCache where they can win: many epochs over a small fine-tuning set.

    python -m bench.claims.autofreeze_epochs --results bench/results   # ~40 min on 2 CPU cores, alone
    python -m bench.claims.autofreeze_epochs --smoke --out outputs/smoke
        # seconds: the script runs (numbers mean nothing)

bench/claims/autofreeze.py runs the paper's settings scaled down, and there every run is shorter than one epoch:
AutoCache never hits (no sample is drawn twice) and the bound binds every freeze. Here a ViT pre-trained
on CIFAR-10 (bench/claims/autofreeze.py's pre-training) is fine-tuned on a 1,280-image subset for 15 epochs, one
freeze decision per epoch (the paper's cadence), with five variants from the same checkpoint, data and seeds:

- plain: every layer trains;
- bound: AutoFreeze with the closed-form bound alone (``criterion: bound``, what the authors' code runs);
- argmin: AutoFreeze with the paper's gradient criterion, which may hold a freeze back (C_T < B_T);
- argmin+cache: the same with AutoCache, which serves a sample's frozen prefix from memory from its second
  epoch on;
- relative: AutoFreeze with Liu et al.'s relative-change rule (the one the authors' code carries, unreachable
  there), a second criterion that may hold a freeze back where argmin does not.

Per variant: dev accuracy (mean [min, max] over seeds), training wall-clock (variants interleaved seed by
seed, so load drifts touch them alike) and its ratio to plain, FLOPs, the cache hit rate over the run and at
its end, and every decision of seed 0 as "B_T/C_T->F_T" with a count of those the criterion decided.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import mean

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from common.cli import check_flags, list_of, run_cli
from common.quiet import quiet_transformers

quiet_transformers()

from bench.lib.runs import freeze_decisions, output_folder, publish, run, summary  # noqa: E402
from bench.lib.variants import AUTOFREEZE_PRETRAIN as PRETRAIN  # noqa: E402
from bench.lib.variants import AUTOFREEZE_SMOKE as SMOKE  # noqa: E402
from progressive.config import load_config  # noqa: E402

EPOCH = 20  # optimizer steps per epoch: 1,280 images / batch 64
FINETUNE = {**PRETRAIN["vit"], "data.max_images": 1280, "train.steps": 15 * EPOCH, "train.batch_size": 64,
            "train.lr": 3e-4, "train.warmup": 0.1, "train.decay": "cosine", "train.min_lr_ratio": 0.0,
            "train.eval_every": 5 * EPOCH, "train.eval_batches": 20, "train.progress": False,
            "train.checkpoint_every": 10**6, "data.seed": 0}
AF = {"method.name": "autofreeze", "method.autofreeze.freeze_every": EPOCH, "method.autofreeze.alpha": 1 / 3}
VARIANTS = {
    "plain": {"method.name": "baseline"},
    "bound": {**AF, "method.autofreeze.criterion": "bound"},
    "argmin": {**AF, "method.autofreeze.criterion": "argmin"},
    "argmin+cache": {**AF, "method.autofreeze.criterion": "argmin", "method.autofreeze.cache.enabled": True,
                     "method.autofreeze.cache.memory_mb": 2048},
    "relative": {**AF, "method.autofreeze.criterion": "relative"},
}


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: a seed out of range, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=list_of(int), default="0,1,2")
    ap.add_argument("--out", default="outputs/bench_autofreeze_epochs")
    ap.add_argument("--results", default=None, help="also record RESULTS/autofreeze_epochs.json (bench/results)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script runs (numbers mean nothing)")
    args = ap.parse_args(argv)
    check_flags({"--seeds": tuple(args.seeds)}, seeds=["--seeds"])
    root = Path(__file__).resolve().parents[2]
    smoke = {**SMOKE, "method.autofreeze.freeze_every": 2, "train.steps": 8, "data.max_images": 32,
             "data.cache_dir": str(root / ".cache" / "data")} if args.smoke else {}
    out = output_folder(args.out, "python -m bench.claims.autofreeze_epochs",
                        ["autofreeze_epochs.*", "pretrain", "runs"])
    seeds = args.seeds
    pre_over = {**PRETRAIN["vit"], **{k: v for k, v in smoke.items() if not k.startswith("method.")},
                "train.progress": False}
    _, pre = run(load_config(None, pre_over), out / "pretrain", "ViT pre-training")
    got: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for seed in seeds:  # interleaved: the variants of a seed run back to back
        for name, over in VARIANTS.items():
            cfg = load_config(None, {**FINETUNE, **over, **smoke, "model.init_from": str(pre / "final"),
                                     "train.seed": seed, **({"method.name": "baseline"} if name == "plain" else {})})
            metrics, folder = run(cfg, out / "runs", f"{name} seed {seed}")
            s = summary(folder)
            train = [r for r in metrics if r["kind"] == "train"]
            hits = [r["cache_hit_rate"] for r in train if "cache_hit_rate" in r]
            got[name].append({"acc": [r for r in metrics if r["kind"] == "val"][-1]["val_accuracy"],
                              "wall": s["train_wall_s"], "flops": s["flops"], "decisions": freeze_decisions(metrics),
                              "hit_end": hits[-1] if hits else None, "hit_mean": mean(hits) if hits else None})
    plain_wall, plain_flops = mean(r["wall"] for r in got["plain"]), mean(r["flops"] for r in got["plain"])
    rows = []
    for name, rs in got.items():
        accs, first = [100 * r["acc"] for r in rs], rs[0]["decisions"]
        rows.append({"variant": name, "dev acc %": round(mean(accs), 2), "min": round(min(accs), 2),
                     "max": round(max(accs), 2), "wall s": round(mean(r["wall"] for r in rs), 1),
                     "speed-up (wall)": round(plain_wall / mean(r["wall"] for r in rs), 3),
                     "FLOPs vs plain": round(mean(r["flops"] for r in rs) / plain_flops, 3),
                     "cache hits (run)": "" if rs[0]["hit_mean"] is None else round(mean(r["hit_mean"] for r in rs), 3),
                     "cache hits (end)": "" if rs[0]["hit_end"] is None else round(mean(r["hit_end"] for r in rs), 3),
                     "criterion decided": f"{sum(c < b for b, c, _ in first)} of {len(first)}" if first else "",
                     "decisions B/C->F (seed 0)": " ".join(f"{b}/{c}->{f}" for b, c, f in first)})
    payload = {"seeds": seeds, "results": rows, "load_average": os.getloadavg(),
               "command": " ".join(["python -m bench.claims.autofreeze_epochs", *sys.argv[1:]])}
    print(publish(out, "autofreeze_epochs", payload, args.results, "python -m bench.claims.autofreeze_epochs"))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
