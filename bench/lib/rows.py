"""The frontier's rows on disk: frontier.csv (one row per finished run; also the cache of finished runs) and
savings.csv (bench.lib.envelope.savings_rows), read and written by the frontier and the rooms that reuse its runs."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

COLUMNS = ["method", "variant", "layers", "width", "lr", "budget", "budget_flops", "seed", "steps", "tokens",
           "params", "tokens_per_param", "flops", "val_loss", "test_loss", "wall_s", "load1", "lambada_acc",
           "lambada_ppl", "wikitext2_word_ppl", "ptb_word_ppl", "key", "code_version"]
SAVINGS_COLUMNS = ["method", "variant", "target", "budget", "budget_flops", "reference", "seeds", "reference_seeds",
                   "test_loss_mean",
                   "tokens_per_param", "tokens_vs_baseline", "flops_saved_mean", "flops_bound", "flops_saved_lo",
                   "flops_saved_hi", "flops_ci_bound", "wall_saved_mean", "wall_bound", "wall_saved_lo",
                   "wall_saved_hi", "wall_ci_bound", "loss_gap_mean", "loss_gap_lo", "loss_gap_hi",
                   # the deciding rule's (bench/lib/verdict.py): Welch tests against the hull and the fitted law
                   "eligible", "gap_se", "gap_df", "gap_t_lo", "gap_t_hi", "p_saves", "p_loses", "flops_saved_t_lo",
                   "flops_saved_t_hi", "flops_t_lo_bound", "flops_t_hi_bound", "holm_n", "verdict_hull", "law_loss_gap", "law_gap_t_lo",
                   "law_gap_t_hi", "law_p_saves", "law_p_loses", "law_flops_saved", "law_flops_bound", "verdict_law",
                   "verdict"]
TEXT = {"method", "variant", "key", "code_version"}  # never numbers (a commit such as "1234567" stays text)
BEFORE_VERSIONING = "unknown (before versioning)"  # the code version of rows made before rows recorded one


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a frontier.csv (numbers as floats/ints, empty cells as None); [] when there is none."""
    if not path.is_file():
        return []
    ints = {"layers", "width", "budget", "seed", "steps", "tokens", "params", "budget_flops", "flops"}
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in r.items():
                if v == "" or k in TEXT:
                    row[k] = v if v != "" else None
                else:
                    row[k] = int(float(v)) if k in ints else float(v)
            out.append(row)
    return out


def code_version(root: Path | None = None) -> str:
    """The short git commit of the code in ``root`` (the repository by default), "+dirty" when tracked files
    outside bench/results and docs differ from it (those are what the benches write); "unknown" outside a git
    checkout or without git."""
    import subprocess

    root = root or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--", ".", ":!bench/results",
                                ":!docs"], capture_output=True, timeout=30).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty == 1 else "")


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Write ``rows`` atomically (a crash never leaves half a file)."""
    from common.io import atomic_write_text

    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else f"{r[k]:.6g}" if isinstance(r[k], float) else r[k])
                    for k in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baseline rows first, then by method, variant, size, budget, LR and seed (a stable, diffable order)."""
    return sorted(rows, key=lambda r: (r["method"] != "baseline", r["method"], r["variant"], r["layers"], r["width"],
                                       r["budget"], r["lr"], r["seed"]))
