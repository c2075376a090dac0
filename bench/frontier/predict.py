"""Predictions written before their runs, and read against their outcomes once the runs are in.

    python -m bench.frontier.predict --grid layers --cell envelope@28098 --seeds 1,2,3,4,5
    python -m bench.frontier.predict --grid layers --cell stackbert:4x64@28098 --seeds 1,2
    python -m bench.frontier.predict --grid layers --cell baseline:2x128@28098 --seeds 1,2,3,4,5
    python -m bench.frontier.predict --grid layers --list        # every prediction beside its outcome
    python -m bench.frontier.predict --grid layers_wsd --law_grid layers --cell late_expansion:4x64@2484 --seeds 0,1,2

A prediction is of one cell nobody has run (``VARIANT:LxW@BUDGET``, the budget in steps of the grid's target;
``envelope@BUDGET`` for the best baseline of any size; ``baseline:LxW@BUDGET`` for one size trained directly), from
the rows of the smaller budgets alone (from the grid's ``law_from`` up), through the law of bench/lib/laws.py: the
mean test loss over ``--seeds`` and, for a method, the FLOPs saved against its target trained directly and against
the envelope, each with its 95% interval, the shape the envelope is predicted to choose, the law, the rows it rests
on (how many, and a digest of their keys) and the code version. It is written once to
bench/results/predictions/<grid>-<cell>.json and never again: a cell with a row, or a prediction already written, is
refused. ``--law_grid`` fits the law on another grid's rows, every budget from its ``law_from`` up (a grid that has
not run yet, on the premise that what differs from that grid, a schedule for instance, changes nothing: the
prediction is then of that premise), each shape that grid measured at the cell's budget predicted as measured there
(the law's draws kept for the spread), and the envelope is over the grid's own sizes. Committing the file before the
cell's first run is the proof that it came first (the commit order); ``--list`` (and the pages) read each prediction
against its outcome once every predicted seed has run: held where the outcome lies inside its interval.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from bench.lib import envelope, laws
from bench.lib.grid import GRIDS, ROOT, Grid, regime, step_flops_of
from bench.lib.predictions import listing, ran
from bench.lib.rows import code_version, read_rows
from bench.lib.variants import VARIANTS
from common.cli import comma_list, run_cli
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY
from common.table import format_table
from progressive.config import load_config

TOOL = "python -m bench.frontier.predict"
_CELL = re.compile(r"^(?:(?P<variant>[\w.]+):(?P<layers>\d+)x(?P<width>\d+)|envelope)@(?P<budget>\d+)$")


def parse_cell(text: str) -> dict[str, Any]:
    """{"variant", "size", "budget"} of ``VARIANT:LxW@BUDGET`` / ``envelope@BUDGET`` (variant "envelope").

    Raises:
        ValueError: naming the text and what a cell looks like, or an unknown variant.
    """
    m = _CELL.match(text.strip())
    if not m:
        raise ValueError(f"--cell {text!r}: give VARIANT:LxW@BUDGET (e.g. stackbert:4x64@28098), "
                         "baseline:LxW@BUDGET or envelope@BUDGET")
    variant = m["variant"] or "envelope"
    if variant not in ("envelope", "baseline") and variant not in VARIANTS:
        raise ValueError(f"--cell {text!r}: unknown variant {variant!r}; choose baseline, envelope or one of "
                         f"{', '.join(VARIANTS)}")
    size = (int(m["layers"]), int(m["width"])) if m["layers"] else None
    return {"variant": variant, "size": size, "budget": int(m["budget"])}


def name_of(g: Grid, cell: dict[str, Any]) -> str:
    """The prediction's file name (no suffix)."""
    where = "" if cell["size"] is None else f"-{cell['size'][0]}x{cell['size'][1]}"
    return f"{g.stem.strip('_') or 'default'}-{cell['variant']}{where}-{cell['budget']}"


def shapes_of(g: Grid, sizes: list[laws.Size]) -> dict[laws.Size, laws.Shape]:
    """Each size's parameters and training FLOPs per token (from its config: a size nobody has run has them too)."""
    cfg = load_config(ROOT / g.recipe, dict(g.overrides))
    tokens = cfg.train.batch_size * cfg.data.seq_len
    return {s: laws.Shape(float(regime(g, s)["params"]), step_flops_of(g, s) / tokens) for s in sizes}


