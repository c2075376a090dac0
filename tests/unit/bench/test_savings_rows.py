"""bench/lib/rows.py's ``read_savings``: a savings<stem>.csv (each method's saving and the rule's verdict) is read by
one reader, every field in its domain, or refused in one line naming the file, the line and the field; the pages
(``python -m bench.pages``) and the frontier's tracker runs read it through that reader.

Every test works on copies in a folder of its own: a background run may be writing bench/results/.
"""

import runpy
import shutil
import sys
from pathlib import Path

import pytest

import bench.pages
from bench.frontier.report import tracker_entries
from bench.lib import grid
from bench.lib import rows as bench_rows
from bench.lib import verdict as rule
from bench.pages import frontier as frontier_pages
from bench.pages import results as results_pages

COMMITTED = Path(grid.ROOT) / "bench" / "results"
FIX = "(restore the file from git, or write it again from its rows: python -m bench.frontier --grid layers --report)"


def _results(tmp_path: Path) -> Path:
    """A results folder holding copies of the layer grid's committed rows and savings."""
    results = tmp_path / "results"
    results.mkdir()
    for name in ("frontier_layers.csv", "savings_layers.csv", "frontier_runs_layers.json"):
        shutil.copy(COMMITTED / name, results / name)
    _eligible_first(results / "savings_layers.csv")
    return results


def _eligible_first(path: Path) -> None:
    """Move the first eligible envelope row to line 2 and the first eligible same-size row to line 3, the rest after
    in their order: the damage cases edit those lines, and which rows are eligible changes as the grid's seeds land."""
    header, *rows = path.read_text().splitlines(keepends=True)
    names = header.rstrip("\n").split(",")

    def first(reference: str) -> int:
        return next(i for i, r in enumerate(rows) if (cells := dict(zip(names, r.rstrip("\n").split(","))))[
            "reference"] == reference and cells["eligible"] == "1")

    envelope = rows.pop(first("envelope"))
    same_size = rows.pop(first("same_size"))
    path.write_text("".join([header, envelope, same_size, *rows]))


def _set_cell(path: Path, column: str, value: str, line: int = 2) -> None:
    """Write ``value`` into ``column`` of line ``line`` of the CSV ``path`` (line 1 is the header; the committed
    savings file ``_results`` writes has an eligible envelope row on line 2, an eligible same-size row on line 3)."""
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[line - 1].rstrip("\n").split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


def _cell(path: Path, column: str, line: int) -> str:
    lines = path.read_text().splitlines()
    return lines[line - 1].split(",")[lines[0].split(",").index(column)]


