"""python -m bench.frontier (bench/frontier/run.py) and bench/lib/envelope.py: the envelope is chosen on validation,
savings are against it at
equal test loss, the LR sweep extends past an edge, the grid runs end to end and reuses its rows."""

import csv
import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.frontier import run as frontier
from bench.lib import envelope, grid
from bench.lib import rows as frontier_rows
from bench.pages.frontier import page as frontier_page


def _row(size, budget, lr, seed, val, test, flops=None, method="baseline", variant="tuned", wall=None, tokens=None):
    return {"method": method, "variant": variant, "layers": size[0], "width": size[1], "lr": lr, "budget": budget,
            "budget_flops": 100.0 * budget, "seed": seed, "flops": flops or 100.0 * budget,
            "wall_s": wall or float(budget), "tokens": tokens or 10 * budget, "val_loss": val, "test_loss": test,
            "tokens_per_param": 1.0,
            "key": f"{method}{variant}{size}{budget}{lr}{seed}"}


def test_tuned_lr_and_the_envelope_size_are_chosen_on_validation_never_on_test():
    small, big = (2, 64), (4, 128)
    rows = [_row(small, 1, 1e-3, 0, val=5.0, test=4.0), _row(small, 1, 2e-3, 0, val=4.9, test=4.5),
            _row(big, 1, 1e-3, 0, val=4.8, test=4.6)]
    rows += [_row(small, 1, 2e-3, 1, val=4.9, test=4.5), _row(big, 1, 1e-3, 1, val=4.8, test=4.6)]  # reference seeds
    assert envelope.tuned_lr(rows, small, 1) == 2e-3  # lowest validation, though 1e-3 has the lower test loss
    chosen = [size for size, *_ in envelope.envelope_points(rows, [small, big], [1], "flops")]
    assert chosen == [big]  # by validation, though the small size tests lower
    assert envelope.envelope_curve(rows, [small, big], [1], "flops") == [(4.6, 100.0)]


def test_the_envelope_drops_a_budget_that_is_not_better_than_a_cheaper_one():
    size = (2, 64)
    rows = [_row(size, b, 1e-3, s, val, val) for b, val in ((1, 4.0), (4, 3.0), (8, 3.5), (16, 2.5)) for s in (0, 1)]
    assert envelope.envelope_curve(rows, [size], [1, 4, 8, 16], "flops") == \
        [(4.0, 100.0), (3.0, 400.0), (2.5, 1600.0)]


def test_the_wall_clock_envelope_may_mix_sizes_the_flops_envelope_picks_per_budget():
    a, b = (2, 64), (4, 128)  # a: cheaper per second, b: better per FLOP
    # a's steps round to 0.2% fewer FLOPs than b's at each budget: one cost, where b's lower loss wins
    rows = [r for s in (0, 1) for r in (
        _row(a, 1, 1e-3, s, 5.0, 5.0, wall=10.0, flops=99.8), _row(b, 1, 1e-3, s, 4.8, 4.8, wall=30.0),
        _row(a, 2, 1e-3, s, 4.5, 4.5, wall=20.0, flops=199.6), _row(b, 2, 1e-3, s, 4.2, 4.2, wall=60.0))]
    assert envelope.envelope_curve(rows, [a, b], [1, 2], "flops") == [(4.8, 99.8), (4.2, 199.6)]
    assert envelope.envelope_curve(rows, [a, b], [1, 2], "wall_s") == [(5.0, 10.0), (4.5, 20.0), (4.2, 60.0)]


def test_savings_against_the_envelope_and_the_same_size_baseline():
    small, big = (2, 64), (4, 128)
    rows = []
    for seed in (0, 1):  # the small size wins at both budgets; the big one is the method's target
        rows += [_row(small, 1, 1e-3, seed, 4.0, 4.0), _row(small, 4, 1e-3, seed, 3.0, 3.0),
                 _row(big, 1, 1e-3, seed, 4.5, 4.5), _row(big, 4, 1e-3, seed, 3.5, 3.5)]
    # the method at budget 4 on the big target: test loss 3.5 = the same-size baseline's at cost 400;
    # on the envelope 3.5 lies halfway in log-loss between (4.0, 100) and (3.0, 400) -> cost 200
    import math

    mid = math.exp((math.log(4.0) + math.log(3.0)) / 2)
    rows += [_row(big, 4, 1e-3, s, 3.6, mid, method="vcycle", variant="vcycle", flops=300.0, wall=3.0, tokens=68)
             for s in (0, 1)]
    got = {r["reference"]: r for r in envelope.savings_rows(rows, [small, big], [1, 4])}
    assert got["envelope"]["flops_saved_mean"] == pytest.approx(1 - 300 / 200)  # negative: the envelope wins
    assert got["envelope"]["flops_bound"] == "="
    same = got["same_size"]  # 3.46 is below the same-size baseline's best (3.5 at 400): a lower bound
    assert (same["flops_saved_mean"], same["flops_bound"]) == (pytest.approx(1 - 300 / 400), ">=")
    assert same["flops_saved_mean"] > 0 > got["envelope"]["flops_saved_mean"]
    assert got["envelope"]["wall_saved_mean"] == pytest.approx(1 - 3.0 / 2.0)  # wall: budgets 1 and 4 s
    assert got["envelope"]["seeds"] == 2 and got["envelope"]["target"] == "4x128"
    assert got["envelope"]["tokens_vs_baseline"] == pytest.approx(1.7)  # 68 tokens against the baseline's 40


