"""How a run starts, decided in one place: fresh, resumed from which checkpoint, or not at all (finished).

``decide`` reads the run folder once: ``--resume`` continues from the newest good checkpoint (damaged newer
ones are named and skipped); ``--resume auto`` resumes when there is a checkpoint, and otherwise starts
fresh (emptying the folder only when train.py created it); a folder holding ``summary.json`` is a finished
run. The command line (progressive/cli.py) decides before it loads the config, so a resumed run's base
config is the one its checkpoint holds (``saved_config``), and hands the decision to the trainer. Under
several processes only the main one reads the folder; ``agree`` gives its decision to every process (one
process seeing a summary that another did not yet see would exit while the others wait in a collective).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from progressive.config import ConfigError
from progressive.run import checkpoint as ckpt
from progressive.run.faults import finished_here
from progressive.run.rundir import is_run_folder
from progressive.run.tracking import say

__all__ = ["FINISHED", "RunFinished", "Start", "decide", "agree", "saved_config", "finished_message"]

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


def finished_message(run_dir: Path) -> str:
    return (f"{run_dir} is a finished run (its summary is {Path(run_dir) / FINISHED}); nothing to resume. "
            "Pass --overwrite to train it again, or --name for a new run")


def _several() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def decide(run_dir: Path, resume: bool | str, overwrite: bool) -> Start:
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
        if ckpt.list_checkpoints(run_dir):
            print(f"--resume auto: {run_dir} holds a checkpoint; resuming", file=sys.stderr)
            resume = True
        elif not finished_here(run_dir):
            fresh = run_dir.is_dir() and is_run_folder(run_dir)
            print(f"--resume auto: no checkpoint in {run_dir}; starting {'again' if fresh else 'a new run'}",
                  file=sys.stderr)
            return Start("fresh", overwrite=fresh)
        else:
            resume = True
    if not resume:
        return Start("fresh", overwrite=overwrite)
    if _several() and os.environ.get("RANK", "0") != "0":
        return Start("follow")
    if finished_here(run_dir):
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
    from progressive.config.reader import read_yaml

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
