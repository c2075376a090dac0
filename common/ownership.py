"""Who may delete what: a tool replaces or empties only what it made, and never what it reads.

Every command of this project that can replace or empty an existing output follows one rule:

- A folder is replaced (``python -m operators ... --overwrite``) or emptied (``train.py --overwrite``)
  only when it carries the marker file of the tool that created it: ``.growtrain-run`` for train.py's
  run folders (and ``--compare`` folders), ``.growtrain-output`` for checkpoint folders written by
  ``python -m operators`` and output folders of ``bench/``. A folder without the marker (a user's
  folder, a repository, a home directory, a run folder when the operators CLI is asked to replace it) is
  never deleted; the command stops with one line saying so.
- The marker is also the record of what the tool made there: its first line names the tool, and one
  ``made: NAME`` line per top-level entry the tool itself created, appended (and fsynced) as it creates it
  (``record_made``), never taken from a listing of the folder. Only recorded names are deleted: a folder
  holding anything else (a user's file, an entry with one of the tool's own names that the record does not
  list) or holding no record at all is refused, in one line naming the entry.
- At every depth: a folder a tool writes whole also has its files on the record (``made: final/config.json``),
  taken from the temporary folder the tool wrote them into, before it is renamed into place; inside it only
  those files are deleted (``remove_listed``), and anything else there (``unlisted``) is refused the same way.
- An output is never allowed to be, or to contain, one of the command's inputs (replacing it would delete
  what is being read).
- A results file (the eval CLIs' JSON) is overwritten only when it is a JSON object that this project
  wrote (its ``written_by`` field), never a file of the user's.

Markers are plain files, so a user who wants a tool to take over a folder can add one by hand (with a
``made:`` line for each entry the tool may delete).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from common.io import atomic_write_text

__all__ = ["RUN", "OUTPUT", "WRITTEN_BY", "MADE", "Marker", "is_marked", "mark", "read_marker", "marked_by", "made",
           "made_inside", "record_made", "claim", "is_leftover_of", "unrecorded", "files_under", "unlisted",
           "remove_listed", "refusal", "contains", "check_not_an_input", "check_folder_replaceable",
           "check_file_replaceable", "prepare_output_folder"]

RUN = ".growtrain-run"         # train.py run folders (and --compare folders)
OUTPUT = ".growtrain-output"   # folders written by python -m operators and by bench/ scripts
WRITTEN_BY = "written_by"      # key of results JSON files written by this project
MADE = "made: "                # a marker line naming one entry the tool itself created ("final", "final/config.json")
_MARKER_TEXT = ("created by {tool}; {tool} may replace or empty this folder. Nothing of this project deletes a "
                "folder without this file.\n")
# what an interrupted atomic write (common/io.py) leaves beside NAME: a temporary sibling ``.NAME.<tempfile's
# random characters>.tmp``, or the replaced entry ``.NAME.old``
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:[a-z0-9_]+\.tmp|old)$")


def is_marked(folder: str | os.PathLike, marker: str) -> bool:
    """True when ``folder`` carries ``marker`` (it was created by the tool that marker stands for), as a file of
    its own (a link planted under the marker's name does not count)."""
    path = Path(folder) / marker
    return path.is_file() and not path.is_symlink()


def mark(folder: str | os.PathLike, marker: str, tool: str, made: Iterable[str] = ()) -> None:
    """Write ``marker`` into ``folder`` (created if needed), naming ``tool``, with a record of the entries in
    ``made`` (a new record: any earlier one is replaced; written to a temporary file and renamed)."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / marker, _MARKER_TEXT.format(tool=tool) + "".join(f"{MADE}{n}\n" for n in made))


def _lines(folder: str | os.PathLike, marker: str) -> list[str]:
    try:
        return (Path(folder) / marker).read_text(errors="replace").splitlines()
    except OSError:
        return []


@dataclass(frozen=True)
class Marker:
    """A folder's marker as one read of it found it: ``by``, the tool it names ("train.py", "python -m operators"; a
    marker written by hand: its first line), and ``made``, the names its record lists (empty without a record)."""

    by: str
    made: frozenset[str]


def read_marker(folder: str | os.PathLike, marker: str) -> Marker | None:
    """``folder``'s ``marker``, read once; None when there is none (or a link stands under its name)."""
    if not is_marked(folder, marker):
        return None
    lines = _lines(folder, marker)
    first = next(iter(lines), "").strip()
    by = first[len("created by "):].split(";", 1)[0].strip() if first.startswith("created by ") else first
    return Marker(by, frozenset(ln[len(MADE):] for ln in lines if ln.startswith(MADE)))


