"""Text classification data for ``model.task: classify`` on a text family (fine-tuning BERT- or Llama-style
models through train.py): GLUE-format tasks, tokenized once to fixed-length arrays and cached.

Sources (``data.dataset``):
- ``glue:<task>``: the bundled GLUE TSVs (data/glue/<TASK>/; common.glue): cola, sst2, mrpc, rte, wnli,
  and mnli/qnli/qqp where their train TSVs are present (else the Hub, when online). The validation
  split is the task's dev set (MNLI: matched). STS-B is a regression task and is refused here.
- ``hf:<name>[:<config>]``: a Hugging Face dataset (or a save_to_disk folder) with the text in
  ``data.text_field`` (and a second text in ``data.text_pair_field``) and the class in
  ``data.label_field``; its validation split if it has one, else a seeded ``val_fraction`` of train.

Encoding: the tokenizer's pair template (``[CLS] a [SEP] b [SEP]`` for BERT-style tokenizers; plain
concatenation for byte-level BPE), truncated longest-first and right-padded to ``data.seq_len``. Fixed
shapes keep a batch a slice of an array, and let AutoCache key a sample's activations by its index.
Cached under ``cache_dir/classify/<key>/`` (key: source identity, split, tokenizer content, seq_len).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from common.glue import ALIASES, TASKS, load_task
from common.io import atomic_write_json, publish_once
from progressive.data.cache import building, cache_key, check_sealed, seal
from progressive.data.identity import content_identity
from progressive.data.sources import DATA_ROOT, hf_identity, load_hf_dataset
from progressive.data.tokenizers import tokenizer_fingerprint

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["ClassifySplit", "load_classify_split", "classify_source"]

_CACHE_VERSION = 2  # 2: GLUE files identified by content digests
_VAL = ("validation", "valid", "val", "dev", "test")


@dataclass
class ClassifySplit:
    """input_ids / attention_mask (/ token_type_ids): long [N, seq_len]; labels: long [N]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    labels: torch.Tensor
    num_labels: int
    label_names: list[str]
    path: Path


def classify_source(dataset: str) -> str:
    """"glue" or "hf" for a text-classification ``data.dataset``; raises ValueError naming the field."""
    if dataset.startswith("glue:"):
        name = ALIASES.get(dataset[5:].lower(), dataset[5:].lower())
        if name not in TASKS:
            raise ValueError(f"data.dataset: unknown GLUE task {dataset[5:]!r}; choose one of {', '.join(TASKS)}")
        if not TASKS[name].labels:
            raise ValueError(f"data.dataset: {dataset} is a regression task; model.task classify needs classes")
        return "glue"
    if dataset.startswith("hf:"):
        return "hf"
    raise ValueError(f"data.dataset: text classification reads 'glue:<task>' (bundled GLUE) or "
                     f"'hf:<name>[:<config>]', got {dataset!r}")


def _glue_texts(cfg: DataConfig, split: str) -> tuple[list[tuple[str, ...]], list[int], list[str]]:
    task = TASKS[ALIASES.get(cfg.dataset[5:].lower(), cfg.dataset[5:].lower())]
    train, dev = load_task(task, DATA_ROOT / "glue")
    texts, labels = train if split == "train" else next(iter(dev.values()))
    return texts, [int(y) for y in labels], list(task.labels)


def _hf_texts(cfg: DataConfig, split: str) -> tuple[list[tuple[str, ...]], list[int], list[str]]:
    name, _, config = cfg.dataset[3:].partition(":")
    dd = load_hf_dataset(name, config or None)
    val_name = next((s for s in _VAL if s in dd), None)
    ds = dd["train"] if split == "train" or val_name is None else dd[val_name]
    cols = [cfg.text_field] + ([cfg.text_pair_field] if cfg.text_pair_field else [])
    for c in (*cols, cfg.label_field):
        if c not in ds.column_names:
            raise ValueError(f"dataset={cfg.dataset!r}: no column {c!r} (data.text_field / text_pair_field / "
                             f"label_field); columns: {ds.column_names}")
    labels = np.asarray(ds[cfg.label_field], dtype=np.int64)
    feature = ds.features[cfg.label_field]
    names = list(getattr(feature, "names", None) or [str(i) for i in range(int(labels.max()) + 1)])
    texts = list(zip(*(ds[c] for c in cols)))
    if val_name is None:  # a seeded share of train for validation
        val = np.random.default_rng(cfg.seed).permutation(len(labels))[: max(1, round(cfg.val_fraction * len(labels)))]
        keep = np.isin(np.arange(len(labels)), val) == (split != "train")
        texts, labels = [t for t, k in zip(texts, keep) if k], labels[keep]
    return texts, [int(y) for y in labels], names


