"""The training loop: config -> data, model, method -> phases of Accelerate training, checkpoints, logs.

One path through it: ``Trainer(cfg).run()``. The method (progressive/methods/) plans the phases and
answers hooks; this file has no method- or family-specific branch. Per optimizer step: the global batch
of step s is a pure function of (seed, s) (BERT masks too), each process takes its slice, ``grad_accum``
micro-batches accumulate gradients (DDP sync only on the last), then clip, AdamW, LR schedule. The next
step's slice is built on a background thread meanwhile (progressive/run/feed.py).

The trainer holds its parts; each is decided once and then asked, never re-decided:

    start        fresh, resumed from which checkpoint, or finished    progressive/run/start.py
    data         the splits, the tokenizer, the batch of any step     progressive/run/inputs.py
    sharding     whole model per process (DDP) or FSDP2 shards        progressive/run/sharding.py
    checkpoints  what is saved, restored and checked                  progressive/run/state.py
    stop         signals end the run at a step boundary              progressive/run/stop.py

The loop (``_run``, ``_train_phase``, ``_after_step``, ``_save``) is the one every engine runs. The step
itself, evaluation, how the model is built or restored, what a checkpoint holds, the changes a method makes
after a step and the final model are the engine's part: the methods below under "the engine", which the
elastic pipeline (progressive/pipeline/engine.py) replaces, and nothing else.

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
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from accelerate.utils import set_seed

from common.device import Stopwatch, keep_freed_host_memory, peak_flops, peak_memory_gb
from common.io import atomic_write_text
from common.trackers import end_training
from progressive.config import ConfigError, RunConfig, dump_yaml, read_paths, resume_diff, to_dict, validate
from progressive.methods import get_method
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.model.flops import model_shape
from progressive.model.loss import chunks
from progressive.run import checkpoint as ckpt
from progressive.run import rundir, sharding
from progressive.run.accelerator import (
    build_accelerator,
    build_optimizer,
    build_scheduler,
    device_note,
    precision_note,
    reprepare,
    set_peak_lr,
)
from progressive.run.compiled import compile_blocks, compile_model, compiles, graphs_compiled
from progressive.run.faults import KILL_ENV, SIGNAL_ENV, armed  # noqa: F401  (tests import KILL_ENV and SIGNAL_ENV here)
from progressive.run.feed import BatchFeed
from progressive.run.inputs import RunData
from progressive.run.start import FINISHED, RunFinished, Start, agree, decide  # noqa: F401  (FINISHED: callers)
from progressive.run.state import Checkpoints, resume_command
from progressive.run.stop import Interrupted, Stopped, stopping
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


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or inf; the last checkpoint on disk predates it."""


