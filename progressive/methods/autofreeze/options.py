"""AutoFreeze's and AutoCache's section ``method.autofreeze:`` (read without torch: progressive/config/registry.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from progressive.config.fields import check_choices
from progressive.config.phase import require


@dataclass
class AutoCacheConfig:
    """``method.autofreeze.cache``: keep the frozen prefix's output per sample (progressive/autocache/).
    ``memory_mb`` / ``disk_mb``: byte bounds of the two tiers (MiB; the disk tier is capped at the free space less
    1 GiB, with a warning); ``disk_dir``: the disk tier's folder (default <run>/autocache, removed at the end; in
    a folder of your choice only the files the cache created are removed); ``min_frozen``: cache only once this
    many layers are frozen (the paper: 3 for ViT-B)."""

    enabled: bool = False  # cache the frozen prefix's output per sample
    memory_mb: float = 1024.0  # the memory tier's bound, MiB
    disk_mb: float = 0.0  # the disk tier's bound, MiB
    disk_dir: str | None = None
    min_frozen: int = 1


@dataclass
class AutoFreezeConfig:
    """``method.autofreeze:`` (progressive/methods/autofreeze/method.py). ``alpha`` in (0, 1): the bound's rate (1/3 in
    the paper's Table 1); ``freeze_every``: optimizer steps between decisions; ``criterion``: argmin | relative |
    bound; ``max_frozen``: at most this many layers (default all: the head still trains)."""

    alpha: float = 1.0 / 3.0  # the freezing bound's rate, in (0, 1) (1/3 in the paper's Table 1)
    freeze_every: int = 50  # optimizer steps between freeze decisions
    # argmin, relative or bound: which layers the decision freezes
    criterion: Literal["argmin", "relative", "bound"] = "argmin"
    max_frozen: int | None = None  # at most this many layers freeze (unset: all; the head still trains)
    cache: AutoCacheConfig = field(default_factory=AutoCacheConfig)

    def validate(self, where: str) -> None:
        """Raise ConfigError naming the field."""
        require(0.0 < self.alpha < 1.0, f"{where}.alpha: must be in (0, 1), got {self.alpha}")
        require(self.freeze_every >= 1,
               f"{where}.freeze_every: must be >= 1 (optimizer steps), got {self.freeze_every}")
        check_choices(self, where)
        require(self.max_frozen is None or self.max_frozen >= 0,
               f"{where}.max_frozen: must be >= 0, got {self.max_frozen}")
        c = self.cache
        for k in ("memory_mb", "disk_mb"):
            require(0 <= getattr(c, k) < math.inf,
                   f"{where}.cache.{k}: a size in MiB, >= 0 and finite, got {getattr(c, k)}")
        require(c.min_frozen >= 1, f"{where}.cache.min_frozen: must be >= 1, got {c.min_frozen}")


OPTIONS = AutoFreezeConfig
