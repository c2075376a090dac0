"""``python -m operators coalesce|decoalesce|interpolate``: the operators on saved checkpoint folders.

Every input is checked before anything is written; the output folder is written to a temporary
sibling and renamed, so it is never half-written. Tokenizer / image-processor files are copied over.
``--overwrite`` replaces only a folder this CLI wrote (it carries the ``.growtrain-output`` marker naming this
CLI, whose record lists every file in it: a file added later, or a folder another tool marked, is refused), and
OUT may never be, or contain, an input (common/ownership.py): a run folder, a user's folder, a bench's output
folder or the checkpoint being read is never deleted.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from common import hf_folder
from common.cli import run_cli
from common.hf_folder import (
    MAX_LAYERS,
    CheckpointFolderError,
    check_checkpoint_folder,
    load_weights,
    model_bytes,
)
from common.io import atomic_dir
from common.ownership import OUTPUT, check_folder_replaceable, check_not_an_input, mark
from common.quiet import no_save_bar, quiet_transformers
from operators import api
from operators.layouts import family_of
from operators.spec import DEFAULT_SPLIT_NOISE, DEPTH_MODES, PAIRINGS, WIDTH_SPLITS, OperatorError

TOOL = "python -m operators"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Only tokenizer / processor files are carried over: weights, shards, optimizer or trainer state of the
# source describe the old shape and must not sit next to the new weights.
COPIED_PREFIXES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "spiece",
                   "sentencepiece", "preprocessor_config", "processor_config", "image_processor",
                   "feature_extractor", "chat_template")
DISK_MARGIN = 1 << 20  # config.json, generation_config.json, the marker and safetensors' header beside the weights


def checkpoint_class(path: str) -> tuple[type, Any]:
    """(model class, config) of a supported HF checkpoint folder, checked whole before any weight is read.

    Raises:
        OperatorError: missing folder, config or weights, damaged weights, or an unsupported architecture.
    """
    import transformers

    folder = Path(path)
    if not folder.is_dir():
        raise OperatorError(f"checkpoint folder not found: {folder}")
    if not (folder / "config.json").is_file():
        raise OperatorError(f"no config.json in checkpoint folder {folder}")
    if not any((folder / f).is_file() or (folder / f"{f}.index.json").is_file() for f in WEIGHT_FILES):
        raise OperatorError(f"no weights in {folder} (expected one of {', '.join(WEIGHT_FILES)})")
    try:  # config.json that parses, weight files whole (not truncated), before anything is read
        check_checkpoint_folder(folder, "checkpoint")
    except CheckpointFolderError as e:
        raise OperatorError(str(e)) from None
    config = transformers.AutoConfig.from_pretrained(folder)
    archs = getattr(config, "architectures", None) or []
    if not archs:
        raise OperatorError(f"{folder}/config.json names no architecture; save it with save_pretrained")
    cls = getattr(transformers, archs[0], None)
    if cls is None:
        raise OperatorError(f"unknown architecture {archs[0]} in {folder}/config.json")
    family_of(config)  # unsupported families fail here, before the weights are read
    return cls, config


def load_checkpoint(path: str):
    """Load a supported HF model from a checkpoint folder (no code of ours needed to read it).

    Raises:
        OperatorError: as ``checkpoint_class``; CheckpointFolderError: weights that do not fit, or a model larger
            than the memory available.
    """
    cls, _ = checkpoint_class(path)
    return load_weights(cls, Path(path), what="checkpoint")[0]  # whole, or an error (never random weights)


def check_grown(inputs: list[tuple[type, Any]], args: argparse.Namespace) -> None:
    """Before anything loads: the model that ``--width``/``--depth`` de-coalesce the last of ``inputs`` (class,
    config) into has its layers bounded (``MAX_LAYERS``), and its parameters with the inputs', counted on the meta
    device, must fit in the memory available (``decoalesce --width 100000`` allocated until it died).

    Raises:
        OperatorError: naming the factors and the sizes.
    """
    factors = f"--width {args.width} --depth {args.depth}"
    cls, config = inputs[-1]
    grown = api.resized_config(config, args.width, args.depth, "decoalesce", args.depth_pairing)
    layers = getattr(grown, "num_hidden_layers", 0)
    if layers > MAX_LAYERS:
        raise OperatorError(f"{factors}: the de-coalesced model would have {layers:,} layers, past the "
                            f"{MAX_LAYERS:,} this project builds; choose a smaller --depth")
    try:
        name, n, need, dtype = model_bytes(cls, grown)
        held = sum(model_bytes(c, cfg)[2] for c, cfg in inputs)
    except CheckpointFolderError as e:
        raise OperatorError(f"{factors}: {e}") from None
    free = hf_folder.available_memory()  # looked up at the call: tests stand in for the machine's
    if free is not None and need + held > free:
        raise OperatorError(f"{factors}: the de-coalesced {name} would hold {n:,} parameters, {need:,} bytes in "
                            f"{dtype}; with the {held:,} bytes of the model(s) it is made from, more than the "
                            f"{free:,} bytes of memory available here; choose smaller factors")


def free_disk(path: str | Path) -> int:
    """Bytes this user may still write on the file system that holds ``path`` (its nearest folder that exists)."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def output_of(inputs: list[tuple[type, Any]], args: argparse.Namespace) -> tuple[type, Any]:
    """(class, config) of the model the command writes: the resized one of coalesce / decoalesce, the first input's
    shape for interpolate (the second is de-coalesced to it). Nothing is loaded.

    Raises:
        OperatorError: factors that do not fit the input (``api.resized_config``).
    """
    cls, config = inputs[0]
    if args.op == "interpolate":
        return cls, config
    return cls, api.resized_config(config, args.width, args.depth, args.op, args.depth_pairing)


