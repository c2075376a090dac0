"""Accelerate plumbing: the Accelerator, AdamW and the per-phase LR scheduler (built together, once, for both
engines: ``build_optimizer_and_scheduler``), and ``reprepare``.

``reprepare`` is the one place that hands a new model, optimizer and scheduler to Accelerate after a
level change. It uses only public API: ``Accelerator.free_memory()`` (documented for "between two
trainings with different models/optimizers") drops Accelerate's references to the previous objects, then
``Accelerator.prepare`` wraps the new ones (DDP, autocast, GradScaler, device placement). We keep one
Accelerator for the whole run instead of creating a fresh one per level: its process group, trackers and
RNG setup must survive level changes, and AcceleratorState is a process-wide singleton anyway.
"""

from __future__ import annotations

import os
import sys

import torch
from accelerate import Accelerator
from torch.optim.lr_scheduler import LambdaLR

from operators import load_named_optimizer_state
from progressive.config import ConfigError, RunConfig, TrainConfig
from progressive.methods.base import Phase, phase_schedule


def build_accelerator(cfg: RunConfig) -> Accelerator:
    """One Accelerator for the run (precision, CPU/GPU, trackers; DDP from the launcher's environment).

    Precision: train.mixed_precision if set, else the launcher's (``accelerate launch``), else bf16 on a GPU
    that supports it and fp32 otherwise. ``train.compile`` is the trainer's (progressive/run/compiled.py), not
    Accelerate's: each model is compiled as it is prepared, so runs compiled and eager may share a process.
    The scheduler is stepped once per optimizer step (``step_scheduler_with_optimizer=False``): with the
    default, Accelerate steps it once per process, which assumes a per-process dataloader length; our
    schedules count global optimizer steps.
    """
    t = cfg.train
    check_not_deepspeed()
    precision = t.mixed_precision
    if precision is None and not os.environ.get("ACCELERATE_MIXED_PRECISION") and not t.cpu \
            and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        precision = "bf16"  # the GPU default when neither the recipe nor the launcher chose
    cpu = t.cpu
    if not cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not _accelerator_here():
        # Without cpu=True, Accelerate on a host with no accelerator runs every process undistributed, each as
        # "rank 0": they fought over the run folder's lock, or failed in gloo. The processes train on the CPU.
        cpu = True
        if os.environ.get("RANK", "0") == "0":
            print(f"train.cpu: no GPU on this host: the {os.environ['WORLD_SIZE']} processes train on the CPU (gloo)",
                  file=sys.stderr)
    acc = Accelerator(
        cpu=cpu,
        mixed_precision=precision,  # None: the launcher's (accelerate launch / config), else "no"
        log_with=None if t.report_to == "none" else t.report_to,
        project_dir=str(cfg.run_dir),
        step_scheduler_with_optimizer=False,
    )
    if t.threads:
        # Accelerate sets torch's threads itself on several CPU processes without OMP_NUM_THREADS (physical cores over
        # the processes of the node): train.threads must win, or a run's numbers would depend on how many processes
        # share a node (two one-process nodes rounded otherwise than one two-process node)
        torch.set_num_threads(t.threads)
    return acc


def _accelerator_here() -> bool:
    """A GPU (or another torch accelerator) is visible to this process."""
    if torch.cuda.is_available():
        return True
    return bool(hasattr(torch, "accelerator") and torch.accelerator.is_available())


