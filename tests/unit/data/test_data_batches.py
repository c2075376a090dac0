"""Deterministic batches (resume by step), BERT masking statistics, trained tokenizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from progressive.config import DataConfig
from progressive.data import (
    batch_indices,
    build_tokenizer,
    load_token_blocks,
    mlm_mask,
    sample_indices,
)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), b=st.integers(1, 64), seed=st.integers(0, 2**31), step=st.integers(0, 500))
def test_batch_for_a_step_is_a_pure_function_of_step(n, b, seed, step):
    if b > n:
        with pytest.raises(ValueError, match="too little data for one batch"):
            batch_indices(n, b, seed, step)
        return
    x = batch_indices(n, b, seed, step)
    assert x.dtype == np.int64 and len(x) == b and x.min() >= 0 and x.max() < n
    np.testing.assert_array_equal(x, batch_indices(n, b, seed, step))  # resume only needs the step
    np.testing.assert_array_equal(x, sample_indices(n, step * b, b, seed))


def test_each_epoch_visits_every_block_once_in_a_new_order():
    n, b = 96, 8  # 12 steps per epoch
    epoch0 = np.concatenate([batch_indices(n, b, 5, s) for s in range(12)])
    epoch1 = np.concatenate([batch_indices(n, b, 5, s) for s in range(12, 24)])
    assert sorted(epoch0) == list(range(n)) and sorted(epoch1) == list(range(n))
    assert not np.array_equal(epoch0, epoch1)
    assert not np.array_equal(epoch0, np.arange(n))


def test_batch_straddling_epochs_has_one_of_each_block_per_epoch():
    n, b = 10, 4
    stream = np.concatenate([batch_indices(n, b, 0, s) for s in range(5)])  # 20 samples = 2 epochs
    assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))


def test_different_seeds_give_different_orders():
    assert not np.array_equal(batch_indices(1000, 32, 0, 0), batch_indices(1000, 32, 1, 0))


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    cfg = DataConfig(tokenizer="wordpiece", vocab_size=512, max_tokens=50_000,
                     cache_dir=str(tmp_path_factory.mktemp("wp")))
    return cfg, build_tokenizer(cfg)


def test_mlm_mask_proportions_match_bert_80_10_10(wordpiece):
    cfg, tok = wordpiece
    ids = torch.from_numpy(np.array(load_token_blocks(cfg, tok).train[:300])).long()  # 300 x 128
    g = torch.Generator().manual_seed(0)
    out, labels = mlm_mask(ids, tok, generator=g)
    special = torch.isin(ids, torch.tensor(tok.all_special_ids))
    chosen = labels != -100
    n_chosen = chosen.sum().item()
    assert abs(n_chosen / (~special).sum().item() - 0.15) < 0.01
    assert not (chosen & special).any()  # [CLS]/[SEP] are never chosen
    assert torch.equal(labels[chosen], ids[chosen])
    frac_mask = (out[chosen] == tok.mask_token_id).float().mean().item()
    frac_keep = (out[chosen] == ids[chosen]).float().mean().item()
    assert abs(frac_mask - 0.8) < 0.02
    assert abs(frac_keep - 0.1) < 0.02  # kept + random tokens that happen to equal the original
    assert torch.equal(out[~chosen], ids[~chosen])


def test_mlm_mask_is_deterministic_with_a_generator(wordpiece):
    _, tok = wordpiece
    ids = torch.randint(5, len(tok), (4, 32))
    a = mlm_mask(ids, tok, generator=torch.Generator().manual_seed(7))
    b = mlm_mask(ids, tok, generator=torch.Generator().manual_seed(7))
    c = mlm_mask(ids, tok, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])


def test_mlm_mask_needs_a_mask_token():
    with pytest.raises(ValueError, match="mask token"):
        mlm_mask(torch.zeros(2, 4, dtype=torch.long), build_tokenizer(DataConfig()))


def test_wordpiece_blocks_start_with_cls_and_end_with_sep(wordpiece):
    cfg, tok = wordpiece
    b = load_token_blocks(cfg, tok)
    assert b.style == "bert"
    assert (b.train[:, 0] == tok.cls_token_id).all() and (b.train[:, -1] == tok.sep_token_id).all()
    assert (b.val[:, 0] == tok.cls_token_id).all()


def test_wordpiece_tokenizer_has_bert_specials_and_round_trips(wordpiece, tmp_path):
    _, tok = wordpiece
    assert set(tok.all_special_tokens) == {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    assert len(tok) <= 512 + 50  # limit_alphabet may add a few characters beyond vocab_size
    enc = tok("The war began.", "Peace followed.")["input_ids"]
    assert enc[0] == tok.cls_token_id and enc.count(tok.sep_token_id) == 2
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("The war began.")["input_ids"] == tok("The war began.")["input_ids"]
    assert again.mask_token_id == tok.mask_token_id


def test_trained_bpe_is_cached_and_round_trips(tmp_path, monkeypatch):
    cfg = DataConfig(tokenizer="bpe", vocab_size=512, max_tokens=20_000, cache_dir=str(tmp_path))
    tok = build_tokenizer(cfg)
    assert len(tok) == 512 and tok.eos_token == "<|endoftext|>"
    text = "Prince Andrew looked at the sky."
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless
    import progressive.data.tokenizers as dtk

    monkeypatch.setattr(dtk, "_train_tokenizer", lambda cfg: pytest.fail("cache miss: retrained"))
    assert build_tokenizer(cfg)(text)["input_ids"] == tok(text)["input_ids"]
    tok.save_pretrained(tmp_path / "saved")
    assert AutoTokenizer.from_pretrained(tmp_path / "saved")(text)["input_ids"] == tok(text)["input_ids"]
