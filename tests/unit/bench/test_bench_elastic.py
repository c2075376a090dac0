"""python -m bench.speed.elastic: the authors' compression rule reproduces the K schedule derived from their code,
and the simulation runs end to end at a tiny width (--smoke), writing every variant."""

import json
import sys

import pytest


def _bench():
    """bench.speed.elastic, imported when a test runs."""
    from bench.speed import elastic

    return elastic


def test_authors_rule_gives_their_vit_b_pipeline_lengths():
    """ViT-B/16, K_0 = 8: 0-4 frozen -> K 8, 5-8 -> 4, 9-10 -> 2, 11-12 -> 1 (derived from their code in
    shared/papers/pipetransformer.md, sec. 2), from the exact parameter counts of its sub-layers."""
    elastic = _bench()
    attn = 1536 + 3 * (768 * 768 + 768) + 768 * 768 + 768  # LayerNorm + q, k, v, o
    mlp = 1536 + 768 * 3072 + 3072 + 3072 * 768 + 768  # LayerNorm + fc1, fc2
    m = {"attn_params": attn, "layer_params": attn + mlp, "embed_params": 742_656, "head_params": 1536 + 769_000}
    assert [elastic.authors_k(m, 12, f) for f in range(13)] == [8] * 5 + [4] * 4 + [2] * 2 + [1] * 2


@pytest.mark.slow
def test_elastic_bench_smoke(tmp_path, monkeypatch):
    elastic = _bench()

    monkeypatch.setattr(sys, "argv", ["elastic.py", "--smoke", "--out", str(tmp_path)])
    elastic.main()
    (result,) = json.loads((tmp_path / "elastic.json").read_text())["results"]
    assert result["frozen"] == [0, 4, 7, 9, 10, 11, 11, 12, 12, 12]  # alpha 1/3, 10 epochs
    assert result["k_authors"][0] == result["k_ours"][0] == 8 and result["k_authors"][-1] == 1
    speed = result["speedup"]
    assert speed["fixed GPipe (K 8 x dp 2)"] == 1.0 and len(speed) == 8
    # freed devices as replicas beat leaving them idle, whatever the measured times
    assert speed["+ AutoPipe + AutoDP"] > speed["+ AutoPipe (freed devices idle)"]
