"""Width and depth maps of the multi-level framework (Zou, Zhang, Deng, ICLR 2024, Sec. 3 / Eqs. 3-8).

Everything reduces to one grouping: n large units are merged in n/k groups of k.

- pairing "stride" (the paper's F = [I/k; ...; I/k]): small unit i <- large units {i, i + n/k, ...};
- pairing "adjacent": small unit i <- large units {k*i, ..., k*i + k - 1}.

On one tensor axis (PyTorch out x in convention, paper notation W_small = F_out W S_in):

    coalesce,   out axis:  average over the group            (F, rows sum to 1)
    coalesce,   in axis:   sum over the group                (S = k F)
    decoalesce, out axis:  duplicate each unit               (T = k F^T, 0/1)
    decoalesce, in axis:   duplicate and divide by k         (T / k)

so coalesce(decoalesce(W)) == W and, when activations come in duplicated groups, the large network
computes what the small one does. With a per-axis weight coefficient c (decoalesce = gather * c:
c = 1 on out axes, 1/k on in axes, and an extra 1/k on the norm before a tied head) the four maps
of one axis are, for weights and for gradient-like tensors (Adam moments):

    decoalesce weight: gather * c        coalesce weight: group-sum / (c k)
    decoalesce grad:   gather / (c k)    coalesce grad:   group-sum * c

The gradient map is the dual one: if theta_L = M theta_s exactly then M^T g_L = g_s, and at the
de-coalesced point g_L = M (M^T M)^-1 g_s. Second moments use the element-wise square of the
gradient map (exact when de-coalescing; an independence assumption when coalescing).

The implementation never builds F or T: ``unit_view`` exposes each group as an explicit tensor
dimension of a view, so merging is a sum over it and duplicating is an expand (see ``transform``).
"""

from __future__ import annotations

import torch
from torch import Tensor

WEIGHT, GRAD, GRAD_SQ = "weight", "grad", "grad_sq"
KINDS = (WEIGHT, GRAD, GRAD_SQ)


def small_of(n_large: int, k: int, pairing: str) -> Tensor:
    """For each of ``n_large`` units, the index of the small unit it merges into (LongTensor[n_large])."""
    i = torch.arange(n_large)
    return i % (n_large // k) if pairing == "stride" else i // k


def groups(n_small: int, k: int, pairing: str) -> Tensor:
    """For each small unit, the k large units merged into it (LongTensor[n_small, k])."""
    i, j = torch.arange(n_small)[:, None], torch.arange(k)[None, :]
    return i + j * n_small if pairing == "stride" else i * k + j


def is_group_leader(n_large: int, k: int, pairing: str) -> Tensor:
    """BoolTensor[n_large]: True for the first member of each group (the kept layer in depth "identity")."""
    i = torch.arange(n_large)
    return i < n_large // k if pairing == "stride" else i % k == 0


def unit_view(chunks: int, n_small: int, unit: int, k: int, pairing: str, expanded: bool) -> tuple[list[int], int]:
    """How one axis looks as (chunks, groups, unit) with the k group members made explicit.

    The large axis is chunks x n_large x unit with n_large = k * n_small. With pairing "stride" large
    unit i belongs to group i mod n_small, i.e. the axis is (chunks, k, n_small, unit); with "adjacent"
    it belongs to group i // k, i.e. (chunks, n_small, k, unit). Summing over the k dimension merges
    the groups; expanding a size-1 k dimension duplicates them. No index tensors, one strided pass.

    Returns:
        The 4 view sizes (the k entry is k if ``expanded`` else 1) and the position of the k entry.
    """
    kk = k if expanded else 1
    if pairing == "stride":
        return [chunks, kk, n_small, unit], 1
    return [chunks, n_small, kk, unit], 2


def coefficient(direction: str, kind: str, c: float, k: int) -> float:
    """Scalar that multiplies one axis map, given the axis' weight coefficient ``c`` (see module doc)."""
    if direction == "decoalesce":
        base = c if kind == WEIGHT else 1.0 / (c * k)
    else:
        base = 1.0 / (c * k) if kind == WEIGHT else c
    return base * base if kind == GRAD_SQ else base
