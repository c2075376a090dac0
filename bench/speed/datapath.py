"""Milliseconds to build one process's DeiT-B batch (launch/recipes/deit_b_vcycle.yaml: 1,024 images of 224 px
per step, 8 processes), before and after the data path was made for GPUs.

    python -m bench.speed.datapath                    # 8 processes' worth: 128 images per process
    python -m bench.speed.datapath --world 1          # one process builds the whole batch either way

Before: every process built the whole global batch (1,024 images) and kept its slice, converting the uint8
pixels through float64 as the image processor does. After: each process builds only its 128 rows, through a
256-entry float32 table per channel that holds the processor's own results (progressive/data/images.py's
``Pixels``), and the trainer builds it on a background thread while the device computes (progressive/run/feed.py),
so what the step waits for is ``wait_ms`` in the metrics rows, not this. Both paths give the same float32 values,
bit for bit (checked here). The images are random uint8 in memory (the page cache's case for a memory-mapped
cache); medians over ``--repeats``, one thread, the two paths alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from common.cli import check_flags, run_cli
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY
from progressive.config import DataConfig
from progressive.data.images import Pixels, make_image_processor

ROOT = Path(__file__).resolve().parents[2]


def before(raw: np.ndarray, idx: np.ndarray, rows: slice, scale: float, mean: np.ndarray,
           std: np.ndarray) -> torch.Tensor:
    """The old path: the whole batch through float64, then this process's slice."""
    x = np.asarray(raw[idx])
    x = (x.astype(np.float64) * scale).astype(np.float32)
    x = (x - mean) / std
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[rows]


def main(argv: list[str] | None = None) -> dict:

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1024, help="global batch (the recipe's)")
    ap.add_argument("--world", type=int, default=8, help="processes sharing it")
    ap.add_argument("--image_size", type=int, default=224)
    ap.add_argument("--images", type=int, default=2048, help="images in the synthetic split")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "datapath.json"))
    args = ap.parse_args(argv)
    counts = ["--batch", "--world", "--image_size", "--images", "--repeats"]
    check_flags({f: getattr(args, f[2:]) for f in counts}, at_least_one=counts)
    if not args.world <= args.batch <= args.images:  # each process a row at least; a batch draws distinct images
        raise ValueError(f"--world {args.world}, --batch {args.batch}, --images {args.images}: give world <= batch "
                         "<= images")
    torch.set_num_threads(1)
    proc = make_image_processor(DataConfig(image_size=args.image_size), "deit")
    raw = np.random.default_rng(0).integers(0, 256, (args.images, 3, args.image_size, args.image_size), dtype=np.uint8)
    pixels = Pixels(raw, proc)
    mean = np.asarray(proc.image_mean, np.float32)[:, None, None]
    std = np.asarray(proc.image_std, np.float32)[:, None, None]
    share = args.batch // args.world
    rows = slice(0, share)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.repeats):
        idx = np.random.default_rng(r).choice(args.images, args.batch, replace=False)
        t0 = time.perf_counter()
        old = before(raw, idx, rows, float(proc.rescale_factor), mean, std)
        t1 = time.perf_counter()
        new = pixels[idx[rows]]
        t2 = time.perf_counter()
        times["before"].append(1e3 * (t1 - t0))
        times["after"].append(1e3 * (t2 - t1))
        if not torch.equal(old, new):
            raise AssertionError("the two paths disagree: the table no longer holds the processor's values")
        print(f"repeat {r}: before {times['before'][-1]:.1f} ms, after {times['after'][-1]:.1f} ms", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {WRITTEN_BY: "growtrain bench/speed/datapath.py", "batch": args.batch, "world": args.world,
              "rows_per_process": share, "image_size": args.image_size, "threads": 1, "ms": times,
              "median_ms": med, "speedup": med["before"] / med["after"], "bit_identical": True}
    print(f"one process's DeiT-B batch ({share} of {args.batch} images, {args.image_size} px): before "
          f"{med['before']:.1f} ms, after {med['after']:.1f} ms ({med['before'] / med['after']:.1f}x), bit-identical")
    atomic_write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
