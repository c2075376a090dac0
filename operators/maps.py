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


def element_small_of(units: int, unit: int, chunks: int, k: int, pairing: str) -> Tensor:
    """Element-level version of ``small_of`` for an axis of ``chunks`` x ``units`` x ``unit`` elements
    (large side), returning small-side element indices."""
    n_small = units // k
    e = torch.arange(chunks * units * unit)
    chunk, rest = e // (units * unit), e % (units * unit)
    u, off = rest // unit, rest % unit
    return chunk * (n_small * unit) + small_of(units, k, pairing)[u] * unit + off


def element_groups(units: int, unit: int, chunks: int, k: int, pairing: str) -> Tensor:
    """Element-level version of ``groups``: LongTensor[k, chunks * units/k * unit] of large indices,
    row j holding the j-th member of every small element's group."""
    n_small = units // k
    e = torch.arange(chunks * n_small * unit)
    chunk, rest = e // (n_small * unit), e % (n_small * unit)
    u, off = rest // unit, rest % unit
    g = groups(n_small, k, pairing)[u]  # [n_elems, k]
    return (chunk[:, None] * (units * unit) + g * unit + off[:, None]).T.contiguous()


def gather(t: Tensor, dim: int, index: Tensor) -> Tensor:
    """Duplicate along ``dim``: out[..., i, ...] = t[..., index[i], ...]."""
    return t.index_select(dim, index)


def group_sum(t: Tensor, dim: int, member_index: Tensor) -> Tensor:
    """Sum along ``dim`` over groups: out[..., i, ...] = sum_j t[..., member_index[j, i], ...]."""
    k, n = member_index.shape
    picked = t.index_select(dim, member_index.reshape(-1))  # dim now has k*n entries, member-major
    shape = list(picked.shape)
    shape[dim : dim + 1] = [k, n]
    return picked.reshape(shape).sum(dim)


def coefficient(direction: str, kind: str, c: float, k: int) -> float:
    """Scalar that multiplies one axis map, given the axis' weight coefficient ``c`` (see module doc)."""
    if direction == "decoalesce":
        base = c if kind == WEIGHT else 1.0 / (c * k)
    else:
        base = 1.0 / (c * k) if kind == WEIGHT else c
    return base * base if kind == GRAD_SQ else base
