"""What a checkpoint saves and what a resume restores and checks (the format is progressive.run.checkpoint):
the main process's parts, every process's own part (its generators and a method's per-process state, e.g.
AutoCache), and the data check (the content fingerprint). ``Checkpoints`` is the component the trainer and
the pipeline engine hold.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.cli import program
from common.io import atomic_write_text
from progressive.config import ConfigError, RunConfig, dump_yaml, to_dict
from progressive.run import checkpoint as ckpt
from progressive.run.accelerator import precision_comment
from progressive.run.inputs import DATA_IDENTITY
from progressive.run.tracking import say

__all__ = ["Checkpoints", "resume_command"]


def resume_command(cfg: RunConfig) -> str:
    """The command that continues ``cfg``'s run (--resume reads the saved config, so name and folder suffice);
    under a launcher of several processes, the same launcher runs it."""

    command = program()  # "python train.py" in a clone, "growtrain-train" when installed
    args = f"--resume --name {shlex.quote(cfg.name)} --output_dir {shlex.quote(str(cfg.output_dir))}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"<the same launcher> {command.removeprefix('python ')} {args}"
    return f"{command} {args}"


class Checkpoints:
    """A run's checkpoints: written by every process together (``stage`` then ``write``), read back on resume
    (``check_data``, ``load_local``).

    Args:
        cfg: the run's config (saved in every checkpoint).
        acc: the Accelerator (which process this is, how many there are).
        method: the running method (its state, and its per-process state when ``has_local_state``).
        fingerprint: the content fingerprint of the run's data (progressive.run.inputs).
    """

    def __init__(self, cfg: RunConfig, acc: Any, method: Any, fingerprint: str):
        self.cfg, self.acc, self.method, self.fingerprint = cfg, acc, method, fingerprint
        self.run_dir = cfg.run_dir

    def check_data(self, state: dict[str, Any], checkpoint: Path) -> None:
        """Refuse to resume on data or a tokenizer whose content changed since the checkpoint (the fingerprint
        covers file contents, never paths or dates: progressive.data.identity); once accepted, the resumed
        config becomes the run's config.yaml (a refused resume leaves the file as it was).

        Raises:
            ConfigError: the fingerprints differ (a checkpoint that predates content fingerprints resumes with
                a warning instead: it cannot be compared).
        """
        saved = state.get("data")
        if saved != self.fingerprint:
            if str(saved).startswith(DATA_IDENTITY):
                raise ConfigError(f"resume: the content of the training data or the tokenizer changed since this "
                                  f"run started (data fingerprint {saved} -> {self.fingerprint}); restore them or "
                                  "start a new run (--name)")
            # an older version fingerprinted paths and dates, which can never equal a content fingerprint:
            # refusing would claim the data changed when it may not have
            say(f"warning: {checkpoint} was written by an older version that identified data by paths and "
                f"modification times ({saved}); the data cannot be checked against it this once. From the next "
                "checkpoint on, its content is checked")
        if self.acc.is_main_process:  # with the line saying this part's precision (a YAML comment)
            atomic_write_text(self.run_dir / "config.yaml", dump_yaml(self.cfg) + precision_comment(self.acc, self.cfg))

    def stage(self, counters: Any, sharding: Any, model: Any, optimizer: Any) -> tuple[Path | None, bool]:
        """Every process writes its own part of the checkpoint into the staging folder that the main process
        moves into the checkpoint: its generator states and the method's per-process state (e.g. AutoCache's
        activations) when the method keeps such state, and its shards of the weights and moments when the
        model is sharded. Returns (that folder, or None when nothing is staged; whether every shard is
        finite). The run folder must be shared by the processes (as the data caches already need)."""
        if not (self.method.has_local_state or sharding.sharded):
            return None, True
        folder = ckpt.staging_dir(self.run_dir, counters.step, counters.phase)
        if self.method.has_local_state:
            ckpt.stage_rank_part(self.run_dir, counters.step, counters.phase, self.acc.process_index,
                                 self.method.save_local)
        finite = sharding.stage(model, optimizer, folder)
        self.acc.wait_for_everyone()  # every part is written before the main process moves them
        return folder, finite

    def write(self, counters: Any, phase_name: str, parts: dict[str, Any], finite: bool, staged: Path | None,
              **extra: Any) -> None:
        """Main process: write the checkpoint of ``counters``' step (``parts``: the tensors and states it holds;
        ``extra``: more fields of its state.json), and rotate old ones."""
        state = dict(asdict(counters), config=to_dict(self.cfg), world_size=self.acc.num_processes,
                     phase_name=phase_name, data=self.fingerprint, finite=finite, **extra)
        ckpt.save_checkpoint(self.run_dir, state, {**parts, "method": self.method.state_dict()},
                             self.cfg.train.keep_checkpoints, staged)

    def load_local(self, checkpoint: Path, state: dict[str, Any]) -> dict[str, Any] | None:
        """Restore this process's part of the checkpoint being resumed (see ``stage``); returns its generator
        states. None when there is none for this process (another world size, or a checkpoint older than
        per-process parts): the method's per-process state then starts afresh, said once."""
        if not self.method.has_local_state:
            return None
        rank, world = self.acc.process_index, self.acc.num_processes
        part = ckpt.load_rank_part(checkpoint, rank) if state.get("world_size") == world else None
        if part is None:
            say(f"warning: {checkpoint} has no per-process state for process {rank} of {world} (saved by "
                f"{state.get('world_size')} processes, or by an older version): the {self.method.name} method's "
                "per-process state (AutoCache's activations) starts empty; the run continues, but not "
                "bit-identically to an uninterrupted one")
            return None
        self.method.load_local(checkpoint, f"{ckpt.rank_part(rank)}.method")
        return part["rng"]
