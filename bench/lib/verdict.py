"""The rule that decides a saving, with a known error rate and a known power, and the fitted envelope beside the hull.

``python -m bench.frontier.false_positives`` measures the rule's false-positive rate by simulation: on stylised null
data (three reference cells, the hull chosen on validation and read log-log), and with ``--pipeline`` on the whole
pipeline (bench/lib/simulate.py: a synthetic grid fitted to a grid's rows, every LR chosen on seed 0 as the grid
chooses it, the hull chosen on validation, every test, Holm), also for the power; the test suite checks both at
fewer draws. The rule (amended at the layer grid's 401 runs, before any later run reports; docs/frontier.md):

- **The test** (``gap_test``): the method's test loss minus the reference's at the method's FLOPs (the loss gap at
  equal FLOPs, ``envelope.loss_gap``), with a Welch t interval. The reference's value there is read between the
  one or two reference cells that bracket the method's FLOPs (log-log), so its variance is those cells' seed
  variances weighted by the interpolation (delta method), and the degrees of freedom are Welch-Satterthwaite's
  over the method's seeds and those cells'.
- **The LR choice's regret is inside the test** (``lr_regret``, ``sided``). Seed 0 chooses each cell's LR on one run
  per LR, so the LR chosen is sometimes not the best, and the cell's value (its other seeds, at that LR) lies
  above the best LR's by the regret: a reference too high makes a method look better than it is. Each arm's
  regret is estimated from its own sweep (its mean and variance under the plug-in truth the sweep gives); the
  test of a saving lowers the reference by the reference's regret and adds its variance, the test of a loss
  lowers the method by the method's (an arm that ran one LR chose nothing: no regret). Without it the hull's test
  calls a saving in ~5% of the whole pipeline's null experiments, not 2.5%.
- One-sided at ``ALPHA`` (2.5%) in each direction: below 0, the method reaches a lower loss on the same compute, so
  the reference needs more FLOPs for the method's loss (a saving); above 0, the reverse. The interval runs from the
  loss test's lower end to the saving test's upper end, propagated to the FLOPs saving by reading the reference
  curve at the reference's loss plus each end.
- **Eligible** cells have 2+ seeds in the method's arm and in every reference cell the gap is read on (with one seed
  there is no variance); the others get no verdict.
- **Holm** over a grid's eligible cells of one reference (the envelope; the same-size baseline), each direction
  apart: "k of n eligible cells" is how many Holm rejects at family-wise 2.5%.
- **The verdict is the hull's test** (the same size's, against the target trained directly): "saves", "loses" or
  "no evidence either way". **The fitted law is a sensitivity check, shown, deciding nothing** (``fit_law``): L(C) =
  E + A (C / C0)^-a by least squares on the best tuned cell of each budget, with the fit's own error (parameter
  covariance from the residuals, n - 3 degrees of freedom), and the same Welch test against it. On the layer grid
  it misfits (residual SD 0.032, 4-7 times the seeds', on 3 degrees of freedom), so a verdict that needed it too
  (the rule until 401 runs, ``BEFORE``) could see only savings of about half the FLOPs.
- **Beside every verdict, the smallest saving the cell could detect** (``detectable_gap``): the true loss gap, and
  the FLOPs saving it means on the reference curve, that the saving's test finds with 80% probability at Holm's
  first threshold, from the cell's own seeds and SDs (the noncentral t of its Welch test).

The percentile bootstrap (envelope.interval) stays on the pages as a description of the spread, labelled so; it
decides nothing: with 3 method seeds against 2 reference seeds it lies above 0 in far more than 2.5% of null
experiments (``null_rate``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from statistics import fmean as mean
from typing import Any

from bench.lib import envelope
from bench.lib.rows import SAVINGS_COLUMNS

Row = dict[str, Any]


def variance(xs: Sequence[float]) -> float:
    """The sample variance (n - 1) of ``xs`` (floats; statistics.variance's exact arithmetic is slow)."""
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


ALPHA = 0.025  # one-sided, each direction
POWER = 0.8  # the power the smallest detectable saving is quoted at
SAVES, LOSES, NONE, INELIGIBLE = "saves", "loses", "no evidence either way", "not eligible"
REFERENCES = ("envelope", "same_size")
AMENDED, BEFORE, HULL_ONLY = "amended", "before", "hull"  # the rule; the rule until 401 runs; the hull's test alone
RULES = {AMENDED: "the hull's test with the LR regret inside it, the law shown only (the rule)",
         BEFORE: "the hull's and the law's tests agreeing, no regret (the rule until 401 runs)",
         HULL_ONLY: "the hull's test alone, no regret"}


# ---------------------------------------------------------------------------------------------- the test


@dataclass(frozen=True)
class Ref:
    """One cell of a reference curve: its mean cost and test loss over its seeds, those seeds' test losses, the cell
    read at each other LR its seed 0 ran (the LRs its choice was made among: ``others``, (mean test loss, runs) of
    the runs there), and how many runs its loss is the mean of (None: its seeds; fewer where it is read at one of
    ``others``)."""

    cost: float
    loss: float
    seeds: tuple[float, ...]
    others: tuple[tuple[float, int], ...] = ()
    runs: int | None = None

    def var(self) -> float:
        """The variance of the cell's loss: its seeds' variance over the runs the loss is the mean of."""
        return variance(self.seeds) / (self.runs or len(self.seeds))


def _arms(rows: Iterable[Row]) -> dict[tuple[str, tuple[int, int], int], list[Row]]:
    """{(variant, size, budget): its rows}, a baseline's variant "tuned": each arm's runs at every LR."""
    out: dict[tuple[str, tuple[int, int], int], list[Row]] = {}
    for r in rows:
        out.setdefault((r["variant"], envelope.size_of(r), int(r["budget"])), []).append(r)
    return out


def _others(arm: Sequence[Row], chosen: float) -> tuple[tuple[float, int], ...]:
    """(mean test loss, runs) of an arm's runs (``arm``: its rows) at each LR its seed 0 ran but ``chosen``, by LR:
    seed 0's run there, and any other seed's (a cell whose LR moved keeps the seeds it ran before)."""
    lrs = sorted({float(r["lr"]) for r in arm if int(r["seed"]) == envelope.CHOOSER_SEED} - {chosen})
    at = [[float(r["test_loss"]) for r in arm if float(r["lr"]) == lr] for lr in lrs]
    return tuple((mean(x), len(x)) for x in at)


def refs_of(cells: envelope.Cells, on: Sequence[tuple[tuple[int, int], int]], axis: str = "flops",
            rows: Sequence[Row] = (), arms: dict | None = None) -> list[Ref]:
    """The reference curve through cells ``on`` (keys of ``cells``), by cost; with ``rows`` (the grid's; or their
    ``_arms`` given as ``arms``), each cell carries the other LRs its seed 0 ran (``Ref.others``)."""
    arms = _arms(r for r in rows if r["method"] == "baseline") if arms is None else arms
    out = [Ref(*envelope.point(cells[c], axis)[::-1], tuple(float(r["test_loss"]) for r in cells[c]),
               _others(arms[("tuned", *c)], float(cells[c][0]["lr"])) if ("tuned", *c) in arms else ())
           for c in on]
    return sorted(out, key=lambda r: r.cost)


def weights(refs: Sequence[Ref], cost: float, slack: float = 0.025) -> list[tuple[float, Ref]] | None:
    """[(d L_ref / d loss of the cell, cell)] of the reference's log-log interpolation at ``cost`` (as
    envelope.loss_at reads it: within ``slack`` of an end, that end; further out None)."""
    lo, hi = refs[0].cost, refs[-1].cost
    if not lo * (1 - slack) <= cost <= hi * (1 + slack):
        return None
    cost = min(max(cost, lo), hi)
    for a, b in zip(refs, refs[1:]):
        if a.cost <= cost <= b.cost:
            w = 0.0 if b.cost == a.cost else math.log(cost / a.cost) / math.log(b.cost / a.cost)
            at = math.exp((1 - w) * math.log(a.loss) + w * math.log(b.loss))
            return [(d, r) for d, r in (((1 - w) * at / a.loss, a), (w * at / b.loss, b)) if d > 1e-12]
    return [(1.0, refs[0])]


def _curve(refs: Sequence[Ref]) -> envelope.Curve:
    return [(r.loss, r.cost) for r in refs]


@dataclass(frozen=True)
class Test:
    """A method's loss gap against a reference at equal cost: mean, standard error, Welch df, the fewest seeds of the
    reference cells it is read on, and the method's seeds."""

    gap: float
    se: float
    df: float
    ref_seeds: int
    seeds: int

    @property
    def eligible(self) -> bool:
        return self.seeds >= 2 and self.ref_seeds >= 2

    def p(self, direction: str = SAVES) -> float:
        """One-sided p-value: that the gap is below 0 (``SAVES``) or above it (``LOSES``)."""
        from scipy.special import stdtr

        if self.se == 0:
            return 0.0 if (self.gap < 0) == (direction == SAVES) and self.gap != 0 else 1.0
        z = self.gap / self.se
        return float(stdtr(self.df, z if direction == SAVES else -z))

    def interval(self, level: float = 1 - 2 * ALPHA) -> tuple[float, float]:
        """The two-sided t interval of the gap (each end a one-sided ``ALPHA`` bound)."""
        from scipy.special import stdtrit

        h = 0.0 if self.se == 0 else float(stdtrit(self.df, 0.5 + level / 2)) * self.se
        return self.gap - h, self.gap + h


def welch(gaps: Sequence[float], ref: Sequence[tuple[float, float]], ref_seeds: int,
          own: tuple[float, float] | None = None) -> Test:
    """A Test of the mean of ``gaps`` (one per method seed, their own variance; ``own``: (the variance of their
    mean, its df) given instead, for a mean of fewer runs than the seeds it was measured on) against a reference
    value whose variance is the sum of the pieces ``ref`` [(variance, degrees of freedom)], one per independent
    estimate it is made of; the degrees of freedom are Welch-Satterthwaite's over the method's and every piece."""
    n = len(gaps)
    pieces = [own or (variance(gaps) / n if n > 1 else 0.0, n - 1), *ref]
    se2 = sum(v for v, _ in pieces)
    denom = sum(v * v / k for v, k in pieces if k > 0 and v > 0)
    df = se2 * se2 / denom if denom > 0 else math.inf
    return Test(mean(gaps), math.sqrt(se2), df, ref_seeds, n)


def _ref_pieces(w: Sequence[tuple[float, Ref]]) -> list[tuple[float, float]]:
    """The reference's variance pieces at a point read with weights ``w``: each cell's d_j^2 times its variance."""
    return [(d * d * c.var(), len(c.seeds) - 1) for d, c in w if len(c.seeds) > 1]


def gap_test(runs: Sequence[Row], refs: Sequence[Ref], axis: str = "flops", pooled: bool = False,
             own: tuple[float, float] | None = None) -> Test | None:
    """The Welch test of ``runs``' loss gap at equal ``axis`` against the reference curve ``refs`` (None: the runs'
    cost is outside the reference's). The reference's value there is read between one or two cells with weights
    d_j (the interpolation's derivative), so its variance is the sum over those cells of d_j^2 s_j^2 / n_j, each
    cell's own seed variance s_j^2 on its n_j - 1 degrees of freedom (a cell of weight ~0 adds ~nothing; a cell
    read at another of its LRs, one run: n_j 1). ``own``: the method's piece, as ``welch`` takes it.

    ``pooled``: the rule as first fixed, kept to measure what it did: one seed variance pooled over the cells by
    their degrees of freedom, whatever their weight. Where the cells' variances differ, a neighbour of weight ~0
    then sets the variance: its false-positive rate ran from 0.2% to 9.7% (docs/frontier.md)."""
    cost = mean(float(r[axis]) for r in runs)
    w = weights(refs, cost)
    if w is None:
        return None
    front = _curve(refs)
    gaps = [float(r["test_loss"]) - envelope.loss_at(front, float(r[axis]), slack=1.0) for r in runs]
    fewest = min(len(c.seeds) for _, c in w)
    if pooled:
        varied = [(d, c) for d, c in w if len(c.seeds) > 1]
        df = sum(len(c.seeds) - 1 for _, c in w)
        var = sum((len(c.seeds) - 1) * variance(c.seeds) for _, c in varied) / df if df > 0 else 0.0
        return welch(gaps, [(var * sum(d * d / len(c.seeds) for d, c in w), df)], fewest, own)
    return welch(gaps, _ref_pieces(w), fewest, own)


def saving_tests(runs: Sequence[Row], refs: Sequence[Ref]) -> list[Test]:
    """The test of a saving with the LR choice inside it: ``gap_test`` against the reference as its cells' seed 0
    chose their LRs, and against it read at every other combination of the LRs the bracketing cells' seed 0 ran
    (each such cell's loss then the mean of its runs at that LR, seed 0's alone where no other seed ran there, with
    its seed variance over those runs, on its seeds' df). The reference's
    best LR is one of them, so a saving (the gap below 0 against each: an intersection-union test, p the largest
    of theirs) is a saving against the best, at level ALPHA whichever it is; a neighbour far worse never binds.
    [] where the runs' cost is outside the reference's; the first test is the chosen LRs'."""
    first = gap_test(runs, refs)
    if first is None:
        return []
    at = [refs.index(c) for _, c in weights(refs, mean(float(r["flops"]) for r in runs))]
    out = [first]
    for combo in itertools.product(*[(None, *refs[k].others) for k in at]):
        if all(v is None for v in combo):
            continue
        alt = list(refs)
        for k, v in zip(at, combo):
            if v is not None:
                alt[k] = replace(refs[k], loss=v[0], runs=v[1])
        out.append(gap_test(runs, alt))
    return out


def loss_tests(runs: Sequence[Row], refs: Sequence[Ref], others: Sequence[tuple[float, int]]) -> list[Test]:
    """The test of a loss with the method's LR choice inside it: ``gap_test`` of its runs at the LR it chose, and of
    its runs at each other LR its seed 0 ran (``others``: (mean test loss, runs) there, as ``Ref.others``; the
    method's seed variance over those runs, on its seeds' df), against the reference. A loss is one at every LR the
    method ran (p the largest)."""
    first = gap_test(runs, refs)
    if first is None:
        return []
    n = len(runs)
    var = variance([float(r["test_loss"]) for r in runs]) if n > 1 else 0.0
    cost = mean(float(r["flops"]) for r in runs)
    return [first, *(gap_test([{"flops": cost, "test_loss": v}], refs, own=(var / k, n - 1)) for v, k in others)]


def saving_at(front: envelope.Curve, cost: float, loss: float) -> tuple[float, str]:
    """(1 - cost / C(loss), kind) on the reference curve ``front``: "=" (or a bound, as envelope.saving says) inside
    its losses; outside them, read along its end segment in log-log, "~" (an extrapolation: what the curve would
    need past its budgets if it went on as between its last two cells)."""
    losses = [lo for lo, _ in front]
    if len(front) < 2 or min(losses) <= loss <= max(losses) or loss <= 0:
        return envelope.saving(cost, front, loss)
    (l0, c0), (l1, c1) = front[-2:] if loss < min(losses) else front[:2]
    if l0 == l1:
        return envelope.saving(cost, front, loss)
    log_cost = math.log(c1) + (math.log(c1) - math.log(c0)) / (math.log(l1) - math.log(l0)) * (math.log(loss)
                                                                                               - math.log(l1))
    return 1.0 - cost / math.exp(min(log_cost, 700.0)), "~"


def saving_interval(lo: float, hi: float, cost: float, front: envelope.Curve, at: float
                    ) -> tuple[tuple[float, str], tuple[float, str]]:
    """The FLOPs saving at each end of a gap's interval [``lo``, ``hi``]: the reference curve ``front`` read at its
    loss ``at`` (at the runs' mean FLOPs ``cost``) plus the upper end (the low saving) and the lower end (the high
    saving)."""
    return envelope.saving(cost, front, at + hi), envelope.saving(cost, front, at + lo)


def detectable_gap(tests: Sequence[Test], n: int, power: float = POWER) -> float | None:
    """The smallest true loss gap (negative, against the reference at the LRs its cells chose) that the saving's
    tests ``tests`` (``saving_tests``) find with probability ``power`` at Holm's first threshold over ``n`` cells,
    ALPHA / n. Each test's statistic is then a noncentral t on its degrees of freedom, so it needs its own gap at
    that noncentrality times its se; a test read at another LR needs the chosen one's gap less the difference of the
    two references. The binding test sets it. None where a test has no error (one seed)."""
    from scipy.special import nctdtrinc, stdtrit

    if not tests or not all(t.se > 0 for t in tests):
        return None
    need = []
    for t in tests:
        df = min(t.df, 1e6)
        nc = float(nctdtrinc(df, power, -float(stdtrit(df, 1 - ALPHA / max(n, 1)))))
        need.append(nc * t.se + tests[0].gap - t.gap)
    return min(need)


def holm(ps: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which of ``ps`` Holm's step-down rejects at family-wise ``alpha``."""
    out = [False] * len(ps)
    for rank, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        if ps[i] > alpha / (len(ps) - rank):
            break
        out[i] = True
    return out


def holm_levels(ps: Sequence[float], alpha: float = ALPHA) -> list[float]:
    """The level Holm's step-down compares each of ``ps`` with: ``alpha`` / (n - its rank), rank 0 the smallest p
    (ties in order); the one-sided level of the interval beside a verdict, so that a cell Holm rejects has an
    interval that excludes 0 (a cell after the step where Holm stopped may have one that excludes 0 too: its
    verdict is still none)."""
    out = [alpha] * len(ps)
    for rank, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        out[i] = alpha / (len(ps) - rank)
    return out


# ---------------------------------------------------------------------------------------------- the fitted law


@dataclass(frozen=True)
class Law:
    """L(C) = E + A (C / C0)^-a fitted to ``points`` (cost, test loss), with its parameters' covariance."""

    E: float
    A: float
    a: float
    C0: float
    cov: tuple[tuple[float, ...], ...]
    resid_sd: float
    points: tuple[tuple[float, float], ...]

    @property
    def df(self) -> int:
        return len(self.points) - 3

    def loss(self, cost: float) -> float:
        return self.E + self.A * (cost / self.C0) ** -self.a

    def se(self, cost: float) -> float:
        """The standard error of the fitted loss at ``cost`` (delta method)."""
        x = cost / self.C0
        j = (1.0, x ** -self.a, -self.A * x ** -self.a * math.log(x))
        return math.sqrt(max(0.0, sum(j[i] * self.cov[i][k] * j[k] for i in range(3) for k in range(3))))

    def cost(self, loss: float) -> float:
        """The cost at which the law reaches ``loss`` (inf: at or below E)."""
        return math.inf if loss <= self.E else self.C0 * (self.A / (loss - self.E)) ** (1 / self.a)

    def saving(self, cost: float, loss: float) -> tuple[float, str]:
        """1 - cost / C_law(loss), "=" inside the fitted costs' range, "~" (an extrapolation) outside it."""
        ref = self.cost(loss)
        lo, hi = min(c for c, _ in self.points), max(c for c, _ in self.points)
        return 1.0 - cost / ref, "=" if lo <= ref <= hi else "~"

    def text(self) -> str:
        return (f"L(C) = {self.E:.3f} + {self.A:.3f}·(C / {self.C0:.3g})^-{self.a:.3f}, residual SD "
                f"{self.resid_sd:.4f} over {len(self.points)} budgets ({self.df} df)")


def best_cells(cells: envelope.Cells, axis: str = "flops") -> list[tuple[tuple[int, int], int]]:
    """The best tuned cell of each budget: the size with the lowest mean validation loss over the reference
    seeds (the envelope's choice, before the hull)."""
    best: dict[int, tuple[float, tuple[tuple[int, int], int]]] = {}
    for c, runs in cells.items():
        val = envelope.point(runs, axis, "val_loss")[0]
        if c[1] not in best or val < best[c[1]][0]:
            best[c[1]] = (val, c)
    return [c for _, (_, c) in sorted(best.items())]


def fit_law(points: Sequence[tuple[float, float]]) -> Law | None:
    """The least-squares L(C) = E + A (C / C0)^-a through (cost, loss) ``points`` (C0 their geometric mean cost);
    None with fewer than 4 points (no fit error) or where the fit fails."""
    import numpy as np
    from scipy.optimize import curve_fit

    if len(points) < 4:
        return None
    c = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    c0 = float(np.exp(np.log(c).mean()))

    def f(x: Any, e: float, a_: float, k: float) -> Any:
        return e + a_ * x ** -k

    try:
        p, cov = curve_fit(f, c / c0, y, p0=(0.8 * y.min(), 0.2 * y.min(), 0.3),
                           bounds=((0.0, 0.0, 0.0), (y.min(), 10 * y.max(), 5.0)), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    if not np.all(np.isfinite(cov)):
        return None
    resid = y - f(c / c0, *p)
    sd = float(math.sqrt((resid ** 2).sum() / (len(y) - 3))) if len(y) > 3 else 0.0
    return Law(float(p[0]), float(p[1]), float(p[2]), c0, tuple(tuple(map(float, r)) for r in cov), sd,
               tuple((float(a), float(b)) for a, b in zip(c, y)))


def _law(cells: envelope.Cells) -> Law | None:
    """The law fitted through the best tuned cell of each budget (``fit_law``)."""
    return fit_law([(r.cost, r.loss) for r in refs_of(cells, best_cells(cells))])


def envelope_law(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int]) -> Law | None:
    """The fitted law ``decide`` tests the envelope against, from the same ``rows`` (None: fewer than 4 budgets or
    no fit)."""
    return _law(envelope.reference_cells(rows, sizes, budgets))


def law_test(runs: Sequence[Row], law: Law) -> Test:
    """The Welch test of ``runs``' loss gap against the fitted law at their FLOPs (the law's own error in place of
    the reference cells', with its n - 3 degrees of freedom)."""
    cost = mean(float(r["flops"]) for r in runs)
    gaps = [float(r["test_loss"]) - law.loss(float(r["flops"])) for r in runs]
    return welch(gaps, [(law.se(cost) ** 2, law.df)], law.df + 1)


# ---------------------------------------------------------------------------------------------- the verdicts


def _columns() -> list[str]:
    """The rule's columns of savings.csv (bench.lib.rows.SAVINGS_COLUMNS, from "eligible" on)."""

    return SAVINGS_COLUMNS[SAVINGS_COLUMNS.index("eligible"):]


@dataclass(frozen=True)
class Tested:
    """One savings row's tests: the Welch test of its gap at the LRs chosen (``plain``), the saving's tests with the
    reference's LR choice inside (``saving_tests``: ``plain`` first), the loss's with the method's (``loss_tests``),
    the law's test (envelope rows), and where it is read: the runs' mean FLOPs and test loss, the reference curve
    and its loss there."""

    plain: Test
    saving: tuple[Test, ...]
    losing: tuple[Test, ...]
    law: Test | None
    cost: float
    loss: float
    front: envelope.Curve
    at: float

    def p(self, direction: str, lr_choice: bool = True) -> float:
        """The p-value of a saving or a loss: the largest of the intersection-union tests' (``lr_choice`` False: the
        test at the LRs chosen alone, the rule until 401 runs)."""
        if not lr_choice:
            return self.plain.p(direction)
        return max(t.p(direction) for t in (self.saving if direction == SAVES else self.losing))

    def interval(self, lr_choice: bool = True, alphas: tuple[float, float] = (ALPHA, ALPHA)) -> tuple[float, float]:
        """The gap's interval: the lowest lower end of the loss's tests, the highest upper end of the saving's; each
        end a one-sided bound at its own level, ``alphas`` = (the loss's, the saving's): Holm's, where it decided."""
        lose, save = alphas
        if not lr_choice:
            return self.plain.interval(1 - 2 * lose)[0], self.plain.interval(1 - 2 * save)[1]
        return (min(t.interval(1 - 2 * lose)[0] for t in self.losing),
                max(t.interval(1 - 2 * save)[1] for t in self.saving))


def tests_of(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int], save: Sequence[Row],
             with_law: bool = True) -> tuple[dict[int, Tested], Law | None]:
    """Every test of the savings rows ``save`` (envelope.savings_rows of the same ``rows``, or rows naming variant,
    target, budget and reference): {index in ``save``: its Tested} where the reference spans the runs' FLOPs, and
    the fitted law (not fitted without ``with_law``: a simulation of a rule it does not decide)."""
    cells = envelope.reference_cells(rows, sizes, budgets)
    arms = _arms(rows)  # every arm's runs, read once
    hull = refs_of(cells, [(s, b) for s, b, *_ in envelope.envelope_of(cells, "flops")], arms=arms)
    law = _law(cells) if with_law else None
    groups: dict[tuple, list[Row]] = {}
    for r in envelope.method_rows(rows):
        groups.setdefault((r["variant"], f"{r['layers']}x{r['width']}", int(r["budget"])), []).append(r)
    same: dict[tuple[int, int], list[Ref]] = {}
    out = {}
    for i, s in enumerate(save):
        runs = groups.get((s["variant"], s["target"], int(s["budget"])), [])
        if not runs:
            continue
        size = envelope.size_of(runs[0])
        if s["reference"] == "envelope":
            refs = hull
        else:
            if size not in same:
                same[size] = refs_of(cells, [c for c in cells if c[0] == size], arms=arms)
            refs = same[size]
        saving = saving_tests(runs, refs) if refs else []
        if not saving:
            continue
        arm = arms[(s["variant"], size, int(s["budget"]))]
        others = _others(arm, float(runs[0]["lr"]))  # none where seed 0 ran one LR: nothing was chosen
        cost, front = mean(float(r["flops"]) for r in runs), _curve(refs)
        law_t = law_test(runs, law) if law is not None and s["reference"] == "envelope" else None
        out[i] = Tested(saving[0], tuple(saving), tuple(loss_tests(runs, refs, others)), law_t, cost,
                        mean(float(r["test_loss"]) for r in runs), front, envelope.loss_at(front, cost, slack=1.0))
    return out, law


def _ps(t: Tested, rule: str) -> tuple[float, float]:
    """(p of a saving, p of a loss) of the hull's (or the same size's) test by ``rule``: with the LR choice inside
    it (``AMENDED``) or at the LRs chosen alone."""
    return t.p(SAVES, rule == AMENDED), t.p(LOSES, rule == AMENDED)


def _holm_verdicts(on: Sequence[int], ps: Sequence[tuple[float, float]]) -> dict[int, str]:
    """{index: verdict} of the cells ``on`` whose (p of a saving, p of a loss) are ``ps``: Holm in each direction."""
    out = dict.fromkeys(on, NONE)
    for k, direction in enumerate((SAVES, LOSES)):
        for i, rejected in zip(on, holm([p[k] for p in ps])):
            if rejected:
                out[i] = direction
    return out


def holm_alphas(save: Sequence[Row], tested: dict[int, Tested], rule: str = AMENDED
                ) -> dict[int, tuple[float, float]]:
    """{index: (the one-sided level Holm compared its p of a loss with, that of a saving)} of every eligible row,
    over each reference's eligible rows as ``verdicts`` corrects: the levels of the intervals beside the verdicts."""
    out = {}
    for reference in REFERENCES:
        fam = [i for i, s in enumerate(save)
               if s["reference"] == reference and i in tested and tested[i].plain.eligible]
        ps = [_ps(tested[i], rule) for i in fam]
        saving, losing = holm_levels([p[0] for p in ps]), holm_levels([p[1] for p in ps])
        out.update({i: (lo, sv) for i, lo, sv in zip(fam, losing, saving)})
    return out


def verdicts(save: Sequence[Row], tested: dict[int, Tested], rule: str = AMENDED
             ) -> dict[int, tuple[str, str | None, str, int]]:
    """{index in ``save``: (the hull's (or the same size's) verdict, the law's (None: not tested), the verdict, the
    number of cells Holm corrects over)} of every eligible row, by ``rule`` (``RULES``): Holm over each reference's
    eligible rows, each direction apart. ``AMENDED`` and ``HULL_ONLY``: the verdict is the hull's test's (with the
    LR regret inside it, and without); ``BEFORE``: against the envelope a verdict only where the hull's and the
    law's agree."""
    out = {}
    for reference in REFERENCES:
        fam = [i for i, s in enumerate(save)
               if s["reference"] == reference and i in tested and tested[i].plain.eligible]
        hull = _holm_verdicts(fam, [_ps(tested[i], rule) for i in fam])
        on = [i for i in fam if tested[i].law is not None]
        law = _holm_verdicts(on, [(tested[i].law.p(SAVES), tested[i].law.p(LOSES)) for i in on])
        for i in fam:
            both = rule == BEFORE and reference == "envelope"
            verdict = hull[i] if not both or (hull[i] == law.get(i) and hull[i] in (SAVES, LOSES)) else NONE
            out[i] = (hull[i], law.get(i), verdict, len(fam))
    return out


# the df a savings row records where the test's is infinite (no variance estimated on either side: one seed each, an
# ineligible cell): a t of 1e9 degrees of freedom is the normal, and the rows file holds finite numbers only
MAX_DF = 1e9


def _write(s: Row, t: Tested, rule: str, judged: tuple[str, str | None, str, int] | None,
           alphas: tuple[float, float] | None = None) -> None:
    """Write the rule's columns of one tested savings row: its test (the LR choice inside it by ``rule``), the law's,
    the smallest detectable saving and, where it is eligible (``judged``), Holm's n, the verdicts and the interval
    at the levels Holm compared it with (``alphas``)."""
    lr_choice = rule == AMENDED
    lo, hi = t.interval(lr_choice)
    (slo, klo), (shi, khi) = saving_interval(lo, hi, t.cost, t.front, t.at)
    if alphas is not None:
        hlo, hhi = t.interval(lr_choice, alphas)
        (s["flops_saved_holm_lo"], s["flops_holm_lo_bound"]), (s["flops_saved_holm_hi"], s["flops_holm_hi_bound"]) = \
            saving_interval(hlo, hhi, t.cost, t.front, t.at)
    s.update({"eligible": int(t.plain.eligible), "gap_se": t.plain.se, "gap_df": min(t.plain.df, MAX_DF),
              "gap_t_lo": lo, "gap_t_hi": hi, "p_saves": t.p(SAVES, lr_choice), "p_loses": t.p(LOSES, lr_choice),
              "flops_saved_t_lo": slo, "flops_saved_t_hi": shi, "flops_t_lo_bound": klo, "flops_t_hi_bound": khi,
              "lrs_saves": len(t.saving), "lrs_loses": len(t.losing)})
    if t.law is not None:
        law_lo, law_hi = t.law.interval()
        s.update({"law_loss_gap": t.law.gap, "law_gap_t_lo": law_lo, "law_gap_t_hi": law_hi,
                  "law_p_saves": t.law.p(SAVES), "law_p_loses": t.law.p(LOSES)})
    if judged is None:
        s["verdict_hull"] = s["verdict"] = INELIGIBLE
        return
    hull, law, verdict, n = judged
    gap = detectable_gap(t.saving if lr_choice else [t.plain], n)
    if gap is not None:
        mde, kind = saving_at(t.front, t.cost, t.at + gap)
        s.update({"mde_gap": gap, "mde_flops_saved": mde, "mde_flops_bound": kind})
    s.update({"holm_n": n, "verdict_hull": hull, "verdict": verdict, **({"verdict_law": law} if law else {})})


def decide(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int],
           save: list[Row], rule: str = AMENDED) -> tuple[list[Row], Law | None]:
    """Add the rule's columns (``_columns``) to ``save`` (envelope.savings_rows of the same ``rows``): each row's
    Welch test against its reference (the hull for "envelope", the target's own cells for "same_size") with the
    LR regret inside it, the saving's interval propagated from it, the smallest saving it could detect, and, for
    the envelope, the same test against the fitted law (shown only); then Holm over each reference's eligible rows,
    each direction apart, and the verdict (``verdicts``; ``rule`` another of ``RULES`` to measure it). Returns
    (``save``, the law)."""
    tested, law = tests_of(rows, sizes, budgets, save)
    judged, alphas = verdicts(save, tested, rule), holm_alphas(save, tested, rule)
    for i, s in enumerate(save):
        if i in tested:
            _write(s, tested[i], rule, judged.get(i), alphas.get(i))
            if tested[i].law is not None and law is not None:
                v, kind = law.saving(tested[i].cost, tested[i].loss)
                s.update({"law_flops_saved": v, "law_flops_bound": kind})
        else:
            s["eligible"] = 0
            s["verdict_hull"] = s["verdict"] = INELIGIBLE
    return save, law