def test_the_lr_sweep_extends_past_an_edge_then_runs_seeds_and_methods_at_the_tuned_lr():
    g = dataclasses.replace(grid.SMOKE, max_trials=6)
    flops = {s: 1000 * s[1] for s in g.sizes}
    size, b = g.target, g.budgets[0]
    lrs = (g.lrs[0] / 2, *g.lrs)  # every cell's best is g.lrs[0], inside the LRs tried
    rows = [_row(s, bb, lr, 0, 4.9 if lr == g.lrs[0] else 5.0, 5.0) for s in g.sizes for bb in g.budgets for lr in lrs]
    for r in rows:  # at (target, first budget) the largest LR tried is the best: one more, twice as large
        if (r["layers"], r["width"]) == size and r["budget"] == b and r["lr"] == max(g.lrs):
            r["val_loss"] = 4.0
    for r, key in zip(rows, range(len(rows))):
        r["key"] = str(key)
    jobs = [j for j in frontier.plan(g, rows, flops) if j["kind"] == "train"]  # (zero-shot jobs: none ran)
    sweep = [j for j in jobs if j["meta"]["method"] == "baseline" and j["meta"]["seed"] == 0]
    assert [(j["meta"]["layers"], j["meta"]["budget"], j["meta"]["lr"]) for j in sweep] == \
        [(size[0], b, 2 * max(g.lrs))]
    assert not [j for j in jobs if j["meta"]["budget"] == b and (j["meta"]["layers"], j["meta"]["width"]) == size
                and j["meta"]["seed"] > 0 and j["meta"]["method"] == "baseline"]  # not tuned yet: no seeds
    rows.append({**_row(size, b, 2 * max(g.lrs), 0, 4.5, 5.0), "key": "x"})  # worse: max(lrs) is interior now
    jobs = [j for j in frontier.plan(g, rows, flops) if j["kind"] == "train"]
    at = [j["meta"] for j in jobs if j["meta"]["budget"] == b and (j["meta"]["layers"], j["meta"]["width"]) == size]
    assert {(m["method"], m["seed"], m["lr"]) for m in at if m["method"] == "baseline"} == \
        {("baseline", s, max(g.lrs)) for s in g.seeds[1:]}
    assert {m["lr"] for m in at if m["method"] != "baseline"} == {max(g.lrs)}  # methods at the tuned LR
    assert {m["variant"] for m in at if m["method"] != "baseline"} == set(g.variants)
    assert jobs == sorted(jobs, key=lambda j: j["order"]) and jobs[0]["order"][0] <= 1
    # the reference's own seeds come before any method: until they run, a method's saving is only a bound
    kinds = [j["meta"]["method"] == "baseline" for j in jobs if j["meta"]["budget"] == b]
    assert kinds == sorted(kinds, reverse=True) and kinds[0] and not kinds[-1]


@pytest.mark.slow
def test_frontier_smoke_writes_the_issue_columns_and_a_rerun_trains_nothing(tmp_path, capsys):
    results, out = tmp_path / "results", tmp_path / "runs"
    argv = ["--smoke", "--workers", "0", "--results", str(results), "--out", str(out)]
    assert frontier.main(argv) == 0
    with open(results / "frontier.csv") as f:
        rows = list(csv.DictReader(f))
    need = "method,variant,layers,width,lr,budget_flops,seed,tokens,params,val_loss,test_loss,wall_s,code_version"
    need = need.split(",")
    assert set(need) <= set(rows[0]) and all(r[c] != "" for r in rows for c in need)
    assert {r["variant"] for r in rows} == {"tuned", *grid.SMOKE.variants}
    assert {int(r["seed"]) for r in rows if r["method"] != "baseline"} == set(grid.SMOKE.seeds)
    with open(results / "savings.csv") as f:
        save = list(csv.DictReader(f))
    need = "method,variant,budget_flops,seeds,flops_saved_mean,flops_saved_lo,flops_saved_hi,wall_saved_mean"
    assert set(need.split(",")) | {"reference"} <= set(save[0])
    assert {r["reference"] for r in save} == {"envelope", "same_size"}
    assert any(r["lambada_acc"] != "" for r in rows)  # zero-shot ran for seed 0 at the largest budget
    assert (results / "frontier.png").stat().st_size > 0 and "envelope" in frontier_page(grid.SMOKE, results)
    before = (results / "frontier.csv").read_text()
    capsys.readouterr()
    assert frontier.main(argv) == 0  # the rows are the cache: nothing trains again
    assert "done" not in capsys.readouterr().out and (results / "frontier.csv").read_text() == before
    # --retime runs the tuned baseline rows of a size again: new wall-clock, the same losses, nothing added
    rows_before = {r["key"]: r for r in csv.DictReader(io.StringIO(before))}
    for r in rows_before.values():
        r["wall_s"] = "1e+06"  # as if an earlier batch of runs had been slow
    frontier_rows.write_csv(results / "frontier.csv", list(rows_before.values()), list(rows[0]))
    assert frontier.main([*argv, "--retime", "2x32"]) == 0
    diffs = [float(d) for d in re.findall(r"differs by ([0-9.e+-]+)\)", capsys.readouterr().out)]
    assert diffs and max(diffs) < 1e-5  # deterministic: the same test loss (the CSV keeps 6 digits)
    with open(results / "frontier.csv") as f:
        after = {r["key"]: r for r in csv.DictReader(f)}
    assert after.keys() == rows_before.keys()
    retimed = [k for k, r in after.items() if float(r["wall_s"]) < 1e6]
    size = {k: (r["layers"], r["width"]) for k, r in after.items()}
    assert retimed and all(size[k] == ("2", "32") for k in retimed)
    assert all(after[k]["test_loss"] == rows_before[k]["test_loss"] for k in after)
    # --reproduce trains one row again beside the rows and prints both losses; the rows stay as they are
    key, before = next(iter(after)), (results / "frontier.csv").read_text()
    capsys.readouterr()
    assert frontier.main([*argv, "--reproduce", key]) == 0
    printed = capsys.readouterr().out
    assert f"the row, by code {after[key]['code_version']}: test {float(after[key]['test_loss']):.6g}" in printed
    assert float(re.findall(r"reproduce .* test loss differs by ([0-9.e+-]+)\)", printed)[0]) < 1e-5
    assert (results / "frontier.csv").read_text() == before and (tmp_path / "runs_reproduce" / key).is_dir()
    assert frontier.main([*argv, "--reproduce", key]) == 0  # again: the first reproduction is not read back
    again = capsys.readouterr().out
    assert "reproduced by code " in again and "reproduced by code unknown" not in again
    assert frontier.main([*argv, "--reproduce", "nosuchkey"]) == 2  # one line naming the key, nothing run
    assert "--reproduce: no row has the key nosuchkey" in capsys.readouterr().err


