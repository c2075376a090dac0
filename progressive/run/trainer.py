"""A run from its config: config -> data, model, method -> phases of Accelerate training, checkpoints, logs.

One path through it: ``Trainer(cfg).run()``. The method (progressive/methods/) plans the phases and
answers hooks; this file has no method- or family-specific branch. The global batch of step s is a pure
function of (seed, s) (BERT masks too); the engine trains on it.

The trainer checks the config and the start its caller decided; ``run()`` builds the devices, the run folder and
then the run itself, whole (``TrainingRun``, progressive/run/loop.py: the data, the plan, the counters, the logs),
trains it and writes the outputs. Each part is decided once and then asked, never re-decided:

    start        fresh, resumed from which checkpoint, or finished    progressive/run/start.py
    engine       the step, evaluation, the model's setup, changes,   progressive/run/engine.py (data parallel),
                 checkpoint contents, the final model                progressive/pipeline/engine.py (pipeline)
    data         the splits, the tokenizer, the batch of any step     progressive/run/inputs.py
    checkpoints  what is saved, restored and checked                  progressive/run/state.py
    stop         signals end the run at a step boundary              progressive/run/stop.py

The loop (progressive/run/loop.py: ``train``, ``_train_phase``, ``_after_step``, ``_save``, ``_transition``) is the
same for every engine; what differs between data parallel and the elastic pipeline is the engine's (``Engine``). Its
kind is chosen when the trainer is made (``DataParallel`` unless the caller passes another, as progressive.cli passes
progressive.pipeline.engine's); the engine itself is made, whole, with the run's other parts (``_build``).

Time is the device's: ``wall`` advances only where a ``Stopwatch`` lap has waited for the device's queued
work (common/device.py): once per logged or evaluated row, at checkpoints and level changes, and around
the first step after a compilation; between laps the host runs ahead. Evaluation, logging and checkpoint
I/O are left out of ``wall``; level changes are in it.
"""

from __future__ import annotations

import gc
import os
import sys
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
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.model.flops import model_shape
from progressive.run import checkpoint as ckpt
from progressive.run import rundir
from progressive.run.accelerator import build_accelerator, device_note, precision_comment, precision_note
from progressive.run.branches import Branches, check_can_branch
from progressive.run.compiled import compiles
from progressive.run.engine import Counters, DataParallel, Engine, RunParts, Saved
from progressive.run.faults import KILL_ENV, SIGNAL_ENV  # noqa: F401  (tests import KILL_ENV and SIGNAL_ENV here)
from progressive.run.grace import StopWindow
from progressive.run.inputs import RunData, sizes_line
from progressive.run.loop import NonFiniteLoss, TrainingRun  # noqa: F401  (NonFiniteLoss: callers import it here)
from progressive.run.rendezvous import meet
from progressive.run.start import FINISHED, FRESH, RunFinished, Start, agree  # noqa: F401  (FINISHED: callers)
from progressive.run.state import Checkpoints, resume_command
from progressive.run.stop import StopOnSignal, stopping
from progressive.run.summary import FINAL, PLOTS, SUMMARY, finish
from progressive.run.tracking import (
    METRICS,
    MetricsLog,
    check_tracker,
    init_trackers,
    say,
    start_progress,
    tracker_entries,
)

CONFIG = "config.yaml"  # the run's config, as it resumes (a resume rewrites it once its data is checked)


def run_inputs(cfg: RunConfig) -> dict[str, str | None]:
    """The config fields that may name files or folders the run reads (marked as paths in the config)."""
    return read_paths(cfg)


