"""Pipeline stages built by hand from a Hugging Face model: a stage is the model's own forward over a slice of
its layer list, so one code path serves GPT-2, BERT, ViT/DeiT and Llama-style models (no per-family code).

Why by hand: torch.distributed.pipelining's tracer (``pipeline(module, ...)``) fails on HF models that use
RoPE, and a traced graph could not be re-cut when AutoPipe re-partitions anyway. A ``StageModule`` holds
the whole HF model object, of which only its slice is materialised:

    stage s of K over the active layers [F, L), with boundaries F = b_0 < b_1 < ... < b_K = L:
        forward(h, **batch) = the model's forward run over layers b_s .. b_{s+1}-1 (operators.freeze's
        layer-list view), fed h (what left layer b_s - 1) and cut off after layer b_{s+1} - 1;
        stage 0 with F = 0 has no h: it runs the embeddings itself;
        the last stage runs on through the final norm and the head and returns the HF loss (labels are in
        ``batch``), a scalar per micro-batch.

What a rank holds (``Holding``): stage 0 the embeddings and the frozen prefix (layers 0..F-1, run without autograd
outside the pipeline or served from AutoCache, see runtime.py) besides its active layers; the last stage the final
norm and head; every other parameter is replaced by a meta tensor (no memory). The embeddings of a stage other than
the first are *hollow*: their forward runs on the meta device (shapes only) and returns zeros of the right shape on
the real device, which the served hidden state then replaces. The model's forward still needs them to build masks and
position ids from the batch, which every stage receives as keyword arguments (the global batch of a step is a pure
function of (seed, step), so no rank sends inputs to another).

Parameter names are the HF model's own fully qualified names (FQNs): state moves between ranks, checkpoints
and optimizers by FQN (progressive.pipeline.transfer), whatever the layout.

A tied input embedding / output head would live on the first and the last stage at once; it is refused
(progressive.pipeline.checks.check_config).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from operators.freeze import forward_from, layer_list, prefix_parameters, span_output


def parameter_groups(model: nn.Module) -> tuple[list[str], list[list[str]], list[str]]:
    """(embedding FQNs, per-layer FQNs [L lists], head FQNs) of an HF model: the embeddings are the
    parameters registered before the layer list, the head (final norm, pooler, classifier, LM head) those
    after it (operators.freeze.prefix_parameters uses the same rule)."""
    name, layers = layer_list(model)
    embed = [n for n, _ in prefix_parameters(model, 0)]
    per_layer = [[f"{name}.{i}.{k}" for k, _ in layers[i].named_parameters()] for i in range(len(layers))]
    taken = set(embed).union(*map(set, per_layer))
    head = [n for n, _ in model.named_parameters() if n not in taken]
    return embed, per_layer, head


@dataclass(frozen=True)
class Holding:
    """What one stage holds: ``keep`` all materialised FQNs, ``train`` those that get gradients and AdamW
    state (a subset of keep), ``first`` / ``last`` its position, ``start``/``stop`` its active layers."""

    keep: frozenset[str]
    train: frozenset[str]
    start: int
    stop: int
    first: bool
    last: bool


def holding(groups: tuple[list[str], list[list[str]], list[str]], frozen: int, bounds: tuple[int, ...],
            stage: int) -> Holding:
    """What stage ``stage`` of the partition ``bounds`` (frozen = bounds[0] < ... < bounds[-1] = L) holds."""
    embed, per_layer, head = groups
    k = len(bounds) - 1
    start, stop = bounds[stage], bounds[stage + 1]
    first, last = stage == 0, stage == k - 1
    active = [n for i in range(start, stop) for n in per_layer[i]]
    keep, train = set(active), set(active)
    if first:
        keep |= set(embed) | {n for i in range(frozen) for n in per_layer[i]}
        if frozen == 0:
            train |= set(embed)
    if last:
        keep |= set(head)
        train |= set(head)
    return Holding(frozenset(keep), frozenset(train), start, stop, first, last)


# ------------------------------------------------------------------------------------- hollow embeddings


def embedding_modules(model: nn.Module) -> list[str]:
    """Names of the smallest set of submodules that hold exactly the embedding parameters (e.g. GPT-2's
    ``transformer.wte`` and ``transformer.wpe``, BERT's ``bert.embeddings``, ViT's ``vit.embeddings``)."""
    embed = set(parameter_groups(model)[0])
    owners = {n: {p for p, _ in m.named_parameters(prefix=n)} for n, m in model.named_modules() if n}
    out: list[str] = []
    for n in sorted(owners, key=lambda s: s.count(".")):
        if owners[n] and owners[n] <= embed and not any(n.startswith(o + ".") for o in out):
            out.append(n)
    return out


def _map(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(v, fn) for v in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _hollow_forward(module: nn.Module):
    run = type(module).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        device = next((t.device for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)),
                      torch.device("cpu"))
        real = []  # parameters and buffers still real (a hollow module mixing devices would fail in torch.cat)
        for mod in module.modules():
            for store in (mod._parameters, mod._buffers):
                for name, t in store.items():
                    if t is not None and t.device.type != "meta":
                        real.append((store, name, t))
                        store[name] = t.detach().to("meta")
        try:
            out = run(module, *_map(args, lambda t: t.to("meta")), **_map(kwargs, lambda t: t.to("meta")))
        finally:
            for store, name, t in real:
                store[name] = t
        return _map(out, lambda t: torch.zeros(t.shape, dtype=t.dtype, device=device))

    return forward


def set_hollow(model: nn.Module, hollow: bool) -> None:
    """Make the embedding modules hollow (forward on the meta device, zeros out) or real again."""
    for name in embedding_modules(model):
        module = model.get_submodule(name)
        if hollow:
            module.forward = _hollow_forward(module)  # an instance attribute: nn.Module.__call__ finds it first
        elif "forward" in module.__dict__:
            del module.forward


# ------------------------------------------------------------------------------- materialising slices


def _owner(model: nn.Module, fqn: str) -> tuple[nn.Module, str]:
    mod, _, leaf = fqn.rpartition(".")
    return (model.get_submodule(mod) if mod else model), leaf


def materialise(model: nn.Module, tensors: dict[str, torch.Tensor], keep: Iterable[str], train: Iterable[str],
                device: torch.device) -> None:
    """Give ``model`` real parameters for ``keep`` (taken from ``tensors`` when given there, else the ones it
    has), meta tensors for every other parameter; ``requires_grad`` exactly for ``train``.

    Raises:
        KeyError: a kept parameter is neither in ``tensors`` nor real already.
    """
    keep, train = set(keep), set(train)
    aliases: dict[int, list[str]] = {}  # a parameter registered under several names (tied) stays one
    for fqn, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(fqn)
    for fqn, p in list(model.named_parameters()):
        if fqn in keep:
            value = tensors.get(fqn)
            if value is None:
                if p.device.type == "meta":
                    raise KeyError(f"{fqn}: needed by this stage but neither sent nor held")
                value = p.data
            new = nn.Parameter(value.to(device), requires_grad=fqn in train)
        elif p.device.type != "meta":
            new = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
        else:
            continue
        for name in aliases[id(p)]:
            owner, leaf = _owner(model, name)
            owner._parameters[leaf] = new


def held(model: nn.Module) -> dict[str, torch.Tensor]:
    """{FQN: tensor} of the parameters this rank has materialised."""
    return {n: p.detach() for n, p in model.named_parameters() if p.device.type != "meta"}


class StageModule(nn.Module):
    """One pipeline stage over an HF model whose slice is materialised (see the module docstring).

    ``forward(*h, **batch)``: ``h`` is empty for stage 0 with nothing frozen (it embeds ``batch`` itself),
    else the hidden states that left layer ``start - 1``. Returns those that leave layer ``stop - 1``, or,
    on the last stage, the HF loss of the micro-batch. In eval mode with ``count_correct`` (classification)
    the last stage also appends the micro-batch's count of correct predictions to ``self.correct`` (a list:
    the first run of a schedule also makes a shape-inference forward on uninitialised inputs, whose count the
    caller must leave out).
    """

    def __init__(self, model: nn.Module, h: Holding, count_correct: bool = False):
        super().__init__()
        self.model, self.start, self.stop, self.first, self.last = model, h.start, h.stop, h.first, h.last
        self.count_correct = count_correct
        self.correct: list[int] = []

    def forward(self, *hidden: torch.Tensor, **batch: torch.Tensor) -> torch.Tensor:
        h = hidden[0] if hidden else None
        if not self.last:
            return span_output(self.model, batch, self.stop, self.start, h)
        out = self.model(**batch) if h is None else forward_from(self.model, batch, self.start, h)
        if self.count_correct and not self.training:
            self.correct.append(int((out.logits.argmax(-1) == batch["labels"]).sum()))
        return out.loss
