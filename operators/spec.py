"""Declarative family specs: for every parameter, which axis lives in which width space.

A *width space* is a residual-stream or inner dimension that coalescing shrinks by the width factor k:

- ``hidden``   the residual width d (neurons, unit size 1);
- ``heads``    query heads x head_dim (whole heads merge; head_dim is never changed, so the attention
               scale 1/sqrt(head_dim) and RoPE stay valid);
- ``kv_heads`` key/value heads x head_dim (GQA/MQA; equals ``heads`` for multi-head attention);
- ``ffn``      the feed-forward inner width (neurons, unit size 1).

An axis is *out* when the tensor produces activations along it (rows of an nn.Linear weight, biases,
norm weights, embedding columns) and *in* when it consumes them (columns of an nn.Linear weight).
GPT-2's fused ``c_attn`` uses ``chunks=3`` (q|k|v concatenated). A family spec is pure data: the maps
themselves are written once, in ``operators.maps`` and ``operators.transform``.
"""

from __future__ import annotations

import copy
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

from operators.maps import ASYMMETRIC, SYMMETRIC

OUT, IN = "out", "in"
SPACES = ("hidden", "heads", "kv_heads", "ffn")
PAIRINGS = ("stride", "adjacent")
DEPTH_MODES = ("copy", "identity")
WIDTH_SPLITS = (SYMMETRIC, ASYMMETRIC)
DEFAULT_SPLIT_NOISE = 0.1  # asymmetric split: noise std / std of the split weight (see operators.maps)


class OperatorError(ValueError):
    """A resize, interpolation or checkpoint request that cannot be carried out (raised before any output)."""


@dataclass(frozen=True)
class Axis:
    """One tensor axis that lives in a width space.

    Attributes:
        space: one of SPACES.
        side: OUT (produces activations: duplicated/averaged) or IN (consumes them: split/summed).
        chunks: how many copies of the space are concatenated along the axis (3 for a fused q|k|v).
    """

    space: str
    side: str
    chunks: int = 1


H_OUT, H_IN = Axis("hidden", OUT), Axis("hidden", IN)
Q_OUT, Q_IN = Axis("heads", OUT), Axis("heads", IN)
KV_OUT = Axis("kv_heads", OUT)
F_OUT, F_IN = Axis("ffn", OUT), Axis("ffn", IN)
QKV_OUT = Axis("heads", OUT, chunks=3)


@dataclass(frozen=True)
class Rule:
    """How one kind of parameter maps: ``pattern`` is searched against the full parameter name (anchored
    at the end); ``axes`` gives one entry per tensor dimension (None = untouched, e.g. vocabulary).

    Attributes:
        residual_out: the tensor writes into the residual stream (zeroed for depth mode "identity").
        head_norm: the last norm before a tied output head; carries the 1/k that keeps a tied
            (duplicated) embedding exact.
    """

    pattern: str
    axes: tuple[Axis | None, ...]
    residual_out: bool = False
    head_norm: bool = False

    def matches(self, name: str) -> bool:
        return re.search(f"(?:^|\\.)(?:{self.pattern})$", name) is not None


@dataclass(frozen=True)
class ConfigFields:
    """Names of the config attributes that carry each size (None: the family has no such field)."""

    hidden: str
    heads: str
    layers: str
    ffn: str
    kv_heads: str | None = None
    ffn_default_ratio: int | None = None  # GPT-2's n_inner=None means 4 * n_embd
    follow_hidden: tuple[str, ...] = ()  # other size fields that equal the hidden size (ViT's pooler_output_size)
    layer_index_flags: tuple[str, ...] = ()  # flags that make a layer depend on its index (no depth change)


@dataclass(frozen=True)
class FamilySpec:
    """Everything the operators need to know about one model family.

    Attributes:
        name: short family name ("gpt2", "bert", "vit", "llama").
        model_types: config.model_type values that use this spec.
        classes: supported transformers class names (checked before any work).
        fields: config attribute names.
        layer_pattern: regex with three groups (prefix, layer index, rest) for per-layer parameters.
        rules: one Rule per kind of parameter; every state-dict entry must match exactly one.
        pre_ln: residual branches are normalised before the sublayer (needed for depth "identity").
        per_layer_fields: config attributes holding one entry per layer (e.g. Qwen2's layer_types).
    """

    name: str
    model_types: tuple[str, ...]
    classes: tuple[str, ...]
    fields: ConfigFields
    layer_pattern: str
    rules: tuple[Rule, ...]
    pre_ln: bool
    per_layer_fields: tuple[str, ...] = field(default=("layer_types",))

    def rule_for(self, name: str) -> Rule:
        """Return the unique rule for parameter ``name``.

        Raises:
            OperatorError: no rule or several rules match (the spec does not cover this parameter).
        """
        hits = [r for r in self.rules if r.matches(name)]
        if len(hits) != 1:
            what = "no rule" if not hits else f"{len(hits)} rules ({', '.join(r.pattern for r in hits)})"
            raise OperatorError(
                f"family '{self.name}': {what} for parameter '{name}'; this model variant is not covered "
                f"by the spec in operators/layouts.py"
            )
        return hits[0]

    # ---- sizes read from a config -------------------------------------------------------------
    def sizes(self, config: Any) -> dict[str, int]:
        """Return {"hidden", "heads", "kv_heads", "ffn", "layers", "head_dim"} for ``config``."""
        f = self.fields
        hidden = int(getattr(config, f.hidden))
        heads = int(getattr(config, f.heads))
        kv = getattr(config, f.kv_heads, None) if f.kv_heads else None
        kv = heads if kv is None else int(kv)
        ffn = getattr(config, f.ffn, None)
        if ffn is None:
            ffn = (f.ffn_default_ratio or 4) * hidden
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        return {
            "hidden": hidden,
            "heads": heads,
            "kv_heads": kv,
            "ffn": int(ffn),
            "layers": int(getattr(config, f.layers)),
            "head_dim": int(head_dim),
        }

    def space_units(self, sizes: dict[str, int], space: str) -> tuple[int, int]:
        """Return (number of units, unit size) of a width space: heads merge whole, neurons singly."""
        if space == "heads":
            return sizes["heads"], sizes["head_dim"]
        if space == "kv_heads":
            return sizes["kv_heads"], sizes["head_dim"]
        return sizes[space], 1


