"""bench/lib/envelope.py's statistics: reference values leave out the seed that chose the LR, intervals resample
the seeds of both arms, the envelope is a lower convex hull (a flat noisy stretch manufactures no saving), a
bound stays a bound in every mean and table, and every frontier row carries the code version that made it."""

import math
import re

import pytest

from bench.lib import envelope
from bench.lib import rows as frontier_rows

SMALL, BIG = (2, 32), (4, 128)


def _row(size, budget, seed, test, val=None, lr=1e-3, method="baseline", variant="tuned", flops=None):
    return {"method": method, "variant": variant, "layers": size[0], "width": size[1], "lr": lr, "budget": budget,
            "budget_flops": 100.0 * budget, "seed": seed, "flops": flops or 100.0 * budget, "wall_s": float(budget),
            "tokens": 10 * budget, "val_loss": test if val is None else val, "test_loss": test,
            "tokens_per_param": 1.0, "key": f"{method}{variant}{size}{budget}{lr}{seed}"}


def test_reference_values_leave_out_the_seed_that_chose_the_lr():
    rows = [_row(SMALL, 1, 0, 4.0), _row(SMALL, 1, 0, 4.5, lr=2e-3),  # the sweep on seed 0: 1e-3 wins
            _row(SMALL, 1, 1, 5.0), _row(SMALL, 1, 2, 5.2)]
    assert envelope.tuned_lr(rows, SMALL, 1) == 1e-3
    assert [r["seed"] for r in envelope.reference_runs(rows, SMALL, 1)] == [1, 2]
    (loss, cost), = envelope.same_size_curve(rows, SMALL, [1], "flops")
    assert (loss, cost) == (pytest.approx(5.1), 100.0)  # seed 0's lucky 4.0 is not averaged in
    assert envelope.envelope_curve(rows, [SMALL], [1], "flops") == [(pytest.approx(5.1), 100.0)]


def _method_between(ref_seeds: dict[int, list[float]]) -> list[dict]:
    """The target's tuned cells at budgets 1 and 4 (seed 0 chose; ``ref_seeds``: {budget: seeds 1.. losses}) and
    a method at budget 4 whose three seeds all test 4.5, between the cells' losses."""
    rows = []
    for b, losses in ref_seeds.items():
        rows.append(_row(BIG, b, 0, sum(losses) / len(losses)))
        rows += [_row(BIG, b, s, loss) for s, loss in enumerate(losses, start=1)]
    rows += [_row(BIG, 4, s, 4.5, method="vcycle", variant="vcycle", flops=300.0) for s in (0, 1, 2)]
    return rows


def _same_size(rows: list[dict]) -> dict:
    return next(r for r in envelope.savings_rows(rows, [BIG], [1, 4], resamples=400) if r["reference"] == "same_size")


def test_the_interval_resamples_the_reference_seeds_and_widens_when_they_vary():
    steady = _same_size(_method_between({1: [5.0, 5.0], 4: [4.0, 4.0]}))
    noisy = _same_size(_method_between({1: [4.8, 5.2], 4: [3.8, 4.2]}))
    # the method's seeds agree, so every spread left is the reference's
    assert steady["flops_saved_hi"] - steady["flops_saved_lo"] == pytest.approx(0, abs=1e-12)
    assert noisy["flops_saved_hi"] - noisy["flops_saved_lo"] > 0.1
    assert noisy["flops_saved_lo"] < noisy["flops_saved_mean"] < noisy["flops_saved_hi"]
    again = _same_size(_method_between({1: [4.8, 5.2], 4: [3.8, 4.2]}))
    assert (again["flops_saved_lo"], again["flops_saved_hi"]) == (noisy["flops_saved_lo"], noisy["flops_saved_hi"])


def test_the_interval_resamples_the_method_seeds_too():
    rows = _method_between({1: [5.0, 5.0], 4: [4.0, 4.0]})
    for r, loss in zip([r for r in rows if r["method"] == "vcycle"], (4.3, 4.5, 4.7)):
        r["test_loss"] = loss
    got = _same_size(rows)
    assert got["flops_saved_hi"] - got["flops_saved_lo"] > 0.1


