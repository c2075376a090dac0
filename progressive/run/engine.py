"""The engine: the part of a run that differs between data parallel and the elastic pipeline.

The trainer (progressive/run/trainer.py) builds the run and the loop (progressive/run/loop.py) drives it: phases,
rows, evaluation and checkpoints when due, the stop at a step boundary, the outputs. The kind of engine is chosen
when the trainer is made; the engine itself is made, whole, once the processes have joined and the run's parts are
built, and the loop asks it for the rest (``Engine``): one step, the global loss, device time, a row's speed fields,
evaluation, the method's changes after a step, a level change, what a checkpoint holds, the test split's scores and
the final model.

    DataParallel     here: every process a replica (DDP) or a shard (FSDP2), through Accelerate
    PipelineEngine   progressive/pipeline/engine.py: PipeTransformer's stages x replicas, re-laid as layers freeze

What the trainer builds for a run and both sides use (the data, the phases, the counters, the checkpoints,
the transitions) is lent to the engine once, as one ``RunParts``; the engine reads nothing else of the
trainer's.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from common.device import Stopwatch, peak_flops, peak_memory_gb
from progressive.config import ConfigError, RunConfig
from progressive.methods.base import Method, Phase
from progressive.model.loss import chunks
from progressive.run import checkpoint as ckpt
from progressive.run import sharding
from progressive.run.accelerator import build_optimizer, build_optimizer_and_scheduler, reprepare
from progressive.run.compiled import compile_blocks, compile_model, graphs_compiled
from progressive.run.feed import BatchFeed
from progressive.run.inputs import RunData
from progressive.run.state import Checkpoints


@dataclass
class Counters:
    """Where the run is. ``step``: optimizer steps done; ``wall``: training seconds (no eval/checkpoint I/O)."""

    phase: int = 0
    step: int = 0
    step_in_phase: int = 0
    tokens: int = 0
    flops: int = 0
    wall: float = 0.0  # device time: see progressive/run/trainer.py's docstring
    compile_s: float = 0.0  # of ``wall``: the steps during which torch.compile compiled (train.compile)
    compile_flops: int = 0  # of ``flops``: those steps' (per-level rates leave them out)
    compile_tokens: int = 0  # of ``tokens``: likewise


@dataclass
class RunParts:
    """What the trainer built for a run and lends its engine (the same objects: the engine advances the
    counters and appends its changes to the transitions).

    Attributes:
        data: the splits and the batch of any step.
        base_config: the full model's HF config for this data.
        phases: the method's phases.
        c: the counters.
        checkpoints: what a checkpoint saves and a resume checks.
        transitions: summary.json's record of model and layout changes.
        clock: the device-time stopwatch the trainer restarts after rows, evaluations and checkpoints.
        write: prints a line beside the progress bar (main process).
    """

    data: RunData
    base_config: Any
    phases: list[Phase]
    c: Counters
    checkpoints: Checkpoints
    transitions: list[dict[str, Any]]
    clock: Stopwatch
    write: Callable[[str], None]


class Saved(NamedTuple):
    """A checkpoint being resumed: its state.json, the main process's parts, and its folder."""

    state: dict[str, Any]
    parts: dict[str, Any]
    checkpoint: Path


class Stepped(NamedTuple):
    """What one step hands back to the loop: the LR it used, the epoch before it (for ``changes``), and its
    loss terms, added in this order to the trainer's running sum (device tensors or floats)."""

    lr: float
    epoch_before: int
    losses: list[Any]


