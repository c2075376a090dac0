"""Text data: bundled GPT-2 tokenizer, packing, caching, seeded splits, local files, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from progressive.config import DataConfig
from progressive.data import build_tokenizer, load_token_blocks
from progressive.data.sources import source_identity
from progressive.data.text import cached_stream

MAX = 50_000


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer(DataConfig(tokenizer="gpt2"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


def test_bundled_gpt2_tokenizer_gives_real_gpt2_ids(gpt2):
    assert gpt2("Hello world")["input_ids"] == [15496, 995]
    assert len(gpt2) == 50257
    assert gpt2.eos_token_id == 50256
    assert gpt2("a<|endoftext|>b")["input_ids"] == [64, 50256, 65]  # the eos string stays one token


def test_gpt2_tokenizer_round_trips_through_save_pretrained(gpt2, tmp_path):
    gpt2.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "The Project Gutenberg EBook of War and Peace, 1869.\n\nCHAPTER I"
    assert again(text)["input_ids"] == gpt2(text)["input_ids"]
    assert again.eos_token_id == gpt2.eos_token_id == 50256


def test_blocks_cover_the_token_stream_in_order(gpt2, cache):
    cfg = DataConfig(cache_dir=cache, max_tokens=MAX, seq_len=64, val_fraction=0.05)
    b = load_token_blocks(cfg, gpt2)
    stream = cached_stream(cfg, gpt2, "train", MAX, source_identity(cfg))
    assert len(stream) == MAX and b.n_tokens == MAX
    n = MAX // 64
    assert len(b.train) + len(b.val) == n
    assert len(b.val) == round(n * 0.05)
    full = np.empty((n, 64), dtype=np.uint16)
    full[b.train_ids] = b.train
    full[b.val_ids] = b.val
    np.testing.assert_array_equal(full.ravel(), stream[: n * 64])
    assert sorted(np.concatenate([b.train_ids, b.val_ids]).tolist()) == list(range(n))
    assert b.train.dtype == np.uint16 and isinstance(b.train, np.memmap)  # 2 bytes per token on disk


def test_stream_decodes_back_to_the_corpus_text(gpt2, cache):
    cfg = DataConfig(cache_dir=cache, max_tokens=MAX)
    stream = cached_stream(cfg, gpt2, "train", MAX, source_identity(cfg))
    text = gpt2.decode(stream[:2000])
    with gzip.open("data/corpus/gutenberg_2600_war_and_peace.txt.gz", "rt", encoding="utf-8") as f:
        original = f.read(len(text) + 100).replace("\r\n", "\n")
    assert original.startswith(text)


def test_split_is_deterministic_by_seed_and_changes_with_it(gpt2, cache):
    a = load_token_blocks(DataConfig(cache_dir=cache, max_tokens=MAX, seed=1), gpt2)
    b = load_token_blocks(DataConfig(cache_dir=cache + "/other", max_tokens=MAX, seed=1), gpt2)  # recomputed
    c = load_token_blocks(DataConfig(cache_dir=cache, max_tokens=MAX, seed=2), gpt2)
    np.testing.assert_array_equal(a.val_ids, b.val_ids)
    np.testing.assert_array_equal(a.train, b.train)
    assert not np.array_equal(a.val_ids, c.val_ids)


def test_cache_hit_returns_identical_arrays_without_retokenizing(gpt2, cache, monkeypatch):
    cfg = DataConfig(cache_dir=cache, max_tokens=MAX, seed=3)
    first = load_token_blocks(cfg, gpt2)
    import progressive.data.text as dt

    monkeypatch.setattr(dt, "tokenize_stream", lambda *a, **k: pytest.fail("cache miss: re-tokenized"))
    again = load_token_blocks(cfg, gpt2)
    assert again.path == first.path
    np.testing.assert_array_equal(np.asarray(again.train), np.asarray(first.train))
    np.testing.assert_array_equal(np.asarray(again.val), np.asarray(first.val))


def test_no_half_written_cache_files_are_left(gpt2, cache):
    load_token_blocks(DataConfig(cache_dir=cache, max_tokens=MAX), gpt2)

    leftovers = [p for p in Path(cache).rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_documents_are_separated_by_eos(gpt2, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("one two three")
    (tmp_path / "d" / "b.txt").write_text("four five")
    cfg = DataConfig(dataset=str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), seq_len=4, val_fraction=0.3)
    stream = cached_stream(cfg, gpt2, "train", None, source_identity(cfg))
    want = gpt2("one two three")["input_ids"] + [50256] + gpt2("four five")["input_ids"] + [50256]
    assert stream.tolist() == want


def test_jsonl_reads_the_text_field_and_gz(gpt2, tmp_path):
    rows = [{"body": f"document number {i} says hello."} for i in range(40)]
    path = tmp_path / "x.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = DataConfig(dataset=str(path), text_field="body", cache_dir=str(tmp_path / "c"), seq_len=16, val_fraction=0.1)
    b = load_token_blocks(cfg, gpt2)
    assert gpt2.decode(np.concatenate([b.train.ravel(), b.val.ravel()])).count("hello") >= 30


def test_jsonl_missing_field_is_named(gpt2, tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"content": "hi"}) + "\n")
    with pytest.raises(ValueError, match="'text'.*text_field"):
        load_token_blocks(DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c")), gpt2)


def test_missing_path_is_named(gpt2, tmp_path):
    with pytest.raises(FileNotFoundError, match="no/such/corpus"):
        load_token_blocks(DataConfig(dataset=str(tmp_path / "no/such/corpus"), cache_dir=str(tmp_path)), gpt2)


def test_too_little_data_is_an_error(gpt2, tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("just a few words")
    with pytest.raises(ValueError, match="too little data"):
        load_token_blocks(DataConfig(dataset=str(path), cache_dir=str(tmp_path / "c"), seq_len=64), gpt2)


def test_unknown_tokenizer_is_an_error():
    with pytest.raises(ValueError, match="tokenizer='no-such-tokenizer-xyz'"):
        build_tokenizer(DataConfig(tokenizer="no-such-tokenizer-xyz"))


def test_publish_once_keeps_the_first_copy_and_a_crash_leaves_nothing(tmp_path):
    from common.io import publish_once

    target = tmp_path / "blocks" / "k"
    with publish_once(target) as tmp:
        (tmp / "meta.json").write_text("first")
    with publish_once(target) as tmp:  # a second rank finishing later: its copy is dropped
        (tmp / "meta.json").write_text("second")
    assert (target / "meta.json").read_text() == "first"
    with pytest.raises(RuntimeError), publish_once(tmp_path / "blocks" / "crash") as tmp:
        (tmp / "train.npy").write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert sorted(p.name for p in (tmp_path / "blocks").iterdir()) == ["k"]