def test_the_report_envelope_covers_reference_only_sizes(tmp_path):
    """A size run only as a baseline reference (2x32 in FULL) is on the envelope when it is best: the savings
    rows of a method are then measured against it, not only against the methods' sizes."""
    from bench.frontier.report import report

    small, big, tiny = (2, 64), (4, 128), (2, 32)
    g = dataclasses.replace(grid.SMOKE, sizes=(small, big), target=big, budgets=(1, 4),
                            reference_budgets=((1, (tiny,)), (4, (tiny,))))
    assert g.baseline_sizes == [tiny, small, big]
    rows = [_row(s, b, 1e-3, seed, v, v) for s, b, v in ((small, 1, 4.0), (small, 4, 3.0), (big, 1, 4.5),
                                                         (big, 4, 3.5), (tiny, 1, 3.0), (tiny, 4, 2.0))
            for seed in (0, 1)]
    rows += [_row(big, 4, 1e-3, 0, 2.5, 2.5, method="vcycle", variant="vcycle")]
    report(g, rows, tmp_path)
    with open(tmp_path / "savings.csv") as f:
        env = next(r for r in csv.DictReader(f) if r["reference"] == "envelope")
    # loss 2.5 lies between the 2x32 points (3.0 at 100, 2.0 at 400): cheaper than the method's 400 FLOPs
    assert float(env["flops_saved_mean"]) < 0


def test_a_grid_runs_a_part_at_a_time_with_its_own_method_seeds_and_targets():
    g = dataclasses.replace(grid.SMOKE, budgets=(6, 12),
                            reference_budgets=((3, grid.SMOKE.sizes), (24, grid.SMOKE.sizes)),
                            method_seeds=((6, (0,)),), envelope_methods=False)
    part = g.upto(12)
    assert part.budgets == (6, 12) and part.reference_budgets == ((3, g.sizes),)  # 24 waits for a later part
    with pytest.raises(ValueError, match="no methods' budget"):
        g.upto(5)
    flops = {s: 1000 * s[1] for s in g.sizes}
    rows = [_row(s, b, lr, 0, 4.9 if lr == g.lrs[0] else 5.0, 5.0) for s in g.sizes for b in (3, 6, 12)
            for lr in (g.lrs[0] / 2, *g.lrs)]
    for i, r in enumerate(rows):
        r["val_loss"] -= 0.5 * (r["width"] < g.target[1])  # the smaller size leads the envelope: no method there
        r["key"] = str(i)
    methods = [j["meta"] for j in frontier.plan(part, rows, flops) if j["meta"]["method"] != "baseline"]
    assert {(m["layers"], m["width"]) for m in methods} == {g.target}
    assert {(m["budget"], m["seed"]) for m in methods} == {(6, 0), (12, 0)}  # seed 1 waits for seed 0's LR
    rows += [{**_row((j["meta"]["layers"], j["meta"]["width"]), j["meta"]["budget"], j["meta"]["lr"], 0, 4.0, 4.0,
                     method=j["meta"]["method"], variant=j["meta"]["variant"]), "key": j["key"]}
             for j in frontier.plan(part, rows, flops) if j["meta"]["method"] != "baseline"]
    methods = [j["meta"] for j in frontier.plan(part, rows, flops) if j["meta"]["method"] != "baseline"]
    assert {(m["budget"], m["seed"]) for m in methods} == {(12, 1)}
    assert not [j for j in frontier.plan(part, rows, flops) if j["meta"]["budget"] == 24]
    from bench.lib.variants import overrides

    assert all(overrides(v, grid.LAYERS.target[0])["method.name"] for v in grid.LAYERS.variants)  # every name exists