class Trainer:
    """Runs one config. The constructor validates everything that needs no data (so bad input fails fast) and
    checks the start it is handed against the folder; ``run()`` loads data, trains every phase and writes the outputs.

    Args:
        cfg: the run's config.
        start: how the run starts, decided by the caller before the trainer exists (progressive.run.start:
            ``plan_run`` for the command line, ``decide`` for a library caller or a comparison's method); default a
            fresh run in a folder that must be new or empty.
        engine: the kind of engine (``Engine``), made once the run's parts are built; default ``DataParallel``
            (progressive.cli passes progressive.pipeline.engine's for ``parallel.pipeline``).
    """

    def __init__(self, cfg: RunConfig, start: Start = FRESH, engine: type[Engine] = DataParallel):
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
        self.start = start  # decided once, by the caller; ``agree`` hands the main process's to every process
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
        engine.check(cfg, self.family)
        self.engine_type = engine  # chosen once; the engine itself is made with the run (``_build``)
        check_can_branch(cfg, pipelined=engine.pipelined)
        self.branches = Branches(cfg, self.run_dir)  # train.branches: WSD cooldowns forked off the run
        self.runs: list[TrainingRun] = []  # what ``run()`` built and trained (the engine, the model in it)

    @property
    def engine(self) -> Engine:
        """The engine of the run this trainer trained."""
        if not self.runs:
            raise RuntimeError("Trainer: the engine and its model are made by run(); call it first")
        return self.runs[-1].engine

    @property
    def raw(self) -> torch.nn.Module:
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
                      main=int(os.environ.get("RANK", "0")) == 0) as stop:
            meet(self.cfg.train.rendezvous_timeout, stop, say=say)  # a hand-set launch's ranks, interruptibly
            with stop.joining():  # the process group: a signal there ends this process soon (nothing started)
                acc = build_accelerator(self.cfg)
            window = StopWindow(self.cfg.train.stop_timeout, say if acc.is_main_process else None)
            compiled = compiles(self.cfg)
            self.engine_type.join(self.cfg, acc)
            self.start = agree(self.start, acc, self.run_dir)
            lock = rundir.RunLock(self.run_dir)  # one writer per folder: the main process holds it
            try:
                self._open(acc, lock, window)
                run = self._build(acc, stop, window, compiled)
                self.runs.append(run)
                run.train(evaluate_first=not self.resume)
                test_scores = run.engine.test_scores()
                run.engine.final_model()
                summary = finish(run, test_scores)
                end_training(acc)
                return summary
            finally:
                lock.release()

    def _open(self, acc: Accelerator, lock: rundir.RunLock, window: StopWindow) -> None:
        """The main process takes the run folder's lock and opens the folder (``_open_run_dir``); every process
        learns whether that worked, so a folder in use (or refused) ends them all, the main one with its one
        line and the others quietly, instead of leaving them waiting in a collective for a process that left."""
        failed: Exception | None = None
        if acc.is_main_process:
            try:
                lock.acquire()
                self._open_run_dir(acc, window)
            except Exception as e:  # noqa: BLE001  (raised below, after the other processes are told)
                failed = e
        if acc.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            box = [failed is not None]
            broadcast_object_list(box, from_process=0)
            if box[0] and failed is None:
                raise FileExistsError("")  # the main process says why
        if failed is not None:
            raise failed

    def _build(self, acc: Accelerator, stop: StopOnSignal, window: StopWindow, compiled: bool) -> TrainingRun:
        """Load the data, plan the phases for it, restore a resumed run's state, set the engine up and open the
        logs and the display: the run, whole, ready for its first (or next) step."""
        cfg, t = self.cfg, self.cfg.train
        set_seed(t.seed)
        data = RunData.load(cfg, self.family)
        base_config = self.family.config_for(cfg.model, data.info, cfg.data.seq_len)
        phases = self.method.plan(base_config, self.step_flops)
        if acc.is_main_process:  # the corpus a user's own data made, and how often the plan reads it
            print(f"data: {sizes_line(data.sizes(sum(p.steps for p in phases), t.batch_size))}",
                  file=sys.stderr, flush=True)
        checkpoints = Checkpoints(cfg, acc, self.method, data.fingerprint)
        clock, saved, c = Stopwatch(acc.device), None, Counters()
        if self.resume:
            state, parts = ckpt.load_checkpoint(self.start.checkpoint)
            checkpoints.check_data(state, self.start.checkpoint)
            c = Counters(**{k: state.get(k, v) for k, v in asdict(Counters()).items()})
            saved = Saved(state, parts, self.start.checkpoint)
        transitions: list[dict[str, Any]] = []
        engine = self.engine_type(cfg, self.family, self.method, self.step_flops, acc, compiled,
                                  RunParts(data, base_config, phases, c, checkpoints, transitions, clock,
                                           lambda line: bar.write(line)), saved)  # lines beside the display
        if saved is not None and acc.is_main_process:
            print(f"resuming {cfg.name} from step {c.step} (phase {c.phase}: {phases[c.phase].name}), "
                  f"{self.start.checkpoint}", file=sys.stderr)
        log = MetricsLog(self.run_dir, acc, keep_until_step=c.step if self.resume else None)
        self.branches.load(self.resume)
        if missed := self.branches.missed(c.step):
            say(f"warning: resumed at step {c.step}, past the fork of the branches of {missed} steps, which "
                "cannot run now (they fork off steps this run already took)")
        if acc.is_main_process:
            for name in tracker_entries(cfg):  # on the run's record before the tracker makes them
                rundir.claim(self.run_dir, name)
        init_trackers(acc, cfg)
        if engine.restored_rng is not None:
            ckpt.set_rng_state(engine.restored_rng)  # last: building models above consumed random numbers
        gc.freeze()  # all allocated so far lives the whole run: free_memory's gc.collect then takes ~1 ms, not 0.6 s
        bar = start_progress(cfg, phases, self.step_flops, base_config, c.step, acc.is_main_process,
                             self.runs_after)
        # a resumed run's stop before its first step needs no new checkpoint
        saved_at = (c.phase, c.step) if self.resume else (-1, -1)
        return TrainingRun(cfg, self.family, self.method, engine, self.branches, acc, stop, window, compiled,
                           self.resume_command, data, base_config, phases, checkpoints, c, transitions, clock, log,
                           bar, saved_at)

    def _open_run_dir(self, acc: Accelerator, window: StopWindow) -> None:
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
            atomic_write_text(self.run_dir / CONFIG, dump_yaml(self.cfg) + precision_comment(acc, self.cfg))
        for name in (ckpt.CHECKPOINTS, *self.method.run_folder_entries()):
            rundir.claim(self.run_dir, name)
        print(f"precision: {precision_note(acc, self.cfg)}", file=sys.stderr)
        if (missing := device_note(acc)) is not None:
            print(f"warning: {missing}", file=sys.stderr)
        window.start()

