"""WSD cooldown branches: several budgets from one run (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
Training Beyond Fixed Training Durations").

Under a warmup-stable-decay schedule the LR is the peak from the end of the warm-up until the cooldown, so a run of
b < N steps and a run of N steps are the same run up to the first step of the shorter one's cooldown,
``fork = b - max(1, round(cooldown * b))``, as long as both warm up over the same steps. ``train.branches: [b, ...]``
makes a run of N steps also cool down from ``fork`` for each b: at that step the model, the optimizer, the scheduler
and the random state are copied, the cooldown of a b-step schedule runs on the batches of steps fork .. b - 1 (the
batch of a step is a pure function of (seed, step)), the model is evaluated (the validation batches and the whole
test split, as at a run's end), and everything is put back, so the run goes on as if there had been no branch.

A branch is therefore the run that ``train.steps: b`` with ``train.warmup: W / b`` (W = this run's warm-up steps)
would train, and costs only its cooldown on top of this run (20% of b at the default cooldown): loss for loss, which
tests/unit/run/test_branches.py checks against that run trained directly. What each branch measured goes to
``<run>/branches.json`` as it ends and into summary.json's ``branches``.

A resumed run keeps the branches already recorded and runs the others at their fork steps; a stop asked during a
branch drops it (the run stops at its fork step's boundary, and the resume runs the branch again from there).
Branches fork off the baseline trained by data parallelism (one process or DDP), not a sharded or pipelined model
nor a growing one: their state would need forking too, and that is not built.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.io import atomic_write_json
from progressive.config import ConfigError, RunConfig
from progressive.config.fields import cooldown_start
from progressive.methods.base import LRSchedule
from progressive.run import rundir

BRANCHES = "branches.json"


def check_can_branch(cfg: RunConfig, pipelined: bool) -> None:
    """Raise ConfigError where ``train.branches`` cannot fork this run (see the module docstring)."""
    if not cfg.train.branches:
        return
    why = ("the method is " + repr(cfg.method.name) + ", and a growing model's state would fork too"
           if cfg.method.name != "baseline" else "the model is pipelined" if pipelined
           else "the model is sharded (FSDP2)" if cfg.train.fsdp else "")
    if why:
        raise ConfigError(f"train.branches: cooldown branches fork the baseline trained by data parallelism; {why} "
                          "(leave train.branches empty)")


class Branches:
    """The cooldown branches of one run: which are due at which step, running one, and their record."""

    def __init__(self, cfg: RunConfig, run_dir: Path):
        t = cfg.train
        self.cfg, self.path = cfg, Path(run_dir) / BRANCHES
        self.warm = int(round(t.warmup * t.steps))  # the run's warm-up, which every branch shares
        self.forks = {cooldown_start(b, t.cooldown): b for b in t.branches}
        self.rows: list[dict[str, Any]] = []

    def load(self, resume: bool) -> None:
        """The branches a resumed run recorded before it stopped (a fresh run has none)."""
        self.rows = json.loads(self.path.read_text()) if resume and self.path.is_file() else []

    def due(self, step: int) -> int | None:
        """The length of the branch that forks after ``step`` optimizer steps, unless it was recorded."""
        b = self.forks.get(step)
        return None if b is None or any(r["steps"] == b for r in self.rows) else b

    def missed(self, step: int) -> list[int]:
        """Branches that fork before ``step`` and were not recorded (a run resumed past their fork)."""
        done = {r["steps"] for r in self.rows}
        return [b for fork, b in self.forks.items() if fork < step and b not in done]

    def schedule(self, steps: int) -> LRSchedule:
        """The LR multiplier of a run of ``steps`` steps with this run's warm-up steps."""
        t = self.cfg.train
        return LRSchedule(steps, self.warm / steps, t.decay, t.min_lr_ratio, cooldown=t.cooldown)

    def run(self, steps: int, engine: Any, c: Any, stopping: Callable[[], bool], write: Callable[[str], None],
            main: bool) -> bool:
        """Cool the model down from this step (``c.step``, the fork) to ``steps`` and record what it scores; the
        engine's state and the counters ``c`` are as before on return. False where ``stopping()`` turned true
        during the branch (nothing recorded: the caller stops the run at this step)."""
        fork, began = c.step, time.perf_counter()
        write(f"branch of {steps:,} steps: cooling down from step {fork:,} ({steps - fork:,} steps)")
        saved, counters = engine.fork(self.schedule(steps)), dataclasses.replace(c)
        try:
            flops_fork = c.flops
            while c.step < steps:
                engine.step()
                if stopping():
                    write(f"branch of {steps:,} steps dropped at step {c.step:,} (a stop); the resume runs it again")
                    return False
            val, test = engine.evaluate(), engine.test_scores()
            row = {"steps": steps, "fork_step": fork, "warmup_steps": self.warm, "cooldown_steps": steps - fork,
                   "decay": self.cfg.train.decay, "val_loss": val["val_loss"],
                   "test_loss": test["val_loss"] if test else None, "tokens": c.tokens, "flops": c.flops,
                   "extra_flops": c.flops - flops_fork, "seconds": round(time.perf_counter() - began, 3),
                   # the run this branch is, trained directly
                   "same_as": {"train.steps": steps, "train.warmup": self.warm / steps}}
        finally:
            engine.join_fork(saved)
            for f in dataclasses.fields(c):
                setattr(c, f.name, getattr(counters, f.name))
        self.rows = sorted([*self.rows, row], key=lambda r: r["steps"])
        if main:
            rundir.claim(self.path.parent, BRANCHES)
            atomic_write_json(self.path, self.rows)
        test_said = f", test {row['test_loss']:.4f}" if row["test_loss"] is not None else ""
        write(f"branch of {steps:,} steps: val {row['val_loss']:.4f}{test_said}, {row['extra_flops']:.3g} FLOPs "
              f"beyond the run ({row['seconds']:.0f} s)")
        return True
