"""A run's output folder: a safe name, proof that we created it, one writer at a time, no stale temporaries.

- The run name is one path component (progressive.config.validate), so ``output_dir/name`` always lies
  inside ``output_dir``.
- A marker file (``.growtrain-run``) is written when a run folder is created; ``--overwrite`` empties
  only folders that carry it, never a folder this project did not create (a typo in --name or
  --output_dir cannot delete a home directory or a repository).
- ``RunLock``: ``fcntl.flock`` on ``<run>/.lock``, holding the writer's pid and host. A second writer is
  refused with the holder's pid. The kernel drops the lock when the holder exits, however it exits
  (SIGKILL included), so there is no stale lock to clean. flock is per host: on a shared filesystem two
  hosts are not locked out of each other (use distinct run names there). Where the file system does not
  support flock (Lustre or GPFS mounted without it), the lock is an exclusive-create file
  ``<run>/.lock.held`` naming the holder, said in one line; one left by a process of this host that no
  longer runs is taken over, one from another host must be removed by hand (the message says so).
- What a run wrote is recorded in its marker (``record_contents``, at every checkpoint and at the end): a fresh
  start with ``--overwrite`` empties the folder only when everything in it is on that record, so a file a user
  left in a run folder is never deleted with the run (a folder without a record, a run stopped before its
  first checkpoint, is emptied whole, as it was made by train.py moments before).
- ``check_inputs_outside``: a fresh start empties the run folder, so it may not be, or hold, one of the run's
  inputs (the rule every tool here follows: an output never contains an input).
- ``RunLock`` opens ``.lock`` without following a symbolic link, and only as a file of its own (no second hard
  link): a planted link cannot make the lock overwrite a user's file.
- ``clean_stale``: hidden ``.*.tmp`` folders and files that an interrupted atomic write left in the run
  folder and its checkpoints folder are removed at start (the lock guarantees no one is writing them).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import stat
import sys
from pathlib import Path

from common.ownership import RUN, contains, is_marked, mark

__all__ = ["MARKER", "LOCK", "is_run_folder", "check_can_start", "check_inputs_outside", "start_fresh", "clean_stale",
           "RunLock", "mark", "record_contents", "unrecorded"]

MARKER = RUN  # the ownership rule of every tool here: common/ownership.py
LOCK = ".lock"
HELD = ".lock.held"  # the lock where the file system has no flock (RunLock._hold_file)
_WROTE = "wrote: "  # a marker line naming one top-level entry the run wrote
# written between two records (at the end of a run, or an interrupted write's leftover): the run's own by name
_OWN = {"config.yaml", "metrics.jsonl", "checkpoints", "final", "summary.json", "loss_vs_flops.png",
        "loss_vs_wallclock.png"}


def is_run_folder(path: Path) -> bool:
    """True when ``path`` was created by train.py (it carries the marker)."""
    return is_marked(path, MARKER)


def is_comparison(path: Path) -> bool:
    """True when ``path`` is the folder of a ``train.py --compare`` (or of a recipe with train.with_baseline)."""
    return is_run_folder(path) and "--compare" in (Path(path) / MARKER).read_text(errors="replace")


def check_can_start(path: Path, overwrite: bool, taken: str | None = None) -> None:
    """Fail before any work when a fresh run cannot start in ``path``.

    Args:
        path: the run folder.
        overwrite: whether a folder this project created may be emptied.
        taken: the message for a folder that holds a run, when --overwrite was not given.

    Raises:
        FileExistsError: the folder holds something and --overwrite was not given, or it was not created
            by this project (no marker), in which case --overwrite does not delete it either.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder; it is never deleted: choose another --name")
    contents = [p for p in path.iterdir() if p.name not in (LOCK, HELD)] if path.is_dir() else []
    if not contents:
        return
    if not is_run_folder(path):
        raise FileExistsError(f"{path} exists and was not created by train.py (no {MARKER} marker); it is never "
                              "deleted: choose another --name / --output_dir, or remove it yourself")
    if not overwrite:
        raise FileExistsError(taken or f"{path} already exists: pass --resume to continue that run or --overwrite "
                              "to start it again")
    foreign = unrecorded(path)
    if foreign:
        names = ", ".join(sorted(foreign)[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(f"{path} holds {names}, which train.py did not write; --overwrite deletes only what "
                              "the run wrote: move those out first, or choose another --name")


def record_contents(path: Path) -> None:
    """Record in the marker every top-level entry of the run folder ``path`` (all written by this run, which
    started the folder empty and holds its lock): what a later ``--overwrite`` may delete."""
    path = Path(path)
    names = sorted(p.name for p in path.iterdir() if p.name not in (LOCK, HELD, MARKER))
    mark(path, MARKER, "train.py")
    with open(path / MARKER, "a") as f:
        f.writelines(f"{_WROTE}{n}\n" for n in names)


def unrecorded(path: Path) -> list[str]:
    """Top-level entries of ``path`` that its marker does not record ([] when it records nothing yet)."""
    path = Path(path)
    try:
        lines = (path / MARKER).read_text(errors="replace").splitlines()
    except OSError:
        return []
    wrote = {ln[len(_WROTE):] for ln in lines if ln.startswith(_WROTE)}
    if not wrote:
        return []
    own = wrote | _OWN | {LOCK, HELD, MARKER}
    return [p.name for p in path.iterdir()
            if p.name not in own and not (p.name.startswith(".") and p.name.endswith((".tmp", ".old")))]


def check_inputs_outside(path: Path, inputs: dict[str, str | None]) -> None:
    """Refuse a fresh start in ``path`` (which empties it) when one of the run's inputs is, or lies in, it.

    Args:
        path: the run folder.
        inputs: {config field: its value}; a value that is no path on disk (a dataset or tokenizer name, a Hub
            id) is skipped, except ``data.cache_dir``, which the run creates.

    Raises:
        ValueError: naming the field, its value and the folder.
    """
    for field, value in inputs.items():
        if not value:
            continue
        where = Path(value).expanduser()
        if (where.exists() or field == "data.cache_dir") and contains(path, where):
            raise ValueError(f"{field}: {value} is inside the run folder {path}, which a fresh start empties "
                             "before anything is read; move it out, or start this run under another --name")


def start_fresh(path: Path) -> None:
    """Empty a run folder we created (keeping its lock) or create one; then write the marker."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    check_can_start(path, overwrite=True)
    for p in path.iterdir():
        if p.name in (LOCK, HELD):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    mark(path, MARKER, "train.py")


def clean_stale(path: Path) -> list[Path]:
    """Remove hidden ``.*.tmp`` leftovers of interrupted atomic writes in ``path`` and ``path/checkpoints``."""
    removed = []
    for folder in (Path(path), Path(path) / "checkpoints"):
        if not folder.is_dir():
            continue
        for p in folder.iterdir():
            if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.endswith(".old")):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def _gone(holder: str) -> bool:
    """Whether the holder line "pid N on HOST" names a process of this host that no longer runs."""
    parts = holder.split()
    if len(parts) != 4 or parts[0] != "pid" or parts[2] != "on" or parts[3] != socket.gethostname():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError):
        return False
    return False


class RunLock:
    """An exclusive lock on a run folder for the life of a run (use as a context manager or acquire/release).

    Raises (acquire):
        FileExistsError: another live process holds the lock; the message gives its pid and host.
    """

    def __init__(self, path: Path):
        self.path = Path(path) / LOCK
        self._fd: int | None = None
        self._held: Path | None = None  # the fallback lock file, where flock is not supported

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:  # ELOOP: a symbolic link
            raise FileExistsError(f"{self.path} is not a plain file ({e.strerror}); it is never written through: "
                                  "remove it, or use another --name") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            os.close(fd)
            raise FileExistsError(f"{self.path} is not a file of its own (another name links to it); it is never "
                                  "written through: remove it, or use another --name")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise FileExistsError(f"{self.path.parent} is in use by another run ({holder}); wait for it to finish "
                                  "or use another --name") from None
        except OSError as e:  # flock unsupported here (a Lustre or GPFS mount without it): ENOLCK, EOPNOTSUPP...
            os.close(fd)
            self._hold_file(e)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def _hold_file(self, why: OSError) -> None:
        """The fallback where the file system has no flock: an exclusive-create file ``.lock.held`` naming the
        holder. A holder on this host that no longer runs left it behind: it is taken over; one on another
        host cannot be checked from here, so the message says how to remove it."""
        held, me = self.path.parent / HELD, f"pid {os.getpid()} on {socket.gethostname()}"
        print(f"run lock: the file system does not support flock ({why.strerror or why}); using the "
              f"exclusive-create file {held}", file=sys.stderr)
        for _ in range(2):
            try:
                fd = os.open(held, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
            except FileExistsError:
                holder = held.read_text(errors="replace").strip() if held.is_file() else "unknown"
                if _gone(holder):
                    held.unlink(missing_ok=True)  # its process ended without removing it (a SIGKILL)
                    continue
                raise FileExistsError(f"{self.path.parent} is in use by another run ({holder}); wait for it to "
                                      f"finish or use another --name (if that run is gone, remove {held})") from None
            os.write(fd, f"{me}\n".encode())
            os.close(fd)
            self._held = held
            return
        raise FileExistsError(f"{self.path.parent}: could not take the lock file {held}; remove it if no run uses it")

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self._held is not None:
            self._held.unlink(missing_ok=True)
            self._held = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
