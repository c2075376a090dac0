"""Where numbers go: metrics.jsonl (always), Accelerate trackers (``--train.report_to``), the progress bar
(tqdm on a terminal, plain lines in a log file) and the plan stated in the budget's terms.

Every train row of metrics.jsonl has: kind="train", step, phase (index), phase_name, tokens, flops (cumulative
training FLOPs), wall (cumulative training seconds: steps and transitions, not evaluation or checkpoint I/O; device
time, synchronized), loss (mean over the steps since the previous row), lr, and the speed since the previous train row
(``MEASURED``: tok_s, tflops and mfu per device, mem_gb, batch_ms, wait_ms). Val rows have kind="val" and val_loss
(and val_accuracy for classification) instead of loss/lr; a method may add its own fields to train rows (e.g. stage,
depth, frozen). Only the main process writes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tqdm.auto import tqdm

from common.io import atomic_write_text
from common.trackers import wandb_offline_fallback
from progressive.config import ConfigError, RunConfig, flatten, to_dict
from progressive.methods import phase_flops
from progressive.run import rundir

METRICS = "metrics.jsonl"
# Keys of a row that measure time or memory rather than training: the only ones a resumed or re-run run may change.
# tok_s / tflops / mfu: speed since the previous train row (device time); mem_gb: peak memory so far; batch_ms /
# wait_ms: building the batch and waiting for it, per step (progressive/run/feed.py).
MEASURED = ("wall", "compile_s", "samples_per_s", "tok_s", "tflops", "mfu", "mem_gb", "batch_ms", "wait_ms")


def say(msg: str) -> None:
    """Print a line on stderr on the main process only (before the Accelerator exists: RANK from the launcher)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, file=sys.stderr, flush=True)


_ROW = {"kind": str, "step": int, "phase": int, "tokens": (int, float), "flops": (int, float), "wall": (int, float)}
_WARNED_LINES: set[tuple[str, int]] = set()


def is_row(obj: Any) -> bool:
    """Whether ``obj`` (one parsed line of a metrics.jsonl) is a row this project wrote: a train or val row with
    its counters (step, phase, tokens, FLOPs and wall-clock as numbers)."""
    return (isinstance(obj, dict) and obj.get("kind") in ("train", "val")
            and all(isinstance(obj.get(k), t) and not isinstance(obj.get(k), bool) for k, t in _ROW.items()))


def _lines(path: Path) -> list[tuple[str, bool, dict[str, Any] | None]]:
    """(line, whether it parses, its row or None) for every line of a metrics.jsonl: a torn line (a crash while
    it was written) does not parse; a line that parses but is not this project's row (a note added by hand) has
    no row, with a warning naming the file and line (once per line and process)."""
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            out.append((line, False, None))
            continue
        if not is_row(row):
            if (str(path), n) not in _WARNED_LINES:
                _WARNED_LINES.add((str(path), n))
                print(f"warning: {path}, line {n}: not a metrics row of this project (a train or val row with "
                      "step, phase, tokens, flops and wall); skipped", file=sys.stderr)
            row = None
        out.append((line, True, row))
    return out


