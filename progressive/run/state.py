"""What a checkpoint saves and what a resume restores and checks (the trainer's part; the format is
progressive.run.checkpoint): the main process's parts, every process's own part (its generators and a
method's per-process state, e.g. AutoCache), and the data check (the content fingerprint).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from common.io import atomic_write_text
from progressive.config import ConfigError, RunConfig, dump_yaml, to_dict
from progressive.run import checkpoint as ckpt
from progressive.run import rundir
from progressive.run.shards import SHARDED, load_shards, save_shards
from progressive.run.tracking import say

__all__ = ["CheckpointState", "DATA_IDENTITY", "resume_command"]

DATA_IDENTITY = "content:"  # prefix of data fingerprints made from file contents (earlier ones: paths + mtimes)


def resume_command(cfg: RunConfig) -> str:
    """The command that continues ``cfg``'s run (--resume reads the saved config, so name and folder suffice);
    under a launcher of several processes, the same launcher runs it."""
    from common.cli import program

    command = program()  # "python train.py" in a clone, "growtrain-train" when installed
    args = f"--resume --name {shlex.quote(cfg.name)} --output_dir {shlex.quote(str(cfg.output_dir))}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"<the same launcher> {command.removeprefix('python ')} {args}"
    return f"{command} {args}"


class CheckpointState:
    """The Trainer's checkpoint and resume steps (a mixin: it uses the trainer's cfg, acc, c, model parts)."""

    def _check_data(self, state: dict[str, Any]) -> None:
        """Refuse to resume on data or a tokenizer whose content changed since the checkpoint (the fingerprint
        covers file contents, never paths or dates: progressive.data.identity).

        Raises:
            ConfigError: the fingerprints differ (a checkpoint that predates content fingerprints resumes with
                a warning instead: it cannot be compared).
        """
        saved = state.get("data")
        if saved == self.data_fingerprint:
            self._resume_accepted()
            return
        if not str(saved).startswith(DATA_IDENTITY):
            # an older version fingerprinted paths and dates, which can never equal a content fingerprint:
            # refusing would claim the data changed when it may not have
            say(f"warning: {self.resume_from} was written by an older version that identified data by paths and "
                 f"modification times ({saved}); the data cannot be checked against it this once. From the next "
                 "checkpoint on, its content is checked")
            self._resume_accepted()
            return
        raise ConfigError(f"resume: the content of the training data or the tokenizer changed since this run "
                          f"started (data fingerprint {saved} -> {self.data_fingerprint}); restore them or start a "
                          "new run (--name)")

    def _resume_accepted(self) -> None:
        """The resumed config passed every check: it becomes the run's config.yaml (a refused resume leaves
        the file as it was)."""
        if self.acc.is_main_process:
            atomic_write_text(self.run_dir / "config.yaml", dump_yaml(self.cfg))

    def _save(self) -> None:
        clock = getattr(self, "clock", None)
        if clock is not None:  # the steps so far are training time; writing the checkpoint is not
            self._tick()
        self._flush_loss()
        staged, finite = self._stage_local()
        if self.acc.is_main_process:
            parts = {"scheduler": self.sched.state_dict(), "method": self.method.state_dict(), "rng": ckpt.rng_state()}
            if not self.fsdp:  # under FSDP2 the weights and moments are in the staged shards
                weights = self.raw.state_dict()
                finite = all(bool(torch.isfinite(w).all()) for w in weights.values() if w.is_floating_point())
                parts.update(model=weights, optimizer=self.opt.state_dict())
            counters = dict(asdict(self.c), config=to_dict(self.cfg), world_size=self.acc.num_processes,
                            phase_name=self.phases[self.c.phase].name, data=self.data_fingerprint, finite=finite,
                            sharded=self.fsdp)
            ckpt.save_checkpoint(self.run_dir, counters, parts, self.cfg.train.keep_checkpoints, staged)
            rundir.record_contents(self.run_dir)
        self.acc.wait_for_everyone()
        self._saved_at = (self.c.phase, self.c.step)
        if clock is not None:
            clock.restart()

    def _stage_local(self) -> tuple[Path | None, bool]:
        """Every process writes its own part of the checkpoint into the staging folder that the main process
        moves into the checkpoint: its generator states and the method's per-process state (e.g. AutoCache's
        activations) when the method keeps such state, and its shards of the weights and moments under
        FSDP2. Returns (that folder, or None when nothing is staged; whether every shard is finite). The run
        folder must be shared by the processes (as the data caches already need)."""
        if not (self.method.has_local_state or self.fsdp):
            return None, True
        folder = ckpt.staging_dir(self.run_dir, self.c.step, self.c.phase)
        if self.method.has_local_state:
            ckpt.stage_rank_part(self.run_dir, self.c.step, self.c.phase, self.acc.process_index,
                                 self.method.save_local)
        finite = save_shards(self.raw, self.opt.optimizer, folder / SHARDED) if self.fsdp else True
        self.acc.wait_for_everyone()  # every part is written before the main process moves them
        return folder, finite

    def _restore(self, state: dict[str, Any], parts: dict[str, Any]) -> None:
        """Build the model of the checkpoint's phase and load weights, method state, optimizer and scheduler
        (from the shards, under FSDP2: any number of processes reads them)."""
        sharded = bool(state.get("sharded"))
        if sharded != self.fsdp:
            raise ConfigError(f"resume: {self.resume_from} was written {'with' if sharded else 'without'} FSDP2 and "
                              f"this run is {'' if self.fsdp else 'not '}sharded; resume it the way it was "
                              "launched (train.fsdp / the accelerate config)")
        model = self.family.build_model(self.phases[self.c.phase].config)
        if not sharded:
            model.load_state_dict(parts["model"])
        self.method.load_state_dict(parts["method"])
        self.method.on_model(model)
        self._set_trio(model, parts.get("optimizer"), parts["scheduler"])
        if sharded:
            load_shards(self.raw, self.opt.optimizer, Path(self.resume_from) / SHARDED)

    def _load_local(self, state: dict[str, Any]) -> dict[str, Any] | None:
        """Restore this process's part of the checkpoint being resumed (see ``_stage_local``); returns its
        generator states. None when there is none for this process (another world size, or a checkpoint
        older than per-process parts): the method's per-process state then starts afresh, said once."""
        if not self.method.has_local_state:
            return None
        rank, world = self.acc.process_index, self.acc.num_processes
        part = ckpt.load_rank_part(self.resume_from, rank) if state.get("world_size") == world else None
        if part is None:
            say(f"warning: {self.resume_from} has no per-process state for process {rank} of {world} (saved "
                 f"by {state.get('world_size')} processes, or by an older version): the {self.method.name} "
                 "method's per-process state (AutoCache's activations) starts empty; the run continues, but "
                 "not bit-identically to an uninterrupted one")
            return None
        self.method.load_local(self.resume_from, f"{ckpt.rank_part(rank)}.method")
        return part["rng"]