def check_not_deepspeed() -> None:
    """Refuse a DeepSpeed launcher (``accelerate launch`` with a DEEPSPEED config sets ACCELERATE_USE_DEEPSPEED)
    before anything is built: under ZeRO DeepSpeed owns the optimizer, so this trainer's gradient accumulation
    and clipping, the methods' optimizer-state mapping across level changes and every process's optimizer
    shard in the checkpoints would silently not be what the config says.

    Raises:
        ConfigError: the launcher asked for DeepSpeed.
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("true", "1", "yes"):
        raise ConfigError("DeepSpeed is not supported: under ZeRO it owns the optimizer, so this trainer's gradient "
                          "accumulation and clipping, the methods' optimizer state across level changes and each "
                          "process's optimizer shard in checkpoints would not be what the config says; launch with "
                          "FSDP2 (launch/accelerate/fsdp.yaml, or --train.fsdp true) or DDP instead")


CHOSEN_BY = {  # who chose the precision a run used (summary.json's precision_chosen_by) -> how the note says it
    "recipe": "train.mixed_precision",
    "launcher": "the launcher (accelerate launch / its config file)",
    "gpu default": "the GPU default; set train.mixed_precision to change it",
    "default": "the default; set train.mixed_precision or launch with accelerate to change it",
}


def precision_record(accelerator: Accelerator, cfg: RunConfig) -> dict[str, str]:
    """The precision the run uses, as Accelerate applies it after the launcher's choice, and who chose it: the
    fields summary.json records (``mixed_precision``: "no", "bf16" or "fp16"; ``precision_chosen_by``: a key of
    ``CHOSEN_BY``). A recipe that leaves ``train.mixed_precision`` unset saves it as null in config.yaml, so
    without this record a run that ``accelerate launch --mixed_precision bf16`` (or launch/accelerate/1gpu.yaml)
    trained in bf16 said nothing of it."""
    used = accelerator.mixed_precision
    if cfg.train.mixed_precision is not None:
        who = "recipe"
    elif os.environ.get("ACCELERATE_MIXED_PRECISION"):
        who = "launcher"
    elif used == "bf16":
        who = "gpu default"
    else:
        who = "default"
    return {"mixed_precision": used, "precision_chosen_by": who}


def precision_note(accelerator: Accelerator, cfg: RunConfig) -> str:
    """Which precision runs and who chose it: the recipe (train.mixed_precision), the launcher or a default."""
    record = precision_record(accelerator, cfg)
    used = record["mixed_precision"]
    what = "fp32 (no mixed precision)" if used == "no" else f"{used} autocast"
    note = f"{what}, from {CHOSEN_BY[record['precision_chosen_by']]}"
    if used == "fp16" and accelerator.device.type == "cpu":
        note += "; fp16 needs a GPU, so Accelerate runs fp32 on CPU (use bf16)"
    return note


def precision_comment(accelerator: Accelerator, cfg: RunConfig) -> str:
    """The line that ends a run's config.yaml: the precision this process trains in and who chose it. A YAML
    comment, so the saved config reads back as it was written (a resume compares the checkpoint's config, and
    config.yaml's fields are unchanged); summary.json records the same at the end."""
    return (f"# precision used: {precision_note(accelerator, cfg)} (train.mixed_precision above is the recipe's; "
            "null: the launcher or the device chose)\n")


def device_note(accelerator: Accelerator) -> str | None:
    """A line when ``accelerate launch`` ran without ``--cpu`` (its config's ``use_cpu: false``, as
    launch/accelerate/1gpu.yaml says) on a host with no GPU: Accelerate then trains on the CPU without a word,
    with the launcher's precision. None otherwise (no launcher, ``--cpu``, or a GPU in use)."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() not in ("false", "0", "no") or accelerator.device.type != "cpu":
        return None
    asked = os.environ.get("CUDA_VISIBLE_DEVICES")
    return ("no GPU on this host: accelerate launch was not given --cpu"
            + (f" (CUDA_VISIBLE_DEVICES={asked})" if asked else "") + ", so this run trains on the CPU"
            + (f" with the launcher's {accelerator.mixed_precision} autocast"
               if accelerator.mixed_precision != "no" else "")
            + "; launch with --cpu (or without the config file) to choose the CPU on purpose")


def set_peak_lr(scheduler: LambdaLR, peak: float) -> None:
    """Make ``peak`` the scheduler's base LR at its current position (after ``load_state_dict``, which
    restores the saved base LRs): group LR = peak * multiplier(position), exactly what LambdaLR computes."""
    scheduler.base_lrs = [peak] * len(scheduler.optimizer.param_groups)
    for g, fn in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
        g["initial_lr"] = peak
        g["lr"] = peak * fn(scheduler.last_epoch)
    scheduler._last_lr = [g["lr"] for g in scheduler.optimizer.param_groups]


def _impl_kwargs(impl: str, device: torch.device) -> dict[str, bool]:
    if impl == "auto":
        impl = "fused" if device.type in ("cuda", "cpu", "xpu", "mps") else "foreach"
    return {"fused": True} if impl == "fused" else {"foreach": True} if impl == "foreach" else {"foreach": False}


def build_optimizer(model: torch.nn.Module, t: TrainConfig, lr: float, device: torch.device) -> torch.optim.AdamW:
    """torch AdamW over the trainable parameters; no weight decay on biases and norm weights (1-D tensors).

    Args:
        model: the unwrapped model.
        t: train settings (betas, eps, weight decay, ``optimizer`` = auto|fused|foreach|plain).
        lr: initial (peak) LR of the phase; the scheduler scales it.
        device: where the parameters will live (fused kernels need a supported device).
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps,
                             **_impl_kwargs(t.optimizer, device))


