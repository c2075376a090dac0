"""Depth by weight sharing and growth by copying layers: the model surgery of Apollo and of stacking.

A model with N distinct layers runs as a D-layer network (D >= N) when position j = 0..D-1 applies the
stored layer ``depth_map(N, D, kind)[j]``:

    interpolation   idx(j) = floor(j * N / D)   each layer repeated over a contiguous block (Apollo:
                                                N=3, D=8 -> 0 0 0 1 1 1 2 2)
    stack           idx(j) = j mod N            the whole stack repeated (StackBERT, G_stack:
                                                N=3, D=8 -> 0 1 2 0 1 2 0 1)

Both maps use every stored layer when D >= N, so every parameter receives a gradient (DDP needs no
``find_unused_parameters``), and the gradients of a layer's repeats add up on its parameters, because
the repeats are the same modules.

Growth from N to N' layers builds a plain model of N' layers whose layer j is a copy of stored layer
``depth_map(N, N', kind)[j]``. It therefore computes exactly the function the shared model computed at
depth D = N' with the same map (``tests/unit/methods/test_apollo.py`` checks this for every family). The optimizer
state follows the same copy map (``map_depth_state``).

Everything is written once against the family specs (``operators.layouts``): the layer list is found
through ``FamilySpec.layer_pattern`` and the depth config field is ``FamilySpec.fields.layers``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from operators.api import _canonical_state, build_like
from operators.layouts import family_of
from operators.spec import FamilySpec, OperatorError

MAPS = ("interpolation", "stack")  # the named maps; any other is given as data (the source layer of each position)
Map = str | Sequence[int]


def depth_map(n: int, depth: int, kind: Map = "interpolation") -> list[int]:
    """The stored layer each of ``depth`` positions applies, for ``n`` distinct layers.

    Args:
        n: distinct layers (>= 1).
        depth: positions (>= n).
        kind: "interpolation" (floor(j * n / depth)), "stack" (j mod n), or the map itself as data: ``depth``
            layer indices, each in 0..n-1, every stored layer at least once (e.g. [0, 1, 1, 2], a copy of the
            middle layer inserted: the surgery works on any such map).

    Raises:
        OperatorError: an unknown name, a map that is not ``depth`` indices covering 0..n-1, or depth < n (some
            layer would never run).
    """
    if n < 1 or depth < n:
        raise OperatorError(f"depth map needs 1 <= n <= depth; got n={n}, depth={depth}")
    if not isinstance(kind, str):
        src = list(kind)
        if (len(src) != depth or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in src)
                or set(src) != set(range(n))):
            raise OperatorError(f"a depth map given as data is {depth} layer indices in 0..{n - 1}, each stored layer "
                                f"at least once (every parameter must run); got {src}")
        return src
    if kind not in MAPS:
        raise OperatorError(f"depth map must be one of {MAPS} or a list of layer indices; got {kind!r}")
    if kind == "stack":
        return [j % n for j in range(depth)]
    return [j * n // depth for j in range(depth)]  # integer floor: no float rounding at block edges


def check_depth_sharing(config: Any) -> FamilySpec:
    """Refuse configs whose layers depend on their index (a moved or repeated layer would compute
    something else); returns the family spec.

    Raises:
        OperatorError: unsupported family, or a layer-index flag (GPT-2's scale_attn_by_inverse_layer_idx).
    """
    spec = family_of(config)
    for flag in spec.fields.layer_index_flags:
        if getattr(config, flag, False):
            raise OperatorError(f"{type(config).__name__}.{flag}=True makes every layer depend on its index, so "
                                "layers cannot be shared or copied to other positions; turn it off")
    return spec


def depth_config(config: Any, n: int, source: list[int] | None = None) -> Any:
    """A copy of ``config`` with ``n`` layers. Per-layer lists (e.g. Qwen2's layer_types) follow
    ``source`` (new layer j <- old layer source[j]); without it, evenly spaced entries are taken."""
    spec = check_depth_sharing(config)
    old_n = spec.sizes(config)["layers"]
    new = copy.deepcopy(config)
    setattr(new, spec.fields.layers, n)
    for name in spec.per_layer_fields:
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == old_n:
            src = source if source is not None else [j * old_n // n for j in range(n)]
            setattr(new, name, [values[i] for i in src])
    return new


def _layer_prefix(model: nn.Module, spec: FamilySpec) -> str:
    """The dotted name of the model's layer list ("transformer.h", "bert.encoder.layer", ...)."""
    pattern = re.compile(spec.layer_pattern)
    prefixes = {m.group(1) for name, _ in model.named_parameters() if (m := pattern.match(name))}
    if len(prefixes) != 1:
        raise OperatorError(f"{type(model).__name__}: expected one layer list matching the '{spec.name}' spec, "
                            f"found {sorted(prefixes) or 'none'}")
    return prefixes.pop()


class SharedDepth:
    """Runs a model's N distinct layers as a deeper network, reversibly, by swapping its layer list.

    ``set_depth(D)`` installs a ModuleList of D entries (the same modules, repeated along the map) and
    sets the config's layer count to D (Llama-style models slice their layer list by it), its per-layer
    lists along the map (Qwen2 reads ``layer_types`` by position) and ``use_cache`` to False (repeats
    share a layer index, so a KV cache would mix their keys).
    ``restore()`` puts the plain N-layer list and the config values back: evaluation, checkpoints and
    ``save_pretrained`` must only ever see the plain model.
    """

    def __init__(self, model: nn.Module, kind: Map = "interpolation"):
        if isinstance(kind, str) and kind not in MAPS:
            raise OperatorError(f"depth map must be one of {MAPS} or a list of layer indices; got {kind!r}")
        self.model, self.kind = model, kind
        self.spec = check_depth_sharing(model.config)
        parent, _, self.attr = _layer_prefix(model, self.spec).rpartition(".")
        self.parent = model.get_submodule(parent)
        self.plain: nn.ModuleList = getattr(self.parent, self.attr)
        self.n = len(self.plain)
        self._config = {self.spec.fields.layers: getattr(model.config, self.spec.fields.layers)}
        for name in self.spec.per_layer_fields:  # read by position in some forwards (Qwen2's layer_types)
            values = getattr(model.config, name, None)
            if isinstance(values, (list, tuple)) and len(values) == self.n:
                self._config[name] = values
        if hasattr(model.config, "use_cache"):
            self._config["use_cache"] = model.config.use_cache
        self.depth = self.n

    def set_depth(self, depth: int) -> None:
        """Run ``depth`` layer applications from now on (``depth == n``: the plain model)."""
        if depth == self.n:
            self.restore()
            return
        src = depth_map(self.n, depth, self.kind)
        setattr(self.parent, self.attr, nn.ModuleList([self.plain[i] for i in src]))
        setattr(self.model.config, self.spec.fields.layers, depth)
        for name in self.spec.per_layer_fields:
            if name in self._config:
                setattr(self.model.config, name, [self._config[name][i] for i in src])
        if "use_cache" in self._config:
            self.model.config.use_cache = False
        self.depth = depth

    def restore(self) -> None:
        """The plain model again (a no-op when it already is)."""
        if self.depth == self.n:
            return
        setattr(self.parent, self.attr, self.plain)
        for k, v in self._config.items():
            setattr(self.model.config, k, v)
        self.depth = self.n


def _layer_name(name: str, pattern: re.Pattern, n_new: int, src: list[int]) -> list[tuple[str, str]]:
    """[(target name, source name)] for one state entry: a layer entry fans out along ``src``."""
    m = pattern.match(name)
    if not m:
        return [(name, name)]
    i = int(m.group(2))
    return [(f"{m.group(1)}.{j}.{m.group(3)}", name) for j in range(n_new) if src[j] == i]


def grow_depth(model: nn.Module, n_new: int, kind: Map = "interpolation") -> nn.Module:
    """A plain model of the same class with ``n_new`` layers; layer j is a copy of layer
    ``depth_map(n, n_new, kind)[j]`` (copies, never aliases), everything else is copied by name.
    The input is not modified. The result computes what ``SharedDepth(model, kind).set_depth(n_new)``
    computes, and keeps requires_grad, tied heads and the training mode.

    Raises:
        OperatorError: unsupported family, a layer-index flag, or n_new < the model's layer count.
    """
    spec = check_depth_sharing(model.config)
    n = spec.sizes(model.config)["layers"]
    src = depth_map(n, n_new, kind)
    pattern = re.compile(spec.layer_pattern)
    state, aliases = _canonical_state(model)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    new_state, trainable = {}, {}
    for name, t in state.items():
        for target, source in _layer_name(name, pattern, n_new, src):
            new_state[target] = t.detach().clone()
            trainable[target] = flags.get(source, True)
    new_aliases = {}
    for alias, canon in aliases.items():  # tied weights live outside the layers (embedding / head)
        new_aliases.update({a: c for (a, _), (c, _) in zip(_layer_name(alias, pattern, n_new, src),
                                                         _layer_name(canon, pattern, n_new, src))})
    return build_like(model, depth_config(model.config, n_new, src), new_state, new_aliases, trainable)


DUPLICATES = ("copy", "fresh", "slot")


def map_depth_state(state: dict[str, dict[str, Any]], model: nn.Module, n_new: int,
                    kind: Map = "interpolation", duplicates: str = "copy") -> dict[str, dict[str, Any]]:
    """Carry name-keyed optimizer state (``operators.named_optimizer_state``) of ``model`` along the copy
    map of ``grow_depth(model, n_new, kind)``. The first copy of a layer (the lowest position that copies
    it) gets that layer's state (moments unchanged, step count kept); ``duplicates`` says what the other
    copies get: "copy" (the same state) or "fresh" (none: the optimizer starts them at step 0). "slot" is
    the Apollo authors' rule, which ignores the map: position j keeps the state position j had (whatever
    weights the map copies into it), positions past the old depth start with none. Parameters outside the
    layers keep theirs.

    Raises:
        OperatorError: an unknown ``duplicates``, or as ``depth_map``.
    """
    if duplicates not in DUPLICATES:
        raise OperatorError(f"duplicates must be one of {DUPLICATES}; got {duplicates!r}")
    spec = check_depth_sharing(model.config)
    n = spec.sizes(model.config)["layers"]
    src = depth_map(n, n_new, kind)
    first = {i: src.index(i) for i in range(n)}
    pattern = re.compile(spec.layer_pattern)
    out: dict[str, dict[str, Any]] = {}
    if duplicates == "slot":  # a layer's state stays at its index; n_new > n, so every old index exists
        return {name: {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
                for name, st in state.items()}
    for name, st in state.items():
        m = pattern.match(name)
        for target, _ in _layer_name(name, pattern, n_new, src):
            j = int(pattern.match(target).group(2)) if m else None
            if m and duplicates == "fresh" and j != first[int(m.group(2))]:
                continue
            out[target] = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
    return out