def test_a_flat_noisy_stretch_off_the_hull_credits_no_saving():
    """Cells at 100..1600 FLOPs fall steadily except a flat stretch 400 -> 800 (4.791 -> 4.784, within noise). A
    run at 420 FLOPs reaching 4.789, a hair below the 400 cell, would be credited with most of that stretch's
    compute by interpolating through it; the hull replaces the flat cell by the chord 400 -> 1600."""
    losses = {1: 5.5, 2: 5.05, 4: 4.791, 8: 4.784, 16: 4.35}
    rows = [_row(SMALL, b, s, loss) for b, loss in losses.items() for s in (0, 1, 2)]
    assert [b for _, b, *_ in envelope.envelope_points(rows, [SMALL], list(losses), "flops")] == [1, 2, 4, 16]
    through_every_cell = [(loss, 100.0 * b) for b, loss in losses.items()]
    assert envelope.saving(420.0, through_every_cell, 4.789)[0] > 0.1  # what the flat stretch would manufacture
    rows += [_row(BIG, 4, s, 4.789, method="vcycle", variant="vcycle", flops=420.0) for s in (0, 1, 2)]
    env = next(r for r in envelope.savings_rows(rows, [SMALL], list(losses), resamples=50)
               if r["reference"] == "envelope")
    assert env["flops_bound"] == "=" and env["flops_saved_mean"] <= 0


def test_hull_keeps_a_cell_below_the_chord_and_drops_one_a_cheaper_cell_beats():
    pts = [((2, 32), b, 100.0 * b, loss, loss) for b, loss in ((1, 5.0), (2, 4.0), (4, 3.9), (8, 4.1))]
    assert [p[1] for p in envelope.hull(pts)] == [1, 2, 4]  # 8 is worse than 4: more compute never hurts


def test_a_bound_stays_a_bound_in_every_mean_and_table():
    from bench.pages import frontier as report
    from bench.pages import results as pages

    assert envelope.combine(["=", ">=", "="]) == ">=" and envelope.combine(["<=", "="]) == "<="
    assert envelope.combine(["=", "="]) == "=" and envelope.combine([">=", "<="]) == "~"
    # the method's seeds: one inside the reference's range (exact), two below its lowest loss (lower bounds)
    rows = _method_between({1: [5.0, 5.0], 4: [4.0, 4.0]})
    for r, loss in zip([r for r in rows if r["method"] == "vcycle"], (4.5, 3.9, 3.8)):
        r["test_loss"] = loss
    got = _same_size(rows)
    assert (got["flops_bound"], got["flops_ci_bound"]) == (">=", ">=")
    assert report._pct(got, "flops").lstrip("*").startswith("≥ ")
    assert re.match(r"^≥[+-]\d+% \[≥[+-][\d.]+, ≥[+-][\d.]+\]$", pages._saved(got))
    assert envelope.spread([(0.1, "="), (0.25, ">=")]).startswith(">= ")


def test_every_frontier_row_records_the_code_version_that_made_it(tmp_path):
    assert "code_version" in frontier_rows.COLUMNS
    assert re.match(r"^[0-9a-f]{4,40}(\+dirty)?$", frontier_rows.code_version())
    assert frontier_rows.code_version(tmp_path) == "unknown"  # not a git checkout
    path = tmp_path / "frontier.csv"
    frontier_rows.write_csv(path, [{**_row(SMALL, 1, 0, 4.0), "code_version": "0123456"}], frontier_rows.COLUMNS)
    assert frontier_rows.read_rows(path)[0]["code_version"] == "0123456"  # a commit of digits stays text
    recorded = frontier_rows.read_rows(frontier_rows.Path(__file__).resolve().parents[3] / "bench" / "results"
                                       / "frontier.csv")
    assert recorded and all(r["code_version"] for r in recorded)


def test_excludes_zero_needs_the_whole_interval_above_zero():
    row = {"flops_saved_lo": 0.01, "flops_ci_bound": "=", "seeds": 3, "reference_seeds": 2}
    assert envelope.excludes_zero(row)
    assert not envelope.excludes_zero({**row, "reference_seeds": 1})  # one seed: the bootstrap repeats it
    assert not envelope.excludes_zero({**row, "seeds": 1})
    assert not envelope.excludes_zero({**row, "flops_ci_bound": "<="})  # at most 1%: could be below 0
    assert not envelope.excludes_zero({**row, "flops_ci_bound": ">="})  # at least 1%: a bound, not a measurement
    assert not envelope.excludes_zero({**row, "flops_saved_lo": -0.01})
    assert math.isclose(envelope.LEVEL, 0.95)


