"""What the main process tells the other processes of a launch before their process group exists: one JSON value a
time, under a key of the launch's store (the TCP store that torch's ``env://`` rendezvous makes the process group on).

``progressive/run/start.py`` hands a resume's plan on this way: the main process decides under the run's lock and
``publish``es its plan, the others ``wait`` for it instead of reading the run folder themselves (a live run may be
pruning its checkpoints until the main process holds the lock).

The store: under torchrun (and ``accelerate launch``, which runs torchrun's agent) the agent's, which every process
reaches as a client (``TORCHELASTIC_USE_AGENT_STORE``); in a launch set by hand, rank 0's, which
``progressive.run.rendezvous.meet`` starts to serve (``multi_tenant``: one server for it, for this module and for the
process group's store made later in the same process). A key holds the launch's restart count (torchrun's agent keeps
its store across restarts of the workers) and a count of the values told so far in this process (a process that
plans several runs, one after the other, asks in the same order as the main one tells).
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from progressive.run.rendezvous import RendezvousTimeout
from progressive.run.stop import StopOnSignal, Stopped

__all__ = ["open_store", "publish", "wait", "POLL_S"]

PREFIX = "growtrain/told"
POLL_S = 0.2  # between two looks at the store: a signal is acted on within this
CONNECT_S = 60.0  # a client's connection to a store that is up (torchrun's agent's, rank 0's after meet)
_COUNT = [0]  # values told (main) or waited for (another process) by this process so far
_SERVED: list[Any] = []  # rank 0's store where it serves it: its server must outlive this call


def open_store(env: dict[str, str] | None = None) -> Any:
    """This launch's store (see the module docstring), ``env`` (default ``os.environ``) naming the launch.

    Raises:
        KeyError: WORLD_SIZE, MASTER_ADDR or MASTER_PORT is not set (``rendezvous.meet`` names them first).
    """
    from torch.distributed import TCPStore

    env = dict(os.environ if env is None else env)
    world, rank = int(env["WORLD_SIZE"]), int(env.get("RANK", "0"))
    host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    if rank == 0 and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        store = TCPStore(host, port, world, is_master=True, timeout=timedelta(seconds=CONNECT_S),
                         wait_for_workers=False, multi_tenant=True)
        _SERVED[:] = [store]
        return store
    return TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=CONNECT_S))


def _next_key() -> str:
    _COUNT[0] += 1
    return f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{_COUNT[0]}"


def publish(store: Any, value: Any) -> None:
    """The main process: tell the others ``value`` (JSON: dicts, lists, strings, numbers, None)."""
    store.set(_next_key(), json.dumps(value))


def wait(store: Any, timeout: float, stop: StopOnSignal | None) -> Any:
    """Another process: the value the main process tells next, waited for in polls of ``POLL_S``.

    Args:
        store: ``open_store``'s.
        timeout: seconds to wait at most (``train.rendezvous_timeout``; 0: no bound).
        stop: the command's stop handler: a signal it saw ends the wait.

    Raises:
        Stopped: a signal came while waiting (exit 75; nothing had started).
        RendezvousTimeout: the main process told nothing within ``timeout`` seconds (exit 2).
    """
    key, began = _next_key(), time.monotonic()
    while not store.check([key]):
        if stop is not None and stop.signum is not None:
            raise Stopped(f"stopped by {stop.name} while waiting for the main process's plan; nothing had started: "
                          "the same command resumes the run")
        if timeout > 0 and time.monotonic() - began >= timeout:
            raise RendezvousTimeout(f"the main process (rank 0) gave no plan within {timeout:g} s "
                                    "(train.rendezvous_timeout); is it running?")
        time.sleep(POLL_S)
    return json.loads(store.get(key))
