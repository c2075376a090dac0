"""Is a folder a usable Hugging Face checkpoint? Checked before any work, so a bad one is one line, not a
traceback from deep inside transformers minutes later.

``check_checkpoint_folder`` reads only small things: config.json (valid JSON naming a model_type), the
weight files that ``from_pretrained`` would load (single or sharded, safetensors or PyTorch), and each
safetensors file's header, whose tensor offsets must lie inside the file (a truncated or cut copy fails
here, not as ``SafetensorError: incomplete metadata`` later).

``load_weights`` loads a checkpoint strictly: transformers' ``from_pretrained`` replaces weights of other
shapes or names by random ones with a log line (silenced here), so every missing, unexpected or resized
tensor outside a named task head is an error instead.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import warnings
from pathlib import Path
from typing import Any

__all__ = ["check_checkpoint_folder", "CheckpointFolderError", "load_weights", "check_fits", "HEADS"]

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# Module names of task heads: the only tensors a checkpoint may lack, carry extra or hold in another shape when
# it is loaded for another task (an MLM's ``cls`` head dropped, a classifier's ``classifier`` and BERT's
# ``pooler`` new, a ViT head resized to other labels).
HEADS = ("classifier", "cls_classifier", "distillation_classifier", "pooler", "cls", "lm_head", "score")


class CheckpointFolderError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the folder, the file and the problem."""


def _check_safetensors(path: Path) -> dict[str, tuple[int, ...]]:
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
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


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


def _in_head(name: str, heads: tuple[str, ...]) -> bool:
    return any(part in heads for part in name.split("."))


def _misfit(resized: dict[str, tuple], missing: set[str], unexpected: set[str], heads: tuple[str, ...], folder: Any,
            cls_name: str, what: str) -> CheckpointFolderError | None:
    bad = {"of other shapes": sorted(k for k in resized if not _in_head(k, heads)),
           "missing": sorted(k for k in missing if not _in_head(k, heads)),
           "unexpected": sorted(k for k in unexpected if not _in_head(k, heads))}
    if not any(bad.values()):
        return None
    first = next(k for v in bad.values() for k in v)
    detail = f" ({resized[first][0]} in the checkpoint, {resized[first][1]} in the model)" if first in resized else ""
    counts = ", ".join(f"{len(v)} {kind}" for kind, v in bad.items() if v)
    return CheckpointFolderError(f"{what}: {folder} does not fit this {cls_name}: {counts} tensors (first: {first}"
                                 f"{detail}); its weights would be replaced by random ones. Use a checkpoint of this "
                                 "shape, or a matching model config")


def check_fits(model: Any, folder: str | os.PathLike, heads: tuple[str, ...] = (), what: str = "checkpoint",
               load: Any = None) -> None:
    """Before any work: do the names and shapes in ``folder``'s safetensors headers fit ``model`` (built on the
    meta device)? Tied weights count once; the base model's prefix may be absent (a base checkpoint). When
    they seem not to, ``load()`` (a strict ``load_weights``, which knows transformers' key renames) decides.

    Raises:
        CheckpointFolderError: they do not fit (see ``load_weights``).
    """
    files = _weight_files(Path(folder))
    if not files or any(f.suffix != ".safetensors" for f in files):
        if files and load is not None:  # a PyTorch file has no header to read: the strict load itself decides
            load()
        return
    stored: dict[str, tuple[int, ...]] = {}
    for f in files:
        stored.update(_check_safetensors(f))
    prefix = f"{getattr(model, 'base_model_prefix', '')}."
    strip = lambda k: k[len(prefix):] if prefix != "." and k.startswith(prefix) else k  # noqa: E731
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    want = {strip(k): tuple(v.shape) for k, v in model.state_dict().items() if k not in tied}
    have = {strip(k): v for k, v in stored.items()}
    resized = {k: (have[k], want[k]) for k in want.keys() & have.keys() if have[k] != want[k]}
    error = _misfit(resized, want.keys() - have.keys(), have.keys() - want.keys(), heads, folder,
                    type(model).__name__, what)
    if error is not None and load is not None:
        load()  # raises if the weights really do not fit
    elif error is not None:
        raise error


def load_weights(cls: type, folder: str | os.PathLike, heads: tuple[str, ...] = (), what: str = "checkpoint",
                 **kwargs):
    """``cls.from_pretrained(folder, **kwargs)``, refusing weights that do not fit.

    Args:
        cls: a transformers model class.
        folder: the checkpoint folder.
        heads: module names (``HEADS``) whose tensors may be missing, unexpected or resized: they are
            initialised anew (a task head); empty for a model that must load whole.
        what: how messages name the folder (e.g. "model.init_from").
        kwargs: passed to ``from_pretrained`` (config, num_labels, dtype, ...).

    Returns:
        (model, the names of the head tensors initialised anew).

    Raises:
        CheckpointFolderError: a tensor outside ``heads`` is missing, unexpected or of another shape.
    """

    try:
        with warnings.catch_warnings():  # torch's note on a pickle's protocol: the load works, or the error says why
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            model, info = cls.from_pretrained(folder, ignore_mismatched_sizes=True, output_loading_info=True,
                                              **kwargs)
    except pickle.UnpicklingError as e:  # torch.load(weights_only=True) refused a pickle: nothing of it ran
        # torch's text first suggests loading again with weights_only=False (which would run the file's code):
        # only what its safe loader refused is worth repeating
        _, _, refused = str(e).partition("WeightsUnpickler error:")
        refused = " ".join(refused.split("Check the documentation")[0].split()) or type(e).__name__
        raise CheckpointFolderError(f"{what}: {folder}: its PyTorch weights file holds more than tensors and is not "
                                    f"loaded (torch's weights-only loader refused it: {refused[:200]}); use a "
                                    "safetensors checkpoint") from None
    resized = {k: (tuple(a), tuple(b)) for k, a, b in info.get("mismatched_keys", ())}
    missing, unexpected = set(info.get("missing_keys", ())), set(info.get("unexpected_keys", ()))
    error = _misfit(resized, missing, unexpected, heads, folder, type(model).__name__, what)
    if error is not None:
        raise error
    return model, sorted(k for k in resized.keys() | missing if _in_head(k, heads))
