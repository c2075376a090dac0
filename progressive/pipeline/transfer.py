"""Move named tensors (weights, AdamW moments) between ranks by fully qualified name, whatever the layouts.

AutoDP's state move (``move_state``): when the layout changes, every tensor a rank will need and does not hold has a
source rank that holds it (the first replica of the stage that owned it). ``broadcast_by_name`` sends, source by
source, one metadata message (names, shapes, dtypes) and one flat buffer per dtype over the world group; each rank
keeps the names it wants and drops the rest at once, so at most one source's tensors are extra at any time. Nothing
goes through a file, so no shared disk is needed (the authors wrote the frozen weights to a file on the node;
torch.distributed.checkpoint would need storage too). A broadcast reaches every rank, so this sends more bytes than
point-to-point would: it is a change every few epochs, chosen for a collective that cannot deadlock. Checkpoints
gather everything on rank 0 the same way (``gather_state``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from operators import named_optimizer_state
from progressive.pipeline.mesh import Layout
from progressive.pipeline.stages import Holding, held, holding

SEP = "::"  # joins a parameter's FQN and an optimizer-state key (FQNs contain dots, never '::')


def flatten_state(state: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{fqn: {key: tensor}} (named AdamW state) -> {"fqn::key": tensor}; python numbers become tensors."""
    return {f"{n}{SEP}{k}": (v if torch.is_tensor(v) else torch.tensor(v)) for n, st in state.items()
            for k, v in st.items()}


def unflatten_state(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """Inverse of ``flatten_state``."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, v in flat.items():
        n, _, k = key.partition(SEP)
        out.setdefault(n, {})[k] = v
    return out


def broadcast_by_name(local: dict[str, torch.Tensor], sources: dict[str, int], wanted: Callable[[str], bool],
                      device: torch.device) -> dict[str, torch.Tensor]:
    """Collective over the world group: every rank passes the same ``sources`` ({name: global rank that
    holds it}); the source sends ``local[name]`` and every ``local["name::key"]`` it has (AdamW state, see
    ``flatten_state``). Returns {key: tensor} for the keys for which ``wanted(key)`` is true, on ``device``
    (a rank's own tensors as they are, others as fresh copies).

    Raises:
        KeyError: a rank is named as the source of a tensor it does not hold.
    """
    me = dist.get_rank()
    out: dict[str, torch.Tensor] = {}
    by_source: dict[int, set[str]] = {}
    for name, src in sources.items():
        by_source.setdefault(src, set()).add(name)
    for src in sorted(by_source):
        names = by_source[src]
        meta = None
        if src == me:
            missing = sorted(n for n in names if n not in local)
            if missing:
                raise KeyError(f"rank {me} is the source of {missing[:3]} but does not hold them")
            keys = sorted(k for k in local if k.partition(SEP)[0] in names)
            meta = [(k, tuple(local[k].shape), str(local[k].dtype).removeprefix("torch.")) for k in keys]
        box = [meta]
        dist.broadcast_object_list(box, src=src, device=device if device.type != "cpu" else None)
        meta = box[0]
        for dtype in sorted({d for _, _, d in meta}):
            group = [(k, shape) for k, shape, d in meta if d == dtype]
            if src == me:
                flat = torch.cat([local[k].detach().reshape(-1).to(device) for k, _ in group])
            else:
                flat = torch.empty(sum(_numel(s) for _, s in group), dtype=getattr(torch, dtype), device=device)
            dist.broadcast(flat, src=src)
            offset = 0
            for k, shape in group:
                size = _numel(shape)
                if wanted(k):
                    out[k] = local[k].to(device) if src == me else flat[offset:offset + size].view(shape).clone()
                offset += size
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def owner(layout: Layout, groups: tuple[list[str], list[list[str]], list[str]], fqn: str) -> int:
    """The stage that holds parameter ``fqn`` in ``layout``: the embeddings and the frozen prefix stage 0,
    an active layer the stage of its partition, the head the last."""
    embed, per_layer, _ = groups
    for i, names in enumerate(per_layer):
        if fqn in names:
            return 0 if i < layout.frozen else max(s for s in range(layout.k) if layout.bounds[s] <= i)
    return 0 if fqn in embed else layout.k - 1


def _holdings(groups: tuple, layout: Layout, world: int) -> list[Holding]:
    return [holding(groups, layout.frozen, layout.bounds, layout.coords(r)[1]) for r in range(world)]


def move_state(model: nn.Module, optimizer: torch.optim.Optimizer, groups: tuple, old: Layout, new: Layout,
               device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """AutoDP's state move (collective): the weights this rank holds under ``new`` and did not under ``old``,
    received from the first replica of their old stage, and the named AdamW state of what it trains under
    ``new`` (its own, or received: a layer that changes stage keeps its moments and step count). A weight that
    nobody lacks is not sent; a newly frozen layer goes to every replica of stage 0 without its state."""

    world, rank = dist.get_world_size(), dist.get_rank()
    before, after = _holdings(groups, old, world), _holdings(groups, new, world)
    need = set().union(*[(a.keep - b.keep) | (a.train - b.train) for a, b in zip(after, before)])
    sources = {n: old.rank(0, owner(old, groups, n)) for n in need}
    mine_b, mine_a = before[rank], after[rank]
    state = named_optimizer_state(model, optimizer)
    local = {**held(model), **flatten_state({n: s for n, s in state.items() if n in need})}

    def wanted(key: str) -> bool:
        base, sep, _ = key.partition(SEP)
        return base in (mine_a.train - mine_b.train) if sep else key in (mine_a.keep - mine_b.keep)

    got = broadcast_by_name(local, sources, wanted, device)
    kept = {n: s for n, s in state.items() if n in mine_a.train}
    kept.update(unflatten_state({k: v for k, v in got.items() if SEP in k}))
    return {k: v for k, v in got.items() if SEP not in k}, kept


def gather_state(model: nn.Module, optimizer: torch.optim.Optimizer, groups: tuple, layout: Layout,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Every weight and AdamW state tensor ("fqn::key") on rank 0, by FQN (collective; other ranks get an
    empty dict): what a checkpoint and the final Hugging Face model need."""

    sources = {n: layout.rank(0, owner(layout, groups, n)) for n, _ in model.named_parameters()}
    local = {**held(model), **flatten_state(named_optimizer_state(model, optimizer))}
    return broadcast_by_name(local, sources, lambda key: dist.get_rank() == 0, device)
