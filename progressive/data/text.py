"""Text data: documents -> token stream (cached) -> fixed-length blocks with a seeded train/val split (cached).

Pipeline and caches (all under cfg.cache_dir, every write atomic: temporary sibling, then rename):

1. Source -> documents: progressive/data/sources.py (bundled corpus, local files, Hugging Face datasets).
2. Documents -> one token stream per split, with a separator after every document (eos for causal
   tokenizers, [SEP] for BERT-style ones), truncated at max_tokens. Written to disk batch by batch as it is
   tokenized (the corpus and its tokens are never held in memory whole) and cached as tokens/<key>.u16
   (uint16, a vocabulary of at most 65,536 ids; .u32 otherwise): 2 bytes per token where int32 took 4, sealed by
   its size and sha256 in tokens/<key>.u16.json (checked when blocks are cut from it again).
   key = hash(source identity, tokenizer content, max_tokens, separator).
3. Stream -> blocks. Causal: consecutive seq_len-token slices. BERT-style: [CLS] + seq_len-2 tokens + [SEP].
   The last partial block is dropped. Split BY BLOCK: a permutation seeded by cfg.seed picks
   round(val_fraction * n) validation blocks (at least 1); train and val keep stream order. (By-document
   splitting was rejected: the bundled corpus has ~135 documents of very different lengths, so the val share
   would swing with the seed.) When the source has its own validation split, that is used whole instead.
   Cached as blocks/<key>/{train,val,train_ids,val_ids}.npy + meta.json (blocks in the stream's dtype, filled
   a chunk of blocks at a time from the memory-mapped stream), loaded with mmap_mode="r": every process of a
   run maps the same files, with no copy of its own.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from tqdm.auto import tqdm

from common.io import atomic_open, atomic_write_json, publish_once
from progressive.data.cache import (
    building,
    cache_key,
    check_sealed,
    check_sealed_file,
    reserved_npy,
    seal,
    seal_file,
)
from progressive.data.identity import NotKnown
from progressive.data.sources import hf_split, read_documents, source_identity
from progressive.data.tokenizers import known_tokenizer, tokenizer_fingerprint

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["TokenBlocks", "load_token_blocks", "find_token_blocks", "cached_stream", "pack_blocks", "block_style",
           "tokenize_stream"]

_CACHE_VERSION = 3  # 2: sources identified by content digests; 3: uint16/uint32 tokens on disk
_BLOCK_CHUNK = 4096  # blocks copied from the stream per write
_PIECE_CHARS = 16_384  # long documents are tokenized in line-aligned pieces of about this size
_BATCH_CHARS = 1 << 20  # characters per encode_batch call


@dataclass
class TokenBlocks:
    """Packed token blocks.

    train, val: [N, seq_len] token ids, uint16 (or uint32 for a vocabulary over 65,536), read-only memory
        maps (make_batch casts a batch to int64). train_ids, val_ids: int64 position of each
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
    test: np.ndarray | None = None  # the test split (data.test_fraction > 0), else None
    test_ids: np.ndarray | None = None


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


_WORKER_TOKENIZER = None  # in a tokenizing worker process (data.num_proc > 1)


def _init_worker(tokenizer) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _WORKER_TOKENIZER = tokenizer


def _encode_in_worker(texts: list[str]) -> list[list[int]]:
    return _encode(_WORKER_TOKENIZER, texts)


