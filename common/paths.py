"""Where the bundled data and recipes are: ``data/`` and ``configs/`` of a clone, or their installed copies.

From a clone (or ``pip install -e .``) they are the repository's folders. ``pip install .`` ships them as
the packages ``growtrain_data`` and ``growtrain_configs`` (pyproject.toml maps the folders), so an installed
``growtrain-train`` finds the default recipe and the bundled corpus without a clone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["repo_folder", "DATA", "CONFIGS"]

_CLONE = Path(__file__).resolve().parents[1]


def repo_folder(name: str) -> Path:
    """The folder ``name`` ("data" or "configs"): the clone's, else the installed package's; the clone's path
    (which may not exist) when neither is there, so a missing file is named where a user expects it."""
    if (_CLONE / name).is_dir():
        return _CLONE / name
    spec = importlib.util.find_spec(f"growtrain_{name}")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return _CLONE / name


DATA = repo_folder("data")
CONFIGS = repo_folder("configs")
