"""How a run starts, decided in one place: fresh, resumed from which checkpoint, or not at all (finished).

``decide`` reads the run folder once: ``--resume`` continues from the newest good checkpoint (damaged newer
ones are named and skipped); ``--resume auto`` resumes when there is a checkpoint, and otherwise starts
fresh (emptying the folder only when train.py created it); a folder holding ``summary.json`` is a finished
run (``is_finished``). ``plan_run`` is what the command line (progressive/cli.py) hands its loaded config to:
it decides whether the command trains one run or a comparison, and how it starts; a run resumed without
``--config`` continues from the config its checkpoint holds (``saved_config``). The trainer gets the decision. Under
several processes only the main one reads the folder: a resume's plan (its methods, decision and saved config) it
hands to the others through the launch's store before any process group exists (``_shared_plan``,
progressive/run/told.py), and ``agree`` gives its decision to every process once they can talk (one process seeing a
summary that another did not yet see would exit while the others wait in a collective).

The decision is made under the run's lock (progressive.run.rundir.RunLock): before ``plan_run`` reads a run folder,
the main process takes its lock, so a second launch on a live run is refused in one line naming the run that holds
it, before it reads a checkpoint the live run may be pruning; the lock is handed on to the trainer or comparison
that carries the plan out, which holds it to its end (``Plan.release`` lets it go where the command ends first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from progressive.config import ConfigError, RunConfig, load_config
from progressive.config.reader import read_yaml
from progressive.run import checkpoint as ckpt
from progressive.run import rundir, told
from progressive.run.faults import armed
from progressive.run.rendezvous import meet
from progressive.run.rundir import RunLock, is_run_folder
from progressive.run.state import resume_command
from progressive.run.stop import stopping
from progressive.run.tracking import say

__all__ = ["FINISHED", "FRESH", "RunFinished", "Start", "decide", "agree", "saved_config", "finished_message",
           "is_finished", "Plan", "hold", "plan_run"]

FINISHED = "summary.json"  # written last by a run that completed


class RunFinished(RuntimeError):
    """``--resume`` on a run that already completed."""


@dataclass(frozen=True)
class Start:
    """``how``: "fresh", "resume" (from ``checkpoint``), "finished", or "follow" (a process that is not the
    main one: it learns the decision from ``agree``). ``overwrite``: a fresh start may empty the folder."""

    how: str
    checkpoint: Path | None = None
    overwrite: bool = False

    @property
    def resume(self) -> bool:
        return self.how == "resume"


FRESH = Start("fresh")  # a new run, in a folder that must not exist or be empty: the trainer's default


def finished_message(run_dir: Path) -> str:
    return (f"{run_dir} is a finished run (its summary is {Path(run_dir) / FINISHED}); nothing to resume. "
            "Pass --overwrite to train it again, or --name for a new run")


def is_finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run: its summary.json, which a run writes last."""
    return (Path(run_dir) / FINISHED).is_file()


def _sees_finished(run_dir: Path) -> bool:
    """``is_finished`` as this process sees it (a test may hide the summary from one rank: run.faults)."""
    faults = armed()
    return is_finished(run_dir) and not (faults is not None and faults.hides_summary())


def _several() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def decide(run_dir: Path, resume: bool | str = False, overwrite: bool = False) -> Start:
    """How the run in ``run_dir`` starts (``resume``: False, True or "auto").

    Raises:
        ConfigError: --resume auto with --overwrite.
        RunFinished: the run is finished and this is the only process.
        FileNotFoundError / CheckpointError: --resume with no checkpoint, or none usable.
    """
    run_dir = Path(run_dir)
    if resume == "auto":
        if overwrite:
            raise ConfigError("--resume auto and --overwrite: choose one")
        # (said by the main process only: every process decides, and a follower's copy could land after the main
        # process has moved on to its next run's output)
        if ckpt.list_checkpoints(run_dir):
            say(f"--resume auto: {run_dir} holds a checkpoint; resuming")
            resume = True
        elif not _sees_finished(run_dir):
            fresh = run_dir.is_dir() and is_run_folder(run_dir)
            say(f"--resume auto: no checkpoint in {run_dir}; starting {'again' if fresh else 'a new run'}")
            return Start("fresh", overwrite=fresh)
        else:
            resume = True
    if not resume:
        return Start("fresh", overwrite=overwrite)
    if _several() and os.environ.get("RANK", "0") != "0":
        return Start("follow")
    if _sees_finished(run_dir):
        if not _several():
            raise RunFinished(finished_message(run_dir))
        return Start("finished")  # said on every process once they can talk (``agree``)
    return Start("resume", ckpt.resume_point(run_dir, warn=lambda msg: say(f"warning: {msg}")))


