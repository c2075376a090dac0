"""SDPA attention that keeps its flash kernel under ``torch.compile`` on every supported torch.

transformers hands PyTorch's ``scaled_dot_product_attention`` no mask and ``is_causal=True`` when a causal
self-attention has no padding, which lets SDPA pick its flash kernel; with a mask it cannot. Under ``torch.compile``
transformers makes that choice only when ``torch.compiler.is_exporting()`` is False while tracing, and the dynamo of
torch 2.11 folds that call to True (torch 2.13 reads the flag), so a compiled model there builds the full
[batch, 1, T, T] mask for every step. ``CAUSAL_SDPA`` is transformers' own SDPA attention registered under another
name, with a mask builder that returns no mask in exactly that case (no padding mask, the causal mask function, no
sliding window, queries and keys the same positions from 0) and defers to transformers' ``sdpa_mask`` in every other.
Not covered: a forward with ``use_cache=False`` (the operators' layer views for AutoFreeze's prefix and the
pipeline's stages, Apollo's shared depth), where transformers, unable to rule out packed sequences while tracing,
turns the skip off itself; there torch 2.11 still builds the mask. The losses are plain SDPA's
(tests/unit/model/test_compile.py checks them); only the kernel may differ. The name lives in the config object only:
a saved checkpoint's config.json does not carry it, and loads with plain SDPA anywhere.
"""

from __future__ import annotations

import inspect
from typing import Any

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import causal_mask_function, sdpa_mask

CAUSAL_SDPA = "sdpa_causal"
_SIGNATURE = inspect.signature(sdpa_mask)


def causal_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``sdpa_mask``, or None (SDPA's ``is_causal=True``) for an unpadded causal self-attention."""
    a = _SIGNATURE.bind(*args, **kwargs).arguments
    plain = (a.get("attention_mask") is None and a.get("mask_function", causal_mask_function) is causal_mask_function
             and a.get("local_size") is None and a.get("allow_is_causal_skip", True) is True
             and all(type(a.get(k, 0)) is int and a.get(k, 0) == 0 for k in ("q_offset", "kv_offset"))
             and type(a.get("q_length")) is int and a.get("q_length") == a.get("kv_length"))
    return None if plain else sdpa_mask(*args, **kwargs)


def compiled_sdpa_masks(model: Any, ids: Any) -> tuple[float, list[bool]]:
    """(the loss of ``model`` on ``ids`` as its own labels, whether each SDPA call gets a mask) when torch.compile
    traces it: dynamo only, no inductor, so a few seconds on a CPU."""
    import torch

    masks: list[bool] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> Any:
        masks.extend(n.kwargs.get("attn_mask") is not None for n in gm.graph.nodes
                     if "scaled_dot_product" in str(n.target))
        return gm.forward

    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(input_ids=ids, labels=ids).loss
    torch._dynamo.reset()
    return float(loss.detach()), masks


AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
AttentionMaskInterface.register(CAUSAL_SDPA, causal_sdpa_mask)
