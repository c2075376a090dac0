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

**Asymmetric split** (``width_split="asymmetric"``, after LEMON, Wang et al. ICLR 2024, Fig. 3).
With ``symmetric`` every copy of a duplicated unit is produced by identical weights, reads identical
inputs and is read with identical weights (W/k each), so it gets identical gradients and identical
Adam moments for ever: the grown model never uses its extra width. ``asymmetric`` adds noise to the
weights that *read* a duplicated group (the in axes): copy j gets W/k + N_j with sum_j N_j = 0. The
copies' activations are equal, so the consumer computes sum_j (W/k + N_j) x = W x: the function is
unchanged up to fp32 rounding, yet the backward pass sends (W/k + N_j)^T delta to copy j, so the copies
diverge under training. Choices:

- unit: N has per-entry std ``split_noise * std(W_sym)``, W_sym the symmetric large tensor (the entries
  the noise perturbs; = std(W_small)/k), one std per tensor. ``split_noise = 0.1`` moves each entry
  by ~10% of a typical entry. A tensor that is constant (std 0) gets no noise.
- zero sum: draw z ~ N(0, 1) of the large shape, subtract its mean over each in axis's k copies and
  rescale by sqrt(k/(k-1)), so the std stays exact (k = 2: N_2 = -N_1).
- independence: every entry gets its own draw, also across out copies: a tensor that both reads one
  duplicated space and writes another (an FFN up projection) has different rows for the two copies
  of a neuron from the start; each row's noise still sums to zero over its input group.
- seeding: one torch.Generator per tensor, seeded from (seed, target parameter name) by a stable hash,
  so the noise does not depend on iteration order, and the copies of a layer (depth "copy") differ.
- not split: a consumer tied to a producer (a tied LM head *is* the embedding, an out axis) cannot
  take noise; it stays exact through the 1/k on the norm before it. Its duplicated hidden units
  still diverge: every layer's q|k|v and FFN-in weights read them asymmetrically.

Coalescing sums the in-axis group, so coalesce(decoalesce_asym(W)) = W + sum_j N_j = W in exact
arithmetic; in fp32 (W/k + N) + (W/k - N) rounds, so the round trip holds to ~1e-7 relative, not bit
for bit. Gradients: Phi(M theta + N) = phi(theta) for every theta, so M^T g_L = g_s still holds
exactly; g_L itself is M (M^T M)^-1 g_s (what the optimizer-state map gives) plus a zero-sum part
(I - P) g_L, P = M (M^T M)^-1 M^T, that is linear in the noise: that part is the symmetry breaking.

The implementation never builds F or T: ``unit_view`` exposes each group as an explicit tensor
dimension of a view, so merging is a sum over it and duplicating is an expand (see ``transform``).
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import Tensor

WEIGHT, GRAD, GRAD_SQ = "weight", "grad", "grad_sq"
SYMMETRIC, ASYMMETRIC = "symmetric", "asymmetric"  # width splits (validated in operators.spec)
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


def noise_generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded from (``seed``, parameter ``name``) by a stable hash (not Python's hash())."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def split_noise(big: Tensor, in_dims: list[int], k: int, scale: float, gen: torch.Generator) -> Tensor:
    """Zero-sum noise for the asymmetric split (see module doc), shaped like ``big``.

    Args:
        big: the symmetric de-coalesced tensor in its unit view (k copies explicit on ``in_dims``).
        in_dims: the view dimensions that hold the k copies of an in axis (read duplicated activations).
        k: width factor (>= 2).
        scale: ``split_noise``; the per-entry std is ``scale * big.std()``.
        gen: the generator to draw from (CPU).

    Returns:
        A tensor of ``big``'s shape, dtype and device whose sum over each of ``in_dims`` is zero.
    """
    sigma = scale * big.float().std(correction=0).item()
    z = torch.randn(big.shape, generator=gen, dtype=torch.float32)
    for d in in_dims:
        z.sub_(z.mean(dim=d, keepdim=True)).mul_(math.sqrt(k / (k - 1)))
    return z.mul_(sigma).to(big.device, big.dtype)
