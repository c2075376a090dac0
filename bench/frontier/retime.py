"""Re-timing frontier rows (``python -m bench.frontier --retime 2x32``): the same runs again, for their wall-clock.

A frontier.csv row keeps the wall-clock of the run that made it, and runs made at different times see different
loads (the load average at a run's start is in ``load1``). A wall-clock saving compares a method's row with the
baseline rows of its reference, so both must be timed together. ``--retime SIZE`` runs again, two at a time as
always, every tuned baseline row of SIZE (the reference of every saving at that size) and every method row of
SIZE that started under a load above ``MAX_LOAD`` (more than the two workers' own), into a separate folder where
nothing is read back (an earlier re-time's run there trains again), and replaces their ``wall_s`` and ``load1``
(the LR sweep's other rows enter no saving and are left alone). The losses stay the row's: each re-run's test
loss is printed beside its difference from the row's, which is 0 (to the CSV's 6 digits) on the machine that ran
the row, where the runs are deterministic, and not 0 on another machine of the same kind: re-timing 2x32 (runs
made on AMD EPYC (2 cores), torch 2.13.0+cpu, 2026-11-25) re-ran 27 rows made earlier on another machine of that
kind, median difference 0.005 nats, largest 0.06 (bit-level differences compound over a run; the seeds' spread at
that size is up to 0.18).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.lib import envelope
from common.cli import comma_list

MAX_LOAD = 2.5  # two one-thread workers alone give a load average of about 2


def parse_sizes(text: str) -> set[tuple[int, int]]:
    """"2x32,2x64" -> {(2, 32), (2, 64)}; raises ValueError naming the bad entry, or for an empty list (which read
    as no --retime and ran the whole grid)."""
    out = set()
    for part in comma_list("--retime", text):
        try:
            layers, width = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"--retime: expected sizes like 2x32,4x128, got {part!r}") from None
        out.add((layers, width))
    return out


def retime_jobs(rows: list[dict[str, Any]], sizes: set[tuple[int, int]],
                job_of: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs that re-time the rows of ``sizes`` (see the module docstring) with kind "retime"; ``job_of``
    turns a row into the frontier's job that would produce it again (bench.lib.grid.make_job)."""
    jobs = []
    for r in rows:
        size, b = envelope.size_of(r), int(r["budget"])
        if size not in sizes:
            continue
        if r["method"] == "baseline":
            if float(r["lr"]) != envelope.tuned_lr(rows, size, b):
                continue  # a sweep row: it enters no saving
        elif float(r["load1"] or 0.0) <= MAX_LOAD:
            continue
        jobs.append(_again(r, job_of, "retime"))
    return sorted(jobs, key=lambda j: j["order"])


def reproduce_jobs(rows: list[dict[str, Any]], keys: list[str],
                   job_of: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs that train the rows with these ``keys`` again with today's code (``--reproduce``), kind
    "reproduce": their losses are printed beside the row's and nothing in the rows changes. Raises ValueError
    naming a key no row has."""
    by_key = {r["key"]: r for r in rows}
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise ValueError(f"--reproduce: no row has the key {', '.join(unknown)} (the rows' keys are their last "
                         "column)")
    return [_again(by_key[k], job_of, "reproduce") for k in keys]


def _again(row: dict[str, Any], job_of: Callable[[dict[str, Any]], dict[str, Any]], kind: str) -> dict[str, Any]:
    """The job of ``kind`` that trains ``row`` again; raises if the row's settings no longer give its key."""
    job = job_of(row)
    if job["key"] != row["key"]:
        raise RuntimeError(f"row {row['key']} no longer matches its configuration (now {job['key']}): the "
                           "frontier's settings changed since it ran; re-run it instead")
    return {**job, "kind": kind}


def apply(row: dict[str, Any], result: dict[str, Any]) -> float:
    """Put a re-run's wall-clock and load into ``row``; return |test loss difference| (0 when deterministic)."""
    diff = abs(float(result["test_loss"]) - float(row["test_loss"]))
    row["wall_s"], row["load1"] = result["wall_s"], result["load1"]
    return diff