def test_a_flat_noisy_last_stretch_gives_a_saving_whose_interval_spans_zero():
    """The frontier's own case: the last two cells differ by less than their seeds do (4.791 vs 4.784, seeds 0.17
    apart at the last). Interpolated through them, a run a hair below the first reads as a third cheaper; with
    the reference's seeds resampled the last cell moves above the one before, and the interval spans 0."""
    seeds = {1: (5.5, 5.5), 2: (5.05, 5.05), 4: (4.80, 4.782), 8: (4.70, 4.868)}  # seeds 1 and 2 of each cell
    rows = [_row(SMALL, b, 0, sum(v) / 2) for b, v in seeds.items()]
    rows += [_row(SMALL, b, s, loss) for b, v in seeds.items() for s, loss in zip((1, 2), v)]
    rows += [_row(BIG, 4, s, 4.787, method="vcycle", variant="vcycle", flops=400.0) for s in (0, 1, 2)]
    env = next(r for r in envelope.savings_rows(rows, [SMALL], list(seeds), resamples=400)
               if r["reference"] == "envelope")
    assert env["flops_saved_mean"] > 0.2  # what the flat stretch manufactures from the means alone
    assert env["flops_saved_lo"] < 0 < env["flops_saved_hi"] and not envelope.excludes_zero(env)


def test_the_layer_grids_verdict_leads_the_readme_block_with_every_method_against_both_references(tmp_path):
    """The README's results block opens with the layer-dominated grid: each method against the envelope and against
    its target trained directly, best first, a cell saving only where the deciding rule says so (bench/lib/verdict.py:
    "k of n eligible cells"), its interval the rule's, the regime as tokens per parameter and FLOPs shares, the
    G_stack variant named, and the budgets not run yet."""
    from bench.lib.rows import SAVINGS_COLUMNS, write_csv
    from bench.pages import results as pages

    def cell(variant, ref, mean, lo, hi, verdict="no evidence either way", eligible=1, seeds=3):
        return {"method": "stacking", "variant": variant, "target": "4x64", "budget": 2484, "budget_flops": 9e12,
                "reference": ref, "seeds": seeds, "reference_seeds": 2, "test_loss_mean": 3.0,
                "tokens_per_param": 21.0, "tokens_vs_baseline": 1.0, "flops_saved_mean": mean, "flops_bound": "=",
                "flops_saved_lo": lo - 0.5, "flops_saved_hi": hi + 0.5, "flops_ci_bound": "=",  # (the bootstrap's)
                "wall_saved_mean": mean, "wall_bound": "=", "wall_saved_lo": lo, "wall_saved_hi": hi,
                "wall_ci_bound": "=", "loss_gap_mean": -mean / 10, "gap_t_lo": -hi / 10, "gap_t_hi": -lo / 10,
                "eligible": eligible, "flops_saved_t_lo": lo, "flops_saved_t_hi": hi, "flops_t_lo_bound": "=",
                "flops_t_hi_bound": "=", "verdict": verdict, "verdict_hull": verdict,
                "verdict_law": verdict if ref == "envelope" and eligible else None,  # (what the savings reader checks)
                "loss_gap_lo": -hi / 10, "loss_gap_hi": -lo / 10, "gap_se": 0.01, "gap_df": 4.0, "p_saves": 0.5,
                "p_loses": 0.5, "holm_n": 2}

    path = tmp_path / "savings_layers.csv"
    write_csv(path, [cell("gstack2", "envelope", -0.5, -0.6, -0.4, "loses"),
                     cell("gstack2", "same_size", -0.2, -0.3, -0.1, "loses"),
                     cell("stackbert", "envelope", -0.1, -0.2, 0.05),
                     cell("stackbert", "same_size", 0.2, 0.1, 0.3, "saves")],
              SAVINGS_COLUMNS)
    line = pages._layers_verdict(path)
    assert "no method saves compute against the compute-optimal envelope by the rule** (0 of 2 eligible cells)" in line
    assert "against 4x64 trained directly 1 of 2 (StackBERT at 2484 steps), 1 lose (G_stack 2x (2 → 4 layers) at " \
        "2484 steps)" in line  # by the rule
    assert "(0 of 2 eligible cells); **1 lose** (G_stack 2x (2 → 4 layers) at 2484 steps)" in line  # said as such
    assert "G_stack 2x (2 → 4 layers) -50% [-60, -40] loses / -20% [-30, -10] loses" in line  # with its interval
    assert line.index("StackBERT -10% [-20, +5] / +20% [+10, +30] saves") < line.index("G_stack 2x (2 → 4 layers) -50%")
    assert "Budgets 4967, 9934 not run yet" in line and "At 21-21 tokens per parameter" in line
    assert "the layers 89% of a step's FLOPs, the LM head 11%" in line and "embeddings" not in line
    assert "Holm over the 2 cells" in line and "Δ +0.010 [-0.005, +0.020]" in line  # the rule's interval
    write_csv(path, [cell("stackbert", "envelope", 0.2, 0.1, 0.3, "saves")], SAVINGS_COLUMNS)
    assert "**1 of 1 eligible cells saves compute against the compute-optimal envelope** (StackBERT at 2484 steps: " \
        "+20% [+10, +30]" in pages._layers_verdict(path)
    write_csv(path, [cell("stackbert", "envelope", 0.2, 0.1, 0.3, "not eligible", eligible=0, seeds=1)],
              SAVINGS_COLUMNS)  # one seed: no claim, and not counted
    assert "(0 of 0 eligible cells)" in pages._layers_verdict(path)
    assert pages._layers_verdict(tmp_path / "none.csv") is None


