"""bench/lib/rows.py, the frontier's rows on disk: every field of a row is in its domain or the file is refused in one
line naming the file, the line and the field; a report of no rows never replaces savings that have some.

Every test works on copies in a folder of its own (``--results``): a background run may be writing the committed
bench/results/frontier_layers.csv.
"""

import runpy
import shutil
import sys
from pathlib import Path

import pytest

import bench.pages
from bench.frontier import run as frontier
from bench.lib import grid
from bench.lib import rows as frontier_rows
from bench.pages import frontier as frontier_pages

COMMITTED = Path(grid.ROOT) / "bench" / "results"
LAYER_FILES = ("frontier_layers.csv", "savings_layers.csv", "frontier_layers.png")


def _results(tmp_path: Path) -> Path:
    """A results folder holding copies of the layer grid's committed rows, savings and figure."""
    results = tmp_path / "results"
    results.mkdir()
    for name in LAYER_FILES:
        shutil.copy(COMMITTED / name, results / name)
    return results


def _set_cell(path: Path, column: str, value: str, line: int = 3) -> None:
    """Write ``value`` into ``column`` of line ``line`` of the rows file ``path`` (line 1 is the header)."""
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[line - 1].rstrip("\n").split(",")
    cells[header.index(column)] = value
    lines[line - 1] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


def _files(results: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(results.iterdir())}


FIX = "(restore the file from git, or delete the row so the run is made again)"


@pytest.mark.parametrize("column, value, said", [
    # losses: finite and > 0 (a negative test loss moved 11 savings rows, exit 0)
    ("val_loss", "-2.9", "val_loss is -2.9; a finished run's val_loss is a number > 0"),
    ("test_loss", "0", "test_loss is 0; a finished run's test_loss is a number > 0"),
    ("test_loss", "-inf", "test_loss is -inf; a finished run's test_loss is a finite number"),
    # the learning rate: nan and inf were read as they were
    ("lr", "nan", "lr is nan; a finished run's lr is a finite number"),
    ("lr", "inf", "lr is inf; a finished run's lr is a finite number"),
    ("lr", "-0.004", "lr is -0.004; a finished run's lr is a number > 0"),
    # counts are whole numbers >= 1; a seed is one of 0 .. 2**32 - 1
    ("steps", "0", "steps is 0; a finished run's steps is a whole number >= 1"),
    ("tokens", "-30517248", "tokens is -30517248; a finished run's tokens is a whole number >= 1"),
    ("params", "91072.5", "params is 91072.5, not an integer"),
    ("flops", "inf", "flops is inf; a finished run's flops is a finite number"),
    ("layers", "0", "layers is 0; a finished run's layers is a whole number >= 1"),
    ("budget_flops", "-1", "budget_flops is -1; a finished run's budget_flops is a whole number >= 1"),
    ("seed", "-1", "seed is -1; a finished run's seed is a seed in 0 .. 2**32 - 1"),
    ("seed", "4294967296", "seed is 4294967296; a finished run's seed is a seed in 0 .. 2**32 - 1"),
    # measured and derived numbers
    ("tokens_per_param", "nan", "tokens_per_param is nan; a finished run's tokens_per_param is a finite number"),
    ("wall_s", "-771.865", "wall_s is -771.865; a finished run's wall_s is a number > 0"),
    ("load1", "-1", "load1 is -1; a finished run's load1 is a number >= 0"),
    ("lambada_acc", "1.5", "lambada_acc is 1.5; a finished run's lambada_acc is a fraction in [0, 1]"),
    ("ptb_word_ppl", "0.5", "ptb_word_ppl is 0.5; a finished run's ptb_word_ppl is a perplexity >= 1"),
    ("wikitext2_word_ppl", "nan", "wikitext2_word_ppl is nan; a finished run's wikitext2_word_ppl is a finite "
                                  "number"),
    # names: a variant of the benches, and the method it belongs to
    ("variant", "vcycle_papr", "variant is 'vcycle_papr', not one of the benches' variants (bench/lib/variants.py)"),
    ("method", "vcycle", "method is 'vcycle', but the variant 'tuned' belongs to method 'baseline'"),
    ("variant", "gstack2", "method is 'baseline', but the variant 'gstack2' belongs to method 'stacking'"),
    ("test_loss", "", "test_loss is empty; every finished run has one"),
])
def test_a_field_outside_its_domain_is_refused_naming_the_file_line_and_field(tmp_path, column, value, said):
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    _set_cell(path, column, value)
    with pytest.raises(frontier_rows.RowError) as e:
        frontier_rows.read_rows(path)
    assert str(e.value).startswith(f"{path}, line 3: {said}") and "\n" not in str(e.value)


