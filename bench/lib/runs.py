"""Benchmark runs cached by config hash, so a sweep that stops resumes where it was; where a bench writes.

``run(cfg, root)`` trains ``cfg`` under ``root/<hash>/`` unless a finished run with the same config is
there, and returns its metrics rows. The hash covers everything that changes what is computed; the run's
name, output folder, progress bar, trackers and the options of methods other than the one that runs are
left out. A run interrupted mid-way is resumed.

A bench's output folder and results files are checked before any work (``output_folder``, ``output_file``);
``record`` and ``publish`` write its data (bench/results/<name>.json, read by ``python -m bench.pages``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.io import atomic_write_json, atomic_write_text
from common.ownership import WRITTEN_BY, check_file_replaceable, prepare_output_folder
from common.table import format_table
from progressive.config import RunConfig, counted, to_dict
from progressive.data.cache import cache_key
from progressive.model.build import get_family, guess_data_info
from progressive.model.loss import chunks
from progressive.run import checkpoint as ckpt
from progressive.run.compiled import compiles
from progressive.run.start import decide
from progressive.run.tracking import METRICS, read_metrics
from progressive.run.trainer import Trainer

RUN_KEY = "[0-9a-f]" * 16  # the name of a cached run's folder (``config_hash``), as a pattern of what a bench writes


def output_folder(path: str | Path, tool: str, writes: Iterable[str]) -> Path:
    """A bench script's ``--out`` folder, checked before any work (common.ownership): new, empty, marked as
    bench output of ``tool``, or holding only what ``tool`` writes (``writes``: names or glob patterns such as
    ``RUN_KEY``, never one that matches any name); never a folder of the user's. Exits with one line (code 2)
    otherwise."""

    try:
        return prepare_output_folder(path, tool, writes)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def output_file(path: str | Path, tool: str) -> Path:
    """A bench script's results file: new, or a JSON this project wrote; exits with one line otherwise."""

    try:
        check_file_replaceable(path, tool)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return Path(path)


def record(folder: str | Path, name: str, payload: dict, tool: str) -> Path:
    """Write a bench's machine-readable results to ``folder/<name>.json`` (bench/results/ is committed and read
    by ``python -m bench.pages``), marked as this project's and ``tool``'s (common.ownership)."""

    path = output_file(Path(folder) / f"{name}.json", tool)
    atomic_write_json(path, {WRITTEN_BY: f"growtrain {tool}", **payload})
    print(f"recorded {path}", file=sys.stderr)
    return path


def publish(out: Path, name: str, payload: dict, results: str | Path | None, tool: str) -> str:
    """Write a bench's ``payload`` (its rows under "results") to ``out/<name>.json`` and a Markdown table of the
    rows to ``out/<name>.md``, record it in ``results`` (bench/results) when given; returns the table."""

    atomic_write_json(Path(out) / f"{name}.json", payload)
    if results:
        record(results, name, payload, tool)
    text = format_table(payload["results"])
    atomic_write_text(Path(out) / f"{name}.md", text + "\n")
    return text


def machine() -> str:
    """"<CPU model> (<n> cores), torch <version>": what a bench's timings depend on."""

    import torch

    name = platform.processor() or platform.machine()
    try:
        name = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name} ({os.cpu_count()} cores), torch {torch.__version__}"


def config_hash(cfg: RunConfig) -> str:
    """A short hash of what ``cfg`` computes: the fields whose mark says they are part of the key (what does not
    change a run's numbers is marked so in progressive.config, and a field added with such a mark keeps every cached
    run's key). Settings decided on this machine ("auto") enter as what they decide; ``train.loss`` only where it is
    not transformers' own loss (every run before it was), so earlier keys hold."""

    tree = counted(to_dict(cfg), lambda mark: mark.key)
    tree["train"]["compile"] = compiles(cfg)
    vocab = guess_data_info(cfg).vocab_size if get_family(cfg.model.family, cfg.model.task).head else 0
    if chunks(cfg.train, vocab, cfg.data.seq_len, compiled_whole=tree["train"]["compile"] and not cfg.train.fsdp):
        tree["train"]["loss"] = "chunked"
    else:
        tree["train"].pop("loss")
    return cache_key(tree, length=16)


def finished(cfg: RunConfig, root: str | Path) -> bool:
    """Whether ``run(cfg, root)`` would read a finished run from the cache instead of training."""
    return (Path(root) / config_hash(cfg) / "summary.json").is_file()


def run(cfg: RunConfig, root: str | Path, label: str = "", again: bool = False) -> tuple[list[dict[str, Any]], Path]:
    """(metrics rows, run folder) of ``cfg``: trained now, resumed, or read from the cache of an earlier run
    (``again``: a finished run is never read back but trained again in its folder)."""

    key, done = config_hash(cfg), finished(cfg, root)
    # the bench draws its own figures: no per-run loss plots (nor a scan of every run beside it for a baseline)
    cfg = dataclasses.replace(cfg, name=key, output_dir=str(root), train=dataclasses.replace(cfg.train, plots=False))
    folder = Path(root) / key
    if done and not again:
        print(f"   {label or key}: reusing {folder}", flush=True)
    else:
        resume = not done and bool(ckpt.list_checkpoints(folder))
        print(f"   {label or key}: {'resuming' if resume else 'training again' if done else 'training'} in {folder}",
              flush=True)
        Trainer(cfg, decide(cfg.run_dir, resume, overwrite=not resume)).run()
    return read_metrics(folder / METRICS), folder


def summary(folder: str | Path) -> dict[str, Any]:
    """A finished run's summary.json."""
    return json.loads((Path(folder) / "summary.json").read_text())


def freeze_decisions(metrics: list[dict]) -> list[tuple[int, int, int]]:
    """(B_T, C_T, F_T) of every freeze decision of an AutoFreeze run, in order, from its metrics rows."""
    out, seen = [], 0
    for r in metrics:
        if r["kind"] == "train" and r.get("freeze_decisions", 0) > seen:
            seen = r["freeze_decisions"]
            out.append((r["freeze_bound"], r["freeze_criterion"], r["frozen"]))
    return out