def read_metrics(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl, optionally of one kind: a torn last line from a crash is skipped, and so is a line
    that is not this project's row (with a warning naming the file and line)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [row for _, _, row in _lines(path) if row is not None and (kind is None or row["kind"] == kind)]


def check_tracker(report_to: str, run_dir: Path) -> str | None:
    """Fail early (before data loads or any folder is made) when the chosen tracker's package is missing; for
    W&B without a login, switch to offline logging. Returns a warning to print, or None."""
    if report_to != "none" and importlib.util.find_spec(report_to) is None:
        raise ConfigError(f"train.report_to: {report_to!r} is not installed (pip install {report_to}, or every "
                          "tracker: pip install 'growtrain[trackers]'), or use --train.report_to none")
    if report_to == "wandb":

        return wandb_offline_fallback(str(Path(run_dir) / "wandb"))
    return None


class MetricsLog:
    """Appends rows to <run>/metrics.jsonl and forwards numeric fields to the Accelerate trackers."""

    def __init__(self, run_dir: Path, accelerator: Any, keep_until_step: int | None = None):
        self.path = Path(run_dir) / METRICS
        self.acc = accelerator
        self.main = accelerator.is_main_process
        if self.main:

            rundir.claim(self.path.parent, METRICS)  # on the run's record before the run makes it
        if self.main and keep_until_step is not None and self.path.is_file():
            # Resuming: drop rows written after the checkpoint (and torn lines), so the file reads like one
            # unbroken run; lines that are not rows (a note added by hand) stay where they were
            kept = [line for line, parses, r in _lines(self.path)
                    if parses and (r is None or r["step"] <= keep_until_step)]
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


def tracker_config(cfg: RunConfig, keep_none: bool = True) -> dict[str, Any]:
    """The run's config, flattened, as a tracker shows it: only the running method's options (a V-cycle run
    carries no ``method.apollo.*``); ``None`` stays null where the tracker takes it (W&B), else "None"."""
    out = {}
    for key, value in flatten(to_dict(cfg)).items():
        parts = key.split(".")
        if parts[0] == "method" and len(parts) > 2 and parts[1] != cfg.method.name:
            continue
        if value is None and keep_none:
            out[key] = None
        else:
            out[key] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def wandb_labels(cfg: RunConfig, job_type: str = "train") -> dict[str, Any]:
    """W&B's group (``train.group``, else the run's name), tags (method, family, budget, seed) and job type."""
    tags = [cfg.method.name, cfg.model.family, f"budget-{cfg.train.steps}", f"seed-{cfg.train.seed}"]
    return {"group": cfg.train.group or cfg.name, "tags": tags, "job_type": job_type}


def tracker_entries(cfg: RunConfig) -> tuple[str, ...]:
    """The top-level entries the chosen tracker makes in the run folder (TensorBoard: a folder named after the
    project, as Accelerate names it; W&B: its folder and the file of the run's id; trackio: its database, unless
    TRACKIO_DIR puts it elsewhere)."""
    return {"wandb": ("wandb", WANDB_ID), "tensorboard": (cfg.train.project,),
            "trackio": () if "TRACKIO_DIR" in os.environ else ("trackio",)}.get(cfg.train.report_to, ())


def init_trackers(accelerator: Any, cfg: RunConfig) -> None:
    """Start the chosen tracker; W&B writes its run folder under <run>/ (offline with WANDB_MODE=offline), in
    the run's group, with its tags and job type; W&B and trackio name the run as the run folder is named (a
    comparison's method runs "<comparison>/<method>"), and a resumed run continues the same tracker run."""
    if cfg.train.report_to == "none":
        return
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.report_to == "trackio":
        # trackio keeps a local SQLite database per project; keep it with the run unless the user chose
        # a place (read when trackio is first imported, which init_trackers does).
        os.environ.setdefault("TRACKIO_DIR", str(run_dir / "trackio"))
    kwargs = {}
    labels = wandb_labels(cfg)
    name = cfg.name if labels["group"] == cfg.name else f"{labels['group']}/{cfg.name}"  # a compare's run
    if cfg.train.report_to == "wandb":  # a resumed run continues the same W&B run
        kwargs = {"wandb": {"dir": str(run_dir), "name": name, "id": wandb_run_id(run_dir, accelerator),
                            "resume": "allow", **labels}}
    if cfg.train.report_to == "trackio":  # the run's name (not a random one), in its group; a resume continues it
        kwargs = {"trackio": {"name": name, "group": labels["group"], "resume": "allow"}}
    config = tracker_config(cfg, keep_none=cfg.train.report_to == "wandb")
    accelerator.init_trackers(cfg.train.project, config=config, init_kwargs=kwargs)
    if cfg.train.report_to == "wandb" and accelerator.is_main_process:
        flops_x_axis(accelerator.get_tracker("wandb", unwrap=True))


# what a W&B run's summary carries at the end (keys of summary.json), beside the last logged values
HEADLINE = ("final_val_loss", "final_test_loss", "final_train_loss", "params", "flops", "tokens", "steps",
            "train_wall_s")


def report_end(accelerator: Any, cfg: RunConfig, summary: dict[str, Any], transitions: list[dict[str, Any]],
               plots: list[Path], final: Path | None) -> None:
    """Main process, at the end of a run logged to W&B: the headline numbers into the run's summary (with the
    last train row's throughput), the level changes and freezes as a table of events, the loss plots as
    images, and, with ``train.log_checkpoint``, final/ as a model artifact."""
    if cfg.train.report_to != "wandb" or not accelerator.is_main_process:
        return
    import wandb

    run = accelerator.get_tracker("wandb", unwrap=True)
    head = {k: summary[k] for k in HEADLINE if summary.get(k) is not None}
    train = read_metrics(Path(cfg.run_dir) / METRICS, "train")
    last = train[-1] if train else {}
    head.update({k: last[k] for k in ("tok_s", "tflops", "mfu", "mem_gb") if last.get(k) is not None})
    # each level's model TFLOP/s per device, the steps that compiled left out (progressive.run.summary.phase_rows)
    head.update({f"phase/{p['phase']}/tflops": p["tflops"] for p in summary.get("phases", [])
                 if p.get("tflops") is not None})
    run.summary.update(head)
    if transitions:
        cols = ["step", "to", "note", "seconds"]
        run.log({"events": wandb.Table(columns=cols, data=[[t.get(c) for c in cols] for t in transitions]),
                 "flops": float(summary.get("flops") or 0)})
    images = {f"plots/{Path(p).stem}": wandb.Image(str(p)) for p in plots if Path(p).is_file()}
    if images:
        run.log({**images, "flops": float(summary.get("flops") or 0)})
    if cfg.train.log_checkpoint and final is not None and Path(final).is_dir():
        art = wandb.Artifact(f"{cfg.name}-final", type="model", metadata=head)
        art.add_dir(str(final))
        run.log_artifact(art)


def report_comparison(cfg: RunConfig, root: Path, result: dict[str, Any], figure: Path | None) -> None:
    """A ``--compare`` logged to W&B: one run of job type "compare" in the comparison's group (where its method
    runs are), whose summary holds each method's % saved (FLOPs and wall-clock) and final losses, with the
    table and the figure."""
    if cfg.train.report_to != "wandb":
        return
    import wandb

    wandb_offline_fallback(str(root / "wandb"))
    group = cfg.train.group or cfg.name
    run = wandb.init(project=cfg.train.project, dir=str(root), name=f"{group}/compare", group=group,
                     job_type="compare", tags=["compare", cfg.model.family, f"budget-{cfg.train.steps}",
                                               f"seed-{cfg.train.seed}"],
                     config={"reference": result["reference"], **tracker_config(cfg)})
    head = {"target_val_loss": result["target_val_loss"]}
    for row in result["results"]:
        for key in ("flops_saved_%", "wall_saved_%", "wall_saved_excl_compile_%", "final_val_loss"):
            if key not in row:  # the compile-free saving exists only under train.compile
                continue
            value = row[key]  # "not reached": null, and reached = false
            head[f"{row['method']}/{key.replace('_%', '_pct')}"] = value if isinstance(value, (int, float)) else None
        head[f"{row['method']}/reached"] = row.get("flops_to_target") is not None
    run.summary.update(head)
    # one type per column: "not reached" becomes null beside a "reached" column
    cols = [*result["results"][0], "reached"]
    data = [[r.get(c) if c == "method" or not isinstance(r.get(c), str) else None for c in cols[:-1]]
            + [r.get("flops_to_target") is not None] for r in result["results"]]
    log = {"compare": wandb.Table(columns=cols, data=data)}
    if figure is not None and Path(figure).is_file():
        log["compare_plot"] = wandb.Image(str(figure))
    run.log(log)
    run.finish()
    wandb.teardown()


WANDB_ID = "wandb_run_id"  # in the run folder: the W&B run a resumed run continues


def wandb_run_id(run_dir: Path, accelerator: Any) -> str:
    """The W&B run id of the run in ``run_dir``: the one saved there, else a new one saved by the main process
    (a fresh start empties the folder first, so a new run gets a new id). Every process returns the same id."""
    path = Path(run_dir) / WANDB_ID
    if accelerator.is_main_process and not path.is_file():


        atomic_write_text(path, secrets.token_hex(4) + "\n")
    accelerator.wait_for_everyone()
    return path.read_text().strip()


def flops_x_axis(run: Any) -> None:
    """Make cumulative training FLOPs the x-axis of every metric of a W&B ``run`` (the project's unit: a
    V-cycle's cheap steps would stretch a steps axis); tokens stay a metric, so a chart can switch to them.
    Every row the trainer logs holds both. TensorBoard has no such setting: its x-axis is the step."""
    run.define_metric("flops")  # the documented pattern: declare the axes, then point the metrics at one
    run.define_metric("tokens")
    run.define_metric("*", step_metric="flops")


def budget_plan(phases: list, step_flops: Callable[..., int], budget_steps: int,
                full_config: Any) -> tuple[str, str, float]:
    """The plan in the budget's terms: (a line to print at the start, the progress bar's label, the budget
    in FLOPs).

    ``train.steps`` is a FLOPs budget: that many optimizer steps of the full model (``full_config``). A
    phase whose steps cost less (a coarse V-cycle level, Apollo's shallow stages) runs more of them for
    the same FLOPs, so a plan may hold more optimizer steps than ``budget_steps``; the line says which phase
    adds them and what one of its steps costs. Computed from the phases alone: any method."""
    full = step_flops(full_config)
    budget = budget_steps * full
    parts, planned = [], 0
    for p in phases:
        flops = phase_flops(p, step_flops)
        planned += flops
        cost = flops / (p.steps * full)
        parts.append(f"{p.name} {p.steps}" + (f" (a step costs {cost:.2f}x)" if abs(cost - 1) > 0.005 else ""))
    steps = sum(p.steps for p in phases)
    line = (f"budget: {budget_steps} full-model steps of FLOPs = {budget:.2g}; the plan runs {steps} optimizer "
            f"steps: {', '.join(parts)}")
    if abs(planned / budget - 1) > 0.01:
        line += f"; {planned / budget:.0%} of the budget's FLOPs"
    return line, f"budget {budget_steps} full-model steps", float(budget)


def start_progress(cfg: RunConfig, phases: list, step_flops: Callable[..., int], full_config: Any, initial: int,
                   main: bool, runs_after: int = 0) -> Progress:
    """Print the plan in the budget's terms (main process; at every start and resume) and start the progress
    display at step ``initial`` (shown on the main process when ``train.progress``). ``runs_after``: runs of
    the same job still to come after this one (a comparison's), each on the same FLOPs budget: the display
    adds a whole-job ETA."""
    line, label, budget = budget_plan(phases, step_flops, cfg.train.steps, full_config)
    if main:
        print(line, file=sys.stderr, flush=True)
    planned = sum(phase_flops(p, step_flops) for p in phases)
    return Progress(sum(p.steps for p in phases), initial, planned, cfg.train.progress and main, label, budget,
                    later_flops=runs_after * budget)


class Progress:
    """Progress over the run's optimizer steps: phase, the method's fields, loss, LR, tokens/s, the share of
    the FLOPs budget spent, and an ETA from FLOPs: (planned - done FLOPs) / FLOPs per second so far. A
    steps-based ETA would lie when phases differ in cost per step (a cheap coarse level early, the full
    model late). In a job of several runs (``later_flops``: the FLOPs of the runs after this one) ``job_eta``
    adds theirs at this run's FLOPs per second: when the whole job ends, not only this run.

    On a terminal it is a tqdm bar. When the stream is not a terminal (a SLURM log, a pipe) a bar would
    redraw itself with carriage returns into one line of hundreds of KB, so it prints a plain line instead
    at the first update, every ``1/PLAIN_LINES`` of the steps and at the end: at most PLAIN_LINES + 1."""

    PLAIN_LINES = 50

    def __init__(self, total: int, initial: int, planned_flops: float, enabled: bool, label: str = "",
                 budget_flops: float | None = None, stream: TextIO | None = None, later_flops: float = 0.0):
        self.stream = stream or sys.stderr
        self.plain = enabled and not _is_tty(self.stream)
        fmt = "{desc}{bar}| {n_fmt}/{total_fmt} optimizer steps [{elapsed}{postfix}]"
        self.bar = tqdm(total=total, initial=initial, disable=not enabled or self.plain, dynamic_ncols=True,
                        unit="step", bar_format=fmt, desc=f"{label} " if label else "", file=self.stream)
        self.total, self.n = total, initial
        self.planned = float(planned_flops)
        self.budget = float(budget_flops or planned_flops)
        self.later = float(later_flops)
        self._last: tuple[float, int] | None = None
        self._start: tuple[float, float] | None = None  # (wall, flops) when this process started training
        self._printed: int | None = None  # the plain-line slot (0 .. PLAIN_LINES) printed last

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
        self.n += n
        eta = job_eta = ""
        done_wall, done_flops = wall - self._start[0], flops - self._start[1]
        if done_wall > 0 and done_flops > 0:  # a method that saves FLOPs as it goes (AutoFreeze) ends early
            left = max(0.0, self.planned - flops) if self.n < self.total else 0.0
            eta = _clock(left * done_wall / done_flops)
            job_eta = _clock((left + self.later) * done_wall / done_flops)
        fields = {"phase": phase, **(extra or {}), "loss": f"{loss:.4f}", "lr": f"{lr:.2e}",
                  "tok_s": f"{tok_s:,.0f}", "budget": f"{flops / self.budget:.0%}", "eta": eta or "?"}
        if self.later:
            fields["job_eta"] = job_eta or "?"
        if self.plain:
            self._plain_line(fields, wall)
        self.bar.set_postfix(ordered_dict=fields, refresh=False)  # in this order, not sorted
        self.bar.update(n)

    def _plain_line(self, fields: dict[str, Any], wall: float) -> None:
        slot = self.n * self.PLAIN_LINES // max(self.total, 1)
        if self._printed is not None and slot == self._printed and self.n < self.total:
            return
        self._printed = slot
        text = " ".join(f"{k}={v}" for k, v in fields.items() if k != "budget")
        print(f"step {self.n}/{self.total} ({self.n / max(self.total, 1):.0%}), {fields['budget']} of the FLOPs budget "
              f"spent: {text} train_time={_clock(wall)}", file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """Print a line (a level change, a freeze) without breaking the bar."""
        self.bar.write(line, file=self.stream)

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"
