"""Model surgery for multi-level training (Zou, Zhang, Deng, ICLR 2024): coalesce, de-coalesce and
interpolate Hugging Face transformers, and carry their optimizer state across the size change.

Pure functions over models and state; no training code. Families are data (``operators.layouts``).
"""

from operators.api import (
    build_like,
    coalesce,
    decoalesce,
    head_is_tied,
    interpolate,
    resized_config,
    validate_resize,
)
from operators.depth import SharedDepth, depth_config, depth_map, grow_depth, map_depth_state
from operators.layouts import FAMILIES, family_of, supported_classes
from operators.optim import (
    interpolate_state,
    load_named_optimizer_state,
    map_optimizer_state,
    named_optimizer_state,
)
from operators.spec import FamilySpec, OperatorError

__all__ = [
    "FAMILIES",
    "FamilySpec",
    "OperatorError",
    "SharedDepth",
    "build_like",
    "coalesce",
    "decoalesce",
    "depth_config",
    "depth_map",
    "family_of",
    "grow_depth",
    "head_is_tied",
    "interpolate",
    "interpolate_state",
    "load_named_optimizer_state",
    "map_depth_state",
    "map_optimizer_state",
    "named_optimizer_state",
    "resized_config",
    "supported_classes",
    "validate_resize",
]
