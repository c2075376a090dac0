"""Freeze a prefix of a model (embeddings + its first n layers) so that it costs a forward pass only.

``freeze_prefix(model, n)``:
- every parameter of the embeddings and of layers 0..n-1 gets ``requires_grad=False``, except a word
  embedding tied to the output head: that matrix *is* the head, which keeps training (freezing it would
  freeze the head by accident, the surprise of transformers issue #8907);
- the prefix runs without autograd: a forward pre-hook on the model switches gradients off and a
  forward hook on layer n-1 restores the caller's mode. No activation of the prefix is kept for a
  backward pass, no gradient flows into it (so a tied embedding learns from the head only), and the
  first trainable layer computes no input gradient, because its input needs none;
- ``n = 0`` unfreezes nothing and installs nothing (freezing is monotone in AutoFreeze; calling it again
  with a larger n replaces the hooks).

The embeddings are the parameters registered before the first layer (transformers registers
embeddings, then layers, then final norm and head, for every supported family); the layer list is found
through the family spec. ``frozen_layers(model)`` reads n back. Nothing here is saved with the model:
``save_pretrained`` writes a plain checkpoint, and a resumed run calls ``freeze_prefix`` again.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from operators.api import head_is_tied
from operators.layouts import family_of
from operators.spec import OperatorError

_STATE = "_growtrain_frozen"  # (n, hook handles) on the model
_PAUSED = "_growtrain_freeze_paused"


def layer_list(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(dotted name, module) of the model's list of transformer layers, found through its family spec.

    Raises:
        OperatorError: unsupported family, or not exactly one layer list.
    """
    spec = family_of(model.config)
    pattern = re.compile(spec.layer_pattern)
    prefixes = {m.group(1) for name, _ in model.named_parameters() if (m := pattern.match(name))}
    if len(prefixes) != 1:
        raise OperatorError(f"{type(model).__name__}: expected one layer list matching the '{spec.name}' spec, "
                            f"found {sorted(prefixes) or 'none'}")
    name = prefixes.pop()
    return name, model.get_submodule(name)


def prefix_parameters(model: nn.Module, n: int) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the embeddings and of layers 0..n-1, in registration order."""
    name, layers = layer_list(model)
    if not 0 <= n <= len(layers):
        raise OperatorError(f"freeze: n={n} outside [0, {len(layers)}] layers")
    out = []
    for pname, p in model.named_parameters():
        if pname.startswith(name + "."):
            break  # the embeddings are registered before the layers
        out.append((pname, p))
    for i in range(n):
        out += [(f"{name}.{i}.{k}", p) for k, p in layers[i].named_parameters()]
    return out


def frozen_layers(model: nn.Module) -> int:
    """How many leading layers ``freeze_prefix`` froze (0 if none)."""
    return getattr(model, _STATE, (0, []))[0]


def freeze_prefix(model: nn.Module, n: int) -> list[str]:
    """Freeze the embeddings and layers 0..n-1 (see the module docstring); returns the frozen names.

    Raises:
        OperatorError: n outside [0, layers], or fewer than already frozen (freezing is monotone here).
    """
    done, handles = getattr(model, _STATE, (0, []))
    if n < done:
        raise OperatorError(f"freeze: {done} layers are frozen already; a prefix only grows (asked for {n})")
    for h in handles:
        h.remove()
    if n == 0:
        setattr(model, _STATE, (0, []))
        return []
    tied = head_is_tied(model)
    head = model.get_output_embeddings() if tied else None
    frozen = []
    for pname, p in prefix_parameters(model, n):
        if head is not None and p is head.weight:
            continue  # the tied embedding is the output head: it keeps training through the head
        p.requires_grad_(False)
        frozen.append(pname)
    _, layers = layer_list(model)
    previous: list[bool] = []

    def grad_off(module: nn.Module, args: tuple) -> None:
        if not getattr(model, _PAUSED, False):
            previous.append(torch.is_grad_enabled())
            torch.set_grad_enabled(False)

    def grad_back(module: nn.Module, args: tuple, output: object) -> None:
        if previous:
            torch.set_grad_enabled(previous.pop())

    handles = [model.register_forward_pre_hook(grad_off), layers[n - 1].register_forward_hook(grad_back),
               model.register_forward_hook(grad_back)]  # safety net: layer n-1 did not run
    setattr(model, _STATE, (n, handles))
    return frozen


@contextlib.contextmanager
def prefix_hooks_paused(model: nn.Module) -> Iterator[None]:
    """Inside, the frozen prefix's no-grad hooks do nothing (AutoCache runs the prefix itself, or skips it)."""
    setattr(model, _PAUSED, True)
    try:
        yield
    finally:
        setattr(model, _PAUSED, False)


class _Stop(Exception):
    def __init__(self, value: torch.Tensor):
        self.value = value


class _Served(nn.Module):
    """Stands in for layer ``start - 1``: returns the hidden states that left it (from a cache) whatever it
    is given; other attributes (e.g. Qwen2's ``attention_type``) are the real layer's. No parameters."""

    def __init__(self, layer: nn.Module, hidden: torch.Tensor):
        super().__init__()
        object.__setattr__(self, "_layer", layer)
        object.__setattr__(self, "_value", hidden)

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return self._value.to(hidden_states.device, hidden_states.dtype)

    def __getattr__(self, name: str) -> object:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "_layer"), name)


