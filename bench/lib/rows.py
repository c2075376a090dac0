"""The frontier's rows on disk: frontier.csv (one row per finished run; also the cache of finished runs) and
savings.csv (bench.lib.envelope.savings_rows), read and written by the frontier and the rooms that reuse its runs."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.io import atomic_write_text

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
                   "flops_saved_t_hi", "flops_t_lo_bound", "flops_t_hi_bound", "holm_n", "verdict_hull", "law_loss_gap",
                   "law_gap_t_lo", "law_gap_t_hi", "law_p_saves", "law_p_loses", "law_flops_saved", "law_flops_bound",
                   "verdict_law", "verdict"]
TEXT = {"method", "variant", "key", "code_version"}  # never numbers (a commit such as "1234567" stays text)
BEFORE_VERSIONING = "unknown (before versioning)"  # the code version of rows made before rows recorded one


class RowError(ValueError):
    """A rows file that cannot be trusted; the message names the file and the line."""


INTS = {"layers", "width", "budget", "seed", "steps", "tokens", "params", "budget_flops", "flops"}
REQUIRED = ("method", "variant", "layers", "width", "lr", "budget", "seed", "val_loss", "key")  # every finished run has


def _number(path: Path, line: int, column: str, text: str) -> float | int:
    """A cell of a numeric column: a finite number (an integer in an integer column), else RowError."""
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{path}, line {line}: {column} is {text!r}, not a number") from None
    if not math.isfinite(value) and (column.endswith("loss") or column in INTS):
        raise RowError(f"{path}, line {line}: {column} is {text}; a finished run's {column} is a finite number "
                       "(restore the file from git, or delete the row so the run is made again)")
    if column in INTS:
        if value != int(value):
            raise RowError(f"{path}, line {line}: {column} is {text}, not an integer")
        return int(value)
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a frontier.csv (numbers as floats/ints, empty cells as None); [] when there is none.

    Raises:
        RowError: naming the file and line: text that is not UTF-8, a row with fewer or more cells than the
            header, a number that does not parse, a loss (or a count) that is not finite, a finished run's field
            left empty, or a key on two rows (each run is one row).
    """
    if not path.is_file():
        return []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if not header:
        return []
    if len(set(header)) != len(header) or not set(REQUIRED) <= set(header):
        raise RowError(f"{path}, line 1: the header names a column twice, or lacks one of {', '.join(REQUIRED)}")
    out, keys = [], {}
    for values in reader:
        line = reader.line_num
        if not values:
            continue  # a blank line
        if len(values) != len(header):
            raise RowError(f"{path}, line {line}: {len(values)} cells, the header has {len(header)} (a truncated or "
                           "garbled row)")
        row: dict[str, Any] = {}
        for k, v in zip(header, values):
            row[k] = None if v == "" else v if k in TEXT else _number(path, line, k, v)
        empty = [k for k in REQUIRED if row[k] is None]
        if empty:
            raise RowError(f"{path}, line {line}: {empty[0]} is empty; every finished run has one")
        if row["key"] in keys:
            raise RowError(f"{path}, line {line}: the key {row['key']} is also on line {keys[row['key']]} (a run is "
                           "one row)")
        keys[row["key"]] = line
        out.append(row)
    return out


def rows_or_exit(path: Path) -> list[dict[str, Any]]:
    """``read_rows``, for a bench's command line: a file it refuses ends the command with one line (exit 2)."""

    try:
        return read_rows(path)
    except RowError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def code_version(root: Path | None = None) -> str:
    """The short git commit of the code in ``root`` (the repository by default), "+dirty" when tracked files
    outside bench/results and docs differ from it (those are what the benches write); "unknown" outside a git
    checkout or without git."""

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


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str], exact: bool = False) -> None:
    """Write ``rows`` atomically (a crash never leaves half a file), floats with 6 significant digits, or, with
    ``exact``, every digit (``repr``: a page rendered from the file reads the very values it was computed from)."""

    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else (repr(r[k]) if exact else f"{r[k]:.6g}")
                        if isinstance(r[k], float) else r[k]) for k in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, buf.getvalue())


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Baseline rows first, then by method, variant, size, budget, LR and seed (a stable, diffable order)."""
    return sorted(rows, key=lambda r: (r["method"] != "baseline", r["method"], r["variant"], r["layers"], r["width"],
                                       r["budget"], r["lr"], r["seed"]))
