"""Move named tensors (weights, AdamW moments) between ranks by fully qualified name, whatever the layouts.

AutoDP's state move: when the layout changes, every tensor a rank will need and does not hold has a source
rank that holds it (the first replica of the stage that owned it). ``broadcast_by_name`` sends, source by
source, one metadata message (names, shapes, dtypes) and one flat buffer per dtype over the world group;
each rank keeps the names it wants and drops the rest at once, so at most one source's tensors are extra
at any time. Nothing goes through a file, so no shared disk is needed (the authors wrote the frozen
weights to a file on the node; torch.distributed.checkpoint would need storage too). A broadcast reaches
every rank, so this sends more bytes than point-to-point would: it is a change every few epochs, chosen
for a collective that cannot deadlock. Checkpoints use the same call to gather everything on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

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
