"""The rule that decides a saving, with a known error rate, and the fitted envelope beside the hull.

``python -m bench.frontier.false_positives`` measures each rule's false-positive rate by simulation (null data,
the frontier's own estimator: bench/lib/envelope.py's hull chosen on validation and its log-log interpolation); the
test suite checks the same at fewer draws.

- **The test** (``gap_test``): the method's test loss minus the reference's at the method's FLOPs (the loss gap at
  equal FLOPs, ``envelope.loss_gap``), with a Welch t interval. The reference's value there is read between the
  one or two reference cells that bracket the method's FLOPs (log-log), so its variance is those cells' seed
  variances weighted by the interpolation (delta method), and the degrees of freedom are Welch-Satterthwaite's
  over the method's seeds and those cells'. One-sided at ``ALPHA`` (2.5%) in each direction: below 0, the method
  reaches a lower loss on the same compute, so the reference needs more FLOPs for the method's loss (a saving);
  above 0, the reverse. The interval is propagated to the FLOPs saving by reading the reference curve at the
  reference's loss plus each end of the gap's interval.
- **Eligible** cells have 2+ seeds in the method's arm and in every reference cell the gap is read on (with one seed
  there is no variance); the others get no verdict.
- **Holm** over a grid's eligible cells of one reference (the envelope; the same-size baseline; the fitted law),
  each direction apart: "k of n eligible cells" is how many Holm rejects at family-wise 2.5%.
- **The fitted envelope** (``fit_law``): L(C) = E + A (C / C0)^-a by least squares on the best tuned cell of each
  budget (the size with the lowest validation loss over the reference seeds; its test loss), with the fit's own
  error (parameter covariance from the residuals, n - 3 degrees of freedom), beside the hull. The same Welch test
  reads the method against the law (the law's standard error at the method's FLOPs in place of the cells').
- **The verdict** stands only where the hull and the law agree: "saves" where both reject in that direction,
  "loses" where both do in the other, else "no evidence either way".

The percentile bootstrap (envelope.interval) stays on the pages as a description of the spread, labelled so; it
decides nothing: with 3 method seeds against 2 reference seeds it lies above 0 in far more than 2.5% of null
experiments (``null_rate``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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
SAVES, LOSES, NONE, INELIGIBLE = "saves", "loses", "no evidence either way", "not eligible"


# ---------------------------------------------------------------------------------------------- the test


@dataclass(frozen=True)
class Ref:
    """One cell of a reference curve: its mean cost and test loss over its seeds, and those seeds' test losses."""

    cost: float
    loss: float
    seeds: tuple[float, ...]


def refs_of(cells: envelope.Cells, on: Sequence[tuple[tuple[int, int], int]], axis: str = "flops") -> list[Ref]:
    """The reference curve through cells ``on`` (keys of ``cells``), by cost."""
    out = [Ref(*envelope.point(cells[c], axis)[::-1], tuple(float(r["test_loss"]) for r in cells[c])) for c in on]
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
    """A method's loss gap against a reference at equal cost: mean, standard error, Welch df, and the fewest seeds
    of the reference cells it is read on."""

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


def welch(gaps: Sequence[float], ref: Sequence[tuple[float, float]], ref_seeds: int) -> Test:
    """A Test of the mean of ``gaps`` (one per method seed, their own variance) against a reference value whose
    variance is the sum of the pieces ``ref`` [(variance, degrees of freedom)], one per independent estimate it is
    made of; the degrees of freedom are Welch-Satterthwaite's over the method's and every piece."""
    n = len(gaps)
    pieces = [(variance(gaps) / n if n > 1 else 0.0, n - 1), *ref]
    se2 = sum(v for v, _ in pieces)
    denom = sum(v * v / k for v, k in pieces if k > 0 and v > 0)
    df = se2 * se2 / denom if denom > 0 else math.inf
    return Test(mean(gaps), math.sqrt(se2), df, ref_seeds, n)


