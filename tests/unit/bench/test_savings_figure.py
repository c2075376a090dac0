"""The README's figure (bench/frontier/figure.py): FLOPs saved per method against tokens per parameter, both
conventions, both grids."""

import pytest

from bench.lib import grid


def test_the_savings_figure_places_each_cell_under_both_counts_of_tokens_per_parameter(tmp_path):
    """bench.frontier.figure: every eligible savings row of both grids is a point, at tokens per parameter counted
    with all parameters and without the embeddings (4x64 at vocabulary 512: 41,088 of its 241,024 parameters are
    the token and position embeddings), coloured by its method, and the figure is drawn."""
    from bench.frontier import figure

    pts = figure.points(grid.LAYERS, grid.ROOT / "bench" / "results")
    assert pts and {p["reference"] for p in pts} == {"envelope", "same_size"}
    share = grid.regime(grid.LAYERS, (4, 64))["embedding_share"]
    assert share == pytest.approx((512 + 128) * 64 / 241024)
    p = next(p for p in pts if p["variant"] == "StackBERT")
    assert p["tpp_nonembed"] == pytest.approx(p["tpp_all"] / (1 - share))
    assert figure.family("vcycle_paper_gstack") == "V-cycle + G_stack" and figure.family("gstack2") == "G_stack (2x)"
    out = figure.draw(pts, tmp_path / "savings.png")
    assert out is not None and out.stat().st_size > 10_000
