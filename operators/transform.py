"""Apply width and depth maps to a dict of named tensors (weights, gradients or Adam moments).

Written once against family specs: the only family knowledge used here comes from ``FamilySpec``.
Depth (paper Eq. 5, R = l (x) I): small layer i is the average of a group of large layers, every
parameter of the block, norms included; de-coalescing copies each small layer into its group
("copy", the paper's G = normalise(l^T)) or, in mode "identity", copies it into the group's first
layer and makes the other layers of the group identities by zeroing their residual-writing
projections, so a pre-LN model computes exactly the small model's function.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import Tensor

from operators import maps
from operators.maps import GRAD, GRAD_SQ, WEIGHT
from operators.spec import IN, FamilySpec, OperatorError, Rule


@dataclass(frozen=True)
class Resize:
    """One resize request: factors, pairings and modes (validated by ``operators.spec.check_factors``)."""

    direction: str  # "coalesce" | "decoalesce"
    width: int = 2
    depth: int = 1
    pairing: str = "stride"
    depth_pairing: str = "adjacent"
    depth_mode: str = "copy"
    width_split: str = maps.SYMMETRIC  # decoalesce: "asymmetric" adds zero-sum noise to in-axis copies
    split_noise: float = 0.0  # noise std in units of the split tensor's std (asymmetric only)
    seed: int = 0  # with the target parameter's name, seeds that tensor's noise


def _map_width(t: Tensor, rule: Rule, spec: FamilySpec, sizes: dict, r: Resize, kind: str,
               tied_head: bool, name: str = "") -> Tensor:
    """Map one tensor along every width axis of its rule in a single strided pass.

    ``sizes`` are the source model's. Every mapped axis is reshaped to (chunks, [k,] groups, unit)
    (``maps.unit_view``): coalescing sums over all k dimensions at once, de-coalescing expands them,
    and the product of the per-axis coefficients is applied on the way. An asymmetric de-coalesce of
    weights adds zero-sum noise over the k copies of every in axis (``maps.split_noise``), seeded from
    ``r.seed`` and ``name`` (the target parameter's name).
    """
    if len(rule.axes) != t.dim():
        raise OperatorError(f"spec rule '{rule.pattern}' expects {len(rule.axes)} dims, tensor has {t.dim()}")
    k, scale, grow = r.width, 1.0, r.direction == "decoalesce"
    if k == 1:
        return t
    view, out_shape, k_dims, in_dims = [], [], [], []
    for dim, ax in enumerate(rule.axes):
        if ax is None:
            view.append(t.shape[dim])
            out_shape.append(t.shape[dim])
            continue
        units, unit = spec.space_units(sizes, ax.space)
        if t.shape[dim] != ax.chunks * units * unit:
            raise OperatorError(f"axis {dim} of '{rule.pattern}' has {t.shape[dim]} entries; the config "
                                f"says {ax.chunks * units * unit}")
        n_small = units if grow else units // k
        sizes4, k_pos = maps.unit_view(ax.chunks, n_small, unit, k, r.pairing, expanded=not grow)
        k_dims.append(len(view) + k_pos)
        if ax.side == IN:
            in_dims.append(len(view) + k_pos)
        view += sizes4
        out_shape.append(ax.chunks * n_small * unit * (k if grow else 1))
        c = 1.0 / k if ax.side == IN else 1.0
        if rule.head_norm and tied_head:
            c /= k
        scale *= maps.coefficient(r.direction, kind, c, k)
    if not k_dims:  # nothing to map (e.g. a vocabulary bias); sum(dim=[]) would reduce everything
        return t
    v = t.reshape(view)
    if grow:
        big = list(view)
        for d in k_dims:
            big[d] = k
        out = torch.empty(big, dtype=t.dtype, device=t.device)
        if scale != 1.0:
            torch.mul(v.expand(big), scale, out=out)
        else:
            out.copy_(v.expand(big))
        if kind == WEIGHT and in_dims and r.width_split == maps.ASYMMETRIC and r.split_noise > 0:
            out.add_(maps.split_noise(out, in_dims, k, r.split_noise, maps.noise_generator(r.seed, name)))
    else:
        out = v
        for d in sorted(k_dims, reverse=True):  # explicit adds of strided slices: ~4x faster than sum(dim)
            acc = torch.add(out.select(d, 0), out.select(d, 1)) if k > 1 else out.select(d, 0).clone()
            for j in range(2, k):
                acc.add_(out.select(d, j))
            out = acc
        if scale != 1.0:
            out.mul_(scale)
    return out.reshape(out_shape)


def _own(t: Tensor, source: Tensor) -> Tensor:
    """Return ``t``, copied if it still shares storage with ``source``: tensors shared between two
    parameters would silently become tied parameters in the new model."""
    return t.clone() if t.untyped_storage().data_ptr() == source.untyped_storage().data_ptr() else t


def source_name(target: str, spec: FamilySpec, r: Resize, n_from: int) -> str:
    """The source parameter a target parameter is built from (the first group member when coalescing)."""
    m = re.match(spec.layer_pattern, target)
    if not m or r.depth == 1:
        return target
    return f"{m.group(1)}.{layer_index_map(n_from, r)[int(m.group(2))][0]}.{m.group(3)}"


def layer_index_map(n_from: int, r: Resize) -> list[list[int]]:
    """For each target layer, the source layers it is built from (one for decoalesce, k for coalesce)."""
    k = r.depth
    if r.direction == "decoalesce":
        return [[int(i)] for i in maps.small_of(n_from * k, k, r.depth_pairing)]
    return maps.groups(n_from // k, k, r.depth_pairing).tolist()


def map_named_tensors(
    tensors: dict[str, Tensor],
    spec: FamilySpec,
    sizes: dict[str, int],
    r: Resize,
    kind: str = WEIGHT,
    tied_head: bool = False,
) -> dict[str, Tensor]:
    """Map every tensor of ``tensors`` (names as in the source model) to the resized model.

    Args:
        tensors: name -> tensor, all of one kind (weights, gradients, first or second moments).
        spec: the family spec.
        sizes: ``spec.sizes(source_config)``.
        r: the resize request.
        kind: "weight", "grad" or "grad_sq" (second moments).
        tied_head: the model ties its output head to the input embedding.

    Returns:
        name -> tensor for the target model. For gradient kinds in depth mode "identity", the new
        identity layers are omitted (fresh optimizer state).

    Raises:
        OperatorError: a tensor is not covered by the spec or has a shape the config contradicts.
    """
    if kind not in maps.KINDS:
        raise OperatorError(f"kind must be one of {maps.KINDS}; got {kind!r}")
    layer_re = re.compile(spec.layer_pattern)
    out: dict[str, Tensor] = {}
    layered: dict[tuple[str, str], dict[int, Tensor]] = defaultdict(dict)
    for name, t in tensors.items():
        m = layer_re.match(name)
        if m:
            layered[(m.group(1), m.group(3))][int(m.group(2))] = t
        else:
            out[name] = _own(_map_width(t, spec.rule_for(name), spec, sizes, r, kind, tied_head, name), t)

    n_from = sizes["layers"]
    targets = layer_index_map(n_from, r) if r.depth > 1 else [[i] for i in range(n_from)]
    leader = maps.is_group_leader(len(targets), r.depth, r.depth_pairing).tolist() if r.depth > 1 else None
    depth_scale = maps.coefficient(r.direction, kind, 1.0, r.depth) if r.depth > 1 else 1.0
    identity = r.direction == "decoalesce" and r.depth > 1 and r.depth_mode == "identity"
    for (prefix, suffix), by_layer in layered.items():
        rule = spec.rule_for(f"{prefix}.0.{suffix}")
        for j, sources in enumerate(targets):
            if any(s not in by_layer for s in sources):
                if kind == WEIGHT:
                    raise OperatorError(f"layer {sources} of '{prefix}.*.{suffix}' is missing")
                continue  # no optimizer state for that layer yet: the target starts fresh too
            name = f"{prefix}.{j}.{suffix}"
            if identity and not leader[j]:
                if kind in (GRAD, GRAD_SQ):
                    continue
                t = _map_width(by_layer[sources[0]], rule, spec, sizes, r, kind, tied_head, name)
                out[name] = t.new_zeros(t.shape) if rule.residual_out else _own(t, by_layer[sources[0]])
                continue
            acc = _own(_map_width(by_layer[sources[0]], rule, spec, sizes, r, kind, tied_head, name),
                       by_layer[sources[0]])
            for s in sources[1:]:  # depth coalescing: sum the group, in place on the fresh tensor
                acc.add_(_map_width(by_layer[s], rule, spec, sizes, r, kind, tied_head))
            if depth_scale != 1.0 and not identity:
                acc.mul_(depth_scale)
            out[name] = acc
    return out
