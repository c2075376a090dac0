"""A scaling law over shape and budget, fitted to the frontier's tuned cells, and what it predicts for a cell nobody
has run (``python -m bench.frontier.predict``).

The law is Hoffmann et al.'s (2022, "Training Compute-Optimal Large Language Models", approach 3) with a depth term:

    L(N, D, l) = E + A N^-alpha + B D^-beta + g ln(l)      N: parameters, D: tokens trained on, l: layers

fitted by least squares to the mean test loss of every tuned baseline cell (its reference seeds, at the LR seed 0
chose on validation) from ``Grid.law_from`` steps up. The depth term is there because at one N this grid's shallow
models test lower than its deep ones (without it the residuals sort by shape: the 2-layer cells 0.05-0.08 below
the law, 8x32 0.09-0.18 above, and the residual SD is 0.09; with it 0.03-0.04). A cell's prediction is the law at
its N, D and depth; the envelope's at a budget is the lowest prediction over the grid's shapes (the shape chosen in
every draw, as the grid chooses it).

Uncertainty (``Predictor``): the seeds of every cell are resampled with replacement and the law refitted
(``DRAWS`` times), and every draw adds the law's misfit (its residual SD) and the noise of the mean of the predicted
cell's seeds (the pooled seed SD over sqrt(n)); an interval is the draws' central 95%. A method is predicted by its
gap to the law at its target: its own level over the budgets it has run plus a slope in log FLOPs common to every
method, the spread about them pooled (a t draw on the pooled degrees of freedom added to each draw); a variant that
has run nowhere is predicted to tie its target trained directly, with the spread of the gaps of the methods that
have run (their between-method SD) as its interval: the null, stated before the runs. A saving whose loss the
reference never reaches under a draw's law counts as 100% there (``bound_share`` says how often).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

import numpy as np

from bench.lib import envelope

Row = dict[str, Any]
Size = tuple[int, int]
DRAWS = 400  # bootstrap refits of the law
LEVEL = 0.95
SEED = 20261201  # fixed: the same rows give the same predictions, to the digit


@dataclass(frozen=True)
class Law:
    """L(N, D, l) = E + A N^-alpha + B D^-beta + g ln(l), and its residual SD over the cells it was fitted to."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    g: float
    resid_sd: float
    cells: int

    def loss(self, size: Size, n: float, d: float) -> float:
        """The predicted mean test loss of ``size`` (``n`` parameters) trained on ``d`` tokens."""
        return self.E + self.A * n ** -self.alpha + self.B * d ** -self.beta + self.g * math.log(size[0])

    def tokens_for(self, size: Size, n: float, loss: float) -> float:
        """The tokens at which ``size`` reaches ``loss`` (inf where it never does)."""
        rest = loss - self.E - self.A * n ** -self.alpha - self.g * math.log(size[0])
        return math.inf if rest <= 0 else (self.B / rest) ** (1 / self.beta)

    def text(self) -> str:
        return (f"L(N, D, l) = {self.E:.3f} + {self.A:.3g}·N^-{self.alpha:.3f} + {self.B:.3g}·D^-{self.beta:.3f} + "
                f"{self.g:.3f}·ln(l); residual SD {self.resid_sd:.4f} over {self.cells} cells")


@dataclass(frozen=True)
class Shape:
    """What the law needs of a size: its parameters and its training FLOPs per token."""

    params: float
    flops_per_token: float


def _model(x: Any, e: float, a: float, alpha: float, b: float, beta: float, g: float) -> Any:
    n, d, layers = x
    return e + a * n ** -alpha + b * d ** -beta + g * np.log(layers)


def fit(points: Sequence[tuple[Size, float, float, float]], start: Sequence[float] | None = None) -> Law | None:
    """The law through ``points`` [(size, N, D, mean test loss)]; None with fewer than 8 points or a failed fit."""
    from scipy.optimize import curve_fit

    if len(points) < 8:
        return None
    x = (np.array([p[1] for p in points], float), np.array([p[2] for p in points], float),
         np.array([p[0][0] for p in points], float))
    y = np.array([p[3] for p in points], float)
    p0 = start or (0.8 * y.min(), 10.0, 0.3, 100.0, 0.3, 0.0)
    try:
        p, _ = curve_fit(_model, x, y, p0=p0, bounds=((0, 0, 0, 0, 0, -1), (y.min(), 1e9, 2.0, 1e10, 2.0, 1)),
                         maxfev=50000)
    except (RuntimeError, ValueError):
        return None
    resid = y - _model(x, *p)
    return Law(*map(float, p), resid_sd=math.sqrt(float((resid ** 2).sum()) / (len(y) - 6)), cells=len(points))


def _points(cells: envelope.Cells, shapes: dict[Size, Shape]) -> list[tuple[Size, float, float, float]]:
    return [(size, shapes[size].params, fmean(float(r["tokens"]) for r in runs), fmean(float(r["test_loss"])
                                                                                      for r in runs))
            for (size, _), runs in cells.items() if size in shapes]


