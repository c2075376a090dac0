"""AutoFreeze (+ AutoCache) against plain fine-tuning, in the paper's two settings scaled to a CPU:
(a) BERT fine-tuned on SST-2 (bundled GLUE) from a BERT this project pre-trains on the bundled corpus;
(b) ViT fine-tuned on CIFAR-10 (bundled) from a ViT this project pre-trains on a 10k-image CIFAR-10 subset.

    python -m bench.claims.autofreeze [--only bert,vit] [--seeds 0,1] [--out outputs/bench_autofreeze]
                               [--train.threads 2 ...]   # any --dotted.key value: every fine-tuning run

Each setting: one pre-training run, then plain fine-tuning, AutoFreeze and AutoFreeze + AutoCache from it,
same data, steps and seeds; the runs alternate (seed-major) so load drifts touch every variant alike. Per
variant: dev accuracy (mean and spread over seeds), training wall-clock and samples/s (training only: no
evaluation or checkpoint I/O), training FLOPs, the final frozen depth, the cache hit rate; one plot of
the frozen depth and the dev accuracy against FLOPs. Runs are cached by config hash (bench/lib/runs.py), so
a sweep resumes. FLOPs and accuracies are deterministic on one machine; wall-clock depends on its load.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import mean, pstdev

from progressive.run.plots import draw, pyplot, styles

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from common.cli import check_flags, list_of, run_cli
from common.quiet import quiet_transformers

quiet_transformers()

from bench.lib.runs import output_folder, record, run, summary  # noqa: E402
from bench.lib.variants import AUTOFREEZE_PRETRAIN, AUTOFREEZE_SMOKE  # noqa: E402
from common.io import atomic_write_json, atomic_write_text  # noqa: E402
from common.table import format_table  # noqa: E402
from progressive.cli import parse  # noqa: E402
from progressive.config import load_config  # noqa: E402

PRETRAIN, SMOKE = AUTOFREEZE_PRETRAIN, AUTOFREEZE_SMOKE  # shared with bench.claims.autofreeze_epochs
FINETUNE = {
    "bert": {"model.task": "classify", "data.dataset": "glue:sst2", "data.seq_len": 64, "train.steps": 600,
             "train.batch_size": 32, "train.lr": 1e-4, "train.warmup": 0.1, "train.decay": "linear",
             "train.min_lr_ratio": 0.0, "train.eval_every": 100, "train.eval_batches": 28},  # 28 x 32 >= 872 dev
    "vit": {"data.max_images": None, "train.steps": 600, "train.batch_size": 64, "train.lr": 3e-4,
            "train.warmup": 0.1, "train.decay": "cosine", "train.min_lr_ratio": 0.0, "train.eval_every": 100,
            "train.eval_batches": 32},
}
VARIANTS = {
    "plain": {"method.name": "baseline"},
    "autofreeze": {"method.name": "autofreeze", "method.autofreeze.freeze_every": 100},
    "autofreeze+cache": {"method.name": "autofreeze", "method.autofreeze.freeze_every": 100,
                         "method.autofreeze.cache.enabled": True, "method.autofreeze.cache.memory_mb": 4096},
}
COMMON = {"train.progress": False, "train.checkpoint_every": 1000, "data.seed": 0}


def _cfg(over: dict):
    return load_config(None, {**COMMON, **over})


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: an unknown task, a seed out of range, or an override that does not load, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", type=list_of(), default="bert,vit")
    ap.add_argument("--seeds", type=list_of(int), default="0,1")
    ap.add_argument("--out", default="outputs/bench_autofreeze")
    ap.add_argument("--results", default=None, help="also write RESULTS/autofreeze.json (bench/results: what "
                                                    "python -m bench.pages renders)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script runs (numbers mean nothing)")
    args, rest = ap.parse_known_args(argv)
    unknown = [t for t in args.only if t not in PRETRAIN]
    if unknown:
        raise ValueError(f"--only: unknown tasks {unknown}; choose from {', '.join(PRETRAIN)}")
    check_flags({"--seeds": tuple(args.seeds)}, seeds=["--seeds"])
    _, extra, _ = parse(rest)
    _cfg(extra)  # an override that does not load: one line, before any folder is made
    smoke = SMOKE if args.smoke else {}
    out = output_folder(args.out, "python -m bench.claims.autofreeze", ["autofreeze.*", "pretrain", *PRETRAIN])
    seeds = args.seeds
    rows, curves = [], {}
    for task in args.only:
        print(f"== {task}: pre-training", flush=True)
        pre_over = {**PRETRAIN[task], **smoke}
        if task == "bert" and smoke:
            pre_over["data.max_tokens"] = 40000
        _, pre = run(_cfg({k: v for k, v in pre_over.items() if not k.startswith("method.")}), out / "pretrain",
                     f"{task} pre-training")
        results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for seed in seeds:
            for name, over in VARIANTS.items():
                over = {**PRETRAIN[task], **FINETUNE[task], **over, **smoke, "model.init_from": str(pre / "final"),
                        "train.seed": seed, **extra}
                if over.get("method.name") == "baseline":
                    over = {k: v for k, v in over.items() if not k.startswith("method.autofreeze")}
                cfg = _cfg(over)
                metrics, folder = run(cfg, out / task, f"{task} {name} seed {seed}")
                s, train = summary(folder), [r for r in metrics if r["kind"] == "train"]
                val = [r for r in metrics if r["kind"] == "val"]
                results[name].append({"acc": val[-1]["val_accuracy"], "wall": s["train_wall_s"], "flops": s["flops"],
                                      "samples": s["steps"] * cfg.train.batch_size,
                                      "frozen": train[-1].get("frozen", 0), "hit": train[-1].get("cache_hit_rate")})
                if seed == seeds[0]:
                    curves[f"{task} {name}"] = metrics
        base = results["plain"]
        for name, rs in results.items():
            accs = [r["acc"] for r in rs]
            rows.append({
                "task": task, "variant": name, "dev acc % (mean)": round(100 * mean(accs), 2),
                "spread": round(100 * pstdev(accs), 2),
                "samples/s": round(mean(r["samples"] / r["wall"] for r in rs), 1),
                "wall s": round(mean(r["wall"] for r in rs), 1), "FLOPs": mean(r["flops"] for r in rs),
                "FLOPs vs plain": round(mean(r["flops"] for r in rs) / mean(r["flops"] for r in base), 3),
                "speed-up (wall)": round(mean(r["wall"] for r in base) / mean(r["wall"] for r in rs), 3),
                "frozen at end": rs[0]["frozen"], "cache hit rate": rs[0]["hit"] if rs[0]["hit"] is not None else "",
            })
    text = format_table(rows)
    payload = {"seeds": seeds, "extra": extra, "results": rows,
               "command": " ".join(["python -m bench.claims.autofreeze", *sys.argv[1:]])}
    atomic_write_json(out / "autofreeze.json", payload)
    if args.results:
        record(args.results, "autofreeze", payload, "python -m bench.claims.autofreeze")
    atomic_write_text(out / "autofreeze.md", text + "\n")
    _plot(curves, out / "autofreeze.png")
    print(text)
    print(f"outputs: {out}/autofreeze.md, autofreeze.json, autofreeze.png")


def _plot(curves: dict[str, list[dict]], path: Path) -> None:
    """Frozen depth against steps and dev accuracy against FLOPs, one column per task. AutoFreeze with and
    without its cache freeze alike and score alike (the cache changes the cost only), so their lines lie on
    each other: ``styles`` draws the first wider and the next dashed over it, so both stay visible."""

    plt = pyplot()
    if plt is None:
        return
    tasks = sorted({k.split()[0] for k in curves})
    fig, axes = plt.subplots(2, len(tasks), figsize=(6 * len(tasks), 7), squeeze=False)
    for col, task in enumerate(tasks):
        names = [k for k in curves if k.startswith(task + " ")]
        for i, (name, st) in enumerate(zip(names, styles(len(names)))):
            rows, label = curves[name], name.split(" ", 1)[1]
            train = [r for r in rows if r["kind"] == "train"]
            val = [r for r in rows if r["kind"] == "val" and "val_accuracy" in r]
            draw(axes[0][col], [r["step"] for r in train], [r.get("frozen", 0) for r in train], st, label, i,
                 len(names), where="post")
            draw(axes[1][col], [r["flops"] for r in val], [100 * r["val_accuracy"] for r in val], st, label, i,
                 len(names))
        axes[0][col].set(title=f"{task}: frozen layers", xlabel="step", ylabel="frozen prefix (layers)")
        axes[1][col].set(title=f"{task}: dev accuracy", xlabel="training FLOPs", ylabel="accuracy %")
        axes[0][col].legend()
        axes[1][col].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
