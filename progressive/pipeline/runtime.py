"""One rank's place in the pipeline and one training step on it (engine.py runs the loop around it).

A rank is stage s of replica d under a ``Layout``: it holds that stage's slice of the HF model (stages.py),
an AdamW over what the stage trains, the LR schedule, and a torch.distributed.pipelining schedule
(ScheduleGPipe, or Schedule1F1B when M >= K) over a ``TimedStage``. A step:

    stage 0 runs the frozen prefix (embeddings + layers 0..F-1) on its replica's batch without autograd,
    or serves it from AutoCache (AutoFreeze.serve_prefix: this process's cache of its samples);
    the schedule runs the M micro-batches forward and backward (the last stage's output is the HF loss of
    a micro-batch, gradients are divided by M);
    ``reduce``: gradients averaged over the dp replicas of the stage (one flat all-reduce, the replica's
    mean loss and AutoCache's count appended), then per-layer squared gradient norms, their total, the loss
    and the count summed over the K stages (one all-reduce of L + 3 numbers): every rank holds the global
    loss, AutoFreeze's per-layer norms, the global norm and the layer-samples the caches saved;
    ``update``: clipping as torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), at most 1),
    AdamW, the LR schedule.

The data-parallel all-reduce is ours, not DDP's: DDP under pipelining needs the schedule to reach into its
reducer (the pipelining stage does, through a private method), and the flat all-reduce is the same average.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from common.device import Stopwatch
from operators.freeze import prefix_output
from progressive.config import RunConfig
from progressive.methods.base import Phase
from progressive.pipeline.mesh import Layout, Mesh, build_mesh
from progressive.pipeline.stages import Holding, StageModule, holding, materialise, set_hollow
from progressive.run.accelerator import build_optimizer_and_scheduler


class TimedStage(PipelineStage):
    """A PipelineStage that adds the seconds of its forward and backward computations to ``busy`` (waits
    for other stages happen outside these calls, so this is the stage's own compute; on a GPU each chunk
    is synchronised before the clock is read, so that the time is the kernels', not their launch)."""

    busy = 0.0

    def _timed(self, run: Any, *args: Any, **kwargs: Any) -> Any:
        clock = Stopwatch(self.device)
        try:
            return run(*args, **kwargs)
        finally:
            self.busy += clock.lap()

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_one_chunk, *args, **kwargs)


def _receive_gradients(stage: PipelineStage) -> None:
    """Before a training step: the stage's receive buffers require gradients, as a training step's first call
    makes them. torch 2.11 makes them once, at a fresh schedule's first call, and keeps them: when that call
    was an evaluation (the trainer evaluates at step 0), its buffers do not, the backward has no input
    gradients, and the step fails ("has gradients None and is expecting to send gradients"). torch 2.13 sets
    the flag at every call, so this changes nothing there."""
    for infos in (getattr(stage, "args_recv_info", None) or {}).values():
        for info in infos:
            buffer = getattr(info, "buffer", None)
            if torch.is_tensor(buffer) and buffer.is_floating_point() and not buffer.requires_grad:
                buffer.requires_grad_(True)


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return output  # the last stage returns the HF model's loss of the micro-batch already