def saves(row: Row) -> bool:
    """Whether a savings row (savings.csv, with the rule's columns) is a saving by the rule: the Holm-corrected
    Welch test against its reference, the reference's LR regret inside it, below 0."""
    return row.get("verdict") == SAVES


def loses(row: Row) -> bool:
    """Whether a savings row is a loss by the rule: the same test above 0, the method's LR regret inside it."""
    return row.get("verdict") == LOSES


def eligible(row: Row) -> bool:
    """Whether a savings row (as ``decide`` wrote it, or read back from savings.csv) is one the rule tests: 2+ seeds
    in each arm."""
    return str(row.get("eligible")) in ("1", "1.0", "True")


def counts(save: Sequence[Row], reference: str = "envelope", direction: str = SAVES) -> tuple[int, int]:
    """(k cells whose verdict is ``direction``, n eligible cells) of ``reference``."""
    fam = [s for s in save if s["reference"] == reference and eligible(s)]
    return sum(s.get("verdict") == direction for s in fam), len(fam)


# ---------------------------------------------------------------------------------------------- error rates


NULL_LOSSES = (3.20, 3.00, 2.90)  # the null reference's true test loss at costs 1, 2, 4 (x 1e13): convex in log-log,
# the middle 0.046 below the outer chord (6 seed SDs), so the hull holds all three, as the grid's hull cells are held


