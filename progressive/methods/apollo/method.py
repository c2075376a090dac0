"""Apollo: Pan et al., "Preparing Lessons for Progressive Training on Language Models", AAAI 2024
(arXiv 2401.09192), as the authors' code runs it (github.com/yuanyehome/Apollo-AAAI-2024-Release), plus
the stacking baselines it contains as special cases: StackBERT (Gong et al., ICML 2019) and G_stack
(Du et al., NeurIPS 2024).

Stages s = 0..S-1 hold N(0) < N(1) < ... < N(S-1) = L distinct layers (a real HF model of N(s) layers).
Stage s starts at step round(boundaries[s-1] * T) of the budget T = train.steps; the last stage runs until
the FLOPs budget (T steps of the full model) is spent, so every method compares at equal compute.

Depth sampling, per micro-batch (i = 0..grad_accum-1 of step t), identical on every rank: a uniform
u(seed, t, i) from a counter-based hash (SplitMix64), so the depth is a pure function of the step and a
resumed run draws the same depths without any saved sampler state. With r = L/N, x = eps + (1-eps)u:

    lvps           a = r + 0.4, b = 0.6, eps = 1e-6, n = (b - a*eps)/(a - b), m = b(1 + n)
                   y = m / (x + n)  (decreasing: y(eps) = a, y(1) = b), clipped to [1, r]
                   D = floor(y * N)
    sigmoid        y = (a - b) / (1 + exp(20 (x - 0.5))) + b, clipped to [1, r], D = floor(y * N)
    uniform        D uniform on {N, ..., L}
    constant_high  D = L (plain looped weight sharing)
    none           D = N (plain progressive growth: StackBERT, G_stack)

Closed form (``depth_probabilities``): floor(yN) >= k  <=>  y >= k/N, so for N < k <= L
P(D >= k) = P(x <= m/(k/N) - n) for lvps (P(x <= 0.5 + ln((a - c)/(c - b))/20) with c = k/N for
sigmoid); P(D = k) = P(D >= k) - P(D >= k+1). Clipping puts the mass of y < 1 on D = N (about two thirds
of the draws) and of y > r on D = L. In the last stage r = 1, so every sampler gives D = L.

Weight sharing (operators.depth): at depth D, position j runs stored layer floor(j N / D)
(``map: interpolation``, Apollo's) or j mod N (``map: stack``). The repeats are the same modules, so
their gradients add up on the shared parameters. The trainer counts each micro-batch's FLOPs at the
depth D that ran (returned by ``before_micro_batch``; FLOPs are linear in the layer count, so exact).

Growth at a stage boundary: a fresh HF model of N(s+1) layers whose layer j is a copy of layer
idx(j) of the N(s)-layer model along the same map with D = N(s+1). The grown model therefore computes
exactly what the shared model of depth N(s+1) computed in stage s (tested for every family).
Optimizer state (``optimizer_state``):
    mapped  every copy of a layer gets that layer's AdamW moments and step count, unchanged. Why
            unchanged and not split 1/k (as gradients of a de-coalesced width are): Adam's update
            m / sqrt(v) is invariant to scaling m by c and v by c^2, so splitting would only matter
            through eps; and most of the stage's steps ran D = N, where every layer ran once, so the
            moments already have the magnitude of one copy's own gradient. Embeddings, norms and heads
            keep theirs.
    first_copy  only the first (lowest) copy of a layer gets its moments; the other copies start at step 0
            with no state (an ablation: does a copy's inherited momentum help it diverge or hold it back?).
    authors the authors' code: AdamW's moments stay with the layer index, not the weights. Position j keeps
            the moments it had (after 3 -> 6 layers with the interpolation map, layer 1 holds a copy of
            layer 0 but layer 1's old moments), and positions past the old depth start at step 0.
    reset   a fresh optimizer at every growth (G_stack's choice).
LR (``schedule``): ``global`` (the authors'): one warm-up + decay schedule over all stages; each stage is
a window of it (Phase.schedule_offset), so nothing restarts at growth, and a WSD decay (train.decay: wsd) holds
the peak through every growth and cools down once, over the last ``train.cooldown`` of the whole run's steps.
``per_stage``: every stage runs train's schedule shape (warmup, decay, min_lr_ratio, cooldown) over its own steps.

Recipes: Apollo = {layers: [1, 3, 6, 12], boundaries: [0.05, 0.10, 0.25], sampler: lvps,
map: interpolation}; StackBERT-style = {layers: [3, 6, 12], sampler: none, map: stack};
G_stack-style = {layers: [L/4, L], sampler: none, map: stack, optimizer_state: reset, schedule: per_stage};
late expansion (Bu, ICML 2026, arXiv 2511.04981) = {layers: [L/2 or 1, L], boundaries: [0.8], sampler: none,
map: stack, optimizer_state: mapped, schedule: global} with train.decay: wsd (configs/wsd_late_expansion.yaml).

Deviations from the authors' code, and why:
1. The stage model holds only its N(s) layers, with an optimizer over them; the authors allocate the
   full 12-layer model and one AdamW from step 0 (memory spent on layers that do not exist yet).
2. Optimizer state is a setting: the authors leave a layer's old AdamW moments in place when it receives
   another layer's weights (e.g. layer 3 <- layer 1 at 6 -> 12) and give newly used layers empty state;
   that is ``authors``, the default, because it was the best of the three on the frontier's validation
   loss (bench/frontier/run.py, 3 seeds x 3 budgets); ``mapped`` and ``first_copy`` are this project's.
3. Growth builds a new model and loads weights by name along the map (order irrelevant); the authors
   copy in place top-down. The result is the same.
4. ``stack`` is j mod N at every depth. The authors' stack map fills a partial last block with the top
   layers (N=3, D=8: 0 1 2 0 1 2 1 2, ours 0 1 2 0 1 2 0 1); the two agree whenever N divides D, e.g.
   in the stacking recipes, whose depth is always N.
5. Depths come from a counter-based hash of (seed, step, micro-batch) instead of a sequentially consumed
   Python ``random``; the authors' resume restarted the generator and re-ran every growth (overwriting
   trained layers). Here resuming at any step continues the same run. D is also clamped to [N, L] after
   the floor (guards a float product like 2.4 * 5 landing just below 12).
6. Boundaries are fractions of train.steps (the authors: epochs x floor(len(dataloader) / accum), which
   drifts when the two do not divide), and the last stage fills the FLOPs budget (equal compute).
7. Initialisation: the first stage is a fresh N(0)-layer HF model. For GPT-2, HF scales the residual
   projections' init by 1/sqrt(2 n_layer) with n_layer = N(0) (the authors' layer 0 was initialised at
   the 12-layer scale); the other families' init does not depend on depth.
8. Checkpoints are plain HF models (no Apollo class is needed to load them, unlike the authors' forward
   that requires its ``apollo_info`` argument).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from operators import (
    OperatorError,
    SharedDepth,
    depth_config,
    depth_map,
    family_of,
    grow_depth,
    map_depth_state,
    named_optimizer_state,
)
from progressive.config import ConfigError
from progressive.methods.apollo.options import SAMPLERS, ApolloConfig
from progressive.methods.base import Method, ModelChange, Phase, StepFlops, staged_phases

if TYPE_CHECKING:  # loaded where a model is built: a recipe's section is read without them (--help, --list)
    import torch
    from transformers import PretrainedConfig

LVPS_EPS, LVPS_END, LVPS_BEGIN_OFFSET, SIGMOID_SLOPE = 1e-6, 0.6, 0.4, 20.0
# Test-only: a folder where every rank appends "step micro depth" lines (depths.rank<R>.txt), like the
# authors' per-rank apollo_info logs; the DDP test checks that the ranks ran the same depths.
DEPTH_LOG_ENV = "PROGRESSIVE_APOLLO_DEPTH_LOG"

# ----------------------------------------------------------------------------------- depth sampling

_U64 = np.uint64


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 arrays (wrapping arithmetic)."""
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def uniforms(seed: int, steps: Any, micro: Any) -> np.ndarray:
    """U[0, 1) numbers, a pure function of (seed, step, micro-batch index); broadcasts steps x micro."""
    s = np.atleast_1d(np.asarray(steps, dtype=np.int64)).astype(_U64)
    i = np.atleast_1d(np.asarray(micro, dtype=np.int64)).astype(_U64)
    key = _splitmix64(np.full(1, seed % 2**64, dtype=_U64))
    h = _splitmix64(_splitmix64(key ^ s[..., None]) ^ i)
    return (h >> _U64(11)).astype(np.float64) * 2.0**-53


