"""Time coalesce, de-coalesce and interpolate on a GPT-2-124M-shaped model (random init, no download).

Each operation runs ``--repeats`` times; we report the median wall-clock and the peak extra resident
memory it needed (RSS sampled every 0.5 ms, minus the RSS before the call, so inputs already in memory
are not counted), both also relative to the fp32 size of the 124M model.

    python -m bench.speed.operators_timing [--repeats 5] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import os

from bench.lib.runs import output_file
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # before torch: huge pages for large CPU tensors

import argparse
import gc
import statistics
import threading
import time

import psutil
import torch

from common.cli import check_flags, run_cli
from common.device import timed
from common.quiet import quiet_transformers

quiet_transformers()
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import operators as ops  # noqa: E402


class PeakRSS:
    """Context manager sampling this process' RSS in a thread; ``.extra`` = peak - start (bytes)."""

    def __init__(self, interval: float = 0.0005):
        self.interval, self.proc = interval, psutil.Process()

    def __enter__(self):
        gc.collect()
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.extra = self.peak - self.start


def measure(fn, repeats: int) -> tuple[float, float]:
    """Median seconds and max extra RSS (bytes) of ``fn()`` over ``repeats`` runs."""
    times, mems = [], []
    for _ in range(repeats):
        with PeakRSS() as mem, timed("cpu") as seconds:
            out = fn()
        times.append(seconds[0])
        mems.append(mem.extra)
        del out
        gc.collect()
    return statistics.median(times), max(mems)


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default).

    Raises:
        ValueError: --repeats or --threads < 1, before any work (0 threads was torch's RuntimeError, 0 repeats a
            median of nothing).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args(argv)
    check_flags({"--repeats": args.repeats, "--threads": args.threads}, at_least_one=["--repeats", "--threads"])
    if args.json:

        output_file(args.json, "python -m bench.speed.operators_timing")  # before the minutes of work, not after
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024)
    large = GPT2LMHeadModel(cfg).eval()
    small = ops.coalesce(large, width=2, depth=2)
    other = GPT2LMHeadModel(cfg).eval()
    size = sum(p.numel() * p.element_size() for p in large.parameters())
    cases = {
        "coalesce (124M -> w/2, d/2)": lambda: ops.coalesce(large, width=2, depth=2),
        "de-coalesce (w/2, d/2 -> 124M)": lambda: ops.decoalesce(small, width=2, depth=2),
        "interpolate (124M, 124M)": lambda: ops.interpolate(large, other, 0.25),
        "interpolate in place (124M)": lambda: ops.interpolate(large, other, 0.25, inplace=True),
    }
    rows = []
    print(f"GPT-2-124M shape: {sum(p.numel() for p in large.parameters()):,} parameters, "
          f"{size / 2**20:.0f} MiB fp32; torch threads={args.threads}; median of {args.repeats}")
    print("| operation | median s | peak extra MiB | peak / model size |")
    print("|---|---|---|---|")
    for name, fn in cases.items():
        fn()  # warm-up (first-call allocator and import costs)
        sec, extra = measure(fn, args.repeats)
        rows.append({"operation": name, "median_s": sec, "peak_extra_mib": extra / 2**20,
                     "peak_over_model": extra / size})
        print(f"| {name} | {sec:.3f} | {extra / 2**20:.0f} | {extra / size:.2f}x |")
    if args.json:

        atomic_write_json(args.json, {WRITTEN_BY: "growtrain bench/speed/operators_timing.py", "model_bytes": size,
                                      "rows": rows})


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
