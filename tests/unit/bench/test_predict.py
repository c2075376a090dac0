"""Predictions before their runs (bench/lib/laws.py, bench/frontier/predict.py, bench/lib/predictions.py): the law
over shape and budget recovers a known truth, a prediction's interval covers the truth it was drawn from and names
the envelope's shape, an outcome is read as held or outside, and a prediction is written once, only of a cell nobody
has run."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from bench.frontier import predict as P
from bench.lib import grid, laws
from bench.lib import predictions as R

TRUTH = (1.8, 30.0, 0.3, 3000.0, 0.45, 0.05)  # E, A, alpha, B, beta, g
SIZES = [(1, 32), (2, 32), (4, 32), (2, 16), (4, 16), (1, 16)]
G = dataclasses.replace(grid.SMOKE, sizes=tuple(SIZES), target=(2, 32), budgets=(40, 80, 160), law_from=0,
                        stem="_test")


@pytest.fixture(scope="module")
def shapes():
    return P.shapes_of(G, SIZES)


@pytest.fixture(autouse=True)
def fewer_draws(monkeypatch):
    monkeypatch.setattr(laws, "DRAWS", 80)  # the intervals' percentiles settle well before the 400 the command draws


def _true(size, shape, flops):
    return laws._model((shape.params, flops / shape.flops_per_token, size[0]), *TRUTH)


def _rows(shapes, budgets=(40, 80, 160), sd=0.004, seed=0, method=None):
    """Baseline rows drawn from TRUTH: each cell's seed-0 sweep of one LR, and seeds 1-3 there."""
    rng = np.random.default_rng(seed)
    step = P.step_flops_of(G, G.target)
    out = []
    for size in SIZES:
        for b in budgets:
            flops = b * step
            y = _true(size, shapes[size], flops)
            for s in range(4):
                test = y + rng.normal(0, sd)
                out.append({"method": "baseline", "variant": "tuned", "layers": size[0], "width": size[1],
                            "lr": 1e-3, "budget": b, "budget_flops": flops, "seed": s, "flops": flops,
                            "tokens": round(flops / shapes[size].flops_per_token), "val_loss": test, "test_loss": test,
                            "key": f"{size}{b}{s}", "wall_s": 1.0, "tokens_per_param": 1.0})
    return out


def test_the_law_over_shape_and_budget_recovers_a_known_truth(shapes):
    step = P.step_flops_of(G, G.target)
    points = [(s, shapes[s].params, b * step / shapes[s].flops_per_token, _true(s, shapes[s], b * step))
              for s in SIZES for b in (40, 80, 160, 320)]
    law = laws.fit(points)
    assert law is not None and law.resid_sd < 1e-4
    for s, n, d, y in points:
        assert law.loss(s, n, d) == pytest.approx(y, abs=1e-4)
    assert law.g == pytest.approx(TRUTH[5], abs=0.01)  # the depth term is found, not absorbed
    assert law.tokens_for((2, 32), shapes[(2, 32)].params, points[1][3]) == pytest.approx(points[1][2], rel=0.05)


def test_a_prediction_covers_the_truth_and_the_envelope_names_its_shape(shapes):
    rows = _rows(shapes)
    step = P.step_flops_of(G, G.target)
    pred = P.predict(G, rows, {"variant": "baseline", "size": (2, 32), "budget": 320}, [1, 2, 3])
    lo, hi = pred["predicted"]["interval"]
    truth = _true((2, 32), shapes[(2, 32)], 320 * step)
    assert lo <= truth <= hi and hi - lo < 0.1
    env = P.predict(G, rows, {"variant": "envelope", "size": None, "budget": 320}, [1, 2, 3])
    best = min(SIZES, key=lambda s: _true(s, shapes[s], 320 * step))
    assert env["predicted"]["shape"] == f"{best[0]}x{best[1]}"
    assert env["from"]["budgets"] == [40, 80, 160] and env["from"]["rows"] == len(rows)
    assert env["predicted"]["interval"][0] <= _true(best, shapes[best], 320 * step) <= env["predicted"]["interval"][1]


