"""The multi-level V-cycle of Zou, Zhang and Deng, "A Multi-Level Framework for Accelerating Training
Transformer Models", ICLR 2024 (arXiv 2404.07999), Algorithm 1, with K >= 2 levels.

Levels are numbered 0..K-1 here, as in the config (``levels[k]``), the logs and the plots: level 0 is the
full model (the paper's M_1), level k+1 = Coalesce(level k) with levels[k+1]'s width and depth factors
(width first, then depth, as in the paper). With E_a(k) = ``levels[k].down``:

    M_0 <- random init
    for k = 0 .. K-2:                       # down-sweep; phase "L<k>-down"
        train M_k for E_a(k)                 # short warm start
        keep a copy of M_k                   # the interpolation partner (see deviation 1)
        M_{k+1} <- Coalesce(M_k)
    train M_{K-1} for levels[K-1].down       # the cheap coarsest level; phase "L<K-1>"
    for k = K-2 .. 0:                        # up-sweep; phase "L<k>-up"
        M_k <- (1 - alpha_k) * M_k(kept) + alpha_k * DeCoalesce(M_{k+1})
        train M_k for levels[k].up           # k = 0: typically to the end of the budget

The paper's GPT-Base recipe in this config: levels[0] = {down: {fraction: 0.05, warmup: 1.0},
up: {fraction: 0.5}, alpha: 0.25}, levels[1] = {width: 2, depth: 2, down: {fraction: 0.5, lr_scale: 4}}
(fractions of the baseline's steps; alpha is the weight of the de-coalesced model).

Deviations from the paper and from the authors' scripts, and why:
1. Interpolation partner: the level's model as it was *before coalescing* (Algorithm 1). The authors'
   GPT-2 script interpolated with the baseline's output folder instead, which leaks a fully trained
   baseline into the result (or fails when the baseline has not been run).
2. Optimizer state: ``optimizer_state: mapped`` (default) carries AdamW's moments through the same maps as
   the weights (operators.map_optimizer_state) and keeps step counts; at an up-step the moments mapped
   from the smaller level are interpolated with the level's own moments kept from before coalescing,
   with the same alpha as the weights (operators.interpolate_state). ``reset`` gives a fresh optimizer
   at every level change, as the authors' restarts did.
3. LR schedule: every phase has an explicit peak LR, warm-up and decay; the authors' stages each started a
   fresh HF Trainer with its own linear schedule (expressible here exactly).
4. One process runs the whole schedule, checkpointing the kept copies, so a run resumes at any step.
5. The last phase may leave its length open: it then runs until the FLOPs budget (train.steps on the
   full model) is spent, so the V-cycle and the baseline compare at equal compute.
6. Width de-coalescing is function preserving for tied heads too (operators put the 1/k on the last norm
   before the head, not on the embedding as the authors' GPT-2 code did).
7. Optional, not in the paper: ``width_split: asymmetric`` de-coalesces with LEMON's symmetry-breaking split
   (Wang et al., ICLR 2024): the weights reading a duplicated neuron get W/k + N_j with sum_j N_j = 0, so
   the up-step is still exact at alpha = 1 but the copies diverge under training. With the paper's
   symmetric split and alpha = 1 they would stay identical for ever. Noise std ``split_noise`` (in units
   of each split tensor's std), seeded by ``split_seed`` (default: train.seed) plus the level index.
8. Optional, not in the paper: ``schedule: global`` runs one LR schedule over all phases instead of one per phase:
   train's warm-up, decay, min_lr_ratio and cooldown over the sum of the phases' steps, each phase a window of it
   (Phase.schedule_offset) at its own peak LR (lr or lr_scale x train.lr). Under a WSD decay (train.decay: wsd)
   the LR holds the peak through every level change and cools down once, at the end of the run, where a per-phase
   WSD would cool down at the end of every phase. The PhaseSpecs' own warmup/decay are then unused.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from common.device import synchronize
from operators import (
    OperatorError,
    coalesce,
    decoalesce,
    interpolate,
    interpolate_state,
    map_optimizer_state,
    named_optimizer_state,
    resized_config,
    validate_resize,
)
from progressive.config import ConfigError
from progressive.config.phase import PhaseSpec
from progressive.methods.base import Method, ModelChange, Phase, StepFlops
from progressive.methods.vcycle.options import LevelConfig, VCycleConfig

if TYPE_CHECKING:  # loaded where a level changes: a recipe's section is read without them (--help, --list)
    import torch
    from transformers import PretrainedConfig


class VCycle(Method):
    """Plans the V-cycle's 2K-1 phases and performs the coalesce / de-coalesce + interpolate transitions."""

    name = "vcycle"
    options = VCycleConfig

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self.vc = cfg.method.vcycle
        self.kept: dict[int, dict[str, torch.Tensor]] = {}  # level -> weights before coalescing (see _park)
        self.park: str | None = None  # where kept copies go: None = park_on's choice, or "device" / "host"
        self.kept_opt: dict[int, dict[str, dict[str, Any]]] = {}  # level -> its named AdamW state then

    # ------------------------------------------------------------------------------------- planning

    def _check_levels(self) -> list[LevelConfig]:
        levels, w = self.vc.levels, "method.vcycle.levels"
        if len(levels) < 2:
            raise ConfigError(f"{w}: a V-cycle needs at least 2 levels, got {len(levels)}")
        if (levels[0].width, levels[0].depth) != (1, 1):
            raise ConfigError(f"{w}[0].width/depth: level 0 is the full model, its factors must be 1 "
                              f"(got {levels[0].width}/{levels[0].depth}); put factors on levels[1:]")
        last = len(levels) - 1
        for k, lv in enumerate(levels):
            if k > 0 and (lv.width < 1 or lv.depth < 1 or lv.width * lv.depth < 2):
                raise ConfigError(f"{w}[{k}].width/depth: factors >= 1 that shrink the model, got "
                                  f"{lv.width}/{lv.depth}")
            if k < last:
                if lv.alpha is None or not 0.0 <= lv.alpha <= 1.0:
                    raise ConfigError(f"{w}[{k}].alpha: an interpolation weight in [0, 1] is required, got {lv.alpha}")
                if lv.up is None:
                    raise ConfigError(f"{w}[{k}].up: level {k} is trained again after de-coalescing; set its phase")
            else:
                if lv.alpha is not None or lv.up is not None:
                    raise ConfigError(f"{w}[{k}].alpha/up: the coarsest level has no up phase; remove them")
        return levels

    def level_configs(self, base_config: PretrainedConfig) -> list[PretrainedConfig]:
        """The HF config of every level (level 0 = ``base_config``); validates every factor."""

        out = [base_config]
        for k, lv in enumerate(self._check_levels()[1:], start=1):
            where = f"method.vcycle.levels[{k}]"
            try:
                validate_resize(out[-1], lv.width, lv.depth, "coalesce", lv.pairing, lv.depth_pairing)
                small = resized_config(out[-1], lv.width, lv.depth, "coalesce", depth_pairing=lv.depth_pairing)
                validate_resize(small, lv.width, lv.depth, "decoalesce", lv.pairing, lv.depth_pairing,
                                self.vc.depth_mode)
            except OperatorError as e:
                raise ConfigError(f"{where}: {e}") from None
            out.append(small)
        return out

    def plan(self, base_config: PretrainedConfig, step_flops: StepFlops) -> list[Phase]:
        levels = self._check_levels()
        configs = self.level_configs(base_config)
        t, last = self.cfg.train, len(levels) - 1
        order: list[tuple[str, int, PhaseSpec, str]] = []
        for k in range(last):
            order.append((f"L{k}-down", k, levels[k].down, f"levels[{k}].down"))
        order.append((f"L{last}", last, levels[last].down, f"levels[{last}].down"))
        for k in range(last - 1, -1, -1):
            order.append((f"L{k}-up", k, levels[k].up, f"levels[{k}].up"))
        budget = t.steps * step_flops(base_config)
        phases, spent, open_phase = [], 0, None
        for i, (name, k, spec, where) in enumerate(order):
            steps = spec.steps if spec.steps is not None else (
                max(1, int(round(spec.fraction * t.steps))) if spec.fraction is not None else None)
            if steps is None:
                if i != len(order) - 1:
                    raise ConfigError(f"method.vcycle.{where}: set steps or fraction (only the last phase, "
                                      f"levels[0].up, may run to the end of the budget)")
                open_phase = i
                steps = 0
            lr = spec.lr if spec.lr is not None else spec.lr_scale * t.lr
            phases.append(Phase(name, steps, lr, spec.warmup, spec.decay, spec.min_lr_ratio, configs[k], k,
                                cooldown=spec.cooldown))
            spent += steps * step_flops(configs[k])
        if spent > budget:
            raise ConfigError(
                f"method.vcycle.levels: the phases need {spent:.4g} FLOPs, more than the budget "
                f"train.steps={t.steps} on the full model = {budget:.4g} FLOPs; "
                "shorten the phases or raise train.steps")
        if open_phase is not None:
            rest = (budget - spent) // step_flops(base_config)
            if rest < 1:
                raise ConfigError("method.vcycle.levels[0].up: no budget left for the last phase; shorten the "
                                  "earlier phases or raise train.steps")
            phases[open_phase].steps = int(rest)
        if self.vc.schedule == "global":
            self._one_schedule(phases)
        return phases

    def _one_schedule(self, phases: list[Phase]) -> None:
        """Make ``phases`` consecutive windows of one schedule of train's shape over all their steps (deviation 8)."""
        t, start, total = self.cfg.train, 0, sum(p.steps for p in phases)
        for p in phases:
            p.warmup, p.decay, p.min_lr_ratio, p.cooldown = t.warmup, t.decay, t.min_lr_ratio, t.cooldown
            p.schedule_offset, p.schedule_steps = start, total
            start += p.steps

    # ---------------------------------------------------------------------------------- transitions

    def transition(self, index: int, phases: list[Phase], model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer) -> ModelChange:
        """Coalesce (going down a level) or de-coalesce + interpolate (going up), with optimizer state."""
        import torch

        prev, cur = phases[index - 1], phases[index]
        mapped = self.vc.optimizer_state == "mapped"
        state = named_optimizer_state(model, optimizer) if mapped else None
        if cur.level > prev.level:  # down: keep M_k, then coalesce into level k+1
            lv = self.vc.levels[cur.level]
            self.kept[prev.level], kept_opt = _park(model.state_dict(), state, self.park)
            if kept_opt is not None:
                self.kept_opt[prev.level] = kept_opt
            new = coalesce(model, lv.width, lv.depth, lv.pairing, lv.depth_pairing)
            direction, note = "coalesce", f"coalesced level {prev.level} -> {cur.level}"
        else:  # up: de-coalesce level k+1, interpolate with the kept M_k (Algorithm 1's partner)
            lv = self.vc.levels[prev.level]
            if cur.level not in self.kept:
                raise RuntimeError(f"V-cycle state lost: no kept weights of level {cur.level} to interpolate with")
            seed = (self.cfg.train.seed if self.vc.split_seed is None else self.vc.split_seed) + cur.level
            large = decoalesce(model, lv.width, lv.depth, lv.pairing, lv.depth_pairing, self.vc.depth_mode,
                               self.vc.width_split, self.vc.split_noise, seed)
            alpha = self.vc.levels[cur.level].alpha
            new = _load_into_copy(large, self.kept.pop(cur.level))
            new = interpolate(new, large, alpha, inplace=True)
            direction, note = "decoalesce", f"de-coalesced level {prev.level} -> {cur.level}, alpha={alpha}"
        if state is not None:
            state = map_optimizer_state(state, model, direction=direction, width=lv.width, depth=lv.depth,
                                        pairing=lv.pairing, depth_pairing=lv.depth_pairing,
                                        depth_mode=self.vc.depth_mode)
            if direction == "decoalesce" and cur.level in self.kept_opt:  # on the device the moments live on
                device = next((v.device for st in state.values() for v in st.values() if torch.is_tensor(v)),
                              torch.device("cpu"))
                kept = {n: _unpark(st, device) for n, st in self.kept_opt.pop(cur.level).items()}
                state = interpolate_state(kept, state, alpha)
        return ModelChange(new, state, note)

    def state_dict(self) -> dict[str, Any]:
        return {"kept": {str(k): v for k, v in self.kept.items()},
                "kept_opt": {str(k): v for k, v in self.kept_opt.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kept = {int(k): v for k, v in state.get("kept", {}).items()}
        self.kept_opt = {int(k): v for k, v in state.get("kept_opt", {}).items()}


def _park(weights: dict[str, Any], state: dict[str, dict[str, Any]] | None, where: str | None = None
          ) -> tuple[dict[str, Any], dict[str, dict[str, Any]] | None]:
    """Copies of a level's ``weights`` and named AdamW ``state`` (other values as they are), kept for the
    levels below it.

    On an accelerator the copies stay in its memory when they fit (``park_on``, one choice for the whole
    level): a device-to-device copy of GPT-2-124M's 1.5 GB of weights and moments takes milliseconds, where
    pinning as much host memory for the first time took 1.7 s on an H200 (bench.speed.level_change). Otherwise
    they go to pinned host memory, copied without blocking, then one wait, so the accelerator's memory is free
    for the smaller levels. ``where`` ("device" or "host") overrides the choice (the benchmark compares both)."""
    import torch

    tensors = [v for v in weights.values() if torch.is_tensor(v)]
    tensors += [v for st in (state or {}).values() for v in st.values() if torch.is_tensor(v)]
    device = tensors[0].device if tensors else torch.device("cpu")
    where = where or park_on(device, sum(v.numel() * v.element_size() for v in tensors))
    to_host = device.type != "cpu" and where == "host"
    pin = to_host and device.type == "cuda"

    def copy(v: Any) -> Any:
        if not torch.is_tensor(v):
            return v
        if not to_host:
            return v.detach().clone()
        return torch.empty_like(v, device="cpu", pin_memory=pin).copy_(v.detach(), non_blocking=pin)

    kept = {k: copy(v) for k, v in weights.items()}
    kept_opt = None if state is None else {n: {k: copy(v) for k, v in st.items()} for n, st in state.items()}
    if pin:
        synchronize(device)
    return kept, kept_opt


def park_on(device: torch.device, nbytes: int, headroom: float = 4.0) -> str:
    """Where to keep ``nbytes`` of a level for the levels below it: "device" when the accelerator has
    ``headroom`` times as much free (the driver's free memory plus what PyTorch's allocator holds unused), so
    the smaller levels and the later operators' temporaries still fit; else "host"."""
    if device.type != "cuda":  # the CPU, or an accelerator whose free memory is not asked here
        return "host"
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return "device" if free >= headroom * nbytes else "host"


def _unpark(tensors: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``tensors`` back on ``device`` (from pinned memory: without blocking the host)."""
    import torch

    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in tensors.items()}


def _load_into_copy(like: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A copy of ``like`` (same class, shape and buffers) holding ``weights``."""

    new = copy.deepcopy(like)
    new.load_state_dict(_unpark(weights, next(like.parameters()).device), strict=True)
    return new


METHOD = VCycle
