"""Text sources: the bundled corpus, local .txt/.jsonl files or folders, and Hugging Face datasets, read as
(name, text) documents in a fixed order; plus what identifies a source's content for cache keys.

"bundled" reads data/corpus (NLTK Gutenberg selection, War and Peace, State of the Union, inaugural addresses,
Tiny Shakespeare; see data/SOURCES.md; NLTK README members skipped); a path reads .txt files (one document
each), .jsonl files (one document per line, field cfg.text_field) and .parquet files (one document per row,
column cfg.text_field, read a row group at a time: a Hub dump such as wikimedia/wikipedia's parquet files,
downloaded once, is read without loading it into memory); "hf:<name>[:<config>]" reads a Hugging Face
dataset (train split; its validation split if it has one).

Every source reads its text the same way: a null text is no document, and a value that is not a string (a number,
a list) is refused, never trained on as its str(). What does not parse is refused at this boundary in one line
naming the file and line (a .jsonl line that is not JSON, or not an object), the file (a damaged .gz or parquet
file, a column of numbers) or the dataset and split (a saved split of 0 rows, a text column of numbers).
"""

from __future__ import annotations

import gzip
import json
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from common.hub import hub_call
from common.paths import DATA
from progressive.data.identity import NotKnown, content_identity

if TYPE_CHECKING:
    from progressive.config import DataConfig

__all__ = ["DATA_ROOT", "BUNDLED_CORPUS", "load_hf_dataset", "read_documents", "source_identity", "hf_identity"]

DATA_ROOT = DATA
BUNDLED_CORPUS = DATA_ROOT / "corpus"


