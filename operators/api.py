"""The three operators on Hugging Face models: coalesce, de-coalesce, interpolate.

Each returns a new model of the same class with a derived config; the input is never modified
(unless ``interpolate(..., inplace=True)``). The new model is built on the meta device and its
tensors are assigned directly, so no random initialisation is spent on weights that are overwritten.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from operators.layouts import family_of
from operators.maps import WEIGHT
from operators.spec import (
    DEFAULT_SPLIT_NOISE,
    FamilySpec,
    OperatorError,
    check_factors,
    check_split,
    resize_config,
    validate_sizes,
)
from operators.transform import Resize, layer_index_map, map_named_tensors, source_name


def head_is_tied(model: nn.Module) -> bool:
    """True when the model's output head shares its weight with the input embedding."""
    get_out = getattr(model, "get_output_embeddings", None)
    get_in = getattr(model, "get_input_embeddings", None)
    if get_out is None or get_in is None:
        return False
    out, inp = get_out(), get_in()
    return out is not None and inp is not None and out.weight is inp.weight


def _canonical_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """State dict without aliases (tied tensors appear once), plus {alias name: canonical name}."""
    seen: dict[tuple[int, int], str] = {}
    canon, aliases = {}, {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen and t.numel() > 0:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            canon[name] = t
    return canon, aliases


def _remap_layer_fields(spec: FamilySpec, old_cfg: Any, new_cfg: Any, r: Resize) -> None:
    """Re-index per-layer config lists (e.g. Qwen2's layer_types) with the depth map."""
    if r.depth == 1:
        return
    n = spec.sizes(old_cfg)["layers"]
    for fname in spec.per_layer_fields:
        values = getattr(old_cfg, fname, None)
        if isinstance(values, (list, tuple)) and len(values) == n:
            setattr(new_cfg, fname, [values[src[0]] for src in layer_index_map(n, r)])


def build_like(model: nn.Module, config: Any, state: dict[str, torch.Tensor],
               aliases: dict[str, str], trainable: dict[str, bool] | None = None) -> nn.Module:
    """Instantiate ``type(model)(config)`` on the meta device and assign ``state`` to it.

    Non-persistent buffers (RoPE frequencies, position ids) are copied from ``model``: their shapes do
    not depend on the widths the operators change. Tied weights are re-tied. ``trainable`` gives each
    parameter's requires_grad (frozen parameters stay frozen); missing names default to True.

    Raises:
        OperatorError: the new model does not accept the mapped tensors (a config field the family spec
            does not cover), or a buffer's shape differs between the two models.
    """
    with torch.device("meta"):
        new = type(model)(config)
    full = dict(state)
    full.update({a: state[c] for a, c in aliases.items()})
    try:
        new.load_state_dict(full, strict=True, assign=True)
    except RuntimeError as e:
        raise OperatorError(f"the resized {type(model).__name__} does not accept the mapped weights (a config "
                            f"field the spec in operators/layouts.py does not cover?): {e}") from None
    for name, p in new.named_parameters():
        p.requires_grad_((trainable or {}).get(name, True))
    old_buffers = dict(model.named_buffers())
    for name, buf in list(new.named_buffers()):
        if not buf.is_meta:
            continue
        src = old_buffers.get(name)
        if src is None or src.shape != buf.shape:
            raise OperatorError(f"cannot materialise buffer '{name}' of the new model from the old one")
        mod_name, _, attr = name.rpartition(".")
        new.get_submodule(mod_name)._buffers[attr] = src.clone()
    if aliases and hasattr(new, "tie_weights"):
        new.tie_weights()
    if hasattr(model, "generation_config") and getattr(model, "generation_config", None) is not None:
        new.generation_config = copy.deepcopy(model.generation_config)
    new.train(model.training)
    return new


def _check_depth_config(spec: FamilySpec, config: Any, depth: int, direction: str, depth_pairing: str) -> None:
    """Refuse depth changes the config cannot express: per-layer settings that differ inside a merged
    group (e.g. a full-attention and a sliding-window layer), or layers that depend on their index."""
    cls = type(config).__name__
    for flag in spec.fields.layer_index_flags:
        if getattr(config, flag, False):
            raise OperatorError(f"{cls}.{flag}=True makes every layer depend on its index, so a depth change "
                                f"would change what the moved layers compute; use depth=1 or turn it off")
    if direction != "coalesce":
        return
    n = spec.sizes(config)["layers"]
    for fname in spec.per_layer_fields:
        values = getattr(config, fname, None)
        if not isinstance(values, (list, tuple)) or len(values) != n:
            continue
        r = Resize(direction, 1, depth, depth_pairing=depth_pairing)
        for group in layer_index_map(n, r):
            kinds = {values[i] for i in group}
            if len(kinds) > 1:
                other = "stride" if depth_pairing == "adjacent" else "adjacent"
                raise OperatorError(f"{cls}.{fname}: depth_pairing '{depth_pairing}' would merge layers {group} "
                                    f"of different kinds {sorted(kinds)}; try depth_pairing '{other}'")


def validate_resize(config: Any, width: int = 2, depth: int = 1, direction: str = "coalesce",
                    pairing: str = "stride", depth_pairing: str = "adjacent",
                    depth_mode: str = "copy", width_split: str = "symmetric",
                    split_noise: float = DEFAULT_SPLIT_NOISE, seed: int = 0) -> FamilySpec:
    """Check a resize request against a config alone (no weights), e.g. before any data loads.

    Returns:
        The family spec of ``config``.

    Raises:
        OperatorError: unsupported family, a factor that does not divide a size (naming the config
            field), an unknown pairing, mode or width split, a bad split_noise or seed, or depth mode
            "identity" on a post-LN family.
    """
    check_factors(width, depth, pairing, depth_pairing, depth_mode)
    check_split(width_split, split_noise, seed)
    spec = family_of(config)
    validate_sizes(spec, config, width, depth, direction)
    if depth > 1:
        _check_depth_config(spec, config, depth, direction, depth_pairing)
    if direction == "decoalesce" and depth > 1 and depth_mode == "identity" and not spec.pre_ln:
        raise OperatorError(
            f"depth_mode 'identity' needs a pre-LN family; '{spec.name}' is post-LN, where a zeroed "
            f"residual branch still re-normalises (LayerNorm(x) != x), so the grown model would not "
            f"compute the small model's function. Use depth_mode 'copy'."
        )
    return spec


def resized_config(config: Any, width: int = 2, depth: int = 1, direction: str = "coalesce",
                   depth_pairing: str = "adjacent") -> Any:
    """The config of the model that ``coalesce``/``decoalesce`` would return, without touching weights.

    Raises:
        OperatorError: as ``validate_resize``.
    """
    spec = validate_resize(config, width, depth, direction, depth_pairing=depth_pairing)
    new = resize_config(spec, config, width, depth, direction)
    _remap_layer_fields(spec, config, new, Resize(direction, width, depth, depth_pairing=depth_pairing))
    return new


def _resize(model: nn.Module, r: Resize) -> nn.Module:
    spec = family_of(model)
    validate_resize(model.config, r.width, r.depth, r.direction, r.pairing, r.depth_pairing, r.depth_mode,
                    r.width_split, r.split_noise, r.seed)
    state, aliases = _canonical_state(model)
    sizes = spec.sizes(model.config)
    new_state = map_named_tensors(state, spec, sizes, r, WEIGHT, head_is_tied(model))
    new_cfg = resize_config(spec, model.config, r.width, r.depth, r.direction)
    _remap_layer_fields(spec, model.config, new_cfg, r)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    trainable = {n: flags.get(source_name(n, spec, r, sizes["layers"]), True) for n in new_state}
    return build_like(model, new_cfg, new_state, aliases, trainable)


def coalesce(model: nn.Module, width: int = 2, depth: int = 1, pairing: str = "stride",
             depth_pairing: str = "adjacent") -> nn.Module:
    """Merge heads/neurons in groups of ``width`` and layers in groups of ``depth`` (a smaller model).

    Args:
        model: a supported transformers model (see ``operators.supported_classes()``).
        width: width factor k (hidden, heads, kv heads and FFN all divide by it; head_dim is kept).
        depth: depth factor (number of layers divides by it).
        pairing: "stride" (unit i merges with i + n/k, the paper's default) or "adjacent" (k*i ... k*i+k-1).
        depth_pairing: "adjacent" (layers 2i, 2i+1: the paper's) or "stride" (i, i + L/2).

    Returns:
        A new model of the same class with the derived config.

    Raises:
        OperatorError: unsupported class, or a factor that does not divide a size.
    """
    return _resize(model, Resize("coalesce", width, depth, pairing, depth_pairing))


def decoalesce(model: nn.Module, width: int = 2, depth: int = 1, pairing: str = "stride",
               depth_pairing: str = "adjacent", depth_mode: str = "copy", width_split: str = "symmetric",
               split_noise: float = DEFAULT_SPLIT_NOISE, seed: int = 0) -> nn.Module:
    """Map a small model back to the large shape (the normalised transposes of ``coalesce``).

    Width de-coalescing duplicates heads/neurons and splits the weights that read them (in axes)
    between the k copies; for a tied head the 1/k goes on the last norm before the head, so the
    function is preserved exactly. ``depth_mode="copy"`` copies each small layer into its group (the
    paper's choice; not function preserving); ``"identity"`` keeps one copy and makes the others
    identities (pre-LN families only).

    Args:
        model, width, depth, pairing, depth_pairing: as for ``coalesce``.
        depth_mode: "copy" or "identity" (see above).
        width_split: "symmetric" (W/k per copy: the copies stay identical under training) or
            "asymmetric" (W/k + N_j with sum_j N_j = 0: still exact, but the copies diverge; LEMON's
            symmetry breaking). A tied head cannot be split asymmetrically and stays exact as before.
            See ``operators.maps`` for the math.
        split_noise: asymmetric only: the std of N_j in units of the std of the split tensor (W/k),
            per tensor.
        seed: asymmetric only: seeds the noise (with each parameter's name), so runs are reproducible.

    Returns:
        A new model of the same class with the derived config.

    Raises:
        OperatorError: unsupported class, unknown mode/pairing/width_split, a bad split_noise or seed,
            or "identity" on a post-LN family.
    """
    check_split(width_split, split_noise, seed)
    return _resize(model, Resize("decoalesce", width, depth, pairing, depth_pairing, depth_mode, width_split,
                                 float(split_noise), int(seed)))


def interpolate(base: nn.Module, other: nn.Module, alpha: float, inplace: bool = False) -> nn.Module:
    """Return (1 - alpha) * base + alpha * other, parameter by parameter (matched by name).

    In the V-cycle ``base`` is the large model as it was before coalescing and ``other`` the
    de-coalesced small model. alpha = 0 returns ``base``'s weights and alpha = 1 ``other``'s, exactly.

    Raises:
        OperatorError: alpha outside [0, 1], different classes, or parameters whose names or shapes
            differ (the first mismatch is named).
    """
    try:
        alpha = float(alpha)  # also numpy scalars and 0-dim tensors
    except (TypeError, ValueError):
        raise OperatorError(f"alpha must be a number in [0, 1]; got {alpha!r}") from None
    if not 0.0 <= alpha <= 1.0:  # False for NaN too
        raise OperatorError(f"alpha must be in [0, 1]; got {alpha!r}")
    if type(base) is not type(other):
        raise OperatorError(f"cannot interpolate a {type(base).__name__} with a {type(other).__name__}")
    a_state, aliases = _canonical_state(base)
    b_state = other.state_dict()
    for name in [*a_state, *(n for n in b_state if n not in a_state)]:  # model order: first mismatch
        if name in aliases:
            continue
        if name not in a_state or name not in b_state:
            which = "first" if name not in a_state else "second"
            raise OperatorError(f"parameter '{name}' is missing from the {which} model of the interpolation")
        if a_state[name].shape != b_state[name].shape:
            raise OperatorError(f"shape mismatch for '{name}': {tuple(a_state[name].shape)} vs "
                                f"{tuple(b_state[name].shape)}; de-coalesce the smaller model first")
    with torch.no_grad():
        if inplace:
            for name, t in a_state.items():
                t.lerp_(b_state[name].to(t.device, t.dtype), alpha)
            return base
        mixed = {n: torch.lerp(t, b_state[n].to(t.device, t.dtype), alpha) for n, t in a_state.items()}
    trainable = {n: p.requires_grad for n, p in base.named_parameters()}
    return build_like(base, copy.deepcopy(base.config), mixed, aliases, trainable)
