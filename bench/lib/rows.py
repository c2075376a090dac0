"""The frontier's rows on disk: frontier.csv (one row per finished run; also the cache of finished runs) and
savings.csv (bench.lib.envelope.savings_rows), read and written by the frontier and the rooms that reuse its runs."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.lib.variants import VARIANTS, method_of
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
# every finished run has these (steps, params, load1, code_version and the zero-shot scores may be left empty)
REQUIRED = ("method", "variant", "layers", "width", "lr", "budget", "budget_flops", "seed", "tokens",
            "tokens_per_param", "flops", "val_loss", "test_loss", "wall_s", "key")
BASELINE_VARIANT = "tuned"  # a baseline row's variant: its LR tuned per size and budget
# each numeric column's domain, (test, what it must be): what no finished run can have (a negative loss, a NaN
# learning rate, zero steps) is damage, refused before anything is computed from it
_COUNT = (lambda v: v >= 1, "a whole number >= 1")
_POSITIVE = (lambda v: v > 0, "a number > 0")
DOMAINS = {**{c: _COUNT for c in INTS - {"seed"}}, "seed": (lambda v: 0 <= v < 2**32, "a seed in 0 .. 2**32 - 1"),
           **{c: _POSITIVE for c in ("lr", "tokens_per_param", "val_loss", "test_loss", "wall_s")},
           "load1": (lambda v: v >= 0, "a number >= 0"), "lambada_acc": (lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
           **{c: (lambda v: v >= 1, "a perplexity >= 1") for c in ("lambada_ppl", "wikitext2_word_ppl",
                                                                    "ptb_word_ppl")}}
FIX = "(restore the file from git, or delete the row so the run is made again)"


def _number(path: Path, line: int, column: str, text: str) -> float | int:
    """A cell of a numeric column: a finite number in the column's domain (``DOMAINS``; an integer in an integer
    column), else RowError."""
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{path}, line {line}: {column} is {text!r}, not a number") from None
    if not math.isfinite(value):
        raise RowError(f"{path}, line {line}: {column} is {text}; a finished run's {column} is a finite number {FIX}")
    if column in INTS:
        if value != int(value):
            raise RowError(f"{path}, line {line}: {column} is {text}, not an integer")
        value = int(text) if text.lstrip("+-").isdigit() else int(value)  # exactly: no rounding through a float
    ok, domain = DOMAINS.get(column, (None, ""))
    if ok is not None and not ok(value):
        raise RowError(f"{path}, line {line}: {column} is {text}; a finished run's {column} is {domain} {FIX}")
    return value


def _check_names(path: Path, line: int, row: dict[str, Any]) -> None:
    """A row's variant is one of the benches' (``tuned`` for a baseline) and its method the one that variant
    belongs to, else RowError."""
    method, variant = row["method"], row["variant"]
    if variant != BASELINE_VARIANT and variant not in VARIANTS:
        raise RowError(f"{path}, line {line}: variant is {variant!r}, not one of the benches' variants "
                       f"(bench/lib/variants.py) nor {BASELINE_VARIANT!r} {FIX}")
    owner = "baseline" if variant == BASELINE_VARIANT else method_of(variant)
    if method != owner:
        raise RowError(f"{path}, line {line}: method is {method!r}, but the variant {variant!r} belongs to method "
                       f"{owner!r} {FIX}")


def _check_header(path: Path, header: list[str]) -> None:
    """Each column once, only the rows' columns, every one a finished run fills; else RowError naming it."""
    twice = [c for c in header if header.count(c) > 1]
    unknown = [c for c in header if c not in COLUMNS]
    lacking = [c for c in REQUIRED if c not in header]
    if twice or unknown or lacking:
        what = (f"names {twice[0][:60]!r} twice" if twice else f"names {unknown[0][:60]!r}, not a column of the rows"
                if unknown else f"lacks the column {lacking[0]}")
        raise RowError(f"{path}, line 1: the header {what} (a rows file's header is {','.join(COLUMNS)})")


def _records(path: Path, text: str) -> Iterator[tuple[int, list[str]]]:
    """(line, cells) of each non-blank record of ``text``, the header first; a field past the csv module's limit
    (a file that is not rows, or a damaged one) is RowError naming the line, never the module's own error."""
    reader = csv.reader(io.StringIO(text, newline=""))
    while True:
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            too_long = "field larger than field limit" in str(e)
            problem = (f"a field longer than {csv.field_size_limit():,} characters" if too_long
                       else f"not CSV ({e})")
            raise RowError(f"{path}, line {reader.line_num}: {problem}: not a rows file, or a damaged one (restore "
                           "it from git)") from None
        if values:  # (a blank line)
            yield reader.line_num, values


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a frontier.csv (numbers as floats/ints, empty cells and absent optional columns as None); []
    when there is no file, or only its header.

    Raises:
        RowError: naming the file and line: an empty (0-byte) file, text that is not UTF-8, a header that names a
            column twice, one that is not a rows column or lacks one every finished run fills, a field longer than
            the csv module reads, a row with fewer or more cells than the header, a number that does not parse or
            lies outside its column's domain (``DOMAINS``: losses, LR and wall-clock finite and > 0, counts whole
            and >= 1, a seed in 0 .. 2**32 - 1, ...), a variant that is not a bench's or a method that is not its
            variant's, a finished run's field left empty, or a key on two rows (each run is one row).
    """
    if not path.is_file():
        return []
    data = path.read_bytes()
    if not data:  # this project writes a header even with no rows: an empty file is a damaged one
        raise RowError(f"{path}: an empty file (0 bytes); a rows file starts with its header line (restore it from "
                       "git, or delete it to start the grid afresh)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    records = _records(path, text)
    _, header = next(records, (1, []))
    _check_header(path, header)
    out, keys = [], {}
    for line, values in records:
        if len(values) != len(header):
            raise RowError(f"{path}, line {line}: {len(values)} cells, the header has {len(header)} (a truncated or "
                           "garbled row)")
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        for k, v in zip(header, values):
            row[k] = None if v == "" else v if k in TEXT else _number(path, line, k, v)
        empty = [k for k in REQUIRED if row[k] is None]
        if empty:
            raise RowError(f"{path}, line {line}: {empty[0]} is empty; every finished run has one")
        _check_names(path, line, row)
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
