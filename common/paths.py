"""Where the bundled data and recipes are: ``data/`` and ``configs/`` of a clone, or their installed copies.

From a clone (or ``pip install -e .``) they are the repository's folders. ``pip install .`` ships them as
the packages ``growtrain_data``, ``growtrain_configs`` and ``growtrain_launch`` (pyproject.toml maps the
folders), so an installed ``growtrain-train`` finds the recipes (``--config <name>``, ``--list``), the
launch configs and the bundled corpus without a clone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["repo_folder", "DATA", "CONFIGS", "LAUNCH", "recipes"]

_CLONE = Path(__file__).resolve().parents[1]


def repo_folder(name: str) -> Path:
    """The folder ``name`` ("data", "configs" or "launch"): the clone's, else the installed package's; the clone's path
    (which may not exist) when neither is there, so a missing file is named where a user expects it."""
    if (_CLONE / name).is_dir():
        return _CLONE / name
    spec = importlib.util.find_spec(f"growtrain_{name}")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return _CLONE / name


DATA = repo_folder("data")
CONFIGS = repo_folder("configs")
LAUNCH = repo_folder("launch")


def recipes() -> dict[str, Path]:
    """Every recipe by name: ``configs/<name>.yaml`` (laptop scale) and ``launch/recipes/<name>.yaml`` (the
    papers' scale), so ``--config <name>`` works in a clone and in an install alike."""
    found = {p.stem: p for p in sorted((LAUNCH / "recipes").glob("*.yaml"))}
    found.update({p.stem: p for p in sorted(CONFIGS.glob("*.yaml"))})
    return found
