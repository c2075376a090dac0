"""The cluster benches end to end at tiny sizes (--smoke): bench/fsdp.py (FSDP2 vs DDP) and bench/dataprep.py
(token preparation): every mode runs, the tables and JSON are written. Their numbers mean nothing here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _smoke(script: str, out: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / script.replace(".py", ".md")).is_file()
    return json.loads((out / script.replace(".py", ".json")).read_text())["results"]


@pytest.mark.slow
def test_fsdp_bench_smoke(tmp_path):
    rows = _smoke("fsdp.py", tmp_path / "b")
    assert [r["mode"] for r in rows] == ["ddp", "fsdp2"]
    assert all(len(r["level changes s"]) == 2 for r in rows)  # both V-cycle level changes ran in both modes
    # the same training: sharding changes where tensors live, not what is computed
    assert abs(rows[0]["final train loss"] - rows[1]["final train loss"]) < 1e-4
    assert rows[1]["weights+grads+AdamW per process MB (counted)"] < rows[0]["weights+grads+AdamW per process MB (counted)"]


@pytest.mark.slow
def test_dataprep_bench_smoke(tmp_path):
    rows = _smoke("dataprep.py", tmp_path / "b")
    assert [r["data.num_proc"] for r in rows] == [1, 2, 1]
    assert all(r["tokens"] == 20_000 and r["dtype"] == "uint16" for r in rows)
    assert all(r["MB per 1M tokens (uint16)"] == 2.0 for r in rows)  # 2 bytes a token, nothing else in the file
