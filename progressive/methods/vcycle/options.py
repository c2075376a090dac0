"""The V-cycle's recipe section ``method.vcycle:`` (read without torch: progressive/config/registry.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from progressive.config.fields import check_choices, counts_if
from progressive.config.phase import PhaseSpec, require


@dataclass
class LevelConfig:
    """One V-cycle level. ``width``/``depth``/``pairing``/``depth_pairing`` say how this level is coalesced
    from the level above (level 0 is the full model: 1/1). ``down``: trained before coalescing to the next
    level (the coarsest level's only phase). ``up``: trained after de-coalescing back into this level,
    after interpolating with ``alpha`` (weight of the de-coalesced model); unused on the coarsest level."""

    width: int = 1  # this level's width is the one above's divided by this (1: same width)
    depth: int = 1  # this level's depth is the one above's divided by this (1: same depth)
    pairing: str = "stride"  # which neurons coalesce: stride (i with i + n/2) or adjacent (2i with 2i + 1)
    depth_pairing: str = "adjacent"  # which layers coalesce: adjacent (2i with 2i + 1) or stride
    alpha: float | None = None  # interpolation weight of the de-coalesced model going up (unset on the coarsest level)
    down: PhaseSpec = field(default_factory=PhaseSpec)  # trained before coalescing to the next level
    up: PhaseSpec | None = None  # trained after de-coalescing back


def _paper_gpt_levels() -> list[LevelConfig]:
    return [
        LevelConfig(alpha=0.25, down=PhaseSpec(fraction=0.05, warmup=1.0), up=PhaseSpec(fraction=0.5)),
        LevelConfig(width=2, depth=2, down=PhaseSpec(fraction=0.5, lr_scale=4.0)),
    ]


@dataclass
class VCycleConfig:
    """``method.vcycle:``, a K-level V-cycle (progressive/methods/vcycle/method.py). ``optimizer_state``: "mapped" (Adam
    moments follow the operators) or "reset" (fresh optimizer at each level change, the authors' behaviour).
    ``depth_mode``: how de-coalescing fills the extra layers, "copy" (the paper's) or "identity" (pre-LN families).
    ``width_split``: how de-coalescing splits the weights that read a duplicated neuron, "symmetric" (W/k each,
    the paper's) or "asymmetric" (W/k + zero-sum noise of std ``split_noise`` x the tensor's std, seeded by
    ``split_seed``; None: train.seed), see deviation 7 there. ``schedule``: "per_phase" (each phase its own LR
    schedule, its PhaseSpec's: the paper's) or "global" (one schedule of train's shape, ``train.warmup``/``decay``/
    ``min_lr_ratio``/``cooldown``, over all phases, each at its own peak LR: a WSD cooldown at the end of the run),
    see deviation 8 there."""

    levels: list[LevelConfig] = field(default_factory=_paper_gpt_levels)
    optimizer_state: Literal["mapped", "reset"] = field(default="mapped",
                                                        metadata={"choices": "'mapped' or 'reset'"})
    depth_mode: Literal["copy", "identity"] = field(default="copy", metadata={"choices": "'copy' or 'identity'"})
    width_split: Literal["symmetric", "asymmetric"] = field(default="symmetric",
                                                            metadata={"choices": "'symmetric' or 'asymmetric'"})
    split_noise: float = 0.1  # the asymmetric split's noise, in units of the split weight's std
    split_seed: int | None = None  # the asymmetric split's seed (unset: train.seed)
    # added after the V-cycle rows were cached: per_phase (what they ran) is no part of a bench key
    schedule: Literal["per_phase", "global"] = field(
        default="per_phase", metadata={"choices": "'per_phase' or 'global'", **counts_if("schedule", ("global",))})

    def validate(self, where: str) -> None:
        """Choices and every phase's fields (the plan itself is checked by VCycle.plan)."""
        check_choices(self, where)
        require(math.isfinite(self.split_noise) and self.split_noise >= 0,
               f"{where}.split_noise: a finite number >= 0 (noise std in units of the split weight's std, e.g. "
               f"0.1), got {self.split_noise}")
        for i, lv in enumerate(self.levels):
            lv.down.validate(f"{where}.levels[{i}].down")
            if lv.up is not None:
                lv.up.validate(f"{where}.levels[{i}].up")


OPTIONS = VCycleConfig
