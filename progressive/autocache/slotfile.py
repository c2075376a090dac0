"""AutoCache's disk tier: one file of fixed-size slots, each entry checked when it is read back.

The tier trusts nothing it did not just check:

- The file, ``<name>-<token>.autocache``, is created exclusively (never an existing file) and it is the only
  file ``close`` deletes; a folder the user chose keeps everything else in it.
- It grows in chunks whose blocks are reserved (``os.posix_fallocate``: no sparse holes a full disk could
  fail to back), up to the capacity, which is capped when the tier opens at the free space less a margin.
- A slot is a 128-byte header (magic, format, the cache's random token, sample id, depth, dtype, shape, and a
  CRC-32 of header and payload) followed by the activation's bytes.
- Slots are read and written with ``os.preadv`` / ``os.pwritev``, never through a memory map: reading a
  mapped page beyond the end of a truncated file raises SIGBUS, which kills the process.
- A read that fails any check (short read, another token, sample, depth, dtype or shape, a bad checksum)
  returns None, and the caller recomputes the sample; a failed write or reservation (a full disk) turns
  the tier off for new entries. Each kind of failure is warned about once per file.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

__all__ = ["SlotFile", "HEADER", "SUFFIX", "slot_bytes"]

MAGIC, FORMAT, MAX_DIMS = b"GTAC", 1, 6
# magic, format, ndim, token, sample id, depth, dtype name, shape (zero-padded), 24 spare bytes, CRC-32
HEADER = struct.Struct("<4sHH16sqi16s6q24xI")
SUFFIX = ".autocache"
CHUNK_BYTES = 64 * 2**20  # the file grows by reserved chunks of about this size
MARGIN_BYTES = 2**30      # the tier never takes the last GiB of its file system
# Test-only fault injection: SIGKILL this process right after its n-th slot write (a kill while a cache
# fills, in the middle of a training step).
KILL_AT_WRITE_ENV = "PROGRESSIVE_KILL_AT_CACHE_WRITE"


def dtype_name(dtype: torch.dtype) -> str:
    """"float32" for torch.float32 (what the header stores)."""
    return str(dtype).removeprefix("torch.")


def slot_bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes of one slot (header + payload) for entries of ``shape`` and ``dtype``."""
    return HEADER.size + int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()


