"""The frontier's rows on disk: frontier.csv (one row per finished run; also the cache of finished runs) and
savings.csv (bench.lib.envelope.savings_rows with bench.lib.verdict.decide's columns), read and written by the frontier
and the rooms that reuse its runs. Each is read by one reader (``read_rows``, ``read_savings``) that checks every
field against its domain, so no page or report computes from a damaged file."""

from __future__ import annotations

import csv
import io
import math
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
                   # the deciding rule's (bench/lib/verdict.py): the Welch test against the reference at every LR
                   # each arm's seed 0 ran (lrs_*: how many tests), the smallest saving it could detect (80% power),
                   # the fitted law's test (shown only)
                   "eligible", "gap_se", "gap_df", "gap_t_lo", "gap_t_hi", "p_saves", "p_loses", "flops_saved_t_lo",
                   "flops_saved_t_hi", "flops_t_lo_bound", "flops_t_hi_bound", "lrs_saves", "lrs_loses", "mde_gap",
                   "mde_flops_saved", "mde_flops_bound", "holm_n",
                   # the interval beside a verdict: each end at the one-sided level Holm compared that direction's p
                   # with (verdict.holm_levels)
                   "flops_saved_holm_lo", "flops_saved_holm_hi", "flops_holm_lo_bound", "flops_holm_hi_bound",
                   "verdict_hull", "law_loss_gap",
                   "law_gap_t_lo", "law_gap_t_hi", "law_p_saves", "law_p_loses", "law_flops_saved", "law_flops_bound",
                   "verdict_law", "verdict"]
TEXT = {"method", "variant", "key", "code_version"}  # never numbers (a commit such as "1234567" stays text)
BEFORE_VERSIONING = "unknown (before versioning)"  # the code version of rows made before rows recorded one


class RowError(ValueError):
    """A rows file that cannot be trusted; the message names the file and the line."""


@dataclass(frozen=True)
class Layout:
    """What one kind of rows file holds, for its reader: its columns, those that are text and those that are whole
    numbers, those every row fills, each numeric column's domain (test, what it must be) and each text column's
    choices; ``what`` and ``each`` name the file and its rows in messages."""

    what: str
    each: str
    columns: tuple[str, ...]
    text: frozenset[str]
    ints: frozenset[str]
    required: tuple[str, ...]
    domains: dict[str, tuple[Callable[[float], bool], str]]
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)


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
ROWS = Layout("rows", "finished run", tuple(COLUMNS), frozenset(TEXT), frozenset(INTS), REQUIRED, DOMAINS)

# savings<stem>.csv: every row has the saving's columns (envelope.savings_rows) and the rule's eligibility and
# verdicts (verdict.decide); the loss gap, the rule's test and the law's test come whole or not at all
MARKS = ("=", ">=", "<=", "~")  # bench/lib/envelope.py's kinds of a value: exact, a lower or upper bound, neither
# bench/lib/verdict.py's words (SAVES, LOSES, NONE, INELIGIBLE); it imports this module, so they are written here,
# and tests/unit/bench/test_savings_rows.py pins that the two agree
VERDICTS = ("saves", "loses", "no evidence either way", "not eligible")
SAVES, LOSES, INELIGIBLE = VERDICTS[0], VERDICTS[1], VERDICTS[3]
REFERENCES = ("envelope", "same_size")
LOSS_GAP = ("loss_gap_mean", "loss_gap_lo", "loss_gap_hi")
TEST = ("gap_se", "gap_df", "gap_t_lo", "gap_t_hi", "p_saves", "p_loses", "flops_saved_t_lo", "flops_saved_t_hi",
        "flops_t_lo_bound", "flops_t_hi_bound")
LAW = ("law_loss_gap", "law_gap_t_lo", "law_gap_t_hi", "law_p_saves", "law_p_loses", "law_flops_saved",
       "law_flops_bound")