def test_a_cell_that_loses_says_loses_with_its_interval_beside_the_saving_it_could_have_detected():
    """The pages state a loss after Holm as one: the grid's page says "loses" with the test's interval and the
    smallest saving the cell could detect (80% power) beside every verdict; the README's table says which cells lose
    against the envelope where none saves."""
    from bench.pages import frontier, results

    row = {"verdict": "loses", "verdict_hull": "loses", "verdict_law": "no evidence either way", "flops_bound": "=",
           "flops_saved_mean": -0.134, "flops_saved_t_lo": -0.189, "flops_saved_t_hi": -0.079, "flops_t_lo_bound": "=",
           "flops_t_hi_bound": "=", "mde_flops_saved": 0.213, "mde_flops_bound": "=", "law_flops_saved": -0.001,
           "law_flops_bound": "="}
    assert frontier._verdict(row) == "**loses**: -13.4% [-18.9, -7.9]"
    assert frontier._mde(row) == "21%" and frontier._mde({**row, "mde_flops_bound": "~"}) == "~ 21%"
    assert frontier._law_pct(row) == "-0.1%" and frontier._law_pct({**row, "verdict_law": "saves"}) == "-0.1% (saves)"
    assert frontier._verdict({**row, "verdict": "no evidence either way"}) == "no evidence either way"
    env = [{**row, "reference": "envelope", "eligible": 1},
           {**row, "reference": "envelope", "verdict": "no evidence either way", "eligible": 1},
           {**row, "reference": "envelope", "verdict": "not eligible", "eligible": 0}]
    same = [{**row, "reference": "same_size", "verdict": "saves", "eligible": 1}]
    assert results.verdict(env + same) == "saves vs same size only; 1/2 lose vs envelope"
    assert results.verdict([env[0], env[2], {**same[0], "verdict": "loses"}]) == "loses"  # every decided cell
    assert results.verdict([env[0], env[2], same[0]]) == "saves vs same size only; loses vs envelope"


def test_the_loss_gap_at_equal_flops_is_a_value_where_the_saving_can_only_be_a_bound():
    """A method at the reference's largest budget that ends below it has a saving of ">= 0" (how much compute the
    reference would need is not measured) but a loss gap with an interval: its test loss minus the reference's at
    its FLOPs, interpolated log-log inside the reference, within 2.5% of an end read there, never extrapolated."""
    front = [(5.0, 100.0), (4.0, 400.0)]
    assert envelope.loss_at(front, 200.0) == pytest.approx(math.exp((math.log(5) + math.log(4)) / 2))
    assert envelope.loss_at(front, 405.0) == pytest.approx(4.0) and envelope.loss_at(front, 98.0) == pytest.approx(5.0)
    assert envelope.loss_at(front, 450.0) is None and envelope.loss_at(front, 90.0) is None
    rows = [_row(BIG, b, s, loss) for b, losses in {1: [5.0, 5.1, 4.9], 4: [4.0, 4.1, 3.9]}.items()
            for s, loss in enumerate(losses)]
    rows += [_row(BIG, 4, s, loss, method="vcycle", variant="vcycle", flops=398.0) for s, loss in enumerate(
        (3.7, 3.8, 3.75))]
    same = _same_size(rows)
    assert same["flops_bound"] == ">=" and same["flops_saved_mean"] == pytest.approx(1 - 398 / 400)
    assert same["loss_gap_mean"] == pytest.approx(3.75 - envelope.loss_at(front, 398.0))  # seeds 1-2: 5.0, 4.0
    assert same["loss_gap_lo"] < same["loss_gap_mean"] < same["loss_gap_hi"] < 0  # both arms' seeds resampled
    assert same["reference_seeds"] == 2 and envelope.ends_lower(same)
    one = _same_size([r for r in rows if r["method"] != "baseline" or r["seed"] != 2])  # seed 1 alone: no interval
    assert one["reference_seeds"] == 1 and one["loss_gap_hi"] < 0 and not envelope.ends_lower(one)
    far = [dict(r, flops=500.0) if r["method"] == "vcycle" else r for r in rows]  # past the reference: no gap
    assert _same_size(far).get("loss_gap_mean") is None


