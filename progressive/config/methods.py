"""The methods' recipe sections, ``method.<name>:``: each method's options dataclass, listed once in
``METHOD_OPTIONS``. The methods themselves (progressive/methods/) read these; reading a recipe imports none of
them (nor numpy, torch or transformers). A method added to the codebase is a folder of progressive/methods/ whose
options.py this module reads through progressive/methods/registry.py (light modules both); one defined outside the
package registers its options with ``register_method_options``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, is_dataclass
from typing import Literal

from progressive.config.fields import WSD, Decay, check_choices, check_schedule, counts_if
from progressive.config.reader import ConfigError
from progressive.methods import registry as method_folders

__all__ = ["PhaseSpec", "LevelConfig", "VCycleConfig", "ApolloConfig", "AutoCacheConfig", "AutoFreezeConfig",
           "METHOD_OPTIONS", "register_method_options", "SAMPLERS"]


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


@dataclass
class PhaseSpec:
    """How a method's config describes one phase: its length and its LR schedule.

    Length: ``steps``, or ``fraction`` of train.steps, or neither (only where the method allows an open
    phase, e.g. the V-cycle's last: it then runs until the FLOPs budget is spent). Peak LR: ``lr`` if set,
    else ``lr_scale`` * train.lr. ``warmup`` is a fraction of the phase's steps (linear from 0); then
    ``decay`` to ``min_lr_ratio`` * peak at its end: ``wsd`` / ``wsd_sqrt`` hold the peak and cool down over the
    last ``cooldown`` fraction of the phase's steps (progressive.methods.base.LRSchedule). Under the V-cycle's
    ``schedule: global`` a phase keeps only its length and peak; train's schedule spans the run.
    """

    steps: int | None = None
    fraction: float | None = None
    lr: float | None = None
    lr_scale: float = 1.0
    warmup: float = 0.0
    decay: Decay = "linear"
    min_lr_ratio: float = 0.0
    cooldown: float = field(default=0.2, metadata=counts_if("decay", WSD))  # a WSD decay's; no effect otherwise

    def validate(self, where: str) -> None:
        """Raise ConfigError naming ``where.<field>`` for a value that cannot work."""
        _check(self.steps is None or self.fraction is None, f"{where}: set steps or fraction, not both")
        _check(self.steps is None or self.steps >= 1, f"{where}.steps: must be >= 1, got {self.steps}")
        _check(self.fraction is None or 0 < self.fraction <= 1,
               f"{where}.fraction: must be in (0, 1], got {self.fraction}")
        _check(self.lr is None or self.lr > 0, f"{where}.lr: must be > 0, got {self.lr}")
        _check(self.lr_scale > 0, f"{where}.lr_scale: must be > 0, got {self.lr_scale}")
        check_schedule(self.warmup, self.decay, self.min_lr_ratio, where, self.cooldown)


# ------------------------------------------------------------------------------------- method.vcycle


@dataclass
class LevelConfig:
    """One V-cycle level. ``width``/``depth``/``pairing``/``depth_pairing`` say how this level is coalesced
    from the level above (level 0 is the full model: 1/1). ``down``: trained before coalescing to the next
    level (the coarsest level's only phase). ``up``: trained after de-coalescing back into this level,
    after interpolating with ``alpha`` (weight of the de-coalesced model); unused on the coarsest level."""

    width: int = 1
    depth: int = 1
    pairing: str = "stride"
    depth_pairing: str = "adjacent"
    alpha: float | None = None
    down: PhaseSpec = field(default_factory=PhaseSpec)
    up: PhaseSpec | None = None


def _paper_gpt_levels() -> list[LevelConfig]:
    return [
        LevelConfig(alpha=0.25, down=PhaseSpec(fraction=0.05, warmup=1.0), up=PhaseSpec(fraction=0.5)),
        LevelConfig(width=2, depth=2, down=PhaseSpec(fraction=0.5, lr_scale=4.0)),
    ]


@dataclass
class VCycleConfig:
    """``method.vcycle:``, a K-level V-cycle (progressive/methods/vcycle.py). ``optimizer_state``: "mapped" (Adam
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
    split_noise: float = 0.1
    split_seed: int | None = None
    # added after the V-cycle rows were cached: per_phase (what they ran) is no part of a bench key
    schedule: Literal["per_phase", "global"] = field(
        default="per_phase", metadata={"choices": "'per_phase' or 'global'", **counts_if("schedule", ("global",))})

    def validate(self, where: str) -> None:
        """Choices and every phase's fields (the plan itself is checked by VCycle.plan)."""
        check_choices(self, where)
        _check(math.isfinite(self.split_noise) and self.split_noise >= 0,
               f"{where}.split_noise: a finite number >= 0 (noise std in units of the split weight's std, e.g. "
               f"0.1), got {self.split_noise}")
        for i, lv in enumerate(self.levels):
            lv.down.validate(f"{where}.levels[{i}].down")
            if lv.up is not None:
                lv.up.validate(f"{where}.levels[{i}].up")


# ------------------------------------------------------------------------------------- method.apollo

Sampler = Literal["lvps", "uniform", "sigmoid", "constant_high", "none"]
SAMPLERS: tuple[str, ...] = Sampler.__args__  # type: ignore[attr-defined]


@dataclass
class ApolloConfig:
    """``method.apollo:`` (progressive/methods/apollo.py). ``layers``: distinct layers per stage, increasing, the
    last = model.num_layers. ``boundaries``: where stages 1.. start, as increasing fractions of train.steps in
    (0, 1) (one fewer than stages; the last stage runs to the end of the FLOPs budget). ``sampler``: lvps,
    uniform, sigmoid, constant_high or none. ``map``: interpolation (Apollo) or stack (StackBERT, G_stack).
    ``optimizer_state``: mapped, first_copy, authors or reset. ``schedule``: global (one LR schedule over all
    stages) or per_stage."""

    layers: list[int] = field(default_factory=lambda: [1, 3, 6, 12])
    boundaries: list[float] = field(default_factory=lambda: [0.05, 0.10, 0.25])
    sampler: Sampler = "lvps"
    map: Literal["interpolation", "stack"] = "interpolation"
    # the best of the three on the frontier's validation (docs/results/frontier.md)
    optimizer_state: Literal["mapped", "first_copy", "authors", "reset"] = "authors"
    schedule: Literal["global", "per_stage"] = field(default="global",
                                                     metadata={"choices": "'global' or 'per_stage'"})

    def validate(self, where: str) -> None:
        """Raise ConfigError naming ``where.<field>`` (the model's depth is checked by Apollo.plan)."""
        layers, bounds = self.layers, self.boundaries
        _check(len(layers) >= 1, f"{where}.layers: give at least one stage, e.g. [1, 3, 6, 12]")
        _check(all(n >= 1 for n in layers), f"{where}.layers: every stage needs >= 1 layer, got {layers}")
        _check(all(a < b for a, b in zip(layers, layers[1:])),
               f"{where}.layers: stage layer counts must increase, got {layers}")
        _check(len(bounds) == len(layers) - 1,
               f"{where}.boundaries: {len(layers)} stages need {len(layers) - 1} boundaries (where stages 1.. "
               f"start, as fractions of train.steps), got {bounds}")
        _check(all(0 < b < 1 for b in bounds),
               f"{where}.boundaries: fractions of the budget strictly between 0 and 1, got {bounds}")
        _check(all(a < b for a, b in zip(bounds, bounds[1:])), f"{where}.boundaries: must increase, got {bounds}")
        check_choices(self, where)


# --------------------------------------------------------------------------------- method.autofreeze


@dataclass
class AutoCacheConfig:
    """``method.autofreeze.cache``: keep the frozen prefix's output per sample (progressive/autocache/).
    ``memory_mb`` / ``disk_mb``: byte bounds of the two tiers (MiB; the disk tier is capped at the free space less
    1 GiB, with a warning); ``disk_dir``: the disk tier's folder (default <run>/autocache, removed at the end; in
    a folder of your choice only the files the cache created are removed); ``min_frozen``: cache only once this
    many layers are frozen (the paper: 3 for ViT-B)."""

    enabled: bool = False
    memory_mb: float = 1024.0
    disk_mb: float = 0.0
    disk_dir: str | None = None
    min_frozen: int = 1


@dataclass
class AutoFreezeConfig:
    """``method.autofreeze:`` (progressive/methods/autofreeze.py). ``alpha`` in (0, 1): the bound's rate (1/3 in
    the paper's Table 1); ``freeze_every``: optimizer steps between decisions; ``criterion``: argmin | relative |
    bound; ``max_frozen``: at most this many layers (default all: the head still trains)."""

    alpha: float = 1.0 / 3.0
    freeze_every: int = 50
    criterion: Literal["argmin", "relative", "bound"] = "argmin"
    max_frozen: int | None = None
    cache: AutoCacheConfig = field(default_factory=AutoCacheConfig)

    def validate(self, where: str) -> None:
        """Raise ConfigError naming the field."""
        _check(0.0 < self.alpha < 1.0, f"{where}.alpha: must be in (0, 1), got {self.alpha}")
        _check(self.freeze_every >= 1,
               f"{where}.freeze_every: must be >= 1 (optimizer steps), got {self.freeze_every}")
        check_choices(self, where)
        _check(self.max_frozen is None or self.max_frozen >= 0,
               f"{where}.max_frozen: must be >= 0, got {self.max_frozen}")
        c = self.cache
        for k in ("memory_mb", "disk_mb"):
            _check(0 <= getattr(c, k) < math.inf,
                   f"{where}.cache.{k}: a size in MiB, >= 0 and finite, got {getattr(c, k)}")
        _check(c.min_frozen >= 1, f"{where}.cache.min_frozen: must be >= 1, got {c.min_frozen}")


# ------------------------------------------------------------------------------------------ the list

# method name (``method.name: <name>``) -> its options dataclass, the recipe section ``method.<name>:``: the methods
# written before the folders, then every method folder's (progressive/methods/registry.py: its options.py, a module
# as light as this one); progressive.methods checks that each method it lists holds the same class ("baseline" has
# no options)
METHOD_OPTIONS: dict[str, type] = {"vcycle": VCycleConfig, "apollo": ApolloConfig, "autofreeze": AutoFreezeConfig,
                                   **method_folders.options()}


def register_method_options(name: str, options: type) -> None:
    """Make ``method.<name>:`` a recipe section parsed into the dataclass ``options``, for a method defined
    outside progressive/methods/ (progressive.methods.register_method calls this).

    Raises:
        TypeError: ``options`` is not a dataclass.
    """
    if not is_dataclass(options):
        raise TypeError(f"options of method {name!r} must be a dataclass, got {options!r}")
    METHOD_OPTIONS[name] = options

