"""This process's batch of every step, built one step ahead on a background thread.

The global batch of step s is a pure function of (seed, s) (progressive.data.batch_indices; MLM masks from
a generator seeded by the step), so nothing stops step s+1's batch from being built while the device
computes step s, and each process builds only its own rows of it (``make_batch(rows=...)``: masks are
still drawn for the whole batch, so every world size trains on the same tensors). On a GPU the tensors are
pinned, so their copy to the device (``non_blocking``) overlaps the host too.

What the device waits for is reported per logged row: ``batch_ms`` (building one step's batch, on the
thread) and ``wait_ms`` (how long the loop waited for it: near zero when the thread keeps up).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["BatchFeed"]

Built = tuple[Any, dict[str, torch.Tensor]]  # (the step's sample indices, this process's tensors)


class BatchFeed:
    """``get(step)`` returns ``build(step)``, and starts building ``step + 1`` before it returns.

    Args:
        build: step -> (indices, {name: CPU tensor}); must not touch the global random state (the batch is a
            pure function of the step, which is what makes building it early safe).
        pin: pin the tensors' memory (for a GPU), on the thread.
    """

    def __init__(self, build: Callable[[int], Built], pin: bool) -> None:
        self.build, self.pin = build, pin
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch")
        self._next: tuple[int, Future] | None = None
        self.build_s = self.wait_s = 0.0
        self.steps = 0

    def _make(self, step: int) -> tuple[Built, float]:
        t0 = time.perf_counter()
        ids, batch = self.build(step)
        if self.pin:
            batch = {k: v.pin_memory() for k, v in batch.items()}
        return (ids, batch), time.perf_counter() - t0

    def get(self, step: int) -> Built:
        """The batch of ``step`` (built here if the one prepared ahead is another step's, e.g. after a resume)."""
        t0 = time.perf_counter()
        ahead, self._next = self._next, None
        if ahead is not None and ahead[0] == step:
            built, seconds = ahead[1].result()  # re-raises what the thread raised, here
        else:
            if ahead is not None:
                ahead[1].cancel()
            built, seconds = self._make(step)
        self.wait_s += time.perf_counter() - t0
        self.build_s += seconds
        self.steps += 1
        self._next = (step + 1, self._pool.submit(self._make, step + 1))
        return built

    def take_times(self) -> dict[str, float]:
        """{"batch_ms", "wait_ms"}: per step, means since the previous call."""
        n = max(self.steps, 1)
        out = {"batch_ms": round(1e3 * self.build_s / n, 3), "wait_ms": round(1e3 * self.wait_s / n, 3)}
        self.build_s = self.wait_s = 0.0
        self.steps = 0
        return out

    def close(self) -> None:
        """Drop the batch built ahead and stop the thread."""
        if self._next is not None:
            self._next[1].cancel()
            self._next = None
        self._pool.shutdown(wait=True)
