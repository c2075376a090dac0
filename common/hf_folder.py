"""Is a folder a usable Hugging Face checkpoint? Checked before any work, so a bad one is one line, not a
traceback from deep inside transformers minutes later.

``check_checkpoint_folder`` reads only small things: config.json (valid JSON naming a model_type the installed
transformers knows), the weight files that ``from_pretrained`` would load (single or sharded, safetensors or
PyTorch), and each safetensors file's header, whose tensors must tile the file's data exactly (a truncated or cut
copy fails here, not as ``SafetensorError: incomplete metadata`` later).

``load_weights`` loads a checkpoint strictly: transformers' ``from_pretrained`` replaces weights of other
shapes or names by random ones with a log line (silenced here), so every missing, unexpected or resized
tensor outside a named task head is an error instead.

Sizes are bounded before anything is allocated: a header's length by the format's limit (100 MB), each header
entry checked as the format defines it (dtype, shape, offsets tiling the data), and a model by its parameters
counted on the meta device from its config against the memory available (``check_loadable``), so neither a
header nor a config can make a load allocate what it merely claims.
"""

from __future__ import annotations

import copy
import json
import math
import os
import pickle
import struct
import warnings
from pathlib import Path
from typing import Any

__all__ = ["check_checkpoint_folder", "CheckpointFolderError", "load_weights", "check_fits", "check_loadable",
           "check_layers", "check_memory", "count_parameters", "model_bytes", "available_memory", "HEADS", "MAX_LAYERS"]

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
# the most layers a config may ask this project to build (even on the meta device a layer costs ~10 ms and ~30 kB;
# the deepest published transformers have a few hundred)
MAX_LAYERS = 4_096
# Module names of task heads: the only tensors a checkpoint may lack, carry extra or hold in another shape when
# it is loaded for another task (an MLM's ``cls`` head dropped, a classifier's ``classifier`` and BERT's
# ``pooler`` new, a ViT head resized to other labels).
HEADS = ("classifier", "cls_classifier", "distillation_classifier", "pooler", "cls", "lm_head", "score")


class CheckpointFolderError(ValueError):
    """A checkpoint folder that cannot be loaded; the message names the folder, the file and the problem."""


