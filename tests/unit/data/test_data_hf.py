"""Hugging Face text datasets: the hf:<name> path, through save_to_disk folders and the load seam."""

from __future__ import annotations

import numpy as np
import pytest

import progressive.data.sources as dt
from progressive.config import DataConfig
from progressive.data import build_tokenizer, load_token_blocks

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex bold jugglers".split()


def _docs(n, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=40)) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer(DataConfig())


def test_hf_dataset_with_validation_split_uses_it(gpt2, tmp_path):
    import datasets

    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": _docs(60, 0), "id": list(range(60))}),
        "validation": datasets.Dataset.from_dict({"text": _docs(10, 1), "id": list(range(10))}),
    })
    dd.save_to_disk(str(tmp_path / "ds"))
    cfg = DataConfig(dataset=f"hf:{tmp_path / 'ds'}", seq_len=32, cache_dir=str(tmp_path / "c"))
    b = load_token_blocks(cfg, gpt2)
    train_tokens = sum(len(gpt2(t)["input_ids"]) + 1 for t in _docs(60, 0))  # + eos per document
    val_tokens = sum(len(gpt2(t)["input_ids"]) + 1 for t in _docs(10, 1))
    assert len(b.train) == train_tokens // 32 and len(b.val) == val_tokens // 32
    assert gpt2.decode(b.val[0]).startswith(_docs(10, 1)[0][:30])


def test_hf_dataset_without_validation_is_split_by_seed(gpt2, tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load(name, config):  # the seam: stands in for datasets.load_dataset(name, config)
        calls.append((name, config))
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": _docs(50, 2)})})

    monkeypatch.setattr(dt, "load_hf_dataset", fake_load)
    cfg = DataConfig(dataset="hf:someone/corpus:en", text_field="body", seq_len=32, val_fraction=0.1,
                     cache_dir=str(tmp_path))
    b = load_token_blocks(cfg, gpt2)
    assert calls[0] == ("someone/corpus", "en")
    n = len(b.train) + len(b.val)
    assert len(b.val) == round(0.1 * n) and len(b.train) > 0


def test_hf_missing_text_field_is_named(gpt2, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(dt, "load_hf_dataset", lambda name, config: datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"content": ["hi"]})}))
    with pytest.raises(ValueError, match="no column 'text' \\(text_field\\)"):
        load_token_blocks(DataConfig(dataset="hf:x", cache_dir=str(tmp_path)), gpt2)


@pytest.mark.parametrize("num_proc", [1, 2])
def test_hf_sources_are_tokenized_with_datasets_map_into_the_same_stream(gpt2, tmp_path, num_proc, monkeypatch):
    """An hf: source goes through Dataset.map (num_proc workers, each on its own shard) into the uint16 token
    file; the stream equals the document-streaming path's, token for token (long documents in pieces, empty
    ones skipped, a separator after each), and no file is written next to the user's dataset."""
    import datasets

    from progressive.data import text as tx

    docs = _docs(40, 3)
    docs[5] = ""  # empty documents give nothing
    docs[7] = "\n".join(_docs(900, 4))  # a long one: encoded in line-aligned pieces
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs}),
                          "validation": datasets.Dataset.from_dict({"text": _docs(8, 5)})}).save_to_disk(
        str(tmp_path / "ds"))
    before = sorted(p.name for p in (tmp_path / "ds" / "train").iterdir())
    cfg = DataConfig(dataset=f"hf:{tmp_path / 'ds'}", seq_len=32, cache_dir=str(tmp_path / "c"), num_proc=num_proc)
    used, real = [], tx.tokenize_hf
    monkeypatch.setattr(tx, "tokenize_hf", lambda *a, **k: used.append(a[6]) or real(*a, **k))
    stream = tx.cached_stream(cfg, gpt2, "train", None, {"t": "x"})
    assert used == [num_proc]
    expected = tx.tokenize_stream(((str(i), d) for i, d in enumerate(docs)), gpt2, gpt2.eos_token_id, None,
                                  dtype=np.uint16)
    assert stream.dtype == np.uint16 and np.array_equal(np.asarray(stream), expected)
    assert sorted(p.name for p in (tmp_path / "ds" / "train").iterdir()) == before
    assert not list((tmp_path / "c" / "tokens").glob("*.map"))
