"""Loss curves as PNG (matplotlib, Agg backend: no display needed).

matplotlib is optional at run time: without it a run still writes its metrics, final checkpoint and
summary, and says once that the plots were skipped.

Lines that share an axes are told apart and kept visible by ``styles``: each its own colour, line style
and marker, and the lines drawn first are wider, so one drawn exactly over another (AutoFreeze with and
without its cache, an elastic run's K and dp where they cross) leaves the one below showing on both sides
and through its dashes; the markers of equal lines are staggered.
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
            print(f"warning: no plots: matplotlib cannot be imported ({e}); pip install matplotlib "
                  "(or: pip install 'growtrain[plots]')", file=sys.stderr)
        return None
    return plt


AXES = {"flops": "cumulative training FLOPs", "wall": "training wall-clock (s)"}
_STANDARD = {"kind", "step", "phase", "phase_name", "tokens", "flops", "wall", "loss", "lr"}
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
          "tab:cyan", "tab:gray")
LINESTYLES = ("-", "--", ":", "-.", (0, (6, 2)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def styles(n: int, first: int = 0) -> list[dict[str, Any]]:
    """Keyword arguments for ``n`` lines drawn in this order on one axes (``first``: where in the palette to
    start). Colour, line style and marker cycle with periods 10, 6 and 10, so the first 30 lines differ in
    all three together; widths fall from 4 to 1 point in drawing order (see the module docstring)."""
    return [{"color": COLORS[(first + i) % len(COLORS)], "ls": LINESTYLES[(first + i) % len(LINESTYLES)],
             "marker": MARKERS[(first + i) % len(MARKERS)], "lw": 1.0 + 3.0 * (n - 1 - i) / max(n - 1, 1),
             "ms": 4, "zorder": 2 + i} for i in range(n)]


def draw(ax: Any, xs: Sequence[float], ys: Sequence[float], style: Mapping[str, Any], label: str, index: int = 0,
         n: int = 1, where: str | None = None) -> None:
    """One line of a set of ``n`` on ``ax`` (line ``index``, drawn in that order) in ``style``: at most ~12
    markers, staggered between the lines so equal lines show all their markers; ``where``: a step plot."""
    every = max(1, len(xs) // 12)
    kw = {**style, "label": label, "markevery": (index * every // max(n, 1), every)}
    if where:
        ax.step(xs, ys, where=where, **kw)
    else:
        ax.plot(xs, ys, **kw)


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


# The run's own losses in colour, the baseline's in grey and black: four distinct (colour, style, marker).
_LOSSES = {"train": {"color": "tab:blue", "ls": "-", "marker": "", "lw": 0.8, "alpha": 0.7},
           "val": {"color": "tab:orange", "ls": "-", "marker": "o", "lw": 1.4, "ms": 3},
           "baseline train": {"color": "tab:gray", "ls": ":", "marker": "", "lw": 0.8, "alpha": 0.7},
           "baseline val": {"color": "black", "ls": "--", "marker": "s", "lw": 1.2, "ms": 3}}


def loss_figure(plt: Any, rows: Sequence[Mapping[str, Any]], x: str, title: str,
                baseline: tuple[str, Sequence[Mapping[str, Any]]] | None = None, note: str = "") -> Any:
    """One run's figure against ``x`` ("flops" or "wall"): train loss, validation loss, phase starts, the
    method's integer fields on a second axis, and ``baseline`` = (its name, its metrics rows) overlaid when
    given; ``note`` goes under the title (e.g. that no baseline was found). Returns the matplotlib figure."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    series = [("train", rows, "train loss"), ("val", rows, "validation loss")]
    if baseline is not None:
        series = [("baseline train", baseline[1], f"baseline train loss ({baseline[0]})"),
                  ("baseline val", baseline[1], f"baseline validation loss ({baseline[0]})"), *series]
    for key, rs, label in series:  # the baseline first: the run's own lines are drawn over it
        kind = key.rpartition(" ")[2]
        pts = [r for r in rs if r["kind"] == kind]
        ax.plot([r[x] for r in pts], [r["loss" if kind == "train" else "val_loss"] for r in pts], **_LOSSES[key],
                label=label)
    for pos, name in _phase_starts(rows, x):
        ax.axvline(pos, color="grey", ls=":", lw=0.8)
        ax.text(pos, ax.get_ylim()[1], f" {name}", fontsize=7, va="top", color="grey")
    ax.set_xlabel(AXES[x])
    ax.set_ylabel("loss")
    ax.set_title(f"{title}\n{note}" if note else title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    extra = method_fields(rows)
    if extra:  # e.g. AutoFreeze's frozen depth, an elastic run's frozen / K / dp, on their own axis
        twin = ax.twinx()
        train = [r for r in rows if r["kind"] == "train"]
        for i, (k, st) in enumerate(zip(extra, styles(len(extra), first=2))):
            pts = [r for r in train if k in r]
            draw(twin, [r[x] for r in pts], [r[k] for r in pts], st, k, i, len(extra), where="post")
        twin.set_ylabel(", ".join(extra))
        h2, l2 = twin.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    # outside the axes, right: inside, the second axis's lines would be drawn over it
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.12 if extra else 1.01, 1.0))
    return fig  # saved with bbox_inches="tight", which takes in the legend and labels (no tight_layout pass needed)


def plot_run(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, title: str,
             baseline: tuple[str, Sequence[Mapping[str, Any]]] | None = None, note: str = "") -> list[Path]:
    """Write loss_vs_flops.png and loss_vs_wallclock.png (see ``loss_figure``).

    Returns:
        The two paths ([] without matplotlib).
    """
    plt = pyplot()
    if plt is None:
        return []
    paths = []
    for x, fname in (("flops", "loss_vs_flops.png"), ("wall", "loss_vs_wallclock.png")):
        fig = loss_figure(plt, rows, x, title, baseline, note)
        fig.savefig(Path(out_dir) / fname, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(Path(out_dir) / fname)
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
        for i, ((name, rows), st) in enumerate(zip(runs.items(), styles(len(runs)))):
            val = [r for r in rows if r["kind"] == "val"]
            draw(ax, [r[x] for r in val], [r["val_loss"] for r in val], st, name, i, len(runs))
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8, label="baseline final val loss")
        ax.set_xlabel(AXES[x])
        ax.set_ylabel("validation loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
