"""Signals save the work: SIGINT (Ctrl-C) and SIGTERM end a run at the next step boundary with a checkpoint.

One ``StopOnSignal`` handles SIGINT and SIGTERM for the whole command (``stopping``): from the moment a run
starts loading until its last file is written, for every method of a comparison and the pause between them:

- The first signal only sets a flag and prints one line. The trainer checks the flag after every step, and
  before the first one, writes a checkpoint, prints the command that resumes, and raises ``Stopped``: exit code
  75 (EX_TEMPFAIL, "try again": the run is resumable). A comparison checks it between two methods too (the next
  one does not start), and a signal that comes after training, while the final outputs are written, lets them
  finish and still ends the command with 75 and the command that resumes (which then finds the work done).
- Several processes agree without a per-step host-device sync (``StopVote``): after step s each process
  hands its flag to an asynchronous all-reduce over host memory (gloo) and reads the result of the one it
  started after step s - 1, which every process has joined by then. So all stop at the same step, at most
  one step after the first of them saw the signal, and the host keeps queueing work ahead of the GPU. At
  a step that ends in a logged row (``train.log_every``, a phase's last step), which waits for the device
  anyway, the vote of that step is waited for too, and the stop comes at that step; so do the checks before
  the first step and between a comparison's methods. (It used to be one all-reduce of a device tensor and
  ``.item()`` every step: the host waited for the device at each step.) One process reads its own flag: no
  collective at all.
- The wait is bounded: if the stop's step boundary is not reached within ``timeout`` seconds
  (``train.stop_timeout``; with several processes and a step without a row, that is the end of the step
  after the one running), the run stops at once, as on a second signal.
- A second signal stops at once (``KeyboardInterrupt`` in the main thread; the trainer raises
  ``Interrupted``: exit code 128 + the signal, 130 for Ctrl-C, 143 for SIGTERM). Nothing is corrupted:
  every file of a run is written to a temporary name and renamed (common/io.py), a torn metrics line is
  skipped, and ``--resume`` continues from the last complete checkpoint.
- A signal repeated within ``DUPLICATE_S`` seconds of the first counts as the same request, until the
  process exits: launchers forward the terminal's signal to their workers (torchrun sends the SIGINT or
  SIGTERM it received), so a worker sees one Ctrl-C twice, and schedulers repeat a SIGTERM. In the process
  of a command (``ignore_repeats_at_exit``), the handler gives way to ignoring both signals once the command
  has stopped, so a repeat that comes while the process exits cannot turn exit 75 into death by the signal.

- A signal is seen even while the main thread is blocked in one native call (a rendezvous, a collective whose peer
  left, a read that never returns), where Python runs no handler until the call returns: the C handler writes each
  signal to a pipe (``signal.set_wakeup_fd``) that a watchdog thread reads (``_Watchdog``). If the main thread has
  not stopped within the bounded wait plus ``NATIVE_GRACE_S`` of the first signal (``NATIVE_GRACE_S`` of a second
  one), the watchdog ends the process itself, with one line and exit code 128 + the signal, as a second signal
  would: the last complete checkpoint stays intact. Before, only SIGKILL ended such a process. While the processes
  make their group (``StopOnSignal.joining``), nothing has started and no step boundary is coming: the watchdog ends
  the process ``JOIN_GRACE_S`` after the signal, with exit 75 (a launch whose main process failed first gets its
  other processes back in seconds, not at torchrun's SIGKILL).

Launchers give a limited grace period before SIGKILL (torchrun: 30 s, ``--shutdown_timeout``; SLURM:
``KillWait``, or ``--signal=B:TERM@<seconds>`` to be warned earlier), which must cover the step that is
running plus one checkpoint write.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["StopOnSignal", "StopVote", "Stopped", "Interrupted", "STOPPED_EXIT", "DUPLICATE_S", "stopping",
           "ignore_repeats_at_exit"]

STOPPED_EXIT = 75      # EX_TEMPFAIL: stopped by a signal after writing a checkpoint; resumable
DUPLICATE_S = 2.0      # a repeat within this many seconds is the same request (forwarded by a launcher)
NATIVE_GRACE_S = 10.0  # after the bounded wait (or a second signal): time for Python's handler, then the watchdog
JOIN_GRACE_S = 3.0     # a signal while the processes join (``StopOnSignal.joining``): past a launcher's repeat
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
        self._vote = StopVote()              # the processes' agreement, one step behind
        self._watchdog: _Watchdog | None = None  # ends the process if the main thread never gets to act
        self.in_join = False                 # inside ``joining``: the processes are making their group

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
            self._watchdog = _Watchdog(self)
            _ACTIVE.append(self)
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:
            self._vote.settle()  # each run's last vote, joined by every process: nothing left in flight
        self._vote = StopVote()  # after an error, the other processes may never join it: not waited for
        self._depth -= 1
        if self._depth:
            return  # a run inside the command: the command's handler stays
        self.disarm()
        if self._watchdog is not None:
            self._watchdog.close()
            self._watchdog = None
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        for s, old in self._old.items():
            # in a command's process, a repeat that comes while it exits is the same request: ignored
            signal.signal(s, signal.SIG_IGN if _AT_EXIT and self.signum is not None else old)
        self._old.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.expired:  # delivered by _expire: the bounded wait ran out
            self._acted()
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
        self._acted()
        raise KeyboardInterrupt

    def _acted(self) -> None:
        """The main thread is stopping at once: the watchdog has nothing left to do."""
        if self._watchdog is not None:
            self._watchdog.deadline = None
            self._watchdog.acted = True

    @contextlib.contextmanager
    def joining(self) -> Iterator[None]:
        """The processes making their group (``init_process_group``, inside Accelerate's start): a native wait
        for peers, before anything has started, in which Python's handler cannot run. A signal there ends the
        process ``JOIN_GRACE_S`` after it (the watchdog: one line, exit 75, the same command starts or resumes
        the run) instead of after the bounded wait: a launch whose main process has already failed (its folder in
        use, a bad config) sends the others SIGTERM while they wait for it, and its own SIGKILL (torchrun: 30 s)
        came first. A call that returns in time leaves the stop as any other signal's, at the first step."""
        self.in_join = True
        try:
            yield
        finally:
            self.in_join = False
            if self._watchdog is not None:
                self._watchdog.left_join()

    # ------------------------------------------------------------------------------------ queries

    def disarm(self) -> None:
        """Cancel the bounded wait (the step boundary was reached; the checkpoint is being written)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watchdog is not None:
            self._watchdog.deadline = None

    def requested(self, at_once: bool = False) -> bool:
        """Whether the processes agreed to stop at this step boundary (``StopVote``); called by every process
        after every step, ``at_once`` where the step already waited for the device (a logged row) or where
        an answer for this very moment is needed (before the first step, between a comparison's methods).
        One process: whether it received a signal."""
        return self._vote(self.signum is not None, at_once)

    @property
    def name(self) -> str:
        """The signal's name ("SIGINT"), or "a signal on another process"."""
        return signal.Signals(self.signum).name if self.signum is not None else "a signal on another process"


class _Watchdog:
    """Reads the signals the C handler writes to a pipe (``signal.set_wakeup_fd``), in a thread of its own, so that it
    sees them while the main thread is blocked in a native call and Python's handler cannot run. A first signal sets
    a deadline of the bounded wait plus ``NATIVE_GRACE_S`` (no deadline without a bound), a second one (past
    ``DUPLICATE_S``) of ``NATIVE_GRACE_S``; ``disarm`` (the step boundary was reached) and the main thread's own stop
    at once clear it. At the deadline the process ends here: one line, exit code 128 + the first signal."""

    def __init__(self, stop: StopOnSignal):
        self.stop = stop
        self.deadline: float | None = None
        self.acted = False
        self._in_join = False  # the deadline set is a join's (``StopOnSignal.joining``)
        self._first: tuple[int, float] | None = None  # (signal, when) of the first signal seen
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="stop-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Give the wake-up descriptor back and end the thread (main thread only)."""
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._write)  # the thread reads the end of the pipe and leaves
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        try:
            while True:
                wait = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
                ready, _, _ = select.select([self._read], [], [], wait)
                if ready:
                    data = os.read(self._read, 64)
                    if not data:
                        return  # closed: the command's handler is gone
                    for signum in data:
                        self._seen(signum)
                elif self.deadline is not None and time.monotonic() >= self.deadline and not self.acted:
                    self._end()
        finally:
            os.close(self._read)

    def _seen(self, signum: int) -> None:
        if signum not in SIGNALS or self.acted:
            return
        now = time.monotonic()
        if self._first is None:
            self._first = (signum, now)
            if self.stop.in_join:
                self.deadline, self._in_join = now + JOIN_GRACE_S, True
            elif self.stop.timeout > 0:
                self.deadline = now + self.stop.timeout + NATIVE_GRACE_S
        elif now - self._first[1] >= DUPLICATE_S and not self.stop.expired:  # a second request (not _expire's own)
            self.deadline = min(self.deadline or float("inf"), now + NATIVE_GRACE_S)

    def left_join(self) -> None:
        """The join returned: a deadline set by a signal inside it becomes the bounded wait's, from that signal."""
        if self._in_join and not self.acted and self._first is not None:
            self.deadline = self._first[1] + self.stop.timeout + NATIVE_GRACE_S if self.stop.timeout > 0 else None
        self._in_join = False

    def _end(self) -> None:
        signum, when = self._first or (signal.SIGTERM, time.monotonic())
        name = signal.Signals(signum).name
        if self._in_join and self.stop.in_join:  # nothing had started: the other processes leave the line to rank 0
            line = (f"stopped by {name} while the processes were joining (another may have failed); nothing had "
                    "started: the same command starts or resumes the run") if os.environ.get("RANK", "0") == "0" else ""
            code = STOPPED_EXIT
        else:
            line = (f"stopped at once: {name} was not acted on within {time.monotonic() - when:.0f} s (the process was "
                    "blocked in a native call: a rendezvous, or a collective whose peer had left); the last complete "
                    "checkpoint resumes")
            code = 128 + int(signum)
        if line:
            print(f"\n{line}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


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
