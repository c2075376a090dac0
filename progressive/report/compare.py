"""``train.py --compare baseline,vcycle``: run methods on the same data, budget and seed; quote savings.

The first method is the reference. Its final validation loss is the target; for every method we find the
first evaluation at which its validation loss is at or below the target and read the cumulative training
FLOPs and wall-clock there (no interpolation between evaluations: the cost is rounded *up* to the next
evaluation, so a saving is never overstated by more than the evaluation spacing allows). The saving is
1 - cost(method) / cost(reference), where the reference's cost is where it first reaches its own final
loss (normally its last step). A method that never reaches the target gets no saving ("not reached").
With ``train.compile`` the wall-clock saving is also given without the seconds spent compiling (each level change
compiles again; a long run amortises that, a short comparison does not).
"""

from __future__ import annotations

import gc
import json
import os
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.cli import program
from common.io import atomic_write_json, atomic_write_text
from common.table import format_table
from progressive.config import ConfigError, RunConfig, dump_yaml, resume_diff, to_dict, validate
from progressive.config.reader import read_yaml
from progressive.run import checkpoint as ckpt
from progressive.run import rundir
from progressive.run.plots import plot_compare
from progressive.run.start import decide
from progressive.run.stop import Stopped, stopping
from progressive.run.summary import SUMMARY, run_plots
from progressive.run.tracking import METRICS, read_metrics, report_comparison, say
from progressive.run.trainer import FINISHED, Trainer, run_inputs


