"""Atomic file output: write to a temporary sibling, then rename, so a crash never leaves half a file.

A rename within one filesystem is atomic on POSIX, so readers see either the old file/folder or the
new one, never a mix. Temporary files and folders are created private (0600 / 0700) by ``tempfile``;
before the rename they get the modes a plain ``open`` / ``mkdir`` would give under the process umask, so
outputs are as readable for a group as any other file the user writes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _plain_modes(folder: Path) -> None:
    """Give ``folder`` and everything in it the modes of a plain mkdir / open under the umask (tempfile
    makes folders 0700, and some writers, e.g. transformers' save_pretrained, leave files 0600)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            os.chmod(os.path.join(root, f), 0o666 & ~mask)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Open a temporary sibling of ``path`` for binary writing; on success it is fsynced and renamed to
    ``path``, on an exception removed (``path`` is left as it was)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, fsync, rename)."""
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=False, default=str) + "\n")


def _remove(path: Path) -> None:
    """Remove a folder, or a file or a symbolic link (only the link), if anything is at ``path``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on success it is renamed to ``path``.

    On an exception the temporary folder is removed and ``path`` is left as it was.

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"output folder {path} already exists; pass overwrite=True (CLI: --overwrite)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        _plain_modes(tmp)
        if path.exists() or path.is_symlink():
            old = path.with_name(f".{path.name}.old")
            _remove(old)
            os.replace(path, old)
            os.replace(tmp, path)
            _remove(old)  # a link that stood at ``path`` goes, never what it points to
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def publish_once(folder: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder that is renamed to ``folder`` on success, unless another process (a DDP
    rank building the same cache) published ``folder`` first, in which case ours is discarded: the first
    complete copy wins. Readers never see a half-written folder."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        yield tmp
        _plain_modes(tmp)
        try:
            os.rename(tmp, folder)  # atomic; fails if folder already exists and is not empty
        except OSError:
            if not folder.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)  # a file system that keeps no locks


@contextlib.contextmanager
def taking_turns(lock: str | os.PathLike, waiting: str) -> Iterator[None]:
    """Run the block holding an exclusive lock (flock) on the file ``lock`` (made if missing, never through a link):
    processes that do the same work at once take turns. A process that has to wait prints ``waiting`` on stderr
    first; the wait has no time limit. Where the file system keeps no locks, or the folder cannot be written, the
    block runs unlocked."""
    lock = Path(lock)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield  # a folder this user cannot write: nothing is built there to take turns at (its readers only read)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in _NO_LOCKS:
                raise
        yield
    finally:
        os.close(fd)  # releases the lock