def gap_test(runs: Sequence[Row], refs: Sequence[Ref], axis: str = "flops", pooled: bool = False) -> Test | None:
    """The Welch test of ``runs``' loss gap at equal ``axis`` against the reference curve ``refs`` (None: the runs'
    cost is outside the reference's). The reference's value there is read between one or two cells with weights
    d_j (the interpolation's derivative), so its variance is the sum over those cells of d_j^2 s_j^2 / n_j, each
    cell's own seed variance s_j^2 on its n_j - 1 degrees of freedom (a cell of weight ~0 adds ~nothing).

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
    varied = [(d, c) for d, c in w if len(c.seeds) > 1]
    if pooled:
        df = sum(len(c.seeds) - 1 for _, c in w)
        var = sum((len(c.seeds) - 1) * variance(c.seeds) for _, c in varied) / df if df > 0 else 0.0
        return welch(gaps, [(var * sum(d * d / len(c.seeds) for d, c in w), df)], fewest)
    return welch(gaps, [(d * d * variance(c.seeds) / len(c.seeds), len(c.seeds) - 1) for d, c in varied], fewest)


def saving_interval(test: Test, runs: Sequence[Row], front: envelope.Curve, at: float
                    ) -> tuple[tuple[float, str], tuple[float, str]]:
    """The FLOPs saving at each end of the gap's t interval: the reference curve ``front`` read at its loss ``at``
    (at the runs' mean FLOPs) plus the gap's upper end (the low saving) and lower end (the high saving)."""
    cost = mean(float(r["flops"]) for r in runs)
    lo, hi = test.interval()
    return envelope.saving(cost, front, at + hi), envelope.saving(cost, front, at + lo)


def holm(ps: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Which of ``ps`` Holm's step-down rejects at family-wise ``alpha``."""
    out = [False] * len(ps)
    for rank, i in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        if ps[i] > alpha / (len(ps) - rank):
            break
        out[i] = True
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


def decide(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int],
           save: list[Row]) -> tuple[list[Row], Law | None]:
    """Add the rule's columns (``_columns``) to ``save`` (envelope.savings_rows of the same ``rows``): each row's
    Welch test against its reference (the hull for "envelope", the target's own cells for "same_size"), the saving's
    interval propagated from it, and, for the envelope, the same test against the fitted law; then Holm over each
    reference's eligible rows, each direction apart, and the verdict. Returns (``save``, the law)."""
    cells = envelope.reference_cells(rows, sizes, budgets)
    hull = refs_of(cells, [(s, b) for s, b, *_ in envelope.envelope_of(cells, "flops")])
    law = _law(cells)
    groups: dict[tuple, list[Row]] = {}
    for r in envelope.method_rows(rows):
        groups.setdefault((r["variant"], f"{r['layers']}x{r['width']}", int(r["budget"])), []).append(r)
    tests: dict[int, tuple[Test | None, Test | None]] = {}
    for i, s in enumerate(save):
        runs = groups.get((s["variant"], s["target"], int(s["budget"])), [])
        if not runs:
            continue
        size = envelope.size_of(runs[0])
        refs = hull if s["reference"] == "envelope" else refs_of(cells, [c for c in cells if c[0] == size])
        t = gap_test(runs, refs) if refs else None
        lt = law_test(runs, law) if law is not None and s["reference"] == "envelope" else None
        tests[i] = (t, lt)
        if t is not None:
            lo, hi = t.interval()
            at = envelope.loss_at(_curve(refs), mean(float(r["flops"]) for r in runs), slack=1.0)
            (slo, klo), (shi, khi) = saving_interval(t, runs, _curve(refs), at)
            s.update({"eligible": int(t.eligible), "gap_se": t.se, "gap_df": t.df, "gap_t_lo": lo, "gap_t_hi": hi,
                      "p_saves": t.p(SAVES), "p_loses": t.p(LOSES), "flops_saved_t_lo": slo, "flops_saved_t_hi": shi,
                      "flops_t_lo_bound": klo, "flops_t_hi_bound": khi})
        else:
            s["eligible"] = 0
        if lt is not None:
            lo, hi = lt.interval()
            v, kind = law.saving(mean(float(r["flops"]) for r in runs), mean(float(r["test_loss"]) for r in runs))
            s.update({"law_loss_gap": lt.gap, "law_gap_t_lo": lo, "law_gap_t_hi": hi, "law_p_saves": lt.p(SAVES),
                      "law_p_loses": lt.p(LOSES), "law_flops_saved": v, "law_flops_bound": kind})
    for reference in ("envelope", "same_size"):
        fam = [i for i, s in enumerate(save) if s["reference"] == reference and s.get("eligible")]
        for k in (0, 1):  # the hull's (or the same size's) test, then the law's
            if k == 1 and reference != "envelope":
                continue
            on = [i for i in fam if tests[i][k] is not None]
            verdicts = {i: NONE for i in on}
            for direction in (SAVES, LOSES):
                for i, rej in zip(on, holm([tests[i][k].p(direction) for i in on])):
                    if rej:
                        verdicts[i] = direction
            for i in on:
                save[i]["holm_n"] = len(on) if k == 0 else save[i].get("holm_n")
                save[i]["verdict_law" if k else "verdict_hull"] = verdicts[i]
    for s in save:
        if not s.get("eligible"):
            s["verdict_hull"] = s["verdict"] = INELIGIBLE
            continue
        both = [s.get("verdict_hull")] + ([s.get("verdict_law")] if s["reference"] == "envelope" else [])
        s["verdict"] = both[0] if len(set(both)) == 1 and both[0] in (SAVES, LOSES) else NONE
    return save, law


def saves(row: Row) -> bool:
    """Whether a savings row (savings.csv, with the rule's columns) is a saving by the rule: Holm-corrected Welch
    tests against the hull and, for the envelope, against the fitted law, both below 0."""
    return row.get("verdict") == SAVES


def eligible(row: Row) -> bool:
    """Whether a savings row (as ``decide`` wrote it, or read back from savings.csv) is one the rule tests: 2+ seeds
    in each arm."""
    return str(row.get("eligible")) in ("1", "1.0", "True")


def counts(save: Sequence[Row], reference: str = "envelope") -> tuple[int, int]:
    """(k cells that save, n eligible cells) of ``reference``."""
    fam = [s for s in save if s["reference"] == reference and eligible(s)]
    return sum(saves(s) for s in fam), len(fam)


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
