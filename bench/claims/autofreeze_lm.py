"""AutoFreeze on the frontier's own GPT-2: fine-tuning from its checkpoint, and pre-training.

    python -m bench.claims.autofreeze_lm --results bench/results     # ~30 min on 2 CPU cores, alone
    python -m bench.claims.autofreeze_lm --smoke --out outputs/smoke   # seconds: the script runs (numbers mean nothing)

**Fine-tuning** (where PipeTransformer's AutoFreeze applies): the frontier's tuned baseline of the default
target (4x128) at the methods' largest budget, seed 0 (bench/frontier/run.py; trained again, to the same row,
when its checkpoint is not on this machine), is fine-tuned on Penn Treebank (the bundled ``ptb.train``, its
first 100k tokens in blocks of 128, a tenth held out for validation) for ``EPOCHS`` epochs with one freeze
decision per epoch, from the same checkpoint, data and seeds: plain (every layer trains), AutoFreeze with
the closed-form bound alone, with the paper's argmin criterion, and with the relative-change rule. AutoCache
does not apply: the GPT-2's input embedding is tied to its output head, which keeps training, so a cached
prefix output would go stale (the method refuses it). Per variant: final validation loss (mean [min, max]
over seeds), FLOPs and wall-clock against plain, the saving at equal validation loss on plain's curve (same
seed; evaluated every epoch on the whole validation split), and seed 0's decisions.

**Pre-training** (not the paper's setting; run to see whether it makes sense): AutoFreeze (argmin, a decision
every sixth of the run) from scratch at the frontier's target and largest budget, every seed, against the
frontier's tuned baseline of the same size: test loss and the FLOPs saved at equal test loss on that
baseline's curve over budgets (bench/lib/envelope.py). The runs keep the frontier's settings (one thread).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import mean
from typing import Any

from common.cli import check_flags, list_of, run_cli
from common.quiet import quiet_transformers
from common.table import format_table

quiet_transformers()

from bench.lib import envelope  # noqa: E402
from bench.lib import grid as F  # noqa: E402
from bench.lib.rows import rows_or_exit  # noqa: E402
from bench.lib.runs import freeze_decisions, output_folder, publish, run, summary  # noqa: E402
from progressive.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PTB = ROOT / "data" / "ptb" / "ptb.train.txt.gz"
EPOCHS = 8
EPOCH = 44  # optimizer steps per epoch: 100k tokens -> 781 blocks of 128, 703 for training, batch 16
AF = {"method.name": "autofreeze", "method.autofreeze.alpha": 1 / 3, "method.autofreeze.cache.enabled": False}
VARIANTS = {
    "plain": {"method.name": "baseline"},
    "bound": {**AF, "method.autofreeze.criterion": "bound"},
    "argmin": {**AF, "method.autofreeze.criterion": "argmin"},
    "relative": {**AF, "method.autofreeze.criterion": "relative"},
}
SMOKE = {"epochs": 2, "epoch": 3, "max_tokens": 3000, "seq_len": 32}


def base_checkpoint(g: F.Grid, rows: list[dict[str, Any]], frontier_out: Path) -> tuple[Path, dict[str, Any],
                                                                                          dict[str, Any]]:
    """(checkpoint folder, its frontier row, the row this machine reproduced or None) of the tuned baseline of
    ``g.target`` at the largest methods' budget, seed 0; trained into ``frontier_out`` when missing there."""
    size, top = g.target, max(g.budgets)
    flops = {size: F.step_flops_of(g, size)}
    lr = envelope.tuned_lr(rows, size, top) or g.lrs[len(g.lrs) // 2]
    job = F.make_job(g, "baseline", "tuned", size, top, lr, 0, flops, 0)
    folder = frontier_out / job["key"]
    again = None
    if not (folder / "final" / "config.json").is_file():
        print(f"   the frontier's {size[0]}x{size[1]} baseline at budget {top}: training its checkpoint", flush=True)
        again = F.train(job, g.recipe, str(frontier_out))
    row = next((r for r in rows if r["key"] == job["key"]), again)
    return folder / "final", row, again


def finetune(g: F.Grid, ckpt: Path, out: Path, seeds: list[int], smoke: bool) -> dict[str, list[dict[str, Any]]]:
    """Every variant fine-tuned from ``ckpt`` on PTB for every seed (variants of a seed back to back)."""
    epochs, epoch = (SMOKE["epochs"], SMOKE["epoch"]) if smoke else (EPOCHS, EPOCH)
    over = {**dict(g.overrides), "model.init_from": str(ckpt), "data.dataset": str(PTB),
            "data.tokenizer": str(ckpt), "data.max_tokens": SMOKE["max_tokens"] if smoke else 100_000,
            "data.val_fraction": 0.1, "data.test_fraction": 0.0, "train.steps": epochs * epoch,
            "train.lr": 5e-4, "train.warmup": 0.05, "train.eval_every": epoch, "train.eval_batches": 10**5,
            "train.checkpoint_every": 10**6, "train.progress": False, "train.report_to": "none",
            "train.threads": 2, "method.autofreeze.freeze_every": epoch,
            **({"data.seq_len": SMOKE["seq_len"]} if smoke else {})}
    got: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for seed in seeds:
        for name, method in VARIANTS.items():
            cfg = load_config(ROOT / g.recipe, {**over, **method, "train.seed": seed})
            metrics, folder = run(cfg, out / "finetune", f"fine-tune {name} seed {seed}")
            s = summary(folder)
            got[name].append({"metrics": metrics, "wall": s["train_wall_s"], "flops": s["flops"],
                              "loss": [r for r in metrics if r["kind"] == "val"][-1]["val_loss"],
                              "decisions": freeze_decisions(metrics)})
    return got


def finetune_rows(got: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The fine-tuning table: one row per variant."""
    plain = got["plain"]
    out = []
    for name, runs in got.items():
        loss = [r["loss"] for r in runs]
        saved = {ax: [envelope.saving(r[key], envelope.frontier(envelope.curve(p["metrics"], ax)), r["loss"])
                      for r, p in zip(runs, plain)] for ax, key in (("flops", "flops"), ("wall", "wall"))}
        first = runs[0]["decisions"]
        out.append({"variant": name, "val loss": round(mean(loss), 4), "min": round(min(loss), 4),
                    "max": round(max(loss), 4),
                    "FLOPs vs plain": round(mean(r["flops"] for r in runs) / mean(p["flops"] for p in plain), 3),
                    "speed-up (wall)": round(mean(p["wall"] for p in plain) / mean(r["wall"] for r in runs), 3),
                    "FLOPs saved at equal loss": "—" if name == "plain" else envelope.spread(saved["flops"]),
                    "wall saved at equal loss": "—" if name == "plain" else envelope.spread(saved["wall"]),
                    "criterion decided": f"{sum(c < b for b, c, _ in first)} of {len(first)}" if first else "",
                    "decisions B/C->F (seed 0)": " ".join(f"{b}/{c}->{f}" for b, c, f in first)})
    return out


def pretrain(g: F.Grid, rows: list[dict[str, Any]], out: Path, seeds: list[int]) -> list[dict[str, Any]]:
    """AutoFreeze pre-training at the frontier's target and largest budget, against its same-size baseline."""
    size, top = g.target, max(g.budgets)
    flops = {size: F.step_flops_of(g, size)}
    lr = envelope.tuned_lr(rows, size, top) or g.lrs[len(g.lrs) // 2]
    budgets = sorted({b for s, b in g.baseline_cells() if s == size})
    ref = envelope.same_size_curve(rows, size, budgets, "flops")
    base = envelope.tuned_runs(rows, size, top)
    table = []
    for seed in seeds:
        job = F.make_job(g, "baseline", "tuned", size, top, lr, seed, flops, 0)
        steps = job["overrides"]["train.steps"]
        over = {**job["overrides"], "method.name": "autofreeze", "method.autofreeze.criterion": "argmin",
                "method.autofreeze.freeze_every": max(1, steps // 6)}
        _, folder = run(load_config(ROOT / g.recipe, over), out / "pretrain", f"pre-training autofreeze seed {seed}")
        s = summary(folder)
        b = next((r for r in base if int(r["seed"]) == seed), None)
        table.append({"seed": seed, "size": f"{size[0]}x{size[1]}", "budget (target steps)": top,
                      "AutoFreeze test loss": round(s["final_test_loss"], 4),
                      "baseline test loss": "" if b is None else round(float(b["test_loss"]), 4),
                      "FLOPs vs baseline": "" if b is None else round(s["flops"] / float(b["flops"]), 3),
                      "FLOPs saved vs same size": envelope.pct(envelope.saving(s["flops"], ref, s["final_test_loss"])
                                                      if ref else None)})
    return table


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: a seed out of range or a damaged frontier.csv, before any work.
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=list_of(int), default="0,1,2")
    ap.add_argument("--out", default="outputs/bench_autofreeze_lm")
    ap.add_argument("--frontier_results", default=str(ROOT / "bench" / "results"), help="folder of frontier.csv")
    ap.add_argument("--frontier_out", default="outputs/frontier", help="the frontier's run folders (checkpoints)")
    ap.add_argument("--results", default=None, help="also record RESULTS/autofreeze_lm.json (bench/results)")
    ap.add_argument("--smoke", action="store_true", help="the frontier's smoke grid, a few steps (tests)")
    args = ap.parse_args(argv)
    check_flags({"--seeds": tuple(args.seeds)}, seeds=["--seeds"])
    g = F.SMOKE if args.smoke else F.FULL
    rows = rows_or_exit(Path(args.frontier_results) / "frontier.csv")  # (a damaged file: before any folder is made)
    out = output_folder(args.out, "python -m bench.claims.autofreeze_lm",
                        ["autofreeze_lm.*", "finetune", "pretrain", "frontier"])
    seeds = args.seeds
    ckpt, row, again = base_checkpoint(g, rows, out / "frontier" if args.smoke else Path(args.frontier_out))
    got = finetune(g, ckpt, out, seeds, args.smoke)
    payload = {"seeds": seeds, "results": finetune_rows(got), "pretraining": pretrain(g, rows, out, seeds),
               "checkpoint": {"row": None if row is None else {k: row[k] for k in ("layers", "width", "lr", "budget",
                                                                                    "seed", "test_loss", "key")},
                              "reproduced_test_loss": None if again is None else again["test_loss"]},
               "load_average": os.getloadavg(),
               "command": " ".join(["python -m bench.claims.autofreeze_lm", *sys.argv[1:]])}

    print(publish(out, "autofreeze_lm", payload, args.results, "python -m bench.claims.autofreeze_lm"))
    print(format_table(payload["pretraining"]))


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
