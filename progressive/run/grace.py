"""The window a launcher gives a stop: how long after it forwards SIGTERM it kills its workers with SIGKILL.

torchrun's agent (also what ``accelerate launch`` runs for several processes) forwards the SIGTERM it gets to every
worker, waits ``shutdown_timeout`` seconds, then sends SIGKILL (torch 2.13: ``LocalElasticAgent._shutdown`` ->
``PContext.close(death_sig, timeout)``). The timeout is ``torchrun --shutdown_timeout N``, else its variable
``PET_SHUTDOWN_TIMEOUT``, else ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (``LaunchConfig`` reads it when no flag set it:
``accelerate launch``, which has no such flag, passes it on), else ``DEFAULT_S``, 30 s. A SLURM warning of 300 s
(``--signal=B:TERM@300``) reaches the workers through that agent, so the run has 30 s of it unless one of those
is raised. (With one process ``accelerate launch`` runs train.py as a plain child and forwards no signal at all:
the launcher dies and the run goes on; signal the worker or its process group.)

A stop takes at most ``train.stop_timeout`` to reach the step boundary, then a checkpoint write; both must fit in
the window. ``StopWindow`` says so in one line at the start when the bound alone does not fit, and once, after the
first checkpoint's write was timed, when the two together do not.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["DEFAULT_S", "launcher_window", "misfit", "StopWindow"]

DEFAULT_S = 30.0  # torchrun's shutdown_timeout when nothing sets it (tests/unit/run/test_stop_window.py: torch's)
_FLAGS = ("--shutdown_timeout", "--shutdown-timeout")
_VARIABLES = ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")  # in the order torchrun reads them


def _parent_command() -> list[str]:
    """The launcher's command line (this worker's parent: torchrun's agent, or accelerate launch holding it)."""
    try:
        return Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # not Linux, or not readable: the environment and the default decide
        return []


def _flag(args: Sequence[str]) -> float | None:
    for i, a in enumerate(args):
        name, eq, value = a.partition("=")
        if name in _FLAGS:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                return float(value)
            except ValueError:
                return None
    return None


def launcher_window(env: Mapping[str, str] | None = None,
                    command: Sequence[str] | None = None) -> tuple[float, str] | None:
    """(seconds between the launcher's SIGTERM to this worker and its SIGKILL, what set them) under torchrun's agent
    (``TORCHELASTIC_RUN_ID`` in the environment: torchrun, ``accelerate launch`` of several processes), else None
    (no launcher, or one whose window is not known here: SLURM's ``KillWait``, a single-process accelerate launch).

    Args:
        env: the environment (default ``os.environ``).
        command: the launcher's command line (default: this process's parent's, from /proc).
    """
    env = os.environ if env is None else env
    if not env.get("TORCHELASTIC_RUN_ID"):
        return None
    flag = _flag(_parent_command() if command is None else command)
    if flag is not None:
        return flag, "torchrun --shutdown_timeout"
    for name in _VARIABLES:
        try:
            return float(env[name]), name
        except (KeyError, ValueError):
            continue
    return DEFAULT_S, "torchrun's default shutdown_timeout"


def misfit(stop_timeout: float, window: tuple[float, str] | None, write_s: float | None = None) -> str | None:
    """The warning when a stop may not fit in the launcher's ``window`` (``launcher_window``): the bounded wait for
    the step boundary (``train.stop_timeout``; 0 waits however long) plus, when known, a checkpoint's write time.
    None when it fits or no window is known."""
    if window is None:
        return None
    seconds, source = window
    need = float("inf") if stop_timeout <= 0 else stop_timeout + (write_s or 0.0)
    if need < seconds:
        return None
    written = f" plus a checkpoint write ({write_s:.1f} s)" if write_s else ""
    what = ("train.stop_timeout 0 (a stop waits for the step however long)" if stop_timeout <= 0 else
            f"train.stop_timeout ({stop_timeout:g} s){written}")
    return (f"warning: {what} does not fit in the {seconds:g} s between the launcher's SIGTERM and its SIGKILL "
            f"({source}): a stop may be killed before its checkpoint is written; widen the window (torchrun "
            "--shutdown_timeout N, or TORCH_ELASTIC_SHUTDOWN_TIMEOUT=N for accelerate launch) or lower "
            "train.stop_timeout")


class StopWindow:
    """Says, once each, when a stop does not fit in the launcher's window: at the start (``train.stop_timeout``
    alone), and after the first checkpoint write (``wrote``: with its measured seconds).

    Args:
        stop_timeout: ``train.stop_timeout``.
        say: prints a line (the main process's; None: say nothing, the other processes).
        window: the launcher's (default: ``launcher_window()``).
    """

    def __init__(self, stop_timeout: float, say: Callable[[str], None] | None,
                 window: tuple[float, str] | None = None):
        self.stop_timeout = stop_timeout
        self.say = say
        self.window = launcher_window() if window is None and say is not None else window
        self.warned = False  # a warning was printed: one is enough
        self.timed = False   # a checkpoint write was timed

    def start(self) -> None:
        """At the start of a run: a bound that alone does not fit."""
        self._tell(misfit(self.stop_timeout, self.window))

    def wrote(self, seconds: float) -> None:
        """After a checkpoint write of ``seconds`` (the first one counts)."""
        if not self.timed:
            self.timed = True
            self._tell(misfit(self.stop_timeout, self.window, seconds))

    def _tell(self, line: str | None) -> None:
        if line and self.say is not None and not self.warned:
            self.warned = True
            self.say(line)