# safetensors' own limit on the header's length (its MAX_HEADER_SIZE): a longer claim is damage, never read
MAX_HEADER = 100_000_000
# bits per element of each dtype the safetensors format names (sub-byte floats pack several to a byte)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8,
              "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(name: str, entry: Any) -> tuple[int, int, tuple[int, ...]]:
    """(begin, end, shape) of one tensor's header entry, checked as the format defines it."""
    if not isinstance(entry, dict):
        raise ValueError(f"tensor '{name}' is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise ValueError(f"tensor '{name}' has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_size(d) for d in shape):
        raise ValueError(f"tensor '{name}': shape must be a list of sizes >= 0, got {shape!r}")
    if offsets is None:
        raise ValueError(f"tensor '{name}' has no data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_size(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"tensor '{name}': data_offsets must be two byte offsets [begin, end], got {offsets!r}")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits != 8 * (offsets[1] - offsets[0]):
        need = bits // 8 if bits % 8 == 0 else bits / 8
        raise ValueError(f"tensor '{name}': shape {shape} of {dtype} needs {need} bytes, its data_offsets give "
                         f"{offsets[1] - offsets[0]}")
    return offsets[0], offsets[1], tuple(shape)


def _read_header(path: Path, size: int) -> tuple[int, Any]:
    """(the header's length, the header) of a safetensors file, its length bounded before it is read."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointFolderError(f"{path}: truncated ({size} bytes; not a safetensors file)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise CheckpointFolderError(f"{path}: its safetensors header claims {n:,} bytes, past the format's limit "
                                        f"of {MAX_HEADER:,} (damaged, or not a safetensors file)")
        if n > size - 8:
            raise CheckpointFolderError(f"{path}: truncated or not a safetensors file (its header claims {n} bytes, "
                                        f"the file has {size})")
        try:
            return n, json.loads(f.read(n))
        except ValueError:
            raise CheckpointFolderError(f"{path}: damaged safetensors header (not JSON)") from None


def _check_safetensors(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensors' shapes by name, from a safetensors file's header checked whole: every entry well formed, the
    tensors tiling the data from its first byte to its last (what safetensors itself demands when it loads).

    Raises:
        CheckpointFolderError: naming the file, and the tensor and field where one is wrong.
    """
    size = path.stat().st_size
    n, header = _read_header(path, size)
    if not isinstance(header, dict):
        raise CheckpointFolderError(f"{path}: damaged safetensors header (not a JSON object)")
    meta = header.get("__metadata__", {})
    try:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise ValueError("__metadata__ must map names to strings")
        spans = sorted((*_entry(k, v), k) for k, v in header.items() if k != "__metadata__")
    except ValueError as e:
        raise CheckpointFolderError(f"{path}: {e} (a damaged safetensors header; save or copy it again)") from None
    end = 0
    for begin, stop, _, name in spans:
        if begin != end:
            raise CheckpointFolderError(f"{path}: tensor '{name}' starts at byte {begin}, where the tensor before it "
                                        f"ends at {end} (a damaged safetensors header; save or copy it again)")
        end = stop
    if 8 + n + end > size:
        raise CheckpointFolderError(f"{path}: truncated ({size} bytes, its tensors need {8 + n + end}); copy or save "
                                    "it again")
    if 8 + n + end < size:
        raise CheckpointFolderError(f"{path}: {size - 8 - n} bytes of tensor data, its header's tensors cover {end} "
                                    "(damaged, or not a safetensors file)")
    return {name: shape for _, _, shape, name in spans}


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
    _check_model_type(config["model_type"], cfg_path, what)
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


def _check_model_type(model_type: Any, cfg_path: Path, what: str) -> None:
    """Refuse a model_type the installed transformers has no classes for, in one line (its own error is three
    lines of advice to install it from source)."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise CheckpointFolderError(f"{what}: {cfg_path} names model_type {model_type!r}, which transformers "
                                    f"{transformers.__version__} installed here does not know (a checkpoint of "
                                    "another library, or of a newer transformers)")


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


def available_memory() -> int | None:
    """Bytes of memory this process may still take: the kernel's MemAvailable, lowered to what is left of the
    cgroup's (a container's, a job's) limit where one is set; None where neither can be read."""
    found = []
    try:
        with open("/proc/meminfo") as f:
            found += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(min(found), 0) if found else None


def _itemsize(dtype: Any, config: Any) -> tuple[int, str]:
    """(bytes per parameter, the dtype's name) a load makes: ``dtype`` when given, else (transformers' "auto")
    the checkpoint's own, else float32."""
    import torch

    for d in (dtype, getattr(config, "dtype", None), getattr(config, "torch_dtype", None)):
        d = getattr(torch, d, None) if isinstance(d, str) else d
        if isinstance(d, torch.dtype):
            return d.itemsize, str(d).removeprefix("torch.")
    return 4, "float32"


def count_parameters(cls: type, config: Any) -> tuple[str, int]:
    """(the model's class name, its parameters) for a model of ``cls`` (a transformers class or Auto
    class) and ``config``, built on the meta device: nothing is allocated. Callers bound the layer count first
    (``MAX_LAYERS``): an empty model of millions of layers still takes hours and gigabytes to build.

    Raises:
        CheckpointFolderError: transformers cannot build a model of this config (first line of its error).
    """
    import torch

    config = copy.deepcopy(config)  # building may set attributes (the attention implementation) on it
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    except (ValueError, TypeError, RuntimeError, ArithmeticError, AttributeError) as e:
        first = (str(e).splitlines() or [""])[0][:200]
        raise CheckpointFolderError(f"transformers cannot build a {getattr(cls, '__name__', cls)} of this config "
                                    f"({type(e).__name__}: {first})") from None
    return type(model).__name__, sum(t.numel() for t in model.parameters())  # buffers are a rounding error


def model_bytes(cls: type, config: Any, dtype: Any = None) -> tuple[str, int, int, str]:
    """(class name, parameters, bytes, dtype name) of a model of ``cls`` and ``config`` loaded in ``dtype`` (None:
    the config's own, else float32), counted on the meta device (``count_parameters``)."""
    name, n = count_parameters(cls, config)
    size, dtype_name = _itemsize(dtype, config)
    return name, n, n * size, dtype_name


def check_memory(cls: type, config: Any, subject: str, dtype: Any = None) -> None:
    """Refuse, before anything is allocated, a model of ``cls`` and ``config`` whose parameters in ``dtype`` need
    more memory than is available here (``available_memory``).

    Args:
        subject: the message's start, naming what asked for the model (a folder).

    Raises:
        CheckpointFolderError: it does not fit; the message gives its parameters, bytes and the memory available.
    """
    name, n, need, dtype_name = model_bytes(cls, config, dtype)
    free = available_memory()
    if free is not None and need > free:
        raise CheckpointFolderError(f"{subject}: a {name} of {n:,} parameters needs {need:,} bytes in {dtype_name}, "
                                    f"more than the {free:,} bytes of memory available here")


def check_layers(config: Any, subject: str, tensors: int | None = None) -> None:
    """Bound ``config``'s layer count before a model of it is built: at most ``MAX_LAYERS``, and (when known) at
    most the ``tensors`` its weights hold, since every layer holds at least one.

    Raises:
        CheckpointFolderError: naming ``subject`` (the config file) and the count.
    """
    layers = getattr(config, "num_hidden_layers", None)
    if layers is None:
        return
    if not _is_size(layers):
        raise CheckpointFolderError(f"{subject}: num_hidden_layers must be a whole number >= 0, got {layers!r}")
    if tensors is not None and layers > tensors:
        raise CheckpointFolderError(f"{subject}: num_hidden_layers {layers:,} is more than the {tensors:,} tensors its "
                                    "weights hold (every layer holds one or more): the config does not describe them")
    if layers > MAX_LAYERS:
        raise CheckpointFolderError(f"{subject}: num_hidden_layers {layers:,} is past the {MAX_LAYERS:,} this project "
                                    "builds (a damaged config?)")


def check_loadable(cls: type, folder: str | os.PathLike, what: str = "checkpoint", dtype: Any = None,
                   config: Any = None) -> None:
    """Before ``from_pretrained`` allocates anything: the config's layer count is bounded (``check_layers``) and a
    model of it fits in the memory available (``check_memory``), whatever its headers claim.

    Args:
        cls: the class that will load it (a transformers class or Auto class).
        dtype: the dtype it will be loaded in (None: the checkpoint's own).
        config: the config it will be built from (None: the folder's config.json).

    Raises:
        CheckpointFolderError: naming the folder (or its config.json) and the size.
    """
    from transformers import AutoConfig

    if config is None:  # as from_pretrained reads it: a concrete class reads the folder through its own config class
        own = getattr(cls, "config_class", None)
        config = (own if isinstance(own, type) and hasattr(own, "from_pretrained") else AutoConfig).from_pretrained(
            folder)
    folder, tensors = Path(folder), None
    if folder.is_dir():  # else a Hub id: its config alone bounds it
        files = _weight_files(folder)
        if all(f.suffix == ".safetensors" for f in files):
            tensors = sum(len(_check_safetensors(f)) for f in files)
    try:
        check_layers(config, str(folder / "config.json"), tensors)
        check_memory(cls, config, str(folder), dtype)
    except CheckpointFolderError as e:
        raise CheckpointFolderError(f"{what}: {e}") from None


def load_weights(cls: type, folder: str | os.PathLike, heads: tuple[str, ...] = (), what: str = "checkpoint",
                 **kwargs):
    """``cls.from_pretrained(folder, **kwargs)``, refusing weights that do not fit.

    Args:
        cls: a transformers model class.
        folder: the checkpoint folder (or a Hub id).
        heads: module names (``HEADS``) whose tensors may be missing, unexpected or resized: they are
            initialised anew (a task head); empty for a model that must load whole.
        what: how messages name the folder (e.g. "model.init_from").
        kwargs: passed to ``from_pretrained`` (config, num_labels, dtype, ...).

    Returns:
        (model, the names of the head tensors initialised anew).

    Raises:
        CheckpointFolderError: a tensor outside ``heads`` is missing, unexpected or of another shape; or, before
            anything is allocated, the model is larger than the memory available (``check_loadable``).
    """

    check_loadable(cls, folder, what, kwargs.get("dtype"), kwargs.get("config"))
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