def test_the_report_refuses_a_negative_loss_and_changes_nothing(tmp_path, capsys):
    """One negative test loss made ``--report`` rewrite 11 of savings_layers.csv's rows, exit 0."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    _set_cell(path, "test_loss", "-2.98229", line=2)
    before = _files(results)
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {path}, line 2: test_loss is -2.98229; a finished run's "
                                               f"test_loss is a number > 0 {FIX}")
    assert _files(results) == before


def test_a_field_past_the_csv_limit_is_one_line_naming_the_file_and_line(tmp_path):
    """A 200,000-character field was the csv module's own error, a traceback naming neither file nor line."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    _set_cell(path, "key", "x" * 200_000, line=4)
    with pytest.raises(frontier_rows.RowError) as e:
        frontier_rows.read_rows(path)
    assert str(e.value) == (f"{path}, line 4: a field longer than 131,072 characters: not a rows file, or a damaged "
                            "one (restore it from git)")


def test_an_empty_rows_file_is_refused_and_the_report_keeps_the_savings_it_had(tmp_path, capsys):
    """A 0-byte frontier_layers.csv read as no rows: ``--report`` exited 0 and replaced savings_layers.csv (and its
    figure) with empty ones."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    path.write_bytes(b"")
    before = _files(results)
    with pytest.raises(frontier_rows.RowError, match="empty"):
        frontier_rows.read_rows(path)
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path}: an empty file (0 bytes); a rows file starts with its header line (restore it from git, or "
        "delete it to start the grid afresh)")
    assert _files(results) == before


def test_a_report_of_no_rows_never_replaces_savings_that_have_rows(tmp_path, capsys):
    """A rows file holding only its header (or none at all) has nothing to report: the savings and the figure stay
    as they were, and the command says so in one line."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    path.write_text(path.read_text().splitlines(keepends=True)[0])  # the header alone
    before = _files(results)
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path} holds no finished run: nothing to report (savings_layers.csv and frontier_layers.png are "
        "left as they are)")
    assert _files(results) == before
    path.unlink()
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {path} does not exist: nothing to report (savings_layers.csv and frontier_layers.png are left as "
        "they are)")
    assert _files(results) == {k: v for k, v in before.items() if k != path.name}


def test_savings_with_rows_are_never_replaced_by_none(tmp_path, capsys):
    """Rows from which no saving can be read (the baseline's alone) leave savings that have rows as they are."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([lines[0], *(ln for ln in lines[1:] if ln.startswith("baseline,"))]))
    before = _files(results)
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: the rows of {path} give no saving; {results / 'savings_layers.csv'} holds ")
    assert err.endswith("and is left as it is (as is frontier_layers.png)") and "\n" not in err
    assert _files(results) == before


@pytest.mark.parametrize("name", ["frontier.csv", "frontier_layers.csv"])
def test_every_committed_row_is_in_its_domain(tmp_path, name):
    """The committed rows (425 of the first grid, 401 and more of the layer grid) are all read, none refused."""
    copy = tmp_path / name
    shutil.copy(COMMITTED / name, copy)
    lines = [ln for ln in copy.read_text().splitlines() if ln.strip()]
    rows = frontier_rows.read_rows(copy)
    assert len(rows) == len(lines) - 1 >= {"frontier.csv": 425, "frontier_layers.csv": 401}[name]


def test_the_pages_refuse_a_damaged_rows_file_in_one_line(tmp_path, monkeypatch, capsys):
    """``python -m bench.pages`` reads the same rows: a damaged file is its one line (exit 2), not a traceback."""
    results = _results(tmp_path)
    path = results / "frontier_layers.csv"
    _set_cell(path, "lr", "inf")
    monkeypatch.setattr(bench.pages, "render", lambda: frontier_pages.pages(results, tmp_path / "docs"))
    monkeypatch.setattr(sys, "argv", ["python -m bench.pages", "--check"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_module("bench.pages", run_name="__main__")
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {path}, line 3: lr is inf; a finished run's lr is a finite " \
                                              f"number {FIX}"
