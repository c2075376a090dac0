"""The compute-optimal reference and the savings against it, from the frontier's rows (python -m bench.frontier).

Pure functions over rows (dicts, one per finished run: method, variant, layers, width, lr, budget, seed,
flops, wall_s, val_loss, test_loss, ...); nothing here trains. The protocol:

- **Tuned LR** of a baseline size at a budget: the learning rate whose seed-0 run has the lowest
  *validation* loss (``tuned_lr``). Seeds 1.. run at that LR only. A method's, by the same rule over the LRs its
  seed 0 ran at that cell (``method_lr``): the target's tuned LR, and an LR check's others.
- **Reference values never use the seed that chose.** Seed 0 chose the LR, so a cell's reference point is the
  mean over its other seeds (``reference_runs``: every seed but 0): over the 23 tuned cells seed 0 tests 0.035 nats
  better than seeds 1-2, which is the selection, not the LR. Choosing the LR on the mean of two seeds instead
  would need the sweep's other LRs at a second seed, which the existing runs do not have. A method whose seed 0 ran
  at several LRs chose among them too, so its value is then over its other seeds (``method_rows``).
- **Same-size reference**: one size's cells at every budget, (mean test loss, mean cost) over seeds 1 and up,
  interpolated piecewise linearly in (log loss, log cost).
- **Envelope**: the lower convex hull in (log cost, log validation loss) of every size's cell at every budget,
  after dropping each cell that a cheaper one beats (``hull``); it enters as those cells' (mean test loss,
  mean cost). Chosen on validation, never on test. The hull passes only through measured cells and never
  extrapolates; a cell above the chord of its neighbours (a flat or noisy stretch, or a budget where the size
  grid missed the best size) is replaced by the chord, so a run a hair below such a cell is not credited with
  the whole stretch's compute. In wall-clock the sizes' costs differ at one budget, so the hull may mix them.
- **Saving** of one run against a reference curve: 1 - C_run / C_ref(l_run), with C_ref interpolated
  piecewise linearly in (log loss, log cost) between neighbouring points. A loss below the curve's lowest
  is a lower bound (">="; the reference's largest budget is all we know it needs), above its highest an
  upper bound ("<="); never extrapolated. Wall-clock the same with ``wall_s`` as the cost.
- **Loss gap at equal FLOPs**: the run's test loss minus the reference's at the run's FLOPs (``loss_at``,
  interpolated in log-log, never extrapolated), with the same bootstrap. It exists where a saving can only be a
  bound, at the reference's largest budget: a gap whose interval lies below 0 says the method ends lower than
  any baseline on that compute (so its saving is above 0, by an amount the next budget up would measure).
- **A bound stays a bound** (``combine``): a mean over values and lower bounds is a lower bound (">="), over
  values and upper bounds an upper bound ("<="); over both kinds of bound it is neither ("~": no direction).
- **Interval**: 95% percentile bootstrap over the seeds of *both* arms (``BOOTSTRAP`` resamples, RNG seed
  ``RNG_SEED``, so the pages are reproducible): each resample draws every reference cell's seeds and the
  method's seeds with replacement, rebuilds the curves (the hull too) and takes the mean saving. Each cell and
  each method group draws from its own RNG, so a report of part of a grid gives the whole report's intervals.
  It describes the spread and decides nothing: at 3 method seeds against 2 reference seeds it lies above 0 in
  about 13% of null experiments. The deciding rule, with its error rate measured, is bench/lib/verdict.py
  (``excludes_zero`` and ``ends_lower`` below are the superseded rule's).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from statistics import fmean, mean
from typing import Any

Row = dict[str, Any]
Curve = list[tuple[float, float]]  # (loss, cost), cost increasing


def frontier(points: Iterable[tuple[float, float]]) -> Curve:
    """(loss, cost) points sorted by cost."""
    return sorted(points, key=lambda p: p[1])


def cost_at(front: Curve, loss: float) -> tuple[float, str]:
    """(C(loss), kind): kind "=" interpolated log-log between neighbouring points of ``front`` (sorted by cost),
    ">" the loss is below every point (the largest cost is a lower bound), "<" above every point."""
    losses = [p[0] for p in front]
    for lo, c in front:
        if lo == loss:
            return c, "="
    if loss < min(losses):
        return front[-1][1], ">"
    if loss > max(losses):
        return front[0][1], "<"
    for (l0, c0), (l1, c1) in zip(front, front[1:]):
        lo, hi = min(l0, l1), max(l0, l1)
        if lo <= loss <= hi:
            if l0 == l1:
                return min(c0, c1), "="
            w = (math.log(loss) - math.log(l0)) / (math.log(l1) - math.log(l0))
            return math.exp(math.log(c0) + w * (math.log(c1) - math.log(c0))), "="
    return front[-1][1], ">"  # a non-monotone curve: conservative


def saving(cost: float, front: Curve, loss: float) -> tuple[float, str]:
    """(1 - cost / C(loss), kind), kind "=" exact, ">=" at least this, "<=" at most this (as in cost_at)."""
    ref, kind = cost_at(front, loss)
    return 1.0 - cost / ref, {"=": "=", ">": ">=", "<": "<="}[kind]


def loss_at(front: Curve, cost: float, slack: float = 0.025) -> float | None:
    """The reference's test loss at ``cost``, interpolated log-log between neighbouring points of ``front``
    (sorted by cost); a cost within ``slack`` (relative) of an end is read at that end (a method's run spends its
    budget to within a step), and further out None: never extrapolated."""
    lo, hi = front[0][1], front[-1][1]
    if not lo * (1 - slack) <= cost <= hi * (1 + slack):
        return None
    cost = min(max(cost, lo), hi)
    for (l0, c0), (l1, c1) in zip(front, front[1:]):
        if c0 <= cost <= c1:
            w = 0.0 if c1 == c0 else (math.log(cost) - math.log(c0)) / (math.log(c1) - math.log(c0))
            return math.exp(math.log(l0) + w * (math.log(l1) - math.log(l0)))
    return front[0][0]  # a one-point front


def loss_gap(runs: Sequence[Row], front: Curve) -> float | None:
    """The mean over ``runs`` of (the run's test loss - the reference's at the run's FLOPs): below 0, the method
    ends lower than the reference does on the same compute. None where a run's FLOPs are outside the front's."""
    ref = [loss_at(front, float(r["flops"])) for r in runs]
    return None if any(x is None for x in ref) else mean(float(r["test_loss"]) - x for r, x in zip(runs, ref))


# ---------------------------------------------------------------------------------------- the baseline


def size_of(row: Row) -> tuple[int, int]:
    """(layers, width) of a row's model (its target model for a method)."""
    return int(row["layers"]), int(row["width"])


def baseline_rows(rows: Sequence[Row], size: tuple[int, int], budget: int) -> list[Row]:
    """The baseline runs of ``size`` at ``budget`` (any LR, any seed)."""
    return [r for r in rows if r["method"] == "baseline" and size_of(r) == size and int(r["budget"]) == budget]


CHOOSER_SEED = 0  # the seed whose validation loss chooses the LR: its runs enter no reference value


def tuned_lr(rows: Sequence[Row], size: tuple[int, int], budget: int) -> float | None:
    """The LR of the seed-0 baseline run of ``size`` at ``budget`` with the lowest validation loss (None: none)."""
    sweep = [r for r in baseline_rows(rows, size, budget) if int(r["seed"]) == CHOOSER_SEED]
    return float(min(sweep, key=lambda r: r["val_loss"])["lr"]) if sweep else None


def tuned_runs(rows: Sequence[Row], size: tuple[int, int], budget: int) -> list[Row]:
    """The baseline runs of ``size`` at ``budget`` at its tuned LR, one per seed (the choosing seed included)."""
    lr = tuned_lr(rows, size, budget)
    return [r for r in baseline_rows(rows, size, budget) if lr is not None and float(r["lr"]) == lr]


def reference_runs(rows: Sequence[Row], size: tuple[int, int], budget: int) -> list[Row]:
    """The tuned runs of ``size`` at ``budget`` other than the seed that chose the LR ([] when none ran)."""
    return [r for r in tuned_runs(rows, size, budget) if int(r["seed"]) != CHOOSER_SEED]


Cells = dict[tuple[tuple[int, int], int], list[Row]]  # {(size, budget): its reference runs}


def reference_cells(rows: Sequence[Row], sizes: Iterable[tuple[int, int]], budgets: Iterable[int]) -> Cells:
    """Every baseline cell with reference runs, in a fixed order (the bootstrap draws in it)."""
    budgets = list(budgets)
    by: dict[tuple[tuple[int, int], int], list[Row]] = {}
    for r in rows:  # each cell's rows gathered once, then read as reference_runs reads them (a draw of the rule's
        if r["method"] == "baseline":  # simulation reads a grid's rows thousands of times)
            by.setdefault((size_of(r), int(r["budget"])), []).append(r)
    return {(s, b): runs for s in sorted(sizes) for b in sorted(budgets)
            if (runs := reference_runs(by.get((s, b), []), s, b))}


def point(runs: Sequence[Row], axis: str, loss: str = "test_loss") -> tuple[float, float]:
    """(mean ``loss``, mean ``axis``) over runs (seeds)."""
    return fmean(float(r[loss]) for r in runs), fmean(float(r[axis]) for r in runs)  # (fmean: floats, fast)


def same_size_of(cells: Cells, size: tuple[int, int], axis: str) -> Curve:
    """The reference curve of one size from ``cells``: (mean test loss, mean ``axis``) at every budget."""
    return frontier(point(runs, axis) for (s, _), runs in cells.items() if s == size)


def same_size_curve(rows: Sequence[Row], size: tuple[int, int], budgets: Iterable[int], axis: str) -> Curve:
    """The tuned baseline of ``size``: (mean test loss, mean ``axis``) over seeds 1.. at every budget it ran."""
    return same_size_of(reference_cells(rows, [size], budgets), size, axis)


SAME_COST = 0.01  # costs within 1% are one cost (the sizes of one FLOPs budget differ by rounding their steps)
Point = tuple[tuple[int, int], int, float, float, float]  # (size, budget, cost, val loss, test loss)


def hull(points: Iterable[Point]) -> list[Point]:
    """The lower convex hull in (log cost, log val loss) of ``points`` after dropping every point that a cheaper
    one matches or beats on validation (more compute can always do at least as well: the envelope only falls).
    Costs within ``SAME_COST`` are one cost, where the lower validation loss stays. Returned by cost."""
    falling: list[Point] = []
    for p in sorted(points, key=lambda p: (p[2], p[3])):
        if falling and p[2] <= falling[-1][2] * (1 + SAME_COST):
            if p[3] < falling[-1][3]:
                falling[-1] = (p[0], p[1], falling[-1][2], p[3], p[4])
        elif not falling or p[3] < falling[-1][3]:
            falling.append(p)
    low: list[Point] = []
    for p in falling:  # Andrew's monotone chain, lower half: drop a middle point on or above the chord
        while len(low) >= 2 and _turn(low[-2], low[-1], p) <= 0:
            low.pop()
        low.append(p)
    return low


def _turn(a: Point, b: Point, c: Point) -> float:
    """> 0 when a -> b -> c turns counter-clockwise in (log cost, log val loss): b lies below the chord a-c."""
    ax, ay, bx, by, cx, cy = (math.log(v) for v in (a[2], a[3], b[2], b[3], c[2], c[3]))
    return (bx - ax) * (cy - ay) - (by - ay) * (cx - ax)


def envelope_of(cells: Cells, axis: str) -> list[Point]:
    """The envelope's cells along ``axis``: the ``hull`` of every cell's mean (cost, val loss, test loss)."""
    pts = []
    for (s, b), runs in cells.items():
        (val, cost), (test, _) = point(runs, axis, "val_loss"), point(runs, axis)
        pts.append((s, b, cost, val, test))
    return hull(pts)


def envelope_points(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Iterable[int],
                    axis: str) -> list[Point]:
    """The points of ``envelope_curve`` as (size, budget, cost, val loss, test loss), by cost."""
    return envelope_of(reference_cells(rows, sizes, budgets), axis)


def envelope_curve(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Iterable[int],
                   axis: str) -> Curve:
    """The lower envelope of the baseline over ``sizes`` along ``axis`` (FLOPs or wall-clock), as (test loss,
    cost) of the cells on the hull (see ``hull``; chosen on validation over seeds 1..). In FLOPs the sizes of a
    budget cost the same, so a budget keeps at most its best size; in wall-clock a size may win at a cost that
    is another's budget."""
    return [(test, cost) for _, _, cost, _, test in envelope_points(rows, sizes, budgets, axis)]


# ---------------------------------------------------------------------------------------- the savings

BOOTSTRAP = 2000  # resamples of the seeds of both arms
RNG_SEED = 20261126  # fixed: the same rows give the same intervals, to the digit
LEVEL = 0.95


def combine(kinds: Iterable[str]) -> str:
    """The kind of a mean over savings of ``kinds``: "=" all exact; ">=" / "<=" exact values and bounds of one
    direction (the mean is a bound of that direction); "~" bounds of both directions (no direction)."""
    ks = set(kinds) - {"="}
    if not ks:
        return "="
    if ks <= {">="}:
        return ">="
    if ks <= {"<="}:
        return "<="
    return "~"


def mean_saving(runs: Sequence[Row], front: Curve, axis: str) -> tuple[float, str]:
    """(mean saving over ``runs``, its kind by ``combine``) against ``front`` along ``axis``."""
    got = [saving(float(r[axis]), front, float(r["test_loss"])) for r in runs]
    return mean(v for v, _ in got), combine(k for _, k in got)


def resample(cells: Cells, resamples: int, seed: int) -> list[Cells]:
    """``resamples`` bootstrap draws of the reference arm: ``cells`` with each cell's seeds drawn with replacement.
    Each cell draws from its own RNG, seeded with ``seed`` and the cell, so its draws are the same whichever other
    cells the grid holds (a report of part of a grid, ``--max_budget``, gives the full report's intervals)."""

    import numpy as np

    picks = {c: np.random.default_rng([seed, 2, zlib.crc32(repr(c).encode())]).integers(
        len(runs), size=(resamples, len(runs))) for c, runs in cells.items()}
    return [{c: [runs[i] for i in picks[c][k]] for c, runs in cells.items()} for k in range(resamples)]


def interval(runs: Sequence[Row], fronts: Sequence[Curve], axis: str, rng: Any) -> tuple[float, float, str]:
    """(low, high, kind) of the ``LEVEL`` percentile interval of the mean saving of ``runs``: draw k pairs a
    reference curve ``fronts[k]`` (already drawn from the reference's seeds) with a draw of the method's seeds.
    ``kind`` combines every draw's (a draw's mean that is a bound makes the interval's ends bounds too)."""
    import numpy as np

    vals, kinds = [], set()
    for front in fronts:
        draw = [runs[i] for i in rng.integers(len(runs), size=len(runs))]
        v, k = mean_saving(draw, front, axis)
        vals.append(v)
        kinds.add(k)
    lo, hi = np.percentile(vals, [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
    return float(lo), float(hi), combine(kinds)


def savings_rows(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int],
                 resamples: int = BOOTSTRAP, seed: int = RNG_SEED) -> list[Row]:
    """One row per (method variant, target size, budget, reference): savings against the envelope and against
    the tuned baseline of the target's own size (the papers' protocol), in FLOPs and wall-clock. Fractions;
    negative where the reference gets there first. ``*_saved_mean``: the mean over the method's seeds against
    the reference of seeds 1..; ``*_bound`` its kind (``combine``); ``*_saved_lo`` / ``*_saved_hi``: the 95%
    bootstrap interval over the seeds of both arms, ``*_ci_bound`` its kind; ``reference_seeds``: the fewest
    seeds of the reference's cells the results are read between; ``loss_gap_*``: the mean test-loss gap at equal
    FLOPs (``loss_gap``) and its interval, where the reference spans the runs' FLOPs. ``resamples`` draws from RNGs
    seeded with ``seed`` and each reference cell (``resample``) or the method group's name."""

    import numpy as np

    cells = reference_cells(rows, sizes, budgets)
    draws = resample(cells, resamples, seed)
    axes = ("flops", "wall_s")
    refs = {("envelope", ax): _envelope_curve(cells, ax) for ax in axes}
    boot = {("envelope", ax): [_envelope_curve(d, ax) for d in draws] for ax in axes}
    groups: dict[tuple, list[Row]] = {}
    for r in method_rows(rows):
        groups.setdefault((r["method"], r["variant"], size_of(r), int(r["budget"])), []).append(r)
    out = []
    for (method, variant, size, budget), runs in sorted(groups.items()):
        for ax in axes:
            if ("same_size", size, ax) not in refs:
                refs[("same_size", size, ax)] = same_size_of(cells, size, ax)
                boot[("same_size", size, ax)] = [same_size_of(d, size, ax) for d in draws]
        for reference in ("envelope", "same_size"):
            key = {ax: (reference, ax) if reference == "envelope" else ("same_size", size, ax) for ax in axes}
            if not all(refs[key[ax]] for ax in axes):
                continue
            on = ([(c[0], c[1]) for c in envelope_of(cells, "flops")] if reference == "envelope"
                  else [c for c in cells if c[0] == size])
            near = _bracket(cells, on, mean(float(r["flops"]) for r in runs), mean(float(r["test_loss"]) for r in runs))
            row: Row = {"method": method, "variant": variant, "target": f"{size[0]}x{size[1]}", "budget": budget,
                        "budget_flops": runs[0]["budget_flops"], "reference": reference, "seeds": len(runs),
                        "reference_seeds": min(len(cells[c]) for c in near),
                        "test_loss_mean": mean(float(r["test_loss"]) for r in runs),
                        "tokens_per_param": mean(float(r["tokens_per_param"]) for r in runs),
                        "tokens_vs_baseline": _tokens_ratio(rows, runs, size, budget)}
            gap = loss_gap(runs, refs[key["flops"]])
            if gap is not None:
                gap_rng = np.random.default_rng([seed, 1, zlib.crc32(f"{method}/{variant}/{size}/{budget}/{reference}"
                                                                      .encode())])
                gaps = [loss_gap([runs[i] for i in gap_rng.integers(len(runs), size=len(runs))], front)
                        for front in boot[key["flops"]]]
                lo, hi = np.percentile([x for x in gaps if x is not None], [50 * (1 - LEVEL), 50 * (1 + LEVEL)])
                row.update({"loss_gap_mean": gap, "loss_gap_lo": float(lo), "loss_gap_hi": float(hi)})
            for ax, name in (("flops", "flops"), ("wall_s", "wall")):
                v, kind = mean_saving(runs, refs[key[ax]], ax)
                name_seed = zlib.crc32(f"{method}/{variant}/{size}/{budget}/{reference}/{ax}".encode())
                lo, hi, ci_kind = interval(runs, boot[key[ax]], ax, np.random.default_rng([seed, name_seed]))
                row.update({f"{name}_saved_mean": v, f"{name}_bound": kind, f"{name}_saved_lo": lo,
                            f"{name}_saved_hi": hi, f"{name}_ci_bound": ci_kind})
            out.append(row)
    return out


def _bracket(cells: Cells, on: Sequence[tuple[tuple[int, int], int]], flops: float, loss: float
             ) -> set[tuple[tuple[int, int], int]]:
    """The cells of a reference (``on``, of ``cells``) that a method's results are read between: the neighbours of
    its FLOPs (the loss gap) and of its test loss (the saving), or the nearest end."""
    out = set()
    for x, value in ((flops, lambda c: point(cells[c], "flops")[1]), (loss, lambda c: point(cells[c], "flops")[0])):
        below, above = [c for c in on if value(c) <= x], [c for c in on if value(c) >= x]
        out |= {max(below, key=value)} if below else set()
        out |= {min(above, key=value)} if above else set()
    return out


def method_lr(rows: Sequence[Row], variant: str, size: tuple[int, int], budget: int) -> float | None:
    """A method's tuned LR at a cell, by the baseline's rule: the LR of its seed-0 run into ``size`` at ``budget``
    with the lowest validation loss, over every LR it ran there (the target's tuned LR, and an LR check's others);
    None where seed 0 has not run."""
    sweep = [r for r in rows if r["variant"] == variant and r["method"] != "baseline" and size_of(r) == size
             and int(r["budget"]) == budget and int(r["seed"]) == CHOOSER_SEED]
    return float(min(sweep, key=lambda r: r["val_loss"])["lr"]) if sweep else None


def own_lr(rows: Sequence[Row], row: Row) -> float | None:
    """The tuned LR of ``row``'s arm at its cell: its size's baseline's (``tuned_lr``) or its method's
    (``method_lr``)."""
    size, budget = size_of(row), int(row["budget"])
    if row["method"] == "baseline":
        return tuned_lr(rows, size, budget)
    return method_lr(rows, row["variant"], size, budget)


def method_rows(rows: Sequence[Row]) -> list[Row]:
    """The runs savings are of: each method's rows at its own tuned LR (``method_lr``), without the seed that chose it
    where it chose among several LRs (as a baseline's reference never has it). A row at another LR is an LR check's
    (bench.lib.grid.Check), reported beside them, never averaged in."""
    lrs: dict[tuple, set[float]] = {}  # (variant, size, budget): the LRs seed 0 ran
    for r in rows:
        if r["method"] != "baseline" and int(r["seed"]) == CHOOSER_SEED:
            lrs.setdefault((r["variant"], size_of(r), int(r["budget"])), set()).add(float(r["lr"]))
    tuned: dict[tuple, float | None] = {}  # one read per cell and variant, not per row
    out = []
    for r in rows:
        if r["method"] == "baseline":
            continue
        key = (r["variant"], size_of(r), int(r["budget"]))
        if key not in tuned:
            tuned[key] = method_lr(rows, *key)
        chose = len(lrs.get(key, ())) > 1
        if float(r["lr"]) == tuned[key] and not (chose and int(r["seed"]) == CHOOSER_SEED):
            out.append(r)
    return out


def _envelope_curve(cells: Cells, axis: str) -> Curve:
    return [(test, cost) for _, _, cost, _, test in envelope_of(cells, axis)]


def gap_text(row: Row | None) -> str:
    """"+0.012 [-0.003, +0.027]": a savings row's test-loss gap at equal FLOPs and its interval ("" where none)."""
    if row is None or row.get("loss_gap_mean") in (None, ""):
        return ""
    return (f"{float(row['loss_gap_mean']):+.3f} [{float(row['loss_gap_lo']):+.3f}, "
            f"{float(row['loss_gap_hi']):+.3f}]")


def has_interval(row: Row) -> bool:
    """Whether a savings row's interval is one: both arms have at least two seeds (with one, the bootstrap only
    repeats it, and a zero-width "interval" says nothing about the seed-to-seed spread)."""
    return int(float(row["seeds"])) >= 2 and int(float(row["reference_seeds"])) >= 2


def excludes_zero(row: Row, axis: str = "flops") -> bool:
    """Whether a savings row's interval lies above 0 (a saving, by the rule fixed before the runs: its 95%
    interval excludes 0, over at least two seeds in each arm). Only a measured interval counts: a lower bound
    (">=", a loss below every reference) is 1 - C_run / C_ref_max, above 0 only where the method's plan spends a
    hair under the budget, so it says nothing the loss gap does not (``ends_lower``) until a larger reference
    budget turns it into a value."""
    return has_interval(row) and float(row[f"{axis}_saved_lo"]) > 0 and row[f"{axis}_ci_bound"] == "="


def ends_lower(row: Row) -> bool:
    """Whether a savings row's test-loss gap at equal FLOPs has its interval below 0 (over at least two seeds in
    each arm): the method ends lower than the reference on the same compute."""
    return has_interval(row) and row.get("loss_gap_hi") not in (None, "") and float(row["loss_gap_hi"]) < 0


def _tokens_ratio(rows: Sequence[Row], runs: Sequence[Row], size: tuple[int, int], budget: int) -> float | None:
    """Tokens the method's runs saw over those of the same-size tuned baseline at the same budget (a growing
    method runs cheaper steps, so it sees more tokens for the same FLOPs: part of the method, reported)."""
    base = tuned_runs(rows, size, budget)
    return mean(float(r["tokens"]) for r in runs) / mean(float(r["tokens"]) for r in base) if base else None


def curve(rows: Sequence[Row], axis: str, loss: str = "val_loss") -> Curve:
    """(loss, cost) at every evaluation of one run's metrics after the first step, cost on ``axis`` (flops or
    wall): the run's own curve, for savings against a baseline's curve rather than the frontier's rows."""
    return [(float(r[loss]), float(r[axis])) for r in rows if r["kind"] == "val" and r["step"] > 0 and loss in r]


def pct(value: tuple[float, str] | float | None) -> str:
    """A saving as "24.1%" (with its bound marker when it is one)."""
    if value is None:
        return "—"
    v, kind = value if isinstance(value, tuple) else (value, "=")
    return f"{'' if kind == '=' else kind + ' '}{100 * v:.1f}%"


def spread(vals: Sequence[tuple[float, str]]) -> str:
    """Savings over seeds as "mean% [min, max]", the mean a bound when any seed's is (``combine``); one seed: the
    saving alone."""
    if len(vals) == 1:
        return pct(vals[0])
    kind = combine(k for _, k in vals)
    v = [x for x, _ in vals]
    return f"{pct((mean(v), kind))} [{100 * min(v):.1f}, {100 * max(v):.1f}]"