def _anchors(n: int, total: int) -> tuple[float, float]:
    """(a, b): the curve's values at x = eps and x = 1; r = total / n."""
    return total / n + LVPS_BEGIN_OFFSET, LVPS_END


def sample_depth(sampler: str, n: int, total: int, u: np.ndarray) -> np.ndarray:
    """Depths (ints in [n, total]) for uniforms ``u`` with ``n`` distinct layers of a ``total``-layer model."""
    u = np.asarray(u, dtype=np.float64)
    if sampler == "none":
        return np.full(u.shape, n, dtype=np.int64)
    if sampler == "constant_high":
        return np.full(u.shape, total, dtype=np.int64)
    if sampler == "uniform":
        return np.minimum(n + np.floor(u * (total - n + 1)).astype(np.int64), total)
    r, (a, b) = total / n, _anchors(n, total)
    x = LVPS_EPS + (1.0 - LVPS_EPS) * u
    if sampler == "lvps":
        shift = (b - a * LVPS_EPS) / (a - b)
        y = b * (1.0 + shift) / (x + shift)
    elif sampler == "sigmoid":
        y = (a - b) / (1.0 + np.exp(SIGMOID_SLOPE * (x - 0.5))) + b
    else:
        raise ValueError(f"unknown depth sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    return np.clip(np.floor(np.clip(y, 1.0, r) * n).astype(np.int64), n, total)


def _p_at_least(sampler: str, n: int, total: int, k: int) -> float:
    """P(depth >= k) for n < k <= total, in closed form."""
    if sampler in ("none", "constant_high"):
        return float(sampler == "constant_high")
    if sampler == "uniform":
        return (total - k + 1) / (total - n + 1)
    (a, b), c = _anchors(n, total), k / n  # depth >= k  <=>  y >= c (c in (1, r]: no clipping involved)
    if sampler == "lvps":
        shift = (b - a * LVPS_EPS) / (a - b)
        x_max = b * (1.0 + shift) / c - shift
    elif c >= a:
        x_max = -np.inf
    else:
        x_max = 0.5 + np.log((a - c) / (c - b)) / SIGMOID_SLOPE if c > b else np.inf
    return float(np.clip((x_max - LVPS_EPS) / (1.0 - LVPS_EPS), 0.0, 1.0))


def depth_probabilities(sampler: str, n: int, total: int) -> np.ndarray:
    """P(depth = k) for k = 0..total, in closed form (zero below n)."""
    at_least = np.zeros(total + 2)
    at_least[: n + 1] = 1.0
    for k in range(n + 1, total + 1):
        at_least[k] = _p_at_least(sampler, n, total, k)
    return at_least[:-1] - at_least[1:]


def expected_depth(sampler: str, n: int, total: int) -> float:
    """E[depth] in closed form."""
    p = depth_probabilities(sampler, n, total)
    return float((np.arange(total + 1) * p).sum())


# ------------------------------------------------------------------------------------------ method


class Apollo(Method):
    """Plans the stages, samples a depth per micro-batch, runs the shared layers, grows between stages."""

    name = "apollo"
    options = ApolloConfig

    def __init__(self, cfg, family):
        super().__init__(cfg, family)
        self.ap: ApolloConfig = cfg.method.apollo
        self._shared = None  # operators.SharedDepth of the current model
        self._depths: list[int] = []
        self._fields: dict[str, Any] = {}

    def depths(self, steps: Any, micro: Any, n: int) -> np.ndarray:
        """The depths micro-batches ``micro`` of ``steps`` run with ``n`` distinct layers (steps x micro)."""
        total = self.ap.layers[-1]
        return sample_depth(self.ap.sampler, n, total, uniforms(self.cfg.train.seed, steps, micro))

    def plan(self, base_config: PretrainedConfig, step_flops: StepFlops) -> list[Phase]:

        ap, t = self.ap, self.cfg.train
        try:
            spec = family_of(base_config)
            configs = [depth_config(base_config, n) for n in ap.layers]
            one, two = (step_flops(depth_config(base_config, k)) for k in (1, 2))
        except OperatorError as e:
            raise ConfigError(f"model: Apollo cannot share or grow this model's layers: {e}") from None
        depth = spec.sizes(base_config)["layers"]
        if ap.layers[-1] != depth:
            raise ConfigError(f"method.apollo.layers: the last stage must hold all {depth} layers of the model "
                              f"(model.num_layers), got {ap.layers}")
        per_layer, head = two - one, 2 * one - two
        accum = t.grad_accum

        def shared_flops(k: int, start: int, end: int) -> tuple[int, float]:
            """A shared stage's FLOPs, exactly what the trainer adds per step ((sum over micro-batches of head +
            D * layer) // accum), and its mean depth."""
            d = self.depths(np.arange(start, end), np.arange(accum), ap.layers[k])
            sums, counts = np.unique(d.sum(axis=1), return_counts=True)
            return sum(int(c) * ((accum * head + per_layer * int(s)) // accum) for s, c in zip(sums, counts)), \
                float(d.mean())

        phases, _ = staged_phases(
            t, [f"stage{k}-{n}L" for k, n in enumerate(ap.layers)], configs, ap.boundaries,
            step_flops(base_config), shared_flops, ap.schedule == "global", float(depth),
            where="method.apollo.boundaries", labels=[f"{n} layers" for n in ap.layers])
        return phases

    # ------------------------------------------------------------------------------------- per step

    def before_micro_batch(self, step: int, index: int, model: torch.nn.Module) -> int:

        k = self.phase  # one phase per stage
        n = self.ap.layers[k]
        if self._shared is None or self._shared.model is not model:
            self._shared = SharedDepth(model, self.ap.map)
        if self._shared.n != n:
            raise RuntimeError(f"apollo: step {step} is in stage {k} ({n} layers) but the model has "
                               f"{self._shared.n}; the plan and the run disagree")
        d = int(self.depths(step, index, n)[0, 0])
        self._shared.set_depth(d)
        self._depths.append(d)
        self._fields = {"stage": k, "layers": n}
        if os.environ.get(DEPTH_LOG_ENV):
            path = Path(os.environ[DEPTH_LOG_ENV]) / f"depths.rank{os.environ.get('RANK', '0')}.txt"
            with open(path, "a") as f:
                f.write(f"{step} {index} {d}\n")
        return d

    def after_step(self, step: int, model: torch.nn.Module) -> None:
        if self._shared is not None:
            self._shared.restore()  # evaluation, checkpoints and the final save see the plain model
        if self._depths:
            self._fields["depth"] = float(np.mean(self._depths))
            self._depths = []

    def log_fields(self) -> dict[str, Any]:
        """stage index, distinct layers N(s), mean depth run by the last step's micro-batches."""
        return dict(self._fields)

    # ---------------------------------------------------------------------------------- transitions

    def transition(self, index: int, phases: list[Phase], model: torch.nn.Module,
                   optimizer: torch.optim.Optimizer) -> ModelChange:
        """Grow N(s-1) -> N(s) along the map; optimizer state mapped along it, or reset."""

        if self._shared is not None:
            self._shared.restore()
            self._shared = None
        n_old, n_new, kind = self.ap.layers[index - 1], self.ap.layers[index], self.ap.map
        new = grow_depth(model, n_new, kind)
        state = None
        if self.ap.optimizer_state != "reset":
            duplicates = {"mapped": "copy", "first_copy": "fresh", "authors": "slot"}[self.ap.optimizer_state]
            state = map_depth_state(named_optimizer_state(model, optimizer), model, n_new, kind, duplicates)
        src = depth_map(n_old, n_new, kind)
        note = (f"grew {n_old} -> {n_new} layers ({kind}: layer j <- {src}), optimizer state "
                f"{self.ap.optimizer_state}")
        return ModelChange(new, state, note)


METHOD = Apollo
