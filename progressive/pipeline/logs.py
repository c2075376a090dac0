"""The readable lines of the pipeline engine: at every change one line per decision and one for the new layout,
and at the end of a layout one line with what it measured (the paper's users could not read its logs:
PipeTransformer issue #3, whose throughput divided by an elapsed time of about zero)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch.distributed as dist
from tqdm.auto import tqdm

from progressive.pipeline.autopipe import LayerProfile
from progressive.pipeline.mesh import Layout, Mesh


def _mb(m: int) -> str:
    return f"{m} micro-batch{'es' * (m != 1)}"


def layout_lines(step: int, note: str, why: list[str], seconds: float, old: Layout | None, lay: Layout,
                 profiled_ms: list[float], samples: int) -> list[str]:
    """The decision (``note``: AutoFreeze's), AutoPipe's reasons for K, AutoDP's re-mesh when K changed, and
    the new layout with the profiled ms of each stage for one micro-batch of ``samples``."""
    out = [f"[step {step}] {note}"] + [f"[step {step}] AutoPipe: {w}" for w in why]
    if old is not None and old.k != lay.k:
        out.append(f"[step {step}] AutoDP: mesh (dp {old.dp}, pp {old.k}) -> (dp {lay.dp}, pp {lay.k}); "
                   f"{seconds:.2f}s to move state, rebuild and profile")
    out.append(f"[step {step}] layout: frozen {lay.frozen} | K {lay.k} | dp {lay.dp} | layers/stage {lay.sizes()} | "
               f"profiled ms/stage {profiled_ms} (one micro-batch of {samples}) | {_mb(lay.microbatches)}")
    return out


def segment_line(start: int, stop: int, lay: Layout, per_stage_ms: list[float], samples_per_s: float) -> str:
    """What steps start..stop measured under ``lay``: compute ms per step of each stage (its forward and
    backward calls, mean over replicas) and the global samples per second of wall-clock."""
    return (f"[steps {start}-{stop}] frozen {lay.frozen} | K {lay.k} | dp {lay.dp} | layers/stage {lay.sizes()} | "
            f"measured ms/step per stage {per_stage_ms} | {_mb(lay.microbatches)} | {samples_per_s:.1f} samples/s")


class LayoutLog:
    """The pipeline engine's record of its layouts: a transition per change in summary.json (appended to
    ``transitions``, the run's list) and the lines above on the console (rank 0).

    Args:
        world: the number of processes.
        rank: this process's.
        batch_size: the global batch (samples/s).
        transitions: the run's record of changes.
    """

    def __init__(self, world: int, rank: int, batch_size: int, transitions: list[dict[str, Any]]):
        self.world, self.rank, self.batch_size, self.transitions = world, rank, batch_size, transitions
        self.segment: list[tuple[float, float]] = []  # per step since the last change: (seconds, busy seconds)
        self.start = 0  # the step the segment started at

    def change(self, step: int, phase: str, note: str, why: list[str], seconds: float, lay: Layout, mesh: Mesh,
               profile: LayerProfile, microbatch_ms: dict[int, float], old: Layout | None = None) -> None:
        """Record a layout change at ``step``: a transition in summary.json (with every rank's process-group
        sizes, as the groups report them) and readable lines; a new segment starts."""
        seen = [None] * self.world
        dist.all_gather_object(seen, mesh.describe())
        prof = profile.costs(lay.frozen, "time")
        ms = [round(sum(prof[a - lay.frozen:b - lay.frozen]), 2) for a, b in zip(lay.bounds, lay.bounds[1:])]
        self.transitions.append({"step": step, "to": phase, "note": note,
                                 "seconds": round(seconds, 3), "why": why, **lay.as_dict(), "k": lay.k,
                                 "layers_per_stage": lay.sizes(), "profiled_ms_per_stage": ms,
                                 "microbatch_ms": microbatch_ms, "ranks": seen})
        if self.rank == 0:
            for line in layout_lines(step, note, why, seconds, old, lay, ms, profile.samples):
                tqdm.write(line, file=sys.stderr)  # clears and redraws a progress bar
        self.segment, self.start = [], step

    def step(self, seconds: float, busy: float) -> None:
        """A step of the current segment: its wall-clock seconds and this stage's compute seconds."""
        self.segment.append((seconds, busy))

    def end(self, step: int, lay: Layout) -> None:
        """One line for the layout ``lay`` that ran since the last change: frozen, K, dp, layers per stage, measured
        compute ms per step of each stage (mean over its replicas), micro-batches and samples/s (the global
        batch over the step wall-clock; the first step of a layout, which infers shapes, is left out when
        there are others)."""
        steps = self.segment
        busy = [None] * self.world
        dist.all_gather_object(busy, float(np.mean([b for _, b in steps])) if steps else 0.0)
        if self.rank != 0 or not steps:
            return
        per_stage = [round(1e3 * float(np.mean(busy[s::lay.k])), 1) for s in range(lay.k)]
        timed = steps[1:] if len(steps) > 1 else steps
        rate = len(timed) * self.batch_size / sum(s for s, _ in timed)
        line = segment_line(self.start, step, lay, per_stage, rate)
        tqdm.write(line, file=sys.stderr)  # clears and redraws a progress bar
        if self.transitions:
            self.transitions[-1].update(measured_ms_per_stage=per_stage, samples_per_s=round(rate, 3),
                                        steps=[self.start, step])