def _identity(cfg: DataConfig) -> list:
    """The source's content: the task's bundled TSVs by sha256 (progressive.data.identity), or the Hugging
    Face fingerprints with the columns read; no absolute path, no date."""
    if cfg.dataset.startswith("glue:"):
        task = ALIASES.get(cfg.dataset[5:].lower(), cfg.dataset[5:].lower())
        folder = DATA_ROOT / "glue" / TASKS[task].dirname
        files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        return ["glue", task, content_identity(files, folder, cfg.cache_dir)]
    name, _, config = cfg.dataset[3:].partition(":")
    dd = load_hf_dataset(name, config or None)
    return [hf_identity(cfg.dataset, dd), cfg.text_field, cfg.text_pair_field, cfg.label_field]


def load_classify_split(cfg: DataConfig, split: str, tokenizer) -> ClassifySplit:
    """Tokenized ``split`` ("train" or "validation") of a text-classification dataset; cached.

    Raises:
        ValueError: an unknown source or task, a regression task, missing columns, labels outside the classes.
        FileNotFoundError: bundled files missing.
    """
    classify_source(cfg.dataset)
    if split not in ("train", "validation"):
        raise ValueError(f"split must be 'train' or 'validation', got {split!r}")
    if tokenizer.pad_token_id is None:
        raise ValueError("text classification pads to data.seq_len: the tokenizer needs a pad token")
    key = cache_key({"v": _CACHE_VERSION, "source": _identity(cfg), "split": split, "seed": cfg.seed,
                     "val_fraction": cfg.val_fraction, "tok": tokenizer_fingerprint(tokenizer), "seq_len": cfg.seq_len})
    folder = Path(cfg.cache_dir) / "classify" / key
    with building(folder):  # one builder a folder; the others wait and read it
        if not (folder / "meta.json").exists():
            texts, labels, names = (_glue_texts if cfg.dataset.startswith("glue:") else _hf_texts)(cfg, split)
            if not labels:
                raise ValueError(f"dataset={cfg.dataset!r} split {split!r} has no examples")
            enc = tokenizer(*[list(c) for c in zip(*texts)], truncation="longest_first", max_length=cfg.seq_len,
                            padding="max_length", return_tensors="np")
            with publish_once(folder) as tmp:
                for k in ("input_ids", "attention_mask", "token_type_ids"):
                    if k in enc:
                        np.save(tmp / f"{k}.npy", np.asarray(enc[k], dtype=np.int32))
                np.save(tmp / "labels.npy", np.asarray(labels, dtype=np.int64))
                atomic_write_json(tmp / "meta.json", seal(tmp, {"dataset": cfg.dataset, "split": split,
                                                                "label_names": names, "n": len(labels)}))
    meta = check_sealed(folder, cfg.cache_dir)

    def arr(name: str) -> torch.Tensor | None:
        p = folder / f"{name}.npy"
        return torch.from_numpy(np.load(p).astype(np.int64)) if p.exists() else None

    labels_t = arr("labels")
    names = meta["label_names"]
    if int(labels_t.max()) >= len(names) or int(labels_t.min()) < 0:
        raise ValueError(f"dataset={cfg.dataset!r}: labels outside 0..{len(names) - 1}")
    return ClassifySplit(arr("input_ids"), arr("attention_mask"), arr("token_type_ids"), labels_t, len(names),
                         names, folder)
