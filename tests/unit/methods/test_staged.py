"""The staged planner every stage-wise growth shares (progressive.methods.base.staged_phases): stages start at
their boundaries, the last (full) stage fills the FLOPs budget of train.steps full steps, one schedule or one per
stage, and a stage without steps or budget is a one-line error naming the field."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from progressive.config import ConfigError
from progressive.methods.base import staged_phases

T = SimpleNamespace(steps=100, lr=1e-3, warmup=0.1, decay="linear", min_lr_ratio=0.0, cooldown=0.2)


def test_the_last_stage_fills_the_budget_and_the_schedule_spans_the_stages():
    cost = {0: 10, 1: 20, 2: 40}  # FLOPs a step of each stage's plain model (no shared layers)
    phases, starts = staged_phases(T, ["a", "b", "c"], ["cfg0", "cfg1", "cfg2"], [0.2, 0.5], cost[2],
                                   lambda k, lo, hi: ((hi - lo) * cost[k], float(k + 1)), True, 3.0, where="w")
    assert starts == [0, 20, 50]
    assert [p.steps for p in phases] == [20, 30, (100 * 40 - 20 * 10 - 30 * 20) // 40]  # 80 full steps left
    assert [p.schedule_offset for p in phases] == [0, 20, 50] and {p.schedule_steps for p in phases} == {130}
    assert [p.flops for p in phases] == [200, 600, 3200] and phases[-1].mean_layers == 3.0
    per, _ = staged_phases(T, ["a", "b"], ["cfg0", "cfg1"], [0.5], 40, lambda k, lo, hi: ((hi - lo) * 10, 1.0),
                           False, 2.0, where="w")
    assert [(p.schedule_offset, p.schedule_steps) for p in per] == [(0, None), (0, None)]


def test_a_stage_without_steps_or_a_last_stage_without_budget_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"w\[0\]: stage 0 \(1 layer\) gets no step"):
        staged_phases(T, ["a", "b"], [0, 1], [0.001], 40, lambda k, lo, hi: (0, 1.0), True, 2.0, where="w",
                      labels=["1 layer", "2 layers"])
    with pytest.raises(ConfigError, match="w: no FLOPs budget left for the last stage"):
        staged_phases(T, ["a", "b"], [0, 1], [0.9], 40, lambda k, lo, hi: ((hi - lo) * 50, 1.0), True, 2.0, where="w")
