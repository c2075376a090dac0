"""Predictions written before their runs (``python -m bench.frontier.predict`` writes them), read against their
outcomes: by the pages (each grid's page, the README's legend) and by the command's ``--list``."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

from bench.lib import envelope
from bench.lib.grid import GRIDS, ROOT, Grid
from bench.lib.rows import read_rows

PREDICTIONS = ROOT / "bench" / "results" / "predictions"


def ran(rows: list[dict[str, Any]], cell: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``cell`` (``{"variant", "size", "budget"}``): every baseline at its budget for the envelope, the
    size's baseline runs for ``baseline``, the variant's runs into the size otherwise."""
    if cell["variant"] == "envelope":
        return [r for r in rows if r["method"] == "baseline" and int(r["budget"]) == cell["budget"]]
    base = cell["variant"] == "baseline"
    return [r for r in rows if (r["method"] == "baseline") == base and envelope.size_of(r) == cell["size"]
            and int(r["budget"]) == cell["budget"] and (base or r["variant"] == cell["variant"])]


def outcome(g: Grid, rows: list[dict[str, Any]], pred: dict[str, Any]) -> dict[str, Any] | None:
    """The predicted cell's measured mean test loss over the predicted seeds, and whether it lies inside the
    interval (None: not every predicted seed has run)."""
    c = pred["cell"]
    size = None if c["target"] is None else tuple(int(x) for x in c["target"].split("x"))
    cell = {"variant": c["variant"], "size": size, "budget": int(c["budget"])}
    seeds = set(pred["seeds"])
    if c["variant"] == "envelope":
        sizes = sorted({envelope.size_of(r) for r in ran(rows, cell)})
        refs = envelope.reference_cells(rows, sizes, [cell["budget"]])
        if not refs:
            return None
        best = min(refs, key=lambda k: envelope.point(refs[k], "flops", "val_loss")[0])  # the grid's choice
        runs = [r for r in refs[best] if int(r["seed"]) in seeds]
        if {int(r["seed"]) for r in runs} != seeds:
            return None
        shape = f"{best[0][0]}x{best[0][1]}"
    else:
        made = envelope.method_rows(ran(rows, cell)) if c["variant"] != "baseline" else \
            envelope.tuned_runs(rows, size, cell["budget"])
        runs = [r for r in made if int(r["seed"]) in seeds]
        if {int(r["seed"]) for r in runs} != seeds:
            return None
        shape = c["target"]
    loss = fmean(float(r["test_loss"]) for r in runs)
    lo, hi = pred["predicted"]["interval"]
    return {"test_loss": loss, "held": lo <= loss <= hi, "shape": shape}


def predictions(g: Grid, folder: Path = PREDICTIONS) -> list[tuple[Path, dict[str, Any]]]:
    """The grid's predictions, by file name."""
    stem = g.stem.strip("_") or "default"
    return [(p, json.loads(p.read_text())) for p in sorted(folder.glob(f"{stem}-*.json"))]


def _pct(saving: dict[str, Any] | None) -> str:
    """"+12% [-3, +25]" of a predicted saving ("" for none; 100% is the bound where the reference never gets there)."""
    if saving is None:
        return ""
    lo, hi = saving["interval"]
    return f"{saving['median']:+.0%} [{lo * 100:+.0f}, {hi * 100:+.0f}]"


def listing(g: Grid, rows: list[dict[str, Any]], folder: Path = PREDICTIONS) -> tuple[list[dict[str, Any]], str]:
    """Every prediction beside its outcome, and the count line ("k of n finished predictions held; m wait")."""
    table, held, done = [], 0, 0
    for path, pred in predictions(g, folder):
        got = outcome(g, rows, pred)
        lo, hi = pred["predicted"]["interval"]
        said = pred["predicted"]
        row = {"prediction": path.stem, "seeds": ",".join(map(str, pred["seeds"])),
               "predicted test loss": f"{said['test_loss']:.4f} [{lo:.4f}, {hi:.4f}]",
               "FLOPs saved vs the same size": _pct(said.get("saving_vs_same_size")),
               "vs the envelope": _pct(said.get("saving_vs_envelope")) if "shape" not in said
               else f"its shape: {said['shape']}",
               "outcome": "waits for its runs" if got is None else
               f"{got['test_loss']:.4f}: {'held' if got['held'] else 'outside'}"}
        table.append(row)
        done += got is not None
        held += bool(got and got["held"])
    return table, f"{held} of {done} finished predictions held; {len(table) - done} wait for their runs"


def held(results: Path) -> str:
    """Every grid's predictions in one line: "k of n finished predictions held; m wait for their runs"."""
    k = n = total = 0
    for g in GRIDS.values():
        rows = read_rows(results / f"frontier{g.stem}.csv")
        for _, pred in predictions(g, results / "predictions"):
            got = outcome(g, rows, pred)
            total += 1
            n += got is not None
            k += bool(got and got["held"])
    return f"{k} of {n} finished predictions held; {total - n} wait for their runs"
