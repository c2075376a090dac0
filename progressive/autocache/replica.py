"""A plain copy of a sharded model for AutoCache's frozen prefix (FSDP2).

AutoCache computes the frozen prefix only for the samples its process's cache misses, so processes run the
frozen blocks different numbers of times. Under FSDP2 every block's forward all-gathers its shards, a
collective that every process must join; the misses are therefore computed on a plain copy of the model,
made once per frozen depth (the frozen weights do not change after that), and the sharded model runs from
the first trained layer on every process alike. The copy costs one unsharded model per process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # loaded when a prefix is frozen: AutoFreeze's recipe section is read without it (--list)
    import torch

__all__ = ["PrefixReplica"]


class PrefixReplica:
    """Holds the plain copy for one frozen depth and makes a new one when the depth changes."""

    def __init__(self) -> None:
        self.frozen: int | None = None
        self.model: torch.nn.Module | None = None

    def model_for(self, model: torch.nn.Module, frozen: int,
                  build: Callable[[Any], torch.nn.Module]) -> torch.nn.Module:
        """``model`` when it is not sharded; else the plain copy for ``frozen`` layers (``build(config)`` makes
        the empty model). Making it is a collective: every process calls this at the same step (the frozen
        depth changes at the same step everywhere)."""
        import torch
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(model, FSDPModule):
            return model
        if self.model is None or self.frozen != frozen:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            self.model = None
            weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
            with torch.random.fork_rng(devices=[]):  # its initialisation must not move the run's random stream
                copy = build(model.config).to(next(model.parameters()).device)
            copy.load_state_dict(weights)
            copy.requires_grad_(False)
            copy.train(model.training)  # dropout as the sharded model has it: the same random draws
            self.frozen, self.model = frozen, copy
        return self.model
