"""What the three paper commands share: cached runs and evaluations, progress with an ETA, savings against a
baseline's own curve, and the data each command records for its page (bench/papers/__main__.py; the page is
``python -m bench.pages``'s, bench/pages/papers.py)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.lib.envelope import curve, frontier, pct, saving, spread  # noqa: F401  (the pages use core.pct, core.spread)
from bench.lib.runs import machine, record, run, summary
from bench.lib.tracking import Entry, train_curve
from common.io import atomic_write_json
from eval.glue import GlueConfig, run_glue
from progressive.config import load_config
from progressive.config.schema import PATHS, mark

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"  # where each command records papers_<paper>.json and its figure

# the bundled GLUE dev sets (WNLI is excluded from the average, as in the papers)
GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qnli", "rte")


@dataclass
class Context:
    """One invocation: where runs go, whether it is the smoke scale, and the work still to do (for the ETA)."""

    paper: str
    out: Path
    smoke: bool
    frontier_results: Path
    frontier_out: Path
    units: float = 0.0  # estimated work left, in "units" (a unit ~ one default-sized training run)
    done_units: float = 0.0
    t0: float = field(default_factory=time.time)
    commands: list[str] = field(default_factory=list)
    runs: list[tuple[str, str, Path]] = field(default_factory=list)  # (label, cell, folder) of every run made or reused

    def plan(self, units: float) -> None:
        """Add ``units`` of expected work (called before it starts, so the ETA covers it)."""
        self.units += units

    def step(self, what: str, units: float = 1.0) -> None:
        """One piece of work finished: print it with the ETA of what is left."""
        self.done_units += units
        spent = time.time() - self.t0
        left = max(0.0, self.units - self.done_units)
        eta = spent / self.done_units * left if self.done_units else 0.0
        print(f"[{self.paper} {self.done_units:.0f}/{self.units:.0f}, {spent / 60:.1f} min, ETA {eta / 60:.1f} min] "
              f"{what}", flush=True)


def train(ctx: Context, recipe: str | Path, overrides: dict[str, Any], label: str,
          root: Path | None = None, cell: str | None = None) -> tuple[list[dict[str, Any]], Path, dict[str, Any]]:
    """(metrics rows, run folder, summary) of a run: trained now or reused (bench.lib.runs caches by config hash).
    ``cell``: the page's cell the run belongs to (the model or task it is compared within; its W&B group)."""

    cfg = load_config(ROOT / recipe, {"train.progress": False, "train.report_to": "none", **overrides})
    rows, folder = run(cfg, root or ctx.out, label)
    record_command(ctx, recipe, overrides)
    ctx.step(f"{label}: {folder.name}")
    ctx.runs.append((label, cell or label, folder))
    return rows, folder, summary(folder)


def tracker_entries(ctx: Context, results: Path) -> list:
    """For ``--report_to``: each run this command made or reused as a W&B run grouped by its cell
    (``papers/<paper>/<cell>``), with its training curve and summary, and one run of the page's figures (in
    ``results``)."""

    keep = ("final_val_loss", "final_test_loss", "final_train_loss", "flops", "tokens", "train_wall_s", "steps")
    out = [Entry(name=f"papers/{ctx.paper}/{label}", group=f"papers/{ctx.paper}/{cell}", history=train_curve(folder),
                 summary={k: v for k, v in summary(folder).items() if k in keep}, config={"label": label, "cell": cell})
           for label, cell, folder in ctx.runs]
    figures = {p.stem: p for p in sorted(Path(results).glob(f"{ctx.paper}*.png"))}
    return out + [Entry(name=f"papers/{ctx.paper}/results", group=f"papers/{ctx.paper}", images=figures,
                        tags=("results",))]


def record_command(ctx: Context, recipe: str | Path, overrides: dict[str, Any], launcher: str = "python") -> None:
    """Keep the ``python train.py`` line of a run (``launcher``: how it starts) for the commands section: the
    overrides that reproduce its numbers, read from each field's mark (not how it is watched, where it lies, nor
    where this machine caches its data)."""
    def shown(key: str) -> bool:
        m = mark(key)
        return m.name not in ("bookkeeping", "place") and not (key in PATHS and m.name == "records")

    ctx.commands.append(f"{launcher} train.py --config {recipe} "
                        + " ".join(f"--{k} {_arg(v)}" for k, v in overrides.items() if shown(k)))


def _arg(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (list, dict, bool)) else str(v)