def test_the_committed_rows_are_still_the_cache_of_the_whole_grid():
    """A job's key hashes what its config computes: a field that only keeps books (W&B group, the MFU's peak,
    train.with_baseline) must not change it, or the next ``python -m bench.frontier`` would train every run again."""

    rows = frontier_rows.read_rows(Path(grid.ROOT) / "bench" / "results" / "frontier.csv")
    g = grid.FULL
    flops = {s: grid.step_flops_of(g, s) for s in {*(c for c, _ in g.baseline_cells()), g.target}}
    fields = ("method", "variant", "layers", "width", "lr", "budget", "seed")
    done = {tuple(r[f] for f in fields) for r in rows}
    planned = [j["meta"] for j in frontier.plan(g, rows, flops)]
    assert len(rows) > 300 and not [m for m in planned if tuple(m[f] for f in fields) in done]
    checks = {(c.size, c.budget, v, f * envelope.tuned_lr(rows, c.size, c.budget), s)
              for c in g.checks for v in c.variants for f in c.factors for s in c.seeds}
    rest = [m for m in planned
            if ((m["layers"], m["width"]), m["budget"], m["variant"], m["lr"], m["seed"]) not in checks]
    assert {(m["layers"], m["width"], m["budget"]) for m in rest} <= {(2, 32, 600)}  # the one cell still to run


def test_the_methods_own_lr_checks_run_last_and_the_winner_on_seed_0_validation_is_the_methods_lr(tmp_path):
    """A Check trains its variants at factors of the cell's tuned LR once the cell is tuned, after every other job;
    the LR whose seed-0 run has the lowest validation loss is the method's (its seeds run there, the savings and
    zero-shot are of it, without the seed that chose), as a baseline's is; the page names the winner."""
    from bench.pages.frontier import checks_tables, zeroshot_rows

    small, big = (2, 64), (4, 128)
    g = dataclasses.replace(grid.SMOKE, sizes=(small, big), target=big, budgets=(1, 4), seeds=(0, 1), lrs=(1e-3,),
                            variants=("vcycle",), envelope_methods=False,
                            checks=(grid.Check(big, 4, ("vcycle", "gstack"), (0.5, 1.0, 2.0), (0, 1)),
                                    grid.Check(big, 4, ("vcycle",), (4.0,), (0, 1))))
    flops = {small: 10, big: 100}
    assert not [j for j in frontier.plan(g, [], flops) if j["order"][0] >= 7]  # no tuned LR yet: no check
    rows = [_row(s, b, 1e-3, seed, v, v) for s, b, v in ((small, 1, 4.0), (small, 4, 3.0), (big, 1, 4.5),
                                                         (big, 4, 3.5)) for seed in (0, 1)]
    rows += [_row(big, 4, 1e-3, seed, 3.4, 3.4, method="vcycle", variant="vcycle") for seed in (0, 1)]
    jobs = [j for j in frontier.plan(g, rows, flops) if j["kind"] == "train"]
    checks = [j for j in jobs if j["order"][0] >= 7]
    assert {(j["meta"]["variant"], (j["meta"]["layers"], j["meta"]["width"]), j["meta"]["budget"], j["meta"]["lr"],
             j["meta"]["seed"]) for j in checks} == \
        {(v, big, 4, lr, s) for v in ("vcycle", "gstack") for lr in (5e-4, 1e-3, 2e-3) for s in (0, 1)
         if (v, lr) != ("vcycle", 1e-3)} | {("vcycle", big, 4, 4e-3, s) for s in (0, 1)}
    # (vcycle at 1x is the method's own run, planned once, at its earlier place)
    assert len({j["key"] for j in jobs}) == len(jobs)
    assert jobs[-len(checks):] == checks  # after every other job
    assert [j["meta"]["seed"] for j in checks] == sorted(j["meta"]["seed"] for j in checks)  # seed 0 of all first
    assert {(r["lr"], r["seed"]) for r in envelope.method_rows(rows)} == {(1e-3, 0), (1e-3, 1)}  # one LR: no choice
    rows += [_row(big, 4, 4e-3, 0, 3.45, 3.0, method="vcycle", variant="vcycle")]  # 4x: worse on validation
    assert {(r["lr"], r["seed"]) for r in envelope.method_rows(rows)} == {(1e-3, 1)}  # seed 0 chose: it is out
    rows += [_row(big, 4, 2e-3, 0, 3.3, 2.5, method="vcycle", variant="vcycle")]  # 2x: better on validation
    assert envelope.method_lr(rows, "vcycle", big, 4) == 2e-3
    assert not envelope.method_rows(rows)  # its seeds have not run at 2x yet
    assert {(j["meta"]["lr"], j["meta"]["seed"]) for j in frontier.plan(g, rows, flops)
            if j["meta"]["variant"] == "vcycle" and j["meta"]["seed"] > 0 and j["order"][0] < 7} == {(2e-3, 1)}
    rows += [_row(big, 4, 2e-3, 1, 3.3, 2.0, method="vcycle", variant="vcycle")]
    assert {(r["lr"], r["seed"]) for r in envelope.method_rows(rows)} == {(2e-3, 1)}
    assert [r["test_loss_mean"] for r in envelope.savings_rows(rows, [small, big], [1, 4], resamples=50)] == [2.0, 2.0]
    for r in rows:  # every run's checkpoint is there: zero-shot only for each arm's tuned LR's seed 0
        (tmp_path / r["key"] / "final").mkdir(parents=True, exist_ok=True)
        (tmp_path / r["key"] / "final" / "config.json").write_text("{}")
    zs = [j["key"] for j in frontier.zeroshot_jobs(g, rows, tmp_path)]
    assert {r["lr"] for r in rows if r["key"] in zs and r["method"] != "baseline"} == {2e-3} and zs
    for r in rows:  # the page shows zero-shot of the tuned LR's runs only, whatever rows carry it
        r["lambada_acc"] = 0.5
    assert {r["lr"] for r in zeroshot_rows(rows) if r["method"] != "baseline"} == {2e-3}
    (check, table), _ = checks_tables(g, rows)  # (the second: vcycle at 4x)
    assert table[0] == {"variant": "vcycle", "LR x0.5": "", "LR x1": "3.4000 [3.4000, 3.4000]",
                        "LR x2": "**3.3000 [3.3000, 3.3000]**"}  # the lower validation loss wins (paired seeds)
    assert table[1] == {"variant": "gstack", "LR x0.5": "", "LR x1": "", "LR x2": ""}
    # a best at the edge of the LRs a method ran is swept on, as a baseline's is, and its seeds wait for the sweep
    rows += [_row(big, 4, lr, 0, val, 3.0, method="stacking", variant="gstack")
             for lr, val in ((5e-4, 3.6), (1e-3, 3.5), (2e-3, 3.4))]
    wide = dataclasses.replace(g, lr_bounds=(1e-4, 1e-1), max_trials=8)
    assert frontier.method_sweep(wide, rows, "gstack", big, 4, 1e-3) == ([4e-3], None)
    assert frontier.method_sweep(g, rows, "gstack", big, 4, 1e-3) == ([], 2e-3)  # (the grid's max_trials: 3)
    rows += [_row(big, 4, 4e-3, 0, 3.45, 3.0, method="stacking", variant="gstack")]
    assert frontier.method_sweep(wide, rows, "gstack", big, 4, 1e-3) == ([], 2e-3)
    assert frontier.method_sweep(wide, rows, "vcycle", big, 4, 1e-3) == ([], 2e-3)  # its best is inside what it ran


