"""What the help texts and docs tell a user holds on this checkout: paths they name exist as train.py
writes them, and packages they call missing are missing."""

import importlib.util
import re

import yaml

from progressive.config import RunConfig
from tests.train_utils import ROOT


def test_eval_clis_name_checkpoints_where_train_py_writes_them():
    """Every ``<folder>/final`` in eval/'s docstrings and --help examples is ``outputs/<a recipe's name>/final``
    (the default output_dir and a name from configs/), not a folder no run writes (``runs/bert/final``)."""
    names = {yaml.safe_load(p.read_text())["name"] for p in (ROOT / "configs").glob("*.yaml")}
    named = {(p.name, m) for p in (ROOT / "eval").rglob("*.py")
             for m in re.findall(r"([\w./~-]+)/final\b", p.read_text()) if not m.startswith("<")}
    assert {"glue.py", "deit_transfer.py", "zeroshot.py"} <= {f for f, _ in named}
    wrong = sorted((f, m) for f, m in named
                   if m.rpartition("/")[0] != RunConfig().output_dir or m.rpartition("/")[2] not in names)
    assert wrong == []


def test_docs_call_no_package_missing_that_is_installed():
    installed = [line.split("==")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                 if "==" in line and not line.lstrip().startswith("#")]
    installed = [name for name in installed if importlib.util.find_spec(name.replace("-", "_")) is not None]
    assert "trackio" in installed and "wandb" in installed
    claims = [(p.name, name) for p in (ROOT / "docs").glob("*.md") for name in installed
              if re.search(rf"`?{re.escape(name)}`? is not installed", p.read_text())]
    assert claims == []
