"""bench/autofreeze.py runs end to end (tiny sizes): pre-training, three variants, table, JSON, plot."""

import json
import sys

from tests.train_utils import ROOT


def test_autofreeze_bench_smoke(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "bench"))
    import autofreeze

    monkeypatch.setattr(sys, "argv", ["autofreeze.py", "--smoke", "--only", "bert", "--seeds", "0",
                                      "--out", str(tmp_path), "--data.cache_dir", str(ROOT / ".cache" / "data")])
    autofreeze.main()
    result = json.loads((tmp_path / "autofreeze.json").read_text())["results"]
    assert [r["variant"] for r in result] == ["plain", "autofreeze", "autofreeze+cache"]
    assert result[1]["FLOPs vs plain"] < 1 and result[1]["frozen at end"] >= 1
    assert (tmp_path / "autofreeze.png").stat().st_size > 0
