"""Time and throughput as the device sees them: the one clock every timed figure here is read from.

GPU kernels run asynchronously: a host clock read right after a step's kernels are *launched* measures the
launch, not the work (a compiled GPT-2-124M "ran" at 78% MFU that way). ``Stopwatch.lap`` waits for the
device's queued work (``synchronize``) before it reads the clock, so what it returns is the device's time.
The trainer laps once per logged row (not per step: each sync drains the queue the host would otherwise
keep ahead), the pipeline engine and the benches wherever they read a time.

Throughput figures (``peak_flops``, ``peak_memory_gb``) follow torchtitan's: model FLOPs per second against
the chip's peak dense bf16 rate (MFU), and the most memory the run held.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import re
import resource
import sys
import time
from collections.abc import Iterator

import torch

__all__ = ["synchronize", "Stopwatch", "timed", "peak_flops", "peak_memory_gb", "keep_freed_host_memory",
           "peak_tflops_of", "PEAK_BF16_TFLOPS"]

# Peak dense bf16 tensor-core TFLOP/s per device torch sees (vendor data sheets, no sparsity). A key matches
# a device name (torch.cuda.get_device_name) when its words are whole words of the name, in order; the most
# specific match wins (most words, then the longest), so "H200 NVL" beats "H200", "GH200" is not an "H200"
# and "A10" is not an "A100". AMD's MI250X and MI250 hold two dies (GCDs) and torch sees each die as its
# own device: their entries are half the package's figure (383 and 362.1).
PEAK_BF16_TFLOPS = {
    "H100": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0,
    "H200": 989.0, "H200 NVL": 835.0, "GH200": 989.0,
    "H800": 989.0, "H800 PCIe": 756.0,
    "B200": 2250.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0,
    "RTX 4090": 165.0, "MI300X": 1307.0, "MI250X": 191.5, "MI250": 181.05,
}


def _words(name: str) -> list[str]:
    """A device name's words, upper-cased: "NVIDIA A100-SXM4-80GB" -> ["NVIDIA", "A100", "SXM4", "80GB"]."""
    return re.findall(r"[A-Z0-9]+", name.upper())


def peak_tflops_of(name: str) -> float | None:
    """The table's peak dense bf16 TFLOP/s for a device named ``name``, or None when no key matches.

    A key matches when its words appear in the name's words as a run, in order; the most specific key
    wins: the most words, then the most characters ("NVIDIA H200 NVL" -> "H200 NVL": 835, not "H200")."""
    words = _words(name)
    found = []
    for key, tflops in PEAK_BF16_TFLOPS.items():
        k = _words(key)
        if any(words[i:i + len(k)] == k for i in range(len(words) - len(k) + 1)):
            found.append((len(k), len(key), tflops))
    return max(found)[2] if found else None


def synchronize(device: torch.device | str) -> None:
    """Wait until every kernel queued on ``device`` has finished (nothing to wait for on a CPU)."""
    device = torch.device(device)
    if device.type == "cpu":
        return
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize(device)


class Stopwatch:
    """Seconds of device work between marks.

    ``lap()`` synchronizes the device, then returns the seconds since the previous mark and marks now.
    ``restart()`` marks now *without* waiting: for right after work that ended on the host anyway (an
    evaluation that read its loss, a checkpoint copied to the CPU), so that the time it took is left out.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._mark = time.perf_counter()

    def restart(self) -> None:
        """Mark now (no synchronization)."""
        self._mark = time.perf_counter()

    def lap(self) -> float:
        """Wait for the device, return the seconds since the last mark, and mark now."""
        synchronize(self.device)
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        return seconds


@contextlib.contextmanager
def timed(device: torch.device | str) -> Iterator[list[float]]:
    """``with timed(dev) as t: ...`` then ``t[0]`` is the block's device time in seconds (synchronized at both
    ends: work queued before the block is not counted, work queued in it is)."""
    synchronize(device)
    out: list[float] = []
    start = time.perf_counter()
    yield out
    synchronize(device)
    out.append(time.perf_counter() - start)


def peak_flops(device: torch.device | str, override_tflops: float | None = None) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` for MFU: ``override_tflops`` when given, else the table's entry
    for a known GPU, else None (a CPU, or a GPU not in the table: pass ``--train.peak_tflops``)."""
    if override_tflops:
        return float(override_tflops) * 1e12
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    tflops = peak_tflops_of(torch.cuda.get_device_name(device))
    return tflops * 1e12 if tflops is not None else None


def peak_memory_gb(device: torch.device | str) -> float:
    """The most memory this process has held, in GB: allocated by tensors on a GPU, the resident set on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return rss / (1e9 if sys.platform == "darwin" else 1e6)


# glibc's mallopt parameters (malloc.h): allocations above M_MMAP_THRESHOLD get their own mmap, given back at free;
# free trims the heap's top above M_TRIM_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
HOST_HOLD_BYTES = 1 << 30


@functools.cache
def keep_freed_host_memory() -> bool:
    """Let glibc keep freed host memory for the next allocation instead of returning it to the kernel.

    By default glibc serves each allocation above 32 MB with its own ``mmap`` and unmaps it at ``free``: a CPU
    step whose logits are that large (2,048 tokens x 4,096 vocabulary x 4 bytes) then maps, zero-fills and unmaps
    them every step, and the kernel's share of a 2x32 model's step was ~40% (bench/speed/host_alloc.py). Raising
    both thresholds to ``HOST_HOLD_BYTES`` keeps such blocks in the heap: the resident set stays at its peak, the
    numbers computed are the same. Returns whether it took effect (glibc only: elsewhere it does nothing); once
    per process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it, and only glibc's mallopt takes these numbers)
    except (OSError, AttributeError):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, HOST_HOLD_BYTES)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                         HOST_HOLD_BYTES))