@pytest.mark.parametrize("column, value, line, said", [
    # numbers in their domain: a p-value is a probability, a saving below 100%, counts whole and >= 1
    ("p_saves", "1.5", 2, "p_saves is 1.5; a savings row's p_saves is a probability in [0, 1]"),
    ("flops_saved_mean", "nan", 2, "flops_saved_mean is nan; a savings row's flops_saved_mean is a finite number"),
    ("flops_saved_mean", "1.2", 2, "flops_saved_mean is 1.2; a savings row's flops_saved_mean is a fraction saved "
                                   "< 1 (1 - cost / the reference's cost)"),
    ("wall_saved_hi", "inf", 3, "wall_saved_hi is inf; a savings row's wall_saved_hi is a finite number"),
    ("seeds", "0", 2, "seeds is 0; a savings row's seeds is a whole number >= 1"),
    ("budget", "2484.5", 2, "budget is 2484.5, not an integer"),
    ("test_loss_mean", "-2.8", 2, "test_loss_mean is -2.8; a savings row's test_loss_mean is a number > 0"),
    ("gap_se", "-0.01", 2, "gap_se is -0.01; a savings row's gap_se is a number >= 0"),
    ("eligible", "2", 2, "eligible is 2; a savings row's eligible is 0 or 1"),
    ("loss_gap_lo", "0.0o4", 2, "loss_gap_lo is '0.0o4', not a number"),
    # text in its vocabulary
    ("reference", "envelop", 2, "reference is 'envelop', not one of envelope, same_size"),
    ("verdict", "probably saves", 2, "verdict is 'probably saves', not one of saves, loses, no evidence either way, "
                                     "not eligible"),
    ("flops_bound", "==", 2, "flops_bound is '==', not one of =, >=, <=, ~"),
    ("target", "4x", 2, "target is '4x', not a size LAYERSxWIDTH"),
    ("variant", "apollo_author", 2, "variant is 'apollo_author', not one of the benches' variants "
                                    "(bench/lib/variants.py)"),
    ("method", "{other_method}", 2, "method is '{other_method}', but the variant '{variant}' belongs to method "
                                    "'{method}'"),
    # what every row has, and what the rule's columns say together
    ("flops_saved_lo", "", 2, "flops_saved_lo is empty; every savings row has one"),
    ("p_saves", "", 2, "p_saves is empty; an eligible row (eligible 1) has the rule's test in full"),
    ("law_p_loses", "", 2, "law_p_loses is empty but law_loss_gap is set: the law's columns are all set or all empty"),
    ("verdict", "{other_verdict}", 2, "verdict is '{other_verdict}' but verdict_hull is '{verdict_hull}' (the "
                                      "verdict is the hull's test's, or the same size's)"),
])
def test_a_savings_field_outside_its_domain_is_refused_naming_the_file_line_and_field(tmp_path, column, value, line,
                                                                                       said):
    path = _results(tmp_path) / "savings_layers.csv"
    row = {c: _cell(path, c, line) for c in ("variant", "method", "verdict_hull")}
    row["other_method"] = "apollo" if row["method"] != "apollo" else "vcycle"
    row["other_verdict"] = rule.SAVES if row["verdict_hull"] != rule.SAVES else rule.LOSES
    value, said = value.format(**row), said.format(**row)
    _set_cell(path, column, value, line)
    with pytest.raises(bench_rows.RowError) as e:
        bench_rows.read_savings(path)
    assert str(e.value).startswith(f"{path}, line {line}: {said}") and "\n" not in str(e.value)


def test_a_verdict_of_an_ineligible_row_and_a_law_on_a_same_size_row_are_refused(tmp_path):
    """The rule decides nothing of a one-seed row ("not eligible"), and tests the law against the envelope only."""
    path = _results(tmp_path) / "savings_layers.csv"
    rows = bench_rows.read_savings(path)
    line = 2 + next(i for i, r in enumerate(rows) if r["eligible"] == 0)
    _set_cell(path, "verdict", "saves", line)
    with pytest.raises(bench_rows.RowError, match=f", line {line}: verdict is 'saves' but eligible is 0"):
        bench_rows.read_savings(path)
    (tmp_path / "2").mkdir()
    path = _results(tmp_path / "2") / "savings_layers.csv"
    for column in ("law_loss_gap", "law_gap_t_lo", "law_gap_t_hi", "law_p_saves", "law_p_loses", "law_flops_saved",
                   "law_flops_bound"):
        _set_cell(path, column, _cell(path, column, 2), line=3)
    with pytest.raises(bench_rows.RowError) as e:
        bench_rows.read_savings(path)
    assert str(e.value) == (f"{path}, line 3: law_loss_gap is set on a same_size row; the law is tested against the "
                            f"envelope only {FIX}")


@pytest.mark.parametrize("damage, said", [
    ("empty", ": an empty file (0 bytes); a savings file starts with its header line " + FIX),
    ("short_row", f", line 4: 9 cells, the header has {len(bench_rows.SAVINGS_COLUMNS)} (a truncated or garbled row)"),
    ("long_field", ", line 4: a field longer than 131,072 characters: not a rows file, or a damaged one (restore it "
                   "from git)"),
    ("unknown_column", ", line 1: the header names 'val_loss', not a column of the savings (a savings file's header "
                       "is method,variant,target,"),
    ("duplicate_cell", ", line 3: the cell {variant} {target} at {budget} against envelope is also on line 2 (a cell "
                       "has one row for each reference)"),
])
def test_a_damaged_savings_file_is_refused_in_one_line(tmp_path, damage, said):
    path = _results(tmp_path) / "savings_layers.csv"
    said = said.format(**{c: _cell(path, c, 2) for c in ("variant", "target", "budget")})
    lines = path.read_text().splitlines(keepends=True)
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "short_row":
        lines[3] = ",".join(lines[3].split(",")[:9]) + "\n"
    elif damage == "long_field":
        lines[3] = "x" * 200_000 + lines[3]
    elif damage == "unknown_column":
        lines[0] = lines[0].replace("test_loss_mean", "val_loss")
    elif damage == "duplicate_cell":
        lines[2] = lines[1]
    if damage != "empty":
        path.write_text("".join(lines))
    with pytest.raises(bench_rows.RowError) as e:
        bench_rows.read_savings(path)
    assert str(e.value).startswith(f"{path}{said}") and "\n" not in str(e.value)