def _encoded(batches: Iterator[list[tuple[str, bool]]], tokenizer,
             num_proc: int) -> Iterator[tuple[list[tuple[str, bool]], list[list[int]]]]:
    """(batch, its pieces' ids) in order; with ``num_proc`` > 1 the batches are encoded by that many worker
    processes, at most two per worker in flight (the output is the same: each piece is encoded alone)."""
    if num_proc <= 1:
        for batch in batches:
            yield batch, _encode(tokenizer, [p for p, _ in batch])
        return

    with cf.ProcessPoolExecutor(num_proc, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                                initargs=(tokenizer,)) as pool:
        pending: collections.deque = collections.deque()
        try:
            for batch in batches:
                pending.append((batch, pool.submit(_encode_in_worker, [p for p, _ in batch])))
                if len(pending) >= 2 * num_proc:
                    done, fut = pending.popleft()
                    yield done, fut.result()
            while pending:
                done, fut = pending.popleft()
                yield done, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust tokenizer directly: no per-call Python overhead
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def token_dtype(tokenizer) -> type:
    """The narrowest unsigned dtype that holds every id of ``tokenizer``: uint16 up to 65,536 ids."""
    return np.uint16 if len(tokenizer) <= 1 << 16 else np.uint32


def tokenize_stream(docs: Iterable[tuple[str, str]], tokenizer, sep_id: int | None, max_tokens: int | None,
                    desc: str = "tokenize", out: BinaryIO | None = None, dtype: type = np.int32,
                    num_proc: int = 1) -> np.ndarray | int:
    """Tokenize documents into one stream of ``dtype``, ``sep_id`` after each document, cut at ``max_tokens``
    (``num_proc`` worker processes encode the batches; the stream is the same for any number).

    Returns the stream; or, given a binary file ``out``, writes it there batch by batch (nothing but the
    batches in flight in memory) and returns the number of tokens written."""
    kept: list[np.ndarray] = []
    state = {"total": 0}
    bar = tqdm(desc=desc, unit="tok", unit_scale=True, disable=None)

    def batches() -> Iterator[list[tuple[str, bool]]]:
        batch: list[tuple[str, bool]] = []
        chars = 0
        for piece in _pieces(docs):
            batch.append(piece)
            chars += len(piece[0])
            if chars >= _BATCH_CHARS or (max_tokens is not None and chars >= 8 * (max_tokens - state["total"])):
                yield batch
                batch, chars = [], 0
                if max_tokens is not None and state["total"] >= max_tokens:
                    return
        if batch:
            yield batch

    for batch, encoded in _encoded(batches(), tokenizer, num_proc):
        for ids, (_, last) in zip(encoded, batch):
            arr = np.asarray(ids + ([sep_id] if last and sep_id is not None else []), dtype=dtype)
            if max_tokens is not None:
                arr = arr[:max(0, max_tokens - state["total"])]
            if out is not None:
                out.write(arr.tobytes())
            else:
                kept.append(arr)
            state["total"] += len(arr)
            bar.update(len(arr))
        if max_tokens is not None and state["total"] >= max_tokens:
            break
    bar.close()
    if out is not None:
        return state["total"]
    return np.concatenate(kept) if kept else np.zeros(0, dtype=dtype)


def _encode_documents(batch: dict, text_field: str, tokenizer, sep_id: int | None) -> dict:
    """``Dataset.map`` function: each non-empty document's ids (its line-aligned pieces encoded alone, as
    ``tokenize_stream`` does) with ``sep_id`` after it; an empty document gives no ids."""
    out = []
    for text in batch[text_field]:
        if not text:
            out.append([])
            continue
        pieces = [p for p, _ in _pieces([("", text)])]
        ids = [i for piece in _encode(tokenizer, pieces) for i in piece]
        out.append(ids + ([sep_id] if sep_id is not None else []))
    return {"ids": out}


def tokenize_hf(ds, text_field: str, tokenizer, sep_id: int | None, out: BinaryIO, dtype: type, num_proc: int,
                scratch: Path, desc: str = "tokenize") -> int:
    """Tokenize a Hugging Face ``Dataset`` with ``Dataset.map(num_proc=...)`` (each worker reads and encodes its
    own contiguous shard of the Arrow files; datasets joins them in order) and write the ids to ``out`` as one
    stream of ``dtype``: the same stream ``tokenize_stream`` gives for these documents. The mapped Arrow files
    go to ``scratch`` (in the cache, never next to the user's dataset) and are removed. Returns the tokens
    written."""

    scratch.mkdir(parents=True, exist_ok=True)
    try:
        mapped = ds.select_columns([text_field]).map(
            _encode_documents, batched=True, batch_size=256, num_proc=num_proc if num_proc > 1 else None,
            remove_columns=[text_field], fn_kwargs={"text_field": text_field, "tokenizer": tokenizer, "sep_id": sep_id},
            cache_file_name=str(scratch / "ids.arrow"), desc=desc)
        total = 0
        for batch in mapped.with_format("numpy").iter(batch_size=1024):
            for ids in batch["ids"]:
                arr = np.asarray(ids, dtype=dtype)
                out.write(arr.tobytes())
                total += len(arr)
        del mapped
        return total
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _separator(tokenizer, style: str) -> int | None:
    if style == "bert":
        return tokenizer.sep_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.bos_token_id