def marked_by(folder: str | os.PathLike, marker: str) -> str | None:
    """The tool ``folder``'s marker names (``Marker.by``), or None when there is no marker."""
    found = read_marker(folder, marker)
    return None if found is None else found.by


def made(folder: str | os.PathLike, marker: str) -> set[str]:
    """The names ``folder``'s marker records as made by its tool (empty without a record)."""
    found = read_marker(folder, marker)
    return set() if found is None else set(found.made)


def made_inside(folder: str | os.PathLike, marker: str, name: str) -> set[str]:
    """The files inside the entry ``name`` of ``folder`` that its record lists, as paths relative to that entry
    ("config.json" for ``made: final/config.json``); empty when it lists none."""
    prefix = f"{name}/"
    return {m[len(prefix):] for m in made(folder, marker) if m.startswith(prefix)}


def record_made(folder: str | os.PathLike, marker: str, name: str) -> None:
    """Append ``name`` (one top-level entry of ``folder``, or a file inside one: "final/config.json") to the
    record in its marker, and fsync it: one ``write`` of one short line to a file opened for appending, so a
    crash leaves the line whole or absent.

    Raises:
        ValueError: ``name`` is not a path of entries inside ``folder``.
        OSError: the marker is missing or is a link (it is never written through).
    """
    if not name or "\n" in name or any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"{name!r} is not the name of an entry of {folder}")
    fd = os.open(Path(folder) / marker, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        os.write(fd, f"{MADE}{name}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def claim(folder: str | os.PathLike, marker: str, name: str) -> bool:
    """Called by a tool just before it creates ``folder/name``: record the name as made by the tool when nothing
    is there yet. Returns whether the name is on the record (now or already); False when an entry of that name
    is there and not on the record (someone else made it: it stays theirs)."""
    if name in made(folder, marker):
        return True
    path = Path(folder) / name
    if path.exists() or path.is_symlink():
        return False
    record_made(folder, marker, name)
    return True


def is_leftover_of(entry: str, names: Iterable[str]) -> bool:
    """Whether ``entry`` is what an interrupted atomic write (common/io.py) of one of ``names`` leaves behind:
    ``.NAME.<random characters>.tmp`` or ``.NAME.old``."""
    found = _LEFTOVER.match(entry)
    return found is not None and found["name"] in set(names)


def unrecorded(folder: str | os.PathLike, marker: str, keep: Iterable[str] = ()) -> list[str]:
    """The top-level entries of ``folder`` that its tool did not make, sorted: all but the marker, the names in
    ``keep``, the names on the record and the leftovers of interrupted atomic writes of those (or of the
    marker)."""
    own = made(folder, marker) | {marker}
    return sorted(p.name for p in Path(folder).iterdir()
                  if p.name not in own and p.name not in set(keep) and not is_leftover_of(p.name, own))


def files_under(folder: str | os.PathLike) -> list[str]:
    """Every file (or link) below ``folder``, as sorted paths relative to it, never through a link."""
    found = []
    for top, dirs, files in os.walk(folder):  # os.walk does not descend into a linked folder
        rel = Path(top).relative_to(folder)
        found += [(rel / n).as_posix() for n in files]
        found += [(rel / n).as_posix() for n in dirs if (Path(top) / n).is_symlink()]
    return sorted(found)


def _ancestors(files: Iterable[str]) -> set[str]:
    """The folders on the way to each of ``files`` (relative paths): "a" and "a/b" for "a/b/c"."""
    return {"/".join(parts[:i]) for f in files for parts in [f.split("/")] for i in range(1, len(parts))}


def unlisted(folder: str | os.PathLike, files: Iterable[str]) -> list[str]:
    """What ``folder`` holds besides ``files`` (paths relative to it) and the folders on their way, as sorted
    paths relative to it: a folder none of ``files`` lies in is named itself, not its contents. Links are
    entries of their own (never followed).
    """
    files = set(files)
    ways, found = _ancestors(files), []
    for top, dirs, names in os.walk(folder):
        rel = Path(top).relative_to(folder)
        for d in list(dirs):
            path = (rel / d).as_posix()
            linked = (Path(top) / d).is_symlink()
            if (linked and path not in files) or (not linked and path not in ways):
                found.append(path)
            if linked or path not in ways:
                dirs.remove(d)  # not walked into: named whole, or a link
        found += [(rel / n).as_posix() for n in names if (rel / n).as_posix() not in files]
    return sorted(found)


def remove_listed(folder: str | os.PathLike, files: Iterable[str]) -> bool:
    """Delete the listed ``files`` of ``folder`` (paths relative to it; a link: only the link), then the folders
    on their way that this leaves empty, and ``folder`` itself if it is then empty. Anything else stays, with
    the folders that hold it. Returns whether ``folder`` is gone."""
    files = set(files)
    ways = _ancestors(files)
    for top, dirs, names in os.walk(folder, topdown=False):
        rel = Path(top).relative_to(folder)
        for n in names + [d for d in dirs if (Path(top) / d).is_symlink()]:
            if (rel / n).as_posix() in files:
                (Path(top) / n).unlink(missing_ok=True)
        for d in dirs:
            if (rel / d).as_posix() in ways and not (Path(top) / d).is_symlink():
                _rmdir_if_empty(Path(top) / d)
    return _rmdir_if_empty(Path(folder))


def _rmdir_if_empty(path: Path) -> bool:
    try:
        path.rmdir()
    except OSError:  # not empty: something that is not on the list is in it
        return False
    return True


def refusal(folder: str | os.PathLike, marker: str, tool: str, foreign: list[str],
            instead: str = "choose another output") -> str:
    """The one line that refuses to delete ``folder`` because it holds ``foreign`` (its first entries named);
    ``instead``: what the user can do rather than delete it."""
    folder = Path(folder)
    if not made(folder, marker):
        return (f"{folder} holds {folder / foreign[0]} and no record of what {tool} made there ({marker} lists "
                f"nothing: written by an earlier version, or by hand); it is never deleted: remove it yourself, or "
                f"{instead}")
    more = f" (and {len(foreign) - 1} more: {', '.join(foreign[1:4])}{', ...' if len(foreign) > 4 else ''})" \
        if len(foreign) > 1 else ""
    return (f"{folder / foreign[0]}{more} was not made by {tool} (the record in {folder / marker} does not list "
            f"it); --overwrite deletes only what {tool} made: move it out first, or {instead}")


def contains(outer: str | os.PathLike, inner: str | os.PathLike) -> bool:
    """True when ``inner`` is ``outer`` or lies inside it (symlinks resolved)."""
    a, b = Path(outer).resolve(), Path(inner).resolve()
    return a == b or a in b.parents


def check_not_an_input(out: str | os.PathLike, inputs: Iterable[str | os.PathLike], what: str = "OUT") -> None:
    """Refuse an output that is, or contains, one of the command's inputs.

    Raises:
        ValueError: naming the output and the input it would delete (or an empty output: the working folder).
    """
    if not str(out).strip():
        raise ValueError(f"{what}: empty; give an output folder ('.' names the working folder)")
    for src in inputs:
        if contains(out, src):
            same = Path(out).resolve() == Path(src).resolve()
            raise ValueError(f"{what} {out} {'is' if same else 'contains'} the input {src}: writing there would "
                             "delete what is being read; choose another output folder")


def check_folder_replaceable(path: str | os.PathLike, marker: str, tool: str, overwrite: bool) -> None:
    """Fail before any work unless ``tool`` may write a new folder at ``path``: it does not exist, is an
    empty folder, or (with ``overwrite``) carries ``marker`` naming ``tool`` and holds only what its record
    lists.

    Raises:
        FileExistsError: ``path`` is a file; or a non-empty folder without ``overwrite``; or a folder that
            ``tool`` did not create (no marker, or another tool's), or that holds something ``tool`` did not
            make, or no record of what it made: never deleted, with or without overwrite.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder; it is never replaced: choose another output")
    if not any(path.iterdir()):
        return
    if not is_marked(path, marker):
        raise FileExistsError(f"{path} exists and was not created by {tool} (no {marker} marker); it is never "
                              "deleted: choose another output, or remove it yourself")
    by = marked_by(path, marker)
    if by != tool:
        raise FileExistsError(f"{path} was created by {by}, not by {tool}; {tool} never replaces it: choose another "
                              "output")
    if not overwrite:
        raise FileExistsError(f"{path} already exists (written by {tool}): pass --overwrite to replace it")
    foreign = unrecorded(path, marker)
    if foreign:
        raise FileExistsError(refusal(path, marker, tool, foreign))


def check_file_replaceable(path: str | os.PathLike, tool: str) -> None:
    """Fail unless a results JSON may be written at ``path``: it does not exist, or it is a JSON object
    this project wrote (its ``written_by`` field).

    Raises:
        FileExistsError: ``path`` is a folder, or a file this project did not write.
    """
    path = Path(path)
    if not path.exists():
        return
    if path.is_dir():
        raise FileExistsError(f"{path} is a folder; --output names the results file")
    try:
        ours = str(json.loads(path.read_text()).get(WRITTEN_BY, "")).startswith("growtrain")
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise FileExistsError(f"{path} exists and was not written by {tool} (no {WRITTEN_BY!r} field); it is never "
                              "overwritten: choose another --output, or remove it yourself")


def prepare_output_folder(path: str | os.PathLike, tool: str, writes: Iterable[str]) -> Path:
    """Create (or reuse) an output folder that ``tool`` owns, before any work. A new or empty folder is
    marked; a folder ``tool`` marked is reused (its entries named in ``writes``, glob patterns, are replaced).
    An unmarked folder that holds only what ``tool`` writes (entries matching ``writes``, run folders of
    train.py) is taken over and marked: output folders written before markers existed stay usable. Anything else
    is refused: a folder
    another tool marked, or one holding anything else.

    Args:
        writes: the entries ``tool`` writes, by name or pattern (``frontier.csv``, a run's hash); never a
            pattern that matches any name (which would make any folder look like ``tool``'s).

    Raises:
        ValueError: a pattern in ``writes`` matches any name.
        FileExistsError: ``path`` is a file, or a folder that is not ``tool``'s (see above).
    """
    path, patterns = Path(path), list(writes)
    wild = [w for w in patterns if not w.strip("*?")]
    if wild:
        raise ValueError(f"{tool}: the pattern {wild[0]!r} matches any name; an output folder names what it writes")
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder: choose another --out")
    if path.is_dir() and is_marked(path, OUTPUT) and marked_by(path, OUTPUT) != tool:
        raise FileExistsError(f"{path} was created by {marked_by(path, OUTPUT)}, not by {tool}; nothing is written "
                              "into another tool's folder: choose another --out")
    if path.is_dir() and not is_marked(path, OUTPUT):
        foreign = sorted(p.name for p in path.iterdir()
                         if not any(fnmatch.fnmatch(p.name, w) for w in patterns) and not is_marked(p, RUN))
        if foreign:
            raise FileExistsError(f"{path} exists and was not created by {tool} (no {OUTPUT} marker; it holds "
                                  f"{foreign[0]!r}); nothing is written into a folder of yours: choose another "
                                  "--out, or remove it yourself")
    if not is_marked(path, OUTPUT):
        mark(path, OUTPUT, tool)
    return path
