"""Test-only fault injection, asked for through the environment: SIGKILL the process right after a given global
optimizer step (its logging, evaluation and checkpoint included), to test ``--resume`` against a real crash; send
it signals, to test stopping on a signal (progressive.run.stop); or hide a finished run's summary from one rank.

    PROGRESSIVE_KILL_AFTER_STEP=9                   SIGKILL after step 9
    PROGRESSIVE_SIGNAL_AFTER_STEP=5:SIGTERM:1,...   STEP[:SIGNAL[:RANK]]: SIGTERM to rank 1 only after step 5
    PROGRESSIVE_SIGNAL_AFTER_STEP=5:SIGTERM:parent  SIGTERM to the parent process (a bench driving workers), then
                                                    wait up to a minute for the stop request it passes back
    PROGRESSIVE_UNSEEN_SUMMARY_RANK=1               rank 1 does not see a finished run's summary (a file
                                                    written while the processes looked, as on a shared file system)

Production code reaches this module through one seam, ``armed()``: None unless one of these variables is set, so
that outside tests nothing else here runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["KILL_ENV", "SIGNAL_ENV", "UNSEEN_ENV", "Faults", "armed"]

KILL_ENV = "PROGRESSIVE_KILL_AFTER_STEP"
SIGNAL_ENV = "PROGRESSIVE_SIGNAL_AFTER_STEP"
UNSEEN_ENV = "PROGRESSIVE_UNSEEN_SUMMARY_RANK"


@dataclass(frozen=True)
class Faults:
    """The faults this process's environment asks for (the variables' values, None when unset)."""

    kill_after: str | None
    signals: str | None
    unseen_rank: str | None

    def after_step(self, step: int, rank: int, stopping: Callable[[], bool] = lambda: False) -> None:
        """The kill and the signals due after optimizer step ``step`` on process ``rank``; ``stopping`` says
        whether this process has been asked to stop (the wait after signalling the parent)."""
        if self.kill_after == str(step):
            os.kill(os.getpid(), signal.SIGKILL)
        for item in filter(None, (self.signals or "").split(",")):
            at, _, rest = item.partition(":")
            name, _, who = rest.partition(":")
            if int(at) != step:
                continue
            if who == "parent":
                os.kill(os.getppid(), getattr(signal, name or "SIGINT"))
                deadline = time.monotonic() + 60
                while not stopping() and time.monotonic() < deadline:
                    time.sleep(0.05)
            elif not who or int(who) == rank:
                os.kill(os.getpid(), getattr(signal, name or "SIGINT"))

    def hides_summary(self) -> bool:
        """Whether this process must not see a finished run's summary (UNSEEN_ENV names its rank)."""
        return self.unseen_rank is not None and self.unseen_rank == os.environ.get("RANK")


def armed() -> Faults | None:
    """The faults the environment asks for, or None when it asks for none (always, outside tests)."""
    found = Faults(os.environ.get(KILL_ENV), os.environ.get(SIGNAL_ENV), os.environ.get(UNSEEN_ENV))
    return found if any(v is not None for v in (found.kill_after, found.signals, found.unseen_rank)) else None
