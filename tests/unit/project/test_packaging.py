"""The installable package: pyproject.toml lists every package of the flat layout, states compatible ranges that
hold the exact lock of requirements*.txt (what CI and the README install), ships data/, configs/ and launch/,
and names console commands that exist."""

import importlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
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
    assert found | {"growtrain_data", "growtrain_configs", "growtrain_launch"} == listed
    assert PROJECT["tool"]["setuptools"]["package-dir"] == {"growtrain_data": "data", "growtrain_configs": "configs",
                                                            "growtrain_launch": "launch"}


def test_the_lock_lies_inside_the_ranges_pyproject_states_and_a_vendor_torch_fits_them():
    from packaging.requirements import Requirement
    from packaging.version import Version

    lock = {**_pins((ROOT / "requirements.txt").read_text().splitlines()),
            **_pins((ROOT / "requirements-dev.txt").read_text().splitlines())}
    deps = list(PROJECT["project"]["dependencies"])
    for extra in PROJECT["project"]["optional-dependencies"].values():
        deps += [d for d in extra if not d.startswith("growtrain")]
    ranges = {r.name.lower(): r.specifier for r in map(Requirement, deps)}
    assert set(ranges) == set(lock)  # one set of packages
    for name, spec in ranges.items():
        assert spec and not any(s.operator == "==" for s in spec), (name, str(spec))  # a range, never a pin
        assert spec.contains(Version(lock[name])), (name, lock[name], str(spec))
        assert any(s.operator == "<" for s in spec), (name, str(spec))  # up to the next breaking version
    for torch_build in ("2.13.0+cpu", "2.13.0a0+gitabc123", "2.13.1", "2.11.0+cu130"):  # kept, not replaced
        assert ranges["torch"].contains(Version(torch_build), prereleases=True), torch_build


def test_console_commands_point_at_functions_that_exist():
    for command, target in PROJECT["project"]["scripts"].items():
        module, _, func = target.partition(":")
        assert callable(getattr(importlib.import_module(module), func)), command