def check_factors(width: int, depth: int, pairing: str, depth_pairing: str, depth_mode: str) -> None:
    """Validate the operator arguments that do not depend on a model.

    Raises:
        OperatorError: a factor is not a positive integer, or a mode/pairing is unknown.
    """
    for name, v in (("width", width), ("depth", depth)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise OperatorError(f"{name} factor must be a positive integer; got {v!r}")
    if pairing not in PAIRINGS:
        raise OperatorError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
    if depth_pairing not in PAIRINGS:
        raise OperatorError(f"depth_pairing must be one of {PAIRINGS}; got {depth_pairing!r}")
    if depth_mode not in DEPTH_MODES:
        raise OperatorError(f"depth_mode must be one of {DEPTH_MODES}; got {depth_mode!r}")


def check_split(width_split: str, split_noise: float, seed: int) -> None:
    """Validate the arguments of the de-coalescing width split (see ``operators.maps``).

    Raises:
        OperatorError: an unknown ``width_split``, a ``split_noise`` that is not a finite number >= 0,
            or a ``seed`` that is not an integer; the message names the argument.
    """
    if width_split not in WIDTH_SPLITS:
        raise OperatorError(f"width_split must be one of {WIDTH_SPLITS}; got {width_split!r}")
    if isinstance(split_noise, bool) or not isinstance(split_noise, numbers.Real) or not math.isfinite(split_noise) \
            or split_noise < 0:
        raise OperatorError(f"split_noise must be a finite number >= 0 (noise std in units of the split weight's "
                            f"std, e.g. 0.1); got {split_noise!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise OperatorError(f"seed must be an integer; got {seed!r}")


def validate_sizes(spec: FamilySpec, config: Any, width: int, depth: int, direction: str) -> None:
    """Check that coalescing by (width, depth) divides every size, naming the config field that fails.

    Raises:
        OperatorError: a factor does not divide heads / kv heads / FFN / hidden / layers.
    """
    if direction not in ("coalesce", "decoalesce"):
        raise OperatorError(f"direction must be 'coalesce' or 'decoalesce'; got {direction!r}")
    if direction == "decoalesce":
        return
    s, f = spec.sizes(config), spec.fields
    cls = type(config).__name__
    checks = [
        ("hidden", f.hidden, width),
        ("heads", f.heads, width),
        ("kv_heads", f.kv_heads or f.heads, width),
        ("ffn", f.ffn, width),
        ("layers", f.layers, depth),
    ]
    for key, field_name, k in checks:
        if s[key] % k != 0 or s[key] // k < 1:
            kind = "depth" if key == "layers" else "width"
            raise OperatorError(
                f"{kind} factor {k} does not divide {cls}.{field_name}={s[key]} ({key}); "
                f"choose a factor that divides it"
            )


def resize_config(spec: FamilySpec, config: Any, width: int, depth: int, direction: str) -> Any:
    """Return a deep copy of ``config`` with sizes divided (coalesce) or multiplied (decoalesce).

    head_dim is kept: heads and hidden shrink together. Per-layer list fields are re-indexed by the
    operators themselves (see ``operators.transform.layer_index_map``); here they are only resized.
    """
    validate_sizes(spec, config, width, depth, direction)
    s, f = spec.sizes(config), spec.fields
    new = copy.deepcopy(config)

    def scale(v: int, k: int) -> int:
        return v // k if direction == "coalesce" else v * k

    setattr(new, f.hidden, scale(s["hidden"], width))
    setattr(new, f.heads, scale(s["heads"], width))
    if f.kv_heads and getattr(config, f.kv_heads, None) is not None:
        setattr(new, f.kv_heads, scale(s["kv_heads"], width))
    if getattr(config, f.ffn, None) is not None or width != 1:
        setattr(new, f.ffn, scale(s["ffn"], width))
    setattr(new, f.layers, scale(s["layers"], depth))
    if getattr(config, "head_dim", None) is not None:
        new.head_dim = s["head_dim"]
    for name in f.follow_hidden:
        if getattr(config, name, None) == s["hidden"]:
            setattr(new, name, scale(s["hidden"], width))
    return new
