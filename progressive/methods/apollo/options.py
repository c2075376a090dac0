"""Apollo's (and the stacking recipes') section ``method.apollo:`` (read without torch:
progressive/config/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from progressive.config.fields import check_choices
from progressive.config.phase import require

Sampler = Literal["lvps", "uniform", "sigmoid", "constant_high", "none"]
SAMPLERS: tuple[str, ...] = Sampler.__args__  # type: ignore[attr-defined]


@dataclass
class ApolloConfig:
    """``method.apollo:`` (progressive/methods/apollo/method.py). ``layers``: distinct layers per stage, increasing, the
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
        require(len(layers) >= 1, f"{where}.layers: give at least one stage, e.g. [1, 3, 6, 12]")
        require(all(n >= 1 for n in layers), f"{where}.layers: every stage needs >= 1 layer, got {layers}")
        require(all(a < b for a, b in zip(layers, layers[1:])),
               f"{where}.layers: stage layer counts must increase, got {layers}")
        require(len(bounds) == len(layers) - 1,
               f"{where}.boundaries: {len(layers)} stages need {len(layers) - 1} boundaries (where stages 1.. "
               f"start, as fractions of train.steps), got {bounds}")
        require(all(0 < b < 1 for b in bounds),
               f"{where}.boundaries: fractions of the budget strictly between 0 and 1, got {bounds}")
        require(all(a < b for a, b in zip(bounds, bounds[1:])), f"{where}.boundaries: must increase, got {bounds}")
        check_choices(self, where)


OPTIONS = ApolloConfig
