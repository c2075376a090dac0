"""Tokenizers: the bundled GPT-2 BPE, a byte-level BPE or WordPiece trained on the corpus (cached), or any
Hugging Face tokenizer. Every one is a PreTrainedTokenizerFast that save_pretrained / AutoTokenizer round-trip.

Why the bundled GPT-2 path does not use GPT2Tokenizer(vocab_file, merges_file): in transformers 5.23 that gives an
empty tokenizer (docs/data_and_flops.md). The Rust ByteLevelBPETokenizer built from the same two files gives the real
GPT-2 ids ("Hello world" -> [15496, 995]).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from common.hub import HubUnavailable, hub_call
from common.io import atomic_write_json, publish_once
from common.paths import DATA
from progressive.data.cache import CacheDamaged, building, cache_key, check_sealed, every_file, seal
from progressive.data.identity import NotKnown
from progressive.data.sources import read_documents, source_identity

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["build_tokenizer", "bundled_gpt2_tokenizer", "tokenizer_fingerprint", "TRAINED_KINDS"]

GPT2_DIR = DATA / "tokenizers" / "gpt2"
EOT = "<|endoftext|>"
BERT_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                 "mask_token": "[MASK]"}
TRAINED_KINDS = ("bpe", "wordpiece")
_CHARS_PER_CAPPED_TOKEN = 6  # with max_tokens set, train a tokenizer on about this many characters per token
_TOKENIZER_CACHE_VERSION = 2  # 2: sources identified by content digests


def bundled_gpt2_tokenizer() -> PreTrainedTokenizerFast:
    """The GPT-2 BPE tokenizer from data/tokenizers/gpt2/{vocab.json,merges.txt}.gz (vocab 50257).

    Raises:
        FileNotFoundError: the bundled files are missing.
    """
    from tokenizers import ByteLevelBPETokenizer

    files = [GPT2_DIR / "vocab.json.gz", GPT2_DIR / "merges.txt.gz"]
    for f in files:
        if not f.exists():
            raise FileNotFoundError(f"bundled GPT-2 tokenizer file {f} is missing (tokenizer='gpt2')")
    with gzip.open(files[0], "rt", encoding="utf-8") as f:
        vocab = json.load(f)
    with gzip.open(files[1], "rt", encoding="utf-8") as f:
        lines = [ln for ln in f.read().split("\n") if ln and not ln.startswith("#version")]
    merges = [tuple(ln.split(" ")) for ln in lines]
    bpe = ByteLevelBPETokenizer(vocab=vocab, merges=merges, add_prefix_space=False, trim_offsets=False)
    # GPT-2 has no pad token; padding with eos is the usual convention and keeps the vocabulary at 50257.
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOT, bos_token=EOT,
                                   unk_token=EOT, pad_token=EOT)


def _training_text(cfg: DataConfig) -> Iterator[str]:
    budget = None if cfg.max_tokens is None else cfg.max_tokens * _CHARS_PER_CAPPED_TOKEN
    used = 0
    for _, text in read_documents(cfg, "train"):
        for start in range(0, len(text), 1 << 16):  # chunks keep the trainer's memory flat
            chunk = text[start:start + (1 << 16)]
            if budget is not None:
                chunk = chunk[: budget - used]
            used += len(chunk)
            yield chunk
            if budget is not None and used >= budget:
                return


def _train_tokenizer(cfg: DataConfig) -> PreTrainedTokenizerFast:
    if cfg.vocab_size < 300:
        raise ValueError(f"vocab_size={cfg.vocab_size} is too small for a trained tokenizer (>= 300)")
    if cfg.tokenizer == "bpe":
        from tokenizers import ByteLevelBPETokenizer

        bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=False)
        bpe.train_from_iterator(_training_text(cfg), vocab_size=cfg.vocab_size, min_frequency=2,
                                special_tokens=[EOT], show_progress=False)
        return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOT, bos_token=EOT,
                                       unk_token=EOT, pad_token=EOT)
    from tokenizers import BertWordPieceTokenizer

    # BERT-uncased conventions: lower-case, strip accents; its post-processor adds [CLS] a [SEP] (b [SEP]).
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(_training_text(cfg), vocab_size=cfg.vocab_size, min_frequency=2,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                           limit_alphabet=min(1000, cfg.vocab_size // 2), show_progress=False)
    from tokenizers.processors import BertProcessing

    # The special ids exist only after training, so the [CLS] a [SEP] post-processor is attached now.
    wp._tokenizer.post_processor = BertProcessing(("[SEP]", wp.token_to_id("[SEP]")),
                                                  ("[CLS]", wp.token_to_id("[CLS]")))
    return PreTrainedTokenizerFast(tokenizer_object=wp._tokenizer, **BERT_SPECIALS)


def tokenizer_entry(cfg: DataConfig, hash_new: bool = True) -> Path:
    """The cache folder of the tokenizer trained for ``cfg`` (its source, kind, vocabulary and token cap);
    ``hash_new``: as ``source_identity``'s."""
    key = cache_key({
        "v": _TOKENIZER_CACHE_VERSION, "source": source_identity(cfg, hash_new), "kind": cfg.tokenizer,
        "vocab_size": cfg.vocab_size, "max_tokens": cfg.max_tokens,
    }, length=16)
    return Path(cfg.cache_dir) / "tokenizers" / f"{cfg.tokenizer}-{cfg.vocab_size}-{key}"


