"""bench/savings.py: the frontier interpolation and its bounds, and a tiny end-to-end sweep."""

import json
import math
import sys

import pytest

from tests.train_utils import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import savings  # noqa: E402


def test_cost_on_the_frontier_is_interpolated_log_log_and_bounded_outside_it():
    front = savings.frontier([(4.0, 100.0), (3.0, 400.0), (2.5, 1600.0)])
    assert savings.cost_at(front, 3.0) == (400.0, "=")
    c, kind = savings.cost_at(front, math.sqrt(4.0 * 3.0))  # halfway in log-loss: halfway in log-cost
    assert kind == "=" and c == pytest.approx(200.0)
    assert savings.cost_at(front, 2.0) == (1600.0, ">")  # better than the biggest baseline: a lower bound
    assert savings.cost_at(front, 5.0) == (100.0, "<")
    assert savings.saving(100.0, front, 3.0) == (pytest.approx(0.75), "=")
    assert savings.saving(800.0, front, 2.0) == (pytest.approx(0.5), ">=")


@pytest.mark.slow
def test_savings_sweep_runs_end_to_end_and_resumes_from_its_cache(tmp_path, monkeypatch):
    argv = ["savings.py", "--config", str(ROOT / "configs" / "tiny_test.yaml"), "--budgets", "10,20",
            "--method_budgets", "20", "--seeds", "0", "--only", "vcycle_paper", "--out", str(tmp_path),
            "--data.cache_dir", str(ROOT / ".cache" / "data")]
    monkeypatch.setattr(sys, "argv", argv)
    savings.main()
    result = json.loads((tmp_path / "savings.json").read_text())
    assert [r["variant"] for r in result["results"]] == ["baseline", "baseline", "vcycle_paper"]
    assert "%" not in result["results"][2]["FLOPs saved %"] and "±" in result["results"][2]["FLOPs saved %"]
    assert (tmp_path / "savings.png").stat().st_size > 0
    assert "3 runs trained in this sitting" in result["note"] and "0 read from the cache" in result["note"]
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    savings.main()  # a second sitting reuses every run
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs
    note = json.loads((tmp_path / "savings.json").read_text())["note"]
    assert "0 runs trained in this sitting" in note and "3 read from the cache" in note  # says whose wall-clock


def test_run_cache_key_ignores_the_options_of_methods_that_do_not_run():
    from bench.runs import config_hash
    from progressive.config import load_config

    recipe = ROOT / "configs" / "default.yaml"
    base = {"method.name": "baseline"}
    assert config_hash(load_config(recipe, base)) == \
        config_hash(load_config(recipe, {**base, "method.vcycle.levels.0.alpha": 0.9}))
    assert config_hash(load_config(recipe, {"method.vcycle.levels.0.alpha": 0.25})) != \
        config_hash(load_config(recipe, {"method.vcycle.levels.0.alpha": 0.9}))


def test_vcycle_variants_do_not_depend_on_the_default_recipes_vcycle():
    """Each variant is one knob on the paper's proportions, named in full: tuning configs/default.yaml's
    V-cycle must not silently change what "vcycle_paper" measures (nor the cache key of its runs)."""
    from bench.runs import config_hash
    from progressive.config import load_config

    recipe = ROOT / "configs" / "default.yaml"
    detuned = {"method.vcycle.levels.0.alpha": 0.9, "method.vcycle.levels.0.down.fraction": 0.3,
               "method.vcycle.levels.1.down.fraction": 0.2, "method.vcycle.levels.1.down.lr_scale": 1.0,
               "method.vcycle.depth_mode": "identity", "method.vcycle.optimizer_state": "reset"}
    for name, over in savings.VARIANTS.items():
        assert config_hash(load_config(recipe, over)) == config_hash(load_config(recipe, {**detuned, **over})), name
    paper = load_config(recipe, savings.VARIANTS["vcycle_paper"]).method.vcycle
    assert paper.levels[0].alpha == 0.25 and paper.levels[0].down.fraction == 0.05
    assert paper.levels[1].down.fraction == 0.5 and paper.levels[1].down.lr_scale == 4.0
    assert paper.depth_mode == "copy" and paper.optimizer_state == "mapped"
