"""Plots a reader can read: every line its own look, lines on top of each other both visible."""

import sys

import numpy as np
from matplotlib.colors import to_rgb

from progressive.run.plots import draw, loss_figure, pyplot, styles
from tests.train_utils import ROOT

plt = pyplot()


def _pixels(image: np.ndarray, colour: str, tol: float = 0.06) -> int:
    """Pixels of ``image`` (RGB(A) floats in [0, 1]) within ``tol`` of ``colour`` in every channel."""
    return int((np.abs(image[..., :3] - np.array(to_rgb(colour))) < tol).all(-1).sum())


def _rows(frozen=lambda s: 0, k=None, loss=lambda s: 5.0 - s / 100, steps=600, every=100):
    """Synthetic metrics rows: a train row per step (with method fields), a val row every ``every`` steps."""
    out = []
    for s in range(1, steps + 1):
        extra = {"frozen": frozen(s)} | ({"k": k(s), "dp": 4 // k(s)} if k else {})
        out.append({"kind": "train", "step": s, "phase": 0, "phase_name": "train", "tokens": 10 * s,
                    "flops": 1e9 * s, "wall": 0.1 * s, "loss": loss(s), "lr": 1e-3, **extra})
        if s % every == 0:
            out.append({"kind": "val", "step": s, "phase": 0, "phase_name": "train", "tokens": 10 * s,
                        "flops": 1e9 * s, "wall": 0.1 * s, "val_loss": loss(s), "val_accuracy": 0.5 + s / 2000})
    return out


def test_thirty_lines_differ_in_colour_linestyle_and_marker_together():
    looks = [(s["color"], str(s["ls"]), s["marker"]) for s in styles(30)]
    assert len(set(looks)) == 30
    assert all(len({look[j] for look in looks[:6]}) == 6 for j in range(3))  # the first six in each alone
    widths = [s["lw"] for s in styles(3)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0]  # drawn first: widest


def _columns(image: np.ndarray, colours: list[str]) -> list[int]:
    """Per colour: the pixel columns of ``image`` where some pixel is nearer that colour than white, black
    or the other colours (anti-aliased mixes count for the nearer one): how much of a line's length shows."""
    palette = np.array([to_rgb(c) for c in ["white", "black", *colours]])
    nearest = ((image[..., None, :3] - palette) ** 2).sum(-1).argmin(-1)
    return [int((nearest == 2 + i).any(0).sum()) for i in range(len(colours))]


def test_three_identical_lines_all_stay_visible_along_their_length():
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = np.arange(600)
    ys = np.minimum(xs // 100, 5)
    for i, st in enumerate(styles(3)):
        draw(ax, xs, ys, st, f"line {i}", i, 3, where="post")
    ax.set_axis_off()  # no legend, no frame: only the lines are counted
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba(), dtype=float) / 255
    plt.close(fig)
    span = int((image[..., :3].min(-1) < 0.9).any(0).sum())  # columns the lines cover together
    shown = _columns(image, [st["color"] for st in styles(3)])
    # measured: 78%, 68%, 47% of the span; the same lines solid and equally wide: 20%, 20%, 100%; with
    # their dashes but equally wide: 34%, 43%, 57%
    assert min(shown) > 0.4 * span, (shown, span)


def test_autofreeze_bench_plot_shows_autofreeze_with_and_without_its_cache(tmp_path):
    """The cache changes the cost only, so both AutoFreeze variants draw the same curves; the one drawn
    first (orange) must still show (docs/autofreeze.png hid it under the green one)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import autofreeze

    frozen = lambda s: min(s // 100 * 2, 6)  # noqa: E731
    curves = {"bert plain": _rows(), "bert autofreeze": _rows(frozen), "bert autofreeze+cache": _rows(frozen)}
    autofreeze._plot(curves, tmp_path / "af.png")
    image = plt.imread(tmp_path / "af.png")
    seen = {c: _pixels(image, c) for c in ("tab:blue", "tab:orange", "tab:green")}
    assert min(seen.values()) > 300, seen  # the legend alone holds ~50 of each


def test_an_elastic_runs_frozen_k_and_dp_are_told_apart():
    """An elastic run logs frozen, K and dp (K 4 -> 2 -> 1, dp 1 -> 2 -> 4: equal at 2): one look each."""
    rows = _rows(frozen=lambda s: min(s // 200, 2), k=lambda s: 4 >> min(s // 200, 2))
    fig = loss_figure(plt, rows, "flops", "elastic")
    twin = fig.axes[1]
    looks = {line.get_label(): (line.get_color(), str(line.get_linestyle()), line.get_marker())
             for line in twin.get_lines()}
    plt.close(fig)
    assert sorted(looks) == ["dp", "frozen", "k"] and len(set(looks.values())) == 3
    assert all(len({look[j] for look in looks.values()}) == 3 for j in range(3))