HOLM = ("flops_saved_holm_lo", "flops_saved_holm_hi", "flops_holm_lo_bound", "flops_holm_hi_bound")
GROUPS = {"the loss gap's": LOSS_GAP, "the rule's test's": TEST, "the law's": LAW, "Holm's interval's": HOLM}
_BOUNDS = tuple(c for c in SAVINGS_COLUMNS if c.endswith("_bound"))  # each the kind of a value beside it (MARKS)
_SAVED = (lambda v: v < 1, "a fraction saved < 1 (1 - cost / the reference's cost)")
_PROBABILITY = (lambda v: 0 <= v <= 1, "a probability in [0, 1]")
SAVINGS = Layout(
    "savings", "savings row", tuple(SAVINGS_COLUMNS),
    frozenset({"method", "variant", "target", "reference", *_BOUNDS, "verdict_hull", "verdict_law", "verdict"}),
    frozenset({"budget", "budget_flops", "seeds", "reference_seeds", "eligible", "holm_n"}),
    ("method", "variant", "target", "budget", "budget_flops", "reference", "seeds", "reference_seeds",
     "test_loss_mean", "tokens_per_param", "flops_saved_mean", "flops_bound", "flops_saved_lo", "flops_saved_hi",
     "flops_ci_bound", "wall_saved_mean", "wall_bound", "wall_saved_lo", "wall_saved_hi", "wall_ci_bound",
     "eligible", "verdict_hull", "verdict"),
    {**{c: _COUNT for c in ("budget", "budget_flops", "seeds", "reference_seeds", "holm_n")},
     "eligible": (lambda v: v in (0, 1), "0 or 1"), "gap_se": (lambda v: v >= 0, "a number >= 0"),
     **{c: _POSITIVE for c in ("test_loss_mean", "tokens_per_param", "tokens_vs_baseline", "gap_df")},
     **{c: _SAVED for c in ("flops_saved_mean", "flops_saved_lo", "flops_saved_hi", "wall_saved_mean",
                            "wall_saved_lo", "wall_saved_hi", "flops_saved_t_lo", "flops_saved_t_hi",
                            "flops_saved_holm_lo", "flops_saved_holm_hi", "law_flops_saved")},
     **{c: _PROBABILITY for c in ("p_saves", "p_loses", "law_p_saves", "law_p_loses")}},  # the loss gaps: finite
    {"reference": REFERENCES, **{c: MARKS for c in _BOUNDS}, "verdict_hull": VERDICTS, "verdict": VERDICTS,
     "verdict_law": VERDICTS[:3]})
_SIZE = re.compile(r"[1-9][0-9]*x[1-9][0-9]*")  # a target, LAYERSxWIDTH


def _shown(text: str) -> str:
    """``text`` as a message quotes it: whole up to 60 characters, else its start and its length."""
    return repr(text) if len(text) <= 60 else f"{text[:40]!r}... ({len(text):,} characters)"


def _number(path: Path, line: int, column: str, text: str, layout: Layout = ROWS, fix: str = FIX) -> float | int:
    """A cell of a numeric column: a finite number in the column's domain (``layout.domains``; an integer in an
    integer column), else RowError."""
    whose = f"a {layout.each}'s {column}"
    try:
        value = float(text)
    except ValueError:
        raise RowError(f"{path}, line {line}: {column} is {_shown(text)}, not a number") from None
    if not math.isfinite(value):
        raise RowError(f"{path}, line {line}: {column} is {text}; {whose} is a finite number {fix}")
    if column in layout.ints:
        if value != int(value):
            raise RowError(f"{path}, line {line}: {column} is {text}, not an integer")
        value = int(text) if text.lstrip("+-").isdigit() else int(value)  # exactly: no rounding through a float
    ok, domain = layout.domains.get(column, (None, ""))
    if ok is not None and not ok(value):
        raise RowError(f"{path}, line {line}: {column} is {text}; {whose} is {domain} {fix}")
    return value


def _check_names(path: Path, line: int, row: dict[str, Any], fix: str = FIX, baseline: bool = True) -> None:
    """A row's variant is one of the benches' (``tuned`` for a baseline, where ``baseline``) and its method the one
    that variant belongs to, else RowError."""
    method, variant = row["method"], row["variant"]
    if (variant != BASELINE_VARIANT or not baseline) and variant not in VARIANTS:
        nor = f" nor {BASELINE_VARIANT!r}" if baseline else ""
        raise RowError(f"{path}, line {line}: variant is {_shown(variant)}, not one of the benches' variants "
                       f"(bench/lib/variants.py){nor} {fix}")
    owner = "baseline" if variant == BASELINE_VARIANT else method_of(variant)
    if method != owner:
        raise RowError(f"{path}, line {line}: method is {_shown(method)}, but the variant {variant!r} belongs to "
                       f"method {owner!r} {fix}")


def _check_header(path: Path, header: list[str], layout: Layout = ROWS) -> None:
    """Each column once, only the layout's columns, every one its rows fill; else RowError naming it."""
    twice = [c for c in header if header.count(c) > 1]
    unknown = [c for c in header if c not in layout.columns]
    lacking = [c for c in layout.required if c not in header]
    if twice or unknown or lacking:
        what = (f"names {twice[0][:60]!r} twice" if twice else
                f"names {unknown[0][:60]!r}, not a column of the {layout.what}" if unknown else
                f"lacks the column {lacking[0]}")
        raise RowError(f"{path}, line 1: the header {what} (a {layout.what} file's header is "
                       f"{','.join(layout.columns)})")
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


