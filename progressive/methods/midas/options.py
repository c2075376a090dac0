"""MIDAS's recipe section ``method.midas:``, its bench variant and its results-page line (read without torch:
progressive/config/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from progressive.config.fields import check_choices
from progressive.config.reader import ConfigError


@dataclass
class MidasConfig:
    """``block``: layers per block, the unit a growth copies (it divides model.num_layers); ``start``: blocks in
    the first stage; ``alpha``: PROP-alpha, stage k's share of train.steps proportional to (k + 1)^alpha;
    ``optimizer_state``: what the copied block's AdamW moments become (``mapped``: both copies keep them; ``reset``: a
    fresh optimizer at every growth); ``schedule``: one LR schedule over all stages (``global``) or one per stage."""

    block: int = 1
    start: int = 1
    alpha: float = 1.0
    optimizer_state: Literal["mapped", "reset"] = "mapped"
    schedule: Literal["global", "per_stage"] = "global"

    def validate(self, where: str = "method.midas") -> None:
        """Raise ConfigError naming the field for a value that cannot work (the model's depth is checked by the
        plan, which knows it)."""
        for name in ("block", "start"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise ConfigError(f"{where}.{name}: a whole number >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.alpha <= 8:
            raise ConfigError(f"{where}.alpha: PROP-alpha's exponent, in [0, 8], got {self.alpha}")
        check_choices(self, where)


OPTIONS = MidasConfig


def _midas(layers: int) -> dict[str, Any]:
    """One layer a block, from one layer to the target's ``layers`` one at a time, PROP-1 (1/10, 2/10, 3/10 and the
    rest of a 4-layer target's budget), moments mapped, one LR schedule."""
    return {"method.name": "midas", "method.midas": {"block": 1, "start": 1, "alpha": 1.0,
                                                     "optimizer_state": "mapped", "schedule": "global"}}


VARIANTS = {"midas": _midas}  # the bench's variants (bench/lib/variants.py): variant -> layers -> overrides
GROUP = ("MIDAS (middle-block stacking)", [("midas", "midas")])  # its line on the results page
