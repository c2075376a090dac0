"""A run's output folder: a safe name, a record of what the run made, one writer at a time, no stale temporaries.

- The run name is one path component (progressive.config.validate), so ``output_dir/name`` always lies
  inside ``output_dir``.
- A marker file (``.growtrain-run``) is written when a run folder is created; ``--overwrite`` empties
  only folders that carry it, never a folder this project did not create (a typo in --name or
  --output_dir cannot delete a home directory or a repository).
- The marker is also the record of what the run made (common/ownership.py): a ``made: NAME`` line for each
  top-level entry, appended and fsynced by ``claim`` just before the run creates it (config.yaml,
  metrics.jsonl, checkpoints/, final/, summary.json, the plots, its trackers' folders, a method's own), and
  carried across resumes. It is never a listing of the folder: a file a user puts into a run folder, at any
  time, is never on it. A fresh start with ``--overwrite`` empties the folder only when everything in it is on
  the record (or is the lock, or a leftover of an interrupted atomic write of a recorded name); anything else,
  an entry with one of the run's own names that the record does not list included, is refused in one line
  naming it, and nothing is deleted. A resume refuses, the same way, to replace a final output (final/,
  summary.json, the plots) that it did not make.
- ``RunLock``: ``fcntl.flock`` on ``<run>/.lock``, holding the writer's pid and host. A second writer is
  refused with the holder's pid. The kernel drops the lock when the holder exits, however it exits
  (SIGKILL included), so there is no stale lock to clean. flock is per host: on a shared filesystem two
  hosts are not locked out of each other (use distinct run names there). Where the file system does not
  support flock (Lustre or GPFS mounted without it), the lock is an exclusive-create file
  ``<run>/.lock.held`` naming the holder, said in one line; one left by a process of this host that no
  longer runs is taken over, one from another host must be removed by hand (the message says so).
- ``check_inputs_outside``: a fresh start empties the run folder, so it may not be, or hold, one of the run's
  inputs (the rule every tool here follows: an output never contains an input).
- ``RunLock`` opens ``.lock`` without following a symbolic link, and only as a file of its own (no second hard
  link); in a folder that is not yet a run's (no marker) it creates it (``O_EXCL``), so a file of that name that
  was there is never written: a planted link or a user's ``.lock`` cannot make the lock overwrite a user's file.
- ``clean_stale``: the leftovers of interrupted atomic writes of the run's own names (``.NAME.<random>.tmp``,
  ``.NAME.old``) in the run folder and in its checkpoints folder are removed at start (the lock guarantees no
  one is writing them); nothing else, and never through a link (a checkpoints/ that links to another disk is
  not cleaned).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from common import ownership
from common.ownership import RUN, contains, is_marked
from progressive.config import ConfigError, load_config

__all__ = ["MARKER", "LOCK", "TOOL", "is_run_folder", "is_comparison", "compared_methods", "resumed_methods", "claim",
           "made",
           "adopt_earlier", "check_can_start", "check_resume", "check_inputs_outside", "start_fresh", "clean_stale",
           "RunLock", "mark_comparison"]

MARKER = RUN  # the ownership rule of every tool here: common/ownership.py
LOCK = ".lock"
HELD = ".lock.held"  # the lock where the file system has no flock (RunLock._hold_file)
TOOL = "train.py"
COMPARE = "train.py --compare"  # a comparison's marker: "created by train.py --compare baseline,vcycle; ..."
# what an interrupted checkpoint write leaves in checkpoints/ (progressive.run.checkpoint): the checkpoint's
# temporary folder, the one it replaced, the processes' staging folder
_CHECKPOINT_LEFTOVER = re.compile(r"^\.step[0-9]{8}-phase[0-9]{2}(?:\.[a-z0-9_]+\.tmp|\.old|-ranks\.tmp)$")


def is_run_folder(path: Path) -> bool:
    """True when ``path`` was created by train.py (it carries the marker)."""
    return is_marked(path, MARKER)


def is_comparison(path: Path) -> bool:
    """True when ``path`` is the folder of a ``train.py --compare`` (or of a recipe with train.with_baseline)."""
    return (ownership.marked_by(path, MARKER) or "").startswith(COMPARE)


def compared_methods(path: Path) -> list[str] | None:
    """The methods of the comparison in ``path``, in order, as its marker records them (None: not a
    comparison, or one written before the marker named its methods)."""
    by = ownership.marked_by(path, MARKER) or ""
    methods = [m for m in by[len(COMPARE):].strip().split(",") if m] if by.startswith(COMPARE) else []
    return methods or None


def resumed_methods(path: Path) -> list[str] | None:
    """The methods of the comparison in ``path``, as it was started (None when ``path`` is no comparison): what
    ``--resume`` continues, whatever recipe the command line names. A comparison written before its marker named
    them: the main job's (train.with_baseline: the baseline, then the saved recipe's method).

    Raises:
        ConfigError: an older comparison that is not the main job (its methods must be named again).
    """

    if not is_comparison(path):
        return None
    methods = compared_methods(path)
    if methods:
        return methods
    saved = load_config(Path(path) / "config.yaml") if (Path(path) / "config.yaml").is_file() else None
    if saved is not None and saved.train.with_baseline and saved.method.name != "baseline":
        return ["baseline", saved.method.name]
    raise ConfigError(f"--resume: {path} holds a comparison written before its folder recorded its methods; name "
                      "them as it was started: --compare A,B --resume")


def mark_comparison(path: Path, methods: list[str]) -> None:
    """Mark ``path`` as the folder of a comparison of ``methods``, keeping the record of what it holds."""
    ownership.mark(path, MARKER, f"{COMPARE} {','.join(methods)}", made=sorted(made(path)))


def made(path: Path) -> set[str]:
    """The top-level names the run in ``path`` recorded as made by it."""
    return ownership.made(path, MARKER)


def claim(path: Path, name: str) -> bool:
    """Just before the run creates ``path/name``: put it on the run's record when nothing is there yet.
    Returns whether it is on the record (False: something the run did not make is there)."""
    return ownership.claim(path, MARKER, name)


def adopt_earlier(path: Path, names: Iterable[str]) -> None:
    """A run folder written before runs kept a record (its marker lists nothing): record those of ``names`` that
    are there, the entries that a resume proves are the run's (the checkpoints it resumes from, the config and
    metrics it rewrites). A folder with a record is left as it is."""
    if not is_run_folder(path) or made(path):
        return
    for name in names:
        if (Path(path) / name).exists() and not (Path(path) / name).is_symlink():
            ownership.record_made(path, MARKER, name)


def _foreign(path: Path) -> list[str]:
    """Entries of the run folder ``path`` that the run did not make (its lock aside)."""
    return ownership.unrecorded(path, MARKER, keep=(LOCK, HELD))


def check_can_start(path: Path, overwrite: bool, taken: str | None = None, locked: bool = False) -> None:
    """Fail before any work when a fresh run cannot start in ``path``.

    Args:
        path: the run folder.
        overwrite: whether a folder this project created may be emptied.
        taken: the message for a folder that holds a run, when --overwrite was not given.
        locked: this process holds the folder's lock (``RunLock``), so the lock's files are its own.

    Raises:
        FileExistsError: the folder holds something and --overwrite was not given; or it was not created
            by this project (no marker), in which case --overwrite does not delete it either; or it holds
            something the run did not make (not on its record, or no record at all).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder; it is never deleted: choose another --name")
    if not path.is_dir():
        return
    if not is_run_folder(path):
        # a lone ".lock" too, unless this process created it: the run would write into it
        held = sorted(p.name for p in path.iterdir() if not (locked and p.name in (LOCK, HELD)))
        if held:
            raise FileExistsError(f"{path} exists and was not created by train.py (no {MARKER} marker; it holds "
                                  f"{held[0]}); it is never deleted: choose another --name / --output_dir, or "
                                  "remove it yourself")
        return
    if not [p for p in path.iterdir() if p.name not in (LOCK, HELD, MARKER)]:
        return
    if not overwrite:
        raise FileExistsError(taken or f"{path} already exists: pass --resume to continue that run or --overwrite "
                              "to start it again")
    foreign = _foreign(path)
    if foreign:
        raise FileExistsError(ownership.refusal(path, MARKER, ownership.marked_by(path, MARKER) or TOOL, foreign,
                                                instead="choose another --name"))


