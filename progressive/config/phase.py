"""How a method's recipe section describes one phase (``PhaseSpec``), and the one-line check the sections share:
a light module that the methods' options (progressive/methods/<name>/options.py) and the recipes' reader import."""

from __future__ import annotations

from dataclasses import dataclass, field

from progressive.config.fields import WSD, Decay, check_schedule, counts_if
from progressive.config.reader import ConfigError

__all__ = ["PhaseSpec", "require"]


def require(ok: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless ``ok``: a section's validate(), one condition a line."""
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

    steps: int | None = None  # the phase's length in optimizer steps (or fraction)
    fraction: float | None = None  # the phase's length, a fraction of train.steps
    lr: float | None = None  # the phase's peak LR (unset: lr_scale x train.lr)
    lr_scale: float = 1.0  # the peak LR as a multiple of train.lr
    warmup: float = 0.0  # the linear warm-up, a fraction of the phase's steps
    decay: Decay = "linear"  # the LR's shape after the warm-up: linear, cosine, constant, wsd or wsd_sqrt
    min_lr_ratio: float = 0.0  # the LR at the phase's end, a fraction of its peak
    cooldown: float = field(default=0.2, metadata=counts_if("decay", WSD))  # a WSD decay's; no effect otherwise

    def validate(self, where: str) -> None:
        """Raise ConfigError naming ``where.<field>`` for a value that cannot work."""
        require(self.steps is None or self.fraction is None, f"{where}: set steps or fraction, not both")
        require(self.steps is None or self.steps >= 1, f"{where}.steps: must be >= 1, got {self.steps}")
        require(self.fraction is None or 0 < self.fraction <= 1,
               f"{where}.fraction: must be in (0, 1], got {self.fraction}")
        require(self.lr is None or self.lr > 0, f"{where}.lr: must be > 0, got {self.lr}")
        require(self.lr_scale > 0, f"{where}.lr_scale: must be > 0, got {self.lr_scale}")
        check_schedule(self.warmup, self.decay, self.min_lr_ratio, where, self.cooldown)
