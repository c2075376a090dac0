"""The rule's error and power on the whole pipeline: a synthetic grid whose truth is fitted to a grid's rows, drawn
again and again and read by the grid's own code (bench/lib/envelope.py, bench/lib/verdict.py).

The truth (``fit_truth``), from the rows:

- **Each baseline cell** (a size at a budget with reference seeds) keeps its FLOPs, the LRs its seed 0 ran, and the
  seeds run at its tuned LR. Its true test loss against log2 LR is a parabola with its vertex at the tuned LR, its
  value there the cell's reference mean (seeds 1 and up), and a curvature on each side fitted by least squares to
  seed 0's validation losses on that side within two octaves (an edge LR borrows the other side's). Each run's
  test loss is that plus the cell's seed SD (from the rows, at least ``SD_FLOOR``: a 2-seed SD can be ~0 by
  chance) times a normal draw; its validation loss the test loss plus the cell's mean validation-test offset and
  an independent ``val_sd`` (the rows' within-cell SD of validation minus test).
- **Each method cell** (a variant into its target at a budget) the same: the LRs its seed 0 ran, its seeds at the
  LR it chose, its seed SD, its curvature (one LR: nothing to choose). Its true loss at its best LR is placed by
  the experiment (``place``): on the true reference at a true FLOPs saving s, the reference's true loss at the
  method's FLOPs / (1 - s) (read log-log along the true curve, along its end segment past it).
- **The true references**: the lower convex hull in (log FLOPs, log loss) of every cell's true loss (the envelope),
  and the target's cells (the same size).

Each draw (``draw_rows``) runs the grid as it runs: seed 0 at every LR a cell ran, the LR chosen on its validation
loss, the other seeds at the LR chosen; then the rows go through ``verdict.tests_of`` (reference cells without seed
0, the hull chosen on validation, each method at its own chosen LR, every test, the regrets) and ``verdict.verdicts``
under each rule (Holm over the eligible cells). What it does not redraw: a sweep the grid would have extended at an
edge, and a seed count that a verdict would have changed; each cell runs the LRs and seeds it has in the rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from statistics import fmean as mean
from typing import Any

from bench.lib import envelope, verdict

Row = dict[str, Any]
SD_FLOOR = 0.002  # the smallest seed SD a 5-seed cell of the layer grid measures (8x64 at 9,934 steps: 0.0023)
REACH = 2.0  # octaves of an LR sweep a side's curvature is fitted on


@dataclass(frozen=True)
class Arm:
    """The truth of one cell: a baseline size at a budget (``method`` "baseline") or a method's variant into its
    target there. ``lrs``: the LRs its seed 0 runs; ``best``: the true best of them (the vertex); ``bend``: the true
    loss's rise per octave squared below and above it; ``loss``: the true test loss at ``best``; ``sd``: the seed
    SD; ``seeds``: the seeds run at the LR chosen besides seed 0; ``offset``: validation minus test, on average."""

    method: str
    variant: str
    size: tuple[int, int]
    budget: int
    flops: float
    lrs: tuple[float, ...]
    best: float
    bend: tuple[float, float]
    loss: float
    sd: float
    seeds: tuple[int, ...]
    offset: float

    def true_loss(self, lr: float) -> float:
        """The true test loss at ``lr``: the parabola in log2 LR around ``best``, each side its own curvature."""
        x = math.log2(lr / self.best)
        return self.loss + self.bend[x > 0] * x * x


@dataclass(frozen=True)
class Truth:
    """A synthetic grid: its baseline cells and method cells (``Arm``), the target size, the baseline sizes and
    budgets (as the grid names them) and the validation noise beside the seeds'."""

    baselines: tuple[Arm, ...]
    methods: tuple[Arm, ...]
    target: tuple[int, int]
    sizes: tuple[tuple[int, int], ...]
    budgets: tuple[int, ...]
    val_sd: float


# ---------------------------------------------------------------------------------------------- the truth


