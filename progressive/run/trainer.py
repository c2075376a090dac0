"""The training loop: config -> data, model, method -> phases of Accelerate training, checkpoints, logs.

One path through it: ``Trainer(cfg).run()``. The method (progressive/methods/) plans the phases and
answers hooks; this file has no method- or family-specific branch. The global batch of step s is a pure
function of (seed, s) (BERT masks too); the engine trains on it.

The trainer holds its parts; each is decided once and then asked, never re-decided:

    start        fresh, resumed from which checkpoint, or finished    progressive/run/start.py
    engine       the step, evaluation, the model's setup, changes,   progressive/run/engine.py (data parallel),
                 checkpoint contents, the final model                progressive/pipeline/engine.py (pipeline)
    data         the splits, the tokenizer, the batch of any step     progressive/run/inputs.py
    checkpoints  what is saved, restored and checked                  progressive/run/state.py
    stop         signals end the run at a step boundary              progressive/run/stop.py

The loop (``_run``, ``_train_phase``, ``_after_step``, ``_save``, ``_transition``) is the same for every
engine; what differs between data parallel and the elastic pipeline is the engine's (``Engine``), chosen
when the trainer is made: ``DataParallel`` unless the caller passes another (progressive.pipeline.engine).

Time is the device's: ``wall`` advances only where a ``Stopwatch`` lap has waited for the device's queued
work (common/device.py): once per logged or evaluated row, at checkpoints and level changes, and around
the first step after a compilation; between laps the host runs ahead. Evaluation, logging and checkpoint
I/O are left out of ``wall``; level changes are in it.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from common.device import Stopwatch, keep_freed_host_memory
from common.io import atomic_write_text
from common.quiet import terminal_bars
from common.trackers import end_training
from progressive.config import ConfigError, RunConfig, dump_yaml, read_paths, resume_diff, to_dict, validate
from progressive.methods import get_method
from progressive.methods.base import Phase
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.model.flops import model_shape
from progressive.run import checkpoint as ckpt
from progressive.run import rundir
from progressive.run.accelerator import build_accelerator, device_note, precision_comment, precision_note
from progressive.run.branches import Branches, check_can_branch
from progressive.run.compiled import compiles
from progressive.run.engine import Counters, DataParallel, Engine, RunParts, Saved
from progressive.run.faults import KILL_ENV, SIGNAL_ENV, armed  # noqa: F401  (tests import KILL_ENV and SIGNAL_ENV here)
from progressive.run.grace import StopWindow
from progressive.run.inputs import RunData, sizes_line
from progressive.run.rendezvous import meet
from progressive.run.start import FINISHED, RunFinished, Start, agree, decide  # noqa: F401  (FINISHED: callers)
from progressive.run.state import Checkpoints, resume_command
from progressive.run.stop import Interrupted, StopOnSignal, Stopped, stopping
from progressive.run.summary import FINAL, PLOTS, SUMMARY, finish
from progressive.run.tracking import (
    METRICS,
    MetricsLog,
    Progress,
    check_tracker,
    init_trackers,
    say,
    start_progress,
    tracker_entries,
)

CONFIG = "config.yaml"  # the run's config, as it resumes (a resume rewrites it once its data is checked)


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf; the last checkpoint on disk predates it."""


def run_inputs(cfg: RunConfig) -> dict[str, str | None]:
    """The config fields that may name files or folders the run reads (marked as paths in the config)."""
    return read_paths(cfg)