def test_the_runs_added_to_settle_a_grid_run_after_every_other_job_step_by_step_and_seed_by_seed():
    """``Grid.more``: each step after every other job and after the steps before it; within a step seed 0's LRs, then
    seed by seed over every item listed (a stop half-way leaves the same seeds everywhere); a new cell is swept
    (extended at an edge) before its seeds run; a cell of the grid runs only the listed LRs it has not tried; a
    method step at factors is an LR check; and a job two parts plan runs once."""
    small, mid, big = (2, 64), (3, 64), (4, 64)
    more = (grid.More("a", cells=((big, 4), (small, 4)), seeds=(2, 3), methods=(("vcycle", 4),)),
            grid.More("b", cells=((mid, 4),), lrs=(1e-3, 2e-3), seeds=(1,)),
            grid.More("c", cells=((big, 4),), lrs=(1e-3, 2e-3, 4e-3)),
            grid.More("d", methods=(("vcycle", 4),), factors=(0.5, 2.0), seeds=(0,)),
            grid.More("e", cells=((big, 4),), seeds=(2,)))  # (planned in "a" already)
    g = dataclasses.replace(grid.SMOKE, sizes=(small, big), target=big, budgets=(1, 4), seeds=(0, 1), lrs=(1e-3,),
                            variants=("vcycle",), envelope_methods=False, more=more)
    assert g.baseline_sizes == [small, mid, big] and g.baseline_cells()[-1] == (mid, 4)  # the envelope is over it
    assert g.upto(1).more == () and g.all_checks == (grid.Check(big, 4, ("vcycle",), (0.5, 1.0, 2.0), (0,)),)
    flops = {small: 10, mid: 50, big: 100}
    rows = [_row(s, b, 1e-3, seed, v, v) for s, b, v in ((small, 1, 4.0), (small, 4, 3.0), (big, 1, 4.5),
                                                         (big, 4, 3.5)) for seed in (0, 1)]
    rows += [_row(big, b, 1e-3, seed, 3.4, 3.4, method="vcycle", variant="vcycle") for b in (1, 4) for seed in (0, 1)]

    def planned():  # (the rows' keys are not real config hashes: a row is matched on what it ran)
        done = {(r["variant"], envelope.size_of(r), r["budget"], r["lr"], r["seed"]) for r in rows}
        return [(j["order"][0], m["variant"], (m["layers"], m["width"]), m["lr"], m["seed"])
                for j in frontier.plan(g, rows, flops) if j["kind"] == "train" and (m := j["meta"])
                and (m["variant"], (m["layers"], m["width"]), m["budget"], m["lr"], m["seed"]) not in done]

    m = frontier.MORE
    assert planned() == [
        (m, "tuned", big, 1e-3, 2), (m, "tuned", small, 1e-3, 2), (m, "vcycle", big, 1e-3, 2),
        (m, "tuned", big, 1e-3, 3), (m, "tuned", small, 1e-3, 3), (m, "vcycle", big, 1e-3, 3),
        (m + 1, "tuned", mid, 1e-3, 0), (m + 1, "tuned", mid, 2e-3, 0),  # a new cell: its sweep first
        (m + 2, "tuned", big, 2e-3, 0), (m + 2, "tuned", big, 4e-3, 0),  # 1e-3 ran
        (m + 3, "vcycle", big, 5e-4, 0), (m + 3, "vcycle", big, 2e-3, 0)]
    rows += [_row(mid, 4, lr, 0, v, v) for lr, v in ((1e-3, 3.3), (2e-3, 3.2))]  # the best at the sweep's edge
    assert [p for p in planned() if p[0] == m + 1] == [(m + 1, "tuned", mid, 4e-3, 0)]
    rows += [_row(mid, 4, 4e-3, 0, 3.25, 3.25)]  # 2e-3 is interior: the sweep is over, its seeds run
    assert [p for p in planned() if p[0] == m + 1] == [(m + 1, "tuned", mid, 2e-3, 1)]
    rows += [_row(big, 4, 4e-3, 0, 3.0, 3.0)]  # a listed LR beats the tuned one, at the edge: the sweep goes on
    assert planned()[0] == (0, "tuned", big, 8e-3, 0)
    rows += [_row(big, 4, 8e-3, 0, 3.1, 3.1)]  # 4e-3 is the tuned LR now: the grid's own seeds run first
    got = planned()
    assert got[0] == (0.5, "tuned", big, 4e-3, 1) and (m, "tuned", big, 4e-3, 2) in got
    assert not [p for p in got if p[0] >= m and p[3] == 1e-3 and p[2] == big]  # nothing more at the old LR


