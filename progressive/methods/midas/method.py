"""MIDAS's hooks: the stages (the shared staged planner), and the growth that inserts a copy of the middle block
(the package's docstring has the algorithm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from operators import OperatorError, depth_config, family_of, grow_depth, map_depth_state, named_optimizer_state
from progressive.config import ConfigError
from progressive.methods.base import Method, ModelChange, Phase, StepFlops, staged_phases
from progressive.methods.midas.options import MidasConfig

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


def middle_copy(blocks: int, block: int) -> list[int]:
    """The copy map from ``blocks`` blocks of ``block`` layers to ``blocks + 1``: the source layer of each new
    position, blocks 0 .. m, block m again, then blocks m + 1 .. blocks - 1 (m = blocks // 2)."""
    m = blocks // 2
    order = [*range(m + 1), m, *range(m + 1, blocks)]
    return [b * block + i for b in order for i in range(block)]


def prop_boundaries(stages: int, alpha: float) -> list[float]:
    """Where stages 1 .. stages-1 start, as fractions of train.steps: stage k's share is (k + 1)^alpha over the
    sum of all stages' (PROP-alpha)."""
    weights = [(k + 1) ** alpha for k in range(stages)]
    total, out, spent = sum(weights), [], 0.0
    for w in weights[:-1]:
        spent += w
        out.append(spent / total)
    return out


class Midas(Method):
    """Plans the stages (1 block more each), grows by copying the middle block."""

    name = "midas"
    options = MidasConfig

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self.mo: MidasConfig = cfg.method.midas

    def blocks(self, layers: int) -> list[int]:
        """The blocks of every stage of a model of ``layers`` layers."""
        mo = self.mo
        if layers % mo.block:
            raise ConfigError(f"method.midas.block: {mo.block} layers a block do not divide the model's {layers} "
                              "layers (model.num_layers)")
        if mo.start > layers // mo.block:
            raise ConfigError(f"method.midas.start: {mo.start} blocks of {mo.block} is more than the model's "
                              f"{layers} layers")
        return list(range(mo.start, layers // mo.block + 1))

    def plan(self, base_config: PretrainedConfig, step_flops: StepFlops) -> list[Phase]:
        mo, t = self.mo, self.cfg.train
        try:
            layers = family_of(base_config).sizes(base_config)["layers"]
            blocks = self.blocks(layers)
            configs = [depth_config(base_config, n * mo.block) for n in blocks]
        except OperatorError as e:
            raise ConfigError(f"model: MIDAS cannot grow this model's layers: {e}") from None
        costs = [step_flops(c) for c in configs]
        phases, _ = staged_phases(
            t, [f"stage{k}-{n * mo.block}L" for k, n in enumerate(blocks)], configs,
            prop_boundaries(len(blocks), mo.alpha), costs[-1],
            lambda k, start, end: ((end - start) * costs[k], float(blocks[k] * mo.block)),
            mo.schedule == "global", float(layers), where="method.midas",
            labels=[f"{n * mo.block} layers" for n in blocks])
        return phases

    def transition(self, index: int, phases: list[Phase], model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer) -> ModelChange:
        """n -> n + 1 blocks: a copy of the middle block inserted after it; the moments mapped along, or reset."""
        full = phases[-1].config
        n, block = self.blocks(family_of(full).sizes(full)["layers"])[index - 1], self.mo.block
        src = middle_copy(n, block)
        new = grow_depth(model, len(src), src)
        state = None if self.mo.optimizer_state == "reset" else map_depth_state(
            named_optimizer_state(model, optimizer), model, len(src), src, "copy")
        return ModelChange(new, state, f"grew {n * block} -> {len(src)} layers (the middle block {n // 2} copied: "
                                       f"layer j <- {src}), optimizer state {self.mo.optimizer_state}")

    def log_fields(self) -> dict[str, int]:
        """The stage and its layers."""
        return {"stage": self.phase}


METHOD = Midas
