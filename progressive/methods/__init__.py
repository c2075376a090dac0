"""The methods: one module per paper's algorithm, each registering itself; this package finds them.

    from progressive.methods import get_method
    method = get_method(cfg, family)          # the Method named by cfg.method.name
    phases = method.plan(base_config, step_flops)

The interface (Method, Phase, StepPlan, ModelChange, PhaseSpec, the LR schedule) and the registry are in
``base.py``. The methods are listed once, below: each one's name in recipes (``method.name: <name>``) and its
options dataclass (progressive/config/methods.py lists the sections ``method.<name>:``, so that reading a recipe
imports no method). A new method is a file that subclasses Method, one line in that list and its options
dataclass in progressive/config/methods.py (docs/architecture.md has the steps).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from progressive.config import ConfigError, RunConfig
from progressive.config.methods import PhaseSpec
from progressive.methods.apollo import Apollo
from progressive.methods.autofreeze import AutoFreeze
from progressive.methods.base import (
    METHODS,
    LRSchedule,
    Method,
    ModelChange,
    Phase,
    StepFlops,
    StepPlan,
    phase_flops,
    phase_schedule,
    register_method,
)
from progressive.methods.vcycle import VCycle

if TYPE_CHECKING:
    from progressive.model.build import Family

__all__ = ["METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "PhaseSpec", "StepFlops", "StepPlan",
           "get_method", "phase_flops", "phase_schedule", "register_method"]

# the methods (``baseline`` is Method itself, registered in base.py): recipe name -> class
for _name, _method in {"vcycle": VCycle, "apollo": Apollo, "autofreeze": AutoFreeze}.items():
    register_method(_name, _method)


def get_method(cfg: RunConfig, family: Family) -> Method:
    """The method named by cfg.method.name, built for ``cfg`` and ``family``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    if cfg.method.name not in METHODS:
        raise ConfigError(f"method.name: unknown method {cfg.method.name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[cfg.method.name](cfg, family)
