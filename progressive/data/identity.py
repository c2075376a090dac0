"""What identifies local data: its content, not where it lies or when it was touched.

A local source (the bundled corpus, CIFAR-10's archives, GLUE TSVs, a text file or folder, an image
folder) is identified by the names of its files *relative to the source's root* and the sha256 of each
file's bytes. So:

- an edit that keeps the size and restores the modification time changes the identity (the content
  changed), and ``--resume`` refuses it;
- ``touch``, a fresh ``git clone`` or a copy to another machine keep it (same bytes);
- moving the data, the run folder or the checkout keeps it (no absolute path is part of it).

Hashing streams each file in 4 MiB blocks (sha256 runs at about 1.8 GB/s on this project's CPU, which
has SHA instructions). Digests are cached in ``<data.cache_dir>/file_digests.json``, keyed by the file's
absolute path, size, mtime, ctime and inode: a large corpus is read once, not at every start. ctime is
what makes a same-size edit with its mtime restored visible: restoring an mtime (``touch -d``,
``os.utime``) sets the ctime to now, and no user call can set it back. Writing the index is atomic;
two processes that hash at once (DDP ranks) only cost each other a re-hash. A file that changed in the two
seconds before it was hashed (or while it was read) is not recorded, so a write in the same timestamp tick
is never hidden (file systems with 1-2 s timestamps: ext3, FAT, some NFS).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from common.io import atomic_write_json, taking_turns

__all__ = ["file_digest", "content_identity", "NotKnown", "INDEX", "RACY_SECONDS"]

INDEX = "file_digests.json"
LOCKS = ".locks"  # the cache's lock files (progressive.data.cache.building)
RACY_SECONDS = 2.0  # a file changed this recently when it was hashed is hashed again next time
_BLOCK = 4 << 20
_LOUD_BYTES = 256 << 20  # a first hash of at least this much says so and shows a bar


class NotKnown(LookupError):
    """An identity (or what it keys) that cannot be known without work a caller did not allow: a file not hashed yet,
    a dataset not opened (``train.py --dry_run`` reads no data); the message says which."""


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _load(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: every file is hashed again
        return {}
    return index if isinstance(index, dict) else {}


def file_digest(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
    """The sha256 of ``path``'s bytes, from the digest index under ``cache_dir`` when the file's (size,
    mtime, ctime, inode) are the same as when it was hashed, else read now (and recorded)."""
    return content_identity([Path(path)], Path(path), cache_dir)[0][1]


def content_identity(files: Iterable[Path], root: Path, cache_dir: str | os.PathLike | None,
                     hash_new: bool = True) -> list[list]:
    """[[name relative to ``root`` (POSIX; the file's own name when ``root`` is that file), sha256], ...] for
    ``files`` in the given order. One stat per file; only files whose stat differs from the index are read
    (``hash_new`` False: none is, and ``NotKnown`` is raised instead).
    A digest is recorded only when the file did not change while it was read and had been still for
    RACY_SECONDS before (git's "racily clean" rule: on file systems with coarse timestamps, a write in the
    same tick as the hash would otherwise leave the same stat on other content).

    Raises:
        OSError: a file cannot be read. NotKnown: ``hash_new`` is False and a file has no digest in the index.
    """
    root = Path(root)
    files = list(map(Path, files))
    index_path = Path(cache_dir) / INDEX if cache_dir is not None else None
    rows, todo = _known(files, root, _load(index_path))
    if todo and not hash_new:
        raise NotKnown(f"the source's files were never hashed with this data.cache_dir, {cache_dir}")
    if todo and index_path is not None:
        # processes that need the same files at once (the ranks of a launch) take turns: the first hashes them, the
        # others wait and read its digests, instead of each reading a corpus of many GiB
        with taking_turns(Path(cache_dir) / LOCKS / f"{INDEX}.lock",
                          f"waiting for another process that is hashing the data files (digests kept in {index_path})"):
            rows, todo = _known(files, root, _load(index_path))
            _hash(rows, todo, index_path)
    elif todo:
        _hash(rows, todo, index_path)
    return rows


def _known(files: list[Path], root: Path, index: dict) -> tuple[list[list], list[tuple[int, str, os.stat_result]]]:
    """(rows with the digests ``index`` knows for files whose stat is unchanged, the rest to hash)."""
    rows, todo = [], []
    for f in files:
        st = f.stat()
        key = str(f.resolve())
        entry = index.get(key)
        rows.append([f.name if f == root else f.relative_to(root).as_posix(), None])
        if isinstance(entry, list) and entry[:4] == _stat_key(st):
            rows[-1][1] = entry[4]
        else:
            todo.append((len(rows) - 1, key, st))
    return rows, todo


def _hash(rows: list[list], todo: list[tuple[int, str, os.stat_result]], index_path: Path | None) -> None:
    """Fill the digests of ``todo`` into ``rows``, recording the settled ones in the index."""
    total = sum(st.st_size for _, _, st in todo)
    if total >= _LOUD_BYTES:
        print(f"hashing {len(todo)} data files ({total / 2**20:,.0f} MiB) once, to identify their content; the "
              f"digests are kept in {index_path}", file=sys.stderr, flush=True)
    fresh = {}
    # disable=None: no bar when stderr is no terminal (a log file would get one line of carriage returns)
    with tqdm(total=total, desc="hash data", unit="B", unit_scale=True,
              disable=True if total < _LOUD_BYTES else None) as bar:
        for i, key, st in todo:
            rows[i][1] = _sha256(Path(key))
            bar.update(st.st_size)
            still = _stat_key(os.stat(key)) == _stat_key(st)
            settled = time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_SECONDS * 1e9
            if still and settled:
                fresh[key] = [*_stat_key(st), rows[i][1]]
    if fresh and index_path is not None:
        try:  # merged with what another process wrote meanwhile: a lost race costs one re-hash
            atomic_write_json(index_path, {**_load(index_path), **fresh}, indent=None)
        except OSError:
            pass  # a read-only cache costs a re-hash next time, nothing else
