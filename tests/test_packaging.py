"""The installable package: pyproject.toml lists every package of the flat layout, pins what requirements.txt
pins (one set of versions), ships data/ and configs/, and names console commands that exist."""

import importlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(lines):
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_every_package_of_the_flat_layout_is_listed_and_data_and_configs_ship():
    listed = set(PROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("common", "operators", "eval", "progressive")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found | {"growtrain_data", "growtrain_configs"} == listed
    assert PROJECT["tool"]["setuptools"]["package-dir"] == {"growtrain_data": "data", "growtrain_configs": "configs"}


def test_pyproject_pins_the_versions_requirements_txt_pins():
    req = _pins((ROOT / "requirements.txt").read_text().splitlines())
    deps = list(PROJECT["project"]["dependencies"])
    for extra in PROJECT["project"]["optional-dependencies"].values():
        deps += [d for d in extra if not d.startswith("growtrain")]
    dev = _pins((ROOT / "requirements-dev.txt").read_text().splitlines())
    assert _pins(deps) == {**req, **dev}


def test_console_commands_point_at_functions_that_exist():
    for command, target in PROJECT["project"]["scripts"].items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), command
