"""Is a folder a usable Hugging Face checkpoint? Checked before any work, so a bad one is one line, not a
traceback from deep inside transformers minutes later.

``check_checkpoint_folder`` reads only small things: config.json (valid JSON naming a model_type), the
weight files that ``from_pretrained`` would load (single or sharded, safetensors or PyTorch), and each
safetensors file's header, whose tensor offsets must lie inside the file (a truncated or cut copy fails
here, not as ``SafetensorError: incomplete metadata`` later).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

__all__ = ["check_checkpoint_folder", "CheckpointFolderError"]

WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class CheckpointFolderError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the folder, the file and the problem."""


def _check_safetensors(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointFolderError(f"{path}: truncated ({size} bytes; not a safetensors file)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointFolderError(f"{path}: truncated or not a safetensors file (its header claims {n} bytes, "
                                        f"the file has {size})")
        try:
            header = json.loads(f.read(n))
        except ValueError:
            raise CheckpointFolderError(f"{path}: damaged safetensors header (not JSON)") from None
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise CheckpointFolderError(f"{path}: truncated ({size} bytes, its tensors need {8 + n + end}); copy or save "
                                    "it again")


def _weight_files(folder: Path) -> list[Path]:
    for name in WEIGHTS:
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise CheckpointFolderError(f"{index}: damaged shard index (not JSON with a weight_map)") from None
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise CheckpointFolderError(f"{folder}: shard {missing[0]} named in {index.name} is missing")
            return [folder / s for s in shards]
    raise CheckpointFolderError(f"{folder}: no weights (expected {' or '.join(WEIGHTS)}, or a sharded index)")


def check_checkpoint_folder(path: str | os.PathLike, what: str = "checkpoint", weights: bool = True) -> dict:
    """Check that ``path`` is a save_pretrained folder that ``from_pretrained`` can load; returns config.json.

    Args:
        path: the folder.
        what: how the message names it (e.g. "model.init_from").
        weights: also check the weight files (False: only the config is needed).

    Raises:
        FileNotFoundError: no such folder, or no config.json in it.
        CheckpointFolderError (a ValueError): config.json is not JSON or names no model_type; weights are
            missing, truncated or damaged.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"{what}: no such folder {folder} (a checkpoint folder written by save_pretrained)")
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{what}: {folder} has no config.json (expected a folder written by save_pretrained)")
    try:
        config = json.loads(cfg_path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise CheckpointFolderError(f"{what}: {cfg_path} is not valid JSON (damaged or not a model config)") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointFolderError(f"{what}: {cfg_path} names no model_type (not a Hugging Face model config)")
    if weights:
        try:
            for f in _weight_files(folder):
                if f.suffix == ".safetensors":
                    _check_safetensors(f)
                elif f.stat().st_size == 0:
                    raise CheckpointFolderError(f"{f}: empty weights file")
        except CheckpointFolderError as e:
            raise CheckpointFolderError(f"{what}: {e}") from None
    return config