def test_the_width_growth_variants_keep_the_depth_and_halve_the_width_of_their_coarse_level():
    """``width_grow`` and ``vcycle_paper_width`` grow into a 2-layer target (the envelope's shape at this grid's
    budgets) through a coarse level of the same depth and half the width; width_grow's growth is exact (alpha 1, the
    symmetry-breaking split) after the first 30% of the budget's steps."""
    from bench.lib.variants import overrides
    from progressive.config import load_config
    from progressive.methods import get_method
    from progressive.model.build import get_family, guess_data_info, step_flops

    for variant in ("width_grow", "vcycle_paper_width"):
        over = {**overrides(variant, 2), "model.num_layers": 2, "model.hidden_size": 128, "model.num_heads": 4,
                "data.vocab_size": 512, "train.steps": 1000}
        cfg = load_config(Path(grid.ROOT) / "configs" / "default.yaml", over)
        fam = get_family(cfg.model.family)
        phases = get_method(cfg, fam).plan(fam.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len),
                                           lambda c, n=None, cfg=cfg, fam=fam: step_flops(cfg, fam, c, n))
        assert [(p.config.n_layer, p.config.n_embd) for p in phases] == [(2, 128), (2, 64), (2, 128)], variant
    grow = overrides("width_grow", 2)
    assert grow["method.vcycle.width_split"] == "asymmetric" and grow["method.vcycle.levels"][0]["alpha"] == 1.0
    assert grow["method.vcycle.levels"][1]["down"]["fraction"] == 0.3
    from bench.lib.variants import method_of

    assert method_of("width_grow") == grow["method.name"] == "vcycle"  # its rows and pages group it with the V-cycle


def test_a_step_grows_its_methods_into_its_own_target_once_that_cells_sweep_is_over():
    """``More.target``: a step's methods grow into a size other than the grid's target (the envelope's shape), at the
    tuned LR of that size's cell at the budget; a new cell's methods wait for its sweep (and its LR move with it)."""
    small, big, wide = (2, 64), (4, 64), (2, 128)
    more = (grid.More("the new cell", cells=((wide, 4),), lrs=(1e-3, 2e-3)),
            grid.More("grow into it", methods=(("vcycle", 4),), seeds=(0, 1), target=wide))
    g = dataclasses.replace(grid.SMOKE, sizes=(small, big), target=big, budgets=(4,), seeds=(0, 1), lrs=(1e-3,),
                            variants=(), envelope_methods=False, more=more)
    flops = {small: 10, big: 100, wide: 60}
    rows = [_row(s, 4, 1e-3, seed, 3.0, 3.0) for s in (small, big) for seed in (0, 1)]

    def planned():
        done = {(r["variant"], envelope.size_of(r), r["lr"], r["seed"]) for r in rows}
        return [(m["variant"], (m["layers"], m["width"]), m["lr"], m["seed"], m["budget_flops"])
                for j in frontier.plan(g, rows, flops) if j["kind"] == "train" and (m := j["meta"])
                and (m["variant"], (m["layers"], m["width"]), m["lr"], m["seed"]) not in done]

    assert [p[0] for p in planned()] == ["tuned", "tuned"]  # the sweep first; no method before it is over
    rows += [_row(wide, 4, lr, 0, v, v) for lr, v in ((1e-3, 2.9), (2e-3, 2.8))]  # its best at an edge
    assert planned() == [("tuned", wide, 4e-3, 0, 400)]
    rows += [_row(wide, 4, 4e-3, 0, 2.85, 2.85)]  # 2e-3 is the tuned LR: the methods grow into 2x128 there
    assert planned() == [("vcycle", wide, 2e-3, 0, 400)]  # the budget stays the grid's (steps of its target)
    rows += [_row(wide, 4, 2e-3, 0, 2.7, 2.7, method="vcycle", variant="vcycle")]
    assert planned() == [("vcycle", wide, 2e-3, 1, 400)]