def _sd(values: Sequence[float]) -> float:
    """The seed SD of ``values``, at least ``SD_FLOOR`` (one value: the floor)."""
    return max(SD_FLOOR, math.sqrt(verdict.variance(values)) if len(values) > 1 else 0.0)


def _bends(sweep: Sequence[Row], best: float) -> tuple[float, float]:
    """The curvature (per octave squared) of seed 0's validation loss on each side of ``best``: least squares of
    (loss - the loss at best) on (log2 LR - log2 best)^2 over the LRs within ``REACH`` octaves; a side with no LR
    tried takes the other's; no other LR at all: flat (nothing is chosen)."""
    at = {float(r["lr"]): float(r["val_loss"]) for r in sweep}
    v0 = at.get(best, min(at.values()))
    out = []
    for side in (-1, 1):
        pts = [(math.log2(lr / best) ** 2, v - v0) for lr, v in at.items()
               if side * math.log2(lr / best) > 0 and abs(math.log2(lr / best)) <= REACH + 1e-9]
        out.append(sum(u * d for u, d in pts) / sum(u * u for u, _ in pts) if pts else None)
    lo, hi = out
    lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
    return max(lo or 0.0, 0.0), max(hi or 0.0, 0.0)


def _val_sd(rows: Sequence[Row], groups: Iterable[Sequence[Row]]) -> float:
    """The pooled within-cell SD of validation minus test loss over the runs of ``groups``."""
    ss, df = 0.0, 0
    for runs in groups:
        d = [float(r["val_loss"]) - float(r["test_loss"]) for r in runs]
        if len(d) > 1:
            ss += verdict.variance(d) * (len(d) - 1)
            df += len(d) - 1
    return math.sqrt(ss / df) if df else 0.0


def fit_truth(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int],
              target: tuple[int, int]) -> Truth:
    """The synthetic grid fitted to ``rows`` (a grid's frontier rows): every baseline cell with reference seeds and
    every method cell, as the module's docstring says."""
    cells = envelope.reference_cells(rows, sizes, budgets)
    base = []
    for (size, budget), runs in cells.items():
        sweep = [r for r in envelope.baseline_rows(rows, size, budget) if int(r["seed"]) == envelope.CHOOSER_SEED]
        best = envelope.tuned_lr(rows, size, budget)
        base.append(Arm("baseline", "tuned", size, budget, mean(float(r["flops"]) for r in runs),
                        tuple(sorted(float(r["lr"]) for r in sweep)), best, _bends(sweep, best),
                        mean(float(r["test_loss"]) for r in runs), _sd([float(r["test_loss"]) for r in runs]),
                        tuple(sorted(int(r["seed"]) for r in runs)),
                        mean(float(r["val_loss"]) - float(r["test_loss"]) for r in runs)))
    groups: dict[tuple, list[Row]] = {}
    for r in envelope.method_rows(rows):
        groups.setdefault((r["method"], r["variant"], envelope.size_of(r), int(r["budget"])), []).append(r)
    arms = []
    for (method, variant, size, budget), runs in sorted(groups.items()):
        best = float(runs[0]["lr"])
        sweep = [r for r in rows if r["variant"] == variant and r["method"] == method and envelope.size_of(r) == size
                 and int(r["budget"]) == budget and int(r["seed"]) == envelope.CHOOSER_SEED]
        at_best = [r for r in rows if r["variant"] == variant and r["method"] == method
                   and envelope.size_of(r) == size and int(r["budget"]) == budget and float(r["lr"]) == best]
        arms.append(Arm(method, variant, size, budget, mean(float(r["flops"]) for r in runs),
                        tuple(sorted(float(r["lr"]) for r in sweep)), best, _bends(sweep, best),
                        mean(float(r["test_loss"]) for r in runs), _sd([float(r["test_loss"]) for r in runs]),
                        tuple(sorted(int(r["seed"]) for r in at_best if int(r["seed"]) != envelope.CHOOSER_SEED)),
                        mean(float(r["val_loss"]) - float(r["test_loss"]) for r in runs)))
    return Truth(tuple(base), tuple(arms), tuple(target), tuple(sizes), tuple(budgets),
                 _val_sd(rows, [*cells.values(), *groups.values()]))