def block_style(tokenizer) -> str:
    """"bert" for tokenizers with [CLS]/[SEP]/[MASK] (blocks get [CLS] ... [SEP]), else "causal"."""
    has = all(getattr(tokenizer, f"{t}_token_id", None) is not None for t in ("cls", "sep", "mask"))
    return "bert" if has else "causal"


def cached_stream(cfg: DataConfig, tokenizer, split: str, max_tokens: int | None, source_id: dict) -> np.ndarray:
    """The token stream of ``split``, from cache or tokenized now, written to the cache as it goes.
    Memory-mapped, uint16 (uint32 for a vocabulary over 65,536 ids)."""
    style = block_style(tokenizer)
    sep = _separator(tokenizer, style)
    dtype = token_dtype(tokenizer)
    key = cache_key({"v": _CACHE_VERSION, "source": source_id, "split": split, "tok": tokenizer_fingerprint(tokenizer),
                "max_tokens": max_tokens, "sep": sep, "dtype": np.dtype(dtype).name})
    path = Path(cfg.cache_dir) / "tokens" / f"{key}.u{np.dtype(dtype).itemsize * 8}"
    with building(path):  # one builder a folder; the others wait and read it
        fresh = not path.exists()
        if fresh:
            with atomic_open(path) as f:
                if cfg.dataset.startswith("hf:") and max_tokens is None:
                    tokenize_hf(hf_split(cfg, split), cfg.text_field, tokenizer, sep, f, dtype, cfg.num_proc,
                                path.with_suffix(".map"), desc=f"tokenize {split}")
                else:
                    tokenize_stream(read_documents(cfg, split), tokenizer, sep, max_tokens, desc=f"tokenize {split}",
                                    out=f, dtype=dtype, num_proc=cfg.num_proc)
            seal_file(path)  # just written, whole: sealed, not checked
    if not fresh:
        check_sealed_file(path, cfg.cache_dir)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


# ------------------------------------------------------------------------------------------ blocks


def n_blocks(stream: np.ndarray, seq_len: int, style: str) -> int:
    """How many whole blocks ``stream`` makes (BERT style: seq_len - 2 stream tokens each)."""
    return len(stream) // (seq_len - 2 if style == "bert" else seq_len)


