"""docs/frontier.md's table of the best tuned shape per budget (bench.pages.frontier.shapes): the best is the lowest
seed-0 validation loss, its nearest neighbours on both axes are named with how much worse they are, and a budget is
interior only when every side was tried."""

from __future__ import annotations

from bench.pages.frontier import shapes


def _row(layers, width, budget, val, seed=0, lr=1e-3):
    return {"method": "baseline", "variant": "tuned", "layers": layers, "width": width, "budget": budget,
            "budget_flops": budget * 1e9, "seed": seed, "lr": lr, "val_loss": val, "test_loss": val}


def test_the_best_shape_is_interior_only_where_every_neighbour_was_tried_and_is_worse():
    rows = [_row(2, 96, 10, 2.70), _row(2, 96, 10, 2.60, lr=2e-3), _row(2, 96, 10, 2.50, seed=1),  # seed 1: no choice
            _row(1, 96, 10, 2.65), _row(3, 96, 10, 2.62), _row(2, 64, 10, 2.70), _row(2, 128, 10, 2.61),
            _row(2, 64, 20, 2.40), _row(4, 64, 20, 2.45)]
    text = shapes(rows, [10, 20, 30])
    assert text.startswith("At 9 runs the best tuned shape is interior at 1 of 2 budgets")
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "**2x96** (2.6000)" in lines["10"] and "1x96 (+0.0500)" in lines["10"] and "2x128 (+0.0100)" in lines["10"]
    assert lines["10"].endswith("| yes |")
    assert "**2x64** (2.4000)" in lines["20"] and "no: fewer layers, narrower, wider untried" in lines["20"]
    assert "30" not in lines  # a budget with fewer than two shapes is not a row


def test_a_grid_one_change_apart_is_read_cell_by_cell_beside_this_one():
    """bench.pages.frontier.beside: each tuned cell at its own LR, over the seeds that did not choose it (seed 0
    alone until they run, said so), and the difference; a cell the other grid lacks says so."""
    from bench.pages.frontier import beside

    here = [_row(2, 64, 10, 3.00), _row(2, 64, 10, 3.10, lr=2e-3), _row(4, 64, 10, 3.20)]
    there = [_row(2, 64, 10, 3.05, lr=4e-3), _row(2, 64, 10, 3.02, lr=4e-3, seed=1),
             _row(2, 64, 10, 3.04, lr=4e-3, seed=2)]
    rows = beside(here, there)
    assert rows[0]["size"] == "2x64" and rows[0]["LR (this grid)"] == "0.001" and rows[0]["LR (beside)"] == "0.004"
    assert rows[0]["test loss (this grid)"] == "3.0000 (seeds 0)"
    assert rows[0]["test loss (beside)"] == "3.0300 (seeds 1,2)"
    assert rows[0]["difference"] == "-0.0300"
    assert rows[1]["test loss (beside)"] == "not run" and rows[1]["difference"] == ""
