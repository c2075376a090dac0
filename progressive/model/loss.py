"""The language-model loss without the logits: the head's matmul and the cross-entropy, a chunk of rows at a time.

A language model's loss is ``mean_i [logsumexp_v(z_iv) - z_{i,y_i}]`` over the rows ``i`` whose label is not
ignored, with logits ``z = h W^T + b`` (``h``: the last hidden states, N x C; ``W``: the head, V x C). transformers
computes all of ``z`` (N x V, the same size at every model width: 1.65 G numbers for 32 x 1024 tokens of GPT-2's
vocabulary) and its loss upcasts it to fp32 (6.6 GB) before the log-softmax; the backward streams those tensors
again. Here ``z`` exists one chunk of rows at a time, and the gradient is taken in the same pass:

    dL/dz_iv = (softmax(z_i)_v - [v = y_i]) / n        (n: the rows that count)
    dL/dh    = (dL/dz) W,   dL/dW = (dL/dz)^T h,   dL/db = sum_i dL/dz_i

so a chunk's logits, fp32 softmax and gradient are freed before the next chunk starts, and the backward only
scales the stored ``dL/dh``, ``dL/dW``, ``dL/db`` by the incoming gradient. The matmuls are the same three that
autograd runs (the FLOPs count does not change); they run in the autocast dtype, the softmax in fp32.
Under ``torch.no_grad`` (evaluation) only the loss is computed.

``install(model, family)`` makes a model's training forward use it: the family names where its head is
(``Family.head``); the model stays a plain transformers model whose other calls (no labels, generation, saving)
are its class's own.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

__all__ = ["linear_cross_entropy", "install", "uninstall", "installed", "chunks", "CHUNK_BYTES"]

CHUNK_BYTES = 1 << 30  # a chunk's fp32 logits at most this large (1 GiB: 5,336 rows of GPT-2's 50,304 columns)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """The matmuls' dtype: the autocast dtype where autocast is on for ``h``'s device, else ``h``'s own."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return h.dtype


def _chunks(n: int, vocab: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """Equal row ranges covering ``n`` rows, each holding at most ``chunk_bytes`` of fp32 logits."""
    count = max(1, math.ceil(n * vocab * 4 / chunk_bytes))
    size = math.ceil(n / count)
    return [(lo, min(n, lo + size)) for lo in range(0, n, size)]


class _LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of ``h W^T + b`` against ``labels``, gradients taken chunk by chunk in the forward."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                ignore_index: int, chunk_bytes: int, dtype: torch.dtype) -> torch.Tensor:
        n, vocab = h.shape[0], weight.shape[0]
        keep = labels != ignore_index
        count = keep.sum()
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1] or (bias is not None and ctx.needs_input_grad[2])
        total = torch.zeros((), device=h.device, dtype=torch.float32)
        if grads:
            scale = 1.0 / count.clamp(min=1).float()
            grad_h = torch.empty_like(h)
            grad_w = torch.zeros(weight.shape, device=weight.device, dtype=torch.float32)
            grad_b = None if bias is None else torch.zeros(vocab, device=weight.device, dtype=torch.float32)
        for lo, hi in _chunks(n, vocab, chunk_bytes):
            hc = h[lo:hi].to(dtype)
            z = hc @ w.t()                                   # (rows, V) in the compute dtype
            if b is not None:
                z = z + b
            z = z.float()
            y, k = labels[lo:hi], keep[lo:hi]
            lse = torch.logsumexp(z, dim=-1)                 # (rows,)
            target = z.gather(1, y.clamp(min=0).unsqueeze(1)).squeeze(1)
            total = total + torch.where(k, lse - target, 0.0).sum()
            if grads:
                g = torch.exp(z - lse.unsqueeze(1))          # softmax, fp32
                g.scatter_add_(1, y.clamp(min=0).unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
                g = (g * (k.float() * scale).unsqueeze(1)).to(dtype)  # rows that do not count: no gradient
                grad_h[lo:hi] = (g @ w).to(h.dtype)
                grad_w += (g.t() @ hc).float()
                if grad_b is not None:
                    grad_b += g.float().sum(0)
            del z
        loss = total / count.float()  # 0/0 = nan when no row counts, as transformers' mean
        if grads:
            ctx.save_for_backward(grad_h, grad_w.to(weight.dtype),
                                  None if grad_b is None else grad_b.to(bias.dtype))
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w, grad_b = ctx.saved_tensors
        return (grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype),
                None if grad_b is None else grad_b * grad_loss.to(grad_b.dtype), None, None, None, None)


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                         ignore_index: int = -100, chunk_bytes: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of the logits ``h @ weight.T + bias`` against ``labels``, never holding more than
    ``chunk_bytes`` of them (see the module docstring).

    Args:
        h: hidden states, (N, C) (any leading shape is flattened).
        weight: the head, (V, C).
        bias: (V,) or None.
        labels: (N,) class indices; ``ignore_index`` rows do not count.
        ignore_index: the label of rows that do not count (transformers' -100).
        chunk_bytes: the most fp32 logits held at once (default ``CHUNK_BYTES``).

    Returns:
        The scalar loss (fp32), differentiable in ``h``, ``weight`` and ``bias``; nan when no row counts.
    """
    h = h.reshape(-1, h.shape[-1])
    labels = labels.reshape(-1).to(h.device)
    if h.shape[0] != labels.shape[0]:
        raise ValueError(f"linear_cross_entropy: {h.shape[0]} rows of hidden states, {labels.shape[0]} labels")
    dtype = _compute_dtype(h)
    with torch.autocast(h.device.type, enabled=False):  # the dtypes are this function's: autocast would recast
        return _LinearCrossEntropy.apply(h, weight, bias, labels, ignore_index, chunk_bytes or CHUNK_BYTES, dtype)


# ------------------------------------------------------------------------------------------ on a model


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    for part in path.split("."):
        model = getattr(model, part)
    return model


def _forward(self: torch.nn.Module, input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
             **kwargs: Any) -> Any:
    """The model's forward with the loss of ``linear_cross_entropy`` when labels are given (no logits are
    returned then); its class's own forward otherwise."""
    head = self._head_loss
    if labels is None or kwargs.get("return_dict") is False or kwargs.get("output_attentions") \
            or kwargs.get("output_hidden_states"):
        return type(self).forward(self, input_ids=input_ids, labels=labels, **kwargs)
    hidden = self.base_model(input_ids=input_ids, **kwargs)[0]      # (B, T, C), after the final norm
    if head["transform"]:
        hidden = _module(self, head["transform"])(hidden)           # BERT: dense, GELU, LayerNorm
    if head["shift"]:                                               # causal LM: position t predicts token t + 1
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    linear = _module(self, head["linear"])
    loss = linear_cross_entropy(hidden, linear.weight, linear.bias, labels)
    return (CausalLMOutput if head["shift"] else MaskedLMOutput)(loss=loss)


