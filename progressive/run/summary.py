"""End of a run: final Hugging Face checkpoint, plots, summary.json and the printed summary table.

The loss plots are drawn against the run's comparable baseline when one exists (``find_baseline``): a finished run
beside it (same ``output_dir``, as the methods of a ``--compare`` are) of method "baseline" whose saved config equals
this run's but for the method and the settings marked as not compared (progressive.config marks each field), at the
learning rate this run's baseline trains at (``train.baseline_lr``, as the main job's does, or ``train.lr``); the plot
says so when there is none.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from common.io import atomic_write_json
from common.quiet import no_save_bar
from common.table import format_table
from progressive.config import ConfigError, RunConfig, counted, flatten, load_config, to_dict
from progressive.model.flops import model_shape
from progressive.run import rundir
from progressive.run.accelerator import precision_record
from progressive.run.plots import plot_run
from progressive.run.tracking import METRICS, read_metrics, report_end

if TYPE_CHECKING:
    from progressive.run.loop import TrainingRun

FINAL = rundir.FINAL  # written whole, its files on the run's record (rundir.write_whole)
SUMMARY = "summary.json"  # written last: a folder holding it is a finished run
PLOTS = ("loss_vs_flops.png", "loss_vs_wallclock.png")  # progressive.run.plots.plot_run
NO_BASELINE = "no baseline overlaid: no finished baseline run with this config beside this run"


def _compared(tree: dict[str, Any]) -> dict[str, Any]:
    """The fields a comparable baseline shares: those that count (schema.counted), not its method, nor what the
    fields' marks say a comparison may differ in (how a run is watched or where it is stored, not what it
    computes)."""
    return {k: v for k, v in flatten(counted(tree, lambda m: m.compared)).items() if not k.startswith("method.")}


def find_baseline(cfg: RunConfig) -> Path | None:
    """The finished run of method "baseline" in a folder beside ``cfg``'s run (under the same output_dir)
    whose saved config.yaml equals ``cfg`` but for the method, the fields marked not compared and its learning rate,
    which is ``cfg``'s ``train.baseline_lr`` (the baseline's own LR, at which a comparison trains it: the main job's)
    or ``train.lr`` (a baseline trained alone from the same recipe); the former first, then the first by
    folder name. None when ``cfg`` is a baseline itself or no folder qualifies (unreadable configs are
    skipped)."""
    if cfg.method.name == "baseline" or not cfg.run_dir.parent.is_dir():
        return None
    mine = _compared(to_dict(cfg))
    lrs = [lr for lr in (cfg.train.baseline_lr, mine.pop("train.lr")) if lr is not None]
    found: dict[int, Path] = {}  # the index of its LR in lrs -> the first such folder
    for folder in sorted(p for p in cfg.run_dir.parent.iterdir() if p.is_dir() and p != cfg.run_dir):
        if not (folder / SUMMARY).is_file():
            continue
        try:
            other = load_config(folder / "config.yaml")
        except (ConfigError, OSError):
            continue
        theirs = _compared(to_dict(other))
        lr = theirs.pop("train.lr")
        if other.method.name == "baseline" and theirs == mine and lr in lrs:
            found.setdefault(lrs.index(lr), folder)
    return found[min(found)] if found else None


def run_plots(cfg: RunConfig) -> tuple[list[Path], Path | None]:
    """Draw <run>/loss_vs_flops.png and loss_vs_wallclock.png from its metrics, over the comparable baseline
    when there is one. Returns (the plots' paths, [] without matplotlib or with train.plots off; the baseline's
    folder or None)."""
    if not cfg.train.plots:  # a sweep's runs: no figures, nor the scan of every run beside it for a baseline
        return [], None
    taken = [name for name in PLOTS if not rundir.claim(cfg.run_dir, name)]
    if taken:  # put there by someone else while the run trained (a resume refuses one found at its start)
        print(f"warning: {cfg.run_dir / taken[0]} was not made by this run; the loss plots are not drawn over it",
              file=sys.stderr)
        return [], None
    base = find_baseline(cfg)
    note = "" if cfg.method.name == "baseline" else f"against the baseline run {base.name}/" if base else NO_BASELINE
    paths = plot_run(read_metrics(cfg.run_dir / METRICS), cfg.run_dir, f"{cfg.name} ({cfg.method.name})",
                     (base.name, read_metrics(base / METRICS)) if base else None, note)
    return paths, base


def param_count(family: Any, config: Any) -> int:
    """Parameters of a model of ``config`` (built on the meta device, so free); tied weights once."""
    model = family.build_model(config, meta=True)
    return sum(p.numel() for p in model.parameters())


def shape_str(config: Any) -> str:
    """"4L/256d/4h" for a transformer config."""
    return model_shape(config).label


def phase_rows(family: Any, phases: list, rows: list[dict[str, Any]], world: int = 1) -> list[dict[str, Any]]:
    """One summary row per phase from the metrics rows: its steps, tokens, FLOPs, seconds and last losses, and
    its model TFLOP/s per device without the steps that compiled (``compile_s`` of its seconds; a level whose
    shape ran before reuses its graph and compiles nothing)."""
    out, prev = [], {"tokens": 0, "flops": 0, "wall": 0.0}
    for i, ph in enumerate(phases):
        tr = [r for r in rows if r["kind"] == "train" and r["phase"] == i]
        va = [r for r in rows if r["kind"] == "val" and r["phase"] == i]
        end = tr[-1] if tr else prev
        row = {"phase": ph.name, "shape": shape_str(ph.config), "params": param_count(family, ph.config),
               "steps": ph.steps, "peak_lr": ph.peak_lr, "tokens": end["tokens"] - prev["tokens"],
               "flops": float(end["flops"] - prev["flops"]), "wall_s": float(end["wall"] - prev["wall"]),
               "train_loss": tr[-1]["loss"] if tr else float("nan"),
               "val_loss": va[-1]["val_loss"] if va else float("nan")}
        compile_s = float(end.get("compile_s", 0.0) - prev.get("compile_s", 0.0))
        seconds = row["wall_s"] - compile_s
        flops = row["flops"] - float(end.get("compile_flops", 0) - prev.get("compile_flops", 0))
        if "compile_s" in end:
            row["compile_s"] = round(compile_s, 3)
        row["tflops"] = float(f"{flops / seconds / world / 1e12:.4g}") if seconds > 0 and flops > 0 else None
        out.append(row)
        prev = end
    return out


def _claim(run_dir: Path, name: str) -> None:
    """Put ``name`` on the run's record before writing it; refuse (one line) when something the run did not make
    is there (put there while the run trained: a resume refuses one found at its start)."""
    if not rundir.claim(run_dir, name):
        raise FileExistsError(f"{run_dir / name} was not made by this run and is never replaced: move it out, then "
                              "resume the run (--resume) to write its final outputs")


def finish(run: TrainingRun, test_scores: dict[str, float] | None) -> dict[str, Any]:
    """Write <run>/final (save_pretrained model + tokenizer/image processor), the plots and summary.json of the
    trained ``run``; print the summary table. ``test_scores``: the test split's, if it has one. Returns the
    summary."""
    acc, run_dir, cfg = run.acc, Path(run.run_dir), run.cfg
    summary: dict[str, Any] = {}
    if acc.is_main_process:
        with rundir.write_whole(run_dir, FINAL) as tmp, no_save_bar():
            run.raw.save_pretrained(tmp)
            run.data.processor.save_pretrained(tmp)
        rows = read_metrics(run_dir / METRICS)
        train, val = [r for r in rows if r["kind"] == "train"], [r for r in rows if r["kind"] == "val"]
        phases = phase_rows(run.family, run.phases, rows, acc.num_processes)
        summary = {
            "run": cfg.name, "method": cfg.method.name, "family": cfg.model.family,
            "params": sum(p.numel() for p in run.raw.parameters()),
            "world_size": acc.num_processes, **precision_record(acc, cfg),  # as used: the launcher's if it chose
            "data": run.data.sizes(sum(p.steps for p in run.phases), cfg.train.batch_size),
            "steps": train[-1]["step"] if train else 0,
            "tokens": train[-1]["tokens"] if train else 0, "flops": train[-1]["flops"] if train else 0,
            "train_wall_s": train[-1]["wall"] if train else 0.0,
            "final_train_loss": train[-1]["loss"] if train else None,
            "final_val_loss": val[-1]["val_loss"] if val else None,
            "phases": phases, "transitions": run.transitions,
            # the whole test split, evaluated once at the end (data.test_fraction > 0; nothing is tuned on it)
            **({"final_test_loss": test_scores["val_loss"], "test_samples": len(run.data.test)}
               if test_scores else {}),
            "final_checkpoint": str(run_dir / FINAL), "metrics": str(run_dir / METRICS),
            # train.branches: the WSD cooldowns forked off this run (progressive/run/branches.py)
            **({"branches": run.branches.rows} if run.branches.rows else {}),
        }
        plots, base = run_plots(cfg)
        summary.update(plots=[str(p) for p in plots], plot_baseline=str(base) if base else None)
        _claim(run_dir, SUMMARY)
        atomic_write_json(run_dir / SUMMARY, summary)
        report_end(acc, cfg, summary, run.transitions, plots, run_dir / FINAL)
        cols = ["phase", "shape", "params", "steps", "peak_lr", "tokens", "flops", "wall_s", "tflops", "train_loss",
                "val_loss"]
        print(f"\n{cfg.name}: {cfg.method.name} on {cfg.model.family}, {summary['steps']} steps, "
              f"{summary['flops']:.3g} FLOPs, {summary['train_wall_s']:.1f}s training, "
              f"final val loss {summary['final_val_loss']:.4f}"
              + (f", test loss {summary['final_test_loss']:.4f}" if "final_test_loss" in summary else ""))
        print(format_table(phases, cols))
        files = ["metrics.jsonl", "final/", *(Path(p).name for p in summary["plots"]), SUMMARY]
        print(f"outputs: {run_dir}/ ({', '.join(files)})")
        if plots and cfg.method.name != "baseline":
            print(f"loss plots drawn against the baseline run {base}" if base else
                  f"loss plots: {NO_BASELINE} in {run_dir.parent}/ (train one there with --method.name baseline "
                  f"--name <name>, or compare with --compare baseline,{cfg.method.name})")
    acc.wait_for_everyone()
    torch.set_grad_enabled(True)
    return summary
