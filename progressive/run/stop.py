"""Signals save the work: SIGINT (Ctrl-C) and SIGTERM end a run at the next step boundary with a checkpoint.

While a run trains, ``StopOnSignal`` replaces the handlers of SIGINT and SIGTERM:

- The first signal only sets a flag and prints one line. The trainer checks the flag after every step,
  writes a checkpoint, prints the command that resumes, and raises ``Stopped``: exit code 75 (EX_TEMPFAIL,
  "try again": the run is resumable).
- Several processes agree without a per-step host-device sync (``StopVote``): after step s each process
  hands its flag to an asynchronous all-reduce over host memory (gloo) and reads the result of the one it
  started after step s - 1, which every process has joined by then. So all stop at the same step, at most
  one step after the first of them saw the signal, and the host keeps queueing work ahead of the GPU. At
  a step that ends in a logged row (``train.log_every``, a phase's last step), which waits for the device
  anyway, the vote of that step is waited for too, and the stop comes at that step. (It used to be one
  all-reduce of a device tensor and ``.item()`` every step: the host waited for the device at each step.)
  One process reads its own flag: no collective at all.
- The wait is bounded: if the stop's step boundary is not reached within ``timeout`` seconds
  (``train.stop_timeout``; with several processes and a step without a row, that is the end of the step
  after the one running), the run stops at once, as on a second signal.
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
from typing import Any

__all__ = ["StopOnSignal", "StopVote", "Stopped", "Interrupted", "STOPPED_EXIT", "DUPLICATE_S"]

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
        self._vote = StopVote()              # the processes' agreement, one step behind

    # -------------------------------------------------------------------------------- the handlers

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        self.disarm()
        if exc_type is None:
            self._vote.settle()  # the last step's vote, joined by every process: nothing left in flight
        self._vote = StopVote()  # after an error, the other processes may never join it: not waited for
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

    def requested(self, at_once: bool = False) -> bool:
        """Whether the processes agreed to stop at this step boundary (``StopVote``); called by every process
        after every step, ``at_once`` where the step already waited for the device (a logged row). One
        process: whether it received a signal."""
        return self._vote(self.signum is not None, at_once)

    @property
    def name(self) -> str:
        """The signal's name ("SIGINT"), or "a signal on another process"."""
        return signal.Signals(self.signum).name if self.signum is not None else "a signal on another process"


class StopVote:
    """Whether any process asked to stop, agreed by all of them without waiting for a device.

    Called once per step by every process with its own flag. With several processes, each call starts an
    asynchronous all-reduce (MAX) of the flag in host memory, over gloo (``_host_group``), and returns the
    result of the previous call's all-reduce: the flags of the previous step, the same on every process.
    Waiting for it waits only until every process's host has finished the previous step's call, never for
    a device's queued work (a GPU's kernels stay queued ahead); the flag is read from host memory. A stop
    is therefore agreed one step after a process saw its signal. A call ``at_once`` (a step that already
    synchronized: a logged row, a phase's last step) also waits for its own all-reduce and answers for
    this step. Once the answer is yes, no new vote starts. One process: the flag itself, no collective.
    """

    def __init__(self) -> None:
        self._pending: tuple[Any, Any] | None = None  # (the all-reduce's work, its host tensor) of the last call

    def __call__(self, flag: bool, at_once: bool = False) -> bool:
        """Hand in this process's ``flag`` (for this step); returns whether to stop now: the previous step's
        agreement, or with ``at_once`` this step's."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return flag
        agreed = self.settle()
        if not agreed:
            mine = torch.tensor([float(flag)])  # host memory, whatever the accelerator
            self._pending = (dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=_host_group(), async_op=True), mine)
            if at_once:
                agreed = self.settle()
        return agreed

    def settle(self) -> bool:
        """Wait for the vote in flight (every process has started it) and return its result; False if none."""
        if self._pending is None:
            return False
        work, flags = self._pending
        self._pending = None
        work.wait()
        return flags.tolist()[0] > 0  # a host tensor: no device to wait for


_HOST_GROUP: list[Any] = []  # [(the default group it was made for, the gloo group)]


def _host_group() -> Any:
    """A process group over all processes whose collectives take host tensors: the default group when its
    backend has gloo (CPU runs, "cpu:gloo,cuda:nccl"), else one gloo group made once for the default group
    (a collective: every process makes it at its first vote, at the same step)."""
    import torch.distributed as dist

    if "gloo" in str(dist.get_backend()):
        return None
    world = dist.group.WORLD
    if not _HOST_GROUP or _HOST_GROUP[0][0] is not world:
        _HOST_GROUP[:] = [(world, dist.new_group(backend="gloo"))]
    return _HOST_GROUP[0][1]
