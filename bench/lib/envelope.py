"""The compute-optimal reference and the savings against it, from the frontier's rows (python -m bench.frontier).

Pure functions over rows (dicts, one per finished run: method, variant, layers, width, lr, budget, seed,
flops, wall_s, val_loss, test_loss, ...); nothing here trains. The protocol:

- **Tuned LR** of a baseline size at a budget: the learning rate whose seed-0 run has the lowest
  *validation* loss (``tuned_lr``). Seeds 1.. run at that LR only.
- **Same-size reference**: one size's tuned runs at every budget, (mean test loss over seeds, mean cost).
- **Envelope**: every size's tuned point at every budget, by cost; a point is on the envelope when its mean
  *validation* loss is below every cheaper point's (chosen on validation, never on test), and it enters as
  (mean test loss, mean cost). In FLOPs that is the best size at each budget; in wall-clock the sizes'
  costs differ at one budget, so the envelope may mix them.
- **Saving** of one run against a reference curve: 1 - C_run / C_ref(l_run), with C_ref interpolated
  piecewise linearly in (log loss, log cost) between neighbouring points. A loss below the curve's lowest
  is a lower bound (">="; the reference's largest budget is all we know it needs), above its highest an
  upper bound ("<="); never extrapolated. Wall-clock the same with ``wall_s`` as the cost.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import mean
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


# ---------------------------------------------------------------------------------------- the baseline


def size_of(row: Row) -> tuple[int, int]:
    """(layers, width) of a row's model (its target model for a method)."""
    return int(row["layers"]), int(row["width"])


def baseline_rows(rows: Sequence[Row], size: tuple[int, int], budget: int) -> list[Row]:
    """The baseline runs of ``size`` at ``budget`` (any LR, any seed)."""
    return [r for r in rows if r["method"] == "baseline" and size_of(r) == size and int(r["budget"]) == budget]


def tuned_lr(rows: Sequence[Row], size: tuple[int, int], budget: int) -> float | None:
    """The LR of the seed-0 baseline run of ``size`` at ``budget`` with the lowest validation loss (None: none)."""
    sweep = [r for r in baseline_rows(rows, size, budget) if int(r["seed"]) == 0]
    return float(min(sweep, key=lambda r: r["val_loss"])["lr"]) if sweep else None


def tuned_runs(rows: Sequence[Row], size: tuple[int, int], budget: int) -> list[Row]:
    """The baseline runs of ``size`` at ``budget`` at its tuned LR, one per seed."""
    lr = tuned_lr(rows, size, budget)
    return [r for r in baseline_rows(rows, size, budget) if lr is not None and float(r["lr"]) == lr]


def point(runs: Sequence[Row], axis: str, loss: str = "test_loss") -> tuple[float, float]:
    """(mean ``loss``, mean ``axis``) over runs (seeds)."""
    return mean(float(r[loss]) for r in runs), mean(float(r[axis]) for r in runs)


def same_size_curve(rows: Sequence[Row], size: tuple[int, int], budgets: Iterable[int], axis: str) -> Curve:
    """The tuned baseline of ``size``: (mean test loss, mean ``axis``) at every budget it ran."""
    return frontier(point(runs, axis) for b in budgets if (runs := tuned_runs(rows, size, b)))


def envelope_curve(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Iterable[int],
                   axis: str) -> Curve:
    """The lower envelope of the baseline over ``sizes`` along ``axis`` (FLOPs or wall-clock): every size's
    tuned point at every budget, by cost, kept when its *validation* loss is below every cheaper kept point's;
    returned as (test loss, cost). In FLOPs the sizes of a budget cost the same, so this is the size chosen
    on validation at each budget; in wall-clock a size may win at a cost that is another's budget."""
    return [(test, cost) for _, _, cost, _, test in envelope_points(rows, sizes, budgets, axis)]


SAME_COST = 0.01  # costs within 1% are one cost (the sizes of one FLOPs budget differ by rounding their steps)


def envelope_points(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Iterable[int],
                    axis: str) -> list[tuple[tuple[int, int], int, float, float, float]]:
    """The points of ``envelope_curve`` as (size, budget, cost, val loss, test loss), by cost."""
    cands = sorted((*point(runs, axis, "val_loss")[::-1], point(runs, axis)[0], s, b)
                   for s in sizes for b in budgets if (runs := tuned_runs(rows, s, b)))  # (cost, val, test, ...)
    kept: list[tuple[tuple[int, int], int, float, float, float]] = []
    for cost, val, test, s, b in cands:
        if kept and cost <= kept[-1][2] * (1 + SAME_COST):  # the same cost: the lower validation loss stays
            if val < kept[-1][3]:
                kept[-1] = (s, b, kept[-1][2], val, test)
        elif not kept or val < kept[-1][3]:
            kept.append((s, b, cost, val, test))
    return kept


# ---------------------------------------------------------------------------------------- the savings


def savings_rows(rows: Sequence[Row], sizes: Sequence[tuple[int, int]], budgets: Sequence[int]) -> list[Row]:
    """One row per (method variant, target size, budget, reference): savings over seeds against the envelope
    and against the tuned baseline of the target's own size (the papers' protocol), in FLOPs and wall-clock.
    Fractions; negative where the reference gets there first. ``*_bound``: "=" exact, ">=" / "<=" bounds
    (some seed's loss fell outside the reference's range), "~" mixed."""
    refs = {axis: envelope_curve(rows, sizes, budgets, axis) for axis in ("flops", "wall_s")}
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r["method"] != "baseline":
            groups.setdefault((r["method"], r["variant"], size_of(r), int(r["budget"])), []).append(r)
    out = []
    for (method, variant, size, budget), runs in sorted(groups.items()):
        for reference in ("envelope", "same_size"):
            curves = refs if reference == "envelope" else \
                {axis: same_size_curve(rows, size, budgets, axis) for axis in ("flops", "wall_s")}
            if not all(curves.values()):
                continue
            row: Row = {"method": method, "variant": variant, "target": f"{size[0]}x{size[1]}", "budget": budget,
                        "budget_flops": runs[0]["budget_flops"], "reference": reference, "seeds": len(runs),
                        "test_loss_mean": mean(float(r["test_loss"]) for r in runs),
                        "tokens_per_param": mean(float(r["tokens_per_param"]) for r in runs),
                        "tokens_vs_baseline": _tokens_ratio(rows, runs, size, budget)}
            for axis, name in (("flops", "flops"), ("wall_s", "wall")):
                got = [saving(float(r[axis]), curves[axis], float(r["test_loss"])) for r in runs]
                vals, kinds = [v for v, _ in got], {k for _, k in got}
                row.update({f"{name}_saved_mean": mean(vals), f"{name}_saved_min": min(vals),
                            f"{name}_saved_max": max(vals),
                            f"{name}_bound": kinds.pop() if len(kinds) == 1 else "~"})
            out.append(row)
    return out


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
    """Savings over seeds as "mean% [min, max]" ("~" when bounds and values mix; one seed: the saving alone)."""
    if len(vals) == 1:
        return pct(vals[0])
    kinds = {k for _, k in vals}
    kind = kinds.pop() if len(kinds) == 1 else "~"
    v = [x for x, _ in vals]
    return f"{pct((mean(v), kind))} [{100 * min(v):.1f}, {100 * max(v):.1f}]"