def pack_blocks(stream: np.ndarray, seq_len: int, style: str, tokenizer, ids: np.ndarray | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
    """Blocks ``ids`` (default: all, in order) of ``stream`` as [len(ids), seq_len] token ids in the stream's
    dtype (BERT style: [CLS] + seq_len-2 tokens + [SEP]); into ``out`` (e.g. a file's memory map) a chunk of
    blocks at a time, so a stream larger than memory is never read whole."""
    content = seq_len - 2 if style == "bert" else seq_len
    n = len(stream) // content
    body = stream[: n * content].reshape(n, content)
    ids = np.arange(n) if ids is None else np.asarray(ids)
    out = np.empty((len(ids), seq_len), dtype=stream.dtype) if out is None else out
    for lo in range(0, len(ids), _BLOCK_CHUNK):
        sel = ids[lo:lo + _BLOCK_CHUNK]
        if style == "causal":
            out[lo:lo + len(sel)] = body[sel]
        else:
            out[lo:lo + len(sel), 0] = tokenizer.cls_token_id
            out[lo:lo + len(sel), 1:-1] = body[sel]
            out[lo:lo + len(sel), -1] = tokenizer.sep_token_id
    return out


def _write_blocks(folder: Path, parts: dict[str, tuple[np.ndarray, np.ndarray]], seq_len: int, style: str,
                  tokenizer, meta: dict) -> None:
    """``parts``: {"train": (stream, block ids), "val": ...}: each written as a .npy memory map (its space reserved
    first: a full disk is an OSError, not SIGBUS), filled a chunk of blocks at a time, with its ids."""
    with publish_once(folder) as tmp:
        for name, (stream, ids) in parts.items():
            if name == "test" and not len(ids):
                continue  # no test split: no files (a run without one reads as before)
            arr = reserved_npy(tmp / f"{name}.npy", stream.dtype, (len(ids), seq_len), shown=folder / f"{name}.npy")
            pack_blocks(stream, seq_len, style, tokenizer, ids, out=arr)
            arr.flush()
            del arr
            np.save(tmp / f"{name}_ids.npy", np.asarray(ids, dtype=np.int64))
        atomic_write_json(tmp / "meta.json", seal(tmp, meta))


def load_token_blocks(cfg: DataConfig, tokenizer) -> TokenBlocks:
    """Tokenize cfg.dataset once, pack into blocks, split train/val by seed; cached and memory-mapped.

    Args:
        cfg: DataConfig (dataset, text_field, seq_len, val_fraction, seed, cache_dir, max_tokens).
        tokenizer: from build_tokenizer (its full content is part of the cache key).

    Returns:
        TokenBlocks with [N, seq_len] train and val arrays (uint16, or uint32 for vocabularies over 65,536).

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
    folder = _blocks_folder(cfg, tokenizer, src)
    with building(folder):  # one builder a folder; the others wait and read it
        if not (folder / "meta.json").exists():
            _build_blocks(cfg, tokenizer, folder, src, style)
    return _open_blocks(cfg, folder, check_sealed(folder, cfg.cache_dir))


def find_token_blocks(cfg: DataConfig) -> TokenBlocks:
    """The blocks ``load_token_blocks`` would give, when its cache entry is built, found without building or reading
    anything: no file hashed that the digest index does not know, no tokenizer trained, no dataset opened, the
    entry's files not checked against their seal (``train.py --dry_run``: the corpus's size before a run).

    Raises:
        NotKnown: the reason they cannot be known yet (progressive.data.identity).
    """
    src = source_identity(cfg, hash_new=False)
    folder = _blocks_folder(cfg, known_tokenizer(cfg), src)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        raise NotKnown(f"no cache entry for these blocks in {Path(cfg.cache_dir) / 'blocks'} (this source, "
                       "tokenizer, seq_len, seed, val_fraction, test_fraction and max_tokens)") from None
    return _open_blocks(cfg, folder, meta)


def _blocks_folder(cfg: DataConfig, tokenizer, src: dict) -> Path:
    """The cache entry of ``cfg``'s blocks of ``src`` (``source_identity``) cut with ``tokenizer``."""
    key = cache_key({"v": _CACHE_VERSION, "source": src, "tok": tokenizer_fingerprint(tokenizer),
                     "seq_len": cfg.seq_len, "seed": cfg.seed, "val_fraction": cfg.val_fraction,
                     "max_tokens": cfg.max_tokens,
                     **({"test_fraction": cfg.test_fraction} if cfg.test_fraction else {})})  # old keys unchanged
    return Path(cfg.cache_dir) / "blocks" / key


def _open_blocks(cfg: DataConfig, folder: Path, meta: dict) -> TokenBlocks:
    """The entry ``folder``'s arrays, memory-mapped (nothing is read but their headers)."""
    arrays = {k: np.load(folder / f"{k}.npy", mmap_mode="r")
              for k in ("train", "val", "test", "train_ids", "val_ids", "test_ids") if (folder / f"{k}.npy").is_file()}
    return TokenBlocks(seq_len=cfg.seq_len, style=meta["style"], n_tokens=meta["n_tokens"], path=folder, **arrays)


