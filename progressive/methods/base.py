"""The method interface: a method plans phases and answers hooks; the trainer executes.

A *phase* is a stretch of training with one model shape and one LR schedule. Between two phases the
trainer calls ``Method.transition``, which may return a different model (a V-cycle level change, an Apollo
stage) and the optimizer state that goes with it; the trainer then builds a fresh optimizer and scheduler
for the new phase and re-prepares them with Accelerate. Inside a phase, ``before_step`` may say how many
layers run (Apollo's per-step depth) or give the step's FLOPs (frozen layers need no weight gradients),
and ``on_epoch_end`` may change the model (AutoFreeze freezing a prefix). The trainer has no
method-specific branch; a new method is a subclass registered with ``register_method``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import named_optimizer_state
from progressive.config import ConfigError, RunConfig
from progressive.config.fields import WSD, cooldown_start
from progressive.config.methods import METHOD_OPTIONS, register_method_options

if TYPE_CHECKING:  # torch and transformers load where a model is built, not where a recipe is read (--help, --list)
    import torch
    from transformers import PretrainedConfig

    from progressive.model.build import Family


@dataclass
class Phase:
    """One phase: ``steps`` optimizer steps of a model with ``config``, LR peaking at ``peak_lr``.

    Optional, for methods that need them (defaults: the phase is its own LR schedule, every step runs
    the whole model of ``config``):
        schedule_offset, schedule_steps: the phase's LR multipliers are steps ``schedule_offset`` ..
            ``schedule_offset + steps - 1`` of one schedule of ``schedule_steps`` steps (warm-up, decay and a
            WSD cooldown measured on that length), so consecutive phases can continue one schedule (Apollo's
            single cosine across its stages; a WSD cooldown at the end of the whole run, not of each stage).
            ``schedule_steps`` None: the phase's own ``steps``.
        cooldown: a WSD decay's cooldown, a fraction of the schedule's steps (``LRSchedule``).
        flops: the phase's planned training FLOPs when they are not ``steps`` x the step FLOPs of
            ``config`` (e.g. sampled depths that re-use shared layers); see ``phase_flops``.
        mean_layers: mean transformer-layer applications per micro-batch, when they differ from
            ``config``'s layer count (dry runs show it).
    """

    name: str
    steps: int
    peak_lr: float
    warmup: float
    decay: str
    min_lr_ratio: float
    config: PretrainedConfig
    level: int = 0
    schedule_offset: int = 0
    schedule_steps: int | None = None
    flops: int | None = None
    mean_layers: float | None = None
    cooldown: float = 0.2


@dataclass
class StepPlan:
    """What a method asks of one step. ``n_layers``: transformer layers that run (FLOPs count only these);
    ``flops``: the step's training FLOPs when the method knows better than the analytic count (the trainer
    reads it after the step, so a method may fill it in while the step runs, e.g. from cache hits)."""

    n_layers: int | None = None
    flops: int | None = None


@dataclass
class ModelChange:
    """A new model for the trainer to train from now on. ``optimizer_state``: named AdamW state for it
    ({param name: {"exp_avg", "exp_avg_sq", "step"}}), or None for a fresh optimizer."""

    model: torch.nn.Module
    optimizer_state: dict[str, dict[str, torch.Tensor]] | None
    note: str = ""


StepFlops = Callable[["PretrainedConfig"], int]


class Method:
    """Base class: one phase on the full model, no transitions, no per-step changes (the baseline).

    A subclass sets ``name`` and, if it has settings, ``options`` (a dataclass: the recipe's
    ``method.<name>:`` section, available as ``cfg.method.<name>``; a ``validate(where)`` method on it is
    called by progressive.config.validate), and is registered with ``register_method``. Its per-step hooks read
    the running phase from ``self.phase`` (the trainer sets it before each step), so ``plan`` stays pure: a
    method keeps nothing of it to find its phase from the step.
    """

    name = "baseline"
    options: type | None = None
    # what the pipeline engine asks of a method (progressive/pipeline/engine.py runs the baseline and AutoFreeze):
    freezes = False  # it decides a growing frozen prefix: ``record`` gets each step's per-layer norms, ``decide`` rules
    frozen = 0  # the layers frozen now
    caching = False  # AutoCache serves the frozen prefix now (``serve_prefix``, ``cached_flops``)

    def __init__(self, cfg: RunConfig, family: Family):
        self.cfg = cfg
        self.family = family
        self.phase = 0  # the index in ``plan()``'s phases of the running one: the trainer sets it before each step

    def plan(self, base_config: PretrainedConfig, step_flops: StepFlops) -> list[Phase]:
        """The phases of the run. Pure (no weights): used for validation before data loads, dry runs and
        resuming. ``step_flops(config)`` gives the training FLOPs of one full-batch step of that shape.

        Raises:
            ConfigError: the method's settings cannot work with this model or budget.
        """
        t = self.cfg.train
        return [Phase("train", t.steps, t.lr, t.warmup, t.decay, t.min_lr_ratio, base_config, cooldown=t.cooldown)]

    def transition(self, index: int, phases: list[Phase], model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer) -> ModelChange:
        """Called when phase ``index`` (>= 1) starts; ``model``/``optimizer`` are unwrapped. The default
        keeps the model and its optimizer state (a new LR schedule on the same model)."""

        return ModelChange(model, named_optimizer_state(model, optimizer), "same model, new LR schedule")

    def before_step(self, step: int, model: torch.nn.Module) -> StepPlan:
        """Called before every optimizer step (global step index ``step``)."""
        return StepPlan()

    def on_model(self, model: torch.nn.Module) -> None:
        """Called whenever the trainer builds or loads a model (start, resume, a model change), before its
        optimizer is built: re-apply per-model state that is not in the weights (e.g. a frozen prefix)."""

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], sample_ids: np.ndarray) -> Any:
        """Run one training micro-batch: ``model`` (possibly DDP-wrapped) on ``batch``, whose rows are the
        training samples ``sample_ids``. A method may compute part of it otherwise (AutoCache)."""
        return model(**batch)

    def on_gradients(self, step: int, model: torch.nn.Module) -> None:
        """Called once per optimizer step after the backward passes (accumulated, all-reduced), before
        clipping and the optimizer step: gradient statistics (AutoFreeze)."""

    def before_micro_batch(self, step: int, index: int, model: torch.nn.Module) -> int | None:
        """Called before micro-batch ``index`` (0 .. grad_accum-1) of step ``step``, on every process.
        Returns the transformer layer applications that micro-batch runs, when the method changed them
        (shared layers may run several times, so this can exceed the model's layer count); None: the
        StepPlan's count. The trainer counts FLOPs from it."""
        return None

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        """Called after every optimizer step (undo per-step changes here)."""

    def log_fields(self) -> dict[str, Any]:
        """Extra fields for every train row of metrics.jsonl, the trackers and the progress bar (numbers
        reach the trackers), e.g. ``{"stage": 2, "depth": 5}``."""
        return {}

    def on_epoch_end(self, epoch: int, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer) -> ModelChange | None:
        """Called when the data stream finishes epoch ``epoch``; a ModelChange re-prepares the model."""
        return None

    def change_after_step(self, step: int, model: torch.nn.Module,
                          optimizer: torch.optim.Optimizer) -> ModelChange | None:
        """Called after every optimizer step (after ``after_step``); a ModelChange re-prepares the model and
        a new optimizer with the given state, and the phase's LR schedule continues (e.g. a freeze)."""
        return None

    def finish(self) -> None:
        """Called when the run ends (however it ends): release what the method holds (caches, files)."""

    def run_folder_entries(self) -> tuple[str, ...]:
        """Names of the top-level entries the method may create in the run folder (any process may create
        them): the run records them as its own when it starts (progressive.run.rundir)."""
        return ()

    def state_dict(self) -> dict[str, Any]:
        """Everything the method needs to continue after a restart (tensors allowed); the same on every
        process (the main process saves it)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    @property
    def has_local_state(self) -> bool:
        """True when each process holds state of its own that a checkpoint must keep (AutoCache: the
        activations of the samples this process drew); then every process calls ``save_local`` at every
        checkpoint, and the checkpoint also keeps each process's random-generator state."""
        return False

    def save_local(self, folder: Path, name: str) -> None:
        """Write this process's own state as files ``folder/<name>.*`` (the trainer moves them into the
        checkpoint). Called on every process when ``has_local_state``."""

    def load_local(self, folder: Path, name: str) -> None:
        """Restore what ``save_local`` wrote (``folder``: the checkpoint), after ``load_state_dict``, on the
        process of the same rank. Not called when the checkpoint has no part for this process (another
        world size): the per-process state then starts as in a fresh run, and the trainer says so."""


class LRSchedule:
    """LR multiplier for step s of a phase: linear warm-up from 0 over W = round(``warmup`` * steps) steps (as the
    HF schedulers: 0 at s = 0), then ``decay`` to ``min_lr_ratio`` (m) at the schedule's end (s = steps):

        linear, cosine   m + (1 - m) (1 - p), m + (1 - m) (1 + cos(pi p)) / 2, p = (s - W) / (steps - W)
        constant         1
        wsd, wsd_sqrt    warmup-stable-decay (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
                         Fixed Training Durations"): 1 until the cooldown's first step C = steps - max(1,
                         round(``cooldown`` * steps)) (never before W), then with t = (s - C) / (steps - C):
                         m + (1 - m) (1 - t) (linear), or max(m, 1 - sqrt(t)) (their 1-sqrt shape, floored at m)

    ``offset``: the phase starts ``offset`` steps into the schedule (multiplier(s) = schedule(s + offset)), so
    stages that continue one schedule cool down once, at its end. A class, not a closure, so LambdaLR's
    state_dict can hold it (its fields are plain numbers and a string: a checkpoint keeps them as JSON)."""

    def __init__(self, steps: int, warmup: float, decay: str, min_lr_ratio: float, offset: int = 0,
                 cooldown: float = 0.2):
        self.steps, self.decay, self.min_lr_ratio = steps, decay, min_lr_ratio
        self.warm = int(round(warmup * steps))
        self.offset = offset
        # at least one step, so that a short run still cools down; never inside the warm-up (both round up)
        self.cool_from = max(self.warm, cooldown_start(steps, cooldown))

    def __call__(self, s: int) -> float:
        s = s + self.offset
        if s < self.warm:
            return s / self.warm
        if self.decay == "constant":
            return 1.0
        if self.decay in WSD:
            return self._cooldown(s)
        p = min(1.0, (s - self.warm) / max(1, self.steps - self.warm))
        shape = 1.0 - p if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * shape

    def _cooldown(self, s: int) -> float:
        """A WSD schedule after its warm-up: the peak, then the cooldown to min_lr_ratio."""
        if s < self.cool_from:
            return 1.0
        t = min(1.0, (s - self.cool_from) / max(1, self.steps - self.cool_from))
        if self.decay == "wsd":
            return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * (1.0 - t)
        return max(self.min_lr_ratio, 1.0 - math.sqrt(t))


def phase_schedule(phase: Phase) -> LRSchedule:
    """The LR multiplier of ``phase`` (peak = phase.peak_lr)."""
    steps = phase.steps if phase.schedule_steps is None else phase.schedule_steps
    return LRSchedule(steps, phase.warmup, phase.decay, phase.min_lr_ratio, phase.schedule_offset, phase.cooldown)


def phase_flops(phase: Phase, step_flops: StepFlops) -> int:
    """The planned training FLOPs of ``phase``: its own ``flops`` when the method set them, else
    steps x ``step_flops(phase.config)``."""
    return phase.flops if phase.flops is not None else phase.steps * step_flops(phase.config)


METHODS: dict[str, type[Method]] = {"baseline": Method}


def register_method(name: str, cls: type[Method]) -> type[Method]:
    """Make ``cls`` available as ``method.name: <name>`` and its ``options`` dataclass (if any) the recipe
    section ``method.<name>:``. progressive/methods/__init__.py calls this for each method in its list; returns
    ``cls``."""
    METHODS[name] = cls
    if cls.options is not None and METHOD_OPTIONS.get(name) is not cls.options:
        if name in METHOD_OPTIONS:
            raise TypeError(f"method {name!r}: its options {cls.options.__name__} are not the section "
                            f"progressive.config.methods lists ({METHOD_OPTIONS[name].__name__})")
        register_method_options(name, cls.options)
    return cls


def staged_phases(t: Any, names: list[str], configs: list[PretrainedConfig], boundaries: list[float], full: int,
                  stage_flops: Callable[[int, int, int], tuple[int, float]], global_schedule: bool,
                  full_layers: float, where: str, labels: list[str] | None = None) -> tuple[list[Phase], list[int]]:
    """The phases of a staged growth, shared by every method that grows in stages (Apollo, stacking, any new
    one): stage k of ``configs`` starts at ``boundaries[k - 1]`` x train.steps (``t``: the train section) and
    ends where the next starts, its FLOPs and mean layer applications ``stage_flops(k, start, end)``; the last
    stage (the full model, ``full`` FLOPs a step, ``full_layers`` layers) fills what is left of the budget of
    train.steps full steps. ``global_schedule``: one LR schedule over all stages (each stage continues it) rather
    than one per stage. Returns (the phases, each stage's first step).

    Raises:
        ConfigError: naming ``where`` (and the stage by ``labels``, default its name), a stage with no step or no
            budget left for the last.
    """
    labels = labels or names
    starts = [0, *(int(round(b * t.steps)) for b in boundaries)]
    phases, spent = [], 0
    for k in range(len(configs) - 1):
        steps = starts[k + 1] - starts[k]
        if steps < 1:
            raise ConfigError(f"{where}[{k}]: stage {k} ({labels[k]}) gets no step of train.steps={t.steps}; move "
                              "the boundaries apart or raise train.steps")
        flops, mean = stage_flops(k, starts[k], starts[k + 1])
        phases.append(_stage_phase(t, names[k], k, steps, configs[k], starts[k], flops, mean, global_schedule))
        spent += flops
    rest = (t.steps * full - spent) // full
    if rest < 1:
        raise ConfigError(f"{where}: no FLOPs budget left for the last stage after {boundaries}; lower the "
                          "boundaries or raise train.steps")
    last = len(configs) - 1
    phases.append(_stage_phase(t, names[last], last, int(rest), configs[last], starts[last], int(rest) * full,
                               full_layers, global_schedule))
    total = sum(p.steps for p in phases)
    for p in phases:
        p.schedule_steps = total if global_schedule else None
    return phases, starts


def _stage_phase(t: Any, name: str, k: int, steps: int, config: PretrainedConfig, start: int, flops: int, mean: float,
           global_schedule: bool) -> Phase:
    return Phase(name, steps, t.lr, t.warmup, t.decay, t.min_lr_ratio, config, level=k,
                 schedule_offset=start if global_schedule else 0, flops=flops, mean_layers=mean, cooldown=t.cooldown)