def build_scheduler(optimizer: torch.optim.Optimizer, phase: Phase) -> LambdaLR:
    """LambdaLR for ``phase``: warm-up then decay, multiplying the phase's peak LR."""
    for g in optimizer.param_groups:
        g["lr"] = phase.peak_lr
        g["initial_lr"] = phase.peak_lr
    return LambdaLR(optimizer, phase_schedule(phase))


def build_optimizer_and_scheduler(model: torch.nn.Module, t: TrainConfig, phase: Phase, device: torch.device,
                                  named_state: dict | None = None, opt_state: dict | None = None,
                                  sched_state: dict | None = None) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW over ``model``'s trainable parameters and ``phase``'s LR schedule, with state carried over: the
    one place an engine gets its optimizer and schedule (data parallel and the pipeline's stages alike).

    Args:
        model: the unwrapped model (or a stage's slice of it), on ``device``.
        t: train settings (see ``build_optimizer``).
        phase: the phase whose peak LR and schedule apply.
        device: where the parameters live.
        named_state: AdamW moments by parameter name (a model change, a re-layout): installed for the
            parameters this optimizer trains; frozen ones have no slot in it.
        opt_state: an ``optimizer.state_dict()`` to load (a resume).
        sched_state: the schedule's position to continue from; the phase's peak LR from the current config
            applies (a resume may lower it).

    Returns:
        (optimizer, scheduler).
    """

    opt = build_optimizer(model, t, phase.peak_lr, device)
    sched = build_scheduler(opt, phase)
    if named_state:
        load_named_optimizer_state(model, opt, named_state)
        for st in opt.state.values():  # fused AdamW wants its step counters on the parameters' device
            if torch.is_tensor(st.get("step")):
                st["step"] = st["step"].to(device, torch.float32)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    if sched_state is not None:
        sched.load_state_dict(sched_state)
        set_peak_lr(sched, phase.peak_lr)
    return opt, sched


def reprepare(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              scheduler: LambdaLR, wrap_model: bool = True) -> tuple[torch.nn.Module, torch.optim.Optimizer, LambdaLR]:
    """Give Accelerate a new (model, optimizer, scheduler) after a level change; returns the prepared trio.

    Drops Accelerate's references to the previous trio first (``free_memory``, public API), so the old
    model and its optimizer state can be garbage-collected; callers must drop theirs too.
    ``wrap_model`` False: only the optimizer and scheduler are prepared and the model is returned as it
    is (a model sharded by FSDP2 on processes where Accelerate itself runs DDP: progressive.run.sharding).
    """
    accelerator.free_memory()
    if wrap_model:
        return accelerator.prepare(model, optimizer, scheduler)
    optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
    return model, optimizer, scheduler