def check_resume(path: Path, replaces: Iterable[str]) -> None:
    """Before a resume trains: refuse when one of ``replaces`` (the outputs the run writes whole at its end,
    replacing what is there) exists in ``path`` and is not on the run's record: writing it would delete what
    someone else put there.

    Raises:
        FileExistsError: naming the entry.
    """
    mine = made(path)
    for name in replaces:
        entry = Path(path) / name
        if (entry.exists() or entry.is_symlink()) and name not in mine:
            raise FileExistsError(f"{entry} was not made by this run (the record in {Path(path) / MARKER} does not "
                                  f"list it), and the run writes its own {name} there at the end: move it out "
                                  "first, or start a new run under another --name")


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
    """Empty a run folder we created (keeping its lock, which this process holds), deleting only what its record
    lists, or create one; then write the marker with a new record."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    check_can_start(path, overwrite=True, locked=True)
    for p in path.iterdir():
        if p.name in (LOCK, HELD, MARKER):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()  # a link: only the link goes, never what it points to
    ownership.mark(path, MARKER, TOOL)  # last: a kill above leaves the old record, which lists what is left


def clean_stale(path: Path) -> list[Path]:
    """Remove the leftovers of interrupted atomic writes of the run's own names in ``path`` and in its
    checkpoints folder (see the module docstring); never through a link. Returns what was removed."""
    path, removed = Path(path), []
    own = made(path) | {MARKER}
    places = [(path, lambda n: ownership.is_leftover_of(n, own))]
    ckpts = path / "checkpoints"
    if ckpts.is_dir() and not ckpts.is_symlink():
        places.append((ckpts, _CHECKPOINT_LEFTOVER.match))
    for folder, stale in places:
        for p in folder.iterdir():
            if not stale(p.name) or p.is_symlink():
                continue
            if p.is_dir():
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
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        if not is_run_folder(folder) and not any(folder.iterdir()):
            ownership.mark(folder, MARKER, TOOL)  # a new run folder is the run's before its lock is made in it
        # in a folder that is not a run's, the lock is a new file: whatever has that name is someone else's
        new = 0 if is_run_folder(folder) else os.O_EXCL
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | new, 0o666)
        except FileExistsError:
            raise FileExistsError(f"{self.path} exists in a folder that train.py did not create (no {MARKER} marker); "
                                  "it is never written through: remove it, or use another --name") from None
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
