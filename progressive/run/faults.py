"""Test-only fault injection, right after a given global optimizer step (its logging, evaluation and
checkpoint included): SIGKILL the process, to test ``--resume`` against a real crash; or send it signals,
to test stopping on a signal (progressive.run.stop).

    PROGRESSIVE_KILL_AFTER_STEP=9                   SIGKILL after step 9
    PROGRESSIVE_SIGNAL_AFTER_STEP=5:SIGTERM:1,...   STEP[:SIGNAL[:RANK]]: SIGTERM to rank 1 only after step 5
    PROGRESSIVE_SIGNAL_AFTER_STEP=5:SIGTERM:parent  SIGTERM to the parent process (a bench driving workers), then
                                                    wait up to a minute for the stop request it passes back
    PROGRESSIVE_UNSEEN_SUMMARY_RANK=1               rank 1 does not see a finished run's summary (a file
                                                    written while the processes looked, as on a shared file system)
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

__all__ = ["KILL_ENV", "SIGNAL_ENV", "UNSEEN_ENV", "inject_faults", "finished_here"]

KILL_ENV = "PROGRESSIVE_KILL_AFTER_STEP"
SIGNAL_ENV = "PROGRESSIVE_SIGNAL_AFTER_STEP"
UNSEEN_ENV = "PROGRESSIVE_UNSEEN_SUMMARY_RANK"


def finished_here(run_dir) -> bool:
    """Whether this process sees ``run_dir`` as a finished run (its summary.json), UNSEEN_ENV aside."""
    from pathlib import Path

    if os.environ.get(UNSEEN_ENV) is not None and os.environ.get(UNSEEN_ENV) == os.environ.get("RANK"):
        return False
    return (Path(run_dir) / "summary.json").is_file()


def inject_faults(step: int, rank: int, stopping: Callable[[], bool] = lambda: False) -> None:
    """The faults of KILL_ENV and SIGNAL_ENV due after optimizer step ``step`` on process ``rank``; ``stopping``
    says whether this process has been asked to stop (the wait after signalling the parent)."""
    if os.environ.get(KILL_ENV) == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
    for item in filter(None, os.environ.get(SIGNAL_ENV, "").split(",")):
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
