"""Signals save the work: SIGINT (Ctrl-C) and SIGTERM end a run at the next step boundary with a checkpoint.

While a run trains, ``StopOnSignal`` replaces the handlers of SIGINT and SIGTERM:

- The first signal only sets a flag and prints one line. The trainer checks the flag after every step
  (all processes agree through one all-reduce, so every rank stops at the same step), writes a
  checkpoint, prints the command that resumes, and raises ``Stopped``: exit code 75 (EX_TEMPFAIL,
  "try again": the run is resumable).
- The wait is bounded: if no step boundary is reached within ``timeout`` seconds (``train.stop_timeout``),
  the run stops at once, as on a second signal.
- A second signal stops at once (``KeyboardInterrupt`` in the main thread; the trainer raises
  ``Interrupted``: exit code 128 + the signal, 130 for Ctrl-C, 143 for SIGTERM). Nothing is corrupted:
  every file of a run is written to a temporary name and renamed (common/io.py), a torn metrics line is
  skipped, and ``--resume`` continues from the last complete checkpoint.
- A signal repeated within ``DUPLICATE_S`` seconds of the first counts as the same request: launchers
  forward the terminal's signal to their workers (torchrun sends the SIGINT or SIGTERM it received), so a
  worker sees one Ctrl-C twice.

Launchers give a limited grace period before SIGKILL (torchrun: 30 s, ``--shutdown_timeout``; SLURM:
``KillWait``, or ``--signal=B:TERM@<seconds>`` to be warned earlier), which must cover the step that is
running plus one checkpoint write.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType

__all__ = ["StopOnSignal", "Stopped", "Interrupted", "STOPPED_EXIT", "DUPLICATE_S"]

STOPPED_EXIT = 75      # EX_TEMPFAIL: stopped by a signal after writing a checkpoint; resumable
DUPLICATE_S = 2.0      # a repeat within this many seconds is the same request (forwarded by a launcher)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


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

    # -------------------------------------------------------------------------------- the handlers

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.disarm()
        for s, old in self._old.items():
            signal.signal(s, old)
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
