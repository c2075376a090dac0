"""The readable lines of the pipeline engine: at every change one line per decision and one for the new layout,
and at the end of a layout one line with what it measured (the paper's users could not read its logs:
PipeTransformer issue #3, whose throughput divided by an elapsed time of about zero)."""

from __future__ import annotations

from progressive.pipeline.mesh import Layout


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