def install(model: torch.nn.Module, head: str, transform: str | None, shift: bool) -> torch.nn.Module:
    """Make ``model``'s forward compute its loss with ``linear_cross_entropy`` whenever it gets labels.

    Args:
        model: a transformers model with a linear head over the vocabulary.
        head: the dotted path of that linear layer (``lm_head``, ``cls.predictions.decoder``).
        transform: the dotted path of what runs between the body and the head (BERT's), or None.
        shift: labels are the inputs, shifted inside the model (causal LM); else labels are per position (MLM).

    Returns:
        ``model`` (changed in place: an instance attribute; saving, loading and its class are untouched).
    """
    model._head_loss = {"linear": head, "transform": transform, "shift": shift}
    model.forward = types.MethodType(_forward, model)
    return model


def uninstall(model: torch.nn.Module) -> torch.nn.Module:
    """Give ``model`` its class's forward back."""
    model.__dict__.pop("forward", None)
    model.__dict__.pop("_head_loss", None)
    return model


def chunks(t: Any, vocab: int, seq_len: int, processes: int = 1, compiled_whole: bool = False) -> bool:
    """Whether a run with train settings ``t`` computes its LM loss here: ``train.loss`` "chunked", or "auto" where
    the loss runs eagerly (``compiled_whole`` False: not compiled, or FSDP2's per-block compilation) and one
    micro-batch's fp32 logits (rows x ``seq_len`` x ``vocab`` x 4 bytes) exceed ``CHUNK_BYTES``, i.e. where chunking
    splits them. Where the whole model is compiled, inductor fuses transformers' upcast and log-softmax itself, and
    on an H200 the chunked loss ran slower (bench/speed/anchor.py: 4.6% at GPT-2-124M, 12% at its coarse level);
    the small CPU runs keep transformers' loss too (their numbers stay what they were)."""
    if t.loss != "auto":
        return t.loss == "chunked"
    rows = max(1, t.batch_size // max(1, processes) // t.grad_accum)
    return not compiled_whole and rows * seq_len * vocab * 4 > CHUNK_BYTES


def installed(model: torch.nn.Module) -> bool:
    """Whether ``model``'s loss is ``linear_cross_entropy``'s."""
    return "_head_loss" in model.__dict__
