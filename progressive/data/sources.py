"""Text sources: the bundled corpus, local .txt/.jsonl files or folders, and Hugging Face datasets, read as
(name, text) documents in a fixed order; plus what identifies a source's content for cache keys.

"bundled" reads data/corpus (NLTK Gutenberg selection, War and Peace, State of the Union, inaugural addresses,
Tiny Shakespeare; see data/SOURCES.md; NLTK README members skipped); a path reads .txt files (one document
each), .jsonl files (one document per line, field cfg.text_field) and .parquet files (one document per row,
column cfg.text_field, read a row group at a time: a Hub dump such as wikimedia/wikipedia's parquet files,
downloaded once, is read without loading it into memory); "hf:<name>[:<config>]" reads a Hugging Face
dataset (train split; its validation split if it has one).
"""

from __future__ import annotations

import gzip
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from common.hub import hub_call
from common.paths import DATA
from progressive.data.identity import content_identity

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["DATA_ROOT", "BUNDLED_CORPUS", "load_hf_dataset", "read_documents", "source_identity", "hf_identity"]

DATA_ROOT = DATA
BUNDLED_CORPUS = DATA_ROOT / "corpus"


def _read_text_member(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


def _bundled_documents() -> Iterator[tuple[str, str]]:
    if not BUNDLED_CORPUS.is_dir():
        raise FileNotFoundError(f"bundled corpus folder {BUNDLED_CORPUS} is missing (dataset='bundled')")
    for path in sorted(BUNDLED_CORPUS.iterdir()):
        if path.name.endswith(".tar.gz"):
            with tarfile.open(path) as tar:
                for m in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
                    if Path(m.name).name.upper().startswith("README"):
                        continue  # NLTK's corpus description, not corpus text
                    yield f"{path.name}:{m.name}", _read_text_member(tar.extractfile(m).read())
        elif path.name.endswith(".txt.gz"):
            with gzip.open(path, "rb") as f:
                yield path.name, _read_text_member(f.read())


_EXTS = (".txt", ".txt.gz", ".jsonl", ".jsonl.gz", ".parquet")


def _local_files(root: Path) -> list[Path]:
    exts = _EXTS
    if root.is_file():
        if not root.name.endswith(exts):
            raise ValueError(f"dataset={str(root)!r}: expected a {'/'.join(exts)} file or a folder of them")
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(exts))
    if not files:
        raise ValueError(f"dataset={str(root)!r}: folder has no {'/'.join(exts)} files")
    return files


def _local_documents(root: Path, text_field: str) -> Iterator[tuple[str, str]]:
    for path in _local_files(root):
        if path.name.endswith(".parquet"):
            yield from _parquet_documents(path, text_field)
            continue
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            if ".jsonl" not in path.name:
                yield str(path), f.read()
                continue
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if text_field not in row:
                    raise ValueError(
                        f"{path}:{n} has no field {text_field!r} (text_field); fields: {sorted(row)}"
                    )
                yield f"{path}:{n}", str(row[text_field])


