"""The ranks of a hand-made launch meet in short, interruptible waits, before the process group is made.

A launch whose environment was set by hand or by a scheduler (``WORLD_SIZE=2 RANK=0 MASTER_ADDR=... MASTER_PORT=...
python train.py``: a Kubernetes job, an ``srun`` line, a leaked torchrun shell) makes its process group through
torch's ``env://`` rendezvous, whose wait for the other ranks is one native call: it blocks for torch's default 30
minutes, and while it blocks Python's signal handlers cannot run, so SIGTERM and Ctrl-C are taken and never acted on.
``meet`` waits for them first, in Python:

- rank 0 serves the store at MASTER_ADDR:MASTER_PORT (``multi_tenant``: the store torch's ``env://`` rendezvous
  makes next, in the same process, is served by the same server), every rank writes its key and waits until every
  key is there, in polls of ``POLL_S`` (a rank whose store is not up yet retries its connection, ``CONNECT_S`` a try);
- a signal between two polls ends the wait at once: ``Stopped`` (exit 75; nothing had started, the same command
  starts the run);
- after ``timeout`` seconds (``train.rendezvous_timeout``) the wait ends with one line naming the ranks that never
  came (rank 0 knows them; another rank names rank 0's address when it never answered), a ``RendezvousTimeout``
  (a ValueError: exit 2).

Launches by torchrun or ``accelerate launch`` need none of it: their agents meet first (with their own bounded,
signal-handling rendezvous) and start the workers together, so ``meet`` does nothing there (TORCHELASTIC_RUN_ID is
set), nor where the process group already exists or the world is one process.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from progressive.run.stop import StopOnSignal, Stopped

__all__ = ["meet", "RendezvousTimeout", "POLL_S", "CONNECT_S"]

POLL_S = 0.2       # between two looks at the store: a signal is acted on within this
CONNECT_S = 2.0    # one try at connecting to rank 0's store (a native call: a signal waits for its end)
SAY_FIRST_S, SAY_EVERY_S = 1.0, 30.0  # a line once the wait is not quick, then every so often
PREFIX = "growtrain/rendezvous"
_SERVED: list[Any] = []  # rank 0's store: its server must outlive the wait, for the process group's store


class RendezvousTimeout(ValueError):
    """Not every rank came within ``train.rendezvous_timeout`` seconds (exit 2, one line naming them)."""


def _needed(env: dict[str, str]) -> bool:
    import torch.distributed as dist

    if int(env.get("WORLD_SIZE", "1")) <= 1 or env.get("TORCHELASTIC_RUN_ID"):
        return False
    return not (dist.is_available() and dist.is_initialized())


def meet(timeout: float, stop: StopOnSignal | None, say: Callable[[str], None] | None = None,
         env: dict[str, str] | None = None) -> None:
    """Wait until every rank of a hand-set launch has come (see the module docstring); returns at once for one
    process, a torchrun / accelerate launch, or a process group that exists.

    Args:
        timeout: seconds to wait for every rank (``train.rendezvous_timeout``; 0: no bound).
        stop: the command's stop handler (``progressive.run.stop.stopping``): a signal it saw ends the wait.
        say: prints a line on the console while the wait goes on (the main process's).
        env: the environment (default ``os.environ``).

    Raises:
        Stopped: a signal came while waiting (exit 75).
        RendezvousTimeout: a rank did not come within ``timeout`` seconds (exit 2).
        ValueError: WORLD_SIZE / RANK / MASTER_ADDR / MASTER_PORT missing or not numbers.
    """
    env = dict(os.environ if env is None else env)
    if not _needed(env):
        return
    world, rank, host, port = _address(env)
    say = say or (lambda msg: None)
    began = time.monotonic()
    deadline = began + timeout if timeout > 0 else float("inf")
    where = f"{host}:{port}"
    store = _connect(host, port, world, rank, deadline, stop, where, timeout)
    store.set(_key(rank), "1")
    keys = [_key(r) for r in range(world)]
    said = began - SAY_EVERY_S + SAY_FIRST_S
    while not store.check(keys):
        _check_stop(stop, where)
        now = time.monotonic()
        if now >= deadline:
            missing = [r for r in range(world) if not store.check([_key(r)])]
            raise RendezvousTimeout(f"rendezvous at {where}: rank{'s' * (len(missing) > 1)} "
                                    f"{', '.join(map(str, missing))} of {world} did not come within {timeout:g} s "
                                    f"(train.rendezvous_timeout); start every rank with the same MASTER_ADDR, "
                                    f"MASTER_PORT and WORLD_SIZE, or launch with torchrun")
        if now - said >= SAY_EVERY_S:
            said = now
            missing = [r for r in range(world) if not store.check([_key(r)])]
            of = f" of {timeout:g}, train.rendezvous_timeout" if timeout > 0 else ""
            say(f"waiting for rank{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} of {world} at {where} "
                f"({now - began:.0f} s{of})")
        time.sleep(POLL_S)
    if rank == 0:
        _SERVED[:] = [store]


def _address(env: dict[str, str]) -> tuple[int, int, str, int]:
    try:
        world, rank = int(env["WORLD_SIZE"]), int(env.get("RANK", "0"))
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except KeyError as e:
        raise ValueError(f"WORLD_SIZE={env.get('WORLD_SIZE')} asks for several processes, but {e.args[0]} is not set: "
                         "set WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT on every rank, or launch with torchrun")\
            from None
    except ValueError:
        raise ValueError(f"WORLD_SIZE, RANK and MASTER_PORT must be integers, got {env.get('WORLD_SIZE')!r}, "
                         f"{env.get('RANK')!r}, {env.get('MASTER_PORT')!r}") from None
    if not 0 <= rank < world or not 0 < port < 2**16:
        raise ValueError(f"RANK={rank} must be in 0 .. WORLD_SIZE-1 ({world - 1}) and MASTER_PORT={port} in "
                         "1 .. 65535")
    return world, rank, host, port


def _key(rank: int) -> str:
    return f"{PREFIX}/{rank}"


def _check_stop(stop: StopOnSignal | None, where: str) -> None:
    if stop is not None and stop.signum is not None:
        raise Stopped(f"stopped by {stop.name} while waiting for the other ranks at {where}; nothing had started: "
                      "the same command starts the run")


def _connect(host: str, port: int, world: int, rank: int, deadline: float, stop: StopOnSignal | None, where: str,
             timeout: float) -> Any:
    """Rank 0: serve the store (at once). Another rank: connect to it, ``CONNECT_S`` a try, until ``deadline``."""
    from torch.distributed import TCPStore

    if rank == 0:
        return TCPStore(host, port, world, is_master=True, timeout=timedelta(seconds=CONNECT_S),
                        wait_for_workers=False, multi_tenant=True)
    while True:
        # a plain socket first: torch's own connection retries log a native stack trace a try while rank 0 is not up
        try:
            socket.create_connection((host, port), timeout=CONNECT_S).close()
            return TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=CONNECT_S))
        except (RuntimeError, OSError):  # refused, unreachable, or (DistNetworkError) gone again: not serving yet
            _check_stop(stop, where)
            if time.monotonic() >= deadline:
                raise RendezvousTimeout(f"rendezvous at {where}: rank 0 never answered within {timeout:g} s "
                                        "(train.rendezvous_timeout); is MASTER_ADDR:MASTER_PORT rank 0's, and is "
                                        "rank 0 started?") from None
            time.sleep(POLL_S)
