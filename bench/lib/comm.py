"""The link between two processes on this machine, measured: the elastic pipeline simulator's communication model
(bench/papers/pipetransformer.py). Its workers are spawned, so this module imports only what they need (a spawned
child imports the module of its target, and one that pulled in transformers cost each child seconds)."""

from __future__ import annotations

import socket
import time
from typing import Any


def _comm_worker(rank: int, port: int, sizes: list[int], out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    res = {}
    for n in sizes:
        t = torch.zeros(n // 4)
        for kind in ("p2p", "allreduce"):
            times = []
            for _ in range(7):
                dist.barrier()
                t0 = time.perf_counter()
                if kind == "allreduce":
                    dist.all_reduce(t)
                elif rank == 0:
                    dist.send(t, 1)
                else:
                    dist.recv(t, 0)
                times.append(time.perf_counter() - t0)
            res[(kind, n)] = sorted(times)[len(times) // 2]
    if rank == 1:
        out.put(res)
    dist.destroy_process_group()


def measure_comm(sizes: tuple[int, ...] = (1 << 12, 1 << 16, 1 << 20, 1 << 22)) -> dict[str, tuple[float, float]]:
    """{"p2p" | "allreduce": (latency s, s per byte)}: a least-squares line through median transfer times
    between two gloo processes on this machine (the simulator's communication model)."""
    import numpy as np
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=_comm_worker, args=(r, port, list(sizes), q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=300)
    for p in procs:
        p.join()
    fit = {}
    for kind in ("p2p", "allreduce"):
        slope, intercept = np.polyfit(np.array(sizes, float), np.array([res[(kind, n)] for n in sizes]), 1)
        fit[kind] = (max(0.0, float(intercept)), max(0.0, float(slope)))
    return fit
