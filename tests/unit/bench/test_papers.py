"""The paper commands (bench/papers): each --smoke run trains, evaluates and records its page's data, which the
pages room renders (bench/pages/papers.py); re-runs reuse."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _papers(paper: str, out: Path, *extra: str) -> str:

    res = subprocess.run([sys.executable, "-m", "bench.papers", paper, "--smoke", "--out", str(out), *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=900, env={**os.environ, "WANDB_MODE": "offline"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def _papers_here(capsys, paper: str, out: Path, *extra: str) -> str:
    """The same command through its main in this process (for a re-run that reuses every run: no second
    interpreter's start-up); what it printed on stdout."""
    from bench.papers.__main__ import main

    capsys.readouterr()
    assert main([paper, "--smoke", "--out", str(out), *extra]) == 0
    return capsys.readouterr().out


def _page(paper: str, folder: Path) -> str:
    """The page ``python -m bench.pages`` renders from the json a --smoke run recorded in ``folder``."""
    from bench.pages import papers

    assert not list(folder.glob("*.md"))  # the command records data, never a page
    data = json.loads((folder / f"papers_{paper}.json").read_text())
    assert data["written_by"] == f"growtrain python -m bench.papers {paper}"
    assert data["run"]["command"] == f"python -m bench.papers {paper} --smoke" and data["commands"]
    return papers.pages(folder, folder)[folder / f"{paper}.md"]


def _row(page: str, label: str) -> list[str]:
    line = next(ln for ln in page.splitlines() if ln.startswith("|") and label in ln)
    return [c.strip() for c in line.strip("|").split("|")]


@pytest.mark.slow
def test_multilevel_smoke_writes_the_three_tables_and_a_rerun_trains_nothing(tmp_path, capsys):
    out = _papers("multilevel", tmp_path)
    page = _page("multilevel", tmp_path)
    for section in ("## GPT-2", "## BERT", "## DeiT", "paper: GPT-Base", "paper: BERT-Base", "paper: DeiT-B"):
        assert section in page
    assert (tmp_path / "multilevel.png").is_file() and "](multilevel.png)" in page
    # the V-cycle rows carry a saving and zero-shot scores on all four bundled sets
    row = _row(page, "V-cycle (this project's recipe)")
    assert re.search(r"-?\d+\.\d%", " ".join(row)) and len(row) >= 13
    assert "training in" in out
    again = _papers_here(capsys, "multilevel", tmp_path)
    assert "training in" not in again and "reusing" in again


@pytest.mark.slow
def test_apollo_smoke_draws_every_method_for_both_models(tmp_path, capsys):
    _papers("apollo", tmp_path)
    page = _page("apollo", tmp_path)
    for model in ("GPT-2", "BERT"):
        for method in ("baseline", "Apollo", "StackBERT", "G_stack"):
            assert re.search(rf"\| {re.escape(model)} \| {method} \|", page), (model, method)
    assert "## GLUE after pre-training" in page and (tmp_path / "apollo.png").is_file()
    # --report_to wandb: the runs (reused now) as W&B runs grouped by model, and the page's figure
    out = _papers_here(capsys, "apollo", tmp_path, "--report_to", "wandb")
    assert "W&B: 9 runs of papers-apollo logged" in out
    data = b"".join(p.read_bytes() for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert b"papers/apollo/GPT-2" in data and b"papers/apollo/BERT" in data and b"final_val_loss" in data
    assert list((tmp_path / "wandb").glob("offline-run-*/files/media/images/apollo*.png"))


@pytest.mark.slow
def test_pipetransformer_smoke_runs_the_elastic_pipeline_for_real(tmp_path):
    _papers("pipetransformer", tmp_path)
    page = _page("pipetransformer", tmp_path)
    for label in ("GPipe K=2", "all four", "AutoFreeze + AutoCache, 1 process"):
        assert label in page
    # the two-process runs happened: their summaries list each process's mesh; the elastic one went K 2 -> 1, dp 2
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json")]
    two = [s for s in summaries if s.get("world_size") == 2]
    assert len(two) == 2
    assert any(t["k"] == 1 and t["dp"] == 2 for s in two for t in s["transitions"])
    assert "simulated" in page and "torchrun --nproc_per_node 2" in page


def test_equal_accuracy_speedup_reads_the_baselines_time_to_the_runs_accuracy():
    from bench.papers.pipetransformer import equal_accuracy_speedup

    def val(step, acc, wall):
        return {"kind": "val", "step": step, "val_accuracy": acc, "wall": wall}

    base = [val(0, 0.1, 0.0), val(1, 0.3, 10.0), val(2, 0.4, 20.0), {"kind": "train", "step": 2}]
    assert equal_accuracy_speedup(base, [val(1, 0.4, 10.0)]) == "2.00x"  # GPipe needed 20 s for 40%
    assert equal_accuracy_speedup(base, [val(1, 0.3, 20.0)]) == "0.50x"  # slower than GPipe to 30%
    assert equal_accuracy_speedup(base, [val(1, 0.5, 10.0)]) == ">= 2.00x"  # GPipe never got to 50%


def test_simulator_scales_the_profiled_microbatch_to_the_one_autopipe_chose():
    """The engine profiles one micro-batch of B / world samples; a run whose AutoPipe chose 8 micro-batches
    instead of 2 runs micro-batches a quarter that size: the bubble model predicts (M + K - 1) x the smaller
    stage time, not 4x the time of the same work."""
    from bench.papers.pipetransformer import simulate

    no_comm = {"p2p": (0.0, 0.0), "allreduce": (0.0, 0.0)}

    def run(m):  # 64 samples on 2 processes, K 2, dp 1: the profile is one micro-batch of 32 samples, 100 ms/stage
        return {"transitions": [{"k": 2, "dp": 1, "microbatches": m, "frozen": 0, "steps": [0, 10],
                                 "profiled_ms_per_stage": [100.0, 100.0], "seconds": 0.0}]}

    assert simulate(run(2), no_comm, 0.0, 0.0, 4, 64) == pytest.approx(10 * 3 * 0.1)  # (2 + 1) x 100 ms
    assert simulate(run(8), no_comm, 0.0, 0.0, 4, 64) == pytest.approx(10 * 9 * 0.025)  # (8 + 1) x 25 ms


def test_deit_seeds_are_summarized_as_mean_with_min_and_max():
    from bench.lib.envelope import spread as _spread
    from bench.papers.multilevel import _acc

    assert _spread([(0.1, "="), (-0.3, "=")]) == "-10.0% [-30.0, 10.0]"
    assert _spread([(0.1, ">="), (0.3, "=")]).startswith(">= 20.0%")  # a value and a >= bound: a >= bound
    assert _spread([(0.25, "=")]) == "25.0%"  # one seed (--smoke): the saving alone
    assert _acc([{"val_accuracy": 0.30}, {"val_accuracy": 0.34}]) == "32.0 [30.0, 34.0]"


def test_a_papers_page_is_rendered_from_its_json_and_check_names_it_when_stale(tmp_path, monkeypatch, capsys):
    """docs/results/<paper>.md is what the pages room renders from bench/results/papers_<paper>.json: a value changed
    in the json changes the page, and ``python -m bench.pages --check`` names that page (and only it) as stale."""
    from bench import pages
    from bench.pages import papers
    from bench.pages.text import DOCS, RESULTS

    for paper in papers.PAPERS:
        (tmp_path / f"papers_{paper}.json").write_text(papers.data_path(paper).read_text())
    monkeypatch.setattr(papers, "data_path", lambda paper, results=RESULTS: tmp_path / f"papers_{paper}.json")
    assert pages.main(["--check"]) == 0  # the committed pages are what their json gives

    data = json.loads((tmp_path / "papers_apollo.json").read_text())
    row = next(r for r in data["tables"]["glue"] if r["pre-training"] == "Apollo")
    assert row["GLUE avg"] == "34.8"
    row["GLUE avg"], data["run"]["wall_s"], data["notes"]["mlm_loss"] = "99.9", 60.0, 1.234
    (tmp_path / "papers_apollo.json").write_text(json.dumps(data))
    page = papers.pages()[DOCS / "apollo.md"]
    assert "| Apollo | 0.0 | 50.9 | 74.8 | 1.6 | 46.9 | 99.9 |" in page
    assert "This run of the command: 1.0 min" in page and "MLM loss of 1.23 (" in page
    assert pages.main(["--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "docs/results/apollo.md differs from what python -m bench.pages generates"]


def test_a_papers_figure_lies_beside_its_json_and_the_page_links_it_from_there(tmp_path):
    """The committed pages link their figure in bench/results/; a page rendered beside its json (a --smoke run's
    folder) links the file next to it."""
    from bench.pages import papers
    from bench.pages.text import DOCS, RESULTS

    for paper in ("multilevel", "apollo"):
        page = (DOCS / f"{paper}.md").read_text()
        link = re.search(r"!\[validation loss vs FLOPs\]\(([^)]+)\)", page)[1]
        assert link == f"../../bench/results/{paper}.png" and (DOCS / link).resolve() == RESULTS / f"{paper}.png"
        assert (RESULTS / f"{paper}.png").is_file() and not (DOCS / f"{paper}.png").exists()
        (tmp_path / f"papers_{paper}.json").write_text(papers.data_path(paper).read_text())
        assert f"]({paper}.png)" in papers.pages(tmp_path, tmp_path)[tmp_path / f"{paper}.md"]


def test_a_pages_command_line_spells_what_reproduces_the_numbers_read_from_each_fields_mark(tmp_path):
    """The commands section keeps the overrides that change a run's numbers (the LR, the data it reads) and drops,
    by their marks, how it is watched, where it lies and where this machine caches its data."""
    from bench.papers import core

    ctx = core.Context(paper="apollo", out=tmp_path, smoke=True, frontier_results=tmp_path, frontier_out=tmp_path)
    core.record_command(ctx, "configs/apollo.yaml", {"train.lr": 0.001, "data.dataset": "shared/x.jsonl",
                                                     "train.progress": False, "train.report_to": "none",
                                                     "train.plots": False, "data.cache_dir": "/tmp/c",
                                                     "output_dir": "/tmp/runs", "method.apollo.stages": [1, 2]})
    assert ctx.commands == ["python train.py --config configs/apollo.yaml --train.lr 0.001 --data.dataset "
                            "shared/x.jsonl --method.apollo.stages [1, 2]"]


def test_the_link_measurements_children_import_neither_torch_nor_transformers_with_their_module():
    """measure_comm's workers are spawned: each child imports its target's module first, so that module stays
    light (it once lived beside the paper's code and each child loaded transformers before measuring)."""
    probe = ("import sys, bench.lib.comm; "
             "print(sorted(m for m in ('torch', 'transformers', 'progressive') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