class Engine(Protocol):
    """The parts of a run that differ between engines. The trainer calls ``check`` when it is made, ``join`` once
    the processes have an Accelerator, then makes the engine, whole, from the run's parts (``restored_rng``: the
    generator states a resumed run restores), and calls the rest in this order. ``raw`` is the unwrapped model
    (the method's hooks, FLOPs, the final checkpoint); ``model`` and ``opt`` what trains it; ``pipelined``
    whether it runs stages (cooldown branches need a replicated model)."""

    pipelined: bool
    raw: torch.nn.Module
    restored_rng: dict | None

    def __init__(self, cfg: RunConfig, family: Any, method: Method, step_flops: Callable[[Any, int | None], int],
                 acc: Accelerator, compiled: bool, run: RunParts, saved: Saved | None) -> None:
        """Build the model of the current phase (fresh or ``saved``) and what trains it."""

    @staticmethod
    def check(cfg: RunConfig, family: Any) -> None:
        """Refuse, before any data loads, a config this engine cannot run (ConfigError)."""

    @staticmethod
    def join(cfg: RunConfig, acc: Accelerator) -> None:
        """Arrange the processes; raises ConfigError when they cannot run the config."""

    @property
    def model(self) -> Any: ...

    @property
    def opt(self) -> Any: ...

    def step(self) -> Stepped:
        """One optimizer step; advances ``run.c``."""

    def global_loss(self, mean: Any) -> float:
        """This process's mean loss since the last row -> the run's."""

    def tick(self) -> float:
        """Count device time since the clock's last mark into ``run.c.wall``; returns the seconds counted."""

    def row_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(a train row's fields beyond the counters, those the progress bar shows)."""

    def evaluate(self, data: Any = None, n: int | None = None) -> dict[str, float]:
        """{"val_loss", and "val_accuracy" when classifying} on ``data`` (default: the validation split)."""

    def changes(self, epoch_before: int) -> None:
        """The method's changes after a step (a freeze, a re-layout)."""

    def transition(self, index: int) -> tuple[str, float, float]:
        """A level change to phase ``index``: (note, operators' seconds, rebuild seconds); sets ``run.c.phase``."""

    def checkpoint_parts(self) -> tuple[dict[str, Any], bool, Any, dict[str, Any]]:
        """(the main process's parts, whether every weight is finite, the staging folder, more state.json)."""

    def test_scores(self) -> dict[str, float] | None:
        """The whole test split's scores, or None."""

    def final_model(self) -> None:
        """Make ``raw`` on the main process the whole trained model."""

    def close(self) -> None:
        """Release what the engine runs in the background."""


class FlopsCount:
    """Training FLOPs of one step of the current model, per number of layers run; ``clear`` when it changes."""

    def __init__(self, step_flops: Callable[[Any, int | None], int]):
        self.step_flops = step_flops
        self.cache: dict[int | None, int] = {}

    def __call__(self, config: Any, n_layers: int | None) -> int:
        if n_layers not in self.cache:
            self.cache[n_layers] = self.step_flops(config, n_layers)
        return self.cache[n_layers]

    def clear(self) -> None:
        self.cache = {}


class DataParallel:
    """Every process holds the model (DDP) or a shard of it (FSDP2, progressive/run/sharding.py) and takes its
    slice of each global batch; ``grad_accum`` micro-batches accumulate gradients (DDP syncs on the last),
    then clipping, AdamW, the LR schedule. The next step's slice is built on a background thread meanwhile
    (progressive/run/feed.py).

    Made once the processes have joined (``join``) and the run's parts are built: the model of the current phase
    (fresh, or the checkpoint's) with its optimizer and scheduler, whole from the start.

    Args:
        cfg: the run's config.
        family: the model family.
        method: the method (its hooks run around every step).
        step_flops: (HF config, layers run) -> one step's training FLOPs.
        acc: the run's Accelerator.
        compiled: train.compile, as decided for this device.
        run: the parts the trainer built (the data, the phases, the counters, ...).
        saved: the checkpoint being resumed, or None for a fresh run.
    """

    pipelined = False

    @staticmethod
    def check(cfg: RunConfig, family: Any) -> None:
        """What is refused before any data loads: nothing beyond the config's own checks."""

    @staticmethod
    def join(cfg: RunConfig, acc: Accelerator) -> None:
        """Whether the global batch divides among the processes (decided once, before the run folder opens)."""
        t, world = cfg.train, acc.num_processes
        if t.batch_size % (world * t.grad_accum):
            raise ConfigError(f"train.batch_size: {t.batch_size} is not divisible by processes x grad_accum = "
                              f"{world} x {t.grad_accum}")

    def __init__(self, cfg: RunConfig, family: Any, method: Method, step_flops: Callable[[Any, int | None], int],
                 acc: Accelerator, compiled: bool, run: RunParts, saved: Saved | None):
        self.cfg, self.family, self.method = cfg, family, method
        self.flops = FlopsCount(step_flops)
        self.acc, self.compiled, self.run = acc, compiled, run
        self.sharding = sharding.choose(cfg, acc)
        self.chunked = chunks(cfg.train, run.base_config.vocab_size if family.head else 0, cfg.data.seq_len,
                              acc.num_processes, compiled_whole=compiled and not self.sharding.sharded)
        self.peak = peak_flops(acc.device, cfg.train.peak_tflops)  # the device's peak FLOP/s, for MFU
        c = run.c
        self._window = (c.wall - c.compile_s, c.tokens - c.compile_tokens, c.flops - c.compile_flops)
        self._compiling = False  # the next step may compile: its time is reported if it did
        model, opt_state, sched_state = self._first_model(saved)
        # the model as Accelerate prepared it (DDP, compiled), its optimizer and scheduler, and the module itself
        self.model, self.opt, self.sched, self.raw = self._prepared(model, opt_state, sched_state)
        # the generator states the trainer restores: a resumed run's (this process's own), none for a fresh run
        self.restored_rng: dict | None = None if saved is None else self._load_own_parts(saved)
        self.feed = BatchFeed(self._rank_batch, pin=acc.device.type == "cuda")  # last: its thread starts here

    def _load_own_parts(self, saved: Saved) -> dict:
        """This process's parts of the checkpoint (its shards, its own entries); returns its generator states."""
        self.sharding.load_shards(self.raw, self.opt.optimizer, saved.checkpoint)
        return self.run.checkpoints.load_local(saved.checkpoint, saved.state) or saved.parts["rng"]

    def _first_model(self, saved: Saved | None) -> tuple[torch.nn.Module, dict | None, dict | None]:
        """The model of the current phase, fresh or with the checkpoint's weights and the method's state, and the
        optimizer and scheduler states to prepare it with."""
        cfg, run = self.cfg, self.run
        if saved is None:
            set_seed(cfg.train.seed)
            model = self.family.build_model(run.phases[0].config, init_from=cfg.model.init_from)
            self.method.on_model(model)
            return model, None, None
        state, parts, checkpoint = saved
        if bool(state.get("sharded")) != self.sharding.sharded:
            was = "with" if state.get("sharded") else "without"
            raise ConfigError(f"resume: {checkpoint} was written {was} FSDP2 and this run is "
                              f"{'' if self.sharding.sharded else 'not '}sharded; resume it the way it was "
                              "launched (train.fsdp / the accelerate config)")
        model = self.family.build_model(run.phases[run.c.phase].config)
        try:
            self.sharding.load_whole(model, parts)
        except RuntimeError as e:  # an edited state.json written before it carried a digest of itself
            first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), str(e)[:200])
            raise ckpt.CheckpointError(f"{checkpoint}: its weights do not fit the model that the config in "
                                       f"its {ckpt.STATE} describes ({first}); the checkpoint was edited: restore it, "
                                       "or move it out to resume from the one before") from None
        self.method.load_state_dict(parts["method"])
        self.method.on_model(model)
        return model, parts.get("optimizer"), parts["scheduler"]

    def _rank_batch(self, step: int) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
        return self.run.data.step_batch(self.cfg, step, self.acc.process_index, self.acc.num_processes)

    def _set_trio(self, model: torch.nn.Module, opt_state: dict | None, sched_state: dict | None,
                  named_state: dict | None = None) -> None:
        """Rebuild optimizer + scheduler around a changed ``model`` (a level change, a freeze) and (re)prepare all
        three."""
        self.model = self.opt = self.sched = self.raw = None  # drop our references before Accelerate drops its own
        self.model, self.opt, self.sched, self.raw = self._prepared(model, opt_state, sched_state, named_state)

    def _prepared(self, model: torch.nn.Module, opt_state: dict | None, sched_state: dict | None,
                  named_state: dict | None = None) -> tuple[Any, Any, Any, torch.nn.Module]:
        """Optimizer + scheduler for the current phase around ``model``, all three prepared: (the model as it
        trains, the optimizer, the scheduler, the module itself)."""
        phase = self.run.phases[self.run.c.phase]
        if self.chunked:
            self.family.chunked_loss(model)  # the loss without whole logits (progressive/model/loss.py)
        if self.compiled and self.sharding.sharded:
            compile_blocks(model)  # before sharding: FSDP2's hooks stay outside the compiled blocks
        named_state = self.sharding.place(model, named_state)
        opt, sched = build_optimizer_and_scheduler(model, self.cfg.train, phase, self.acc.device, named_state,
                                                   opt_state, sched_state)
        prepared, opt, sched = reprepare(self.acc, model, opt, sched, wrap_model=self.sharding.prepare_model)
        if self.compiled and not self.sharding.sharded:
            prepared = compile_model(prepared)  # after DDP's wrapper, as Accelerate's own compile does
        # The module itself, not torch.compile's wrapper: methods change it (layer lists, freezing). Its forward
        # is restored: Accelerate wraps it in autocast *and* a copy of every output to fp32, i.e. the whole
        # B x T x V logits (3% of a GPT-2-124M step on an H200), though the loss is computed inside the forward;
        # the steps and evaluations run under ``acc.autocast()`` instead (the same region, without the copy),
        # which also gives the precision to a model sharded outside Accelerate (train.fsdp without its launcher)
        raw = self.acc.unwrap_model(prepared, keep_fp32_wrapper=False, keep_torch_compile=False)
        self._compiling = self.compiled
        self.flops.clear()
        return prepared, opt, sched, raw

    def _blank(self) -> torch.nn.Module:
        """A plain model of the current shape on the device, for a sharded model's weights to be copied
        into. Its initialisation runs on forked generators: the run's random stream stays an unsharded run's."""
        with torch.random.fork_rng(devices=[]):
            return self.family.build_model(self.raw.config).to(self.acc.device)

    # ------------------------------------------------------------------------------------- one step

    def step(self) -> Stepped:
        """One optimizer step over this process's rows of the global batch."""
        t, c, acc = self.cfg.train, self.run.c, self.acc
        compiling = self._compiling
        if compiling:  # the first step of a new model is timed on its own: compile_s, if dynamo compiled in it
            self.tick()
            graphs = graphs_compiled()
        self.method.phase = c.phase  # the phase its hooks run in (Method.phase)
        plan = self.method.before_step(c.step, self.raw)
        ids, batch = self.feed.get(c.step)  # this process's rows of the global batch, built ahead
        micro = t.batch_size // acc.num_processes // t.grad_accum
        first = acc.process_index * micro * t.grad_accum  # where this process's rows start in ``ids``
        applications = []  # per micro-batch: layer applications the method ran (None: as the plan says)
        losses = []
        for j in range(t.grad_accum):
            applications.append(self.method.before_micro_batch(c.step, j, self.raw))
            lo = j * micro
            mb = {k: v[lo:lo + micro].to(acc.device, non_blocking=True) for k, v in batch.items()}
            sync = contextlib.nullcontext() if j == t.grad_accum - 1 else sharding.no_sync(acc, self.model)
            with sync:
                with acc.autocast():
                    loss = self.method.forward(self.model, mb, ids[first + lo:first + lo + micro]).loss
                acc.backward(loss / t.grad_accum)
            losses.append(loss.detach().float() / t.grad_accum)
        self.method.on_gradients(c.step, self.raw)
        if t.max_grad_norm > 0:
            acc.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.method.after_step(c.step, self.raw)
        config = self.raw.config
        epoch_before = c.step * t.batch_size // self.run.data.n_train
        flops_before, tokens_before = c.flops, c.tokens
        c.step, c.step_in_phase = c.step + 1, c.step_in_phase + 1
        c.tokens += t.batch_size * self.family.tokens_per_sample(config, self.cfg.data.seq_len)
        c.flops += plan.flops if plan.flops is not None else self._flops_run(plan.n_layers, applications)
        if compiling:
            seconds, self._compiling = self.tick(), False
            if graphs_compiled() > graphs:  # a shape seen before reuses its graph: a plain step, not compilation
                c.compile_s += seconds
                c.compile_flops += c.flops - flops_before
                c.compile_tokens += c.tokens - tokens_before
        return Stepped(lr, epoch_before, losses)

    def _flops_run(self, n_layers: int | None, applications: list[int | None]) -> int:
        """FLOPs of the step just run. A micro-batch for which the method reported its layer applications
        (shared layers may run several times) costs head + embeddings + that many layers: the analytic
        count is linear in the layers, and every term is a multiple of the batch, so this is exact."""
        config = self.raw.config
        if all(a is None for a in applications):
            return self.flops(config, n_layers)
        base, per_layer = self.flops(config, 0), self.flops(config, 1) - self.flops(config, 0)
        total = sum(self.flops(config, n_layers) if a is None else base + a * per_layer for a in applications)
        return total // len(applications)

    def global_loss(self, mean: torch.Tensor) -> float:
        """This process's mean loss -> the mean over all processes (one collective)."""
        return self.acc.reduce(mean, reduction="mean").item()

    def tick(self) -> float:
        """Count the device time since the last mark into ``wall`` (one synchronization); returns it."""
        seconds = self.run.clock.lap()
        self.run.c.wall += seconds
        return seconds

    def row_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(a train row's fields beyond the counters, those the progress bar shows): the method's, and the
        speed since the previous row:
        tokens/s (all processes), model TFLOP/s and MFU per device (MFU against the peak of
        ``common.device.peak_flops``, or ``train.peak_tflops``), this process's peak memory, and the
        milliseconds per step spent building the batch and waiting for it."""
        c, world = self.run.c, self.acc.num_processes
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
        t, run, acc = self.cfg.train, self.run, self.acc
        data = run.data.val if data is None else data
        n = min(run.data.n_val, t.eval_batches * t.batch_size) if n is None else n
        micro = t.batch_size // t.grad_accum
        mine = np.arange(n)[acc.process_index::acc.num_processes]
        classify = self.family.objective in ("cls", "seqcls")
        total = torch.zeros(3, device=acc.device, dtype=torch.float64)
        # The unwrapped model, under the run's autocast: no DDP collectives, so ranks may run different numbers
        # of batches (a sharded model: as many as the process with the most rows, see Sharded.eval_count).
        count = self.sharding.eval_count(n, len(mine))
        self.raw.eval()
        for j in range(0, count, micro):
            rows = mine[j:j + micro]
            batch = run.data.batch(data, rows if len(rows) else np.arange(1), seed=t.seed * 7919 + 104729 + j)
            weight = (batch["labels"] != -100).sum() if self.family.is_text else len(batch["labels"])
            batch = {k: v.to(acc.device) for k, v in batch.items()}
            with acc.autocast():
                out = self.raw(**batch)
            if not len(rows):
                continue
            right = (out.logits.argmax(-1) == batch["labels"]).sum().double() if classify else out.loss.new_zeros(())
            total += torch.stack([out.loss.double() * float(weight), torch.tensor(float(weight), dtype=torch.float64,
                                                                                  device=acc.device), right.double()])
        self.raw.train()
        total = acc.reduce(total, reduction="sum")
        scores = {"val_loss": float(total[0] / total[1])}
        if classify:
            scores["val_accuracy"] = float(total[2] / total[1])
        return scores

    # ------------------------------------------------------------------------------------- changes

    def changes(self, epoch_before: int) -> None:
        """The method's changes after a step (AutoFreeze freezing layers, at a step or an epoch's end): the
        optimizer is rebuilt around the changed model; the schedule goes on."""
        run, c = self.run, self.run.c
        phase = run.phases[c.phase]
        epoch = c.step * self.cfg.train.batch_size // run.data.n_train
        changes = [self.method.change_after_step(c.step - 1, self.raw, self.opt.optimizer)]
        if epoch > epoch_before:
            changes.append(self.method.on_epoch_end(epoch_before, self.raw, self.opt.optimizer))
        for change in filter(None, changes):
            self.method.on_model(change.model)
            self._set_trio(change.model, None, self.sched.state_dict(), named_state=change.optimizer_state)
            run.transitions.append({"step": c.step, "to": phase.name, "note": change.note, "seconds": 0.0})
            if self.acc.is_main_process:
                run.write(f"[step {c.step}] {change.note}")

    def transition(self, index: int) -> tuple[str, float, float]:
        """A level change: the method's operators map the model and its AdamW moments to phase ``index``."""
        run, c = self.run, self.run.c
        lr, device = run.phases[c.phase].peak_lr, self.acc.device
        model, opt = self.sharding.whole(self.raw, self.opt.optimizer, self._blank,
                                         lambda m: build_optimizer(m, self.cfg.train, lr, device))
        change = self.method.transition(index, run.phases, model, opt)
        del model, opt
        operators = self.tick()  # the gather (FSDP2) and the method's operators on weights and moments
        self.method.on_model(change.model)
        c.phase, c.step_in_phase = index, 0
        self._set_trio(change.model, None, None, named_state=change.optimizer_state)
        rebuild = self.tick()  # optimizer, scheduler, sharding, Accelerate's prepare
        return change.note, operators, rebuild

    # ------------------------------------------------------------------------------------- state, the end

    def checkpoint_parts(self) -> tuple[dict[str, Any], bool, Any, dict[str, Any]]:
        """(the main process's parts, whether every weight is finite, the staging folder of every process's
        own parts, more state.json fields); every process calls it."""
        staged, finite = self.run.checkpoints.stage(self.run.c, self.sharding, self.raw, self.opt.optimizer)
        parts: dict[str, Any] = {}
        if self.acc.is_main_process:
            parts, whole_finite = self.sharding.main_parts(self.raw, self.opt)
            parts.update(scheduler=self.sched.state_dict(), rng=ckpt.rng_state())
            finite = finite and whole_finite
        return parts, finite, staged, {"sharded": self.sharding.sharded}

    def fork(self, schedule: Any) -> dict[str, Any]:
        """A WSD cooldown branch starts here (progressive/run/branches.py): a copy of the model's weights, the
        optimizer's and the scheduler's state and the random state, to hand back to ``join_fork``; the scheduler
        goes on with ``schedule``'s multipliers (an LRSchedule)."""
        if self.sharding.sharded:
            raise ConfigError("train.branches: cooldown branches fork a replicated model, and this one is sharded "
                              "(FSDP2); leave train.branches empty")
        saved = {"model": {k: v.detach().clone() for k, v in self.raw.state_dict().items()},
                 "optimizer": copy.deepcopy(self.opt.optimizer.state_dict()),
                 "scheduler": copy.deepcopy(self.sched.scheduler.state_dict()), "rng": ckpt.rng_state(),
                 "scaler": None if self.acc.scaler is None else copy.deepcopy(self.acc.scaler.state_dict())}
        for f in self.sched.scheduler.lr_lambdas:
            f.__dict__.update(schedule.__dict__)
        return saved

    def join_fork(self, saved: dict[str, Any]) -> None:
        """Put back what ``fork`` copied: the run goes on as if the branch had not run."""
        with torch.no_grad():
            self.raw.load_state_dict(saved["model"])
        self.opt.optimizer.load_state_dict(saved["optimizer"])
        self.sched.scheduler.load_state_dict(saved["scheduler"])  # its multipliers' fields too (LambdaLR's)
        if saved["scaler"] is not None:
            self.acc.scaler.load_state_dict(saved["scaler"])
        self.opt.zero_grad(set_to_none=True)
        ckpt.set_rng_state(saved["rng"])

    def test_scores(self) -> dict[str, float] | None:
        """The whole test split, evaluated once at the end (data.test_fraction > 0; nothing is tuned on it)."""
        data = self.run.data
        return None if data.test is None else self.evaluate(data.test, len(data.test))

    def final_model(self) -> None:
        """``raw`` on the main process holds the whole trained model (final/ is a plain save_pretrained folder)."""
        self.raw = self.sharding.to_main(self.raw, self._blank)

    def close(self) -> None:
        """Stop building batches ahead."""
        self.feed.close()

