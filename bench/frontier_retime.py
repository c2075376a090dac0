"""Re-timing frontier rows (``python -m bench.frontier --retime 2x32``): the same runs again, for their wall-clock.

A frontier.csv row keeps the wall-clock of the sitting that ran it, and sittings differ (another session's
load, a test run beside it: the load average at a run's start is in ``load1``). A wall-clock saving compares
a method's row with the baseline rows of its reference, so both must come from one sitting. ``--retime SIZE``
runs again, two at a time as always, every tuned baseline row of SIZE (the reference of every saving at that
size) and every other row of SIZE that started under a load above ``MAX_LOAD`` (more than the two workers'
own), into a separate folder so that nothing is reused, and replaces their ``wall_s`` and ``load1``. FLOPs and
losses must come out the same (the runs are deterministic on one machine): each re-run's test loss is compared
with the row's and the largest difference printed.
"""

from __future__ import annotations

from typing import Any

from bench import envelope

MAX_LOAD = 2.5  # two one-thread workers alone give a load average of about 2


def parse_sizes(text: str) -> set[tuple[int, int]]:
    """"2x32,2x64" -> {(2, 32), (2, 64)}; raises ValueError naming the bad entry."""
    out = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            layers, width = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"--retime: expected sizes like 2x32,4x128, got {part!r}") from None
        out.add((layers, width))
    return out


def retime_jobs(g: Any, rows: list[dict[str, Any]], sizes: set[tuple[int, int]],
                flops: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    """The jobs that re-time the rows of ``sizes`` (see the module docstring), in the frontier's job format
    (bench.frontier.make_job) with kind "retime"."""
    from bench.frontier import make_job, method_of

    jobs = []
    for r in rows:
        size, b = envelope.size_of(r), int(r["budget"])
        if size not in sizes:
            continue
        tuned = r["method"] == "baseline" and float(r["lr"]) == envelope.tuned_lr(rows, size, b)
        if not tuned and float(r["load1"] or 0.0) <= MAX_LOAD:
            continue
        method = "baseline" if r["method"] == "baseline" else method_of(r["variant"])
        job = make_job(g, method, r["variant"], size, b, float(r["lr"]), int(r["seed"]), flops, 0)
        if job["key"] != r["key"]:
            raise RuntimeError(f"row {r['key']} no longer matches its configuration (now {job['key']}): the "
                               "frontier's settings changed since it ran; re-run it instead")
        jobs.append({**job, "kind": "retime"})
    return sorted(jobs, key=lambda j: j["order"])


def apply(row: dict[str, Any], result: dict[str, Any]) -> float:
    """Put a re-run's wall-clock and load into ``row``; return |test loss difference| (0 when deterministic)."""
    diff = abs(float(result["test_loss"]) - float(row["test_loss"]))
    row["wall_s"], row["load1"] = result["wall_s"], result["load1"]
    return diff
