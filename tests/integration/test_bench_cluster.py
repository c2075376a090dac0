"""The cluster benches end to end at tiny sizes (--smoke): bench.speed.fsdp (FSDP2 vs DDP) and bench.speed.dataprep
(token preparation): every mode runs, the tables and JSON are written. Their numbers mean nothing here."""

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke(name: str, out: Path, monkeypatch) -> list[dict]:
    """``python -m bench.speed.<name> --smoke --out OUT`` through the module's main in this process (it starts its
    measured processes itself; a driver of its own would only add an interpreter's start-up)."""
    module = importlib.import_module(f"bench.speed.{name}")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--smoke", "--out", str(out)])
    monkeypatch.chdir(ROOT)
    module.main()  # a failed measurement raises SystemExit with its error line
    assert (out / f"{name}.md").is_file()
    return json.loads((out / f"{name}.json").read_text())["results"]


@pytest.mark.slow
def test_fsdp_bench_smoke(tmp_path, monkeypatch):
    rows = _smoke("fsdp", tmp_path / "b", monkeypatch)
    assert [r["mode"] for r in rows] == ["ddp", "fsdp2"]
    assert all(len(r["level changes s"]) == 2 for r in rows)  # both V-cycle level changes ran in both modes
    # the same training: sharding changes where tensors live, not what is computed
    assert abs(rows[0]["final train loss"] - rows[1]["final train loss"]) < 1e-4
    assert (rows[1]["weights+grads+AdamW per process MB (counted)"]
            < rows[0]["weights+grads+AdamW per process MB (counted)"])


@pytest.mark.slow
def test_dataprep_bench_smoke(tmp_path, monkeypatch):
    rows = _smoke("dataprep", tmp_path / "b", monkeypatch)
    assert [(r["source"].split()[0], r["data.num_proc"]) for r in rows] == [
        ("bundled", 1), ("bundled", 2), ("bundled", 1), ("hf:", 1), ("hf:", 2)]
    assert all(r["tokens"] == 20_000 for r in rows[:3])
    assert rows[3]["tokens"] == rows[4]["tokens"] > 0  # Dataset.map gives one stream for any num_proc
    assert all(r["dtype"] == "uint16" for r in rows)
    assert all(r["MB per 1M tokens (uint16)"] == 2.0 for r in rows)  # 2 bytes a token, nothing else in the file