def saved_config(run_dir: Path, start: Start) -> dict[str, Any]:
    """The config a run saved, for ``--resume`` without ``--config``: the one of the checkpoint it resumes (a
    process that follows the main one finds the same: the newest good one), else its config.yaml.

    Raises:
        FileNotFoundError: no checkpoint and no config.yaml.
    """

    found = start.checkpoint or ckpt.latest_good(run_dir)
    if found is not None:
        return ckpt.read_state(found)["config"]
    path = Path(run_dir) / "config.yaml"
    if path.is_file():
        return read_yaml(path.read_text(), str(path))
    raise FileNotFoundError(f"--resume: no run at {run_dir} (no checkpoint, no config.yaml); pass --name / "
                            "--output_dir of the run to resume")


def agree(start: Start, acc: Any, run_dir: Path) -> Start:
    """Every process gets the main process's decision (a no-op for one process).

    Raises:
        RunFinished: on every process, when the main one found the run finished (the message on the main one).
    """
    if acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        box = [{"how": start.how, "from": None if start.checkpoint is None else str(start.checkpoint),
                "overwrite": start.overwrite}]
        broadcast_object_list(box, from_process=0)
        main = box[0]
        start = Start(main["how"], None if main["from"] is None else Path(main["from"]), main["overwrite"])
    if start.how == "finished":
        raise RunFinished(finished_message(run_dir) if acc.is_main_process else "")
    return start


@dataclass(frozen=True)
class Plan:
    """What one command runs: ``cfg`` (a resumed run's saved config with the command's overrides, when it resumes
    without ``--config``), ``methods`` (a comparison's, None for one run), ``resume`` / ``overwrite`` as decided,
    ``start`` (one run's decision, handed to the trainer; None for a comparison, whose methods' runs
    report/compare.py decides, each once), ``base`` (the saved config tree ``cfg`` was built on, or None) and
    ``lock`` (the run folder's lock, under which the decision was made: held and handed on by the main process of
    a command that trains, else None)."""

    cfg: RunConfig
    methods: list[str] | None
    resume: bool
    overwrite: bool
    start: Start | None = None
    base: dict[str, Any] | None = None
    lock: RunLock | None = field(default=None, compare=False, repr=False)  # held (handed on) on the main process

    def release(self) -> None:
        """Let the run's lock go, if the trainer or comparison did not take it over (a command that ended first)."""
        if self.lock is not None:
            self.lock.release()


def hold(run_dir: Path) -> RunLock | None:
    """The main process: take the lock of the run folder ``run_dir`` before anything reads it, handed on to whoever
    carries the plan out (``RunLock.hand_on``). None where there is nothing to lock yet (no run folder: the trainer
    or comparison that creates it takes the lock then) or on the other processes.

    Raises:
        FileExistsError: another process holds it (naming it), or its lock file is not a file of its own.
    """
    if int(os.environ.get("RANK", "0")) != 0 or not is_run_folder(run_dir):
        return None
    lock = RunLock(run_dir).acquire()
    lock.hand_on()
    return lock


def _comparison(cfg: RunConfig, resume: bool) -> list[str] | None:
    """["baseline", <method>] when the recipe asks for its same-size baseline (train.with_baseline: the main job),
    else None. A run folder that exists keeps what it is: one run resumes as one run, and a comparison resumes the
    methods it started with, whatever the recipe says."""
    folder = rundir.look(cfg.run_dir) if resume else None  # its marker, read once
    if folder is not None and (methods := folder.resumed_methods()) is not None:
        return methods
    if not cfg.train.with_baseline or cfg.method.name == "baseline":
        return None
    if folder is not None and folder.is_run and not folder.is_comparison:
        return None
    return ["baseline", cfg.method.name]


def plan_run(cfg: RunConfig, overrides: dict[str, str], resume: bool | str, overwrite: bool,
             methods: list[str] | None, recipe: bool, lock: bool = True) -> Plan:
    """How the command that loaded ``cfg`` (its recipe with ``overrides``) runs: one run or a comparison
    (``methods``: --compare's, ``[]`` for one run, None: decided here), fresh or resumed (``resume``: False, True or
    "auto").
    ``recipe``: the command named its recipe (--config), which then defines the resumed run; otherwise a resumed
    run's saved config does, with ``overrides`` on top.
    ``lock``: the command trains, so its decision is made under the run's lock (``hold``), which the plan holds
    (``Plan.lock``; the caller calls ``Plan.release`` when the command ends); False for one that only reads
    (--print_config, --dry_run).
    Under several processes a resume is decided by the main process alone, which hands its plan to the others
    (``_shared_plan``): they never read the run folder, whose checkpoints a live run may be pruning until the main
    process holds its lock.

    Raises:
        FileExistsError: the run folder is in use by another run (with ``lock``); empty on the other processes of a
            launch whose main process refused to plan (it says why).
        ConfigError: --resume auto with --overwrite; a bad override of the saved config.
        RunFinished, FileNotFoundError, CheckpointError: as ``decide``.
        RendezvousTimeout, Stopped: the other processes waited past ``train.rendezvous_timeout`` for the main
            process's plan, or were stopped by a signal while waiting.
    """
    if resume and _several():
        return _shared_plan(cfg, overrides, resume, overwrite, methods, recipe, lock)
    return _held_plan(cfg, overrides, resume, overwrite, methods, recipe, lock)