class StageRuntime:
    """This rank's stage: ``build`` it for a layout, ``run`` the schedule, ``reduce`` and ``update``."""

    def __init__(self, model: torch.nn.Module, groups: tuple, cfg: RunConfig, count_correct: bool,
                 device: torch.device, autocast: Any):
        self.model, self.groups, self.cfg, self.device, self.autocast = model, groups, cfg, device, autocast
        self.count_correct = count_correct
        self.layer_of = {n: i for i, names in enumerate(groups[1]) for n in names}
        self.layout: Layout | None = None
        self.mesh: Mesh | None = None
        # made by build() for each layout: what this rank holds and trains, its AdamW and LR schedule
        self.holding: Holding | None = None
        self.module: StageModule | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.sched: Any = None
        # made by schedule(): the pipeline stage and its schedule (a new one per M)
        self.stage: TimedStage | None = None
        self.pipe: Any = None
        self.skipped = 0  # layer-samples AutoCache served this rank in the last run

    def build(self, layout: Layout, received: dict[str, torch.Tensor], named_state: dict | None,
              sched_state: dict | None, phase: Phase) -> None:
        """Become the stage ``layout`` gives this rank: a new mesh when K changes, its parameters (its own or
        ``received``), hollow embeddings off stage 0, AdamW with ``named_state`` for what it trains, the
        phase's LR schedule at ``sched_state``'s position, a fresh pipeline schedule."""
        if self.layout is None or self.layout.k != layout.k:
            self.mesh = build_mesh(layout, self.device)
        self.layout = layout
        h = self.holding = holding(self.groups, layout.frozen, layout.bounds, self.mesh.stage)
        self.opt = self.sched = None
        materialise(self.model, received, h.keep, h.train, self.device)
        set_hollow(self.model, not h.first)
        self.module = StageModule(self.model, h, count_correct=self.count_correct)
        mine = {n: s for n, s in named_state.items() if n in h.train} if named_state else None
        self.opt, self.sched = build_optimizer_and_scheduler(self.model, self.cfg.train, phase, self.device, mine,
                                                             sched_state=sched_state)
        self.schedule(layout.microbatches)

    def schedule(self, m: int) -> None:
        """A fresh PipelineStage and schedule with M micro-batches (shapes are inferred on the first step)."""
        k = self.layout.k
        self.stage = TimedStage(self.module, self.mesh.stage, k, self.device, group=self.mesh.pp_group)
        cls = Schedule1F1B if self.cfg.parallel.schedule == "1f1b" and m >= k else ScheduleGPipe
        self.pipe = cls(self.stage, n_microbatches=m, loss_fn=_loss)
        self.layout = Layout(self.layout.frozen, self.layout.bounds, self.layout.dp, m)

    def local(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This replica's rows of a global batch: [d B/dp, (d+1) B/dp) (every sample once, whatever dp)."""
        per = self.cfg.train.batch_size // self.layout.dp
        lo = self.mesh.replica * per
        return {k: v[lo:lo + per].to(self.device) for k, v in batch.items()}

    def local_ids(self, ids: np.ndarray) -> np.ndarray:
        """This replica's sample ids of a global batch (the rows ``local`` takes)."""
        per = self.cfg.train.batch_size // self.layout.dp
        return ids[self.mesh.replica * per:(self.mesh.replica + 1) * per]

    def run(self, mb: dict[str, torch.Tensor], train: bool,
            prefix: Callable[[dict], tuple[torch.Tensor, int]] | None = None) -> list[torch.Tensor] | None:
        """One pass of the schedule over this replica's batch (forward and backward, or forward only); the
        last stage returns the M micro-batch losses. Stage 0 feeds the frozen prefix's output: ``prefix(mb)``
        (AutoCache: (hidden, layer-samples served from the cache), kept in ``self.skipped``), else computed
        without autograd."""

        h, f = self.holding, self.layout.frozen
        self.skipped = 0
        with self.autocast():
            args = ()
            if h.first and f:
                x, self.skipped = prefix(mb) if prefix is not None else (prefix_output(self.model, mb, stop=f), 0)
                args = (x,)
            losses = [] if h.last else None
            target = mb["labels"] if h.last else None
            if train:
                _receive_gradients(self.stage)
                self.pipe.step(*args, target=target, losses=losses, return_outputs=False, **mb)
            else:
                self.pipe.eval(*args, target=target, losses=losses, return_outputs=False, **mb)
        return losses

    def reduce(self, replica_loss: float) -> tuple[float, np.ndarray, float, float]:
        """Average gradients (and this replica's loss) over dp; sum per-layer squared norms, the total, the
        loss and the cache's layer-samples over pp. Returns (global loss, per-layer gradient norms [L] (0
        below F), total norm, layer-samples all stage-0 ranks served from their caches)."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad and p.grad is not None]
        grads = [p.grad for _, p in named]
        dp = self.layout.dp
        extra = torch.tensor([replica_loss, float(self.skipped)], dtype=torch.float32, device=self.device)
        if dp > 1:
            flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
            dist.all_reduce(flat, group=self.mesh.dp_group)
            flat /= dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            extra = flat[-2:]
        L = len(self.groups[1])
        vec = torch.zeros(L + 3, dtype=torch.float64, device=self.device)
        for n, p in named:
            sq = p.grad.detach().float().pow(2).sum().double()
            if n in self.layer_of:
                vec[self.layer_of[n]] += sq
            vec[L] += sq
        vec[L + 1] = extra[0].double()
        vec[L + 2] = extra[1].double() * dp  # the mean over replicas back to their sum
        if self.layout.k > 1:
            dist.all_reduce(vec, group=self.mesh.pp_group)
        vec = vec.cpu().numpy()
        norms = np.sqrt(vec[:L])
        norms[: self.layout.frozen] = 0.0
        return float(vec[L + 1]), norms, float(np.sqrt(vec[L])), float(round(vec[L + 2]))

    def update(self, total_norm: float) -> float:
        """Clip (train.max_grad_norm), step AdamW and the LR schedule, clear gradients; returns the LR used."""
        max_norm = self.cfg.train.max_grad_norm
        grads = [p.grad for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        if max_norm > 0 and grads and max_norm / (total_norm + 1e-6) < 1.0:
            torch._foreach_mul_(grads, max_norm / (total_norm + 1e-6))
        lr = self.sched.get_last_lr()[0]
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return lr