def _build_blocks(cfg: DataConfig, tokenizer, folder: Path, src: dict, style: str) -> None:
    """Tokenize (or read the cached streams), cut into blocks, split and write the entry ``folder`` whole."""
    val_split = src.get("val_split")
    stream = _some_text(cached_stream(cfg, tokenizer, "train", cfg.max_tokens, src), cfg,
                        "train" if val_split else None)  # a source of one split is named alone
    n_tokens = len(stream)
    if val_split:  # the source's own validation split, capped in proportion to max_tokens
        vcap = None if cfg.max_tokens is None else max(int(cfg.max_tokens * cfg.val_fraction), cfg.seq_len)
        vstream = _some_text(cached_stream(cfg, tokenizer, "validation", vcap, src), cfg, val_split)
        n = n_blocks(stream, cfg.seq_len, style)
        test_ids, train_ids = _test_split(n, 0, cfg, np.random.default_rng(cfg.seed).permutation(n))
        val_ids = np.arange(n_blocks(vstream, cfg.seq_len, style))
        parts = {"train": (stream, train_ids), "val": (vstream, val_ids), "test": (stream, test_ids)}
        n_tokens += len(vstream)
    else:
        n = n_blocks(stream, cfg.seq_len, style)
        n_val = max(1, round(n * cfg.val_fraction)) if cfg.val_fraction > 0 else 0
        if n - n_val < 1:
            raise ValueError(
                f"too little data: {n_tokens} tokens make {n} blocks of seq_len={cfg.seq_len}, not enough for "
                f"a training block plus {n_val} validation block(s); raise max_tokens or lower seq_len"
            )
        perm = np.random.default_rng(cfg.seed).permutation(n)
        val_ids = np.sort(perm[:n_val])  # the same validation blocks with or without a test split
        test_ids, train_ids = _test_split(n, n_val, cfg, perm)
        parts = {"train": (stream, train_ids), "val": (stream, val_ids), "test": (stream, test_ids)}
    if len(train_ids) < 1 or (cfg.val_fraction > 0 and len(val_ids) < 1):
        raise ValueError(f"too little data in {cfg.dataset!r}: {len(train_ids)} train / {len(val_ids)} val blocks")
    meta = {"dataset": cfg.dataset, "seq_len": cfg.seq_len, "style": style, "n_tokens": int(n_tokens),
            "n_train": len(train_ids), "n_val": len(val_ids), "seed": cfg.seed, "val_fraction": cfg.val_fraction,
            "max_tokens": cfg.max_tokens, "source": src, "dtype": np.dtype(stream.dtype).name}
    _write_blocks(folder, parts, cfg.seq_len, style, tokenizer, meta)


def _some_text(stream: np.ndarray, cfg: DataConfig, split: str | None) -> np.ndarray:
    """``stream``, unless it is empty: no setting makes blocks of a source (or split) that holds no text.

    Raises:
        ValueError: naming the dataset (and the split)."""
    if not len(stream):
        where = f"dataset={cfg.dataset!r}" + (f" split {split!r}" if split else "")
        raise ValueError(f"{where} holds no text (0 tokens): every document is empty")
    return stream


def _test_split(n: int, n_val: int, cfg: DataConfig, perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(test block ids, train block ids) from the blocks ``perm[n_val:]`` (sorted): ``test_fraction`` of the
    n blocks go to the test split (at least one when it is > 0), the rest train.

    Raises:
        ValueError: no training block would be left."""
    n_test = max(1, round(n * cfg.test_fraction)) if cfg.test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise ValueError(f"too little data: {n} blocks of seq_len={cfg.seq_len} leave no training block after "
                         f"{n_val} validation and {n_test} test block(s); raise max_tokens or lower seq_len")
    return np.sort(perm[n_val:n_val + n_test]), np.sort(perm[n_val + n_test:])