def predict(g: Grid, rows: list[dict[str, Any]], cell: dict[str, Any], seeds: list[int],
            basis: tuple[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """The prediction of ``cell`` from ``rows`` of budgets below its own, or from ``basis`` (another grid's name and
    rows, every budget from ``g.law_from`` up; see the module docstring).

    Raises:
        ValueError: the cell has rows already, or too few smaller budgets to fit the law.
    """
    if ran(rows, cell):
        raise ValueError(f"{cell['variant']} at budget {cell['budget']} has rows already: a prediction is of a cell "
                         "nobody has run")
    budget, flops = cell["budget"], cell["budget"] * step_flops_of(g, g.target)
    used = [r for r in rows if g.law_from <= int(r["budget"]) < budget] if basis is None else \
        [r for r in basis[1] if g.law_from <= int(r["budget"])]
    sizes = sorted({envelope.size_of(r) for r in used if r["method"] == "baseline"} | set(g.baseline_sizes)
                   | ({cell["size"]} if cell["size"] else set()))
    budgets = sorted({int(r["budget"]) for r in used})
    cells = envelope.reference_cells(used, sizes, budgets)
    fitted = sorted({size for size, _ in cells} | ({cell["size"]} if cell["size"] else set()))
    p = laws.Predictor(cells, shapes_of(g, fitted), draws=laws.DRAWS)  # the envelope: over the shapes the law saw
    if basis is not None:  # the other grid's cells of this budget, as measured: the premise is that nothing changes
        p.anchor({size: fmean(float(r["test_loss"]) for r in runs) for (size, b), runs in cells.items()
                  if b == budget}, flops)
    out: dict[str, Any] = {
        WRITTEN_BY: f"growtrain {TOOL}", "grid": g.stem.strip("_") or "default", "cell": {
            "variant": cell["variant"], "target": None if cell["size"] is None else "x".join(map(str, cell["size"])),
            "budget": budget, "budget_flops": flops}, "seeds": seeds,
        "from": {"grid": (g.stem.strip("_") or "default") if basis is None else basis[0], "budgets": budgets,
                 "anchored": sorted("x".join(map(str, k)) for k in p.offsets), "rows": len(used), "cells": len(cells),
                 "rows_sha256": _digest(used), "law": p.law.text(), "seed_sd": p.seed_sd, "draws": len(p.refits)},
        "code_version": code_version()}
    # the envelope over the shapes the grid runs where its sizes are its own (a grid read off another's rows);
    # over every shape the law saw where the steps of ``more`` add shapes as the envelope asks
    over = sorted(set(g.baseline_sizes) & set(p.shapes)) if basis is not None else sorted(p.shapes)
    out["from"]["envelope_over"] = ["x".join(map(str, s)) for s in over]
    env_loss, chosen = p.envelope_draws(flops, len(seeds), over)
    if cell["variant"] == "envelope":
        share = {f"{s[0]}x{s[1]}": chosen.count(s) / len(chosen) for s in sorted(set(chosen))}
        out["predicted"] = {"test_loss": float(np.median(env_loss)), "interval": laws.interval(env_loss),
                            "shape": max(share, key=share.get), "shapes": share}
        return out
    size = cell["size"]
    if cell["variant"] == "baseline":
        loss = p.cell_draws(size, flops, len(seeds))
        out["predicted"] = {"test_loss": float(np.median(loss)), "interval": laws.interval(loss)}
        return out
    gap, se, dof, basis = _gap(p, used, cell["variant"], size, flops)
    t = np.random.default_rng([laws.SEED, 2]).standard_t(dof, size=len(p.refits)) if math.isfinite(dof) else 0.0
    loss = p.cell_draws(size, flops, len(seeds)) + gap + se * t
    same = p.saving_draws(loss, flops, lambda law: [size])
    env = p.saving_draws(loss, flops, lambda law: over)
    out["predicted"] = {"test_loss": float(np.median(loss)), "interval": laws.interval(loss),
                        "gap_to_the_target": gap, "gap_se": se, "gap_df": dof, "gap_from": basis,
                        "saving_vs_same_size": _saving(same), "saving_vs_envelope": _saving(env)}
    return out


def _saving(draws: np.ndarray) -> dict[str, Any]:
    """A saving's median and interval, and the share of draws in which the reference never reaches the loss (a
    bound: the saving is at least what the FLOPs spent allow)."""
    return {"median": float(np.median(draws)), "interval": laws.interval(draws),
            "bound_share": float(np.mean(draws >= 1.0))}


def _gap(p: laws.Predictor, rows: list[dict[str, Any]], variant: str, size: laws.Size, flops: float
         ) -> tuple[float, float, float, str]:
    """(the method's gap to its target at ``flops``, its SE, its df, how it was found). A gap is a method's test loss
    less its target's trained directly at the same budget (the tuned cell's seed mean; the law's value where that
    cell never ran), so that the law's misfit at a budget, which the target shares, stays out of the method's trend;
    the prediction adds it to the law's value of the target. Its trend over the budgets it ran into ``size``
    (``_trend``); a variant that ran nowhere there: 0, with the between-method SD of the gaps of the variants that did
    run (into any target the law knows, each at its largest budget)."""
    direct: dict[tuple[laws.Size, int], float] = {}

    def target(r: dict[str, Any]) -> float:
        key = (envelope.size_of(r), int(r["budget"]))
        if key not in direct:
            tuned = envelope.tuned_runs(rows, *key)
            direct[key] = fmean(float(t["test_loss"]) for t in tuned) if tuned else p.cell(key[0], float(r["flops"]))
        return direct[key]

    gaps: dict[tuple[str, laws.Size], dict[float, list[float]]] = {}
    for r in envelope.method_rows(rows):
        if envelope.size_of(r) in p.shapes:
            gaps.setdefault((r["variant"], envelope.size_of(r)), {}).setdefault(
                math.log(float(r["budget_flops"])), []).append(float(r["test_loss"]) - target(r))
    own = gaps.get((variant, size))
    if own:
        return _trend(gaps, (variant, size), math.log(flops))
    last = [fmean(v[max(v)]) for v in gaps.values()]
    if len(last) < 2:
        raise ValueError(f"{variant} has run at no smaller budget into {size[0]}x{size[1]}, and fewer than two "
                         "other methods have run anywhere: no gap to predict from")
    sd = float(np.std(last, ddof=1))
    return 0.0, sd, len(last) - 1, (f"none of its own: a tie with the target trained directly, on the SD of the "
                                    f"{len(last)} run methods' gaps")


def _trend(gaps: dict[tuple[str, laws.Size], dict[float, list[float]]], which: tuple[str, laws.Size], at: float
           ) -> tuple[float, float, float, str]:
    """Every method's mean gap at each budget it ran, as its own level plus a slope in log FLOPs common to all (a
    method's two or three budgets cannot estimate a slope and a spread of its own: one degree of freedom gives a
    Cauchy interval); the prediction at log FLOPs ``at`` for ``which``, its SE and degrees of freedom."""
    groups = sorted(gaps)
    points = [(groups.index(k), x, fmean(v)) for k in groups for x, v in gaps[k].items()]
    x = np.zeros((len(points), len(groups) + 1))
    for i, (k, lx, _) in enumerate(points):
        x[i, k], x[i, -1] = 1.0, lx
    y = np.array([p[2] for p in points])
    dof = len(points) - np.linalg.matrix_rank(x)
    if dof < 1:
        raise ValueError(f"too few budgets over the methods ({len(points)} points, {len(groups)} methods) to pool a "
                         "slope and a spread of their gaps")
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    s2 = float(((y - x @ beta) ** 2).sum()) / dof
    row = np.zeros(len(groups) + 1)
    row[groups.index(which)], row[-1] = 1.0, at
    se = math.sqrt(s2 * (1 + float(row @ np.linalg.pinv(x.T @ x) @ row)))
    return float(row @ beta), se, float(dof), (f"its own level over {len(gaps[which])} budget(s) and a slope common "
                                               f"to {len(groups)} methods ({beta[-1]:+.3f} a factor e of FLOPs)")


def _digest(rows: list[dict[str, Any]]) -> str:
    return hashlib.sha256("\n".join(sorted(str(r["key"]) for r in rows)).encode()).hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    """The command line (2 with one line on bad input)."""
    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="layers")
    ap.add_argument("--cell", default=None, help="VARIANT:LxW@BUDGET, baseline:LxW@BUDGET or envelope@BUDGET")
    ap.add_argument("--seeds", default="1,2,3,4,5", help="the seeds whose mean the prediction is of")
    ap.add_argument("--list", action="store_true", help="every prediction beside its outcome")
    ap.add_argument("--law_grid", choices=sorted(GRIDS), default=None,
                    help="fit the law on this grid's rows (every budget) instead of the smaller budgets of --grid's")
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"), help="folder of the grid's rows")
    args = ap.parse_args(argv)
    g = GRIDS[args.grid]
    rows = read_rows(Path(args.results) / f"frontier{g.stem}.csv")
    folder = Path(args.results) / "predictions"
    if args.list or args.cell is None:
        table, line = listing(g, rows, folder)
        print(format_table(table) if table else "no predictions yet")
        print(line)
        return 0
    cell = parse_cell(args.cell)
    seeds = comma_list("--seeds", args.seeds, int)
    path = folder / f"{name_of(g, cell)}.json"
    if path.exists():
        raise FileExistsError(f"{path} exists: a prediction is written once and never edited")
    basis = None if args.law_grid is None else \
        (args.law_grid, read_rows(Path(args.results) / f"frontier{GRIDS[args.law_grid].stem}.csv"))
    pred = predict(g, rows, cell, seeds, basis)
    atomic_write_json(path, pred)
    got = pred["predicted"]
    print(f"wrote {path}: test loss {got['test_loss']:.4f} [{got['interval'][0]:.4f}, {got['interval'][1]:.4f}]"
          + (f", FLOPs saved vs the same size {got['saving_vs_same_size']['median']:+.0%}, vs the envelope "
             f"{got['saving_vs_envelope']['median']:+.0%}" if "saving_vs_same_size" in got else "")
          + (f", shape {got['shape']}" if "shape" in got else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
