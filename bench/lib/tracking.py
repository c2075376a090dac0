"""``--report_to`` for the benches: every run a bench made (or read from its cache) as one W&B run, grouped by
its cell, and the bench's results (tables, figures) as one more run, so the numbers the README leads with reach
a dashboard.

Each run's id is a hash of the bench and the run's name, so logging the same bench again writes into the same
runs (offline: a new offline-run folder per logging, synced into the same run). Without W&B credentials it logs
offline into ``<where>/wandb`` (``wandb sync`` uploads later), as train.py does.
"""

from __future__ import annotations

import argparse
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.trackers import wandb_offline_fallback

CHOICES = ("none", "wandb")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The benches' tracker flags."""
    ap.add_argument("--report_to", choices=CHOICES, default="none",
                    help="wandb: each run as a W&B run grouped by its cell, and the results as one more run")
    ap.add_argument("--project", default="growtrain", help="the W&B project (default: train.py's)")


@dataclass
class Entry:
    """One W&B run: its name and group, config, summary, training curve (metrics.jsonl's train rows), tables
    (name -> list of dicts) and images (name -> PNG path)."""

    name: str
    group: str
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    images: dict[str, Path] = field(default_factory=dict)
    tags: tuple[str, ...] = ()


def number(text: str) -> Any:
    """A CSV cell as W&B should see it: a number where it is one, None where empty, else the text."""
    if text in ("", None):
        return None
    try:
        return int(text) if text.lstrip("-").isdigit() else float(text)
    except ValueError:
        return text


def train_curve(folder: Path) -> list[dict[str, Any]]:
    """The train rows of ``folder/metrics.jsonl`` (step, tokens, FLOPs, wall-clock, loss, LR), or [] when the run
    folder is not here (a row made on another machine)."""
    path = Path(folder) / "metrics.jsonl"
    if not path.is_file():
        return []
    keep = ("step", "tokens", "flops", "wall", "loss", "lr")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: r[k] for k in keep if k in r} for r in rows if r.get("kind") == "train"]


def run_id(bench: str, name: str) -> str:
    """A W&B run id fixed by the bench and the run's name."""
    return f"{bench.replace('/', '-')[:40]}-{zlib.crc32(name.encode()):08x}"


def log(report_to: str, project: str, where: Path, bench: str, entries: list[Entry]) -> int:
    """Log ``entries`` as W&B runs of job type "bench" tagged ``bench``; returns how many (0 for "none")."""
    if report_to == "none" or not entries:
        return 0
    import wandb

    where = Path(where)
    where.mkdir(parents=True, exist_ok=True)
    warning = wandb_offline_fallback(str(where / "wandb"))
    if warning:
        print(warning)
    for e in entries:
        run = wandb.init(project=project, dir=str(where), id=run_id(bench, e.name), resume="allow", name=e.name,
                         group=e.group, job_type="bench", tags=[bench, *e.tags], config=e.config)
        if e.history:
            run.define_metric("flops")
            run.define_metric("*", step_metric="flops")
            for row in e.history:
                run.log(row)
        log_now: dict[str, Any] = {n: wandb.Table(columns=list(t[0]), data=[[r.get(c) for c in t[0]] for r in t])
                                   for n, t in e.tables.items() if t}
        log_now.update({n: wandb.Image(str(p)) for n, p in e.images.items() if Path(p).is_file()})
        if log_now:
            run.log(log_now)
        run.summary.update(e.summary)
        run.finish()
    wandb.teardown()
    print(f"W&B: {len(entries)} runs of {bench} logged to project {project} (job type bench)")
    return len(entries)
