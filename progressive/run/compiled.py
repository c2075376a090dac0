"""torch.compile for training: on by default where a GPU trains, each model shape compiled once per process.

``train.compile``: true, false, or "auto" (the default): compiled where the run trains on a GPU (on GPT-2-124M an
H200 ran 1.95x faster compiled than eager), eager on a CPU (compiling the small models a CPU trains costs more
than it saves) and in the elastic pipeline (its stages are rebuilt at every change).

How a run compiles (``compile_model``): one process holds several models in turn (the levels of a V-cycle,
AutoFreeze's freeze states, the methods of a ``--compare``), each traced by dynamo from the same code, so
``settle_dynamo`` sets two of dynamo's process-wide settings once:

- ``recompile_limit`` raised from 8 to ``RECOMPILE_LIMIT``: past the limit dynamo runs every further variant of
  that code eagerly, without an error; a run whose variants reach it gets one warning line (``_LimitWarning``);
- ``automatic_dynamic_shapes`` off: by default the second shape dynamo sees makes it compile a graph with
  symbolic sizes, slower than a graph per shape; a V-cycle has two or three shapes, each compiled once, and a
  level that comes back (the full model after the coarse one) finds its graph compiled (dynamo's guards are on
  shapes and dtypes, not on which module object runs).

Under FSDP2 each transformer block is compiled before it is sharded (``compile_blocks``, as torchtitan does):
FSDP2's hooks run between the blocks, outside the compiled code. Elsewhere the whole model is compiled (the
loss included: the chunked loss's element-wise work fuses into few kernels).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch

from operators.freeze import layer_list
from progressive.config import RunConfig

__all__ = ["compiles", "settle_dynamo", "compile_model", "compile_blocks", "graphs_compiled", "RECOMPILE_LIMIT"]

RECOMPILE_LIMIT = 64  # compiled variants of one code object per process: levels x freeze states x methods of a run
BACKEND = "inductor"  # torch.compile's backend for training (tests use "eager": dynamo's tracing, no kernels)


def compiles(cfg: RunConfig) -> bool:
    """Whether ``cfg`` trains compiled: ``train.compile`` true, or "auto" on a GPU outside the elastic pipeline."""
    t = cfg.train
    if t.compile == "auto":
        return not t.cpu and torch.cuda.is_available() and cfg.parallel.pipeline == "none"
    return bool(t.compile)


class _LimitWarning(logging.Filter):
    """Turns dynamo's multi-line notice that it hit a recompile limit into one line of ours, once a process."""

    def __init__(self, say: Any) -> None:
        super().__init__()
        self.say, self.said = say, False

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if not message.startswith("torch._dynamo hit config."):
            return True
        if not self.said:
            self.said = True
            limit = record.args[0] if isinstance(record.args, tuple) and record.args else "recompile_limit"
            self.say(f"warning: torch.compile hit torch._dynamo.config.{limit} ({RECOMPILE_LIMIT} here): the model "
                     "variants compiled after it (more levels, freeze states or methods in this process) run eagerly, "
                     "slower; run fewer variants per process, or raise growtrain's RECOMPILE_LIMIT")
        return False


_settled: list[_LimitWarning] = []


def settle_dynamo(say: Any = None) -> None:
    """Set dynamo's process-wide settings for training several models in turn (module docstring); idempotent."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, RECOMPILE_LIMIT)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)
    dynamo.automatic_dynamic_shapes = False
    if not _settled:
        warn = _LimitWarning(say or (lambda msg: print(msg, file=sys.stderr, flush=True)))
        logging.getLogger("torch._dynamo.convert_frame").addFilter(warn)
        _settled.append(warn)


def compile_model(model: torch.nn.Module, backend: str | None = None) -> torch.nn.Module:
    """``model`` (possibly DDP-wrapped) compiled whole (``backend``: default ``BACKEND``), after ``settle_dynamo``."""
    settle_dynamo()
    return torch.compile(model, backend=backend or BACKEND)


def compile_blocks(model: torch.nn.Module, backend: str | None = None) -> torch.nn.Module:
    """Compile each transformer block of ``model`` in place (``nn.Module.compile``: names and parameters stay
    the module's), before FSDP2 shards them; returns ``model``. A block listed twice is compiled once."""

    settle_dynamo()
    seen: set[int] = set()
    for block in layer_list(model)[1]:
        if id(block) not in seen:
            seen.add(id(block))
            block.compile(backend=backend or BACKEND)
    return model


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far (a step that raised it compiled)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
