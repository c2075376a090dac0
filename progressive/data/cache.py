"""Cache keys for the data caches (tokenizers, token streams, blocks, decoded images) under data.cache_dir.

A key is a short hash of everything that determines a cache entry's content (source identity, tokenizer
content, cut parameters, a format version), so a changed input never reads a stale entry. Entries are
published atomically with common.io.publish_once: the first complete copy wins when DDP ranks race.

Entries are sealed: ``seal`` records each file's size and sha256 in the entry's meta.json when it is written,
and ``check_sealed`` compares them every time it is read (the digests are cached by file identity, so a large
entry is hashed again only when a file changed: progressive.data.identity). A file edited in place, truncated
or swapped is an error naming it, never data trained on silently. An entry written before sealing existed is
sealed on its first read. A single-file entry (a token stream) is sealed the same way, in ``<name>.json`` beside it.

Processes that need the same entry at once (the ranks of a node, nodes that share a cache folder) take turns at
building it (``building``: an exclusive lock on a file of the cache's ``.locks/``), so an entry is built once per
folder and the others read it; none of them waits at a collective with a timeout while another builds, so a corpus
that takes hours to tokenize cannot fail a launch. On a file system without locks they race as before, and
``publish_once`` keeps the first complete copy.

A file that is filled through a memory map is made by ``reserved_npy``: its disk blocks are reserved before it is
mapped, because a write through a map to a page the file system cannot back (a sparse file on a full disk) kills
the process with SIGBUS, while a reservation that does not fit is an ordinary OSError (ENOSPC), a one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common.io import atomic_write_json, taking_turns
from progressive.data.identity import LOCKS, file_digest

__all__ = ["cache_key", "seal", "check_sealed", "seal_file", "check_sealed_file", "CacheDamaged", "reserved_npy",
           "every_file", "building"]

SEAL = "files"  # meta.json's key: {file name: [bytes, sha256]}


class CacheDamaged(ValueError):
    """A cache entry's file no longer holds what was written there."""




def building(entry: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the right to build cache entry ``entry`` (a folder or a file of a room of the cache, such as
    ``<cache_dir>/blocks/<key>``) while the block runs: an exclusive lock on ``<cache_dir>/.locks/<room>-<name>.lock``
    (common.io.taking_turns), taken in turn by every process that needs the entry. Check whether the entry exists
    inside the block: a process that waited finds the one built while it waited. A wait is announced in one line and
    has no time limit (the builder may tokenize for hours); a signal is acted on when it ends. Where the file system
    keeps no locks, the block runs unlocked (``publish_once``: the first complete copy wins)."""
    entry = Path(entry)
    return taking_turns(entry.parent.parent / LOCKS / f"{entry.parent.name}-{entry.name}.lock",
                        f"waiting for another process that is building {entry} (a data cache entry this run reads too)")


def cache_key(obj: Any, length: int = 20) -> str:
    """The first ``length`` hex digits of sha256 over ``obj`` as canonical JSON (sorted keys; str() for the rest)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


def _is_npy(path: Path) -> bool:
    return path.suffix == ".npy"


def every_file(path: Path) -> bool:
    """``seal``'s ``select`` for an entry whose every file is content (a tokenizer's folder): all but meta.json."""
    return path.name != "meta.json"


def seal(folder: Path, meta: dict[str, Any], select: Callable[[Path], bool] = _is_npy) -> dict[str, Any]:
    """``meta`` with the size and sha256 of every file of ``folder`` that ``select`` picks (default: the ``.npy``
    files), before the entry is published."""

    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and select(p))
    return {**meta, SEAL: {p.name: [p.stat().st_size, file_digest(p)] for p in files}}


def _read_meta(folder: Path, fix: str) -> dict[str, Any]:
    """The entry's meta.json as a dict whose seal, if any, maps names to [bytes, sha256].

    Raises:
        CacheDamaged: it is missing, does not parse, or is not such a record."""
    return _read_meta_file(folder / "meta.json", fix)


def _read_meta_file(path: Path, fix: str) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CacheDamaged(f"data cache {path} is missing; {fix}") from None
    except ValueError as e:  # also a UnicodeDecodeError
        raise CacheDamaged(f"data cache {path} is not valid JSON ({e}); {fix}") from None
    sealed = meta.get(SEAL, {}) if isinstance(meta, dict) else None
    if not isinstance(sealed, dict) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and isinstance(v[1], str)
            for v in sealed.values()):
        raise CacheDamaged(f"data cache {path} is not this project's record of a cache entry; {fix}")
    return meta