def check_disk(output: tuple[type, Any], src: str | Path, out: str | Path) -> None:
    """Before anything loads: the output folder (the model of ``output``, (class, config), saved in its dtype, with
    the tokenizer / processor files copied from ``src``) must fit in the space free where ``out`` is written (a
    temporary sibling of ``out``, renamed into place: an ``--overwrite`` frees the old folder only after). A full
    disk was found only at the write, after the minutes of loading and resizing.

    Raises:
        OperatorError: naming the folder, the bytes it needs and the bytes free.
    """
    name, n, weights, dtype = model_bytes(*output)
    copied = sum(f.stat().st_size for f in Path(src).iterdir() if f.is_file() and f.name.startswith(COPIED_PREFIXES))
    need = weights + copied + DISK_MARGIN
    where = Path(out).absolute().parent
    free = free_disk(where)  # looked up at the call: tests stand in for the machine's
    if need > free:
        raise OperatorError(f"{out}: the {name} written there needs about {need:,} bytes on disk ({n:,} parameters, "
                            f"{weights:,} bytes in {dtype}, and {copied:,} bytes of tokenizer files), more than the "
                            f"{free:,} bytes free in {where}; free some space or write elsewhere")


def save_checkpoint(model, src: str | Path, out: str | Path, overwrite: bool) -> Path:
    """save_pretrained ``model`` into ``out`` atomically (marked as this CLI's output) and copy tokenizer/processor
    files from ``src``. ``out`` must pass ``check_folder_replaceable`` (the CLI checks it before any work)."""
    check_folder_replaceable(out, OUTPUT, TOOL, overwrite)
    with atomic_dir(out, overwrite=True) as tmp:
        with no_save_bar():
            model.save_pretrained(tmp)
        for f in Path(src).iterdir():
            if f.is_file() and f.name.startswith(COPIED_PREFIXES) and not (tmp / f.name).exists():
                shutil.copy2(f, tmp / f.name)
        # the record of what this CLI made: everything in the new folder, which it created and filled itself
        mark(tmp, OUTPUT, TOOL, made=sorted(p.name for p in tmp.iterdir()))
    return Path(out)


def _add_resize_args(p: argparse.ArgumentParser, with_mode: bool) -> None:
    p.add_argument("--width", type=int, default=2, help="width factor k (heads, hidden, FFN divide by it)")
    p.add_argument("--depth", type=int, default=1, help="depth factor (layers divide by it)")
    p.add_argument("--pairing", choices=PAIRINGS, default="stride",
                   help="which heads/neurons merge: stride (i with i+n/k, default) or adjacent (k*i..)")
    p.add_argument("--depth-pairing", choices=PAIRINGS, default="adjacent",
                   help="which layers merge: adjacent (2i, 2i+1, default) or stride (i, i+L/2)")
    if with_mode:
        p.add_argument("--depth-mode", choices=DEPTH_MODES, default="copy",
                       help="copy: every large layer copies its small layer (paper); identity: the extra "
                            "layers start as identities (exact, pre-LN families only)")
        p.add_argument("--width-split", choices=WIDTH_SPLITS, default="symmetric",
                       help="how the weights reading a duplicated neuron are split: symmetric (W/k each; the "
                            "copies stay identical under training) or asymmetric (W/k + zero-sum noise: still "
                            "exact, the copies diverge)")
        p.add_argument("--split-noise", type=float, default=DEFAULT_SPLIT_NOISE,
                       help="asymmetric: noise std in units of each split weight's std (default %(default)s)")
        p.add_argument("--seed", type=int, default=0, help="asymmetric: seed of the noise (default 0)")


