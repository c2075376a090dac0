"""What the help texts and docs tell a user holds on this checkout: paths they name exist as train.py
writes them, and packages they call missing are missing."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import yaml

from progressive.config import RunConfig
from tests.train_utils import ROOT


def test_eval_clis_name_checkpoints_where_train_py_writes_them():
    """Every ``<folder>/final`` in eval/'s docstrings and --help examples is ``outputs/<a recipe's name>/final``
    (the default output_dir and a name from configs/), or ``outputs/<name>/<method>/final`` for a recipe that
    trains its baseline beside its method (train.with_baseline), not a folder no run writes (``runs/bert/final``)."""
    folders = set()
    for p in (ROOT / "configs").glob("*.yaml"):
        recipe = yaml.safe_load(p.read_text())
        folder = f"{RunConfig().output_dir}/{recipe['name']}"
        both = recipe.get("train", {}).get("with_baseline")
        folders |= {f"{folder}/baseline", f"{folder}/{recipe['method']['name']}"} if both else {folder}
    named = {(p.name, m) for p in (ROOT / "eval").rglob("*.py")
             for m in re.findall(r"([\w./~-]+)/final\b", p.read_text()) if not m.startswith("<")}
    assert {"glue.py", "deit_transfer.py", "zeroshot.py"} <= {f for f, _ in named}
    assert sorted((f, m) for f, m in named if m not in folders) == []


def test_docs_call_no_package_missing_that_is_installed():
    installed = [line.split("==")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                 if "==" in line and not line.lstrip().startswith("#")]
    installed = [name for name in installed if importlib.util.find_spec(name.replace("-", "_")) is not None]
    assert "trackio" in installed and "wandb" in installed
    claims = [(p.name, name) for p in (ROOT / "docs").glob("*.md") for name in installed
              if re.search(rf"`?{re.escape(name)}`? is not installed", p.read_text())]
    assert claims == []


@pytest.mark.slow
def test_help_into_a_closed_pipe_is_quiet_and_installed_commands_name_themselves(monkeypatch):
    """``growtrain-train --help | head -3`` ended in a BrokenPipeError traceback, and an installed run printed
    ``python train.py ...`` as the command to resume it (no train.py there)."""

    from common.cli import program
    from progressive.config import load_config
    from progressive.run.state import resume_command
    from tests.train_utils import ROOT

    r, w = os.pipe()
    os.close(r)  # nobody reads: the first write fails with EPIPE
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], stdout=w, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(w)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/growtrain-train", "--help"])
    assert program() == "growtrain-train"
    assert resume_command(load_config(None, {"name": "x"})).startswith("growtrain-train --resume --name x")
    monkeypatch.setattr(sys, "argv", ["train.py"])
    assert resume_command(load_config(None, {"name": "x"})).startswith("python train.py --resume")