@dataclass
class Counters:
    """Where the run is. ``step``: optimizer steps done; ``wall``: training seconds (no eval/checkpoint I/O)."""

    phase: int = 0
    step: int = 0
    step_in_phase: int = 0
    tokens: int = 0
    flops: int = 0
    wall: float = 0.0  # device time: see the module docstring
    compile_s: float = 0.0  # of ``wall``: the steps during which torch.compile compiled (train.compile)
    compile_flops: int = 0  # of ``flops``: those steps' (per-level rates leave them out)
    compile_tokens: int = 0  # of ``tokens``: likewise


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
    """

    def __init__(self, cfg: RunConfig, resume: bool | str = False, overwrite: bool = False,
                 start: Start | None = None):
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
                              f"({model_shape(phases[0].config).label}, not {model_shape(guess).label}); init_from needs a method "
                              "whose first phase trains the full model (baseline, vcycle, autofreeze)")
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

    @property
    def resume(self) -> bool:
        """Whether this run continues from a checkpoint."""
        return self.start.resume

    def step_flops(self, config: Any, n_layers: int | None = None) -> int:
        """Training FLOPs of one optimizer step (global batch) for a model of ``config``."""
        return step_flops(self.cfg, self.family, config, n_layers)

    # ------------------------------------------------------------------------------------- the loop

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
            self.acc = build_accelerator(self.cfg)
            self.compiled = compiles(self.cfg)
            self._join()
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
        self.data = RunData.load(cfg, self.family, self.acc)
        self.base_config = self.family.config_for(cfg.model, self.data.info, cfg.data.seq_len)
        self.chunked = chunks(t, self.base_config.vocab_size if self.family.head else 0, cfg.data.seq_len,
                              self.acc.num_processes, compiled_whole=self.compiled and not self.sharding.sharded)
        self.phases = self.method.plan(self.base_config, self.step_flops)
        self.checkpoints = Checkpoints(cfg, self.acc, self.method, self.data.fingerprint)
        self._pending, self._pending_n = torch.zeros((), device=self.acc.device), 0
        self.clock, self.feed = Stopwatch(self.acc.device), None
        self.c, saved = Counters(), None
        self.transitions: list[dict[str, Any]] = []
        if self.resume:
            state, parts = ckpt.load_checkpoint(self.start.checkpoint)
            self.checkpoints.check_data(state, self.start.checkpoint)
            self.c = Counters(**{k: state.get(k, v) for k, v in asdict(Counters()).items()})
            saved = (state, parts)
        rng = self._setup(saved)
        if saved is not None and self.acc.is_main_process:
            print(f"resuming {cfg.name} from step {self.c.step} (phase {self.c.phase}: "
                  f"{self.phases[self.c.phase].name}), {self.start.checkpoint}", file=sys.stderr)
        self.log = MetricsLog(self.run_dir, self.acc, keep_until_step=self.c.step if self.resume else None)
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
                    self.log.log(self._row("val", **self.evaluate()))
                c = self.c
                self._window = (c.wall - c.compile_s, c.tokens - c.compile_tokens, c.flops - c.compile_flops)
                self.clock.restart()
                if self.stop.requested(at_once=True):  # a signal while the run was loading
                    self._stop_at_boundary()
                start = self.c.phase
                for index in range(start, len(self.phases)):
                    if index > start:
                        self._transition(index)
                    self._train_phase(self.phases[index].steps)
        except (Stopped, NonFiniteLoss):
            end_training(self.acc)  # a stop for requeue (its checkpoint written) leaves the trackers flushed
            raise
        finally:
            if self.feed is not None:
                self.feed.close()
            self.bar.close()
            self.log.close()
            self.method.finish()
        from progressive.run.summary import finish

        self.test_scores = self._test_scores()
        self._final_model()
        summary = finish(self)
        end_training(self.acc)
        return summary

    def _open_run_dir(self) -> None:
        """Main process, at the start, holding the lock: a resume checks that the outputs it will replace are
        its own and removes stale temporaries; a fresh start empties the folder of what its record lists (or
        creates it) and saves the config. What every process may create in the folder goes on the run's
        record now (progressive.run.rundir). Then say which precision runs."""
        from progressive.run.summary import FINAL, PLOTS, SUMMARY

        if self.resume:
            rundir.adopt_earlier(self.run_dir, (ckpt.CHECKPOINTS, CONFIG, METRICS))
            rundir.check_resume(self.run_dir, (FINAL, SUMMARY, *(PLOTS if self.cfg.train.plots else ())))
            for p in rundir.clean_stale(self.run_dir):
                print(f"removed {p}, left by an interrupted write", file=sys.stderr)
        else:
            rundir.start_fresh(self.run_dir)
            rundir.claim(self.run_dir, CONFIG)
            atomic_write_text(self.run_dir / CONFIG, dump_yaml(self.cfg))  # a resume: once it is checked
        for name in (ckpt.CHECKPOINTS, *self.method.run_folder_entries()):
            rundir.claim(self.run_dir, name)
        print(f"precision: {precision_note(self.acc, self.cfg)}", file=sys.stderr)
        if (missing := device_note(self.acc)) is not None:
            print(f"warning: {missing}", file=sys.stderr)

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

    def _after_step(self, lr: float, epoch_before: int) -> None:
        """After every step: a train row and an evaluation when due, the method's changes, a checkpoint."""
        t, c = self.cfg.train, self.c
        phase = self.phases[c.phase]
        last = c.step_in_phase == phase.steps
        log, evaluate = self._row_due(), c.step % t.eval_every == 0 or last
        if log or evaluate:
            self._tick()  # the one synchronization of this row: wall, tokens/s and the ETA are the device's
        if log:
            loss = self._flush_loss()
            fields, shown = self._row_fields()
            self.log.log(self._row("train", loss=loss, lr=lr, **fields))
            self.bar.update(c.step - self.bar.n, phase.name, loss, lr, c.wall, c.tokens, c.flops, shown)
        if evaluate:
            self.log.log(self._row("val", **self.evaluate()))
        if log or evaluate:
            self.clock.restart()  # logging and evaluation are not training time
        self._changes(epoch_before)
        if c.step % t.checkpoint_every == 0:
            self._save()
        if (faults := armed()) is not None:  # tests only: a kill or a signal due after this step
            faults.after_step(c.step, self.acc.process_index, stopping=lambda: self.stop.signum is not None)

    def _save(self) -> None:
        """A checkpoint of this step, written by every process together (the steps so far are training time;
        writing it is not)."""
        self._tick()
        self._flush_loss()  # a resumed run averages its logged losses over the same steps
        parts, finite, staged, extra = self._checkpoint_parts()
        if self.acc.is_main_process:
            self.checkpoints.write(self.c, self.phases[self.c.phase].name, parts, finite, staged, **extra)
        self.acc.wait_for_everyone()
        self._saved_at = (self.c.phase, self.c.step)
        self.clock.restart()

    def _flush_loss(self) -> float | None:
        """Mean loss since the last call (all processes), or None; raises NonFiniteLoss on NaN/inf."""
        if self._pending_n == 0:
            return None
        loss = self._global_loss(self._pending / self._pending_n)
        self._pending = torch.zeros_like(self._pending) if torch.is_tensor(self._pending) else 0.0
        self._pending_n = 0
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
        if getattr(self, "_saved_at", None) != (self.c.phase, self.c.step):
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

    def _flops(self, n_layers: int | None) -> int:
        if n_layers not in self._flops_cache:  # emptied whenever the model changes
            self._flops_cache[n_layers] = self.step_flops(self.raw.config, n_layers)
        return self._flops_cache[n_layers]

    # ------------------------------------------------------------------------------------- the engine
    # Data parallel (one process, DDP or FSDP2 through Accelerate). progressive/pipeline/engine.py replaces
    # exactly these methods.

    def _join(self) -> None:
        """The processes' arrangement, decided once: how the model is held (``sharding``), and whether the
        global batch divides among them."""
        t = self.cfg.train
        self.sharding = sharding.choose(self.cfg, self.acc)
        world = self.acc.num_processes
        if t.batch_size % (world * t.grad_accum):
            raise ConfigError(f"train.batch_size: {t.batch_size} is not divisible by processes x grad_accum = "
                              f"{world} x {t.grad_accum}")

    def _setup(self, saved: tuple[dict, dict] | None) -> dict | None:
        """Build the model of the current phase (fresh, or the checkpoint's ``saved`` = (state, parts)) with its
        optimizer and scheduler; returns the generator states to restore (None for a fresh run)."""
        self.feed = BatchFeed(self._rank_batch, pin=self.acc.device.type == "cuda")
        self.peak = peak_flops(self.acc.device, self.cfg.train.peak_tflops)
        if saved is None:
            set_seed(self.cfg.train.seed)
            model = self.family.build_model(self.phases[0].config, init_from=self.cfg.model.init_from)
            self.method.on_model(model)
            self._set_trio(model, None, None)
            return None
        state, parts = saved
        if bool(state.get("sharded")) != self.sharding.sharded:
            was = "with" if state.get("sharded") else "without"
            raise ConfigError(f"resume: {self.start.checkpoint} was written {was} FSDP2 and this run is "
                              f"{'' if self.sharding.sharded else 'not '}sharded; resume it the way it was "
                              "launched (train.fsdp / the accelerate config)")
        model = self.family.build_model(self.phases[self.c.phase].config)
        try:
            self.sharding.load_whole(model, parts)
        except RuntimeError as e:  # an edited state.json written before it carried a digest of itself
            first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e)[:200])
            raise ckpt.CheckpointError(f"{self.start.checkpoint}: its weights do not fit the model that the config in "
                                       f"its {ckpt.STATE} describes ({first}); the checkpoint was edited: restore it, "
                                       "or move it out to resume from the one before") from None
        self.method.load_state_dict(parts["method"])
        self.method.on_model(model)
        self._set_trio(model, parts.get("optimizer"), parts["scheduler"])
        self.sharding.load_shards(self.raw, self.opt.optimizer, self.start.checkpoint)
        return self.checkpoints.load_local(self.start.checkpoint, state) or parts["rng"]  # this process's own

    def _rank_batch(self, step: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        return self.data.step_batch(self.cfg, step, self.acc.process_index, self.acc.num_processes)

    def _set_trio(self, model: torch.nn.Module, opt_state: dict | None, sched_state: dict | None,
                  named_state: dict | None = None) -> None:
        """Build optimizer + scheduler for the current phase around ``model`` and (re)prepare all three."""
        from operators import load_named_optimizer_state

        phase = self.phases[self.c.phase]
        self.model = self.opt = self.sched = self.raw = None  # drop our references before Accelerate drops its own
        if self.chunked:
            self.family.chunked_loss(model)  # the loss without whole logits (progressive/model/loss.py)
        if self.compiled and self.sharding.sharded:
            compile_blocks(model)  # before sharding: FSDP2's hooks stay outside the compiled blocks
        named_state = self.sharding.place(model, named_state)
        opt = build_optimizer(model, self.cfg.train, phase.peak_lr, self.acc.device)
        sched = build_scheduler(opt, phase)
        if named_state:
            # only parameters this optimizer trains (frozen ones have no slot in it)
            trainable = {n for n, p in model.named_parameters() if p.requires_grad}
            load_named_optimizer_state(model, opt, {n: s for n, s in named_state.items() if n in trainable})
            for st in opt.state.values():  # fused AdamW wants its step counters on the parameters' device
                if torch.is_tensor(st.get("step")):
                    st["step"] = st["step"].to(self.acc.device, torch.float32)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        if sched_state is not None:
            sched.load_state_dict(sched_state)
            set_peak_lr(sched, phase.peak_lr)  # the phase's peak from the current config (resume may lower it)
        self.model, self.opt, self.sched = reprepare(self.acc, model, opt, sched,
                                                     wrap_model=self.sharding.prepare_model)
        if self.compiled and not self.sharding.sharded:
            self.model = compile_model(self.model)  # after DDP's wrapper, as Accelerate's own compile does
        # The module itself, not torch.compile's wrapper: methods change it (layer lists, freezing). Its forward
        # is restored: Accelerate wraps it in autocast *and* a copy of every output to fp32, i.e. the whole
        # B x T x V logits (3% of a GPT-2-124M step on an H200), though the loss is computed inside the forward;
        # the steps and evaluations run under ``acc.autocast()`` instead (the same region, without the copy),
        # which also gives the precision to a model sharded outside Accelerate (train.fsdp without its launcher)
        self.raw = self.acc.unwrap_model(self.model, keep_fp32_wrapper=False, keep_torch_compile=False)
        self._compiling = self.compiled  # the next step may compile: its time is reported if it did
        self._flops_cache: dict[int | None, int] = {}

    def _blank(self) -> torch.nn.Module:
        """A plain model of the current shape on the device, for a sharded model's weights to be copied
        into. Its initialisation runs on forked generators: the run's random stream stays an unsharded run's."""
        with torch.random.fork_rng(devices=[]):
            return self.family.build_model(self.raw.config).to(self.acc.device)

    def _train_step(self) -> None:
        t, c = self.cfg.train, self.c
        compiling = self._compiling
        if compiling:  # the first step of a new model is timed on its own: compile_s, if dynamo compiled in it
            self._tick()
            graphs = graphs_compiled()
        plan = self.method.before_step(c.step, self.raw)
        ids, batch = self.feed.get(c.step)  # this process's rows of the global batch, built ahead
        micro = t.batch_size // self.acc.num_processes // t.grad_accum
        first = self.acc.process_index * micro * t.grad_accum  # where this process's rows start in ``ids``
        applications = []  # per micro-batch: layer applications the method ran (None: as the plan says)
        for j in range(t.grad_accum):
            applications.append(self.method.before_micro_batch(c.step, j, self.raw))
            lo = j * micro
            mb = {k: v[lo:lo + micro].to(self.acc.device, non_blocking=True) for k, v in batch.items()}
            sync = contextlib.nullcontext() if j == t.grad_accum - 1 else sharding.no_sync(self.acc, self.model)
            with sync:
                with self.acc.autocast():
                    loss = self.method.forward(self.model, mb, ids[first + lo:first + lo + micro]).loss
                self.acc.backward(loss / t.grad_accum)
            self._pending = self._pending + loss.detach().float() / t.grad_accum
        self._pending_n += 1
        self.method.on_gradients(c.step, self.raw)
        if t.max_grad_norm > 0:
            self.acc.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.method.after_step(c.step, self.raw)
        config = self.raw.config
        epoch_before = c.step * t.batch_size // self.data.n_train
        flops_before, tokens_before = c.flops, c.tokens
        c.step, c.step_in_phase = c.step + 1, c.step_in_phase + 1
        c.tokens += t.batch_size * self.family.tokens_per_sample(config, self.cfg.data.seq_len)
        c.flops += plan.flops if plan.flops is not None else self._flops_run(plan.n_layers, applications)
        if compiling:
            seconds, self._compiling = self._tick(), False
            if graphs_compiled() > graphs:  # a shape seen before reuses its graph: a plain step, not compilation
                c.compile_s += seconds
                c.compile_flops += c.flops - flops_before
                c.compile_tokens += c.tokens - tokens_before
        self._after_step(lr, epoch_before)

    def _flops_run(self, n_layers: int | None, applications: list[int | None]) -> int:
        """FLOPs of the step just run. A micro-batch for which the method reported its layer applications
        (shared layers may run several times) costs head + embeddings + that many layers: the analytic
        count is linear in the layers, and every term is a multiple of the batch, so this is exact."""
        if all(a is None for a in applications):
            return self._flops(n_layers)
        base, per_layer = self._flops(0), self._flops(1) - self._flops(0)
        total = sum(self._flops(n_layers) if a is None else base + a * per_layer for a in applications)
        return total // len(applications)

    def _global_loss(self, mean: torch.Tensor) -> float:
        """This process's mean loss -> the mean over all processes (one collective)."""
        return self.acc.reduce(mean, reduction="mean").item()

    def _tick(self) -> float:
        """Count the device time since the last mark into ``wall`` (one synchronization); returns it."""
        seconds = self.clock.lap()
        self.c.wall += seconds
        return seconds

    def _row_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(a train row's fields beyond the counters, those the progress bar shows): the method's, and the
        speed since the previous row:
        tokens/s (all processes), model TFLOP/s and MFU per device (MFU against the peak of
        ``common.device.peak_flops``, or ``train.peak_tflops``), this process's peak memory, and the
        milliseconds per step spent building the batch and waiting for it."""
        c, world = self.c, self.acc.num_processes
        wall, tokens, flops = self._window
        # the steps that compiled are left out of the rates (their seconds are compilation, not training)
        self._window = (c.wall - c.compile_s, c.tokens - c.compile_tokens, c.flops - c.compile_flops)
        now_wall, now_tokens, now_flops = self._window
        out: dict[str, Any] = {}
        if now_wall > wall and now_flops > flops:  # (a window of only compiling steps has no rate)
            per_device = (now_flops - flops) / (now_wall - wall) / world
            # 4 significant digits, not 4 decimals: a CPU's 5e-5 TFLOP/s would round to 1e-4 (or to 0)
            out = {"tok_s": round((now_tokens - tokens) / (now_wall - wall), 1),
                   "tflops": float(f"{per_device / 1e12:.4g}")}
            if self.peak:
                out["mfu"] = float(f"{per_device / self.peak:.4g}")
        shown = self.method.log_fields()
        return {**shown, **out, "mem_gb": round(peak_memory_gb(self.acc.device), 3), **self.feed.take_times()}, shown

    @torch.no_grad()
    def evaluate(self, data: Any = None, n: int | None = None) -> dict[str, float]:
        """{"val_loss", and "val_accuracy" when classifying}: over the first ``n`` samples of ``data`` (default:
        eval_batches * batch_size validation samples), fixed masks."""
        t = self.cfg.train
        data = self.data.val if data is None else data
        n = min(self.data.n_val, t.eval_batches * t.batch_size) if n is None else n
        micro = t.batch_size // t.grad_accum
        mine = np.arange(n)[self.acc.process_index::self.acc.num_processes]
        classify = self.family.objective in ("cls", "seqcls")
        total = torch.zeros(3, device=self.acc.device, dtype=torch.float64)
        # The unwrapped model, under the run's autocast: no DDP collectives, so ranks may run different numbers
        # of batches (a sharded model: as many as the process with the most rows, see Sharded.eval_count).
        count = self.sharding.eval_count(n, len(mine))
        self.raw.eval()
        for j in range(0, count, micro):
            rows = mine[j:j + micro]
            batch = self.data.batch(data, rows if len(rows) else np.arange(1), seed=t.seed * 7919 + 104729 + j)
            weight = (batch["labels"] != -100).sum() if self.family.is_text else len(batch["labels"])
            batch = {k: v.to(self.acc.device) for k, v in batch.items()}
            with self.acc.autocast():
                out = self.raw(**batch)
            if not len(rows):
                continue
            right = (out.logits.argmax(-1) == batch["labels"]).sum().double() if classify else out.loss.new_zeros(())
            total += torch.stack([out.loss.double() * float(weight), torch.tensor(float(weight), dtype=torch.float64,
                                                                                  device=self.acc.device), right.double()])
        self.raw.train()
        total = self.acc.reduce(total, reduction="sum")
        scores = {"val_loss": float(total[0] / total[1])}
        if classify:
            scores["val_accuracy"] = float(total[2] / total[1])
        return scores

    def _changes(self, epoch_before: int) -> None:
        """The method's changes after a step (AutoFreeze freezing layers, at a step or an epoch's end): the
        optimizer is rebuilt around the changed model; the schedule goes on."""
        c, phase = self.c, self.phases[self.c.phase]
        epoch = c.step * self.cfg.train.batch_size // self.data.n_train
        changes = [self.method.change_after_step(c.step - 1, self.raw, self.opt.optimizer)]
        if epoch > epoch_before:
            changes.append(self.method.on_epoch_end(epoch_before, self.raw, self.opt.optimizer))
        for change in filter(None, changes):
            self.method.on_model(change.model)
            self._set_trio(change.model, None, self.sched.state_dict(), named_state=change.optimizer_state)
            self.transitions.append({"step": c.step, "to": phase.name, "note": change.note, "seconds": 0.0})
            if self.acc.is_main_process:
                self.bar.write(f"[step {c.step}] {change.note}")

    def _transition(self, index: int) -> None:
        """A level change: the method's operators map the model and its AdamW moments to phase ``index``."""
        self._tick()  # the steps before it (nothing, when the phase's last row has just been logged)
        self._flush_loss()
        lr = self.phases[self.c.phase].peak_lr
        model, opt = self.sharding.whole(self.raw, self.opt.optimizer, self._blank,
                                         lambda m: build_optimizer(m, self.cfg.train, lr, self.acc.device))
        change = self.method.transition(index, self.phases, model, opt)
        del model, opt
        operators = self._tick()  # the gather (FSDP2) and the method's operators on weights and moments
        self.method.on_model(change.model)
        self.c.phase, self.c.step_in_phase = index, 0
        self._set_trio(change.model, None, None, named_state=change.optimizer_state)
        rebuild = self._tick()  # optimizer, scheduler, sharding, Accelerate's prepare
        seconds = operators + rebuild
        self.transitions.append({"step": self.c.step, "to": self.phases[index].name, "note": change.note,
                                 "seconds": round(seconds, 3), "operators_s": round(operators, 3),
                                 "rebuild_s": round(rebuild, 3)})
        if self.acc.is_main_process:
            self.bar.write(f"[step {self.c.step}] {change.note} ({seconds:.2f}s); now {self.phases[index].name}")
        self._save()  # every transition is a checkpoint: resuming never redoes a level change

    def _checkpoint_parts(self) -> tuple[dict[str, Any], bool, Any, dict[str, Any]]:
        """(the main process's parts, whether every weight is finite, the staging folder of every process's
        own parts, more state.json fields); every process calls it."""
        staged, finite = self.checkpoints.stage(self.c, self.sharding, self.raw, self.opt.optimizer)
        parts: dict[str, Any] = {}
        if self.acc.is_main_process:
            parts, whole_finite = self.sharding.main_parts(self.raw, self.opt)
            parts.update(scheduler=self.sched.state_dict(), rng=ckpt.rng_state())
            finite = finite and whole_finite
        return parts, finite, staged, {"sharded": self.sharding.sharded}

    def _test_scores(self) -> dict[str, float] | None:
        """The whole test split, evaluated once at the end (data.test_fraction > 0; nothing is tuned on it)."""
        return None if self.data.test is None else self.evaluate(self.data.test, len(self.data.test))

    def _final_model(self) -> None:
        """``raw`` on the main process holds the whole trained model (final/ is a plain save_pretrained folder)."""
        self.raw = self.sharding.to_main(self.raw, self._blank)
