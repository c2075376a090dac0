"""Results output shared by the eval CLIs: JSON beside the checkpoint (outside every folder a command of this
project owns) and Accelerate trackers (tables: common.table)."""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.io import atomic_write_json
from common.ownership import OUTPUT, RUN, WRITTEN_BY, check_file_replaceable, is_marked
from common.trackers import end_training, wandb_offline_fallback

TRACKERS = ("wandb", "tensorboard", "trackio", "none")


def add_run_args(parser, project: str, run_name_default: str,
                 logging_default: str = "<results folder>/eval_logs", mixed_precision: bool = True) -> None:
    """The flags every eval CLI shares: tracker, project, run name, tracker folder, device (and autocast)."""
    parser.add_argument("--report_to", default="none", choices=TRACKERS, help="tracker for the final metrics "
                        "(W&B offline: WANDB_MODE=offline; `wandb sync` uploads later)")
    parser.add_argument("--project", default=None, help=f"tracker project name (default: the training run's, for "
                        f"a train.py final/ checkpoint; else {project})")
    parser.add_argument("--run_name",
                        help=f"tracker run name (default: <training run>-<eval>, else {run_name_default})")
    parser.add_argument("--logging_dir", help=f"tracker files (default {logging_default})")
    parser.add_argument("--cpu", action="store_true", help="force CPU even if a GPU is visible")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")
    if mixed_precision:
        parser.add_argument("--mixed_precision", default="no", choices=["no", "bf16", "fp16"],
                            help="autocast on GPU (default no)")


def output_or(given: str | os.PathLike | None, default: str | os.PathLike) -> str | os.PathLike:
    """``--output`` as given, or ``default`` when it was left out. An empty one (a script's empty variable) is
    refused: it read as left out and wrote beside the checkpoint.

    Raises:
        ValueError: ``given`` is empty.
    """
    if given is None:
        return default
    if not str(given).strip():
        raise ValueError(f"--output: empty; give a results file, or leave --output out for {default}")
    return given


def default_output(checkpoint: str | os.PathLike, name: str) -> Path:
    """Where an eval CLI writes ``name`` when ``--output`` is left out: beside the outermost folder holding the
    checkpoint that a command of this project owns (a run folder, a comparison's, an operators' or a bench's output
    folder: it carries a marker), else beside the checkpoint folder; never inside one, where a later ``--overwrite``
    would replace what its command made and refuse what it did not. The file is named after the checkpoint's path
    from there: ``outputs/default/vcycle/final`` -> ``outputs/default.vcycle.final.<name>``.

    The checkpoint's real location decides (links resolved), so a link to a run's ``final/`` or a working folder
    inside the run still puts the results outside it.
    """
    ckpt = Path(checkpoint).expanduser().resolve()
    top = ckpt
    for folder in ckpt.parents:
        if is_marked(folder, RUN) or is_marked(folder, OUTPUT):
            top = folder
    return top.parent / ".".join((*ckpt.relative_to(top.parent).parts, name))


def results_path(path: str | os.PathLike, tool: str) -> Path:
    """``path`` if ``tool`` may write its results there (checked before any work): a new file, or a results
    JSON this project wrote; never a file of the user's (common.ownership).

    Raises:
        FileExistsError: ``path`` is a folder or a file this project did not write.
    """
    check_file_replaceable(path, tool)
    path = Path(path)
    folder = path.parent  # found now, not after the scoring: the nearest folder that exists must take a file
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "the results cannot be written under a file", str(folder))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "the results cannot be written there (no write permission)", str(folder))
    return path


def save_results(results: Mapping[str, Any], path: str | os.PathLike, tool: str = "eval") -> Path:
    """Write ``results`` as JSON to ``path`` atomically, marked ``written_by: growtrain <tool>`` so a later run
    may replace it, and return the path.

    Raises:
        FileExistsError: ``path`` holds a file this project did not write (it is never overwritten).
    """
    path = results_path(path, tool)
    try:
        atomic_write_json(path, {WRITTEN_BY: f"growtrain {tool}", **results})
    except OSError:  # the scores took minutes: print them rather than lose them
        print(json.dumps(results, indent=1, default=str))
        print(f"(the results above could not be written to {path})", file=sys.stderr)
        raise
    return path


def training_run(checkpoint: str | os.PathLike | None) -> dict[str, Any] | None:
    """The train.py run a checkpoint is the ``final/`` of (read from its run folder's files, not code): its
    folder, name, tracker project, W&B group and W&B run id (None when it was not logged to W&B)."""
    import yaml

    if checkpoint is None:
        return None
    ckpt = Path(checkpoint)
    run = ckpt.parent
    if ckpt.name != "final" or not (run / ".growtrain-run").is_file() or not (run / "config.yaml").is_file():
        return None
    try:
        cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    train = cfg.get("train") or {}
    name = str(cfg.get("name") or run.name)
    wid = run / "wandb_run_id"
    return {"dir": run, "name": name, "project": train.get("project") or "growtrain",
            "group": train.get("group") or name, "id": wid.read_text().strip() if wid.is_file() else None}


def log_results(
    metrics: Mapping[str, float],
    report_to: str,
    project: str | None,
    run_name: str | None,
    logging_dir: str | os.PathLike,
    config: Mapping[str, Any] | None = None,
    checkpoint: str | os.PathLike | None = None,
    kind: str = "eval",
    default_project: str = "growtrain-eval",
    default_name: str = "eval",
) -> None:
    """Send flat ``metrics`` to one Accelerate tracker (``wandb``/``tensorboard``/``trackio``), or nowhere.

    For a train.py run's ``final/`` checkpoint the results go to the training run's project and W&B group,
    named ``<run>-<kind>`` (job type "eval"), and, with W&B, the metrics are also written into the training
    run's summary (resumed by its id). W&B honours WANDB_MODE=offline (its run folder goes under
    ``logging_dir``).

    Raises:
        ValueError: ``report_to`` is not one of TRACKERS.
    """
    if report_to not in TRACKERS:
        raise ValueError(f"--report_to must be one of {', '.join(TRACKERS)}; got {report_to!r}")
    if report_to == "none":
        return
    from accelerate import Accelerator

    run = training_run(checkpoint)
    project = project or (run["project"] if run else default_project)
    run_name = run_name or (f"{run['name']}-{kind}" if run else default_name)
    note = wandb_offline_fallback(str(logging_dir)) if report_to == "wandb" else None
    if note:
        print(f"warning: {note}", file=sys.stderr)
    logging_dir = Path(logging_dir)
    logging_dir.mkdir(parents=True, exist_ok=True)
    if report_to == "trackio":  # its local database goes with the results unless the user chose a place
        os.environ.setdefault("TRACKIO_DIR", str(logging_dir / "trackio"))
    acc = Accelerator(log_with=report_to, project_dir=str(logging_dir))
    init_kwargs = {}
    if report_to == "wandb":
        init_kwargs = {"wandb": {"dir": str(logging_dir), "name": run_name, "job_type": "eval", "tags": [kind],
                                 **({"group": run["group"]} if run else {})}}
    acc.init_trackers(project, config=dict(config or {}), init_kwargs=init_kwargs)
    acc.log({k: float(v) for k, v in metrics.items()})
    end_training(acc)
    if report_to == "wandb" and run and run["id"]:
        import wandb

        train_run = wandb.init(id=run["id"], project=project, dir=str(run["dir"]), resume="allow")
        train_run.summary.update({k: float(v) for k, v in metrics.items()})
        train_run.finish()
        wandb.teardown()