def build_parser() -> argparse.ArgumentParser:
    """The CLI's argument parser."""
    ap = argparse.ArgumentParser(
        prog="python -m operators",
        description="Coalesce, de-coalesce or interpolate saved Hugging Face checkpoints "
                    "(multi-level training operators, Zou et al. ICLR 2024). Output is a new checkpoint "
                    "folder (config + safetensors + tokenizer/processor files copied).",
    )
    sub = ap.add_subparsers(dest="op", required=True)
    c = sub.add_parser("coalesce", help="shrink: merge heads/neurons and layers")
    c.add_argument("src"), c.add_argument("out")
    _add_resize_args(c, with_mode=False)
    d = sub.add_parser("decoalesce", help="grow: duplicate heads/neurons, copy layers")
    d.add_argument("src"), d.add_argument("out")
    _add_resize_args(d, with_mode=True)
    i = sub.add_parser("interpolate", help="out = (1-alpha)*base + alpha*other (other de-coalesced first "
                                           "when --width/--depth > 1)")
    i.add_argument("base", help="the large model before coalescing")
    i.add_argument("other", help="a model of the same shape, or the small model with --width/--depth")
    i.add_argument("out")
    i.add_argument("--alpha", type=float, required=True, help="weight of OTHER, in [0, 1]")
    _add_resize_args(i, with_mode=True)
    i.set_defaults(width=1)
    for p in (c, d, i):
        p.add_argument("--overwrite", action="store_true",
                       help="replace OUT if this CLI wrote it (it carries the .growtrain-output marker); a folder "
                            "it did not write, or one holding an input, is never replaced")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (2 on a usage/operator error, one line; ``--debug`` shows
    the traceback)."""

    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    quiet_transformers()
    args = build_parser().parse_args(argv)

    inputs = [args.base, args.other] if args.op == "interpolate" else [args.src]
    check_not_an_input(args.out, inputs)
    check_folder_replaceable(args.out, OUTPUT, TOOL, args.overwrite)
    if args.op == "interpolate" and not 0.0 <= args.alpha <= 1.0:
        raise OperatorError(f"--alpha must be in [0, 1]; got {args.alpha}")
    classes = [checkpoint_class(p) for p in inputs]  # every input checked whole, nothing loaded yet
    if args.op == "decoalesce" or (args.op == "interpolate" and (args.width > 1 or args.depth > 1)):
        check_grown(classes, args)  # the last input is the one de-coalesced
    check_disk(output_of(classes, args), inputs[0], args.out)
    if args.op == "interpolate":
        base, other = load_checkpoint(args.base), load_checkpoint(args.other)
        n_base, n_other = (sum(p.numel() for p in m.parameters()) for m in (base, other))
        if n_other < n_base and args.width == 1 and args.depth == 1:
            raise OperatorError(f"{args.other} is smaller than {args.base}: pass the factors it was coalesced "
                                f"with (--width/--depth) so it is de-coalesced before the interpolation")
        if args.width > 1 or args.depth > 1:
            other = api.decoalesce(other, args.width, args.depth, args.pairing, args.depth_pairing,
                                   args.depth_mode, args.width_split, args.split_noise, args.seed)
        model, src = api.interpolate(base, other, args.alpha), args.base
    else:
        src = args.src
        model = load_checkpoint(src)
        if args.op == "coalesce":
            model = api.coalesce(model, args.width, args.depth, args.pairing, args.depth_pairing)
        else:
            model = api.decoalesce(model, args.width, args.depth, args.pairing, args.depth_pairing,
                                   args.depth_mode, args.width_split, args.split_noise, args.seed)
    out = save_checkpoint(model, src, args.out, args.overwrite)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({type(model).__name__}, {n:,} parameters)")
    return 0
