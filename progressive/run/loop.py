"""The loop over a run's steps, and the run it trains: what ``Trainer.run()`` built once the devices, the run
folder and the data were ready.

``TrainingRun`` is handed every part it uses when it is made (the devices, the data and the plan for it, the
checkpoints, the counters, the logs, the progress display), so none of them is missing between phases; the loop
(``train``, ``_train_phase``, ``_after_step``, ``_save``, ``_transition``) only advances them, and the summary
(progressive/run/summary.py) reads the finished run from it. The loop is the same for every engine; what differs
between data parallel and the elastic pipeline is the engine's (progressive/run/engine.py).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator

from common.device import Stopwatch
from common.trackers import end_training
from progressive.config import RunConfig
from progressive.methods.base import Method, Phase
from progressive.model.build import Family
from progressive.run import checkpoint as ckpt
from progressive.run.branches import Branches
from progressive.run.engine import Counters, Engine
from progressive.run.faults import armed
from progressive.run.grace import StopWindow
from progressive.run.inputs import RunData
from progressive.run.state import Checkpoints
from progressive.run.stop import Interrupted, StopOnSignal, Stopped
from progressive.run.tracking import MetricsLog, Progress


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf; the last checkpoint on disk predates it."""


@dataclass(eq=False)
class TrainingRun:
    """One run being trained, built whole by ``Trainer.run()``; ``train()`` runs its phases from where its
    counters stand.

    Attributes:
        cfg: the run's config.
        family: the model family.
        method: the method (plans the phases, answers the hooks).
        engine: data parallel or the elastic pipeline, set up for this run.
        branches: train.branches, the WSD cooldowns forked off the run (progressive/run/branches.py).
        acc: the Accelerator.
        stop: the stop handler: a signal ends the run at a step boundary.
        window: whether a stop's checkpoint fits in the launcher's SIGTERM-to-SIGKILL window.
        compiled: train.compile, as decided for this device.
        resume_command: printed when a signal stops the run.
        data: the splits, the tokenizer, the batch of any step.
        base_config: the full model's HF config for this data.
        phases: the method's plan for this data.
        checkpoints: what a checkpoint saves and a resume checks.
        c: where the run is (step, phase, tokens, FLOPs, device time).
        transitions: summary.json's record of model and layout changes.
        clock: device time (progressive/run/trainer.py's docstring).
        log: metrics.jsonl and the trackers.
        bar: the progress display.
        saved_at: (phase, step) of the last checkpoint this process wrote or resumed from; (-1, -1) before any.
    """

    cfg: RunConfig
    family: Family
    method: Method
    engine: Engine
    branches: Branches
    acc: Accelerator
    stop: StopOnSignal
    window: StopWindow
    compiled: bool
    resume_command: str
    data: RunData
    base_config: Any
    phases: list[Phase]
    checkpoints: Checkpoints
    c: Counters
    transitions: list[dict[str, Any]]
    clock: Stopwatch
    log: MetricsLog
    bar: Progress
    saved_at: tuple[int, int] = (-1, -1)
    pending: Any = field(default=0.0, init=False)  # the sum of the loss terms since the last row (a device tensor)
    pending_n: int = field(default=0, init=False)  # steps in that sum

    @property
    def run_dir(self):
        """The run folder."""
        return self.cfg.run_dir

    @property
    def raw(self) -> torch.nn.Module:
        """The unwrapped model (the engine's): the method's hooks change it; final/ saves it."""
        return self.engine.raw

    def train(self, evaluate_first: bool) -> None:
        """Train every phase from where the counters stand (after an evaluation row first, on a fresh start);
        a signal stops at a step boundary with a checkpoint (Stopped). The engine, the display and the logs are
        closed however it ends."""
        try:
            with self._stoppable():
                if evaluate_first:
                    self.log.log(self._row("val", **self.engine.evaluate()))
                self.clock.restart()
                if self.stop.requested(at_once=True):  # a signal while the run was loading
                    self._stop_at_boundary()
                self._branch_if_due()  # a run resumed at a branch's fork step (stopped during the branch)
                start = self.c.phase
                for index in range(start, len(self.phases)):
                    if index > start:
                        self._transition(index)
                    self._train_phase(self.phases[index].steps)
        except (Stopped, NonFiniteLoss):
            end_training(self.acc)  # a stop for requeue (its checkpoint written) leaves the trackers flushed
            raise
        finally:
            self.engine.close()
            self.bar.close()
            self.log.close()
            self.method.finish()

    @contextlib.contextmanager
    def _stoppable(self):
        """While training: SIGINT/SIGTERM request a stop at the next step boundary (progressive.run.stop); a
        second one (or no boundary within train.stop_timeout) ends the run at once with Interrupted."""
        try:
            with self.stop:
                yield
        except KeyboardInterrupt:
            raise self._interrupted() from None

    def _train_phase(self, steps: int) -> None:
        """Train the current phase until it has done ``steps`` steps, stopping at a step boundary when a
        signal asked for it on any process."""
        while self.c.step_in_phase < steps:
            self._train_step()
            # where the step ended in a row (already synchronized), the processes agree on this very step;
            # elsewhere a step later, without waiting for the device (progressive.run.stop.StopVote)
            if self.stop.requested(at_once=self._row_due()):
                self._stop_at_boundary()

    def _row_due(self) -> bool:
        """Whether the step just done ends with a train row: every ``train.log_every`` steps and a phase's last."""
        return self.c.step % self.cfg.train.log_every == 0 or self.c.step_in_phase == self.phases[self.c.phase].steps

    def _train_step(self) -> None:
        """One step by the engine; its loss terms join the running sum; then what follows every step."""
        lr, epoch_before, losses = self.engine.step()
        for loss in losses:
            self.pending = self.pending + loss
        self.pending_n += 1
        self._after_step(lr, epoch_before)

    def _after_step(self, lr: float, epoch_before: int) -> None:
        """After every step: a train row and an evaluation when due, the method's changes, a checkpoint."""
        t, c = self.cfg.train, self.c
        phase = self.phases[c.phase]
        last = c.step_in_phase == phase.steps
        log, evaluate = self._row_due(), c.step % t.eval_every == 0 or last
        if log or evaluate:
            self.engine.tick()  # the one synchronization of this row: wall, tokens/s and the ETA are the device's
        if log:
            loss = self._flush_loss()
            fields, shown = self.engine.row_fields()
            self.log.log(self._row("train", loss=loss, lr=lr, **fields))
            self.bar.update(c.step - self.bar.n, phase.name, loss, lr, c.wall, c.tokens, c.flops, shown)
        if evaluate:
            self.log.log(self._row("val", **self.engine.evaluate()))
        if log or evaluate:
            self.clock.restart()  # logging and evaluation are not training time
        self.engine.changes(epoch_before)
        if c.step % t.checkpoint_every == 0:
            self._save()
        self._branch_if_due()
        if (faults := armed()) is not None:  # tests only: a kill or a signal due after this step
            faults.after_step(c.step, self.acc.process_index, stopping=lambda: self.stop.signum is not None)

    def _branch_if_due(self) -> None:
        """The cooldown branch that forks at this step, if one does (progressive/run/branches.py): the run goes on
        from here as if it had not run; a stop asked during it stops the run here, the branch not recorded."""
        steps = self.branches.due(self.c.step)
        if steps is None:
            return
        self.engine.tick()
        done = self.branches.run(steps, self.engine, self.c, self.stop.requested, self._write,
                                 self.acc.is_main_process)
        self.clock.restart()  # a branch is not this run's training time
        if not done:
            self._stop_at_boundary()

    def _save(self) -> None:
        """A checkpoint of this step, written by every process together (the steps so far are training time;
        writing it is not)."""
        self.engine.tick()
        self._flush_loss()  # a resumed run averages its logged losses over the same steps
        began = time.perf_counter()
        parts, finite, staged, extra = self.engine.checkpoint_parts()
        if self.acc.is_main_process:
            self.checkpoints.write(self.c, self.phases[self.c.phase].name, parts, finite, staged, **extra)
        self.acc.wait_for_everyone()
        self.window.wrote(time.perf_counter() - began)  # a stop's checkpoint takes as long: does it fit?
        self.saved_at = (self.c.phase, self.c.step)
        self.clock.restart()

    def _flush_loss(self) -> float | None:
        """Mean loss since the last call (all processes), or None; raises NonFiniteLoss on NaN/inf."""
        if self.pending_n == 0:
            return None
        loss = self.engine.global_loss(self.pending / self.pending_n)
        self.pending, self.pending_n = 0.0, 0
        if not math.isfinite(loss):
            good = ckpt.latest_good(self.run_dir)
            where = (f"the last good checkpoint is {good} (verified, finite weights): resume it with --resume, "
                     "e.g. with a lower --train.lr" if good else "no good checkpoint was written yet")
            raise NonFiniteLoss(f"training loss became {loss} by step {self.c.step} (phase "
                                f"{self.phases[self.c.phase].name}); stopping. {where}")
        return loss

    def _stop_at_boundary(self) -> None:
        """A signal asked to stop (on any process): checkpoint this step (unless it just was), end the
        trackers, and raise Stopped with the command that resumes (exit code 75)."""
        self.stop.disarm()
        if self.saved_at != (self.c.phase, self.c.step):
            self._save()
        self.bar.close()
        self.log.close()
        end_training(self.acc)
        msg = ""
        if self.acc.is_main_process:
            where = ckpt.list_checkpoints(self.run_dir)[-1]
            msg = (f"stopped by {self.stop.name} after step {self.c.step} (phase {self.phases[self.c.phase].name}); "
                   f"checkpoint {where}\nresume with: {self.resume_command}")
        raise Stopped(msg)

    def _interrupted(self) -> Interrupted:
        """What a second signal (or a step boundary that did not come in time) ends the run with."""
        stop = self.stop
        why = (f"no step boundary within {stop.timeout:g} s of {stop.name}" if stop.expired else
               f"a second {signal.Signals(stop.hard).name}" if stop.hard else "a KeyboardInterrupt")
        msg = ""
        if self.acc.is_main_process:
            good = ckpt.latest_good(self.run_dir)
            msg = (f"stopped at once on {why}, without a new checkpoint; "
                   + (f"the last complete checkpoint is {good}\nresume with: {self.resume_command}" if good else
                      "no checkpoint was written yet: the run starts again with --overwrite"))
        return Interrupted(msg, stop.hard or signal.SIGINT)

    def _row(self, kind: str, **values: Any) -> dict[str, Any]:
        c = self.c
        extra = {"compile_s": round(c.compile_s, 3), "compile_flops": c.compile_flops,
                 "compile_tokens": c.compile_tokens} if self.compiled else {}
        return dict(kind=kind, step=self.c.step, phase=self.c.phase, phase_name=self.phases[self.c.phase].name,
                    tokens=self.c.tokens, flops=self.c.flops, wall=round(self.c.wall, 4), **extra, **values)

    def _write(self, line: str) -> None:
        """A line beside the progress bar (the main process's)."""
        self.bar.write(line)

    def _transition(self, index: int) -> None:
        """A level change: the method's operators map the model and its AdamW moments to phase ``index``
        (the engine's part); recorded, and checkpointed: resuming never redoes a level change."""
        self.engine.tick()  # the steps before it (nothing, when the phase's last row has just been logged)
        self._flush_loss()
        note, operators, rebuild = self.engine.transition(index)
        seconds = operators + rebuild
        self.transitions.append({"step": self.c.step, "to": self.phases[index].name, "note": note,
                                 "seconds": round(seconds, 3), "operators_s": round(operators, 3),
                                 "rebuild_s": round(rebuild, 3)})
        if self.acc.is_main_process:
            self.bar.write(f"[step {self.c.step}] {note} ({seconds:.2f}s); now {self.phases[index].name}")
        self._save()