class Trainer:
    """Runs one config. The constructor validates everything that needs no data (so bad input fails fast) and
    decides how the run starts; ``run()`` loads data, trains every phase and writes the outputs.

    Args:
        cfg: the run's config.
        resume: continue the run from its newest good checkpoint (True), or "auto" (resume if there is one).
        overwrite: a fresh start may empty a run folder train.py created.
        start: the decision already made (progressive/cli.py decides before loading the config); default:
            decided here from ``resume`` and ``overwrite``.
        engine: makes the engine from (cfg, family, method, step_flops); default ``DataParallel``
            (progressive.pipeline.engine passes its own for ``parallel.pipeline``).
    """

    def __init__(self, cfg: RunConfig, resume: bool | str = False, overwrite: bool = False,
                 start: Start | None = None, engine: Callable[..., Engine] = DataParallel):
        validate(cfg)
        self.cfg, self.run_dir = cfg, cfg.run_dir
        self.family = get_family(cfg.model.family, cfg.model.task)
        self.method = get_method(cfg, self.family)
        tracker_note = check_tracker(cfg.train.report_to, cfg.run_dir)
        if tracker_note:
            say(f"warning: {tracker_note}")
        guess = self.family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
        phases = self.method.plan(guess, self.step_flops)  # factors, schedule vs budget: before any data loads
        if cfg.model.init_from and model_shape(phases[0].config) != model_shape(guess):
            raise ConfigError(f"model.init_from: method {cfg.method.name!r} starts from a model of another shape "
                              f"({model_shape(phases[0].config).label}, not {model_shape(guess).label}); "
                              "init_from needs a method whose first phase trains the full model "
                              "(baseline, vcycle, autofreeze)")
        if cfg.model.init_from:
            self.family.check_init_from(phases[0].config, cfg.model.init_from)
        self.resume_command = resume_command(cfg)  # printed when a signal stops the run (compare sets its own)
        self.runs_after = 0  # runs of the same job after this one (compare sets it): the bar's whole-job ETA
        self.start = start or decide(self.run_dir, resume, overwrite)
        if self.start.how == "fresh":
            rundir.check_inputs_outside(self.run_dir, run_inputs(cfg))
            rundir.check_can_start(self.run_dir, self.start.overwrite)
        elif self.start.resume:
            refused, allowed = resume_diff(ckpt.read_state(self.start.checkpoint)["config"], to_dict(cfg))
            if refused:
                raise ConfigError("resume: the config differs from the run being resumed (saved -> now):\n  "
                                  + "\n  ".join(refused) + "\nUse the original settings, or start a new run "
                                  "(--name).")
            for line in allowed:
                say(f"warning: resuming with a changed setting: {line}")
        self.engine: Engine = engine(cfg, self.family, self.method, self.step_flops)  # chosen once
        check_can_branch(cfg, pipelined=not isinstance(self.engine, DataParallel))
        self.branches = Branches(cfg, self.run_dir)  # train.branches: WSD cooldowns forked off the run
        # made by run(), in this order: the devices, the stop handler, the folder's lock
        self.acc: Accelerator | None = None
        self.compiled = False  # train.compile, as decided for this device
        self.stop: StopOnSignal | None = None
        self.window: StopWindow | None = None  # whether a stop fits in the launcher's SIGTERM-to-SIGKILL window
        self.lock: rundir.RunLock | None = None
        # made by _run(): the data, the plan for it, where the run is, its outputs
        self.data: RunData | None = None
        self.base_config: Any = None
        self.phases: list[Phase] = []
        self.checkpoints: Checkpoints | None = None
        self.c = Counters()
        self.transitions: list[dict[str, Any]] = []  # summary.json's model and layout changes
        self.clock: Stopwatch | None = None  # device time (see the module docstring)
        self.log: MetricsLog | None = None
        self.bar: Progress | None = None
        self.test_scores: dict[str, float] | None = None
        self._pending: Any = 0.0  # the sum of the loss terms since the last row (a device tensor once stepped)
        self._pending_n = 0  # steps in that sum
        self._saved_at: tuple[int, int] | None = None  # (phase, step) of the last checkpoint this process wrote

    @property
    def raw(self) -> torch.nn.Module | None:
        """The unwrapped model (the engine's): the method's hooks change it; final/ saves it."""
        return self.engine.raw

    @property
    def model(self) -> Any:
        """The model as it trains (Accelerate's wrapper, compiled)."""
        return self.engine.model

    @property
    def opt(self) -> Any:
        """The optimizer."""
        return self.engine.opt

    @property
    def resume(self) -> bool:
        """Whether this run continues from a checkpoint."""
        return self.start.resume

    def step_flops(self, config: Any, n_layers: int | None = None) -> int:
        """Training FLOPs of one optimizer step (global batch) for a model of ``config``."""
        return step_flops(self.cfg, self.family, config, n_layers)

    # ------------------------------------------------------------------------------------- the loop

    @terminal_bars()  # a log file gets lines: no bar of transformers or datasets (loading weights, a dataset)
    def run(self) -> dict[str, Any]:
        """Train every phase; write metrics, checkpoints, the final HF checkpoint, plots and a summary.

        Returns:
            The summary (also written to <run>/summary.json).

        Raises:
            NonFiniteLoss: the loss became NaN/inf (the last checkpoint stays intact).
            RunFinished: the run had already completed (exit code 0).
            FileNotFoundError / ValueError: data path missing, data too small (named by progressive.data).
        """
        if self.cfg.train.threads:
            torch.set_num_threads(self.cfg.train.threads)
        if self.cfg.train.keep_host_memory:
            keep_freed_host_memory()  # no mmap/munmap of the logits every CPU step (common/device.py)
        # one stop handler from here to the last file written (a comparison's own, when this is one of its runs)
        with stopping(self.cfg.train.stop_timeout, self.resume_command, f"the run {self.cfg.name}", say=say,
                      main=int(os.environ.get("RANK", "0")) == 0) as self.stop:
            meet(self.cfg.train.rendezvous_timeout, self.stop, say=say)  # a hand-set launch's ranks, interruptibly
            self.acc = build_accelerator(self.cfg)
            self.window = StopWindow(self.cfg.train.stop_timeout, say if self.acc.is_main_process else None)
            self.compiled = compiles(self.cfg)
            self.engine.join(self.acc, self.compiled)
            self.start = agree(self.start, self.acc, self.run_dir)
            self.lock = rundir.RunLock(self.run_dir)  # one writer per folder: the main process holds it
            try:
                self._open()
                return self._run()
            finally:
                self.lock.release()

    def _open(self) -> None:
        """The main process takes the run folder's lock and opens the folder (``_open_run_dir``); every process
        learns whether that worked, so a folder in use (or refused) ends them all, the main one with its one
        line and the others quietly, instead of leaving them waiting in a collective for a process that left."""
        failed: Exception | None = None
        if self.acc.is_main_process:
            try:
                self.lock.acquire()
                self._open_run_dir()
            except Exception as e:  # noqa: BLE001  (raised below, after the other processes are told)
                failed = e
        if self.acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            box = [failed is not None]
            broadcast_object_list(box, from_process=0)
            if box[0] and failed is None:
                raise FileExistsError("")  # the main process says why
        if failed is not None:
            raise failed

    def _run(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.train
        set_seed(t.seed)
        self.data = RunData.load(cfg, self.family)
        self.base_config = self.family.config_for(cfg.model, self.data.info, cfg.data.seq_len)
        self.phases = self.method.plan(self.base_config, self.step_flops)
        if self.acc.is_main_process:  # the corpus a user's own data made, and how often the plan reads it
            print(f"data: {sizes_line(self.data.sizes(sum(p.steps for p in self.phases), t.batch_size))}",
                  file=sys.stderr, flush=True)
        self.checkpoints = Checkpoints(cfg, self.acc, self.method, self.data.fingerprint)
        self.clock, saved = Stopwatch(self.acc.device), None
        if self.resume:
            state, parts = ckpt.load_checkpoint(self.start.checkpoint)
            self.checkpoints.check_data(state, self.start.checkpoint)
            self.c = Counters(**{k: state.get(k, v) for k, v in asdict(Counters()).items()})
            saved = Saved(state, parts, self.start.checkpoint)
        rng = self.engine.setup(RunParts(self.data, self.base_config, self.phases, self.c, self.checkpoints,
                                         self.transitions, self.clock, self._write), saved)
        if saved is not None and self.acc.is_main_process:
            print(f"resuming {cfg.name} from step {self.c.step} (phase {self.c.phase}: "
                  f"{self.phases[self.c.phase].name}), {self.start.checkpoint}", file=sys.stderr)
        self.log = MetricsLog(self.run_dir, self.acc, keep_until_step=self.c.step if self.resume else None)
        self.branches.load(self.resume)
        if missed := self.branches.missed(self.c.step):
            say(f"warning: resumed at step {self.c.step}, past the fork of the branches of {missed} steps, which "
                "cannot run now (they fork off steps this run already took)")
        if self.acc.is_main_process:
            for name in tracker_entries(cfg):  # on the run's record before the tracker makes them
                rundir.claim(self.run_dir, name)
        init_trackers(self.acc, cfg)
        if rng is not None:
            ckpt.set_rng_state(rng)  # last: building models above consumed random numbers
        gc.freeze()  # all allocated so far lives the whole run: free_memory's gc.collect then takes ~1 ms, not 0.6 s
        self.bar = start_progress(cfg, self.phases, self.step_flops, self.base_config, self.c.step,
                                  self.acc.is_main_process, self.runs_after)
        if self.resume:
            self._saved_at = (self.c.phase, self.c.step)  # a stop before the first step needs no new checkpoint
        try:
            with self._stoppable():
                if not self.resume:
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

        self.test_scores = self.engine.test_scores()
        self.engine.final_model()
        summary = finish(self)
        end_training(self.acc)
        return summary

    def _open_run_dir(self) -> None:
        """Main process, at the start, holding the lock: a resume checks that the outputs it will replace are
        its own and removes stale temporaries; a fresh start empties the folder of what its record lists (or
        creates it) and saves the config. What every process may create in the folder goes on the run's
        record now (progressive.run.rundir). Then say which precision runs."""

        if self.resume:
            rundir.adopt_earlier(self.run_dir, (ckpt.CHECKPOINTS, CONFIG, METRICS))
            rundir.check_resume(self.run_dir, (FINAL, SUMMARY, *(PLOTS if self.cfg.train.plots else ())))
            for p in rundir.clean_stale(self.run_dir):
                print(f"removed {p}, left by an interrupted write", file=sys.stderr)
        else:
            rundir.start_fresh(self.run_dir)
            rundir.claim(self.run_dir, CONFIG)
            # a resume: once it is checked. The comment says the precision the recipe may leave unset (null)
            atomic_write_text(self.run_dir / CONFIG, dump_yaml(self.cfg) + precision_comment(self.acc, self.cfg))
        for name in (ckpt.CHECKPOINTS, *self.method.run_folder_entries()):
            rundir.claim(self.run_dir, name)
        print(f"precision: {precision_note(self.acc, self.cfg)}", file=sys.stderr)
        if (missing := device_note(self.acc)) is not None:
            print(f"warning: {missing}", file=sys.stderr)
        self.window.start()

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
            self._pending = self._pending + loss
        self._pending_n += 1
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
        self._saved_at = (self.c.phase, self.c.step)
        self.clock.restart()

    def _flush_loss(self) -> float | None:
        """Mean loss since the last call (all processes), or None; raises NonFiniteLoss on NaN/inf."""
        if self._pending_n == 0:
            return None
        loss = self.engine.global_loss(self._pending / self._pending_n)
        self._pending, self._pending_n = 0.0, 0
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
        if self._saved_at != (self.c.phase, self.c.step):
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