@pytest.mark.parametrize("name, at_least", [("savings.csv", 174), ("savings_layers.csv", 38)])
def test_every_committed_savings_row_is_read_in_its_domain(tmp_path, name, at_least):
    copy = tmp_path / name
    shutil.copy(COMMITTED / name, copy)
    lines = [ln for ln in copy.read_text().splitlines() if ln.strip()]
    rows = bench_rows.read_savings(copy)
    assert len(rows) == len(lines) - 1 >= at_least
    first = rows[0]
    assert (first["budget"], first["seeds"], first["eligible"]) == tuple(int(_cell(copy, c, 2)) for c in (
        "budget", "seeds", "eligible"))
    assert first["p_saves"] == float(_cell(copy, "p_saves", 2)) and first["verdict"] == _cell(copy, "verdict", 2)
    assert bench_rows.read_savings(tmp_path / "absent.csv") == []


def test_the_savings_reader_knows_the_rules_verdicts():
    assert set(bench_rows.VERDICTS) == {rule.SAVES, rule.LOSES, rule.NONE, rule.INELIGIBLE}


def _damaged(tmp_path: Path) -> tuple[Path, str]:
    """A results folder whose savings_layers.csv has a p-value of 1.5 on line 2, and the line that names it."""
    results = _results(tmp_path)
    path = results / "savings_layers.csv"
    _set_cell(path, "p_saves", "1.5")
    return results, f"{path}, line 2: p_saves is 1.5; a savings row's p_saves is a probability in [0, 1] {FIX}"


READERS = {  # every page and tool that reads a savings file, from that file
    "frontier page": lambda p: frontier_pages.page(grid.LAYERS, p.parent),
    "results: read_frontier": lambda p: results_pages.read_frontier(p, "4x64"),
    "results: envelope_targets": results_pages.envelope_targets,
    "results: the table's rows": lambda p: results_pages._savings(p, "4x64", ["apollo_authors"]),
    "results: the layer grid's verdict": results_pages._layers_verdict,
    "tracker runs": lambda p: tracker_entries(grid.LAYERS, [], p.parent, p.parent / "runs"),
}


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_of_a_savings_file_refuses_a_damaged_one_naming_the_line(tmp_path, reader):
    """A p-value of 1.5 was rendered as it was (the pages and W&B read the file with csv.DictReader, unchecked)."""
    results, said = _damaged(tmp_path)
    with pytest.raises(bench_rows.RowError) as e:
        READERS[reader](results / "savings_layers.csv")
    assert str(e.value) == said.removeprefix("error: ")


def test_the_results_pages_read_the_frontier_rows_through_the_checked_reader(tmp_path, monkeypatch):
    """baseline_sizes and the layer grid's shapes read frontier*.csv with csv.DictReader: a layers of -2 was a size."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    _set_cell(path, "layers", "-2")
    said = f"{path}, line 2: layers is -2; a finished run's layers is a whole number >= 1"
    with pytest.raises(bench_rows.RowError, match=f"^{said}"):
        results_pages.baseline_sizes(path)
    monkeypatch.setattr(results_pages, "RESULTS", results)
    with pytest.raises(bench_rows.RowError, match=f"^{said}"):
        results_pages._shapes()


def test_python_m_bench_pages_refuses_a_damaged_savings_file_in_one_line(tmp_path, monkeypatch, capsys):
    results, said = _damaged(tmp_path)
    monkeypatch.setattr(bench.pages, "render", lambda: frontier_pages.pages(results, tmp_path / "docs"))
    monkeypatch.setattr(sys, "argv", ["python -m bench.pages", "--check"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("bench.pages", run_name="__main__")
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {said}"
