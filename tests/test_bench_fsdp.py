"""bench/fsdp.py end to end at a tiny width (--smoke): both modes run, the table and JSON are written."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fsdp_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fsdp.py"), "--smoke", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, cwd=ROOT, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "b" / "fsdp.json").read_text())["results"]
    assert [r["mode"] for r in rows] == ["ddp", "fsdp2"]
    assert all(len(r["level changes s"]) == 2 for r in rows)  # both V-cycle level changes ran in both modes
    # the same training: sharding changes where tensors live, not what is computed
    assert abs(rows[0]["final train loss"] - rows[1]["final train loss"]) < 1e-4
    assert rows[1]["weights+grads+AdamW per process MB (counted)"] < rows[0]["weights+grads+AdamW per process MB (counted)"]