def seed_sd(cells: envelope.Cells) -> float:
    """The pooled seed SD of the test loss over ``cells`` (cells of one seed add nothing)."""
    ss, dof = 0.0, 0
    for runs in cells.values():
        xs = [float(r["test_loss"]) for r in runs]
        if len(xs) > 1:
            m = fmean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            dof += len(xs) - 1
    return math.sqrt(ss / dof) if dof else 0.0


class Predictor:
    """The law fitted to ``cells`` and ``DRAWS`` refits on resampled seeds: predictions with intervals."""

    def __init__(self, cells: envelope.Cells, shapes: dict[Size, Shape], draws: int = DRAWS, seed: int = SEED):
        self.shapes = shapes
        # per shape, a shift of the law's value at the predicted budget: a measured cell's residual there (``anchor``)
        self.offsets: dict[Size, float] = {}
        self.law = fit(_points(cells, shapes))
        if self.law is None:
            raise ValueError(f"the law needs 8+ tuned cells of known shape to fit, got {len(cells)}")
        self.seed_sd = seed_sd(cells)
        rng = np.random.default_rng(seed)
        start = (self.law.E, self.law.A, self.law.alpha, self.law.B, self.law.beta, self.law.g)
        self.refits: list[Law] = []
        for _ in range(draws):
            drawn = {c: [runs[i] for i in rng.integers(len(runs), size=len(runs))] for c, runs in cells.items()}
            law = fit(_points(drawn, shapes), start)
            if law is not None:
                self.refits.append(law)
        self.rng = np.random.default_rng([seed, 1])

    def anchor(self, measured: dict[Size, float], flops: float) -> None:
        """Predict each of ``measured``'s shapes (their mean test loss at ``flops``, measured elsewhere: another
        schedule's cell of the same budget) as that value rather than the law's, the law's draws kept for the spread:
        the shift is that cell's residual, applied to the cell, the envelope and the FLOPs a reference needs."""
        self.offsets = {s: y - self.cell(s, flops) for s, y in measured.items() if s in self.shapes}

    def tokens(self, size: Size, flops: float) -> float:
        return flops / self.shapes[size].flops_per_token

    def cell(self, size: Size, flops: float) -> float:
        """The law's mean test loss of ``size`` trained on ``flops``."""
        return self.law.loss(size, self.shapes[size].params, self.tokens(size, flops))

    def cell_draws(self, size: Size, flops: float, seeds: int) -> np.ndarray:
        """Draws of the mean test loss of ``seeds`` runs of ``size`` at ``flops``."""
        n, d = self.shapes[size].params, self.tokens(size, flops)
        base = np.array([law.loss(size, n, d) for law in self.refits]) + self.offsets.get(size, 0.0)
        return base + self._noise(len(base), seeds)

    def envelope_draws(self, flops: float, seeds: int, sizes: list[Size] | None = None
                       ) -> tuple[np.ndarray, list[Size]]:
        """Draws of the envelope's mean test loss at ``flops`` (the lowest of ``sizes``, default every shape, in each
        draw), and the shape each draw chose."""
        sizes = sorted(self.shapes if sizes is None else sizes)
        table = np.array([[law.loss(s, self.shapes[s].params, self.tokens(s, flops)) for s in sizes]
                          for law in self.refits]) + np.array([self.offsets.get(s, 0.0) for s in sizes])
        best = table.argmin(axis=1)
        return table.min(axis=1) + self._noise(len(table), seeds), [sizes[i] for i in best]

    def _noise(self, k: int, seeds: int) -> np.ndarray:
        sd = math.sqrt(self.law.resid_sd ** 2 + self.seed_sd ** 2 / max(1, seeds))
        return self.rng.normal(0.0, sd, size=k)

    def flops_for(self, law: Law, size: Size, loss: float) -> float:
        """The FLOPs at which ``size`` reaches ``loss`` under ``law``."""
        return law.tokens_for(size, self.shapes[size].params, loss) * self.shapes[size].flops_per_token

    def saving_draws(self, loss: np.ndarray, flops: float, reference: Callable[[Law], list[Size]]) -> np.ndarray:
        """Draws of 1 - flops / (the FLOPs the reference needs for each drawn ``loss``), the reference the cheapest
        of ``reference(law)``'s shapes under each refit (1.0 where none of them ever reaches the loss)."""
        out = []
        for law, y in zip(self.refits, loss):
            need = min(self.flops_for(law, s, float(y) - self.offsets.get(s, 0.0)) for s in reference(law))
            out.append(1.0 - flops / need if math.isfinite(need) else 1.0)
        return np.array(out)


def interval(draws: np.ndarray) -> list[float]:
    """The draws' central ``LEVEL`` interval."""
    lo, hi = np.percentile(draws, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return [float(lo), float(hi)]
