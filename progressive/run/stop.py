"""Signals save the work: SIGINT (Ctrl-C) and SIGTERM end a run at the next step boundary with a checkpoint.

One ``StopOnSignal`` handles SIGINT and SIGTERM for the whole command (``stopping``): from the moment a run
starts loading until its last file is written, for every method of a comparison and the pause between them:

- The first signal only sets a flag and prints one line. The trainer checks the flag after every step, and
  before the first one (all processes agree through one all-reduce, so every rank stops at the same step),
  writes a checkpoint, prints the command that resumes, and raises ``Stopped``: exit code 75 (EX_TEMPFAIL,
  "try again": the run is resumable). A comparison checks it between two methods too (the next one does not
  start), and a signal that comes after training, while the final outputs are written, lets them finish and
  still ends the command with 75 and the command that resumes (which then finds the work done).
- The wait is bounded: if no step boundary is reached within ``timeout`` seconds (``train.stop_timeout``),
  the run stops at once, as on a second signal.
- A second signal stops at once (``KeyboardInterrupt`` in the main thread; the trainer raises
  ``Interrupted``: exit code 128 + the signal, 130 for Ctrl-C, 143 for SIGTERM). Nothing is corrupted:
  every file of a run is written to a temporary name and renamed (common/io.py), a torn metrics line is
  skipped, and ``--resume`` continues from the last complete checkpoint.
- A signal repeated within ``DUPLICATE_S`` seconds of the first counts as the same request, until the
  process exits: launchers forward the terminal's signal to their workers (torchrun sends the SIGINT or
  SIGTERM it received), so a worker sees one Ctrl-C twice, and schedulers repeat a SIGTERM. In the process
  of a command (``ignore_repeats_at_exit``), the handler gives way to ignoring both signals once the command
  has stopped, so a repeat that comes while the process exits cannot turn exit 75 into death by the signal.

Launchers give a limited grace period before SIGKILL (torchrun: 30 s, ``--shutdown_timeout``; SLURM:
``KillWait``, or ``--signal=B:TERM@<seconds>`` to be warned earlier), which must cover the step that is
running plus one checkpoint write.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["StopOnSignal", "Stopped", "Interrupted", "STOPPED_EXIT", "DUPLICATE_S", "stopping",
           "ignore_repeats_at_exit"]

STOPPED_EXIT = 75      # EX_TEMPFAIL: stopped by a signal after writing a checkpoint; resumable
DUPLICATE_S = 2.0      # a repeat within this many seconds is the same request (forwarded by a launcher)
SIGNALS = (signal.SIGINT, signal.SIGTERM)
_ACTIVE: list[StopOnSignal] = []  # the command's handler while it is installed
_AT_EXIT: list[bool] = []         # this process is a command's: once it has stopped, repeats are ignored


class Stopped(RuntimeError):
    """The run stopped at a step boundary on a signal, after writing a checkpoint (exit code 75)."""

    exit_code = STOPPED_EXIT


class Interrupted(RuntimeError):
    """The run stopped at once (a second signal, or no step boundary within the bounded wait); the last
    complete checkpoint stays as it was. ``exit_code``: 128 + the signal number."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class StopOnSignal:
    """Context manager: while active, SIGINT/SIGTERM request a stop at the next step boundary (see the
    module docstring). Installs nothing outside the main thread (signal handlers cannot be set there).

    Args:
        timeout: seconds to wait for a step boundary after the first signal; then stop at once.
        say: prints one line (the main process's console; other ranks stay quiet).
    """

    def __init__(self, timeout: float, say=None):
        self.timeout = float(timeout)
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.signum: int | None = None       # the first signal received
        self.hard: int | None = None         # the signal that stopped the run at once
        self.expired = False                 # ... because no step boundary came within the timeout
        self._first_at = 0.0
        self._old: dict[int, object] = {}
        self._timer: threading.Timer | None = None
        self._depth = 0                      # entered this many times (the command's, then a run's)

    @staticmethod
    def active() -> StopOnSignal | None:
        """The handler installed for this command (``stopping``), if any."""
        return _ACTIVE[-1] if _ACTIVE else None

    # -------------------------------------------------------------------------------- the handlers

    def __enter__(self) -> StopOnSignal:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return  # a run inside the command: the command's handler stays
        self.disarm()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for s, old in self._old.items():
            # in a command's process, a repeat that comes while it exits is the same request: ignored
            signal.signal(s, signal.SIG_IGN if _AT_EXIT and self.signum is not None else old)
        self._old.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.expired:  # delivered by _expire: the bounded wait ran out
            raise KeyboardInterrupt
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._first_at = signum, now
            self.say(f"\nreceived {signal.Signals(signum).name}: stopping at the end of this step with a checkpoint "
                     f"(waiting at most {self.timeout:g} s; press Ctrl-C again to stop at once)")
            if self.timeout > 0:
                self._timer = threading.Timer(self.timeout, self._expire)
                self._timer.daemon = True
                self._timer.start()
            return
        if self.hard is None and now - self._first_at < DUPLICATE_S:
            return  # the same request, forwarded by a launcher
        self._stop_at_once(signum)

    def _expire(self) -> None:
        if self.hard is None and self._timer is not None:
            self.hard, self.expired = self.signum, True
            # a real signal to the main thread: it also wakes a blocking call (sleep, I/O); the handler
            # above then raises KeyboardInterrupt there
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def _stop_at_once(self, signum: int) -> None:
        self.hard = signum
        self.disarm()
        raise KeyboardInterrupt

    # ------------------------------------------------------------------------------------ queries

    def disarm(self) -> None:
        """Cancel the bounded wait (the step boundary was reached; the checkpoint is being written)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def requested(self, device=None) -> bool:
        """Whether a stop was requested on any process (one all-reduce when torch.distributed runs more than
        one process; ``device``: where the collective's tensor lives, the accelerator's device)."""
        import torch
        import torch.distributed as dist

        flag = self.signum is not None
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor([float(flag)], device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flag = bool(t.item() > 0)
        return flag

    @property
    def name(self) -> str:
        """The signal's name ("SIGINT"), or "a signal on another process"."""
        return signal.Signals(self.signum).name if self.signum is not None else "a signal on another process"


