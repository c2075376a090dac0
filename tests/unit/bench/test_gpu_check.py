"""The prepared GPU check (``python -m bench.speed.gpu``) runs end to end with ``--smoke`` on the CPU, in an
environment like the GPU machines' image: no datasets, lm-evaluation-harness, wandb or evaluate."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from bench.pages.gpu import render
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
ONLY = ("anchor,readme_run,throughput,compare_124m,sigterm_resume,accelerate,compile_levels,eval:zeroshot,"
        "chain:bert_mlm")


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
    assert len(checks["compare_124m"]["vcycle_level_tflops"]) == 3  # down, coarse, up: each level's device rate
    anchor = set(checks["anchor"])
    assert {"12x768 chunked", "6x384 ce"} <= anchor or {"2x32 chunked", "1x16 ce"} <= anchor
    page = render(data)  # the page is the pages room's, from the JSON the check wrote
    assert page.startswith("# The GPU check") and "## Goals" in page and "a V-cycle level change" in page


def test_gpu_check_names_missing_packages_in_one_line(monkeypatch):

    from bench.speed import gpu

    real = importlib.util.find_spec
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda n, *a: None if n == "accelerate" else real(n, *a))
    assert gpu.missing_packages() == ["accelerate"]
    assert gpu.main(["--smoke"]) == 2


@pytest.mark.parametrize("only, said", [("", "--only: give a comma list, got ''"),
                                        ("anchor,nosuch", "--only nosuch: no check's name starts so; the checks: ")])
def test_an_empty_or_unknown_only_is_one_line_before_any_check(tmp_path, capsys, only, said):
    """On a GPU lease ``--only ""`` ran the whole suite (an empty value read as not given) and a misspelt
    prefix ran nothing, each using up a start of the machine."""
    from bench.speed import gpu

    assert gpu.main(["--smoke", "--only", only, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"bench.speed.gpu: {said}") and "\n" not in err
    assert not (tmp_path / "w").exists()


def test_a_page_mixing_runs_says_which_check_ran_under_what():
    """``--only`` keeps earlier checks beside re-run ones: the page names each group's date and versions."""
    from bench.speed import gpu

    env = {"device": "GPU", "torch": "2.13.0", "cuda": "13.0", "accelerate": "1.15.0", "transformers": "5.23.0",
           "python": "3.12"}
    old, new = gpu._ran("2026-01-01", env), gpu._ran("2026-01-02", {**env, "transformers": "5.17.0"})
    checks = {"readme_run": {"ok": True, "seconds": 1.0, "ran": new}, "recipe:llama": {"ok": True, "seconds": 2.0,
                                                                                     "ran": old}}
    page = render({"written_by": "x", "date": "2026-01-02", "environment": env, "checks": checks})
    assert "readme_run (2026-01-02, torch 2.13.0, accelerate 1.15.0, transformers 5.17.0)" in page
    assert "recipe:llama (2026-01-01," in page and "ran " not in page.split("## Checks")[1]
    one = render({"written_by": "x", "date": "2026-01-02", "environment": env,
                      "checks": {"readme_run": checks["readme_run"]}})
    assert "more than one run" not in one


def test_the_default_suite_is_the_anchor_and_the_two_comparisons_and_the_rest_runs_when_asked():
    from bench.speed.gpu import DECIDE, Check, plan, selected

    names = [n for _, checks in plan(Check(smoke=True, out=ROOT, deadline=0.0, jobs=1)) for n, _ in checks]
    assert names[:3] == list(DECIDE) == ["anchor", "compare_124m", "compare_350m"]
    assert [n for n in names if selected(n, [])] == list(DECIDE)
    assert all(selected(n, [], "full") for n in names) and "readme_run" in names and "compare_eager_124m" in names
    assert selected("compare_eager_124m", ["compare_eager"]) and not selected("compare_eager_124m", ["compare_124m"])


def test_the_goals_read_the_harness_against_the_anchor_and_the_levels_without_compilation():
    from bench.pages.gpu import goals

    checks = {"anchor": {"12x768 chunked": {"tflops": 400.0}, "6x384 chunked": {"tflops": 300.0}},
              "compare_124m": {"baseline_tflops": 392.0, "baseline_mfu": 0.46, "coarse_over_full": 0.85,
                               "flops_saved_%": 13.0, "wall_saved_excl_compile_%": 11.0, "wall_saved_%": 5.0}}
    got = {g: (v, met) for g, v, met in goals(checks, "NVIDIA H200")}
    assert got["harness >= 0.97x the bare compiled loop (GPT-2-124M, the same loss)"][1] == "yes"
    assert got["MFU >= 45% (GPT-2-124M, seq 1024, bf16, compiled)"] == ("46.0%", "yes")
    assert got["coarse level's FLOP/s >= 0.9x the full model's (GPT-2-124M)"][1] == "**no**"
    # the compile-free saving is the one judged: 11 >= 0.8 x 13
    assert got["V-cycle compile-free wall-clock saving >= 0.8x its FLOPs saving (GPT-2-124M)"] == \
        ("+11.0% wall vs +13.0% FLOPs", "yes")
    assert "MFU (GPT-2-124M, seq 1024, bf16, compiled)" in {g for g, _, _ in goals(checks, "NVIDIA A100")}