def test_the_layer_grid_settles_its_deciding_cells_first_and_its_rows_are_still_the_cache():
    """The layer grid's added runs, most decisive first: seeds 3-5 of the hull's cells where methods win (8x64 at
    9934, 4x64 at 14049, 2x64 at 2484) and of G_stack, StackBERT and Apollo there (and Apollo at 4967); then seed 3
    of the hull's neighbours; then the holes that can move the hull where methods save (6x64 at 9934 and, once it
    joined the hull there, its seeds 3-5; every size's LR over the whole range at 9934; 8x64's LR at 14049), before
    the neighbours' seeds 4-5; the other holes (6x64 at 14049, every LR over the whole range at 14049 and 4967);
    the methods' own LR; the paper's 4x G_stack at 9934, then at the smaller budgets and its own LR there; a second
    width at 9934; every LR at 2484; the second width at 14049. No committed row is planned again."""

    g = grid.LAYERS
    first = g.more[0]
    assert first.cells == (((8, 64), 9934), ((4, 64), 14049), ((2, 64), 2484)) and first.seeds == (3, 4, 5)
    assert first.methods == (("gstack2", 9934), ("stackbert", 9934), ("apollo_authors", 9934),
                             ("apollo_authors", 4967))
    steps = [m.what for m in g.more]
    order = ["seed 3 of the hull's neighbours", "6x64 at 9934", "seeds 3-5 of 6x64 at 9934",
             "every size's LR over the whole range at 9934", "8x64 at 14049", "seeds 4-5 of the hull's",
             "6x64 at 14049",
             "every size's LR over the whole range at the other", "own LR", "G_stack (4x", "G_stack at the smaller",
             "G_stack's own LR at the smaller", "second width at 9934",
             "second width at 9934 steps over the whole", "every size's LR over the whole range at 2484",
             "second width at 14049", "seeds 3-5 of 6x64 at 14049"]
    at = [next(i for i, w in enumerate(steps) if key in w) for key in order]
    assert at == sorted(at) and at[0] == 1
    assert {(6, 64), (2, 96), (6, 96), (4, 32), (8, 32)} <= set(g.baseline_sizes)
    assert all(c.size == g.target for c in g.all_checks) and g.all_checks[:len(g.checks)] == g.checks
    rows = frontier_rows.read_rows(Path(grid.ROOT) / "bench" / "results" / "frontier_layers.csv")
    flops = {s: grid.step_flops_of(g, s) for s in {*(c for c, _ in g.baseline_cells()), g.target}}
    fields = ("method", "variant", "layers", "width", "lr", "budget", "seed")
    done = {tuple(r[f] for f in fields) for r in rows}
    planned = [j for j in frontier.plan(g, rows, flops) if j["kind"] == "train"]
    assert not [j for j in planned if tuple(j["meta"][f] for f in fields) in done]
    assert [j["order"] for j in planned] == sorted(j["order"] for j in planned)