def _parquet_documents(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    """(name, text) per non-empty row of column ``text_field`` of a parquet file, a row group at a time."""
    import pyarrow.parquet as pq

    f = pq.ParquetFile(path)
    if text_field not in f.schema_arrow.names:
        raise ValueError(f"{path} has no column {text_field!r} (text_field); columns: {f.schema_arrow.names}")
    row = 0
    for batch in f.iter_batches(columns=[text_field], batch_size=1024):
        for text in batch.column(0).to_pylist():
            if text:
                yield f"{path}:{row}", str(text)
            row += 1


def _parse_hf(dataset: str) -> tuple[str, str | None]:
    rest = dataset[3:]
    if not rest:
        raise ValueError("dataset='hf:' needs a name: 'hf:<name>[:<config>]'")
    name, _, config = rest.partition(":")
    return name, (config or None)


def load_hf_dataset(name: str, config: str | None):
    """Load a Hugging Face dataset: a datasets.save_to_disk folder, else datasets.load_dataset(name, config).

    Returns a DatasetDict (a single Dataset is returned as {"train": ds}). Tests replace this seam.
    """
    import datasets

    root = Path(name)
    if root.is_dir() and ((root / "dataset_dict.json").exists() or (root / "state.json").exists()):
        ds = datasets.load_from_disk(name)
    else:
        what = f"dataset {name!r}" + (f" (config {config!r})" if config else "")
        ds = hub_call(what, lambda: datasets.load_dataset(name, config))
    return ds if isinstance(ds, datasets.DatasetDict) else datasets.DatasetDict({"train": ds})


_VAL_SPLITS = ("validation", "valid", "val", "dev")


def _hf_splits(cfg: DataConfig):
    name, config = _parse_hf(cfg.dataset)
    dd = load_hf_dataset(name, config)
    if "train" not in dd:
        raise ValueError(f"dataset={cfg.dataset!r} has no 'train' split (splits: {sorted(dd)})")
    val_name = next((s for s in _VAL_SPLITS if s in dd), None)
    for split in ["train"] + ([val_name] if val_name else []):
        if cfg.text_field not in dd[split].column_names:
            raise ValueError(
                f"dataset={cfg.dataset!r} split {split!r} has no column {cfg.text_field!r} (text_field); "
                f"columns: {dd[split].column_names}"
            )
    return dd, val_name


def _hf_documents(ds, text_field: str) -> Iterator[tuple[str, str]]:
    for i, batch in enumerate(ds.select_columns([text_field]).iter(batch_size=1000)):
        for j, text in enumerate(batch[text_field]):
            if text:
                yield f"{i * 1000 + j}", text


def hf_split(cfg: DataConfig, split: str = "train"):
    """The ``datasets.Dataset`` of ``split`` ("train" or "validation") of an ``hf:`` source, for tokenizing it
    the datasets way (``Dataset.map`` with ``num_proc``: each worker reads its own shard of the Arrow files).

    Raises:
        ValueError: no such split, or no ``text_field`` column.
    """
    dd, val_name = _hf_splits(cfg)
    name = "train" if split == "train" else val_name
    if name is None:
        raise ValueError(f"dataset={cfg.dataset!r} has no validation split")
    return dd[name]


def read_documents(cfg: DataConfig, split: str = "train") -> Iterator[tuple[str, str]]:
    """Yield (name, text) documents of ``split`` ("train" or "validation") of cfg.dataset, in a fixed order.

    Raises:
        FileNotFoundError: a local path (or the bundled corpus) is missing.
        ValueError: an unknown source, a bad file type, a missing text field, or no such split.
    """
    if cfg.dataset.startswith("hf:"):
        dd, val_name = _hf_splits(cfg)
        name = "train" if split == "train" else val_name
        if name is None:
            raise ValueError(f"dataset={cfg.dataset!r} has no validation split")
        yield from _hf_documents(dd[name], cfg.text_field)
        return
    if split != "train":
        raise ValueError(f"dataset={cfg.dataset!r} has no separate validation split; it is split off by seed")
    if cfg.dataset == "bundled":
        yield from _bundled_documents()
        return
    root = Path(cfg.dataset).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"dataset path {str(root)!r} does not exist (dataset=...; expected 'bundled', 'hf:<name>[:<config>]' "
            "or a .txt/.jsonl/.parquet file or folder)"
        )
    yield from _local_documents(root, cfg.text_field)


def hf_identity(dataset: str, dd) -> list:
    """What identifies a Hugging Face dataset: its Hub name (or "local" for a save_to_disk folder, whose
    place is no part of its content), its config, and each split's ``_fingerprint`` (datasets' own hash)."""
    name, config = _parse_hf(dataset)
    where = "local" if Path(name).expanduser().is_dir() else name
    return [where, config, [[k, getattr(dd[k], "_fingerprint", None)] for k in sorted(dd)]]


def source_identity(cfg: DataConfig) -> dict:
    """What identifies the source's content for cache keys and resume checks: the sha256 of every local file
    with its name relative to the source's root (progressive.data.identity: no absolute path, no mtime), or
    the Hugging Face datasets' own fingerprints."""
    if cfg.dataset.startswith("hf:"):
        dd, val_name = _hf_splits(cfg)
        return {"hf": hf_identity(cfg.dataset, dd), "val_split": val_name, "text_field": cfg.text_field}
    if cfg.dataset == "bundled":
        if not BUNDLED_CORPUS.is_dir():
            raise FileNotFoundError(f"bundled corpus folder {BUNDLED_CORPUS} is missing (dataset='bundled')")
        files = sorted(p for p in BUNDLED_CORPUS.iterdir() if p.is_file())
        return {"bundled": content_identity(files, BUNDLED_CORPUS, cfg.cache_dir)}
    root = Path(cfg.dataset).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"dataset path {str(root)!r} does not exist (dataset=...)")
    files = _local_files(root)
    if root.is_file():  # one file: its bytes and its format are its identity (a renamed copy is the same data)
        (_, digest), = content_identity(files, root, cfg.cache_dir)
        kind = next(e for e in sorted(_EXTS, key=len, reverse=True) if root.name.endswith(e))
        return {"file": digest, "format": kind, "text_field": cfg.text_field}
    return {"files": content_identity(files, root, cfg.cache_dir), "text_field": cfg.text_field}
