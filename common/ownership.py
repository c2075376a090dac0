"""Who may delete what: a tool replaces or empties only what it created, and never what it reads.

Every command of this project that can replace or empty an existing output follows one rule:

- A folder is replaced (``python -m operators ... --overwrite``) or emptied (``train.py --overwrite``)
  only when it carries the marker file of the tool that created it: ``.growtrain-run`` for train.py's
  run folders (and ``--compare`` folders), ``.growtrain-output`` for checkpoint folders written by
  ``python -m operators`` and output folders of ``bench/``. A folder without the marker (a user's
  folder, a repository, a home directory, a run folder when the operators CLI is asked to replace it) is
  never deleted; the command stops with one line saying so.
- An output is never allowed to be, or to contain, one of the command's inputs (replacing it would delete
  what is being read).
- A results file (the eval CLIs' JSON) is overwritten only when it is a JSON object that this project
  wrote (its ``written_by`` field), never a file of the user's.

Markers are plain files, so a user who wants a tool to take over a folder can add one by hand.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["RUN", "OUTPUT", "WRITTEN_BY", "is_marked", "mark", "contains", "check_not_an_input",
           "check_folder_replaceable", "check_file_replaceable", "prepare_output_folder"]

RUN = ".growtrain-run"         # train.py run folders (and --compare folders)
OUTPUT = ".growtrain-output"   # folders written by python -m operators and by bench/ scripts
WRITTEN_BY = "written_by"      # key of results JSON files written by this project
_MARKER_TEXT = ("created by {tool}; {tool} may replace or empty this folder. Nothing of this project deletes a "
                "folder without this file.\n")


def is_marked(folder: str | os.PathLike, marker: str) -> bool:
    """True when ``folder`` carries ``marker`` (it was created by the tool that marker stands for)."""
    return (Path(folder) / marker).is_file()


def mark(folder: str | os.PathLike, marker: str, tool: str) -> None:
    """Write ``marker`` into ``folder`` (created if needed), naming ``tool``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / marker).write_text(_MARKER_TEXT.format(tool=tool))


def contains(outer: str | os.PathLike, inner: str | os.PathLike) -> bool:
    """True when ``inner`` is ``outer`` or lies inside it (symlinks resolved)."""
    a, b = Path(outer).resolve(), Path(inner).resolve()
    return a == b or a in b.parents


def check_not_an_input(out: str | os.PathLike, inputs: Iterable[str | os.PathLike], what: str = "OUT") -> None:
    """Refuse an output that is, or contains, one of the command's inputs.

    Raises:
        ValueError: naming the output and the input it would delete.
    """
    for src in inputs:
        if contains(out, src):
            same = Path(out).resolve() == Path(src).resolve()
            raise ValueError(f"{what} {out} {'is' if same else 'contains'} the input {src}: writing there would "
                             "delete what is being read; choose another output folder")


def check_folder_replaceable(path: str | os.PathLike, marker: str, tool: str, overwrite: bool) -> None:
    """Fail before any work unless ``tool`` may write a new folder at ``path``: it does not exist, is an
    empty folder, or (with ``overwrite``) carries ``marker``.

    Raises:
        FileExistsError: ``path`` is a file; or a non-empty folder without ``overwrite``; or a folder
            that ``tool`` did not create (no marker), which is never deleted, with or without overwrite.
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
    if not overwrite:
        raise FileExistsError(f"{path} already exists (written by {tool}): pass --overwrite to replace it")


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


def prepare_output_folder(path: str | os.PathLike, tool: str, writes: Iterable[str] = ()) -> Path:
    """Create (or reuse) an output folder that ``tool`` owns, before any work. A new or empty folder is
    marked; a marked folder is reused (its entries named in ``writes``, glob patterns, are replaced). An
    unmarked folder that holds only what ``tool`` writes (entries matching ``writes``, run folders of
    train.py) is taken over and marked: output folders written before markers existed stay usable.
    Anything else is refused.

    Raises:
        FileExistsError: ``path`` is a file, or a folder holding something ``tool`` did not write.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a folder: choose another --out")
    if path.is_dir() and not is_marked(path, OUTPUT):
        patterns = list(writes)
        foreign = sorted(p.name for p in path.iterdir()
                         if not any(fnmatch.fnmatch(p.name, w) for w in patterns) and not is_marked(p, RUN))
        if foreign:
            raise FileExistsError(f"{path} exists and was not created by {tool} (no {OUTPUT} marker; it holds "
                                  f"{foreign[0]!r}); nothing is written into a folder of yours: choose another "
                                  "--out, or remove it yourself")
    if not is_marked(path, OUTPUT):
        mark(path, OUTPUT, tool)
    return path
