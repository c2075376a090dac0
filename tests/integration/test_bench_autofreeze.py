"""python -m bench.claims.autofreeze runs end to end (tiny sizes): pre-training, three variants, table, JSON, plot."""

import json
import sys

import pytest

from tests.train_utils import ROOT


@pytest.mark.slow
def test_autofreeze_bench_smoke(tmp_path, monkeypatch):
    from bench.claims import autofreeze

    monkeypatch.setattr(sys, "argv", ["autofreeze.py", "--smoke", "--only", "bert", "--seeds", "0",
                                      "--out", str(tmp_path), "--data.cache_dir", str(ROOT / ".cache" / "data")])
    autofreeze.main()
    result = json.loads((tmp_path / "autofreeze.json").read_text())["results"]
    assert [r["variant"] for r in result] == ["plain", "autofreeze", "autofreeze+cache"]
    assert result[1]["FLOPs vs plain"] < 1 and result[1]["frozen at end"] >= 1
    assert (tmp_path / "autofreeze.png").stat().st_size > 0


@pytest.mark.slow
def test_multi_epoch_bench_hits_the_cache_and_logs_every_decision(tmp_path, monkeypatch):
    from bench.claims import autofreeze_epochs

    monkeypatch.setattr(sys, "argv", ["autofreeze_epochs.py", "--smoke", "--seeds", "0", "--out", str(tmp_path)])
    autofreeze_epochs.main()
    rows = {r["variant"]: r for r in json.loads((tmp_path / "autofreeze_epochs.json").read_text())["results"]}
    assert list(rows) == ["plain", "bound", "argmin", "argmin+cache", "relative"]
    assert rows["argmin+cache"]["cache hits (run)"] > 0  # 2 epochs of 4 steps: the second epoch hits
    assert rows["argmin+cache"]["FLOPs vs plain"] < rows["argmin"]["FLOPs vs plain"] < 1
    # decisions after steps 2, 4 and 6 (the 8th ends the run)
    assert len(rows["argmin"]["decisions B/C->F (seed 0)"].split()) == 3
    assert rows["plain"]["criterion decided"] == "" and rows["bound"]["criterion decided"].endswith("of 3")


@pytest.mark.slow
def test_lm_bench_finetunes_the_frontier_checkpoint_and_pretrains(tmp_path, monkeypatch):
    """python -m bench.claims.autofreeze_lm --smoke: the frontier's (smoke) checkpoint is trained once and fine-tuned
    four ways from it; AutoFreeze runs fewer FLOPs than plain, the bound alone never has the criterion deciding, and the
    pre-training rows have a test loss."""
    from bench.claims import autofreeze_lm

    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["autofreeze_lm.py", "--smoke", "--seeds", "0", "--out", str(out),
                                      "--frontier_results", str(tmp_path)])
    autofreeze_lm.main()
    payload = json.loads((out / "autofreeze_lm.json").read_text())
    rows = {r["variant"]: r for r in payload["results"]}
    assert list(rows) == ["plain", "bound", "argmin", "relative"]
    assert all(rows[v]["FLOPs vs plain"] < 1 for v in ("bound", "argmin"))
    assert rows["bound"]["criterion decided"] == "0 of 1"  # one decision after the first epoch (the 2nd ends the run)
    assert payload["checkpoint"]["reproduced_test_loss"] is not None  # no frontier row here: it was trained
    assert payload["pretraining"][0]["AutoFreeze test loss"] > 0