def _trained_tokenizer(cfg: DataConfig) -> PreTrainedTokenizerFast:
    folder = tokenizer_entry(cfg)
    with building(folder):  # one builder a folder; the others wait and read it
        if not folder.is_dir():  # published whole (publish_once): a folder there is an entry, maybe a damaged one
            print(f"training a {cfg.tokenizer} tokenizer (vocabulary {cfg.vocab_size}) on {cfg.dataset}; it is "
                  f"cached in {folder} for later runs", file=sys.stderr, flush=True)
            tok = _train_tokenizer(cfg)
            with publish_once(folder) as tmp:
                tok.save_pretrained(str(tmp))
                atomic_write_json(tmp / "meta.json", seal(tmp, _record(cfg), every_file))
    return _cached_tokenizer(folder, cfg)


def known_tokenizer(cfg: DataConfig) -> PreTrainedTokenizerFast:
    """The tokenizer ``build_tokenizer`` gives, found without training one or hashing the source (a dry run).

    Raises:
        NotKnown: a tokenizer trained on the data (bpe, wordpiece) that is not in the cache, a source whose
            identity is not known yet (progressive.data.sources.source_identity), or one that cannot be loaded here
            (a Hub name offline).
    """
    if cfg.tokenizer not in TRAINED_KINDS:
        try:
            return build_tokenizer(cfg)
        except (HubUnavailable, ValueError, OSError) as e:
            raise NotKnown(f"tokenizer={cfg.tokenizer!r} cannot be loaded here: {e}") from None
    folder = tokenizer_entry(cfg, hash_new=False)
    if not folder.is_dir():
        raise NotKnown(f"no {cfg.tokenizer} tokenizer of {cfg.vocab_size} tokens was trained on {cfg.dataset} in "
                       f"{cfg.cache_dir} yet")
    return _cached_tokenizer(folder, cfg)


def _cached_tokenizer(folder: Path, cfg: DataConfig) -> PreTrainedTokenizerFast:
    """The tokenizer cached in ``folder``, its files checked against their seal first (an entry from before
    sealing, without meta.json, is sealed once it loads: trust on first read, as the block entries are).

    Raises:
        CacheDamaged: a file is missing, cut or edited, or does not load; naming it and the folder to delete.
    """
    sealed = (folder / "meta.json").exists()
    if sealed:
        check_sealed(folder, cfg.cache_dir, every_file)
    try:
        tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    except Exception as e:  # noqa: BLE001  (the Rust loader raises plain Exception for a damaged tokenizer.json)
        raise CacheDamaged(f"data cache {folder / 'tokenizer.json'} cannot be read as a tokenizer "
                           f"({type(e).__name__}: {e}); delete {folder} and it is built again") from None
    if not sealed:
        try:
            atomic_write_json(folder / "meta.json", seal(folder, _record(cfg), every_file))
        except OSError:  # a read-only cache: sealed for this run only
            pass
    return tok


def _record(cfg: DataConfig) -> dict:
    """What a tokenizer entry's meta.json says besides its seal."""
    return {"kind": cfg.tokenizer, "vocab_size": cfg.vocab_size}


def build_tokenizer(cfg: DataConfig) -> PreTrainedTokenizerFast:
    """The tokenizer named by cfg.tokenizer.

    "gpt2": bundled GPT-2 BPE. "bpe" / "wordpiece": trained on cfg.dataset's training text at cfg.vocab_size
    (with max_tokens set, on about 6 characters per capped token), cached under cfg.cache_dir/tokenizers keyed
    by (source identity, kind, vocab size, max_tokens). Anything else: AutoTokenizer.from_pretrained (HF name
    or local folder).

    Raises:
        FileNotFoundError: bundled files or the dataset path are missing.
        ValueError: a name that is neither a known kind, a local folder, nor a loadable HF tokenizer.
    """
    if cfg.tokenizer == "gpt2":
        return bundled_gpt2_tokenizer()
    if cfg.tokenizer in TRAINED_KINDS:
        return _trained_tokenizer(cfg)
    try:
        if Path(cfg.tokenizer).is_dir():
            tok = AutoTokenizer.from_pretrained(cfg.tokenizer)
        else:
            tok = hub_call(f"tokenizer={cfg.tokenizer!r}", lambda: AutoTokenizer.from_pretrained(cfg.tokenizer))
    except HubUnavailable:
        raise
    except (OSError, ValueError) as e:
        raise ValueError(
            f"tokenizer={cfg.tokenizer!r} is not 'gpt2', 'bpe', 'wordpiece', a local tokenizer folder, or a Hugging "
            f"Face tokenizer that can be loaded here (offline?): {e}"
        ) from e
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"tokenizer={cfg.tokenizer!r} has no fast (Rust) version; packing needs one")
    return tok


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's full content (vocab, merges, normalizer, specials): part of cache keys."""
    h = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode())
    h.update(json.dumps(sorted(map(str, tokenizer.all_special_tokens))).encode())
    return h.hexdigest()[:20]
