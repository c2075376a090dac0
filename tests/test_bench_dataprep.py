"""bench/dataprep.py end to end on 20k tokens (--smoke): both tokenizer settings run, uint16 on disk."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dataprep_bench_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "dataprep.py"), "--smoke", "--out", str(tmp_path / "b")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "b" / "dataprep.json").read_text())["results"]
    assert [r["data.num_proc"] for r in rows] == [1, 2, 1] and all(r["tokens"] == 20_000 and r["dtype"] == "uint16" for r in rows)
    assert all(r["MB per 1M tokens (uint16)"] == 2.0 for r in rows)  # 2 bytes a token, nothing else in the file