def test_report_to_wandb_logs_each_row_in_its_cells_group_and_the_results(tmp_path, monkeypatch):
    """--report_to wandb: one run per row, grouped by its cell, a method's run holding its savings, and a results
    run with the table and the plot; read back from the offline runs."""
    from bench.frontier.report import tracker_entries
    from bench.lib import tracking

    g = dataclasses.replace(grid.SMOKE, sizes=((2, 16), (2, 32)), target=(2, 32), budgets=(6,))
    rows = [_row((2, 32), 6, 3e-3, 1, 4.0, 4.1), _row((2, 32), 6, 3e-3, 0, 3.9, 4.0, method="vcycle", variant="vcycle")]
    for r in rows:
        r["code_version"] = "abc"
    save = [{"method": "vcycle", "variant": "vcycle", "target": "2x32", "budget": 6, "reference": "envelope",
             **{f"{a}_saved_{p}": v for a in ("flops", "wall") for p, v in (("mean", 0.1), ("lo", -0.2), ("hi", 0.3))},
             # the rest of what every savings row has (the reader checks them): one seed, so no verdict
             "budget_flops": 10**9, "seeds": 1, "reference_seeds": 1, "test_loss_mean": 4.0, "tokens_per_param": 1.0,
             **dict.fromkeys(("flops_bound", "flops_ci_bound", "wall_bound", "wall_ci_bound"), "="), "eligible": 0,
             "verdict_hull": "not eligible", "verdict": "not eligible"}]
    frontier_rows.write_csv(tmp_path / "savings.csv", save, frontier_rows.SAVINGS_COLUMNS)
    (tmp_path / "runs" / rows[1]["key"]).mkdir(parents=True)
    (tmp_path / "runs" / rows[1]["key"] / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1, "flops": 10, "loss": 5.5}\n{"kind": "val", "step": 1, "val_loss": 5}\n')
    entries = tracker_entries(g, rows, tmp_path, tmp_path / "runs")
    assert [e.group for e in entries] == ["frontier/2x32@6", "frontier/2x32@6", "frontier"]
    method = entries[1]
    assert (method.summary["envelope/flops_saved_lo"] == -0.2
            and method.history == [{"step": 1, "flops": 10, "loss": 5.5}])
    assert entries[0].history == [] and "envelope/flops_saved_mean" not in entries[0].summary
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.log("wandb", "growtrain", tmp_path / "log", "frontier", entries[1:]) == 2
    files = sorted((tmp_path / "log" / "wandb").glob("offline-run-*/run-*.wandb"))
    data = b"".join(p.read_bytes() for p in files)
    assert len(files) == 2 and b"frontier/2x32@6" in data and b"envelope/flops_saved_lo" in data
    assert b":\x05bench" in data  # job type
    assert tracking.log("none", "growtrain", tmp_path / "none", "frontier", entries) == 0
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_a_signal_to_the_grid_alone_stops_its_runs_with_a_checkpoint_and_the_same_command_resumes(tmp_path):
    """``kill PID`` or a scheduler signals the driver only: it passes the signal on, so the worker's run stops at its
    next step with a checkpoint, no job starts after it, the grid exits 75, and the rerun resumes the run."""
    from progressive.run import checkpoint as ckpt
    from progressive.run.faults import SIGNAL_ENV

    out, results = tmp_path / "runs", tmp_path / "results"

    def grid_cmd(jobs: int) -> list[str]:
        return [sys.executable, "-m", "bench.frontier", "--smoke", "--workers", "1", "--max_jobs", str(jobs),
                "--results", str(results), "--out", str(out)]

    # the worker signals its parent after step 2, then waits (up to a minute) for the stop passed back to it
    env = {**os.environ, SIGNAL_ENV: "2:SIGTERM:parent"}
    proc = subprocess.run(grid_cmd(2), cwd=grid.ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 75, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Stopped by SIGTERM: 1 run(s) left a checkpoint, 0 finished" in proc.stdout
    (run,) = [d for d in out.iterdir() if d.is_dir()]  # the second job never started
    assert ckpt.list_checkpoints(run) and not (run / "summary.json").exists()
    assert frontier_rows.read_rows(results / "frontier.csv") == []
    proc = subprocess.run(grid_cmd(1), cwd=grid.ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resuming" in (out / f"{run.name}.train.log").read_text()
    assert len(frontier_rows.read_rows(results / "frontier.csv")) == 1


def _damaged(tmp_path, damage: str):
    """A copy of the layer grid's committed rows with one damage, in a results folder of its own (with the savings
    the rows gave); returns (that folder, the rows file)."""

    results = tmp_path / "results"
    results.mkdir()
    committed = Path(grid.ROOT) / "bench" / "results"
    for name in ("frontier_layers.csv", "savings_layers.csv"):
        shutil.copy(committed / name, results / name)
    path = results / "frontier_layers.csv"
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    cells = lines[2].rstrip("\n").split(",")  # line 3 of the file
    if damage == "nan_loss":
        cells[header.index("val_loss")] = "nan"
    elif damage == "garbled_number":
        cells[header.index("lr")] = "0.0o4"
    elif damage == "short_row":
        cells = cells[:9]
    elif damage == "duplicate_key":
        cells[header.index("key")] = lines[1].rstrip("\n").split(",")[header.index("key")]
    lines[2] = ",".join(cells) + "\n"
    path.write_text("".join(lines))
    return results, path


@pytest.mark.parametrize("damage, said", [
    ("nan_loss", "line 3: val_loss is nan; a finished run's val_loss is a finite number"),
    ("garbled_number", "line 3: lr is '0.0o4', not a number"),
    ("short_row", "line 3: 9 cells, the header has 23 (a truncated or garbled row)"),
    ("duplicate_key", "line 3: the key b507324b48e91fb4 is also on line 2 (a run is one row)"),
])
def test_a_damaged_rows_file_is_refused_naming_the_file_and_line(tmp_path, damage, said):
    """One ``nan`` in a loss column made --report drop 14 savings rows and change 7 (``min(key=val_loss)`` keeps a
    leading NaN), exit 0; a garbled number or a cut row was a ValueError or TypeError naming neither file nor line."""
    _, path = _damaged(tmp_path, damage)
    with pytest.raises(ValueError) as e:
        frontier_rows.read_rows(path)
    assert str(e.value).startswith(f"{path}, {said}") and "\n" not in str(e.value)


def test_the_report_refuses_a_nan_loss_and_changes_nothing(tmp_path, capsys):
    results, path = _damaged(tmp_path, "nan_loss")
    before = {p.name: p.read_bytes() for p in results.iterdir()}
    assert frontier.main(["--grid", "layers", "--report", "--results", str(results)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}, line 3: val_loss is nan; a finished run's val_loss is a finite number (restore " \
                  "the file from git, or delete the row so the run is made again)"
    assert {p.name: p.read_bytes() for p in results.iterdir()} == before


@pytest.mark.parametrize("flag, value, said", [
    ("--max_jobs", "-3", "--max_jobs must be >= 0, got -3"), ("--workers", "-1", "--workers must be >= 0, got -1"),
    ("--max_budget", "0", "--max_budget must be >= 1, got 0"), ("--max_budget", "-5", "--max_budget must be >= 1"),
    ("--max_budget", "10", "--max_budget 10: no methods' budget of this grid is <= 10"),
])
def test_counts_and_budgets_out_of_range_are_one_line_before_any_work(tmp_path, capsys, flag, value, said):
    """``--max_jobs -3`` and ``--workers -1`` ran nothing and exited 0; ``--max_budget 0`` was a traceback."""
    argv = ["--report", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "runs")]
    assert frontier.main([*argv, flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {said}") and "\n" not in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "res").exists()


@pytest.mark.parametrize("args, said", [
    (["--reproduce", ""], "--reproduce: give a comma list, got ''"),
    (["--reproduce", " , "], "--reproduce: give a comma list, got ' , '"),
    (["--retime", ""], "--retime: give a comma list, got ''"),
    (["--report", "--reproduce", "k"], "--report and --reproduce are separate commands: give one of them"),
    (["--retime", "2x32", "--reproduce", "k"], "--retime and --reproduce are separate commands: give one of them"),
])
def test_an_empty_list_or_a_second_mode_is_one_line_and_never_runs_the_grid(tmp_path, capsys, args, said):
    """``--reproduce ""`` (an empty value reads as not given) ran the whole grid, and a --retime beside a
    --reproduce was ignored."""
    argv = ["--smoke", "--results", str(tmp_path / "res"), "--out", str(tmp_path / "runs")]
    assert frontier.main([*argv, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {said}") and "\n" not in err
    assert not any(tmp_path.iterdir())