def ignore_repeats_at_exit() -> None:
    """Called once by a command's entry point (its own process): when the command stops on a signal, SIGINT and
    SIGTERM are ignored from then until the process exits (in-process callers, such as tests, get their
    handlers back instead)."""
    _AT_EXIT[:] = [True]


@contextlib.contextmanager
def stopping(timeout: float, resume: str, what: str, say: Callable[[str], None] | None = None,
             main: bool = True) -> Iterator[StopOnSignal]:
    """The command's one stop handler, from here to the end of the block (see the module docstring): a new
    ``StopOnSignal``, or the command's own when one is already installed (a run of a comparison).

    Args:
        timeout: ``train.stop_timeout``.
        resume: the command that resumes the work.
        what: the work, for the messages ("the run gpt2-vcycle", "the comparison cmp").
        say: prints the first signal's line (the main process's console).
        main: whether this is the main process (the others leave the messages to it).

    Raises:
        Stopped: the block ended normally but a signal came while it ran (its outputs are complete).
        Interrupted: a second signal, or the bounded wait, stopped the block at once outside a training step.
    """
    outer = StopOnSignal.active()
    if outer is not None:
        yield outer
        return
    stop = StopOnSignal(timeout, say=say)
    try:
        with stop:
            yield stop
    except KeyboardInterrupt:
        if stop.hard is None:
            raise
        why = (f"no step boundary within {stop.timeout:g} s of {stop.name}" if stop.expired else
               f"a second {signal.Signals(stop.hard).name}")
        raise Interrupted(f"stopped at once on {why}, outside a training step; nothing is lost that a checkpoint "
                          f"held\nresume with: {resume}" if main else "", stop.hard) from None
    if stop.signum is not None:
        raise Stopped(f"stopped by {stop.name} after {what} had finished: its outputs are complete\nresume with: "
                      f"{resume}" if main else "")
