"""Milliseconds per CPU training step with glibc's default allocator and with freed host memory kept
(``train.keep_host_memory``, common.device.keep_freed_host_memory), on the frontier grids' model shapes.

    python -m bench.speed.host_alloc                  # 2x32 and 4x128 (vocabulary 4,096), 4x64 (vocabulary 512)
    python -m bench.speed.host_alloc --smoke          # one tiny shape, a few steps (the test suite runs it)

By default glibc serves each allocation above 32 MB with its own mmap and gives it back at free; a step's logits at
vocabulary 4,096 (2,048 tokens x 4,096 x 4 bytes = 32 MB) and their gradient are then mapped, zero-filled by the
kernel and unmapped every step. Each shape trains ``--steps`` steps of the baseline twice per repeat, default and
kept alternating, one thread each, in fresh processes (glibc reads the setting once per process); the figure is
the median step time after the first ``--skip`` steps, with the processes' user and system CPU seconds. Both ways
must end on the same loss, bit for bit (checked). Run it alone: another process on the cores changes both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common.cli import check_flags, run_cli
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--method.name", "baseline", "--train.with_baseline", "false", "--train.threads", "1",
          "--train.progress", "false", "--train.eval_every", "1000000", "--train.checkpoint_every", "1000000",
          "--train.report_to", "none", "--train.log_every", "1"]
# name -> (recipe, overrides): the default grid's smallest and largest shapes, the layer grid's target
SHAPES = {"2x32 vocab 4096": ("configs/default.yaml", ["--model.num_layers", "2", "--model.hidden_size", "32"]),
          "4x128 vocab 4096": ("configs/default.yaml", []),
          "4x64 vocab 512": ("configs/default.yaml", ["--model.hidden_size", "64", "--data.vocab_size", "512"])}
SMOKE = {"tiny": ("configs/tiny_test.yaml", [])}


def one(recipe: str, over: list[str], keep: bool, steps: int, skip: int, folder: Path) -> dict:
    """Train once in a fresh process; its median ms/step after ``skip`` steps, final loss and CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "train.py", "--config", recipe, *COMMON, *over, "--train.steps", str(steps),
                    "--train.keep_host_memory", str(keep).lower(), "--output_dir", str(folder)],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (metrics,) = folder.glob("*/metrics.jsonl")
    train = [r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"]
    gaps = [1e3 * (b["wall"] - a["wall"]) for a, b in zip(train[skip:], train[skip + 1:])]
    return {"ms": statistics.median(gaps), "loss": train[-1]["loss"], "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip", type=int, default=20, help="steps left out of the median (warm-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="one tiny shape, 6 steps, 1 repeat (tests)")
    ap.add_argument("--out", default=None, help="default bench/results/host_alloc.json; --smoke: outputs/bench/")
    args = ap.parse_args(argv)
    check_flags({"--steps": args.steps, "--repeats": args.repeats, "--skip": args.skip},
                at_least_one=["--steps", "--repeats"], not_negative=["--skip"])
    if args.skip >= args.steps:
        raise ValueError(f"--skip {args.skip}: leaves none of --steps {args.steps} for the median")
    if args.out is None:  # a smoke run's CPU figures never land among the results
        args.out = str(ROOT / ("outputs/bench" if args.smoke else "bench/results") / "host_alloc.json")
    shapes, steps, skip, repeats = (SMOKE, 6, 1, 1) if args.smoke else (SHAPES, args.steps, args.skip, args.repeats)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result: dict = {WRITTEN_BY: "growtrain bench/speed/host_alloc.py", "steps": steps, "skip": skip,
                    "repeats": repeats, "threads": 1, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (recipe, over) in shapes.items():
            runs: dict[str, list[dict]] = {"default": [], "kept": []}
            for r in range(repeats):
                for mode in ("default", "kept"):
                    runs[mode].append(one(recipe, over, mode == "kept", steps, skip, Path(tmp) / f"{name}-{mode}-{r}"))
                    print(f"{name} repeat {r} {mode}: {runs[mode][-1]['ms']:.1f} ms/step, "
                          f"sys {runs[mode][-1]['sys_s']:.1f} s", flush=True)
            if len({x["loss"] for x in runs["default"] + runs["kept"]}) != 1:
                raise AssertionError(f"{name}: the two allocators ended on different losses")
            med = {mode: statistics.median(x["ms"] for x in v) for mode, v in runs.items()}
            result["shapes"][name] = {"runs": runs, "median_ms": med, "speedup": med["default"] / med["kept"],
                                      "same_loss": True}
            print(f"{name}: default {med['default']:.1f} ms/step, kept {med['kept']:.1f} ms/step "
                  f"({med['default'] / med['kept']:.2f}x), the same loss", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