def first_reach(rows: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first val row with val_loss <= target, or None."""
    for r in rows:
        if r["kind"] == "val" and r["val_loss"] <= target:
            return r
    return None


def savings(runs: dict[str, list[dict[str, Any]]], reference: str) -> tuple[float, list[dict[str, Any]]]:
    """(target loss, one table row per run) from the runs' metrics rows; see the module docstring."""
    val = {m: [r for r in rows if r["kind"] == "val"] for m, rows in runs.items()}
    target = val[reference][-1]["val_loss"]
    ref_hit = first_reach(val[reference], target)
    table = []
    for m, rows in runs.items():
        train = [r for r in rows if r["kind"] == "train"]
        hit = first_reach(val[m], target)
        row = {"method": m, "final_val_loss": val[m][-1]["val_loss"], "final_train_loss": train[-1]["loss"],
               "steps": train[-1]["step"], "flops": float(train[-1]["flops"]), "wall_s": train[-1]["wall"],
               "flops_to_target": float(hit["flops"]) if hit else None,
               "wall_to_target_s": hit["wall"] if hit else None,
               "flops_saved_%": round(100 * (1 - hit["flops"] / ref_hit["flops"]), 2) if hit else "not reached",
               "wall_saved_%": round(100 * (1 - hit["wall"] / ref_hit["wall"]), 2) if hit else "not reached"}
        if "compile_s" in ref_hit:  # train.compile: the same saving without the compilations (a one-off cost that
            def net(r: dict[str, Any]) -> float:  # a long run amortises; a level change compiles again)
                return r["wall"] - r["compile_s"]
            row["compile_s"] = train[-1].get("compile_s", 0.0)
            row["wall_saved_excl_compile_%"] = round(100 * (1 - net(hit) / net(ref_hit)), 2) if hit else "not reached"
        table.append(row)
    return target, table


# how a sentence names a method (others by their recipe name)
NAMES = {"baseline": "the baseline", "vcycle": "the V-cycle", "apollo": "Apollo", "autofreeze": "AutoFreeze"}


def _name(method: str) -> str:
    return NAMES.get(method, method)


def header(cfg: RunConfig, methods: list[str], method: str, reused: bool = False) -> str:
    """The line that opens each run of a comparison: "1 of 2: the baseline, gpt2 4x128 at learning rate 0.001 (...)"."""
    i, n = methods.index(method) + 1, len(methods)
    own = method == "baseline" and cfg.train.baseline_lr is not None
    lr = cfg.train.baseline_lr if own else cfg.train.lr
    text = (f"{i} of {n}: {_name(method)}, {cfg.model.family} {cfg.model.num_layers}x{cfg.model.hidden_size} at "
            f"learning rate {lr:g}{' (its own: train.baseline_lr)' if own else ''}")
    if reused:
        return f"\n=== {text}: finished earlier, reused ==="
    after = " on the same data, budget and seed" if i > 1 else ""
    return f"\n=== {text}{after}{'; then the saving' if i == n else ''} ==="


def said(table: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], target: float,
         phases: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One plain sentence per method after the reference (the first row of ``table``): whether it reached the
    reference's final validation loss ``target``, with how many fewer (or more) FLOPs and how much less training
    time, and in which phase (``phases``: each method's summary rows, with their model's shape)."""
    ref = _name(table[0]["method"])
    out = []
    for row in table[1:]:
        m = row["method"]
        if row["flops_to_target"] is None:
            out.append(f"{_name(m)[0].upper()}{_name(m)[1:]} did not reach {ref}'s final validation loss "
                       f"({target:.4f}) within the budget: it ended at {row['final_val_loss']:.4f}.")
            continue
        fl = row["flops_saved_%"]
        # compiled: the training time without compilation (a long run amortises it; a short one would flatter)
        wall = row.get("wall_saved_excl_compile_%", row["wall_saved_%"])
        text = (f"{_name(m)[0].upper()}{_name(m)[1:]} reached {ref}'s final validation loss ({target:.4f}) with "
                f"{abs(fl):.1f}% {'fewer' if fl >= 0 else 'more'} FLOPs and {abs(wall):.1f}% "
                f"{'less' if wall >= 0 else 'more'} training time"
                + (" (compilation left out)" if "wall_saved_excl_compile_%" in row else ""))
        hit = first_reach(runs[m], target)
        own = phases.get(m) or []
        if len(own) > 1 and hit is not None and hit.get("phase") is not None and hit["phase"] < len(own):
            at = own[hit["phase"]]
            text += f", while training its {at['shape']} model (phase {at['phase']})"
        out.append(text + ".")
    return out


def context(cfg: RunConfig) -> str:
    """What a saving against the baseline means, printed under every comparison whose reference is the baseline."""
    lr = (f"the baseline at its own learning rate {cfg.train.baseline_lr:g} (train.baseline_lr), the method at "
          f"{cfg.train.lr:g}" if cfg.train.baseline_lr is not None else
          f"both at this recipe's learning rate {cfg.train.lr:g} (train.baseline_lr gives the baseline its own)")
    return ("\nWhat this saving is: each method against the baseline of its own size on the same data, budget and "
            f"seed, one run each (the papers' protocol); {lr}. It is not a saving against the best baseline of any "
            "size: on the same FLOPs a smaller model trained directly can reach a lower loss, and at the default "
            "recipe's scale no method saves compute against that compute-optimal envelope (README, Results; "
            "docs/results/frontier.md, python -m bench.frontier).")


def compare_command(cfg: RunConfig, methods: list[str]) -> str:
    """The command that resumes a comparison (--resume reads the config it saved in its folder)."""

    return (f"{program()} --compare {','.join(methods)} --resume --name {shlex.quote(cfg.name)} "
            f"--output_dir {shlex.quote(str(cfg.output_dir))}")


REPORTS = ("compare.json", "compare.md", "compare.png")  # written whole at the end of every comparison


def check_resumable(root: Path, cfg: RunConfig, methods: list[str], folder: rundir.RunFolder | None = None) -> None:
    """``--resume`` of the comparison in ``root`` continues what was started: the same methods in the same order
    (the first is the reference), and the recipe it saved (config.yaml) but for what a resume may change.
    ``folder``: ``root`` as its marker says (``rundir.look``), when the caller has read it.

    Raises:
        ConfigError: in one line, naming what differs and the command that resumes.
    """

    folder = folder or rundir.look(root)
    if not folder.is_comparison:
        raise ConfigError(f"--resume: {root} holds one run, not a comparison: resume it without --compare")
    started = folder.methods
    again = f"resume it as it was started: {compare_command(cfg, started or methods)}"
    if started is not None and started != methods:
        raise ConfigError(f"--resume: {root} compares {','.join(started)} (the first is the reference), not "
                          f"{','.join(methods)}; {again}")
    path = Path(root) / "config.yaml"
    if path.is_file():
        refused, _ = resume_diff(read_yaml(path.read_text(errors="replace"), str(path)) or {}, to_dict(cfg))
        if refused:
            raise ConfigError(f"--resume: the comparison in {root} was started with another recipe (saved -> now: "
                              f"{'; '.join(refused)}); {again}, or start a new one under another --name")


def release_memory() -> None:
    """Give back what a finished training held: the trainer's ``gc.freeze()`` kept its setup out of the cyclic
    collector, so unfreeze and collect, then return a GPU's cached blocks."""

    import torch

    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare(cfg: RunConfig, methods: list[str], overwrite: bool = False, resume: bool = False) -> dict[str, Any]:
    """Train each method with ``cfg`` (only method.name changes) under outputs/<name>/<method>/, then write
    compare.json, compare.md and compare.png in outputs/<name>/ and print the table.

    The comparison's folder follows the run-folder rules (progressive.run.rundir): ``name`` is one folder
    name, a folder this project did not create is never written into, and a finished comparison is only
    redone with ``overwrite``. The main process holds the folder's lock for the comparison's whole life, from
    before it reads the folder (a run or another comparison writing there is named, and nothing is written) to
    its last report. ``resume`` continues a comparison that stopped (a signal, a crash): finished methods are
    reused, interrupted ones resume from their last checkpoint, the rest start.

    Raises:
        ConfigError: fewer than two methods, or any config problem (all are checked before training).
        FileExistsError / FileNotFoundError: the folder cannot be used (see above; in use by another run
            included), or nothing to resume.
    """

    if len(methods) < 2 or len(set(methods)) != len(methods):
        raise ConfigError(f"--compare: give two or more different methods, e.g. baseline,vcycle; got {methods}")
    validate(cfg)  # the run-name rule holds for the comparison's folder (--name .. would write outside)
    lock = rundir.RunLock(cfg.run_dir)  # taken over from the command's plan when it holds it (progressive.run.start)
    try:
        return _compare(cfg, methods, overwrite, resume, lock)
    finally:
        lock.release()


def _check_fresh(cfg: RunConfig, overwrite: bool, locked: bool = False) -> None:
    """A new comparison may start in its folder (progressive.run.rundir.check_can_start)."""
    root = cfg.run_dir
    rundir.check_inputs_outside(root, run_inputs(cfg))
    rundir.check_can_start(root, overwrite, locked=locked, taken=f"{root} already exists: give this comparison its own "
                           "--name (--resume continues a comparison there; --overwrite would delete what it holds)")


def _compare(cfg: RunConfig, methods: list[str], overwrite: bool, resume: bool,
             lock: rundir.RunLock) -> dict[str, Any]:
    """``compare``, holding ``lock`` (the comparison folder's) on the main process once there is a folder."""
    root = cfg.run_dir
    main = int(os.environ.get("RANK", "0")) == 0  # the main process checks and writes the comparison's folder
    if main and rundir.is_run_folder(root):
        lock.acquire()  # before anything reads the folder: a live run or comparison there refuses this one
    folder = rundir.look(root)  # its marker, read once (under the lock, where there is a folder to lock)
    if resume and not folder.is_run:
        raise FileNotFoundError(f"--resume: no comparison at {root}; pass the --name / --output_dir it ran with")
    if resume:
        check_resumable(root, cfg, methods, folder)
    if not resume and main:  # another process would find the folder the main one creates
        _check_fresh(cfg, overwrite)
    group = replace(cfg.train, group=cfg.train.group or cfg.name)  # the method runs are one W&B group
    own = replace(group, lr=cfg.train.baseline_lr) if cfg.train.baseline_lr is not None else group
    subs = [replace(cfg, name=m, output_dir=str(root), method=replace(cfg.method, name=m),
                    train=own if m == "baseline" else group) for m in methods]
    trainers, reused = [], []
    for s in subs:  # validates every config before any training
        if resume and (s.run_dir / FINISHED).is_file():
            reused.append(s.method.name)  # finished by an earlier run of this command: its metrics are read below
            continue
        # each method's run decided once, here, before any trains: resumed where it left a checkpoint, else fresh
        tr = Trainer(s, decide(s.run_dir, resume and bool(ckpt.list_checkpoints(s.run_dir)), overwrite=True))
        tr.resume_command = compare_command(cfg, methods)
        trainers.append(tr)
    for i, trainer in enumerate(trainers):
        trainer.runs_after = len(trainers) - 1 - i  # the bar's ETA covers the whole comparison
    if main:  # the folder's record: what the comparison makes in it (progressive.run.rundir)
        if not lock.held:  # a new folder: locked as it is made, and checked again under the lock
            lock.acquire()
            _check_fresh(cfg, overwrite, locked=True)
        if resume:
            rundir.adopt_earlier(root, ("config.yaml", *methods, *REPORTS))
            rundir.check_resume(root, REPORTS)
        rundir.mark_comparison(root, methods)
        for name in ("config.yaml", *methods):
            rundir.claim(root, name)
        atomic_write_text(root / "config.yaml", dump_yaml(cfg))  # what --resume reads
        for m in reused:
            print(header(cfg, methods, m, reused=True), flush=True)
    command = compare_command(cfg, methods)
    with stopping(cfg.train.stop_timeout, command, f"the comparison {cfg.name}", say=say, main=main) as stop:
        while trainers:  # a finished method's model, optimizer and wrappers are let go before the next one trains
            trainer = trainers.pop(0)
            if main:
                print(header(cfg, methods, trainer.cfg.method.name), flush=True)
            trainer.run()
            done = trainer.cfg.method.name
            del trainer
            release_memory()
            if trainers and stop.requested(at_once=True):  # the next method does not start
                raise Stopped(f"stopped by {stop.name} after {done} finished, before {trainers[0].cfg.method.name} "
                              f"started\nresume with: {command}" if main else "")
        if not main:
            return {}
        return _report(cfg, root, methods, subs)


def _report(cfg: RunConfig, root: Path, methods: list[str], subs: list[RunConfig]) -> dict[str, Any]:
    """Main process, once every method has finished: the savings table, compare.json, compare.md, compare.png
    and the tracker's comparison run; the methods' loss plots redrawn against the baseline."""

    for name in (*REPORTS, *(("wandb",) if cfg.train.report_to == "wandb" else ())):
        rundir.claim(root, name)
    runs = {m: read_metrics(Path(root) / m / METRICS) for m in methods}
    target, table = savings(runs, methods[0])
    result = {"reference": methods[0], "target_val_loss": target, "results": table,
              "note": "cost to first reach the reference's final validation loss (evaluated every "
                      f"{cfg.train.eval_every} steps); wall_s is training time (steps and level changes, "
                      "not evaluation or checkpoint I/O)"}
    cols = ["method", "flops_saved_%"]  # the saving first: compiled, the one without the compilations leads
    cols += ["wall_saved_excl_compile_%", "wall_saved_%"] if "compile_s" in table[0] else ["wall_saved_%"]
    cols += ["final_val_loss", "flops_to_target", "wall_to_target_s", "steps", "flops", "wall_s", "final_train_loss"]
    cols += ["compile_s"] if "compile_s" in table[0] else []
    text = format_table(table, cols)
    atomic_write_json(root / "compare.json", result)
    atomic_write_text(root / "compare.md", f"target: {methods[0]} final val loss {target:.4f}\n\n{text}\n")
    figure = plot_compare(runs, root / "compare.png", target) if cfg.train.plots else None
    report_comparison(cfg, root, result, figure)
    for s in subs:  # a method that finished before the baseline did drew its loss plots without it: redraw
        done = json.loads((s.run_dir / SUMMARY).read_text())
        if s.method.name != "baseline" and done.get("plot_baseline") is None:
            _, base = run_plots(s)
            atomic_write_json(s.run_dir / SUMMARY, {**done, "plot_baseline": str(base) if base else None})
    print(f"\ncomparison (target = {methods[0]}'s final validation loss {target:.4f}):")
    print(text)
    phases = {s.method.name: json.loads((s.run_dir / SUMMARY).read_text()).get("phases") or [] for s in subs}
    print("\n" + "\n".join(said(table, runs, target, phases)))
    if methods[0] == "baseline":
        print(context(cfg))
    print(f"outputs: {root}/compare.json, compare.md{', compare.png' if figure else ''}; runs in {root}/<method>/")
    return result