@contextlib.contextmanager
def _layers_view(model: nn.Module, start: int, stop: int, hidden: torch.Tensor | None) -> Iterator[nn.ModuleList]:
    """Temporarily make the model's layer list layers[start:stop], preceded, when ``hidden`` is given, by a
    stand-in for layer start-1 that outputs ``hidden``. The config's layer count and per-layer fields (e.g.
    Qwen2's layer_types) follow; no KV cache."""
    spec = family_of(model.config)
    name, layers = layer_list(model)
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    n = len(layers)
    first = start - 1 if hidden is not None else start
    if hidden is not None and start < 1:
        raise OperatorError("a served hidden state enters layer start >= 1")
    saved = {spec.fields.layers: getattr(model.config, spec.fields.layers)}
    for f in spec.per_layer_fields:
        values = getattr(model.config, f, None)
        if isinstance(values, (list, tuple)) and len(values) == n:
            saved[f] = values
    if hasattr(model.config, "use_cache"):
        saved["use_cache"] = model.config.use_cache
    view = ([_Served(layers[start - 1], hidden)] if hidden is not None else []) + list(layers)[start:stop]
    sub = nn.ModuleList(view)
    try:
        setattr(parent, attr, sub)
        setattr(model.config, spec.fields.layers, len(sub))
        for f in spec.per_layer_fields:
            if f in saved:
                setattr(model.config, f, list(saved[f])[first:stop])
        if "use_cache" in saved:
            model.config.use_cache = False
        yield sub
    finally:
        setattr(parent, attr, layers)
        for k, v in saved.items():
            setattr(model.config, k, v)


def layer_grad_norms(model: nn.Module, start: int = 0) -> np.ndarray:
    """The gradient norm of each transformer layer (0 for layers before ``start`` and for layers without
    gradients). Under FSDP2 each process holds shards of the gradients (DTensors): the squares of its shards
    are summed over the processes, so every process gets the whole layers' norms."""
    from torch.distributed.tensor import DTensor

    _, layers = layer_list(model)
    sq = torch.zeros(len(layers))
    group = None
    for i in range(start, len(layers)):
        parts = []
        for p in layers[i].parameters():
            if p.grad is not None:
                g = p.grad
                if isinstance(g, DTensor):
                    group, g = g.device_mesh.get_group(), g.to_local()
                parts.append(g.detach().float().pow(2).sum().cpu())
        sq[i] = torch.stack(parts).sum() if parts else 0.0
    if group is not None:
        import torch.distributed as dist

        on = "cpu" if dist.get_backend(group) == "gloo" else next(model.parameters()).device
        sq = sq.to(on)
        dist.all_reduce(sq, group=group)
    return sq.cpu().sqrt().double().numpy()


@torch.no_grad()
def prefix_output(model: nn.Module, inputs: dict, stop: int, start: int = 0,
                  hidden: torch.Tensor | None = None) -> torch.Tensor:
    """The hidden states leaving layer ``stop - 1`` (the input of layer ``stop``), computed without
    autograd: from the embeddings through layers 0..stop-1, or, given ``hidden`` (what left layer
    ``start - 1``), through layers start..stop-1 only. The model's own forward runs (masks, rotary
    position embeddings and all) and is cut off after layer ``stop - 1``; nothing after it runs."""
    return span_output(model, inputs, stop, start, hidden)


def span_output(model: nn.Module, inputs: dict, stop: int, start: int = 0,
                hidden: torch.Tensor | None = None) -> torch.Tensor:
    """``prefix_output`` with autograd as the caller has it: the output of layers start..stop-1 (fed
    ``hidden``, or the embeddings when start is 0), differentiable in ``hidden`` and in those layers'
    parameters. A pipeline stage that holds layers start..stop-1 is this call (progressive.pipeline)."""
    if stop == start and hidden is not None:
        return hidden
    with prefix_hooks_paused(model), _layers_view(model, start, stop, hidden) as sub:
        hook = sub[-1].register_forward_hook(lambda m, a, out: (_ for _ in ()).throw(_Stop(_hidden(out))))
        try:
            model(**inputs)
        except _Stop as s:
            return s.value
        finally:
            hook.remove()
    raise RuntimeError("prefix_output: the model's forward never reached its last layer")


def forward_from(model: nn.Module, inputs: dict, start: int, hidden: torch.Tensor,
                 call: Callable[..., object] | None = None) -> object:
    """The model's output when ``hidden`` is what left layer ``start - 1`` (layers before ``start`` do not
    run; the embeddings do, cheaply, and are discarded; with every layer frozen, ``start`` = the layer
    count and only the head runs). Autograd as the caller has it: the training forward of a frozen
    prefix served from a cache. ``call``: what to call instead of ``model`` (a DDP wrapper around it, so
    that gradients are still all-reduced)."""
    _, layers = layer_list(model)
    with prefix_hooks_paused(model), _layers_view(model, start, len(layers), hidden):
        return (call or model)(**inputs)


def _hidden(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output