# ---------------------------------------------------------------------------------------------- the true references


def _loglog(points: Sequence[tuple[float, float]], cost: float) -> float:
    """The loss at ``cost`` on the curve through (cost, loss) ``points`` (sorted by cost), log-log, along the end
    segments past its ends."""
    if len(points) == 1:
        return points[0][1]
    i = next((k for k in range(len(points) - 1) if cost <= points[k + 1][0]), len(points) - 2)
    (c0, l0), (c1, l1) = points[i], points[i + 1]
    w = math.log(cost / c0) / math.log(c1 / c0)
    return math.exp((1 - w) * math.log(l0) + w * math.log(l1))


def true_curve(truth: Truth, reference: str, size: tuple[int, int] | None = None) -> list[tuple[float, float]]:
    """(cost, true loss) of a true reference, by cost: "envelope", the lower convex hull (log-log) of every baseline
    cell's true loss (envelope.hull, on the true losses); "same_size", the cells of ``size`` (the target)."""
    if reference == "envelope":
        pts = [(a.size, a.budget, a.flops, a.loss, a.loss) for a in truth.baselines]
        return [(p[2], p[4]) for p in envelope.hull(pts)]
    size = size or truth.target
    return sorted((a.flops, a.loss) for a in truth.baselines if a.size == size)


def place(truth: Truth, reference: str, saving: float | dict[tuple[str, int], float] = 0.0) -> Truth:
    """``truth`` with every method cell's true loss at its best LR placed at a true FLOPs ``saving`` against the true
    ``reference`` (a fraction, or {(variant, budget): fraction}; a cell not named saves 0): the loss the reference
    reaches at the method's FLOPs / (1 - saving)."""
    curve = true_curve(truth, reference)
    out = []
    for a in truth.methods:
        s = saving.get((a.variant, a.budget), 0.0) if isinstance(saving, dict) else saving
        out.append(replace(a, loss=_loglog(curve, a.flops / (1 - s))))
    return replace(truth, methods=tuple(out))


def known_lr(truth: Truth) -> Truth:
    """``truth`` with every arm running its best LR alone (nothing to choose, no regret): what the hull's test's
    error would be if the LRs were known."""
    return replace(truth, baselines=tuple(replace(a, lrs=(a.best,)) for a in truth.baselines),
                   methods=tuple(replace(a, lrs=(a.best,)) for a in truth.methods))


# ---------------------------------------------------------------------------------------------- the draws


def _runs(arm: Arm, rng: Any, val_sd: float) -> list[Row]:
    """One draw of an arm's runs: seed 0 at each of its LRs, the LR chosen on their validation loss, its other seeds
    at that LR (rows as the frontier writes them, the fields the rule reads)."""
    def run(lr: float, seed: int) -> Row:
        test = arm.true_loss(lr) + arm.sd * rng.standard_normal()
        return {"method": arm.method, "variant": arm.variant, "layers": arm.size[0], "width": arm.size[1], "lr": lr,
                "budget": arm.budget, "budget_flops": arm.flops, "seed": seed, "flops": arm.flops,
                "wall_s": arm.flops / 1e9, "test_loss": test, "tokens_per_param": 1.0, "tokens": 1,
                "val_loss": test + arm.offset + val_sd * rng.standard_normal()}

    sweep = [run(lr, envelope.CHOOSER_SEED) for lr in arm.lrs]
    chosen = float(min(sweep, key=lambda r: r["val_loss"])["lr"])
    return sweep + [run(chosen, s) for s in arm.seeds]


def draw_rows(truth: Truth, rng: Any) -> list[Row]:
    """One draw of the whole grid's rows (``_runs`` of every cell, baselines first)."""
    return [r for arm in (*truth.baselines, *truth.methods) for r in _runs(arm, rng, truth.val_sd)]


