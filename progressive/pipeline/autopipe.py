"""AutoPipe (He et al., "PipeTransformer", ICML 2021, sec. 3.2 and Algorithm 1): pack the still-active layers
into a pipeline of K stages, shorten it when freezing frees memory, and pick the micro-batch count.

With F layers frozen out of L, the pipeline holds the active layers F..L-1 (stage 0 also the embeddings
while F = 0, the last stage the head). Each unit i has a cost c_i (``LayerProfile``: measured forward +
backward milliseconds per micro-batch, or the authors' parameter counts, or 1 per layer).

1. Partition (``balance``): the contiguous split of the units into K non-empty stages that minimises the
   largest stage cost max_s sum_{i in s} c_i, which bounds a synchronous pipeline's step time
   (M + K - 1) * max_s C_s. Solved exactly by dynamic programming over (stage, prefix), O(K n^2); among
   optimal splits the one that fills the earliest stages most is taken, so equal costs always give the same
   partition. The paper's greedy rule (each device takes units while its sum stays below mean + variance of
   what is left) is ``greedy_balance``, kept for comparison: it is never better (tests/unit/pipeline/test_pipeline.py).
2. Compression (``choose_stages``, the paper's Eq. 2 / Algorithm 1 lines 26-33): after a freeze, try K/2
   while the largest stage of the halved, re-balanced pipeline needs no more memory than the largest stage
   of the pipeline at the start (F = 0, K = K_0). A stage's memory (``stage_memory``) counts bytes:
   16 per trainable parameter (fp32 weight, gradient, AdamW m and v), 4 per held frozen parameter (stage 0
   holds the frozen prefix: weights only; the paper's lambda_frozen = 1/6 is the same idea), and the
   activations its active layers save for backward, per sample (measured with saved-tensor hooks) times
   the local batch B / dp (GPipe keeps every micro-batch's activations until its backward; a 1F1B schedule
   keeps fewer, so this is its upper bound). Halving K doubles dp, which halves the local batch: a stage
   with twice the layers keeps about the same activations, and freezing removes gradient and AdamW bytes.
   K never exceeds the number of active layers (each stage holds one at least); then it is halved until it
   fits, whatever memory says. Every decision comes with the sentence that explains it.
3. Micro-batches (``microbatch_candidates``): M from {K, 2K, 4K, ...} that divide the local batch; the
   engine times a few pipeline steps for each and keeps the fastest (the paper profiles K..6K once per
   environment; the authors' code hard-codes 16 or 4K). If none divides, the largest divisor below K.

Deviations from the paper and the authors' code:
- The balance uses measured time (``balance: time``), not parameter counts (the authors'; ``balance:
  params`` keeps it for comparison), and it is exact rather than greedy.
- The memory rule counts AdamW state, frozen weights and activations, not parameter counts; the frozen
  prefix's memory is on stage 0 (the authors' correction subtracts zero at HEAD).
- The frozen prefix is outside the pipeline (run without autograd on stage 0 before the schedule starts,
  or served from AutoCache), so its forward time is not part of stage 0's balance: it adds to every step,
  pipelined or not.
- Each layer is one unit (the authors split a block into attention and MLP sub-layers): the layer list of
  an HF model is what ``operators.freeze`` can cut, and layers are many enough for balance at K <= L.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from common.device import Stopwatch
from operators.freeze import forward_from, prefix_output, span_output
from progressive.pipeline.stages import parameter_groups, set_hollow

# ------------------------------------------------------------------------------------- partitioning


def balance(costs: Sequence[float], k: int) -> list[int]:
    """Sizes (units per stage) of the contiguous split of ``costs`` into ``k`` non-empty stages with the
    smallest largest-stage sum; among optimal splits, the one whose earliest stages are fullest.

    Raises:
        ValueError: k < 1 or more stages than units.
    """
    n = len(costs)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} units into {k} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    # rest[m][j]: the smallest largest-stage sum of units j..n-1 split into m non-empty stages
    rest = np.full((k + 1, n + 1), math.inf)
    rest[0][n] = 0.0
    for m in range(1, k + 1):
        for j in range(n - m, -1, -1):
            rest[m][j] = min(max(prefix[i] - prefix[j], rest[m - 1][i]) for i in range(j + 1, n - m + 2))
    cap = rest[k][0] * (1 + 1e-12) + 1e-12  # float sums of the same units may differ in the last bit
    sizes, i = [], 0
    for s in range(k):
        m = k - s - 1  # stages still to fill after this one
        j = max(j for j in range(i + 1, n - m + 1) if prefix[j] - prefix[i] <= cap and rest[m][j] <= cap)
        sizes.append(j - i)
        i = j
    return sizes


def greedy_balance(costs: Sequence[float], k: int) -> list[int]:
    """The paper's Algorithm 1 ``load_balance`` (authors' ``generate_parameter_size_wise_balance``): device
    i takes units while its sum plus the next unit stays below mean + var of the units left (mean = their
    sum / (K - i), var = their variance / (K - i)); here each device takes one unit at least and leaves one
    for every later device; the last takes the rest."""
    n, sizes, i = len(costs), [], 0
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} units into {k} non-empty stages")
    for d in range(k):
        left = np.asarray(costs[i:], dtype=np.float64)
        if d == k - 1:
            sizes.append(n - i)
            break
        bound = left.sum() / (k - d) + left.var() / (k - d)
        j, total = i + 1, float(costs[i])
        while j < n - (k - d - 1) and total + costs[j] < bound:
            total += costs[j]
            j += 1
        sizes.append(j - i)
        i = j
    return sizes


def bounds_of(frozen: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """Layer boundaries F = b_0 < ... < b_K = L of stages with ``sizes`` layers each (K = 1 and no active
    layer: (L, L), the head-only stage)."""
    out = [frozen]
    for s in sizes:
        out.append(out[-1] + s)
    return tuple(out) if sizes else (frozen, frozen)


# ------------------------------------------------------------------------------------- the profile


@dataclass
class LayerProfile:
    """Per-unit costs of one model, measured once (``profile_model``) or from its shapes alone.

    ``layer_ms``, ``embed_ms``, ``head_ms``: forward + backward milliseconds for ``samples`` samples;
    ``layer_params``, ``embed_params``, ``head_params``: parameter counts; ``layer_act``, ``head_act``:
    bytes saved for backward per sample."""

    layer_ms: list[float]
    embed_ms: float
    head_ms: float
    layer_params: list[int]
    embed_params: int
    head_params: int
    layer_act: list[float]
    head_act: float
    samples: int

    def as_dict(self) -> dict:
        """JSON-able (checkpoints keep the profile, so a resumed run partitions as the original did)."""
        return asdict(self)

    @property
    def layers(self) -> int:
        """L."""
        return len(self.layer_ms)

    def costs(self, frozen: int, kind: str) -> list[float]:
        """The cost of each active layer F..L-1 for ``balance`` kind time | params | uniform, with the
        embeddings on the first while nothing is frozen and the head on the last (a head-only pipeline, all
        layers frozen, has no unit: callers use K = 1)."""
        n = self.layers - frozen
        if kind == "uniform":
            return [1.0] * n
        if kind == "params":
            c = [float(x) for x in self.layer_params[frozen:]]
            extra_first, extra_last = float(self.embed_params), float(self.head_params)
        else:
            c = list(self.layer_ms[frozen:])
            extra_first, extra_last = self.embed_ms, self.head_ms
        if n and frozen == 0:
            c[0] += extra_first
        if n:
            c[-1] += extra_last
        return c


def stage_memory(p: LayerProfile, frozen: int, bounds: Sequence[int], local_batch: int) -> list[float]:
    """Bytes each stage of the partition ``bounds`` needs (see the module docstring): 16 per trainable
    parameter, 4 per held frozen one, saved activations x ``local_batch``."""
    out = []
    k = len(bounds) - 1
    for s in range(k):
        a, b = bounds[s], bounds[s + 1]
        train = sum(p.layer_params[a:b])
        act = sum(p.layer_act[a:b]) * local_batch
        hold = 0
        if s == 0:
            hold = p.embed_params + sum(p.layer_params[:frozen])
            if frozen == 0:
                train, hold = train + p.embed_params, 0
        if s == k - 1:
            train += p.head_params
            act += p.head_act * local_batch
        out.append(16.0 * train + 4.0 * hold + act)
    return out


def partition(p: LayerProfile, frozen: int, k: int, kind: str) -> tuple[int, ...]:
    """The balanced boundaries of K stages over the active layers (K = 1 with none active: head only)."""
    n = p.layers - frozen
    if n == 0:
        return (frozen, frozen)
    return bounds_of(frozen, balance(p.costs(frozen, kind), k))


def choose_stages(p: LayerProfile, frozen: int, k: int, world: int, batch: int, budget: float,
                  kind: str) -> tuple[int, list[str]]:
    """AutoPipe's compression: the new K (a halving of ``k`` zero or more times) and one sentence per step
    saying why. ``budget``: the largest stage's bytes at the start; ``batch``: the global batch (the
    local batch of a pipeline is batch / dp, dp = world / K)."""
    why = []
    active = p.layers - frozen
    while k > max(1, active):
        why.append(f"K {k} -> {k // 2}: only {active} active layer{'s' * (active != 1)} for {k} stages")
        k //= 2
    while k > 1:
        half = k // 2
        bounds = partition(p, frozen, half, kind)
        need = max(stage_memory(p, frozen, bounds, batch * half // world))
        if need > budget:
            why.append(f"K stays {k}: K {half} would need {need / 2**20:.2f} MiB on its largest stage > "
                       f"{budget / 2**20:.2f} MiB at the start")
            break
        why.append(f"K {k} -> {half}: its largest stage needs {need / 2**20:.2f} MiB <= {budget / 2**20:.2f} "
                   "MiB at the start")
        k = half
    return k, why


def microbatch_candidates(k: int, local_batch: int) -> list[int]:
    """M in {K, 2K, 4K, ...} dividing the local batch (at most the local batch); if none, the largest
    divisor of the local batch below K."""
    out, m = [], k
    while m <= local_batch:
        if local_batch % m == 0:
            out.append(m)
        m *= 2
    return out or [max(d for d in range(1, min(k, local_batch) + 1) if local_batch % d == 0)]


# ------------------------------------------------------------------------------------- measuring


class _SavedBytes:
    """Counts the bytes autograd saves for backward inside the block: distinct storages once, parameters
    (a matmul saves its weight too) not at all, since they are counted as parameters."""

    def __init__(self, params: set[int]):
        self.bytes, self._seen = 0, set(params)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            key = t.untyped_storage().data_ptr()
            if key not in self._seen:
                self._seen.add(key)
                self.bytes += t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def _time(fn: Callable[[], torch.Tensor], repeats: int, params: set[int], device: torch.device) -> tuple[float, float]:
    """(median forward+backward ms of device time, saved activation bytes) of ``fn`` (returns a tensor to
    back-propagate); ``params``: storage pointers of the parameters; ``device``: where it runs."""
    times, saved = [], 0
    for r in range(repeats + 1):  # the first run warms up (allocations, lazy inits) and is not timed
        clock = Stopwatch(device)
        with _SavedBytes(params) as sb:
            out = fn()
        out.backward(torch.ones_like(out) if out.dim() else None)
        seconds = clock.lap()
        if r:
            times.append(seconds * 1e3)
        saved = sb.bytes
    return statistics.median(times), float(saved)


def profile_model(model: nn.Module, batch: dict[str, torch.Tensor], repeats: int) -> LayerProfile:
    """Measure ``model`` (every parameter real, e.g. right after it was built) on ``batch``, one micro-batch:
    each layer i >= 1 as a middle stage [i, i+1) fed a hidden state (hollow embeddings), the first stage
    [0, 1) with the embeddings and the last [L-1, L) with the head and loss. The layers of one model have one
    shape, so layer 0's own cost is taken as the median of the others; the embeddings' cost is the first
    stage's minus that, the head's the last stage's minus layer L-1's (clamped at 0). Gradients are
    discarded."""

    embed, per_layer, head = parameter_groups(model)
    params = dict(model.named_parameters())
    count = lambda names: sum(params[n].numel() for n in names)  # noqa: E731
    L = len(per_layer)
    n = len(next(iter(batch.values())))
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    device = next(model.parameters()).device
    hidden = [prefix_output(model, batch, stop=i) if i else None for i in range(L)]
    was_training = model.training
    model.train()
    try:
        first_ms, first_act = _time(lambda: span_output(model, batch, 1).float().sum(), repeats, ptrs, device)
        mid, act = [0.0] * L, [0.0] * L
        set_hollow(model, True)
        try:
            for i in range(1, L):
                h = hidden[i].detach().requires_grad_(True)
                mid[i], act[i] = _time(lambda h=h, i=i: span_output(model, batch, i + 1, i, h).float().sum(),
                                       repeats, ptrs, device)
        finally:
            set_hollow(model, False)
        if L > 1:
            h = hidden[L - 1].detach().requires_grad_(True)
            last_ms, last_act = _time(lambda: forward_from(model, batch, L - 1, h).loss, repeats, ptrs, device)
        else:
            last_ms, last_act = _time(lambda: model(**batch).loss, repeats, ptrs, device)
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    layer = statistics.median(mid[1:]) if L > 1 else first_ms
    layer_act = statistics.median(act[1:]) if L > 1 else first_act
    mid[0], act[0] = layer, layer_act
    return LayerProfile(
        layer_ms=mid, embed_ms=max(0.0, first_ms - layer), head_ms=max(0.0, last_ms - mid[L - 1]),
        layer_params=[count(p) for p in per_layer], embed_params=count(embed), head_params=count(head),
        layer_act=[a / n for a in act], head_act=max(0.0, last_act - act[L - 1]) / n, samples=n)
