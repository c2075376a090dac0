"""``train.py --compare baseline,vcycle``: run methods on the same data, budget and seed; quote savings.

The first method is the reference. Its final validation loss is the target; for every method we find the
first evaluation at which its validation loss is at or below the target and read the cumulative training
FLOPs and wall-clock there (no interpolation between evaluations: the cost is rounded *up* to the next
evaluation, so a saving is never overstated by more than the evaluation spacing allows). The saving is
1 - cost(method) / cost(reference), where the reference's cost is where it first reaches its own final
loss (normally its last step). A method that never reaches the target gets no saving ("not reached").
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from common.io import atomic_write_json, atomic_write_text
from common.table import format_table
from progressive.config import ConfigError, RunConfig
from progressive.report.plots import plot_compare
from progressive.tracking import METRICS, read_metrics


def first_reach(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first val row with val_loss <= target, or None."""
    for r in rows:
        if r["kind"] == "val" and r["val_loss"] <= target:
            return r
    return None


def savings(runs: dict[str, list[dict[str, Any]]], reference: str) -> tuple[float, list[dict[str, Any]]]:
    """(target loss, one table row per run) from the runs' metrics rows; see the module docstring."""
    val = {m: [r for r in rows if r["kind"] == "val"] for m, rows in runs.items()}
    target = val[reference][-1]["val_loss"]
    ref_hit = first_reach(val[reference], target)
    table = []
    for m, rows in runs.items():
        train = [r for r in rows if r["kind"] == "train"]
        hit = first_reach(val[m], target)
        row = {"method": m, "final_val_loss": val[m][-1]["val_loss"], "final_train_loss": train[-1]["loss"],
               "steps": train[-1]["step"], "flops": float(train[-1]["flops"]), "wall_s": train[-1]["wall"],
               "flops_to_target": float(hit["flops"]) if hit else None,
               "wall_to_target_s": hit["wall"] if hit else None,
               "flops_saved_%": round(100 * (1 - hit["flops"] / ref_hit["flops"]), 2) if hit else "not reached",
               "wall_saved_%": round(100 * (1 - hit["wall"] / ref_hit["wall"]), 2) if hit else "not reached"}
        table.append(row)
    return target, table


def compare(cfg: RunConfig, methods: list[str], overwrite: bool = False) -> dict[str, Any]:
    """Train each method with ``cfg`` (only method.name changes) under outputs/<name>/<method>/, then write
    compare.json, compare.md and compare.png in outputs/<name>/ and print the table.

    Raises:
        ConfigError: fewer than two methods, or any config problem (all are checked before training).
    """
    from progressive.trainer import Trainer

    if len(methods) < 2 or len(set(methods)) != len(methods):
        raise ConfigError(f"--compare: give two or more different methods, e.g. baseline,vcycle; got {methods}")
    root = cfg.run_dir
    if root.exists() and any(root.iterdir()) and not overwrite:
        raise FileExistsError(f"{root} already exists: pass --overwrite to run the comparison again")
    subs = [replace(cfg, name=m, output_dir=str(root), method=replace(cfg.method, name=m)) for m in methods]
    trainers = [Trainer(s, overwrite=True) for s in subs]  # validates every config before any training
    for tr in trainers:
        tr.run()
    if not trainers[-1].acc.is_main_process:
        return {}
    runs = {m: read_metrics(Path(root) / m / METRICS) for m in methods}
    target, table = savings(runs, methods[0])
    result = {"reference": methods[0], "target_val_loss": target, "results": table,
              "note": "cost to first reach the reference's final validation loss (evaluated every "
                      f"{cfg.train.eval_every} steps); wall_s is training time (steps and level changes, "
                      "not evaluation or checkpoint I/O)"}
    cols = ["method", "final_val_loss", "final_train_loss", "steps", "flops", "wall_s", "flops_to_target",
            "wall_to_target_s", "flops_saved_%", "wall_saved_%"]
    text = format_table(table, cols)
    atomic_write_json(root / "compare.json", result)
    atomic_write_text(root / "compare.md", f"target: {methods[0]} final val loss {target:.4f}\n\n{text}\n")
    plot_compare(runs, root / "compare.png", target)
    print(f"\ncomparison (target = {methods[0]}'s final validation loss {target:.4f}):")
    print(text)
    print(f"outputs: {root}/compare.json, compare.md, compare.png; runs in {root}/<method>/")
    return result
