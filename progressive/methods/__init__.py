"""The methods: one folder per paper's algorithm (registry.py lists them); this package finds them.

    from progressive.methods import get_method
    method = get_method(cfg, family)          # the Method named by cfg.method.name
    phases = method.plan(base_config, step_flops)

The interface (Method, Phase, StepPlan, ModelChange, PhaseSpec, the LR schedule, the staged planner) and the
registry are in ``base.py``. A new method is a folder, ``progressive/methods/<name>/``, and one line in
``registry.FOLDERS`` (registry.py says what the folder holds).

Importing this package imports no method, nor torch: the recipes' reader (progressive/config/methods.py) reads the
folders' options through ``registry`` beside it. The names below are loaded, and every method registered, on first
use (``from progressive.methods import get_method``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# the config first, as a module (it may be what is importing this package): it reads the folders' options
# (registry.py), so it is loaded before any of them
import progressive.config
from progressive.config import registry
from progressive.config.phase import PhaseSpec

if TYPE_CHECKING:
    from progressive.config import RunConfig
    from progressive.methods.base import Method
    from progressive.model.build import Family

__all__ = ["METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "PhaseSpec", "StepFlops", "StepPlan",
           "get_method", "phase_flops", "phase_schedule", "register_method", "staged_phases"]

_BASE = {"METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "StepFlops", "StepPlan", "phase_flops",
         "phase_schedule", "register_method", "staged_phases"}
_registered = False


def _base() -> Any:
    """progressive.methods.base, with every method folder registered in its METHODS (once; ``baseline`` is Method
    itself, registered in base.py)."""
    global _registered
    base = importlib.import_module("progressive.methods.base")
    if not _registered:
        _registered = True
        for name in registry.FOLDERS:
            base.register_method(name, registry.method_class(name))
    return base


def __getattr__(name: str) -> Any:
    if name in _BASE:
        return getattr(_base(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_method(cfg: RunConfig, family: Family) -> Method:
    """The method named by cfg.method.name, built for ``cfg`` and ``family``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    methods = _base().METHODS
    if cfg.method.name not in methods:
        raise progressive.config.ConfigError(f"method.name: unknown method {cfg.method.name!r}; choose one of "
                                             f"{', '.join(methods)}")
    return methods[cfg.method.name](cfg, family)
