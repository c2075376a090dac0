"""AutoFreeze (and AutoCache) of He, Li, Soltanolkotabi and Avestimehr, "PipeTransformer: Automated Elastic
Pipelining for Distributed Training of Large-scale Models", ICML 2021 (arXiv 2102.03161), sec. 3.1 and 3.4.

A growing prefix of the model is frozen while it trains (the paper's setting: fine-tuning a pretrained
ViT or BERT). Every ``freeze_every`` optimizer steps a decision T = 1, 2, ... sets the frozen prefix

    F_T = max(F_{T-1}, min(B_T, C_T, max_frozen))
    B_T = ceil(L * (1 - (1 - alpha)^T))          the paper's bound F_{T-1} + alpha * (L - F_{T-1}), unrolled
    C_T = the gradient criterion over the active layers l = F_{T-1} .. L-1:
          "argmin"   (the paper's): argmin_l g_l + 1, g_l = mean over the steps since the last decision
                     of the layer's gradient norm (all its parameters), so the layer whose weights moved
                     least is frozen with everything below it
          "relative" (Liu et al., "AutoFreeze", arXiv 2102.01386): r_l = |g'_l - g_l| / g'_l against the
                     previous decision's g'_l; the frozen prefix grows by the leading active layers whose
                     r_l is below the median r (the first decision has no reference and freezes nothing)
          "bound"    no criterion: C_T = L (the closed-form schedule alone, what the authors' code ran)

L is the number of transformer layers; a frozen prefix is the embeddings plus layers 0..F-1
(operators.freeze_prefix: parameters leave the optimizer, the prefix runs without autograd, a tied LM
head keeps training). The head (and the final norm) always train. Statistics are collected after every
backward (after gradient accumulation and the DDP all-reduce, so every process decides the same).

AutoCache (``cache.enabled``): the prefix's output for each training sample is kept (progressive.autocache)
and, while the sample's cached depth is the current F, the prefix does not run at all; a sample cached
at an earlier depth d runs layers d..F-1 only. The FLOPs of every step count what ran
(progressive.model.flops.frozen_training_flops).

Deviations from the paper and the authors' code, and why:
1. Decisions every ``freeze_every`` optimizer steps, not at epoch ends (fine-tuning runs are a few epochs;
   Composer's LayerFreezing has the same epoch-end limitation, and cannot resume).
2. The gradient criterion actually runs (the authors' code hard-codes the closed-form schedule) and L is
   read from the model (the authors hard-code 12).
3. AdamW keeps its moments for the still-trainable parameters at a freeze; the authors rebuild the
   optimizer (losing its state) every epoch.
4. The cache has a working, byte-bounded disk tier (the authors' is an empty stub), whose entries carry a
   checksum and the sample, depth, dtype and shape they were written for (a failed check is a miss, never
   a wrong activation; progressive.autocache.slotfile), and it is refused when a cached output would be wrong:
   inputs that change between draws (MLM re-masking), and an input embedding tied to the output head (it
   keeps training, so the prefix's output changes). Under DDP each process caches what it draws. Without
   dropout, cached and uncached training give the same losses (tests/unit/methods/test_autofreeze.py), since a
   sample's prefix output is computed the same way either way; with dropout, an entry keeps the mask of
   the draw that computed it, and a hit makes no random draws.
5. One process per model here; the pipeline part (AutoPipe, AutoDP) is progressive/pipeline/, which calls
   ``record`` / ``decide`` with gradient norms all-reduced over its stages, so it decides exactly as here,
   and feeds its first stage from ``serve_prefix`` (this cache) when AutoCache is on.
6. The cache is part of the checkpoint (``save_local`` / ``load_local``: each process's entries, both
   tiers, and its random state), so a killed run resumed with ``--resume`` repeats the uninterrupted one
   bit for bit, dropout included (tests/integration/test_resume_matrix.py). The cost: each checkpoint holds a copy of
   every process's cache (its memory tier in safetensors, the used part of its disk file as it is). On
   another world size the checkpoint has no part for a process: its cache starts empty, with a warning.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import family_of, head_is_tied, named_optimizer_state
from operators.freeze import forward_from, freeze_prefix, layer_grad_norms, prefix_output
from progressive.autocache import ActivationCache, check_room, load_cache, save_cache
from progressive.autocache.replica import PrefixReplica
from progressive.config import ConfigError
from progressive.methods.autofreeze.options import AutoFreezeConfig
from progressive.methods.base import Method, ModelChange, Phase, StepFlops, StepPlan
from progressive.model.flops import frozen_training_flops

if TYPE_CHECKING:  # loaded where a model is built: a recipe's section is read without them (--help, --list)
    import torch
    from transformers import PretrainedConfig

def bound(layers: int, alpha: float, decision: int) -> int:
    """B_T = ceil(L (1 - (1 - alpha)^T)) after ``decision`` = T decisions: the closed form the authors' code
    computes; the paper's stepwise rule is tighter after the criterion froze fewer (docs/autofreeze.md)."""
    return min(layers, math.ceil(layers * (1.0 - (1.0 - alpha) ** decision) - 1e-9))


