"""Text data: documents -> token stream (cached) -> fixed-length blocks with a seeded train/val split (cached).

Pipeline and caches (all under cfg.cache_dir, every write atomic: temporary sibling, then rename):

1. Source -> documents: progressive/data/sources.py (bundled corpus, local files, Hugging Face datasets).
2. Documents -> one token stream per split, with a separator after every document (eos for causal
   tokenizers, [SEP] for BERT-style ones), truncated at max_tokens. Cached as tokens/<key>.npy (int32),
   key = hash(source identity, tokenizer content, max_tokens, separator).
3. Stream -> blocks. Causal: consecutive seq_len-token slices. BERT-style: [CLS] + seq_len-2 tokens + [SEP].
   The last partial block is dropped. Split BY BLOCK: a permutation seeded by cfg.seed picks
   round(val_fraction * n) validation blocks (at least 1); train and val keep stream order. (By-document
   splitting was rejected: the bundled corpus has ~135 documents of very different lengths, so the val share
   would swing with the seed.) When the source has its own validation split, that is used whole instead.
   Cached as blocks/<key>/{train,val,train_ids,val_ids}.npy + meta.json, loaded with mmap_mode="r".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from common.io import atomic_open, atomic_write_json, publish_once
from progressive.data.cache import cache_key
from progressive.data.sources import read_documents, source_identity
from progressive.data.tokenizers import tokenizer_fingerprint

if TYPE_CHECKING:
    from progressive.data.config import DataConfig

__all__ = ["TokenBlocks", "load_token_blocks", "cached_stream", "pack_blocks", "block_style", "tokenize_stream"]

_CACHE_VERSION = 2  # 2: sources identified by content digests
_PIECE_CHARS = 16_384  # long documents are tokenized in line-aligned pieces of about this size
_BATCH_CHARS = 1 << 20  # characters per encode_batch call


@dataclass
class TokenBlocks:
    """Packed token blocks.

    train, val: int32 [N, seq_len] (read-only memory maps). train_ids, val_ids: int64 position of each
    block in its split's stream (block i covers stream[i*c:(i+1)*c], c = content tokens per block).
    style: "causal" or "bert". n_tokens: tokens in the stream(s) the blocks were cut from. path: cache folder.
    """

    train: np.ndarray
    val: np.ndarray
    train_ids: np.ndarray
    val_ids: np.ndarray
    seq_len: int
    style: str
    n_tokens: int
    path: Path


# ------------------------------------------------------------------------------------ tokenization


def _pieces(docs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, bool]]:
    """Split documents into line-aligned pieces; yields (piece, is_last_piece_of_document)."""
    for _, text in docs:
        start = 0
        while start < len(text):
            end = len(text) if len(text) - start <= _PIECE_CHARS else text.find("\n", start + _PIECE_CHARS)
            end = len(text) if end == -1 else end + 1
            yield text[start:end], end >= len(text)
            start = end


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust tokenizer directly: no per-call Python overhead
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def tokenize_stream(docs: Iterable[tuple[str, str]], tokenizer, sep_id: int | None, max_tokens: int | None,
                    desc: str = "tokenize") -> np.ndarray:
    """Tokenize documents into one int32 stream, ``sep_id`` after each document, cut at ``max_tokens``."""
    out: list[np.ndarray] = []
    total = 0
    batch: list[tuple[str, bool]] = []
    bar = tqdm(desc=desc, unit="tok", unit_scale=True, disable=None)

    def flush() -> None:
        nonlocal total
        for ids, (_, last) in zip(_encode(tokenizer, [p for p, _ in batch]), batch):
            arr = np.asarray(ids + ([sep_id] if last and sep_id is not None else []), dtype=np.int32)
            out.append(arr)
            total += len(arr)
            bar.update(len(arr))
        batch.clear()

    chars = 0
    for piece in _pieces(docs):
        batch.append(piece)
        chars += len(piece[0])
        if chars >= _BATCH_CHARS or (max_tokens is not None and chars >= 8 * (max_tokens - total)):
            flush()
            chars = 0
            if max_tokens is not None and total >= max_tokens:
                break
    if batch:
        flush()
    bar.close()
    stream = np.concatenate(out) if out else np.zeros(0, dtype=np.int32)
    return stream[:max_tokens] if max_tokens is not None else stream


def _separator(tokenizer, style: str) -> int | None:
    if style == "bert":
        return tokenizer.sep_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id


def block_style(tokenizer) -> str:
    """"bert" for tokenizers with [CLS]/[SEP]/[MASK] (blocks get [CLS] ... [SEP]), else "causal"."""
    has = all(getattr(tokenizer, f"{t}_token_id", None) is not None for t in ("cls", "sep", "mask"))
    return "bert" if has else "causal"


def cached_stream(cfg: DataConfig, tokenizer, split: str, max_tokens: int | None, source_id: dict) -> np.ndarray:
    """The token stream of ``split``, from cache or tokenized now (then cached). Memory-mapped int32."""
    style = block_style(tokenizer)
    sep = _separator(tokenizer, style)
    key = cache_key({"v": _CACHE_VERSION, "source": source_id, "split": split, "tok": tokenizer_fingerprint(tokenizer),
                "max_tokens": max_tokens, "sep": sep})
    path = Path(cfg.cache_dir) / "tokens" / f"{key}.npy"
    if not path.exists():
        stream = tokenize_stream(read_documents(cfg, split), tokenizer, sep, max_tokens, desc=f"tokenize {split}")
        with atomic_open(path) as f:
            np.save(f, stream)
    return np.load(path, mmap_mode="r")


# ------------------------------------------------------------------------------------------ blocks


def pack_blocks(stream: np.ndarray, seq_len: int, style: str, tokenizer) -> np.ndarray:
    """Cut ``stream`` into [N, seq_len] int32 blocks (BERT style: [CLS] + seq_len-2 tokens + [SEP])."""
    content = seq_len - 2 if style == "bert" else seq_len
    n = len(stream) // content
    body = np.asarray(stream[: n * content], dtype=np.int32).reshape(n, content)
    if style == "causal":
        return body
    cls = np.full((n, 1), tokenizer.cls_token_id, dtype=np.int32)
    sep = np.full((n, 1), tokenizer.sep_token_id, dtype=np.int32)
    return np.concatenate([cls, body, sep], axis=1)


def _write_blocks(folder: Path, train: np.ndarray, val: np.ndarray, train_ids, val_ids, meta: dict) -> None:
    with publish_once(folder) as tmp:
        for name, arr in (("train", train), ("val", val), ("train_ids", train_ids), ("val_ids", val_ids)):
            np.save(tmp / f"{name}.npy", arr)
        atomic_write_json(tmp / "meta.json", meta)


def load_token_blocks(cfg: DataConfig, tokenizer) -> TokenBlocks:
    """Tokenize cfg.dataset once, pack into blocks, split train/val by seed; cached and memory-mapped.

    Args:
        cfg: DataConfig (dataset, text_field, seq_len, val_fraction, seed, cache_dir, max_tokens).
        tokenizer: from build_tokenizer (its full content is part of the cache key).

    Returns:
        TokenBlocks with int32 [N, seq_len] train and val arrays.

    Raises:
        FileNotFoundError: missing data path. ValueError: bad seq_len/val_fraction, or too little data for
        one training block plus one validation block.
    """
    style = block_style(tokenizer)
    if cfg.seq_len < (3 if style == "bert" else 1):
        raise ValueError(f"seq_len={cfg.seq_len} is too short")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {cfg.val_fraction}")
    src = source_identity(cfg)
    val_split = src.get("val_split")
    key = cache_key({"v": _CACHE_VERSION, "source": src, "tok": tokenizer_fingerprint(tokenizer), "seq_len": cfg.seq_len,
                "seed": cfg.seed, "val_fraction": cfg.val_fraction, "max_tokens": cfg.max_tokens})
    folder = Path(cfg.cache_dir) / "blocks" / key
    if not (folder / "meta.json").exists():
        stream = cached_stream(cfg, tokenizer, "train", cfg.max_tokens, src)
        blocks = pack_blocks(stream, cfg.seq_len, style, tokenizer)
        n_tokens = len(stream)
        if val_split:  # the source's own validation split, capped in proportion to max_tokens
            vcap = None if cfg.max_tokens is None else max(int(cfg.max_tokens * cfg.val_fraction), cfg.seq_len)
            vstream = cached_stream(cfg, tokenizer, "validation", vcap, src)
            val = pack_blocks(vstream, cfg.seq_len, style, tokenizer)
            train, train_ids, val_ids = blocks, np.arange(len(blocks)), np.arange(len(val))
            n_tokens += len(vstream)
        else:
            n = len(blocks)
            n_val = max(1, round(n * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
            if n - n_val < 1:
                raise ValueError(
                    f"too little data: {n_tokens} tokens make {n} blocks of seq_len={cfg.seq_len}, not enough for "
                    f"a training block plus {n_val} validation block(s); raise max_tokens or lower seq_len"
                )
            perm = np.random.default_rng(cfg.seed).permutation(n)
            val_ids, train_ids = np.sort(perm[:n_val]), np.sort(perm[n_val:])
            train, val = blocks[train_ids], blocks[val_ids]
        if len(train) < 1 or (cfg.val_fraction > 0 and len(val) < 1):
            raise ValueError(f"too little data in {cfg.dataset!r}: {len(train)} train / {len(val)} val blocks")
        meta = {"dataset": cfg.dataset, "seq_len": cfg.seq_len, "style": style, "n_tokens": int(n_tokens),
                "n_train": len(train), "n_val": len(val), "seed": cfg.seed, "val_fraction": cfg.val_fraction,
                "max_tokens": cfg.max_tokens, "source": src}
        _write_blocks(folder, train, val, train_ids.astype(np.int64), val_ids.astype(np.int64), meta)
    meta = json.loads((folder / "meta.json").read_text())
    arrays = {k: np.load(folder / f"{k}.npy", mmap_mode="r") for k in ("train", "val", "train_ids", "val_ids")}
    return TokenBlocks(seq_len=cfg.seq_len, style=meta["style"], n_tokens=meta["n_tokens"], path=folder, **arrays)
