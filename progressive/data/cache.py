"""Cache keys for the data caches (tokenizers, token streams, blocks, decoded images) under data.cache_dir.

A key is a short hash of everything that determines a cache entry's content (source identity, tokenizer
content, cut parameters, a format version), so a changed input never reads a stale entry. Entries are
published atomically with common.io.publish_once: the first complete copy wins when DDP ranks race.

Entries are sealed: ``seal`` records each file's size and sha256 in the entry's meta.json when it is written,
and ``check_sealed`` compares them every time it is read (the digests are cached by file identity, so a large
entry is hashed again only when a file changed: progressive.data.identity). A file edited in place, truncated
or swapped is an error naming it, never data trained on silently. An entry written before sealing existed is
sealed on its first read.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from common.io import atomic_write_json
from progressive.data.identity import file_digest

__all__ = ["cache_key", "seal", "check_sealed", "CacheDamaged"]

SEAL = "files"  # meta.json's key: {file name: [bytes, sha256]}


class CacheDamaged(ValueError):
    """A cache entry's file no longer holds what was written there."""


def cache_key(obj: Any, length: int = 20) -> str:
    """The first ``length`` hex digits of sha256 over ``obj`` as canonical JSON (sorted keys; str() for the rest)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


def seal(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the size and sha256 of every ``.npy`` file in ``folder`` (before it is published)."""

    files = sorted(p for p in Path(folder).iterdir() if p.suffix == ".npy")
    return {**meta, SEAL: {p.name: [p.stat().st_size, file_digest(p)] for p in files}}


def check_sealed(folder: Path, cache_dir: str | os.PathLike | None) -> dict[str, Any]:
    """The entry's meta.json, after checking that every sealed file is there, whole and unchanged.

    Raises:
        CacheDamaged: naming the file, what is wrong and the folder to delete (it is rebuilt on the next run).
    """

    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    sealed = meta.get(SEAL)
    if sealed is None:  # written before entries were sealed: seal it now (trust on first read)
        meta = seal(folder, meta)
        try:
            atomic_write_json(folder / "meta.json", meta)
        except OSError:  # a read-only cache: sealed for this run only
            pass
        return meta
    fix = f"delete {folder} and it is built again"
    for name, (size, digest) in sealed.items():
        path = folder / name
        if not path.is_file():
            raise CacheDamaged(f"data cache {path} is missing; {fix}")
        if path.stat().st_size != size:
            raise CacheDamaged(f"data cache {path} has {path.stat().st_size} bytes, {size} were written (truncated or "
                               f"replaced); {fix}")
        if file_digest(path, cache_dir) != digest:
            raise CacheDamaged(f"data cache {path} was changed after it was written (its sha256 differs); {fix}")
    return meta