def _read_text_member(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n")


_DAMAGED_GZIP = (EOFError, zlib.error, gzip.BadGzipFile)  # a .gz cut short, or not gzip at all


def _bundled_documents() -> Iterator[tuple[str, str]]:
    if not BUNDLED_CORPUS.is_dir():
        raise FileNotFoundError(f"bundled corpus folder {BUNDLED_CORPUS} is missing (dataset='bundled')")
    for path in sorted(BUNDLED_CORPUS.iterdir()):
        try:
            yield from _bundled_file(path)
        except (*_DAMAGED_GZIP, tarfile.TarError) as e:
            raise ValueError(f"bundled corpus file {path} is damaged ({e}); restore it from the repository "
                             f"(data/corpus/{path.name})") from None


def _bundled_file(path: Path) -> Iterator[tuple[str, str]]:
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
        try:
            yield from _text_file_documents(path, text_field)
        except _DAMAGED_GZIP as e:
            raise ValueError(f"{path}: not a whole gzip file ({e}); replace it or remove it from the data") from None


def _text_file_documents(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    """A .txt file as one document, or a .jsonl file's rows (either gzip-compressed)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    jsonl = ".jsonl" in path.name
    # utf-8-sig: a byte order mark an editor put first is no part of the first row's JSON
    with opener(path, "rt", encoding="utf-8-sig" if jsonl else "utf-8", errors="replace") as f:
        if not jsonl:
            yield str(path), f.read()
            return
        for n, line in enumerate(f, 1):
            if line.strip():
                text = _jsonl_text(line, f"{path}:{n}", text_field)
                if text is not None:  # null: no document (as a saved dataset's or a parquet file's null)
                    yield f"{path}:{n}", text


def _json_kind(value: object) -> str:
    """What a JSON value is, in words: "a number", "an array", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    kinds = {str: "a string", list: "an array", dict: "an object"}
    return kinds.get(type(value), "a number")


def _jsonl_text(line: str, where: str, text_field: str) -> str | None:
    """The text of one JSONL line ``where`` (path:line): its ``text_field``, a string or null (None).

    Raises:
        ValueError: naming ``where``: the line is not JSON, not an object, has no such field, or the field is
            neither a string nor null.
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:  # its "line 1 column c" is this one line's: say the file's line
        raise ValueError(f"{where}: not valid JSON (column {e.colno}: {e.msg}); each line of a .jsonl file is "
                         "one JSON object") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: the line is {_json_kind(row)}, not a JSON object; each line of a .jsonl file "
                         f"is one object with a {text_field!r} field (text_field)")
    if text_field not in row:
        raise ValueError(f"{where} has no field {text_field!r} (text_field); fields: {sorted(row)}")
    text = row[text_field]
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{where}: field {text_field!r} (text_field) is {_json_kind(text)}, not a string (a null "
                         "is skipped); give every row's text as a JSON string")
    return text


def _is_text_type(t) -> bool:
    """Whether an Arrow column of type ``t`` holds strings (or only nulls)."""
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _is_text_type(t.value_type)
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))


def _parquet_documents(path: Path, text_field: str) -> Iterator[tuple[str, str]]:
    """(name, text) per non-empty row of column ``text_field`` of a parquet file, a row group at a time.

    Raises:
        ValueError: the file is not readable parquet, has no such column, or the column is not text.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
        if text_field not in f.schema_arrow.names:
            raise ValueError(f"{path} has no column {text_field!r} (text_field); columns: {f.schema_arrow.names}")
        kind = f.schema_arrow.field(text_field).type
        if not _is_text_type(kind):
            raise ValueError(f"{path}: column {text_field!r} (text_field) holds {kind}, not strings")
        row = 0
        for batch in f.iter_batches(columns=[text_field], batch_size=1024):
            for text in batch.column(0).to_pylist():
                if text:
                    yield f"{path}:{row}", text
                row += 1
    except pa.ArrowException as e:  # its own message names no file
        raise ValueError(f"{path}: not a readable parquet file ({e})") from None


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
    if _saved_folder(root):
        ds = _load_saved(root, "hf:" + name + (f":{config}" if config else ""))
    else:
        what = f"dataset {name!r}" + (f" (config {config!r})" if config else "")
        ds = hub_call(what, lambda: datasets.load_dataset(name, config))
    return ds if isinstance(ds, datasets.DatasetDict) else datasets.DatasetDict({"train": ds})


def _saved_folder(root: Path) -> bool:
    """Whether ``root`` is a ``datasets.save_to_disk`` folder (a DatasetDict's or a Dataset's)."""
    return root.is_dir() and ((root / "dataset_dict.json").exists() or (root / "state.json").exists())


def _load_saved(root: Path, dataset: str):
    """``datasets.load_from_disk(root)``, after checking what it trusts: its JSON records parse, and no split is
    saved without rows (datasets cannot load one: an IndexError deep in concat_tables).

    Raises:
        ValueError: naming ``dataset`` and the split or the file.
    """
    import datasets

    def record(path: Path):
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"dataset={dataset!r}: the saved dataset {root} cannot be read ({path} is missing)") \
                from None
        except ValueError as e:
            raise ValueError(f"dataset={dataset!r}: the saved dataset {root} cannot be read ({path}: not valid JSON, "
                             f"{e})") from None

    if (root / "dataset_dict.json").exists():
        splits = record(root / "dataset_dict.json").get("splits", [])
        folders = {str(split): root / str(split) for split in splits}
    else:
        folders = {"train": root}  # one saved Dataset: read as the train split
    for split, folder in folders.items():
        state = record(folder / "state.json")
        if isinstance(state, dict) and state.get("_data_files") == []:
            raise ValueError(f"dataset={dataset!r} split {split!r} has 0 rows; give it rows, or remove that split from "
                             f"the saved dataset ({folder})")
    try:
        return datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:  # what damaged records make it raise
        raise ValueError(f"dataset={dataset!r}: the saved dataset {root} cannot be read ({type(e).__name__}: {e})") \
            from None


_VAL_SPLITS = ("validation", "valid", "val", "dev")
_TEXT_DTYPES = ("string", "large_string", "null")  # datasets' Value dtypes that hold text (or only nulls)


def _hf_splits(cfg: DataConfig):
    name, config = _parse_hf(cfg.dataset)
    dd = load_hf_dataset(name, config)
    if "train" not in dd:
        raise ValueError(f"dataset={cfg.dataset!r} has no 'train' split (splits: {sorted(dd)})")
    val_name = next((s for s in _VAL_SPLITS if s in dd), None)
    for split in ["train"] + ([val_name] if val_name else []):
        _check_split(cfg, split, dd[split])
    return dd, val_name


def _check_split(cfg: DataConfig, split: str, ds) -> None:
    """Refuse a split without rows, or whose ``text_field`` column is missing or holds no strings.

    Raises:
        ValueError: naming the dataset, the split and the column.
    """
    import datasets

    if cfg.text_field not in ds.column_names:
        raise ValueError(
            f"dataset={cfg.dataset!r} split {split!r} has no column {cfg.text_field!r} (text_field); "
            f"columns: {ds.column_names}"
        )
    if ds.num_rows == 0:
        raise ValueError(f"dataset={cfg.dataset!r} split {split!r} has 0 rows")
    feature = ds.features[cfg.text_field]
    if not (isinstance(feature, datasets.Value) and feature.dtype in _TEXT_DTYPES):
        kind = feature.dtype if isinstance(feature, datasets.Value) else feature
        raise ValueError(f"dataset={cfg.dataset!r} split {split!r}: column {cfg.text_field!r} (text_field) holds "
                         f"{kind}, not strings")


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


def source_identity(cfg: DataConfig, hash_new: bool = True) -> dict:
    """What identifies the source's content for cache keys and resume checks: the sha256 of every local file
    with its name relative to the source's root (progressive.data.identity: no absolute path, no mtime), or
    the Hugging Face datasets' own fingerprints. ``hash_new`` False: from what is known already, reading no
    file and opening no dataset from the Hub (a ``save_to_disk`` folder opens memory-mapped, reading nothing).

    Raises:
        NotKnown: ``hash_new`` is False and a file was never hashed, or the source is a dataset of the Hub.
    """
    if cfg.dataset.startswith("hf:"):
        if not hash_new and not _saved_folder(Path(_parse_hf(cfg.dataset)[0])):
            raise NotKnown(f"{cfg.dataset} is known by its fingerprints on the Hub, which only loading it gives (a "
                           "datasets.save_to_disk copy, data.dataset: hf:/path/to/it, is known without)")
        dd, val_name = _hf_splits(cfg)
        return {"hf": hf_identity(cfg.dataset, dd), "val_split": val_name, "text_field": cfg.text_field}
    if cfg.dataset == "bundled":
        if not BUNDLED_CORPUS.is_dir():
            raise FileNotFoundError(f"bundled corpus folder {BUNDLED_CORPUS} is missing (dataset='bundled')")
        files = sorted(p for p in BUNDLED_CORPUS.iterdir() if p.is_file())
        return {"bundled": content_identity(files, BUNDLED_CORPUS, cfg.cache_dir, hash_new)}
    root = Path(cfg.dataset).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"dataset path {str(root)!r} does not exist (dataset=...)")
    files = _local_files(root)
    if root.is_file():  # one file: its bytes and its format are its identity (a renamed copy is the same data)
        (_, digest), = content_identity(files, root, cfg.cache_dir, hash_new)
        kind = next(e for e in sorted(_EXTS, key=len, reverse=True) if root.name.endswith(e))
        return {"file": digest, "format": kind, "text_field": cfg.text_field}
    return {"files": content_identity(files, root, cfg.cache_dir, hash_new), "text_field": cfg.text_field}