def skeleton(truth: Truth) -> list[Row]:
    """The savings rows ``verdict.tests_of`` fills: every method cell against each reference."""
    return [{"method": a.method, "variant": a.variant, "target": f"{a.size[0]}x{a.size[1]}", "budget": a.budget,
             "reference": ref} for a in truth.methods for ref in verdict.REFERENCES]


@dataclass
class Tally:
    """What the draws found, by rule and reference: for each (rule, reference, direction), the tests that rejected
    before Holm, the eligible tests, the draws with any verdict in that direction, the draws; and each cell's
    verdicts in that direction (for its power)."""

    draws: int = 0
    tests: dict | None = None
    rejected: dict | None = None
    family: dict | None = None
    cells: dict | None = None

    def __post_init__(self) -> None:
        self.tests, self.rejected, self.family, self.cells = {}, {}, {}, {}

    def add(self, save: Sequence[Row], tested: dict, rule: str) -> None:
        """Count one draw's tests and verdicts under ``rule`` (``verdict.verdicts``)."""
        judged = verdict.verdicts(save, tested, rule)
        for reference in verdict.REFERENCES:
            fam = [i for i in judged if save[i]["reference"] == reference]
            for k, direction in enumerate((verdict.SAVES, verdict.LOSES)):
                key = (rule, reference, direction)
                ps = [_p(tested[i], rule, reference, k) for i in fam]
                self.tests[key] = self.tests.get(key, 0) + len(ps)
                self.rejected[key] = self.rejected.get(key, 0) + sum(p <= verdict.ALPHA for p in ps)
                hit = [i for i in fam if judged[i][2] == direction]
                self.family[key] = self.family.get(key, 0) + bool(hit)
                for i in fam:
                    cell = (*key, save[i]["variant"], int(save[i]["budget"]))
                    n, k_hit = self.cells.get(cell, (0, 0))
                    self.cells[cell] = (n + 1, k_hit + (i in hit))

    def per_test(self, rule: str, reference: str, direction: str) -> float:
        """The share of eligible tests that reject before Holm (the first test of the rule: the hull's)."""
        key = (rule, reference, direction)
        return self.rejected.get(key, 0) / max(self.tests.get(key, 0), 1)

    def familywise(self, rule: str, reference: str, direction: str) -> float:
        """The share of draws with any verdict in ``direction`` against ``reference`` (after Holm)."""
        return self.family.get((rule, reference, direction), 0) / max(self.draws, 1)

    def power(self, rule: str, reference: str, variant: str, budget: int) -> float:
        """The share of draws in which the cell's verdict is a saving."""
        n, k = self.cells.get((rule, reference, verdict.SAVES, variant, budget), (0, 0))
        return k / max(n, 1)


def _p(t: verdict.Tested, rule: str, reference: str, k: int) -> float:
    """The p-value (k 0: of a saving, 1: of a loss) of the test that leads ``rule``'s verdict: the hull's (the same
    size's), with the regret inside it under the amended rule; under ``BEFORE``, against the envelope, the larger
    of the hull's and the law's (a verdict needs both)."""
    p = verdict._ps(t, rule)[k]
    if rule == verdict.BEFORE and reference == "envelope":
        law = t.law.p(verdict.SAVES if k == 0 else verdict.LOSES) if t.law is not None else 1.0
        return max(p, law)
    return p


def simulate(truth: Truth, draws: int, seed: int = 0, rules: Sequence[str] = tuple(verdict.RULES)) -> Tally:
    """``draws`` draws of ``truth`` (``draw_rows``, RNG seeded with ``seed``), each read by the rule's code and
    tallied under each of ``rules``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tally, save = Tally(), skeleton(truth)
    for _ in range(draws):
        rows = draw_rows(truth, rng)
        tested, _ = verdict.tests_of(rows, truth.sizes, truth.budgets, save, with_law=verdict.BEFORE in rules)
        for rule in rules:
            tally.add(save, tested, rule)
        tally.draws += 1
    return tally
