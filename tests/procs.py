"""Run a command as its own process group and never leave any of it behind.

``subprocess.run(..., timeout=...)`` kills only the process it started: a torchrun that times out leaves its
workers running (one was found waiting in a collective 48 minutes later), and a worker orphaned by a launcher
that exited outlives the test. ``run_tree`` starts the command in a new session and, when it has finished or
timed out, kills whatever of its group is still alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_tree(cmd: list[str], timeout: float, check: bool = False, capture_output: bool = True, text: bool = True,
             **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=timeout, ...)``, the command's whole process group killed at the end.

    Raises:
        subprocess.TimeoutExpired: after ``timeout`` seconds (the group is killed first).
        subprocess.CalledProcessError: with ``check``, a non-zero exit.
    """
    if capture_output:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    proc = subprocess.Popen(cmd, text=text, start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        _kill_group(proc.pid)
        proc.communicate()
        raise
    _kill_group(proc.pid)  # an orphan a launcher left behind
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