def test_a_report_of_part_of_a_grid_gives_the_whole_reports_intervals():
    """Each reference cell draws its seeds from its own RNG: adding a budget above (another cell in the reference)
    leaves the intervals of a method read between the lower cells as they were."""
    low = _method_between({1: [4.7, 4.9, 5.1, 5.3], 4: [3.7, 3.9, 4.1, 4.3]})
    for r, loss in zip([r for r in low if r["method"] == "vcycle"], (4.4, 4.5, 4.65)):
        r["test_loss"] = loss  # the method's seeds differ too: the percentiles move with every draw
    more = low + [_row(BIG, 16, s, loss) for s, loss in enumerate((3.0, 2.9, 3.2, 3.1, 2.8))]
    part = _same_size(low)
    whole = next(r for r in envelope.savings_rows(more, [BIG], [1, 4, 16], resamples=400)
                 if r["reference"] == "same_size" and r["budget"] == 4)
    assert part["flops_saved_hi"] - part["flops_saved_lo"] > 0.1  # a real interval, not a point
    for k in ("flops_saved_lo", "flops_saved_hi", "loss_gap_lo", "loss_gap_hi"):
        assert whole[k] == part[k], k


def test_the_guides_deciding_cells_are_the_eligible_envelope_cells_with_the_smallest_p_of_the_hulls_test():
    """docs/frontier.md's generated block: the eligible cells against the envelope, ordered by the hull test's p
    (the order Holm reads them), each with its test, the smallest saving it could detect, the law's test beside it
    and the verdict, the hull's (a saving with its interval, whatever the law says); a same-size or ineligible cell
    never."""
    from bench.pages.frontier import closest

    def cell(variant, ref, p, eligible="1"):
        return {"variant": variant, "reference": ref, "eligible": eligible, "budget": 9934, "budget_flops": 3.6e13,
                "seeds": 4, "reference_seeds": 3, "p_saves": p, "flops_bound": "=", "flops_saved_mean": 0.1,
                "flops_saved_t_lo": 0.05, "flops_saved_t_hi": 0.15, "flops_t_lo_bound": "=", "flops_t_hi_bound": "=",
                "law_flops_saved": 0.12, "law_flops_bound": "=", "law_p_saves": 0.03, "holm_n": 4,
                "mde_flops_saved": 0.213, "mde_flops_bound": "=",
                "verdict": "saves", "verdict_hull": "saves", "verdict_law": "no evidence either way"}

    block = closest([cell("stackbert", "envelope", 0.003), cell("gstack2", "envelope", 1e-6),
                     cell("apollo_authors", "same_size", 1e-9), cell("vcycle_paper", "envelope", 1e-8, "0"),
                     cell("vcycle_coarse_lr1x", "envelope", 0.5), cell("vcycle_paper_gstack", "envelope", 0.2)], n=3)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "method" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| G_stack 2x (2 → 4 layers)", "| StackBERT", "| V-cycle + G_stack"]
    assert "Holm over\n4 cells (first threshold 0.025 / 4 = 0.0063)" in block and "No law is fitted" in block
    assert "| 10.0% [5.0, 15.0] | 1e-06 | 21% | 12.0% | 0.03 | **saves**: 10.0% [5.0, 15.0] |" in rows[0]
    assert "enough in both arms" in closest([cell("gstack2", "envelope", 0.1, "0")])
