"""Where numbers go: metrics.jsonl (always), Accelerate trackers (``--train.report_to``), a tqdm bar.

Every train row of metrics.jsonl has: kind="train", step, phase (index), phase_name, tokens, flops
(cumulative training FLOPs), wall (cumulative training seconds: steps and transitions, not evaluation or
checkpoint I/O), loss (mean over the steps since the previous row), lr. Val rows have kind="val" and
val_loss (and val_accuracy for classification) instead of loss/lr; a method may add its own fields to
train rows (e.g. stage, depth, frozen). Only the main process writes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from common.io import atomic_write_text
from progressive.config import ConfigError, RunConfig, flatten, to_dict

METRICS = "metrics.jsonl"


def say(msg: str) -> None:
    """Print a line on stderr on the main process only (before the Accelerator exists: RANK from the launcher)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, file=sys.stderr, flush=True)


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl (a torn last line from a crash is skipped), optionally of one kind."""
    rows = []
    path = Path(path)
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or row.get("kind") == kind:
            rows.append(row)
    return rows


def check_tracker(report_to: str, run_dir: Path) -> str | None:
    """Fail early (before data loads or any folder is made) when the chosen tracker's package is missing; for
    W&B without a login, switch to offline logging. Returns a warning to print, or None."""
    if report_to != "none" and importlib.util.find_spec(report_to) is None:
        raise ConfigError(f"train.report_to: {report_to!r} is not installed (pip install {report_to}), "
                          "or use --train.report_to none")
    if report_to == "wandb":
        from common.trackers import wandb_offline_fallback

        return wandb_offline_fallback(str(Path(run_dir) / "wandb"))
    return None


class MetricsLog:
    """Appends rows to <run>/metrics.jsonl and forwards numeric fields to the Accelerate trackers."""

    def __init__(self, run_dir: Path, accelerator: Any, keep_until_step: int | None = None):
        self.path = Path(run_dir) / METRICS
        self.acc = accelerator
        self.main = accelerator.is_main_process
        if self.main and keep_until_step is not None:
            # Resuming: drop rows written after the checkpoint, so the file reads like one unbroken run.
            kept = [json.dumps(r) for r in read_metrics(self.path) if r["step"] <= keep_until_step]
            atomic_write_text(self.path, "".join(k + "\n" for k in kept))
        elif self.main and keep_until_step is None and self.path.exists():
            self.path.unlink()
        self._fh = open(self.path, "a") if self.main else None  # noqa: SIM115 - held for the run

    def log(self, row: dict[str, Any]) -> None:
        """Write one row (main process) and send it to the trackers."""
        if self._fh is not None:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        if self.acc.trackers:
            numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
            if "val_loss" in row:
                numeric = {k: row[k] for k in ("val_loss", "val_accuracy", "tokens", "flops") if k in row}
            self.acc.log({k: float(v) for k, v in numeric.items() if math.isfinite(float(v))}, step=row["step"])

    def close(self) -> None:
        """Close the file (trackers are ended by the trainer)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def init_trackers(accelerator: Any, cfg: RunConfig) -> None:
    """Start the chosen tracker; W&B writes its run folder under <run>/ (offline with WANDB_MODE=offline)."""
    if cfg.train.report_to == "none":
        return
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.report_to == "trackio":
        # trackio keeps a local SQLite database per project; keep it with the run unless the user chose
        # a place (read when trackio is first imported, which init_trackers does).
        os.environ.setdefault("TRACKIO_DIR", str(run_dir / "trackio"))
    kwargs = {"wandb": {"dir": str(run_dir), "name": cfg.name}} if cfg.train.report_to == "wandb" else {}
    flat = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in flatten(to_dict(cfg)).items()}
    accelerator.init_trackers(cfg.train.project, config=flat, init_kwargs=kwargs)


class Progress:
    """tqdm bar over the run's global steps showing phase, the method's fields, loss, LR, tokens/s, and an
    ETA from FLOPs: (planned - done FLOPs) / FLOPs per second so far. A steps-based ETA would lie when
    phases differ in cost per step (a cheap coarse level early, the full model late)."""

    def __init__(self, total: int, initial: int, planned_flops: float, enabled: bool):
        fmt = "{l_bar}{bar}| {n_fmt}/{total_fmt} steps [{elapsed}{postfix}]"
        self.bar = tqdm(total=total, initial=initial, disable=not enabled, dynamic_ncols=True, unit="step",
                        bar_format=fmt)
        self.planned = float(planned_flops)
        self._last: tuple[float, int] | None = None
        self._start: tuple[float, float] | None = None  # (wall, flops) when this process started training

    def update(self, n: int, phase: str, loss: float, lr: float, wall: float, tokens: int, flops: float = 0.0,
               extra: dict[str, Any] | None = None) -> None:
        """Advance by ``n`` steps and refresh the postfix (tokens/s since the previous update; ``extra``:
        the method's own fields, e.g. a stage or a frozen depth)."""
        tok_s = 0.0
        if self._last is not None and wall > self._last[0]:
            tok_s = (tokens - self._last[1]) / (wall - self._last[0])
        self._last = (wall, tokens)
        if self._start is None:
            self._start = (wall, flops)
        eta = ""
        done_wall, done_flops = wall - self._start[0], flops - self._start[1]
        if done_wall > 0 and done_flops > 0:
            eta = _clock(max(0.0, self.planned - flops) * done_wall / done_flops)
        self.bar.set_postfix(phase=phase, **(extra or {}), loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}",
                             eta=eta or "?", refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"