def test_an_outcome_inside_its_interval_holds_and_one_outside_does_not(shapes):
    rows = _rows(shapes)
    pred = P.predict(G, rows, {"variant": "baseline", "size": (2, 32), "budget": 320}, [1, 2, 3])
    assert R.outcome(G, rows, pred) is None  # its runs have not come
    later = _rows(shapes, budgets=(320,), seed=1)
    assert R.outcome(G, rows + later, pred)["held"]
    off = [dict(r, test_loss=r["test_loss"] + 0.5, val_loss=r["val_loss"] + 0.5) for r in later]
    assert not R.outcome(G, rows + off, pred)["held"]
    partial = [r for r in later if r["seed"] != 3 or r["layers"] != 2 or r["width"] != 32]
    assert R.outcome(G, rows + partial, pred) is None  # seed 3 of the cell is missing


def test_a_method_is_predicted_from_its_gap_and_a_new_variant_as_a_tie_with_its_target(shapes):
    rows = _rows(shapes)
    step = P.step_flops_of(G, G.target)
    for variant, gap in (("vcycle", -0.05), ("gstack", 0.04)):
        for b in (40, 80, 160):
            for s in (0, 1, 2):
                y = _true((2, 32), shapes[(2, 32)], b * step) + gap + 0.002 * s
                rows.append({"method": "vcycle" if variant == "vcycle" else "stacking", "variant": variant,
                             "layers": 2, "width": 32, "lr": 1e-3, "budget": b, "budget_flops": b * step, "seed": s,
                             "flops": b * step, "tokens": 1, "val_loss": y, "test_loss": y, "key": f"{variant}{b}{s}",
                             "wall_s": 1.0, "tokens_per_param": 1.0})
    pred = P.predict(G, rows, {"variant": "vcycle", "size": (2, 32), "budget": 320}, [1, 2])["predicted"]
    assert pred["gap_to_the_target"] == pytest.approx(-0.05 + 0.003, abs=0.01)
    assert pred["saving_vs_same_size"]["median"] > 0  # below the target's curve: a saving
    new = P.predict(G, rows, {"variant": "stackbert", "size": (2, 32), "budget": 320}, [1, 2])["predicted"]
    assert new["gap_to_the_target"] == 0.0 and new["gap_se"] == pytest.approx(np.std([-0.047, 0.043], ddof=1), abs=0.01)
    assert math.isfinite(new["interval"][0]) and new["interval"][0] < new["test_loss"] < new["interval"][1]


def test_a_methods_gap_is_to_its_target_trained_directly_so_the_laws_misfit_at_a_budget_stays_out(shapes):
    """At one budget the target and the method both sit 0.08 above the law (a misfit the law cannot follow): the
    method's gap to its target stays -0.05 there, and its predicted gap at the next budget with it."""
    rows = _rows(shapes)
    step = P.step_flops_of(G, G.target)
    for r in rows:
        if (r["layers"], r["width"], r["budget"]) == (2, 32, 160):
            r["test_loss"] = r["val_loss"] = r["test_loss"] + 0.08
    for b in (40, 80, 160):
        for s in (0, 1, 2):
            y = _true((2, 32), shapes[(2, 32)], b * step) - 0.05 + (0.08 if b == 160 else 0.0)
            rows.append({"method": "vcycle", "variant": "vcycle", "layers": 2, "width": 32, "lr": 1e-3, "budget": b,
                         "budget_flops": b * step, "seed": s, "flops": b * step, "tokens": 1, "val_loss": y,
                         "test_loss": y, "key": f"v{b}{s}", "wall_s": 1.0, "tokens_per_param": 1.0})
    pred = P.predict(G, rows, {"variant": "vcycle", "size": (2, 32), "budget": 320}, [1, 2])["predicted"]
    assert pred["gap_to_the_target"] == pytest.approx(-0.05, abs=0.01)


def test_a_cell_with_a_row_and_a_written_prediction_are_refused(shapes, tmp_path, capsys, monkeypatch):
    rows = _rows(shapes)
    with pytest.raises(ValueError, match="has rows already: a prediction is of a cell nobody has run"):
        P.predict(G, rows, {"variant": "baseline", "size": (2, 32), "budget": 160}, [1])
    with pytest.raises(ValueError, match="give VARIANT:LxW@BUDGET"):
        P.parse_cell("stackbert@4x64")
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        P.parse_cell("nope:4x64@10")
    monkeypatch.setitem(P.GRIDS, "test", G)
    from bench.lib.rows import COLUMNS, write_csv

    write_csv(tmp_path / "frontier_test.csv", rows, COLUMNS)
    argv = ["--grid", "test", "--cell", "baseline:2x32@320", "--seeds", "1,2,3", "--results", str(tmp_path)]
    assert P.main(argv) == 0, capsys.readouterr().err
    written = tmp_path / "predictions" / "test-baseline-2x32-320.json"
    before = written.read_text()
    assert json.loads(before)["cell"] == {"variant": "baseline", "target": "2x32", "budget": 320,
                                          "budget_flops": 320 * P.step_flops_of(G, G.target)}
    capsys.readouterr()
    assert P.main(argv) == 2
    assert "exists: a prediction is written once and never edited" in capsys.readouterr().err
    assert written.read_text() == before
    assert P.main(["--grid", "test", "--list", "--results", str(tmp_path)]) == 0
    assert "0 of 0 finished predictions held; 1 wait for their runs" in capsys.readouterr().out