def _read(path: Path, layout: Layout, fix: str, empty_fix: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, row) of each record of the rows file ``path`` of ``layout``: the header checked, every cell counted,
    each number parsed in its domain, each text with choices one of them, and every required field filled (an
    absent optional column, an empty cell: None); RowError naming the file and line otherwise."""
    data = path.read_bytes()
    if not data:  # this project writes a header even with no rows: an empty file is a damaged one
        raise RowError(f"{path}: an empty file (0 bytes); a {layout.what} file starts with its header line "
                       f"{empty_fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RowError(f"{path}: not UTF-8 text (at byte {e.start})") from None
    records = _records(path, text)
    _, header = next(records, (1, []))
    _check_header(path, header, layout)
    for line, values in records:
        if len(values) != len(header):
            raise RowError(f"{path}, line {line}: {len(values)} cells, the header has {len(header)} (a truncated or "
                           "garbled row)")
        row: dict[str, Any] = dict.fromkeys(layout.columns)
        for k, v in zip(header, values):
            row[k] = None if v == "" else v if k in layout.text else _number(path, line, k, v, layout, fix)
            if row[k] is not None and k in layout.choices and v not in layout.choices[k]:
                raise RowError(f"{path}, line {line}: {k} is {_shown(v)}, not one of {', '.join(layout.choices[k])} "
                               f"{fix}")
        empty = [k for k in layout.required if row[k] is None]
        if empty:
            raise RowError(f"{path}, line {line}: {empty[0]} is empty; every {layout.each} has one {fix}")
        yield line, row


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
    out, keys = [], {}
    for line, row in _read(path, ROWS, FIX, "(restore it from git, or delete it to start the grid afresh)"):
        _check_names(path, line, row)
        if row["key"] in keys:
            raise RowError(f"{path}, line {line}: the key {row['key']} is also on line {keys[row['key']]} (a run is "
                           "one row)")
        keys[row["key"]] = line
        out.append(row)
    return out


def _savings_fix(path: Path) -> str:
    """What to do about a damaged savings<stem>.csv: the command that writes it again from its grid's rows."""
    stem = path.stem.removeprefix("savings").lstrip("_")
    grid = f" --grid {stem}" if stem else ""
    return f"(restore the file from git, or write it again from its rows: python -m bench.frontier{grid} --report)"


def _check_saving(path: Path, line: int, row: dict[str, Any], fix: str) -> None:
    """What a savings row's columns say together, as ``verdict.decide`` writes them: a variant and its method, a
    target size; an eligible row has the rule's test whole, the loss gap, the test and the law come whole or not at
    all, the law only against the envelope; an ineligible row's verdicts are "not eligible" and no other row's; a
    saving or a loss is the verdict of each of the row's tests. RowError naming the field otherwise."""
    at = f"{path}, line {line}:"
    _check_names(path, line, row, fix, baseline=False)
    if not _SIZE.fullmatch(row["target"]):
        raise RowError(f"{at} target is {_shown(row['target'])}, not a size LAYERSxWIDTH {fix}")
    if row["eligible"] == 1 and (empty := [c for c in (*TEST, "holm_n") if row[c] is None]):
        raise RowError(f"{at} {empty[0]} is empty; an eligible row (eligible 1) has the rule's test in full {fix}")
    for name, columns in GROUPS.items():
        given = [c for c in columns if row[c] is not None]
        if given and len(given) < len(columns):
            empty = next(c for c in columns if row[c] is None)
            raise RowError(f"{at} {empty} is empty but {given[0]} is set: {name} columns are all set or all empty "
                           f"{fix}")
    law = [c for c in (*LAW, "verdict_law") if row[c] is not None]
    if row["reference"] != "envelope" and law:
        raise RowError(f"{at} {law[0]} is set on a {row['reference']} row; the law is tested against the envelope "
                       f"only {fix}")
    for column in ("verdict_hull", "verdict"):
        if (row[column] == INELIGIBLE) != (row["eligible"] == 0):
            raise RowError(f"{at} {column} is {row[column]!r} but eligible is {row['eligible']} (the rule decides "
                           f"nothing of a row it does not test, {INELIGIBLE!r}, and only of those) {fix}")
    if row["verdict"] != row["verdict_hull"]:  # the law's test is shown beside it and decides nothing
        raise RowError(f"{at} verdict is {row['verdict']!r} but verdict_hull is {row['verdict_hull']!r} (the verdict "
                       f"is the hull's test's, or the same size's) {fix}")


def read_savings(path: Path) -> list[dict[str, Any]]:
    """The rows of a savings<stem>.csv (``SAVINGS_COLUMNS``; numbers as floats/ints, empty cells and absent
    optional columns as None); [] when there is no file, or only its header. Every reader of a savings file (the
    pages, the frontier's tracker runs) reads it here.

    Raises:
        RowError: naming the file and line (and what writes the file again): what ``read_rows`` refuses of a rows
            file (an empty file, a header, a field past the csv limit, a cell count, a number that does not parse),
            a field outside its domain (``SAVINGS.domains``: counts whole and >= 1, savings finite and < 1,
            p-values in [0, 1], losses > 0, every gap finite; ``SAVINGS.choices``: a reference, a bound's kind, a
            verdict of the rule), a saving's field left empty, columns that disagree (``_check_saving``), or a
            cell (variant, target, budget) with two rows for one reference.
    """
    if not path.is_file():
        return []
    fix = _savings_fix(path)
    out, cells = [], {}
    for line, row in _read(path, SAVINGS, fix, fix):
        _check_saving(path, line, row, fix)
        cell = (row["variant"], row["target"], row["budget"], row["reference"])
        if cell in cells:
            raise RowError(f"{path}, line {line}: the cell {cell[0]} {cell[1]} at {cell[2]} against {cell[3]} is also "
                           f"on line {cells[cell]} (a cell has one row for each reference) {fix}")
        cells[cell] = line
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
