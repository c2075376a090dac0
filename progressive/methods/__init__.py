"""The methods: one module per paper's algorithm, each registering itself; this package finds them.

    from progressive.methods import get_method
    method = get_method(cfg, family)          # the Method named by cfg.method.name
    phases = method.plan(base_config, step_flops)

The interface (Method, Phase, StepPlan, ModelChange, PhaseSpec, the LR schedule) and the registry are in
``base.py``. Every other module of this package is imported here, so a new method is a new file that
subclasses Method and calls ``register_method``: no list to edit (docs/architecture.md has the steps).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from progressive.config import ConfigError, RunConfig
from progressive.methods.base import (
    METHODS,
    LRSchedule,
    Method,
    ModelChange,
    Phase,
    PhaseSpec,
    StepFlops,
    StepPlan,
    phase_flops,
    phase_schedule,
    register_method,
)

if TYPE_CHECKING:
    from progressive.model.build import Family

__all__ = ["METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "PhaseSpec", "StepFlops", "StepPlan",
           "get_method", "phase_flops", "phase_schedule", "register_method"]

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")


def get_method(cfg: RunConfig, family: Family) -> Method:
    """The method named by cfg.method.name, built for ``cfg`` and ``family``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    if cfg.method.name not in METHODS:
        raise ConfigError(f"method.name: unknown method {cfg.method.name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[cfg.method.name](cfg, family)