def check_sealed(folder: Path, cache_dir: str | os.PathLike | None,
                 select: Callable[[Path], bool] = _is_npy) -> dict[str, Any]:
    """The entry's meta.json, after checking that every sealed file is there, whole and unchanged (an entry
    written before sealing is sealed now, over the files ``select`` picks, as ``seal`` does).

    Raises:
        CacheDamaged: naming the file, what is wrong and the folder to delete (it is rebuilt on the next run).
    """

    folder = Path(folder)
    fix = f"delete {folder} and it is built again"
    meta = _read_meta(folder, fix)
    sealed = meta.get(SEAL)
    if sealed is None:  # written before entries were sealed: seal it now (trust on first read)
        meta = seal(folder, meta, select)
        try:
            atomic_write_json(folder / "meta.json", meta)
        except OSError:  # a read-only cache: sealed for this run only
            pass
        return meta
    _check_files(folder, sealed, cache_dir, fix)
    return meta


def _check_files(folder: Path, sealed: dict[str, list], cache_dir: str | os.PathLike | None, fix: str) -> None:
    """Raise CacheDamaged for the first file of ``sealed`` ({name: [bytes, sha256]}) that is missing or differs."""
    for name, (size, digest) in sealed.items():
        path = folder / name
        if not path.is_file():
            raise CacheDamaged(f"data cache {path} is missing; {fix}")
        if path.stat().st_size != size:
            raise CacheDamaged(f"data cache {path} has {path.stat().st_size} bytes, {size} were written (truncated or "
                               f"replaced); {fix}")
        if file_digest(path, cache_dir) != digest:
            raise CacheDamaged(f"data cache {path} was changed after it was written (its sha256 differs); {fix}")


def _seal_of(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def seal_file(path: Path) -> None:
    """Record a single-file entry's size and sha256 beside it, in ``<name>.json`` (a token stream)."""
    path = Path(path)
    atomic_write_json(_seal_of(path), {SEAL: {path.name: [path.stat().st_size, file_digest(path)]}})


def check_sealed_file(path: Path, cache_dir: str | os.PathLike | None) -> None:
    """Check a single-file entry against the seal ``seal_file`` wrote (one written before it is sealed now).

    Raises:
        CacheDamaged: naming the file, what is wrong, and that deleting it rebuilds it.
    """
    path = Path(path)
    fix = f"delete {path} and it is built again"
    if not _seal_of(path).exists():  # written before single files were sealed: trust on first read
        try:
            seal_file(path)
        except OSError:  # a read-only cache: sealed for this run only
            pass
        return
    _check_files(path.parent, _read_meta_file(_seal_of(path), fix)[SEAL], cache_dir, fix)


def reserved_npy(path: Path, dtype: np.dtype | type, shape: tuple[int, ...], shown: Path | None = None) -> np.memmap:
    """A new ``.npy`` file ``path`` of ``shape`` and ``dtype``, its disk blocks reserved whole, memory-mapped for
    writing (as ``np.lib.format.open_memmap(path, "w+", ...)`` gives, without its sparse file).

    Args:
        path: the file to create (it must not exist).
        dtype, shape: the array's.
        shown: the name to give in an error (the entry's final path, where ``path`` is a temporary one).

    Raises:
        OSError: the reservation failed (ENOSPC: the disk is full), naming ``shown`` and the size; the file is
            removed.
    """
    dtype = np.dtype(dtype)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
    size = header.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with open(path, "xb") as f:
        try:
            _reserve(f.fileno(), size)
            os.pwrite(f.fileno(), header.getvalue(), 0)
        except OSError as e:
            Path(path).unlink(missing_ok=True)
            raise OSError(e.errno, f"{e.strerror or e} (reserving {size / 2**20:.2f} MiB for a data cache file; free "
                          "space under data.cache_dir, or set it to another disk)", str(shown or path)) from None
    return np.lib.format.open_memmap(path, mode="r+")


def _reserve(fd: int, size: int) -> None:
    """Give bytes [0, size) of ``fd`` disk blocks (and that length), or raise the file system's OSError."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except AttributeError:  # pragma: no cover - not POSIX (macOS has no posix_fallocate)
        pass
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
    # no reservation call here: write the zeros, which takes the blocks as surely (and as slowly as a copy)
    done = os.lseek(fd, 0, os.SEEK_END)
    zeros = bytes(1 << 20)
    while done < size:
        done += os.write(fd, zeros[: min(len(zeros), size - done)])
