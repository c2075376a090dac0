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
- At every depth (``_not_made``): final/ is written whole (``write_whole``) and its files go on the record
  (``made: final/config.json``) from the temporary folder the run wrote them into, before it is renamed in; a
  checkpoint's files are the ones its manifest lists (checkpoints/ holds the run's checkpoints and the leftovers
  of its interrupted writes, nothing else); a comparison's method folders are run folders with records of their
  own. Anything else inside those (a model card in final/, an eval's JSON in a checkpoint) is refused like a
  top-level entry, and ``start_fresh`` deletes only the recorded files (and the folders they leave empty). A
  recorded folder whose files are not known (a tracker's, a method's own such as autocache/) is the tool's and
  goes whole; a final/ whose files were never recorded (an earlier version's) is refused.
- ``RunLock``: ``fcntl.flock`` on ``<run>/.lock``, holding the writer's pid and host. A second writer is
  refused with the holder's pid. The kernel drops the lock when the holder exits, however it exits
  (SIGKILL included), so there is no stale lock to clean. flock is per host: on a shared filesystem two
  hosts are not locked out of each other (use distinct run names there). Where the file system does not
  support flock (Lustre or GPFS mounted without it), the lock is an exclusive-create file
  ``<run>/.lock.held`` naming the holder, said in one line; one left by a process of this host that no
  longer runs is taken over, one from another host must be removed by hand (the message says so).
- The lock is taken before the folder is read: a command decides how the run starts under it
  (progressive.run.start) and ``hand_on``s it to the trainer or comparison that carries the decision out,
  which holds it to its end; a comparison holds its folder's for its whole life (progressive.report.compare).
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

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from common import ownership
from common.io import atomic_dir
from common.ownership import RUN, contains, is_marked
from progressive.config import ConfigError, load_config
from progressive.run import checkpoint as ckpt

__all__ = ["MARKER", "LOCK", "TOOL", "RunFolder", "look", "is_run_folder", "claim", "made", "adopt_earlier",
           "check_can_start", "check_resume", "check_inputs_outside", "start_fresh", "clean_stale", "write_whole",
           "RunLock", "mark_comparison", "FINAL"]

MARKER = RUN  # the ownership rule of every tool here: common/ownership.py
LOCK = ".lock"
HELD = ".lock.held"  # the lock where the file system has no flock (RunLock._hold_file)
TOOL = "train.py"
COMPARE = "train.py --compare"  # a comparison's marker: "created by train.py --compare baseline,vcycle; ..."
FINAL = "final"  # the run's Hugging Face checkpoint, written whole at its end (write_whole): its files are recorded
# a checkpoint folder's name (progressive.run.checkpoint), and what an interrupted checkpoint write leaves in
# checkpoints/: the checkpoint's temporary folder, the one it replaced, the processes' staging folder
_CHECKPOINT = re.compile(r"^step[0-9]{8,}-phase[0-9]{2,}$")
_CHECKPOINT_LEFTOVER = re.compile(r"^\.step[0-9]{8,}-phase[0-9]{2,}(?:\.[a-z0-9_]+\.tmp|\.old|-ranks\.tmp)$")


@dataclass(frozen=True)
class RunFolder:
    """What a folder's marker says of it, from one read (``look``): whether train.py made it (``is_run``), whether it
    is a comparison (``train.py --compare``, or a recipe with train.with_baseline) and of which ``methods``, and what
    its run recorded as made. A snapshot: read it again (``look``) after the folder may have changed (under its
    lock, say)."""

    path: Path
    marker: ownership.Marker | None

    @property
    def is_run(self) -> bool:
        return self.marker is not None

    @property
    def is_comparison(self) -> bool:
        return self.marker is not None and self.marker.by.startswith(COMPARE)

    @property
    def methods(self) -> list[str] | None:
        """The comparison's methods, in order, as its marker records them (None: not a comparison, or one written
        before the marker named its methods)."""
        if not self.is_comparison:
            return None
        return [m for m in self.marker.by[len(COMPARE):].strip().split(",") if m] or None

    @property
    def made(self) -> frozenset[str]:
        return frozenset() if self.marker is None else self.marker.made

    def resumed_methods(self) -> list[str] | None:
        """The methods of the comparison here, as it was started (None when this is no comparison): what
        ``--resume`` continues, whatever recipe the command line names. A comparison written before its marker named
        them: the main job's (train.with_baseline: the baseline, then the saved recipe's method).

        Raises:
            ConfigError: an older comparison that is not the main job (its methods must be named again).
        """
        if not self.is_comparison:
            return None
        if self.methods:
            return self.methods
        path = self.path / "config.yaml"
        saved = load_config(path) if path.is_file() else None
        if saved is not None and saved.train.with_baseline and saved.method.name != "baseline":
            return ["baseline", saved.method.name]
        raise ConfigError(f"--resume: {self.path} holds a comparison written before its folder recorded its methods; "
                          "name them as it was started: --compare A,B --resume")


def look(path: Path) -> RunFolder:
    """``path`` as its marker describes it, read once (``RunFolder``)."""
    return RunFolder(Path(path), ownership.read_marker(path, MARKER))


def is_run_folder(path: Path) -> bool:
    """True when ``path`` was created by train.py (it carries the marker)."""
    return is_marked(path, MARKER)


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


def _not_made(path: Path) -> tuple[list[str], list[str]]:
    """What the run folder ``path`` holds that its run did not make, at any depth (its lock aside), as paths
    relative to it: (entries the records do not list; recorded folders whose files are not recorded, which cannot
    be told from a user's)."""
    foreign, unknown = ownership.unrecorded(path, MARKER, keep=(LOCK, HELD)), []
    for name in sorted(n for n in made(path) if "/" not in n):
        inner, blind = _not_made_inside(path, name)
        foreign += [f"{name}/{rel}" for rel in inner]
        unknown += [f"{name}/{rel}".rstrip("/") for rel in blind]
    return foreign, unknown


def _not_made_inside(path: Path, name: str) -> tuple[list[str], list[str]]:
    """``_not_made`` inside the recorded entry ``name`` of the run folder ``path`` (paths relative to it; "" in the
    second list: the entry itself)."""
    entry = path / name
    if entry.is_symlink() or not entry.is_dir():
        return [], []  # a file, or a link the run made (only the link is its own)
    if is_run_folder(entry):  # a comparison's method run
        return _not_made(entry)
    if name == ckpt.CHECKPOINTS:
        return _not_made_in_checkpoints(entry)
    files = ownership.made_inside(path, MARKER, name)
    if files:
        return ownership.unlisted(entry, files), []
    return [], ([""] if name == FINAL else [])  # else a tracker's or the method's own folder: theirs, whole


def _checkpoint_files(folder: Path) -> set[str] | None:
    """The files of the checkpoint ``folder`` (its manifest's, and the manifest), or None when it is no checkpoint
    the run wrote (not a checkpoint's name, a link, or no readable manifest: a checkpoint is renamed into place
    only once its manifest is written)."""
    if folder.is_symlink() or not folder.is_dir() or not _CHECKPOINT.match(folder.name):
        return None
    try:
        listed = json.loads((folder / ckpt.MANIFEST).read_text())["sha256"]
        return {str(name) for name in listed} | {ckpt.MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _not_made_in_checkpoints(folder: Path) -> tuple[list[str], list[str]]:
    """``_not_made`` inside checkpoints/: the run's checkpoints hold their manifests' files; the leftovers of its
    interrupted checkpoint writes are its own too."""
    foreign, unknown = [], []
    for p in sorted(folder.iterdir()):
        if _CHECKPOINT_LEFTOVER.match(p.name) and not p.is_symlink():
            continue
        files = _checkpoint_files(p)
        if files is not None:
            foreign += [f"{p.name}/{rel}" for rel in ownership.unlisted(p, files)]
        elif _CHECKPOINT.match(p.name) and p.is_dir() and not p.is_symlink():
            unknown.append(p.name)
        else:
            foreign.append(p.name)
    return foreign, unknown


def _refusal(path: Path, foreign: list[str], unknown: list[str], instead: str) -> str:
    """The one line that refuses to empty the run folder ``path`` (see ``_not_made``)."""
    if unknown:
        return (f"{path / unknown[0]} holds files train.py has no record of (written by an earlier version, or its "
                f"{ckpt.MANIFEST} is unreadable), so --overwrite cannot tell them from yours: remove it yourself, or "
                f"{instead}")
    return ownership.refusal(path, MARKER, ownership.marked_by(path, MARKER) or TOOL, foreign, instead=instead)


def check_can_start(path: Path, overwrite: bool, taken: str | None = None, locked: bool = False) -> None:
    """Fail before any work when a fresh run cannot start in ``path``.

    Args:
        path: the run folder.
        overwrite: whether a folder this project created may be emptied.
        taken: the message for a folder that holds a run, when --overwrite was not given.
        locked: this process holds the folder's lock (``RunLock``), so the lock's files are its own.

    Raises:
        FileExistsError: the folder holds something and --overwrite was not given; or it was not created
            by this project (no marker), in which case --overwrite does not delete it either; or it holds, at any
            depth, something the run did not make (not on its record, or no record at all; see ``_not_made``).
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
    foreign, unknown = _not_made(path)
    if foreign or unknown:
        raise FileExistsError(_refusal(path, foreign, unknown, instead="choose another --name"))


def check_resume(path: Path, replaces: Iterable[str]) -> None:
    """Before a resume trains: refuse when one of ``replaces`` (the outputs the run writes whole at its end,
    replacing what is there) exists in ``path`` and is not on the run's record: writing it would delete what
    someone else put there.

    Raises:
        FileExistsError: naming the entry.
    """
    for name in replaces:
        _check_replaceable(Path(path), name, "move it out first, or start a new run under another --name")


def _check_replaceable(path: Path, name: str, todo: str) -> None:
    """Refuse when ``path/name`` is there and is not the run's whole: not on its record, or holding (at any depth)
    something the run did not write; ``todo``: what the user can do."""
    entry = path / name
    if not (entry.exists() or entry.is_symlink()):
        return
    if name not in made(path):
        foreign, unknown = [name], []
    else:
        inner, blind = _not_made_inside(path, name)
        foreign, unknown = [f"{name}/{rel}" for rel in inner], [f"{name}/{rel}".rstrip("/") for rel in blind]
    if unknown:
        raise FileExistsError(f"{path / unknown[0]} holds files this run has no record of (written by an earlier "
                              f"version), and the run writes its own {name} there at the end: {todo}")
    if foreign:
        raise FileExistsError(f"{path / foreign[0]} was not made by this run (the record in {path / MARKER} does not "
                              f"list it), and the run writes its own {name} there at the end: {todo}")


@contextlib.contextmanager
def write_whole(path: Path, name: str) -> Iterator[Path]:
    """Write the folder ``path/name`` of the run folder ``path`` whole: yield a temporary folder to fill, then put
    each file in it on the run's record and rename it into place (replacing the run's own earlier one).

    Raises:
        FileExistsError: something the run did not make is at ``path/name`` or inside it (it is never replaced).
    """
    path = Path(path)
    _check_replaceable(path, name, "move it out, then resume the run (--resume) to write its final outputs")
    claim(path, name)
    with atomic_dir(path / name, overwrite=True) as tmp:
        yield tmp
        known = ownership.made_inside(path, MARKER, name)
        for rel in ownership.files_under(tmp):  # what the run just wrote into a folder of its own making
            if rel not in known:
                ownership.record_made(path, MARKER, f"{name}/{rel}")


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
    _remove_made(path)
    ownership.mark(path, MARKER, TOOL)  # last: a kill above leaves the old record, which lists what is left


def _remove_made(path: Path) -> None:
    """Delete what the run in ``path`` made, at every depth (``_not_made``), and nothing else: its lock and marker
    stay; a folder whose files are known loses only those (and is removed once that leaves it empty)."""
    own = made(path) | {MARKER}
    for p in sorted(path.iterdir()):
        name = p.name
        if name in (LOCK, HELD, MARKER) or not (name in own or ownership.is_leftover_of(name, own)):
            continue  # not the run's: refused by the check, or put there since
        if p.is_symlink() or not p.is_dir():
            p.unlink()  # a link: only the link goes, never what it points to
        elif name not in own:
            shutil.rmtree(p)  # the leftover of an interrupted write of the run's own
        elif is_run_folder(p):  # a comparison's method run: what its own record lists, then its marker and lock
            _remove_made(p)
            for f in (MARKER, LOCK, HELD):
                (p / f).unlink(missing_ok=True)
            ownership.remove_listed(p, ())
        elif name == ckpt.CHECKPOINTS:
            _remove_checkpoints(p)
        elif ownership.made_inside(path, MARKER, name):
            ownership.remove_listed(p, ownership.made_inside(path, MARKER, name))
        elif name != FINAL:  # a tracker's or the method's own folder: written by them, theirs whole
            shutil.rmtree(p)


def _remove_checkpoints(folder: Path) -> None:
    """Delete the run's checkpoints (their manifests' files) and the leftovers of its checkpoint writes."""
    for p in sorted(folder.iterdir()):
        files = _checkpoint_files(p)
        if files is not None:
            ownership.remove_listed(p, files)
        elif _CHECKPOINT_LEFTOVER.match(p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
    ownership.remove_listed(folder, ())


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


# the locks this process holds and has handed on (RunLock.hand_on), by folder: the next RunLock of that folder
# acquired in this process takes the lock over
_HANDED_ON: dict[str, RunLock] = {}


class RunLock:
    """An exclusive lock on a run folder for the life of a run (use as a context manager or acquire/release).

    Raises (acquire):
        FileExistsError: another live process holds the lock (another RunLock of this process included, unless
            that one was handed on); the message gives its pid and host.
    """

    def __init__(self, path: Path):
        self.path = Path(path) / LOCK
        self._fd: int | None = None
        self._held: Path | None = None  # the fallback lock file, where flock is not supported

    @property
    def held(self) -> bool:
        """Whether this lock is held (by this object)."""
        return self._fd is not None or self._held is not None

    def _key(self) -> str:
        return os.path.realpath(self.path.parent)

    def hand_on(self) -> None:
        """Let the next RunLock of this folder that this process acquires take this held lock over, instead of
        being refused by it: a command decides how its run starts under the lock (progressive.run.start), and the
        trainer or comparison that carries the decision out holds the same lock to its end, with no moment
        between the two when another writer could take it. Released, it is handed on no more."""
        if self.held:
            _HANDED_ON[self._key()] = self

    def _take_over(self) -> bool:
        """Take over the lock of this folder that this process handed on, if there is one."""
        passed = _HANDED_ON.pop(self._key(), None)
        if passed is None or not passed.held:
            return False
        self._fd, self._held, passed._fd, passed._held = passed._fd, passed._held, None, None
        return True

    def acquire(self) -> RunLock:
        if self.held or self._take_over():
            return self
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
        if _HANDED_ON.get(self._key()) is self:
            del _HANDED_ON[self._key()]
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
