"""Carry AdamW state across a size change, so training continues instead of restarting.

Moments map like gradients, not like weights. For an exact de-coalesce theta_L = M theta_s the
gradients satisfy M^T g_L = g_s, and at the de-coalesced point g_L = M (M^T M)^-1 g_s: a duplicated
embedding column receives [g/2, g/2], not [g, g]. So exp_avg goes through the gradient map,
exp_avg_sq (and max_exp_avg_sq) through its element-wise square, and ``step`` is kept. Coalescing uses
the matching merge (M^T: gradients of merged outputs add up). See ``operators.maps`` for the table.

Adam is not scale-equivariant: the de-coalesced large model sees the same gradients (mapped) but
its update m / (sqrt(v) + eps) is applied to weights of a different scale (incoming weights are
split 1/k), so even with mapped state the large run does not reproduce the small run's trajectory.
Mode "reset" (fresh state, the papers' choice) stays available to the trainer.

The asymmetric width split (``decoalesce(..., width_split="asymmetric")``) needs no other map: the
grown model still satisfies M^T g_L = g_s exactly, and the mapped moments equal P g_L, the projection of
its gradient onto the duplicated subspace. The zero-sum rest (I - P) g_L, the symmetry-breaking signal,
has no history in the small model and starts from zero moments (see ``operators.maps``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from operators.api import head_is_tied, validate_resize
from operators.layouts import family_of
from operators.maps import GRAD, GRAD_SQ
from operators.transform import Resize, map_named_tensors, source_name

# AdamW state keys and how each maps; anything else (``step``) is copied unchanged.
MOMENT_KINDS = {"exp_avg": GRAD, "exp_avg_sq": GRAD_SQ, "max_exp_avg_sq": GRAD_SQ}


def named_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """Return the optimizer's per-parameter state keyed by ``model.named_parameters()`` names."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p in optimizer.state and id(p) in by_id:
                out[by_id[id(p)]] = dict(optimizer.state[p])
    return out


def load_named_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                               state: dict[str, dict[str, Any]]) -> int:
    """Install name-keyed ``state`` into ``optimizer`` for ``model``'s parameters.

    Parameters without an entry keep fresh state (their first step initialises it); entries for
    parameters the optimizer does not train (frozen, or left out of its groups) are skipped, since
    ``optimizer.state_dict()`` cannot serialise state of a parameter outside its groups.

    Returns:
        The number of parameters whose state was installed.

    Raises:
        ValueError: a moment's shape does not match its parameter.
    """
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    params = {n: p for n, p in model.named_parameters() if id(p) in trained}
    n = 0
    for name, st in state.items():
        p = params.get(name)
        if p is None:
            continue
        for key, val in st.items():
            if torch.is_tensor(val) and val.dim() > 0 and val.shape != p.shape:
                raise ValueError(f"optimizer state '{key}' for '{name}' has shape {tuple(val.shape)}, "
                                 f"parameter has {tuple(p.shape)}")
        optimizer.state[p] = {k: (v.to(p.device) if torch.is_tensor(v) and v.dim() > 0 else v)
                              for k, v in st.items()}
        n += 1
    return n


def map_optimizer_state(state: dict[str, dict[str, Any]], model: nn.Module, direction: str,
                        width: int = 2, depth: int = 1, pairing: str = "stride",
                        depth_pairing: str = "adjacent", depth_mode: str = "copy") -> dict[str, dict[str, Any]]:
    """Map name-keyed Adam state of ``model`` (the source) to the model ``direction`` produces.

    Args:
        state: ``named_optimizer_state(model, optimizer)``.
        model: the source model (its config gives the sizes).
        direction, width, depth, pairing, depth_pairing, depth_mode: as for ``coalesce``/``decoalesce``.

    Returns:
        Name-keyed state for the target model. Parameters with no mapped state (new identity layers in
        depth mode "identity") are absent: they start fresh, with their own step count at 0.
    """
    validate_resize(model.config, width, depth, direction, pairing, depth_pairing, depth_mode)
    spec = family_of(model)
    r = Resize(direction, width, depth, pairing, depth_pairing, depth_mode)
    sizes, tied = spec.sizes(model.config), head_is_tied(model)
    keys = sorted({k for st in state.values() for k in st})  # sorted: a set's order differs between processes
    mapped: dict[str, dict[str, Any]] = {}
    for key in keys:
        tensors = {n: st[key] for n, st in state.items() if key in st}
        kind = MOMENT_KINDS.get(key)
        if kind is None:
            continue
        for n, t in map_named_tensors(tensors, spec, sizes, r, kind, tied).items():
            mapped.setdefault(n, {})[key] = t
    # ``step`` (and other scalars) follow the source layer each target was built from.
    for key in (k for k in keys if k not in MOMENT_KINDS):
        for n in mapped:
            src = source_name(n, spec, r, sizes["layers"])
            if src in state and key in state[src]:
                val = state[src][key]
                mapped[n][key] = val.clone() if torch.is_tensor(val) else val
    return mapped


def interpolate_state(base: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]],
                      alpha: float) -> dict[str, dict[str, Any]]:
    """(1 - alpha) * base + alpha * other for every moment, by parameter name.

    A convex combination of second moments is itself a valid second-moment estimate. A parameter with
    state only in ``base`` (e.g. a new identity layer, whose mapped state is fresh) is treated as having
    zero moments in ``other``: it keeps (1 - alpha) * base and base's step, so the update ratio
    m / sqrt(v) shrinks by sqrt(1 - alpha). At alpha = 1 such a parameter is left out (fresh state, step
    0): zero moments under a large step count would make Adam's first bias-corrected updates ~3x too big.
    Non-moment entries come from ``other`` when it has the parameter.
    """
    out = {} if alpha >= 1.0 else {
        n: {k: (v * (1.0 - alpha) if k in MOMENT_KINDS and torch.is_tensor(v) else v) for k, v in st.items()}
        for n, st in base.items() if n not in other}
    for name, st in other.items():
        b = base.get(name, {})
        out[name] = {k: (torch.lerp(b[k], v, alpha) if k in MOMENT_KINDS and k in b and torch.is_tensor(v)
                         and b[k].shape == v.shape else v) for k, v in st.items()}
    return out