def _true(cost: float) -> float:
    """The null reference's true loss at ``cost``: the log-log chord of ``NULL_LOSSES`` (what the hull reads)."""
    x = min(max(math.log2(cost / 1e13), 0.0), 2.0)
    j = min(int(x), 1)
    w = x - j
    return math.exp((1 - w) * math.log(NULL_LOSSES[j]) + w * math.log(NULL_LOSSES[j + 1]))


def _null_cells(rng: Any, n_ref: Sequence[int], sds: Sequence[float]) -> envelope.Cells:
    """Reference cells at costs 1, 2, 4 (x 1e13) with true losses ``NULL_LOSSES``, ``n_ref[j]`` seeds each with
    test-loss noise ``sds[j]``, validation = test + a small independent noise (the hull is chosen on it)."""
    cells = {}
    for j, (n, sd) in enumerate(zip(n_ref, sds)):
        cells[((2, 64), j)] = []
        for s in range(n):
            test = NULL_LOSSES[j] + rng.normal(0, sd)
            cells[((2, 64), j)].append({"flops": 1e13 * 2 ** j, "wall_s": 1.0, "test_loss": test,
                                        "val_loss": test + rng.normal(0, sd / 4), "seed": s + 1})
    return cells


def null_rate(rule: str, n_method: int, n_ref: Sequence[int], sims: int, seed: int = 0, at: float = 1.0,
              sd: float = 0.008, resamples: int = envelope.BOOTSTRAP, ref_sd: Sequence[float] | None = None) -> float:
    """The share of ``sims`` null experiments in which ``rule`` finds a saving against the hull: reference cells of
    ``n_ref`` seeds at costs 1, 2, 4 (``_null_cells``), the method's ``n_method`` seeds at cost 2^``at`` (1.0: at the
    middle cell; 0.5: on the chord between the first two) with the reference's true loss there, every seed's noise
    ``sd`` (0.008: the grid's seed SD; ``ref_sd``: each reference cell's own, where they differ). ``rule``: "welch"
    (this module's test at ``ALPHA``, uncorrected), "welch_pooled" (the same with the variance pooled over the cells,
    as first fixed) or "bootstrap" (envelope.interval's percentile interval above 0, ``resamples`` draws)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    cost = 1e13 * 2 ** at
    hits = 0
    for k in range(sims):
        cells = _null_cells(rng, n_ref, ref_sd or [sd] * len(n_ref))
        runs = [{"flops": cost, "wall_s": 1.0, "test_loss": _true(cost) + rng.normal(0, sd), "seed": s}
                for s in range(n_method)]
        if rule in ("welch", "welch_pooled"):
            t = gap_test(runs, refs_of(cells, [(c[0], c[1]) for c in envelope.envelope_of(cells, "flops")]),
                         pooled=rule == "welch_pooled")
            hits += t is not None and t.p(SAVES) <= ALPHA
        else:
            draws = envelope.resample(cells, resamples, seed * 100003 + k)
            fronts = [envelope._envelope_curve(d, "flops") for d in draws]
            lo, _, kind = envelope.interval(runs, fronts, "flops", np.random.default_rng([seed, k]))
            hits += lo > 0 and kind == "="
    return hits / sims


NEAR = 1 - 1.5e-5  # 0.001% below a cell's FLOPs, as the methods' runs at 9934 lie: the left neighbour weighs ~2e-5
CASES = (("3 method seeds vs 2 reference seeds, at a cell", 3, (2, 2, 2), 1.0, None),
         ("3 vs 2, on a chord between two cells", 3, (2, 2, 2), 0.5, None),
         ("3 vs 3, at a cell", 3, (3, 3, 3), 1.0, None),
         ("3 vs 3, on a chord", 3, (3, 3, 3), 0.5, None),
         ("5 vs 5, at a cell", 5, (5, 5, 5), 1.0, None),
         ("6 vs 5 (seeds 0-5 of a method, 1-5 of a reference), at a cell", 6, (5, 5, 5), 1.0, None),
         ("6 vs 2, at a cell (a reference of one degree of freedom)", 6, (2, 2, 2), 1.0, None),
         # a method whose seed 0 chose its LR among several is read on its other seeds (envelope.method_rows)
         ("2 vs 2 (seeds 1-2 of a method whose seed 0 chose its LR), at a cell", 2, (2, 2, 2), 1.0, None),
         ("5 vs 4 (seeds 1-5 of such a method, 1-4 of a reference), at a cell", 5, (4, 4, 4), 1.0, None),
         # the cells' seed SDs differ (the grid's span 0.002-0.04): the method's runs just below a cell
         ("6 vs 5, just below a cell whose left neighbour (3 seeds) has 5x its SD", 6, (3, 5, 5), NEAR,
          (0.04, 0.008, 0.008)),
         ("6 vs 5, just below a cell whose left neighbour (3 seeds) has 1/4 its SD", 6, (3, 5, 5), NEAR,
          (0.002, 0.008, 0.008)),
         ("6 vs 2, just below a cell of 2 seeds whose neighbour (5 seeds) has 1/4 its SD", 6, (5, 2, 5), NEAR,
          (0.002, 0.008, 0.008)),
         ("6 vs 3, just below a cell of 3 seeds at 2x the SD, its neighbour (5 seeds) at 1/2", 6, (5, 3, 5), NEAR,
          (0.004, 0.016, 0.008)),
         # a method read on 2 seeds against settled (5-seed) reference cells: the method's one degree of freedom
         # carries most of the variance, and Welch-Satterthwaite's overstates it
         ("2 vs 5 (seeds 1-2 of a method against settled cells), at a cell", 2, (5, 5, 5), 1.0, None),
         ("2 vs 5, on a chord", 2, (5, 5, 5), 0.5, None),
         ("3 vs 5, at a cell", 3, (5, 5, 5), 1.0, None),
         ("3 vs 5, on a chord", 3, (5, 5, 5), 0.5, None),
         ("5 vs 2 (a method of 5 seeds against its target's 2-seed cell), at a cell", 5, (2, 2, 2), 1.0, None),
         ("5 vs 5, on a chord", 5, (5, 5, 5), 0.5, None))
