"""Sharded checkpoints (FSDP2): every process writes its shards of the weights and AdamW moments with
torch.distributed.checkpoint, and any number of processes reads them back (DCP re-shards on load).

The storage is DCP's safetensors format (``HuggingFaceStorageWriter(save_distributed=True)``: one file per
process, ``shard-<rank>-model-00001-of-00001.safetensors``, each shard's offsets in the file's header), so
loading unpickles nothing, like the rest of a checkpoint (progressive.run.checkpoint). The files sit in the
checkpoint's ``sharded/`` folder and are covered by its sha256 manifest. Non-tensor optimizer settings
(param groups) are not stored: they are rebuilt from the config, as an unsharded resume rebuilds them,
and the scheduler part sets the learning rate.

Tensors are named ``model.<name>`` and ``optimizer.<name>.<exp_avg|exp_avg_sq|step>``; a weight tied to
another (GPT-2's head and token embeddings) is stored once, under its first name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SHARDED = "sharded"

__all__ = ["SHARDED", "save_shards", "load_shards"]


def _tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict, dict]:
    """(flat name -> tensor, model state dict, optimizer state dict), all sharded as the model is. Getting the
    optimizer's state dict initialises AdamW state it does not have yet (torch's own zero-LR step)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), name)
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if first[id(p)] != name}
    flat = {f"model.{name}": t for name, t in msd.items() if name not in tied}  # a tied weight: once
    for name, st in osd["state"].items():
        for key, t in st.items():
            if torch.is_tensor(t):
                flat[f"optimizer.{name}.{key}"] = t
    return flat, msd, osd


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> bool:
    """Every process: write this process's shards into ``folder`` (created); returns True when every weight
    of every process is finite (agreed by all processes)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.tensor import DTensor

    folder.mkdir(parents=True, exist_ok=True)
    flat, msd, _ = _tensors(model, optimizer)
    finite = all(bool(torch.isfinite(t.to_local() if isinstance(t, DTensor) else t).all())
                 for t in msd.values() if t.is_floating_point())
    dcp.save(flat, storage_writer=HuggingFaceStorageWriter(str(folder), save_distributed=True))
    flag = torch.tensor([1.0 if finite else 0.0], device=_device(model))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item() == 1.0)


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Every process: read the shards in ``folder`` into the sharded ``model`` and ``optimizer`` (written by
    any number of processes)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    flat, msd, osd = _tensors(model, optimizer)
    dcp.load(flat, storage_reader=HuggingFaceStorageReader(str(folder)))
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)


def _device(model: torch.nn.Module) -> torch.device:
    import torch.distributed as dist

    return torch.device("cpu") if dist.get_backend() == "gloo" else next(model.parameters()).device
