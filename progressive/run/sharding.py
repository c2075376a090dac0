"""How a run holds its model, chosen once (``choose``): ``Replicated`` (the whole model on every process:
one process, or DDP) or ``Sharded`` (FSDP2). The trainer asks its choice, never ``train.fsdp`` again: where
the model goes, whether Accelerate wraps it, how many evaluation rows a process runs, the whole model for a
size change and for the final checkpoint, and what a checkpoint holds.

FSDP2 is the one seam where a model is sharded, gathered whole for a size change, and re-sharded.

Sharding is ``torch.distributed.fsdp.fully_shard`` applied the way Accelerate's FSDP2 plugin applies it:
each transformer block is its own group, then the root (embeddings, final norm, head). The trainer calls
``shard`` itself, on CPU processes (``train.fsdp: true``, gloo) and on GPUs alike, and then hands the
sharded model to ``Accelerator.prepare`` only where Accelerate runs FSDP2 (``accelerate launch
--config_file launch/accelerate/fsdp.yaml``), which leaves a model that is already an FSDPModule as it is
(``fsdp2_prepare_model``) and takes its settings from the plugin here (mixed-precision policy, reshard
after forward, CPU offload). So the path the tests run on CPU is the path production runs on GPUs.

Gradients are reduced (summed over processes) in fp32 on both paths, as torchtitan does
(``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``): Accelerate's policy for a bf16 launch
gathers parameters in bf16 *and* reduces in bf16, so its ``reduce_dtype`` is replaced by
``train.fsdp_reduce_dtype`` (fp32 unless a recipe asks for bf16, which halves the traffic and rounds the sum).

Size changes need whole tensors (the operators split, merge and interpolate layers): ``gather`` builds a
plain copy of the model and of its AdamW state from ``torch.distributed.checkpoint.state_dict`` (full
state dicts: every rank receives every tensor), the method changes that copy exactly as it would under
DDP, and the trainer shards the result again (``distribute_named_state`` re-shards the optimizer state).
Peak memory at a change: one full copy of the model and its two AdamW moments per process (4x the
parameter bytes in fp32) on top of the shards. A freeze (AutoFreeze) needs no gather: it only turns
``requires_grad`` off on sharded parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from operators import load_named_optimizer_state
from operators.freeze import layer_list
from progressive.config import ConfigError, RunConfig
from progressive.run.shards import SHARDED, load_shards, save_shards

REDUCE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # train.fsdp_reduce_dtype -> the gradients' sum

__all__ = ["Replicated", "Sharded", "choose", "wants_fsdp", "check_fsdp", "take_over_wrapping", "ensure_group",
           "shard", "is_sharded", "gather", "unshard_to_main", "distribute_named_state", "no_sync", "full_state_dict"]


def wants_fsdp(cfg: RunConfig, acc: Accelerator) -> bool:
    """True when this run shards its model: ``train.fsdp``, or Accelerate was launched with FSDP2."""
    return bool(cfg.train.fsdp) or getattr(acc, "is_fsdp2", False)


def check_fsdp(cfg: RunConfig, acc: Accelerator) -> None:
    """Refuse what the sharded path does not do, in one line each, before any work.

    Raises:
        ConfigError: FSDP version 1, or under FSDP2: pipeline parallelism.
    """
    from accelerate.utils import DistributedType

    if acc.distributed_type == DistributedType.FSDP and not acc.is_fsdp2:
        raise ConfigError("FSDP version 1 (fsdp_version: 1 in the accelerate config) is not supported: level "
                          "changes gather and re-shard through FSDP2's fully_shard; set fsdp_version: 2 "
                          "(launch/accelerate/fsdp.yaml)")
    if not wants_fsdp(cfg, acc):
        return
    if cfg.parallel.pipeline != "none":
        raise ConfigError(f"parallel.pipeline: {cfg.parallel.pipeline!r} runs its own distributed engine (stages "
                          "x replicas) and cannot be combined with FSDP2; use DDP for pipeline runs (set "
                          "train.fsdp: false, or launch with launch/accelerate/8gpu.yaml)")


def take_over_wrapping(acc: Accelerator) -> None:
    """Under Accelerate's FSDP2 plugin (``accelerate launch --config_file launch/accelerate/fsdp.yaml``), tell
    the plugin that the blocks are sharded here (``shard``), so one config file serves every family.

    Accelerate's ``_prepare_fsdp2`` resolves the plugin's wrap policy (``fsdp_transformer_layer_cls_to_wrap``,
    or the model's ``_no_split_modules``) by looking the block's class up by name *before* it notices that
    the model is already an FSDPModule; ``fully_shard`` has by then renamed each block's class
    (``GPT2Block`` -> ``FSDPGPT2Block``), so the look-up fails at start ("Could not find the transformer
    layer class GPT2Block in the model"; from Accelerate 1.16 only where the config file names the class, as it
    drops the ``_no_split_modules`` names it cannot find). The policy has nothing left to decide here: it is cleared.

    Raises:
        ConfigError: the plugin asks for activation checkpointing (Accelerate would wrap blocks after they were
            sharded; not supported by this trainer).
    """
    plugin = getattr(acc.state, "fsdp_plugin", None)
    if plugin is None or not getattr(acc, "is_fsdp2", False):
        return
    if plugin.activation_checkpointing:
        raise ConfigError("fsdp_activation_checkpointing: activation checkpointing is not supported with this "
                          "trainer's FSDP2 path (the blocks are sharded before Accelerate sees the model); set it to "
                          "false in the accelerate config")
    plugin.auto_wrap_policy = None
    plugin.transformer_cls_names_to_wrap = None


def ensure_group(acc: Accelerator) -> None:
    """``fully_shard`` needs a process group: a run of one process started with plain ``python`` (e.g. resuming
    a sharded checkpoint on one process) gets a group of one, on the run's device."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if acc.device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                world_size=1)


def is_sharded(model: torch.nn.Module) -> bool:
    """True when ``model`` (the root) is an FSDP2 module."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _settings(acc: Accelerator, reduce_dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """fully_shard's keyword arguments: the Accelerate FSDP2 plugin's where there is one, else its defaults
    (reshard after forward, no mixed-precision policy: fp32 on CPU, no offload). Gradients are reduced in
    ``reduce_dtype`` either way (``train.fsdp_reduce_dtype``, fp32 unless asked, as torchtitan does; the
    plugin of a bf16 launch says bf16; the module's docstring)."""

    from torch.distributed.fsdp import MixedPrecisionPolicy

    plugin = getattr(acc.state, "fsdp_plugin", None)
    policy = getattr(plugin, "mixed_precision_policy", None) or MixedPrecisionPolicy()
    out: dict[str, Any] = {"reshard_after_forward": plugin.reshard_after_forward if plugin is not None else True,
                           "mp_policy": replace(policy, reduce_dtype=reduce_dtype)}
    if plugin is not None and plugin.cpu_offload is not None and not isinstance(plugin.cpu_offload, bool):
        out["offload_policy"] = plugin.cpu_offload
    return out


def shard(model: torch.nn.Module, acc: Accelerator, reduce_dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Apply FSDP2 in place to a plain model on ``acc.device``: one group per transformer block, then the
    root; returns the model (now an FSDPModule). Blocks that appear several times in the layer list (Apollo's
    shared depth outside its steps never does) are sharded once. Gradients are reduced in ``reduce_dtype``."""
    from torch.distributed.fsdp import fully_shard

    if is_sharded(model):
        return model
    kw = _settings(acc, reduce_dtype)
    _, layers = layer_list(model)
    seen: set[int] = set()
    for block in layers:
        if id(block) not in seen:
            seen.add(id(block))
            fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` whole, on every process (a collective when the model is sharded)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def unshard_to_main(model: torch.nn.Module, blank: Any) -> torch.nn.Module | None:
    """Every process: gather a sharded ``model``'s weights to the main process (on CPU); returns a plain
    model holding them there (``blank()`` builds it) and None elsewhere."""
    import torch.distributed as dist

    weights = full_state_dict(model)
    if dist.get_rank() != 0:
        return None
    plain = blank()
    plain.load_state_dict(weights)
    return plain


def gather(model: torch.nn.Module, optimizer: torch.optim.Optimizer, build: Any,
           make_optimizer: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A plain (unsharded) copy of a sharded ``model`` and of ``optimizer``'s state, on every process.

    Args:
        model: the sharded model (an FSDPModule).
        optimizer: its optimizer (over DTensor parameters).
        build: () -> a fresh plain model of the same config (its weights are overwritten).
        make_optimizer: (plain model) -> a fresh optimizer for it.

    Returns:
        (plain model holding the full weights, optimizer holding the full AdamW state by parameter).
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    weights = full_state_dict(model)
    full = StateDictOptions(full_state_dict=True)
    opt_state = get_optimizer_state_dict(model, optimizer, options=full)["state"]  # {param name: {...}}
    plain = build()
    plain.load_state_dict(weights)
    grads = {n: q.requires_grad for n, q in model.named_parameters()}
    for name, p in plain.named_parameters():
        p.requires_grad_(grads.get(name, True))
    plain_opt = make_optimizer(plain)
    load_named_optimizer_state(plain, plain_opt, opt_state)
    return plain, plain_opt


def distribute_named_state(model: torch.nn.Module, named: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Name-keyed AdamW state whose whole moments become shards placed like their (DTensor) parameters;
    moments already sharded and scalars (the step count) pass unchanged; each entry's keys sorted. Every
    process holds the same whole moments (``gather`` gave them all every tensor), so each cuts its own
    shard: no communication."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    out: dict[str, dict[str, Any]] = {}
    for name, st in named.items():
        p = params.get(name)
        # one key order on every process: gathering the state later walks each entry in its order, and a
        # method's dict built from a set (string hashes differ between processes) would pair the wrong moments
        st = {k: st[k] for k in sorted(st)}
        out[name] = st if not isinstance(p, DTensor) else {
            k: (_shard_like(v, p) if torch.is_tensor(v) and v.dim() > 0 and not isinstance(v, DTensor) else v)
            for k, v in st.items()}
    return out


def _shard_like(whole: torch.Tensor, param: Any) -> Any:
    """This process's shard of ``whole``, as a DTensor placed like ``param`` (FSDP2: Shard(0), torch.chunk's
    split, so the last processes may hold fewer rows or none)."""
    from torch.distributed.tensor import DTensor, Shard

    if tuple(whole.shape) != tuple(param.shape):
        raise ValueError(f"optimizer state of shape {tuple(whole.shape)} for a parameter of shape {tuple(param.shape)}")
    mesh, placements = param.device_mesh, param.placements
    if mesh.ndim != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(whole.to(param.device).contiguous(), mesh, placements)
    chunks = torch.chunk(whole, mesh.size(), dim=0)
    rank = mesh.get_local_rank()
    mine = chunks[rank] if rank < len(chunks) else whole.new_empty((0, *whole.shape[1:]))
    local = param.to_local()
    mine = mine.to(device=local.device, dtype=whole.dtype).clone()  # its own memory, not a view of the whole
    if mine.shape != local.shape:
        raise ValueError(f"a shard of shape {tuple(mine.shape)} for a parameter shard of shape {tuple(local.shape)}")
    return DTensor.from_local(mine, mesh, placements, run_check=False, shape=param.shape, stride=param.stride())


@contextlib.contextmanager
def no_sync(acc: Accelerator, model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients without reducing them (every micro-batch but the last): FSDP2's switch for a
    sharded model, Accelerate's ``no_sync`` (DDP) otherwise."""
    if is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with acc.no_sync(model):
            yield


class Replicated:
    """Every process holds the whole model: one process, or DDP through Accelerate's ``prepare``."""

    sharded = False

    def __init__(self, acc: Accelerator):
        self.acc = acc

    def place(self, model: torch.nn.Module, named_state: dict | None) -> dict | None:
        """Move ``model`` to the device; returns the name-keyed optimizer state it will load, unchanged."""
        model.to(self.acc.device)
        return named_state

    @property
    def prepare_model(self) -> bool:
        """Whether Accelerate's ``prepare`` wraps the model (DDP): always, here."""
        return True

    def eval_count(self, n: int, mine: int) -> int:
        """Evaluation rows this process runs when ``mine`` of the ``n`` are its own: its own."""
        return mine

    def whole(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, blank: Any,
              make_optimizer: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model and optimizer the operators change at a size change: these ones."""
        return model, optimizer

    def to_main(self, model: torch.nn.Module, blank: Any) -> torch.nn.Module:
        """The whole model on the main process, for the final checkpoint: it is already there."""
        return model

    def main_parts(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, bool]:
        """The checkpoint parts the main process writes (weights and AdamW state) and whether every weight is
        finite."""
        weights = model.state_dict()
        finite = all(bool(torch.isfinite(w).all()) for w in weights.values() if w.is_floating_point())
        return {"model": weights, "optimizer": optimizer.state_dict()}, finite

    def stage(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Any) -> bool:
        """Write this process's shards into a checkpoint's staging ``folder``: none here."""
        return True

    def load_whole(self, model: torch.nn.Module, parts: dict[str, Any]) -> None:
        """Load a checkpoint's weights into a freshly built ``model`` (before it is placed)."""
        model.load_state_dict(parts["model"])

    def load_shards(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, checkpoint: Any) -> None:
        """Load this process's shards once the model is placed: none here."""


class Sharded(Replicated):
    """FSDP2: each process holds a shard of every block (``shard``); gathered whole for a size change and for
    the final checkpoint; checkpointed as per-process shards (progressive/run/shards.py) that any number of processes
    reads back."""

    sharded = True

    def __init__(self, acc: Accelerator, reduce_dtype: torch.dtype = torch.float32):
        super().__init__(acc)
        self.reduce_dtype = reduce_dtype  # of the gradients' sum over processes (train.fsdp_reduce_dtype)
        ensure_group(acc)

    def place(self, model: torch.nn.Module, named_state: dict | None) -> dict | None:
        model.to(self.acc.device)
        shard(model, self.acc, self.reduce_dtype)
        return named_state and distribute_named_state(model, named_state)

    @property
    def prepare_model(self) -> bool:
        """A sharded model goes to Accelerate only where Accelerate runs FSDP2 (it keeps it as it is)."""
        return bool(getattr(self.acc, "is_fsdp2", False))

    def eval_count(self, n: int, mine: int) -> int:
        """A sharded model gathers its weights in every forward: every process runs as many rows as the one
        with the most (an empty share runs one row and counts nothing)."""
        return -(-n // self.acc.num_processes)

    def whole(self, model, optimizer, blank, make_optimizer):
        return gather(model, optimizer, blank, make_optimizer)

    def to_main(self, model, blank):
        return unshard_to_main(model, blank)

    def main_parts(self, model, optimizer):
        return {}, True  # the weights and moments are in the staged shards

    def stage(self, model, optimizer, folder):
        return save_shards(model, optimizer, folder / SHARDED)

    def load_whole(self, model, parts):
        pass

    def load_shards(self, model, optimizer, checkpoint):
        load_shards(model, optimizer, Path(checkpoint) / SHARDED)


def choose(cfg: RunConfig, acc: Accelerator) -> Replicated:
    """How this run holds its model, decided once: ``Sharded`` under ``train.fsdp`` or Accelerate's FSDP2
    launcher, else ``Replicated``; what neither does is refused first (``check_fsdp``)."""
    check_fsdp(cfg, acc)
    take_over_wrapping(acc)
    if not wants_fsdp(cfg, acc):
        return Replicated(acc)
    return Sharded(acc, REDUCE_DTYPES[cfg.train.fsdp_reduce_dtype])