def cached(path: Path, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``compute()`` once; its JSON result is kept at ``path`` and read back on a re-run."""
    if path.is_file():
        return json.loads(path.read_text())

    result = compute()
    atomic_write_json(path, result)
    return result


def zeroshot(ctx: Context, folder: Path, tasks: tuple[str, ...]) -> dict[str, Any]:
    """Zero-shot scores of ``folder/final`` on ``tasks`` (bundled files), cached beside the run."""
    from eval.zeroshot import ZeroShotConfig, run  # here: its `run` would hide bench.lib.runs.run

    limit = 2 if ctx.smoke else None  # --smoke: 2 words, so one passage, page line or sentence a task
    path = folder / f"papers_zeroshot_{'_'.join(tasks)}{'_smoke' if ctx.smoke else ''}.json"

    def go() -> dict[str, Any]:
        res = run(ZeroShotConfig(checkpoint=str(folder / "final"), tasks=tasks, limit=limit, batch_size=16,
                                 output=str(folder / "papers_zeroshot_raw.json")))
        return res["results"]

    res = cached(path, go)
    ctx.step(f"zero-shot {folder.name}")
    return res


def glue(ctx: Context, folder: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """GLUE dev scores of ``folder/final`` fine-tuned on the bundled tasks with ``settings`` (cached beside it)."""

    tag = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]

    def go() -> dict[str, Any]:
        return run_glue(GlueConfig(checkpoint=str(folder / "final"), cpu=True, **settings))

    res = cached(folder / f"papers_glue_{tag}.json", go)
    ctx.step(f"GLUE {folder.name}", units=len(settings.get("tasks", GLUE_TASKS)) / 2)
    return res


def glue_settings(settings: dict[str, Any], skipped: set[str]) -> dict[str, Any]:
    """What a GLUE table ran, for its caption: the dev sets scored and those skipped, the fine-tuning recipe."""
    keep = ("lrs", "seeds", "epochs", "max_train_samples", "max_eval_samples", "max_seq_len")
    return {"tasks": [t for t in settings["tasks"] if t not in skipped], "skipped": sorted(skipped),
            **{k: settings[k] for k in keep}}


def glue_scores(res: dict[str, Any]) -> dict[str, float]:
    """{task: its score x100 (mean of its metrics, over seeds)} and "average" (GLUE's convention)."""
    import numpy as np

    out = {t: 100 * float(np.mean(list(m.values()))) for v in res["tasks"].values() for t, m in v["mean"].items()}
    out["average"] = res["glue_average"]
    return out


def saved(base_rows: list[dict[str, Any]], rows: list[dict[str, Any]], axis: str) -> tuple[float, str]:
    """The run's saving on ``axis`` against the baseline's own curve at the run's final validation loss (the
    papers' protocol: the cost at which the baseline first reached that loss), as (fraction, kind): kind "="
    interpolated, ">=" / "<=" bounds where the loss lies outside the baseline's range (bench.lib.envelope)."""
    final = [r for r in rows if r["kind"] == "val"][-1]
    return saving(float(final[axis]), frontier(curve(base_rows, axis)), float(final["val_loss"]))


def plot_curves(panels: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """Validation loss vs training FLOPs: one panel per title, one line per run (``{"rows": metrics}``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (title, runs) in zip(axes[0], panels.items()):
        for name, r in runs.items():
            pts = curve(r["rows"], "flops")
            ax.plot([c for _, c in pts], [v for v, _ in pts], marker=".", label=name)
        ax.set(title=title, xlabel="training FLOPs", ylabel="validation loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_info(ctx: Context, wall_s: float) -> dict[str, Any]:
    """The page's header: the command that regenerates its data, the machine and library versions, the command's
    wall time in seconds (runs reused from the cache cost nothing)."""
    import accelerate
    import transformers

    return {"command": f"python -m bench.papers {ctx.paper}{' --smoke' if ctx.smoke else ''}", "machine": machine(),
            "transformers": transformers.__version__, "accelerate": accelerate.__version__, "wall_s": wall_s}


def commands(ctx: Context) -> list[str]:
    """The training commands behind the runs, each once (the run folders also keep each config.yaml)."""
    return list(dict.fromkeys(ctx.commands))


def write_data(ctx: Context, results: Path, data: dict[str, Any]) -> Path:
    """Record the page's ``data`` as ``results/papers_<paper>.json`` (atomically; bench.lib.runs.record)."""
    return record(results, f"papers_{ctx.paper}", data, f"python -m bench.papers {ctx.paper}")