class SlotFile:
    """Up to ``capacity`` entries of ``shape``/``dtype``, each in its own slot of one file.

    Args:
        folder: where the file goes (created if missing; removed by ``close`` only if created here and empty).
        want: the slots asked for (capped by the free space).
        name: the file's prefix (one file per process: "rank0").
        shape, dtype: what every entry holds.
        token: 16 bytes identifying the cache (in every header; a resumed cache keeps its token).
        owned: ``folder`` belongs to this run: files with this prefix left there by a killed process of the
            run are deleted; elsewhere they are only named in a warning.
        warn: receives each warning line.

    Raises:
        OSError: the folder or file cannot be created (the caller runs without a disk tier).
    """

    def __init__(self, folder: Path, want: int, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                 token: bytes, owned: bool, warn: Callable[[str], None]):
        if len(shape) > MAX_DIMS:
            raise ValueError(f"the disk tier stores activations of at most {MAX_DIMS} dimensions, got {shape}")
        self.shape, self.dtype, self.token, self._say = shape, dtype, token, warn
        self.slot_bytes = slot_bytes(shape, dtype)
        self.capacity = self.used = self._allocated = 0  # slots: allowed / handed out / reserved in the file
        self.off = False   # a write or a reservation failed: no new entries
        self.bad = 0       # reads that failed a check
        self.path: Path | None = None
        self._fd: int | None = None
        self._free: list[int] = []  # handed-out slots whose entry was dropped (reused first)
        self._warned: set[str] = set()
        self._writes = 0
        self.folder, self._made_dir = folder, False
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir()
            self._made_dir = True
        except FileExistsError:
            pass
        left = sorted(folder.glob(f"{name}-*{SUFFIX}"))
        for p in left if owned else []:
            p.unlink(missing_ok=True)  # a killed process of this very run wrote it
        if left and not owned:
            self._warn("left", f"{folder} holds {len(left)} AutoCache file(s) of other runs or of killed processes "
                       f"({left[0].name}, ...): never read by this run, and not deleted (remove them yourself once "
                       "no run uses them)")
        free = shutil.disk_usage(folder).free
        room = max(0, free - MARGIN_BYTES) // self.slot_bytes
        if room < want:
            self._warn("capped", f"disk tier in {folder}: asked for {want * self.slot_bytes / 2**20:.1f} MiB, but "
                       f"{free / 2**20:.1f} MiB are free and it leaves {MARGIN_BYTES >> 20} MiB: "
                       + (f"capped at {room * self.slot_bytes / 2**20:.1f} MiB" if room else "no disk tier"))
        self.capacity = min(want, room)
        if self.capacity:
            self.path = folder / f"{name}-{token.hex()}{SUFFIX}"
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)

    def _warn(self, kind: str, msg: str) -> None:
        if kind not in self._warned:  # one line per file and kind, not one per sample
            self._warned.add(kind)
            self._say(msg)

    def turn_off(self, why: str) -> None:
        """Take no new entries from now on (the ones written stay readable, each read still checked)."""
        self._warn("off", f"disk tier {self.path}: {why}; no new entries go to disk from now on (training goes "
                   "on; free some space to use it in a later run)")
        self.off, self._free = True, []

    # ------------------------------------------------------------------------------------ slots

    def new_slot(self) -> int | None:
        """A slot for a new entry, or None when the tier is full or off."""
        if self._fd is None or self.off:
            return None
        if self._free:
            return self._free.pop()
        if self.used >= self.capacity or (self.used == self._allocated and not self._grow(self.used + 1)):
            return None
        self.used += 1
        return self.used - 1

    def drop(self, slot: int) -> None:
        """The entry in ``slot`` is no longer wanted: its slot may be reused."""
        if not self.off:
            self._free.append(slot)

    def _grow(self, need: int) -> bool:
        """Reserve slots up to at least ``need`` (a chunk at a time) within the capacity."""
        while self._allocated < need:
            n = min(self.capacity - self._allocated, max(1, CHUNK_BYTES // self.slot_bytes))
            start, size = self._allocated * self.slot_bytes, n * self.slot_bytes
            try:
                if n <= 0 or shutil.disk_usage(self.folder).free - size < MARGIN_BYTES:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(self._fd, start, size)
                else:  # pragma: no cover - not Linux
                    os.ftruncate(self._fd, start + size)
            except OSError as e:
                self.turn_off(f"could not reserve {size / 2**20:.1f} MiB more ({e.strerror or e})")
                return False
            self._allocated += n
        return True

    def _header(self, sample: int, depth: int, crc: int) -> bytes:
        dims = list(self.shape) + [0] * (MAX_DIMS - len(self.shape))
        return HEADER.pack(MAGIC, FORMAT, len(self.shape), self.token, sample, depth,
                           dtype_name(self.dtype).encode(), *dims, crc)

    def write(self, slot: int, sample: int, depth: int, value: torch.Tensor) -> bool:
        """Write sample ``sample``'s activation ``value`` at ``depth`` into ``slot``; False (and the tier off)
        when the write fails."""
        payload = memoryview(value.contiguous().view(torch.uint8).numpy()).cast("B")
        crc = zlib.crc32(payload, zlib.crc32(self._header(sample, depth, 0)[:-4]))
        try:
            n = os.pwritev(self._fd, [self._header(sample, depth, crc), payload], slot * self.slot_bytes)
            if n != self.slot_bytes:
                raise OSError(errno.EIO, f"short write, {n} of {self.slot_bytes} bytes")
        except OSError as e:
            self.turn_off(f"a write failed ({e.strerror or e})")
            return False
        self._writes += 1
        if os.environ.get(KILL_AT_WRITE_ENV) == str(self._writes):
            os.kill(os.getpid(), signal.SIGKILL)
        return True

    def read(self, slot: int, sample: int, depth: int) -> torch.Tensor | None:
        """The entry in ``slot`` if it is intact and sample ``sample``'s at ``depth``, else None (warned)."""
        buf = bytearray(self.slot_bytes)
        try:
            n = os.preadv(self._fd, [buf], slot * self.slot_bytes)
        except OSError as e:
            return self._failed("unreadable", f"a read of {self.path} failed ({e.strerror or e})")
        if n != self.slot_bytes:
            return self._failed("short", f"{self.path} is shorter than its entries (truncated)")
        magic, fmt, ndim, token, sid, d, dtype, *rest = HEADER.unpack_from(buf)
        if (magic, fmt, token) != (MAGIC, FORMAT, self.token):
            return self._failed("foreign", f"{self.path} holds an entry this cache did not write (overwritten, or "
                                "another run's file)")
        if (sid, d, dtype.rstrip(b"\0").decode(errors="replace"), tuple(rest[:ndim])) != \
                (sample, depth, dtype_name(self.dtype), self.shape):
            return self._failed("mismatch", f"an entry of {self.path} is not the sample, depth, dtype or shape it "
                                "was written for")
        view = memoryview(buf)
        if zlib.crc32(view[HEADER.size:], zlib.crc32(view[:HEADER.size - 4])) != rest[-1]:
            return self._failed("checksum", f"an entry of {self.path} fails its checksum (corrupted on disk)")
        return torch.frombuffer(buf, dtype=self.dtype, offset=HEADER.size).view(self.shape)

    def _failed(self, kind: str, msg: str) -> None:
        self.bad += 1
        self._warn(kind, f"{msg}; such entries are recomputed (this warning is not repeated)")
        return None

    # ------------------------------------------------------------------------------------ whole file

    def intact(self) -> bool:
        """Whether the file still holds every slot handed out (someone may have truncated it meanwhile)."""
        try:
            return os.fstat(self._fd).st_size >= self.used * self.slot_bytes
        except OSError:
            return False

    def copy_out(self, dest: Path) -> None:
        """Copy the used slots, as they are, to a new file ``dest`` (a checkpoint's part).

        Raises:
            OSError: the copy failed (e.g. a full disk).
        """
        with open(dest, "wb") as out:
            _copy(self._fd, out.fileno(), self.used * self.slot_bytes)

    def copy_in(self, src: Path, used: int, free: list[int]) -> bool:
        """Fill this (new, empty) file with ``used`` slots saved by ``copy_out``, ``free`` of them unused;
        False when they do not fit (capacity, free space) or the copy fails."""
        if used > self.capacity or not self._grow(used):
            return False
        try:
            with open(src, "rb") as f:
                if os.fstat(f.fileno()).st_size != used * self.slot_bytes:
                    return False
                _copy(f.fileno(), self._fd, used * self.slot_bytes)
        except OSError:
            return False
        self.used, self._free = used, sorted(free, reverse=True)
        return True

    def close(self) -> None:
        """Delete this file, and the folder if this object created it and nothing else is in it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)
        if self._made_dir:
            try:
                self.folder.rmdir()
            except OSError:
                pass  # not empty: another process's file, or the user's


def _copy(src: int, dst: int, size: int) -> None:
    """Copy bytes [0, size) of file descriptor ``src`` to the same offsets of ``dst`` (in the kernel where
    it can; in 8 MiB pieces through memory otherwise).

    Raises:
        OSError: a failed or short copy.
    """
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, size - done, done, done)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = os.pwrite(dst, os.pread(src, min(size - done, 8 * 2**20), done), done)
        if n == 0:
            raise OSError(errno.EIO, f"the file ended after {done} of {size} bytes")
        done += n
