"""How every command-line entry point ends: a result, or one line saying what went wrong (no traceback).

``run_cli(main, argv)`` runs ``main(argv)`` and turns what a user can fix into ``error: <message>`` on
stderr with exit code 2: bad values and missing or existing paths (ValueError, which includes the
config, operator and checkpoint errors, FileNotFoundError, FileExistsError), and the file system's
refusals a user can fix, named as such with the path (``describe_os_error``: a full disk, a read-only or
permission-denied location, a name too long, a symbolic-link loop, a file where a folder is expected or
the reverse, a file too large, too many open files). ``--debug`` anywhere on the command line shows the
traceback instead. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_cli", "describe_os_error", "shown_path", "check_flags", "comma_list", "list_of", "DEBUG_HELP"]

DEBUG_HELP = "--debug: show the full traceback of an error instead of one line"

_USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)
_DISK_FULL = ("No space left on device", "os error 28", "StorageFull")
_READ_ONLY = ("Read-only file system", "os error 30", "ReadOnlyFilesystem")


def check_flags(values: dict[str, Any], at_least_one: Sequence[str] = (), not_negative: Sequence[str] = (),
                fractions: Sequence[str] = (), seeds: Sequence[str] = ()) -> None:
    """Refuse numeric flags that cannot work, naming the flag, before any work: ``values`` maps a flag name
    ("--batch_size") to its value (None: unset, skipped; a tuple: each item is checked). Sizes and counts
    (``at_least_one``) are >= 1; ``not_negative`` >= 0; ``fractions`` in [0, 1]; ``seeds`` in 0 .. 2**32 - 1.

    Raises:
        ValueError: the first flag out of range.
    """

    rules = [(at_least_one, lambda v: v >= 1, ">= 1"), (not_negative, lambda v: v >= 0, ">= 0"),
             (fractions, lambda v: 0 <= v <= 1, "in [0, 1]"),
             (seeds, lambda v: 0 <= v < 2**32, "a seed in 0 .. 2**32 - 1")]
    for names, ok, text in rules:
        for name in names:
            value = values.get(name)
            for v in value if isinstance(value, tuple | list) else () if value is None else (value,):
                if not (isinstance(v, int | float) and math.isfinite(v) and ok(v)):
                    raise ValueError(f"{name} must be {text}, got {v}")


def comma_list(flag: str, value: str, kind: Callable[[str], Any] = str) -> list[Any]:
    """The items of a comma-list flag (``--only a,b``), each converted by ``kind`` (str, int or float). An empty
    list is refused: a script's empty variable (``--only "$X"``) must not read as "not given" and run everything,
    or nothing.

    Raises:
        ValueError: naming the flag, for an empty list or an item ``kind`` refuses.
    """
    try:
        return _items(value, kind)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None


def list_of(kind: Callable[[str], Any] = str) -> Callable[[str], list[Any]]:
    """``comma_list`` as an argparse ``type=`` (argparse names the flag in its error)."""

    def parse(value: str) -> list[Any]:
        try:
            return _items(value, kind)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _items(value: str, kind: Callable[[str], Any]) -> list[Any]:
    items = [x.strip() for x in value.split(",") if x.strip()]
    if not items:
        raise ValueError(f"give a comma list, got {value!r}")
    out = []
    for x in items:
        try:
            out.append(kind(x))
        except ValueError:
            raise ValueError(f"{x!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


# the file system's refusals a user can fix, by errno: what to say after the path (bugs, such as EBADF, are not here)
_FIXABLE = {
    errno.ENAMETOOLONG: "a name in this path is too long for the file system (at most 255 bytes a name, 4,096 the "
                        "whole path); choose a shorter one",
    errno.ELOOP: "symbolic links lead back to themselves here (a link loop); fix or remove the link",
    errno.ENOTDIR: "part of this path is a file, not a folder; choose another path",
    errno.EISDIR: "a folder, where a file is expected; name a file",
    errno.EFBIG: "too large a file for this file system; write elsewhere",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or run fewer processes at once",
    errno.ENFILE: "too many open files on this machine: close some programs, or run fewer processes at once",
}
# pathlib's resolve() reports a link loop as a RuntimeError before Python 3.13 (an OSError, ELOOP, from 3.13)
_LINK_LOOP = re.compile(r"^Symlink loop from '(.*)'$", re.DOTALL)


def shown_path(path: Any, most: int = 120) -> str:
    """``path`` for a message: whole, or past ``most`` characters its start and end with its length (a 5,000
    character path is named, not pasted)."""
    text = os.fsdecode(path) if isinstance(path, bytes | os.PathLike) else str(path)
    return text if len(text) <= most else f"{text[:60]}...{text[-40:]} ({len(text):,} characters)"


def describe_os_error(e: BaseException) -> str | None:
    """One line for an OS error a user can fix: a full disk, a read-only or permission-denied location (also when a
    library wrapped the OS error in its own exception, as safetensors and torch do), a name too long, a link loop, a
    file where a folder is expected or the reverse, a file too large, too many open files; the path first where the
    error names one (two for a rename). None for anything else, which keeps its traceback.

    Args:
        e: the exception a command raised.

    Returns:
        the line to print after "error: ", or None.
    """
    code = getattr(e, "errno", None)
    text = str(e)
    where = getattr(e, "filename", None)
    loop = _LINK_LOOP.match(text) if isinstance(e, RuntimeError) else None
    if loop:
        code, where = errno.ELOOP, loop.group(1)
    at = f" ({shown_path(where)})" if where else ""
    if code in (errno.ENOSPC, errno.EDQUOT) or any(s in text for s in _DISK_FULL):
        return f"disk full while writing{at}: free some space or write elsewhere (--output_dir); {text}"
    if code == errno.EROFS or any(s in text for s in _READ_ONLY):
        return f"cannot write{at}: the location is on a read-only file system; choose another output folder"
    if code in (errno.EACCES, errno.EPERM):
        return f"permission denied{at}: this user cannot write there; choose another output folder"
    if code in _FIXABLE and isinstance(e, OSError | RuntimeError):
        other = getattr(e, "filename2", None)
        path = f"{shown_path(where)}{f' -> {shown_path(other)}' if other else ''}: " if where else ""
        return f"{path}{_FIXABLE[code]}"
    return None


def program(script: str = "train.py", console: str = "growtrain-train") -> str:
    """How to name this command in a message that tells the user what to run next: ``python train.py`` from a
    clone, ``growtrain-train`` when installed (there is no train.py there)."""
    started = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return console if started == console else f"python {script}"


def _stdout_gone() -> None:
    """The reader of stdout went away (``... --help | head -3``): send the rest nowhere, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def leave_if_distributed(code: int) -> None:
    """In one of several processes (torchrun), end the process here, skipping destructors.

    Dropping a DDP-wrapped model at exit destroys its gloo process group, whose destructor joins gloo's worker
    thread while the main thread holds the GIL; a worker still finishing a barrier's work needs the GIL to free
    it: both wait forever (seen under load, a rank alive 48 minutes later). A CLI that has returned has written
    and flushed everything (files atomically, trackers ended), so the process ends without tearing down.
    """
    if "torch.distributed" not in sys.modules:  # never imported (--help, --list): no process group to skip
        return
    try:
        import torch.distributed as dist

        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:  # noqa: BLE001  (no torch, or a broken group: nothing to skip)
        several = False
    if several:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def run_cli(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None,
            exit_codes: dict[type[BaseException] | str, int] | None = None) -> int:
    """Run ``main(argv)`` and return a process exit code (0, or ``main``'s int result).

    Args:
        main: the CLI's body; raises on failure.
        argv: arguments (default: sys.argv[1:]); ``--debug`` is removed from them and re-raises errors.
        exit_codes: extra exception types that are expected outcomes, with their exit codes (their
            message is printed as one line), e.g. {NonFiniteLoss: 1}; an exception's own ``exit_code``
            attribute wins (progressive.run.stop: 75 after a checkpoint on a signal, 128 + signal when stopped
            at once), and its message is printed without "error:". A type may be named "module:Class": it is
            looked up only in the modules already imported (an exception of a module never loaded cannot have
            been raised), so a CLI's quick paths (--help) need not import what its long ones raise.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    code = _outcome(main, [a for a in args if a != "--debug"], debug, exit_codes or {})
    leave_if_distributed(code)
    return code


def _outcome(main: Callable[[list[str]], Any], args: list[str], debug: bool,
             exit_codes: dict[type[BaseException] | str, int]) -> int:
    """``main(args)``'s exit code, its expected failures reported in one line (see run_cli)."""
    try:
        result = main(args)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()
        return 0
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        for kind, code in exit_codes.items():
            if isinstance(kind, str):
                module, _, name = kind.partition(":")
                kind = getattr(sys.modules.get(module), name, None)
            if kind is not None and isinstance(e, kind):
                # an outcome with its own exit code (a stop on a signal) is reported, not an error
                code = getattr(e, "exit_code", code)
                text = str(e) if code == 0 or hasattr(e, "exit_code") else f"error: {e}"
                if str(e):  # other processes of a multi-process run leave the report to the main one
                    print(text, file=sys.stderr)
                return code
        os_problem = describe_os_error(e)
        if os_problem is not None:
            print(f"error: {os_problem}", file=sys.stderr)
            return 2
        if isinstance(e, _USER_ERRORS):
            if str(e):  # empty: another process of a multi-process run, whose main process said why
                print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return result if isinstance(result, int) else 0
