"""Plots a reader can read: every line its own look, lines on top of each other both visible, and a run's
loss curves against its comparable baseline (or a note that there is none)."""

import json
import weakref

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from progressive.config import dump_yaml, replace
from progressive.config.schema import TrainConfig
from progressive.run.plots import draw, loss_figure, pyplot, styles
from progressive.run.summary import NO_BASELINE, find_baseline
from tests.train_utils import tiny_cfg

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
    from bench.claims import autofreeze

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


def test_loss_plot_overlays_the_baseline_or_says_there_is_none():
    run, base = _rows(loss=lambda s: 4.0 - s / 150), _rows()
    fig = loss_figure(plt, run, "flops", "default (vcycle)", ("baseline", base), "against the baseline run baseline/")
    labels = fig.axes[0].get_legend().get_texts()
    assert [t.get_text() for t in labels] == ["baseline train loss (baseline)", "baseline validation loss (baseline)",
                                              "train loss", "validation loss", "frozen"]
    drawn = {line.get_label(): line.get_ydata() for line in fig.axes[0].get_lines()}
    assert list(drawn["baseline validation loss (baseline)"]) == [r["val_loss"] for r in base if r["kind"] == "val"]
    plt.close(fig)
    fig = loss_figure(plt, run, "flops", "default (vcycle)", None, NO_BASELINE)
    assert NO_BASELINE in fig.axes[0].get_title()
    assert not any("baseline" in line.get_label() for line in fig.axes[0].get_lines())
    plt.close(fig)


def _finished(cfg, final_loss=3.0):
    """A run folder as a finished run leaves it (config.yaml, metrics.jsonl, summary.json), without training."""
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(dump_yaml(cfg))
    (cfg.run_dir / "metrics.jsonl").write_text(json.dumps(_rows()[-1]) + "\n")
    (cfg.run_dir / "summary.json").write_text(json.dumps({"final_val_loss": final_loss}))
    return cfg.run_dir


def test_the_baseline_is_a_finished_sibling_run_whose_config_differs_only_in_method(tmp_path):
    run = tiny_cfg(tmp_path, name="run")
    assert find_baseline(run) is None  # nothing beside it yet
    other_seed = replace(run, name="a_seed1", method=replace(run.method, name="baseline"),
                         train=replace(run.train, seed=1))
    _finished(other_seed)
    unfinished = replace(run, name="b_unfinished", method=replace(run.method, name="baseline"))
    _finished(unfinished).joinpath("summary.json").unlink()
    vcycle_twin = replace(run, name="c_vcycle")
    _finished(vcycle_twin)
    assert find_baseline(run) is None  # another seed, unfinished, not a baseline: none comparable
    watched = replace(run, name="d_base", method=replace(run.method, name="baseline"),
                      train=replace(run.train, eval_every=2, progress=True, plots=True, report_to="tensorboard"))
    assert find_baseline(run) is None and _finished(watched) == tmp_path / "d_base"
    assert find_baseline(run) == tmp_path / "d_base"  # how it was watched does not matter
    assert find_baseline(watched) is None  # a baseline is drawn against no other


def test_the_baseline_at_its_own_lr_is_the_runs_baseline_and_comes_first(tmp_path):
    """The main job trains its baseline at train.baseline_lr, not at the V-cycle's train.lr: that baseline is the
    V-cycle's (its plots overlay it); one trained alone from the same recipe (at train.lr) is too, after it; a
    baseline at any other LR is not."""
    run = tiny_cfg(tmp_path, name="run", train__lr=2e-3, train__baseline_lr=1e-3)

    def baseline(name, lr):
        return replace(run, name=name, method=replace(run.method, name="baseline"), train=replace(run.train, lr=lr))

    _finished(baseline("a_other_lr", 5e-3))
    assert find_baseline(run) is None
    _finished(baseline("b_alone", 2e-3))
    assert find_baseline(run) == tmp_path / "b_alone"
    _finished(baseline("c_own_lr", 1e-3))
    assert find_baseline(run) == tmp_path / "c_own_lr"  # the tuned one first, whatever the folders' order
    assert find_baseline(replace(run, train=replace(run.train, baseline_lr=None))) == tmp_path / "b_alone"


@pytest.mark.parametrize("order", [("baseline", "vcycle"), ("vcycle", "baseline")])
def test_compare_draws_each_methods_loss_plots_against_the_baseline(tmp_path, order):
    from progressive.report.compare import compare

    # as the main job does: the baseline at its own LR (train.baseline_lr), the V-cycle at train.lr
    cfg = tiny_cfg(tmp_path, train__steps=4, train__eval_every=2, name="cmp", train__plots=True,
                   train__baseline_lr=1e-3)
    compare(cfg, list(order))
    summary = json.loads((cfg.run_dir / "vcycle" / "summary.json").read_text())
    assert summary["plot_baseline"] == str(cfg.run_dir / "baseline")  # also when the baseline ran second
    assert json.loads((cfg.run_dir / "baseline" / "summary.json").read_text())["plot_baseline"] is None


def test_with_plots_off_a_comparison_draws_no_figure_and_says_none(tmp_path, capsys):
    """train.plots false (a sweep's runs): no loss plots in any run, no compare.png, none listed or printed."""
    from progressive.report.compare import compare

    cfg = tiny_cfg(tmp_path, train__steps=4, train__eval_every=2, name="cmp")
    assert cfg.train.plots is False and TrainConfig().plots  # tiny_cfg's default; the library's is True
    compare(cfg, ["baseline", "vcycle"])
    assert not list(tmp_path.rglob("*.png"))
    for method in ("baseline", "vcycle"):
        summary = json.loads((cfg.run_dir / method / "summary.json").read_text())
        assert summary["plots"] == [] and summary["plot_baseline"] is None
    out = capsys.readouterr().out
    assert "compare.md;" in out and "compare.png" not in out and "loss plots" not in out


def test_compare_lets_a_finished_methods_model_go_before_the_next_one_trains(tmp_path, monkeypatch):
    """Every method's trainer is built first (all configs checked before any training); each one that has
    finished is dropped and collected, so the next method trains without the previous model in memory."""

    from progressive.report.compare import compare
    from progressive.run.trainer import Trainer

    models, alive_at_start = [], []
    real = Trainer.run

    def run(self):
        alive_at_start.append([m() is not None for m in models])
        out = real(self)
        models.append(weakref.ref(self.raw))
        return out

    monkeypatch.setattr(Trainer, "run", run)
    compare(tiny_cfg(tmp_path, train__steps=4, train__eval_every=2, name="cmp"), ["baseline", "vcycle"])
    assert alive_at_start == [[], [False]]  # the baseline's model was gone when the V-cycle started
