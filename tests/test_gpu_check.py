"""The prepared GPU check (``python -m bench.speed.gpu``) runs end to end with ``--smoke`` on the CPU, in an
environment like the GPU machines' image: no datasets, lm-evaluation-harness, wandb or evaluate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.train_utils import ROOT

BLOCKER = '''
import importlib.metadata, importlib.util, sys
GONE = ("datasets", "lm_eval", "wandb", "evaluate")
def _gone(name):
    return str(name).split(".")[0].replace("-", "_") in GONE
class _Gone:
    def find_spec(self, name, path=None, target=None):
        if _gone(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
_spec, _version, _dist = importlib.util.find_spec, importlib.metadata.version, importlib.metadata.distribution
importlib.util.find_spec = lambda name, package=None: None if _gone(name) else _spec(name, package)
def _missing(fn):
    def wrapped(name, *a, **k):
        if _gone(name):
            raise importlib.metadata.PackageNotFoundError(name)
        return fn(name, *a, **k)
    return wrapped
importlib.metadata.version, importlib.metadata.distribution = _missing(_version), _missing(_dist)
sys.meta_path.insert(0, _Gone())
'''
ONLY = "readme_run,throughput,compare_124m,sigterm_resume,accelerate,compile_levels,eval:zeroshot,chain:bert_mlm"


@pytest.mark.slow
def test_gpu_check_smoke_runs_every_kind_of_check_without_the_packages_the_gpu_image_lacks(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    probe = subprocess.run([sys.executable, "-c", "import datasets"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0  # the environment really lacks them
    work = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, "-m", "bench.speed.gpu", "--smoke", "--jobs", "2", "--workdir", str(work),
                           "--only", ONLY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((work / "gpu.json").read_text())
    checks = data["checks"]
    assert {"readme_run", "throughput", "compare_124m", "sigterm_resume", "accelerate_1gpu", "accelerate_fsdp",
            "compile_levels", "eval:zeroshot", "recipe:bert_mlm", "eval:glue", "recipe:autofreeze_sst2"} <= set(checks)
    assert checks["sigterm_resume"]["identical"] and checks["sigterm_resume"]["stopped_exit"] == 75
    assert checks["accelerate_1gpu"]["identical"]
    assert checks["accelerate_fsdp"]["ok"] is None and "skipped" in checks["accelerate_fsdp"]
    tiny = checks["throughput"]["tiny (CPU) eager"]
    assert tiny["harness_tok_s"] > 0 and tiny["max_loss_diff"] < 1e-4  # the losses paired at the same steps
    assert len(checks["compare_124m"]["level_change_s"]) == 2
    assert len(checks["compare_124m"]["vcycle_phase_tflops"]) == 3  # down, coarse, up: each level's device rate
    page = (work / "gpu.md").read_text()
    assert page.startswith("# The GPU check") and "## Goals" in page and "a V-cycle level change" in page


def test_gpu_check_names_missing_packages_in_one_line(monkeypatch):
    import importlib.util

    from bench.speed import gpu

    real = importlib.util.find_spec
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda n, *a: None if n == "accelerate" else real(n, *a))
    assert gpu.missing_packages() == ["accelerate"]
    assert gpu.main(["--smoke"]) == 2


def test_a_page_mixing_runs_says_which_check_ran_under_what():
    """``--only`` keeps earlier checks beside re-run ones: the page names each group's date and versions."""
    from bench.speed import gpu

    env = {"device": "GPU", "torch": "2.13.0", "cuda": "13.0", "accelerate": "1.15.0", "transformers": "5.23.0",
           "python": "3.12"}
    old, new = gpu._ran("2026-01-01", env), gpu._ran("2026-01-02", {**env, "transformers": "5.17.0"})
    checks = {"readme_run": {"ok": True, "seconds": 1.0, "ran": new}, "recipe:llama": {"ok": True, "seconds": 2.0,
                                                                                     "ran": old}}
    page = gpu.render({"written_by": "x", "date": "2026-01-02", "environment": env, "checks": checks})
    assert "readme_run (2026-01-02, torch 2.13.0, accelerate 1.15.0, transformers 5.17.0)" in page
    assert "recipe:llama (2026-01-01," in page and "ran " not in page.split("## Checks")[1]
    one = gpu.render({"written_by": "x", "date": "2026-01-02", "environment": env,
                      "checks": {"readme_run": checks["readme_run"]}})
    assert "more than one run" not in one


def test_the_compiled_comparison_runs_only_when_named():
    from bench.speed.gpu import Check, plan, selected

    names = [n for _, checks in plan(Check(smoke=True, out=ROOT, deadline=0.0, jobs=1)) for n, _ in checks]
    assert "compare_compiled_124m" in names
    assert not selected("compare_compiled_124m", []) and selected("compare_124m", [])
    assert selected("compare_compiled_124m", ["compare_compiled"]) and not selected("compare_compiled_124m", ["compare_124m"])