def _held_plan(cfg: RunConfig, overrides: dict[str, str], resume: bool | str, overwrite: bool,
               methods: list[str] | None, recipe: bool, lock: bool) -> Plan:
    """``_plan`` under the run's lock (``hold``; see ``plan_run``)."""
    held = hold(cfg.run_dir) if lock else None
    try:
        return replace(_plan(cfg, overrides, resume, overwrite, methods, recipe), lock=held)
    except BaseException:
        if held is not None:
            held.release()
        raise


def _shared_plan(cfg: RunConfig, overrides: dict[str, str], resume: bool | str, overwrite: bool,
                 methods: list[str] | None, recipe: bool, lock: bool) -> Plan:
    """A resume under several processes: the main one plans under the run's lock and hands the plan on through the
    launch's store (``told.py``), before any process group exists; every other process builds its plan from it.
    A follower that read the newest checkpoint itself, before the main process held the lock, could read one a
    live run was pruning (or a newer one than the main process resumes)."""
    with stopping(cfg.train.stop_timeout, resume_command(cfg), f"the run {cfg.name}", say=say,
                  main=int(os.environ.get("RANK", "0")) == 0) as stop:
        meet(cfg.train.rendezvous_timeout, stop, say=say)  # a hand-set launch's ranks, so rank 0 serves the store
        store = told.open_store()
        if int(os.environ.get("RANK", "0")) != 0:
            main = told.wait(store, cfg.train.rendezvous_timeout, stop)
            if main is None:
                raise FileExistsError("")  # the main process refused to plan and says why, in its one line
            return _followed(cfg, overrides, main)
    try:
        plan = _held_plan(cfg, overrides, resume, overwrite, methods, recipe, lock)
    except BaseException:
        told.publish(store, None)  # the others leave at once, quietly, instead of waiting for a plan
        raise
    told.publish(store, {"methods": plan.methods, "resume": plan.resume, "overwrite": plan.overwrite,
                         "start": None if plan.start is None else {"how": plan.start.how,
                                                                   "overwrite": plan.start.overwrite},
                         "base": plan.base})
    return plan


def _followed(cfg: RunConfig, overrides: dict[str, str], main: dict[str, Any]) -> Plan:
    """A follower's plan from the main process's (``_shared_plan``): its methods, decision and saved config, with
    this command's ``overrides`` on top; a resume's checkpoint it learns with every process (``agree``)."""
    start = main["start"]
    if start is not None:
        start = Start("fresh", overwrite=start["overwrite"]) if start["how"] == "fresh" else Start("follow")
    if main["base"] is not None:
        cfg = load_config(None, overrides, base=main["base"])
    return Plan(cfg, main["methods"], main["resume"], main["overwrite"], start, main["base"])


def _plan(cfg: RunConfig, overrides: dict[str, str], resume: bool | str, overwrite: bool,
          methods: list[str] | None, recipe: bool) -> Plan:
    """``plan_run``'s decision (see there)."""
    run_dir = cfg.run_dir
    if methods is None:
        methods = _comparison(cfg, bool(resume))
    if not resume:  # a fresh start reads nothing
        return Plan(cfg, methods, False, overwrite, None if methods else Start("fresh", overwrite=overwrite))
    start = None
    if methods:  # a comparison resumes when its folder exists; report/compare.py decides each method's run, once
        if resume == "auto" and overwrite:
            raise ConfigError("--resume auto and --overwrite: choose one")
        resume = resume is True or is_run_folder(run_dir)
        base = saved_config(run_dir, Start("follow")) if resume and not recipe else None
    else:
        start = decide(run_dir, resume, overwrite)
        resume, overwrite = start.how != "fresh", start.overwrite
        base = saved_config(run_dir, start) if resume and not recipe else None
    if base is not None:
        cfg = load_config(None, overrides, base=base)
    return Plan(cfg, methods, bool(resume), bool(overwrite), start, base)
