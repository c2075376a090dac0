"""Save and load nested training state without pickle: tensors in a safetensors file, the rest as JSON.

A *tree* is any nesting of dicts, lists and tuples whose leaves are torch tensors, NumPy arrays or
JSON scalars (str, int, float, bool, None): a model's state_dict, an optimizer's, an LR scheduler's,
random-generator states, a method's state. ``save_tree(tree, folder, name)`` writes ``<name>.json`` (the
structure, tensors replaced by references) and ``<name>.safetensors`` (the tensors). Loading runs no
code from the files: safetensors holds raw buffers and JSON holds data, unlike ``torch.load`` with
``weights_only=False``, where a crafted file can execute anything.

Encoding of what JSON cannot hold directly: a tensor is {"__tensor__": key}; a NumPy array is
{"__ndarray__": key, "dtype": ...}; a tuple is {"__tuple__": [...]}; a dict with non-string keys (an
optimizer's state is keyed by parameter index) is {"__items__": [[key, value], ...]}. Tensors that share
storage (tied weights) are stored once and come back as one tensor under both names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

__all__ = ["save_tree", "load_tree", "tree_files"]

_MARKERS = ("__tensor__", "__ndarray__", "__tuple__", "__items__")


def tree_files(name: str) -> tuple[str, str]:
    """The two file names ``save_tree`` writes for ``name``."""
    return f"{name}.json", f"{name}.safetensors"


def _encode(obj: Any, tensors: dict[str, torch.Tensor], seen: dict[tuple, str], path: str) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        alias = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype) \
            if t.device.type != "meta" and t.numel() else None
        if alias is not None and alias in seen:
            return {"__tensor__": seen[alias]}
        key = _unique(path, tensors)
        tensors[key] = t.to("cpu").contiguous()
        if alias is not None:
            seen[alias] = key
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = _unique(path, tensors)
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).astype(_storable(obj.dtype), copy=False))
        return {"__ndarray__": key, "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, seen, f"{path}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, tensors, seen, f"{path}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not any(k in _MARKERS for k in obj):
            return {k: _encode(v, tensors, seen, f"{path}.{k}" if path else k) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors, seen, f"{path}.k{i}"), _encode(v, tensors, seen, f"{path}.{i}")]
                              for i, (k, v) in enumerate(obj.items())]}
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    raise TypeError(f"save_tree: {path or 'the tree'} holds a {type(obj).__name__}, which cannot be stored "
                    "without pickle (use tensors, arrays, numbers, strings, lists, tuples and dicts)")


def _unique(path: str, taken: dict[str, Any]) -> str:
    key, n = path or "_", 1
    while key in taken:  # {"a": {"b": x}} and {"a.b": y} would otherwise collide
        key, n = f"{path}#{n}", n + 1
    return key


def _storable(dtype: np.dtype) -> np.dtype:
    # torch has no unsigned types beyond uint8 that safetensors round-trips everywhere: widen them.
    return np.dtype(np.int64) if dtype.kind == "u" and dtype.itemsize > 1 else dtype


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy().astype(np.dtype(obj["dtype"]))
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def save_tree(tree: Any, folder: str | Path, name: str) -> list[Path]:
    """Write ``tree`` as ``folder/<name>.json`` + ``folder/<name>.safetensors``; returns both paths.

    Raises:
        TypeError: a leaf that is not a tensor, array or JSON scalar (the message gives its path).
    """
    folder = Path(folder)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _encode(tree, tensors, {}, "")
    js, st = (folder / f for f in tree_files(name))
    save_file(tensors, str(st))
    js.write_text(json.dumps(skeleton))
    return [js, st]


def load_tree(folder: str | Path, name: str, device: str = "cpu") -> Any:
    """Read what ``save_tree`` wrote (no code from the files runs: JSON and raw tensor buffers only).

    Raises:
        FileNotFoundError: a file is missing. ValueError: a file is not valid JSON / safetensors.
    """
    folder = Path(folder)
    js, st = (folder / f for f in tree_files(name))
    skeleton = json.loads(js.read_text())
    try:
        tensors = load_file(str(st), device=device)
    except Exception as e:  # safetensors raises its own error type for a torn or foreign file
        raise ValueError(f"{st}: not a readable safetensors file ({e})") from None
    return _decode(skeleton, tensors)
