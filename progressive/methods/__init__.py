"""The methods: one module or one folder per paper's algorithm; this package finds them.

    from progressive.methods import get_method
    method = get_method(cfg, family)          # the Method named by cfg.method.name
    phases = method.plan(base_config, step_flops)

The interface (Method, Phase, StepPlan, ModelChange, PhaseSpec, the LR schedule, the staged planner) and the
registry are in ``base.py``. A new method is a folder, ``progressive/methods/<name>/``, and one line in
``registry.FOLDERS`` (registry.py says what the folder holds). The methods written before the
folders are the modules listed below, with their options dataclasses in progressive/config/methods.py.

Importing this package imports no method, nor torch: the recipes' reader (progressive/config/methods.py) reads the
folders' options through ``registry`` beside it. The names below are loaded, and every method registered, on first
use (``from progressive.methods import get_method``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from progressive.methods import registry

if TYPE_CHECKING:
    from progressive.config import RunConfig
    from progressive.methods.base import Method
    from progressive.model.build import Family

__all__ = ["METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "PhaseSpec", "StepFlops", "StepPlan",
           "get_method", "phase_flops", "phase_schedule", "register_method", "staged_phases"]

# the methods written before the folders (``baseline`` is Method itself, registered in base.py): name -> module:class
MODULES = {"vcycle": "vcycle:VCycle", "apollo": "apollo:Apollo", "autofreeze": "autofreeze:AutoFreeze"}
_BASE = {"METHODS", "LRSchedule", "Method", "ModelChange", "Phase", "StepFlops", "StepPlan", "phase_flops",
         "phase_schedule", "register_method", "staged_phases"}
_registered = False


def _base() -> Any:
    """progressive.methods.base, with every method registered in its METHODS (once)."""
    global _registered
    base = importlib.import_module("progressive.methods.base")
    if not _registered:
        _registered = True
        for name, where in MODULES.items():
            module, cls = where.split(":")
            base.register_method(name, getattr(importlib.import_module(f"progressive.methods.{module}"), cls))
        for name in registry.FOLDERS:
            base.register_method(name, registry.method_class(name))
    return base


def __getattr__(name: str) -> Any:
    if name in _BASE:
        return getattr(_base(), name)
    if name == "PhaseSpec":
        from progressive.config.methods import PhaseSpec  # lazy: that module reads this package's registry

        return PhaseSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_method(cfg: RunConfig, family: Family) -> Method:
    """The method named by cfg.method.name, built for ``cfg`` and ``family``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    from progressive.config import ConfigError  # lazy: the config reads this package's registry

    methods = _base().METHODS
    if cfg.method.name not in methods:
        raise ConfigError(f"method.name: unknown method {cfg.method.name!r}; choose one of {', '.join(methods)}")
    return methods[cfg.method.name](cfg, family)