def criterion(kind: str, norms: np.ndarray, previous: np.ndarray | None, frozen: int) -> int:
    """C_T for per-layer gradient norms ``norms`` [L] (entries below ``frozen`` are ignored)."""
    L = len(norms)
    if kind == "bound" or frozen >= L:
        return L
    active = norms[frozen:]
    if kind == "argmin":
        return frozen + int(np.argmin(active)) + 1
    if previous is None:
        return frozen
    change = np.abs(previous[frozen:] - active) / np.maximum(previous[frozen:], 1e-30)
    below = change < np.median(change)
    return frozen + (int(np.argmin(below)) if not below.all() else len(below))


class AutoFreeze(Method):
    """Freezes a growing prefix on the schedule above; optionally serves it from AutoCache."""

    name = "autofreeze"
    options = AutoFreezeConfig
    freezes = True

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self.af: AutoFreezeConfig = cfg.method.autofreeze
        self.frozen, self.decisions, self.layers = 0, 0, 0
        self.grad_sum: np.ndarray | None = None
        self.grad_n = 0
        self.previous: np.ndarray | None = None
        self.last: tuple[int, int] | None = None  # (B_T, C_T) of the latest decision, logged with every row
        self.cache = None
        self._replica = PrefixReplica()  # under FSDP2: a plain copy for the frozen prefix
        self._plan: StepPlan | None = None
        self._skipped = 0.0
        if self.af.cache.enabled and family.objective == "mlm":
            raise ConfigError("method.autofreeze.cache.enabled: masked-LM inputs are re-masked at every draw, so a "
                              "cached activation would belong to another input; use it with clm, cls or seqcls")

    # ------------------------------------------------------------------------------------- planning

    def plan(self, base_config: PretrainedConfig, step_flops: StepFlops) -> list[Phase]:

        self.layers = family_of(base_config).sizes(base_config)["layers"]
        if self.af.cache.enabled:

            if head_is_tied(self.family.build_model(base_config, meta=True)):
                raise ConfigError("method.autofreeze.cache.enabled: the input embedding is tied to the output head "
                                  "and keeps training, so the frozen prefix's output changes and a cached copy goes "
                                  "stale; set model.tie_word_embeddings false, or train without the cache")
            self._check_cache_room(base_config)
        if self.af.max_frozen is not None and self.af.max_frozen > self.layers:
            raise ConfigError(f"method.autofreeze.max_frozen: {self.af.max_frozen} > the model's {self.layers} layers")
        return super().plan(base_config, step_flops)

    def _check_cache_room(self, base_config: PretrainedConfig) -> None:

        c = self.af.cache
        hidden = family_of(base_config).sizes(base_config)["hidden"]
        try:  # an entry holds >= 2 bytes per number
            check_room(c.memory_mb, c.disk_mb, self.family.tokens_per_sample(base_config, self.cfg.data.seq_len)
                       * hidden * 2, self._cache_place()[0])
        except ValueError as e:
            raise ConfigError(f"method.autofreeze.cache{e}") from None

    # ------------------------------------------------------------------------------------ the hooks

    def on_model(self, model: torch.nn.Module) -> None:

        freeze_prefix(model, self.frozen)

    def before_step(self, step: int, model: torch.nn.Module) -> StepPlan:
        self._plan, self._skipped = StepPlan(flops=self._flops(model, skipped=0)), 0.0
        return self._plan

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], sample_ids: np.ndarray) -> Any:
        if not self.caching:
            return model(**batch)

        raw = getattr(model, "module", model)  # DDP wraps the model; the layer list is the raw model's
        hidden, skipped = self.serve_prefix(self._prefix_model(raw), batch, sample_ids)
        self._count(raw, skipped)
        return forward_from(raw, batch, self.frozen, hidden, call=model)

    def _prefix_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """What computes the frozen prefix for cache misses: ``model``, or under FSDP2 a plain copy of it
        (progressive.autocache.replica: each process computes only its own misses, and the sharded blocks'
        forward all-gathers, so they must not run them)."""
        return self._replica.model_for(model, self.frozen, self.family.build_model)

    @property
    def caching(self) -> bool:
        """True when AutoCache serves the frozen prefix now (enabled, and enough layers frozen)."""
        return self.af.cache.enabled and self.frozen >= self.af.cache.min_frozen

    def serve_prefix(self, model: torch.nn.Module, batch: dict[str, torch.Tensor],
                     sample_ids: np.ndarray) -> tuple[torch.Tensor, int]:
        """The frozen prefix's output for ``batch`` (its rows are the training samples ``sample_ids``) on the
        model's device, from this process's cache where it holds the current depth, else computed (only the
        layers a sample's cached depth lacks) and cached; and the layer-samples the cache saved. The pipeline
        engine feeds its first stage with it."""
        import torch

        F = self.frozen
        if self.cache is None:
            self._start_cache(prefix_output(model, {k: v[:1] for k, v in batch.items()}, stop=1))
        # -1: not cached, or a disk entry that failed its checks (recomputed, as a miss)
        depths, values = self.cache.lookup(sample_ids)
        hidden = torch.empty((len(sample_ids), *self.cache.shape), dtype=self.cache.dtype)
        skipped = 0
        for d in np.unique(depths):  # each group runs only the layers its cached depth lacks
            rows = np.flatnonzero(depths == d)
            if d == F:
                hidden[rows] = values[rows]
                self.cache.stats.hits += len(rows)
            else:
                sub = {k: v[torch.as_tensor(rows, device=v.device)] for k, v in batch.items()}
                cached = values[rows] if d >= 0 else None
                h = prefix_output(model, sub, stop=F, start=max(int(d), 0), hidden=cached)
                self.cache.put(sample_ids[rows], F, h)
                hidden[rows] = h.to("cpu", self.cache.dtype)
                if d >= 0:
                    self.cache.stats.partial += len(rows)
                else:
                    self.cache.stats.misses += len(rows)
            skipped += len(rows) * max(int(d), 0)
        return hidden.to(next(model.parameters()).device), skipped

    def _count(self, model: torch.nn.Module, skipped: int) -> None:
        """This step's FLOPs so far: a step of global batch B in which S layer-samples were served from the
        cache (summed over micro-batches and processes, whose caches differ) costs full - S (full - one) / B,
        with full / one the analytic step FLOPs with 0 / 1 layers skipped for every sample (the count is
        linear in both)."""
        import torch
        import torch.distributed as dist

        s = torch.tensor([float(skipped)], dtype=torch.float64)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(s)  # a scalar per micro-batch (gloo: CPU tensors)
        self._skipped += s.item()
        self._plan.flops = self.cached_flops(model, self._skipped)

    def cached_flops(self, model: torch.nn.Module, skipped: float) -> int:
        """The FLOPs of a step in which ``skipped`` layer-samples (all processes) came from the cache."""
        full, one = self._flops(model, 0), self._flops(model, 1)
        return full - round(skipped * (full - one) / self.cfg.train.batch_size)

    def on_gradients(self, step: int, model: torch.nn.Module) -> None:

        self.record(layer_grad_norms(model, start=self.frozen))

    def record(self, norms: np.ndarray) -> None:
        """Add one optimizer step's per-layer gradient norms [L] to the statistics of the next decision
        (the pipeline engine calls this with norms all-reduced over its stages)."""
        self.grad_sum = norms if self.grad_sum is None else self.grad_sum + norms
        self.grad_n += 1

    def decide(self, step: int, cap: int | None = None) -> tuple[int, int, int, int] | None:
        """The freeze decision after optimizer step ``step``, if one is due: updates the state and returns
        (old F, new F, bound B_T, criterion C_T) when the frozen prefix grew, else None. ``cap``: freeze at
        most this many layers (the user's max_frozen applies too; a fixed pipeline of K stages caps L - K)."""
        if (step + 1) % self.af.freeze_every or self.grad_n == 0:
            return None
        norms = self.grad_sum / self.grad_n
        self.decisions += 1
        cap = min(self.layers if self.af.max_frozen is None else self.af.max_frozen,
                  self.layers if cap is None else cap)
        b = bound(self.layers, self.af.alpha, self.decisions)
        c = criterion(self.af.criterion, norms, self.previous, self.frozen)
        new = max(self.frozen, min(b, c, cap))
        self.previous, self.grad_sum, self.grad_n, self.last = norms, None, 0, (b, c)
        if new == self.frozen:
            return None
        old, self.frozen = self.frozen, new
        return old, new, b, c

    def change_after_step(self, step: int, model: torch.nn.Module,
                          optimizer: torch.optim.Optimizer) -> ModelChange | None:
        decided = self.decide(step)
        if decided is None:
            return None

        old, new, b, c = decided
        freeze_prefix(model, new)  # the frozen parameters leave the optimizer the trainer builds next
        state = named_optimizer_state(model, optimizer)
        return ModelChange(model, state, self.note(decided))

    def note(self, decided: tuple[int, int, int, int]) -> str:
        """The log line of a decision ``decide`` returned."""
        old, new, b, c = decided
        return (f"froze layers {old}..{new - 1} (decision {self.decisions}: bound {b}, {self.af.criterion} "
                f"criterion {c}); {new}/{self.layers} frozen")

    def log_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"frozen": self.frozen}
        if self.last is not None:  # which of the two bound the latest decision: C_T < B_T means the criterion
            out.update(freeze_decisions=self.decisions, freeze_bound=self.last[0], freeze_criterion=self.last[1])
        if self.cache is not None:
            s = self.cache.stats
            out.update(cache_hit_rate=round(s.hit_rate, 4), cache_mem_mb=round(s.memory_bytes / 2**20, 1),
                       cache_disk_mb=round(s.disk_bytes / 2**20, 1))
        return out

    # --------------------------------------------------------------------------------------- helpers

    def _flops(self, model: torch.nn.Module, skipped: int) -> int:

        config = model.config
        seq = self.family.tokens_per_sample(config, self.cfg.data.seq_len)
        return frozen_training_flops(config, self.cfg.train.batch_size, seq, self.frozen, family_of(config).pre_ln,
                                     skipped=skipped, arch=self.family.model_cls.__name__)

    def _cache_place(self) -> tuple[Path, bool]:
        """(folder of the disk tier, whether it belongs to this run: <run>/autocache does, disk_dir does not)."""
        c = self.af.cache
        return (Path(c.disk_dir), False) if c.disk_dir else (self.cfg.run_dir / "autocache", True)

    def run_folder_entries(self) -> tuple[str, ...]:
        where, owned = self._cache_place()
        return (where.name,) if owned and self.af.cache.enabled else ()

    def _cache_args(self) -> dict[str, Any]:
        c = self.af.cache
        where, owned = self._cache_place()
        return dict(memory_bytes=int(c.memory_mb * 2**20), disk_bytes=int(c.disk_mb * 2**20), disk_dir=where,
                    owned=owned)

    def _start_cache(self, example: torch.Tensor) -> None:
        """The activation store, sized from one sample's prefix output [1, *shape] (one per process)."""

        self.cache = ActivationCache(tuple(example.shape[1:]), example.dtype, name=_process_name(),
                                     **self._cache_args())

    def finish(self) -> None:
        if self.cache is not None:
            self.cache.close()
            self.cache = None
        where, owned = self._cache_place()
        if owned:
            with contextlib.suppress(OSError):  # not empty (another process's file), or removed by another
                where.rmdir()  # <run>/autocache, once every process removed its own file

    def state_dict(self) -> dict[str, Any]:
        import torch

        return {"frozen": self.frozen, "decisions": self.decisions, "grad_n": self.grad_n,
                "grad_sum": None if self.grad_sum is None else torch.from_numpy(self.grad_sum),
                "previous": None if self.previous is None else torch.from_numpy(self.previous),
                "last": None if self.last is None else torch.tensor(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.frozen, self.decisions, self.grad_n = state["frozen"], state["decisions"], state["grad_n"]
        last = state.get("last")  # absent in checkpoints written before it was logged
        self.last = None if last is None else (int(last[0]), int(last[1]))
        self.grad_sum = None if state["grad_sum"] is None else state["grad_sum"].numpy().copy()
        self.previous = None if state["previous"] is None else state["previous"].numpy().copy()

    @property
    def has_local_state(self) -> bool:
        return self.af.cache.enabled  # each process's cache of the samples it drew

    def save_local(self, folder: Path, name: str) -> None:

        save_cache(self.cache, folder, name)

    def load_local(self, folder: Path, name: str) -> None:

        if self.cache is not None:
            self.cache.close()
        self.cache = load_cache(folder, name, file_name=_process_name(), **self._cache_args())


def _process_name() -> str:
    """The disk tier's file prefix: one file per process (RANK from the launcher)."""
    return f"rank{int(os.environ.get('RANK', '0'))}"


METHOD = AutoFreeze