def test_a_grid_that_has_not_run_is_predicted_as_another_grid_measured_its_cell(shapes, tmp_path, capsys, monkeypatch):
    """``--law_grid``: the other grid's rows, its own budget included, make the law; a shape it measured at the
    predicted budget is predicted as measured there (here 0.05 off the law, a misfit the law cannot follow), and the
    record names that grid and the anchored shapes."""
    other = dataclasses.replace(G, stem="_other")
    monkeypatch.setitem(P.GRIDS, "test", dataclasses.replace(G, sizes=((2, 32), (4, 32))))
    monkeypatch.setitem(P.GRIDS, "other", other)
    from bench.lib.rows import COLUMNS, write_csv

    rows = _rows(shapes)
    for r in rows:
        if (r["layers"], r["width"], r["budget"]) == (2, 32, 160):
            r["test_loss"] = r["val_loss"] = r["test_loss"] + 0.05
    measured = np.mean([r["test_loss"] for r in rows if (r["layers"], r["width"], r["budget"]) == (2, 32, 160)])
    write_csv(tmp_path / "frontier_other.csv", rows, COLUMNS)
    argv = ["--grid", "test", "--cell", "baseline:2x32@160", "--seeds", "1,2", "--results", str(tmp_path)]
    assert P.main(argv) == 2  # the test grid has no rows: nothing to fit without the other grid's
    assert P.main([*argv, "--law_grid", "other"]) == 0, capsys.readouterr().err
    got = json.loads((tmp_path / "predictions" / "test-baseline-2x32-160.json").read_text())
    assert got["from"]["grid"] == "other" and got["from"]["budgets"] == [40, 80, 160]
    assert "2x32" in got["from"]["anchored"]
    lo, hi = got["predicted"]["interval"]
    assert got["predicted"]["test_loss"] == pytest.approx(measured, abs=0.01) and lo < measured < hi
    assert P.main(["--grid", "test", "--cell", "envelope@160", "--law_grid", "other", "--results", str(tmp_path)]) == 0
    env = json.loads((tmp_path / "predictions" / "test-envelope-160.json").read_text())
    assert env["from"]["envelope_over"] == ["2x32", "4x32"] and env["predicted"]["shape"] in ("2x32", "4x32")


def test_the_grids_page_and_the_readme_line_read_every_prediction_against_its_outcome(shapes, tmp_path, monkeypatch):
    from bench.lib.rows import COLUMNS, write_csv
    from bench.pages import frontier as page

    monkeypatch.setattr(P, "GRIDS", {"test": G})
    monkeypatch.setattr(R, "GRIDS", {"test": G})
    rows = _rows(shapes, budgets=(40, 80))
    write_csv(tmp_path / "frontier_test.csv", rows, COLUMNS)
    assert P.main(["--grid", "test", "--cell", "baseline:2x32@160", "--seeds", "1,2", "--results", str(tmp_path)]) == 0
    assert R.held(tmp_path) == "0 of 0 finished predictions held; 1 wait for their runs"
    later = [r for r in _rows(shapes, budgets=(160,)) if (r["layers"], r["width"]) == (2, 32)]
    write_csv(tmp_path / "frontier_test.csv", rows + later, COLUMNS)
    assert R.held(tmp_path) == "1 of 1 finished predictions held; 0 wait for their runs"
    text = page.render(G, [], [], preds=R.listing(G, rows + later, tmp_path / "predictions"))
    assert "## Predictions written before their runs" in text and "**1 of 1 finished predictions held" in text
    assert "| test-baseline-2x32-160 | 1,2 |" in text and ": held |" in text
