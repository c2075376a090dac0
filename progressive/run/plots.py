"""Loss curves as PNG (matplotlib, Agg backend: no display needed).

matplotlib is optional at run time: without it a run still writes its metrics, final checkpoint and
summary, and says once that the plots were skipped.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

_WARNED: list[bool] = []


def pyplot() -> Any | None:
    """matplotlib.pyplot on the Agg backend, or None (with a one-line warning, once) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        if not _WARNED:
            _WARNED.append(True)
            print(f"warning: no plots: matplotlib cannot be imported ({e}); pip install matplotlib", file=sys.stderr)
        return None
    return plt

AXES = {"flops": "cumulative training FLOPs", "wall": "training wall-clock (s)"}
_STANDARD = {"kind", "step", "phase", "phase_name", "tokens", "flops", "wall", "loss", "lr"}


def method_fields(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Integer-valued fields a method added to the train rows (frozen depth, stage, sampled depth)."""
    train = [r for r in rows if r["kind"] == "train"]
    keys = sorted({k for r in train for k in r} - _STANDARD)
    return [k for k in keys if all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool)
                                   for r in train if k in r)]


def _phase_starts(rows: Sequence[Mapping[str, Any]], x: str) -> list[tuple[float, str]]:
    starts, seen = [], None
    for r in rows:
        if r["kind"] == "train" and r["phase"] != seen:
            if seen is not None:
                starts.append((r[x], r["phase_name"]))
            seen = r["phase"]
    return starts


def plot_run(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, title: str) -> list[Path]:
    """Write loss_vs_flops.png and loss_vs_wallclock.png (train loss line, val loss markers, phase starts).

    Returns:
        The two paths ([] without matplotlib).
    """
    plt = pyplot()
    if plt is None:
        return []
    out_dir = Path(out_dir)
    paths = []
    train = [r for r in rows if r["kind"] == "train"]
    val = [r for r in rows if r["kind"] == "val"]
    for x, fname in (("flops", "loss_vs_flops.png"), ("wall", "loss_vs_wallclock.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.plot([r[x] for r in train], [r["loss"] for r in train], lw=0.8, alpha=0.6, label="train loss")
        ax.plot([r[x] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label="validation loss")
        for pos, name in _phase_starts(rows, x):
            ax.axvline(pos, color="grey", ls=":", lw=0.8)
            ax.text(pos, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", color="grey")
        ax.set_xlabel(AXES[x])
        ax.set_ylabel("loss")
        ax.set_title(title)
        handles, labels = ax.get_legend_handles_labels()
        extra = method_fields(rows)
        if extra:  # e.g. AutoFreeze's frozen depth, on its own axis
            twin = ax.twinx()
            for k in extra:
                pts = [r for r in train if k in r]
                twin.step([r[x] for r in pts], [r[k] for r in pts], where="post", lw=1.2, ls="--", color="tab:green",
                          label=k)
            twin.set_ylabel(", ".join(extra))
            h2, l2 = twin.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        ax.legend(handles, labels)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        paths.append(out_dir / fname)
    return paths


def plot_compare(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path,
                 target: float | None) -> Path | None:
    """One figure, two panels (validation loss vs FLOPs, vs wall-clock), one curve per run; ``target``
    (the baseline's final validation loss) as a horizontal line. Returns its path (None without matplotlib)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, x in zip(axes, ("flops", "wall")):
        for name, rows in runs.items():
            val = [r for r in rows if r["kind"] == "val"]
            ax.plot([r[x] for r in val], [r["val_loss"] for r in val], "o-", ms=3, label=name)
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8, label="baseline final val loss")
        ax.set_xlabel(AXES[x])
        ax.set_ylabel("validation loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
