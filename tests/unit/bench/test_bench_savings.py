"""The V-cycle's recipe search (python -m bench.claims.vcycle_recipes): the frontier interpolation and its bounds
(bench.lib.envelope), the variants (bench.lib.variants), and a tiny end-to-end sweep."""

import json
import math
import sys

import pytest

from bench.lib.envelope import cost_at, frontier, saving
from bench.lib.variants import SWEEP, overrides, paper_vcycle
from tests.train_utils import ROOT


def test_cost_on_the_frontier_is_interpolated_log_log_and_bounded_outside_it():
    front = frontier([(4.0, 100.0), (3.0, 400.0), (2.5, 1600.0)])
    assert cost_at(front, 3.0) == (400.0, "=")
    c, kind = cost_at(front, math.sqrt(4.0 * 3.0))  # halfway in log-loss: halfway in log-cost
    assert kind == "=" and c == pytest.approx(200.0)
    assert cost_at(front, 2.0) == (1600.0, ">")  # better than the biggest baseline: a lower bound
    assert cost_at(front, 5.0) == (100.0, "<")
    assert saving(100.0, front, 3.0) == (pytest.approx(0.75), "=")
    assert saving(800.0, front, 2.0) == (pytest.approx(0.5), ">=")


@pytest.mark.slow
def test_savings_sweep_runs_end_to_end_and_resumes_from_its_cache(tmp_path, monkeypatch):
    from bench.claims import vcycle_recipes

    argv = ["vcycle_recipes.py", "--config", str(ROOT / "configs" / "tiny_test.yaml"), "--budgets", "10,20",
            "--method_budgets", "20", "--seeds", "0", "--only", "vcycle_paper", "--out", str(tmp_path),
            "--data.cache_dir", str(ROOT / ".cache" / "data")]
    monkeypatch.setattr(sys, "argv", argv)
    vcycle_recipes.main()
    result = json.loads((tmp_path / "savings.json").read_text())
    assert [r["variant"] for r in result["results"]] == ["baseline", "baseline", "vcycle_paper"]
    assert "%" not in result["results"][2]["FLOPs saved %"] and "±" in result["results"][2]["FLOPs saved %"]
    assert (tmp_path / "savings.png").stat().st_size > 0
    assert not list((tmp_path / "runs").rglob("loss_vs_*.png"))  # the bench's own figure, not one per run
    assert "3 runs made on" in result["note"] and "0 read from the cache" in result["note"]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    monkeypatch.setattr(sys, "argv", [*argv, "--results", str(tmp_path / "results")])
    vcycle_recipes.main()  # a second run of the sweep reuses every run; it records the page's data and figure
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["vcycle_recipes.json", "vcycle_recipes.png"]
    note = json.loads((tmp_path / "savings.json").read_text())["note"]
    assert "0 runs made on" in note and "3 read from the cache" in note  # says whose wall-clock


def test_run_cache_key_ignores_the_options_of_methods_that_do_not_run():
    from bench.lib.runs import config_hash
    from progressive.config import load_config

    recipe = ROOT / "configs" / "default.yaml"
    base = {"method.name": "baseline"}
    assert config_hash(load_config(recipe, base)) == \
        config_hash(load_config(recipe, {**base, "method.vcycle.levels.0.alpha": 0.9}))
    assert config_hash(load_config(recipe, base)) == config_hash(load_config(recipe, {**base, "train.plots": False}))
    assert config_hash(load_config(recipe, {"method.vcycle.levels.0.alpha": 0.25})) != \
        config_hash(load_config(recipe, {"method.vcycle.levels.0.alpha": 0.9}))


def test_vcycle_variants_do_not_depend_on_the_default_recipes_vcycle():
    """Each variant is one knob on the paper's proportions, named in full: tuning configs/default.yaml's
    V-cycle must not silently change what "vcycle_paper" measures (nor the cache key of its runs)."""
    from bench.lib.runs import config_hash
    from progressive.config import load_config

    recipe = ROOT / "configs" / "default.yaml"
    detuned = {"method.vcycle.levels.0.alpha": 0.9, "method.vcycle.levels.0.down.fraction": 0.3,
               "method.vcycle.levels.1.down.fraction": 0.2, "method.vcycle.levels.1.down.lr_scale": 1.0,
               "method.vcycle.depth_mode": "identity", "method.vcycle.optimizer_state": "reset"}
    for name in SWEEP:
        over = overrides(name)
        assert config_hash(load_config(recipe, over)) == config_hash(load_config(recipe, {**detuned, **over})), name
    paper = load_config(recipe, overrides("vcycle_paper")).method.vcycle
    assert paper.levels[0].alpha == 0.25 and paper.levels[0].down.fraction == 0.05
    assert paper.levels[1].down.fraction == 0.5 and paper.levels[1].down.lr_scale == 4.0
    assert paper.depth_mode == "copy" and paper.optimizer_state == "mapped"


def test_the_papers_recipe_is_read_from_the_vcycle_methods_defaults(monkeypatch):
    """One definition: bench's "vcycle_paper" follows VCycleConfig's default levels (progressive/methods/vcycle/)."""
    from progressive.methods.vcycle import options as vcycle

    assert paper_vcycle()["method.vcycle.levels.0.alpha"] == vcycle.VCycleConfig().levels[0].alpha == 0.25
    changed = vcycle.VCycleConfig()
    changed.levels[0].alpha = 0.3
    monkeypatch.setattr(vcycle, "VCycleConfig", lambda: changed)
    assert overrides("vcycle_paper")["method.vcycle.levels.0.alpha"] == 0.3
