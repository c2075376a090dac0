"""The method folders: a method that is one folder, ``progressive/methods/<name>/``, is registered by its line in
``FOLDERS`` and by nothing else. The folder holds

    __init__.py   the paper and the algorithm, as its docstring (nothing imported)
    options.py    ``OPTIONS``: the dataclass of the recipe section ``method.<name>:`` (read without torch, numpy or
                  transformers: a recipe is parsed before any method is imported); ``VARIANTS``: the bench's
                  variants of it, {variant: layers -> overrides} (bench/lib/variants.py); ``GROUP``: its line on the
                  results page, (title, [(method, variant)]) (bench/pages/results.py)
    method.py     ``METHOD``: the Method subclass (progressive/methods/base.py), imported where a run is made

so its options reach the recipes (progressive/config/methods.py), its class ``method.name: <name>``, ``--compare``
and ``python train.py`` (progressive/methods/__init__.py), and its variants the frontier and the pages, from here.
The bench's variants of the V-cycle, Apollo and the stacking recipes were written before the folders and stay in
bench/lib/variants.py's table (with the V-cycle's recipe search), as do their lines on the results page.

It lives in the config, which reads it (progressive/config/methods.py), and names the folders by string, so the
config imports no module of progressive/methods/ by statement: the folders import the config, not the reverse.
This module imports nothing heavy.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["FOLDERS", "options", "method_class", "variants", "groups"]

FOLDERS = (
    "vcycle",  # multi-level training, the V-cycle (Zou, Zhang, Deng, ICLR 2024)
    "apollo",  # Apollo (Pan et al., AAAI 2024), and the stacking recipes as its special cases
    "autofreeze",  # AutoFreeze + AutoCache (PipeTransformer, He et al., ICML 2021)
    "midas",  # MIDAS: gradual stacking of the middle block (Saunshi et al., NeurIPS 2024)
)


def _options_module(name: str) -> ModuleType:
    return importlib.import_module(f"progressive.methods.{name}.options")


def options() -> dict[str, type]:
    """{method name: its options dataclass} of every folder."""
    return {name: _options_module(name).OPTIONS for name in FOLDERS}


def method_class(name: str) -> type:
    """The Method subclass of the folder ``name`` (imports its hooks, and with them torch)."""
    return importlib.import_module(f"progressive.methods.{name}.method").METHOD


def variants() -> dict[str, Callable[[int], dict[str, Any]]]:
    """The bench's variants of every folder, {variant: layers of the target -> config overrides}."""
    out: dict[str, Callable[[int], dict[str, Any]]] = {}
    for name in FOLDERS:
        out.update(getattr(_options_module(name), "VARIANTS", {}))
    return out


def groups() -> list[tuple[str, list[tuple[str, str]]]]:
    """The results page's line of every folder that has one: (title, [(method, variant)])."""
    return [g for name in FOLDERS if (g := getattr(_options_module(name), "GROUP", None)) is not None]


def variant_names() -> dict[str, str]:
    """{variant: the title of its folder's results-page line} for every folder's variants (the frontier pages' name
    of a cell): a new method is named on every page by its ``GROUP``."""
    return {variant: title for title, members in groups() for _, variant in members}
