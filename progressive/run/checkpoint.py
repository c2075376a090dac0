"""Full training-state checkpoints: atomic, verified, pickle-free; the last K kept; loaded for ``--resume``.

A checkpoint is a folder ``<run>/checkpoints/step<step>-phase<phase>/`` (format 2):

    model.{json,safetensors}      the unwrapped model's state_dict (tied weights stored once)
    optimizer.{json,safetensors}  the optimizer's state_dict (AdamW moments, step counts, param groups)
    scheduler.{json,safetensors}  the LR scheduler's state_dict (its position in the phase's schedule)
    method.{json,safetensors}     Method.state_dict() (e.g. the V-cycle's kept pre-coalescing weights)
    rng.{json,safetensors}        Python, NumPy, torch CPU and CUDA generator states (of the main process)
    rank<r>.*                     only for a method with per-process state (``Method.has_local_state``, e.g.
                                  AutoCache): process r's generator states (rank<r>.{json,safetensors}) and
                                  the method's files (rank<r>.method.*), written by each process into
                                  ``checkpoints/.step<step>-phase<phase>-ranks.tmp/`` and moved in by the
                                  main process before it hashes the manifest
    sharded/                      only under FSDP2, in place of model.* and optimizer.*: every process's
                                  shards of the weights and AdamW moments (progressive.run.shards: DCP's
                                  safetensors format, readable by any number of processes)
    state.json                    counters (phase, step, tokens, FLOPs, wall-clock), the config, world size,
                                  the data fingerprint, ``sharded``, ``finite`` (every weight finite),
                                  ``contents``: one sha256 over the digests of every other file, and
                                  ``digest``: a sha256 of its own other fields (a config edited in it is caught)
    manifest.json                 sha256 of every other file (by path inside the folder), computed by reading
                                  the files back; last

Nothing is unpickled on load (common.safetree: JSON + safetensors), so a crafted file in a run folder cannot run code.
A checkpoint is *good* when its files match the manifest exactly (no file missing, changed or added), state.json
agrees with the manifest (``contents``: a manifest re-made over changed files, e.g. a flipped shard, is caught), with
itself (``digest``: its config or counters edited and the manifest re-made is caught) and with the folder's name (its
step and phase), and its weights were finite. ``--resume`` takes the newest good checkpoint and names every newer one
it skips and why; rotation never deletes the newest good checkpoint. The folder is built under a temporary name and
renamed (common.io.atomic_dir), so a crash mid-write leaves the previous checkpoints untouched. The data position is
the global step: batches are a pure function of (seed, step) (progressive.data.batch_indices).

Format 1 (``*.pt`` files written with pickle, before this module's format 2) is refused with a message
saying so: loading it would mean unpickling files from the run folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.io import atomic_dir, atomic_write_json
from common.safetree import load_tree, save_tree

CHECKPOINTS = "checkpoints"
FORMAT = 2
MANIFEST = "manifest.json"
STATE = "state.json"
PARTS = ("model", "optimizer", "scheduler", "method", "rng")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the folder and what is wrong with it."""


def rng_state() -> dict[str, Any]:
    """The states of every random generator the run uses."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run keeps its checkpoints."""
    return Path(run_dir) / CHECKPOINTS


def _position(path: Path) -> tuple[int, int]:
    step, _, phase = path.name.removeprefix("step").partition("-phase")
    return int(step), int(phase)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders of a run, oldest first, by the (step, phase) in their names (temporary and
    foreign folders are ignored; whether each is usable is ``verify``'s question)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and not p.name.startswith("."):
            try:
                found.append((_position(p), p))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file under ``folder``, as its path relative to it ("sharded/shard-00001-...")."""
    return sorted(f.relative_to(folder).as_posix() for f in folder.rglob("*") if f.is_file())


def _contents(digests: dict[str, str]) -> str:
    """One sha256 over every file's digest but state.json's and the manifest's (recorded in state.json)."""
    items = sorted((k, v) for k, v in digests.items() if k not in (STATE, MANIFEST))
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _digest(state: dict[str, Any]) -> str:
    """A sha256 of state.json's fields but ``digest`` itself (as JSON: the same before writing and once read)."""
    fields = {k: v for k, v in state.items() if k != "digest"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def _name(step: int, phase: int) -> str:
    return f"step{step:08d}-phase{phase:02d}"


def staging_dir(run_dir: str | Path, step: int, phase: int) -> Path:
    """Where every process writes its per-process part of the checkpoint at (step, phase) before the main
    process moves it in (a hidden ``.tmp`` folder: removed at start by progressive.run.rundir.clean_stale)."""
    return checkpoint_dir(run_dir) / f".{_name(step, phase)}-ranks.tmp"


def rank_part(rank: int) -> str:
    """The file-name prefix of process ``rank``'s part of a checkpoint."""
    return f"rank{rank}"


def stage_rank_part(run_dir: str | Path, step: int, phase: int, rank: int,
                    write: Callable[[Path, str], None]) -> Path:
    """Write process ``rank``'s part of the checkpoint at (step, phase) into ``staging_dir``: its generator
    states (``rank<r>.{json,safetensors}``) and whatever ``write(folder, name)`` writes as ``folder/<name>.*``
    (``name`` = "rank<r>.method"); returns the folder (the caller waits for every process, then the main
    process passes it to ``save_checkpoint``)."""
    folder = staging_dir(run_dir, step, phase)
    folder.mkdir(parents=True, exist_ok=True)
    save_tree({"rng": rng_state()}, folder, rank_part(rank))
    write(folder, f"{rank_part(rank)}.method")
    return folder


def load_rank_part(path: str | Path, rank: int) -> dict[str, Any] | None:
    """Process ``rank``'s part (its generator states) of a verified checkpoint, or None when it has none.

    Raises:
        CheckpointError: the part's files cannot be parsed.
    """
    path, name = Path(path), rank_part(rank)
    if not (path / f"{name}.json").is_file():
        return None
    try:
        return load_tree(path, name)
    except (OSError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: part {name!r} cannot be read ({e})") from None


def save_checkpoint(run_dir: str | Path, counters: dict[str, Any], parts: dict[str, Any], keep: int,
                    staged: Path | None = None) -> Path:
    """Write one checkpoint atomically, then delete all but the newest ``keep`` (never the newest good one).

    Args:
        run_dir: the run's output folder.
        counters: JSON-able training position (must hold "step", "phase" and "finite") plus anything to keep.
        parts: {"model": ..., "optimizer": ..., "scheduler": ..., "method": ..., "rng": ...}: trees of
            tensors, arrays, numbers, strings, lists, tuples and dicts (common.safetree).
        keep: how many checkpoints to keep (>= 1).
        staged: a folder of files the other processes wrote for this checkpoint (``staging_dir``): moved
            in before the manifest is hashed, then the folder is removed.

    Returns:
        The checkpoint folder.
    """
    path = checkpoint_dir(run_dir) / _name(counters["step"], counters["phase"])
    with atomic_dir(path, overwrite=True) as tmp:
        for name, obj in parts.items():
            save_tree(obj, tmp, name)
        for f in sorted(staged.iterdir()) if staged is not None else []:
            os.replace(f, tmp / f.name)  # same file system (both under checkpoints/): a rename, no copy
        # hashed from the files as they are on disk, so the manifest vouches for what was written
        files = {name: _sha256(tmp / name) for name in _files(tmp)}
        state = {**counters, "format": FORMAT, "contents": _contents(files)}
        atomic_write_json(tmp / STATE, {**state, "digest": _digest(state)})
        files[STATE] = _sha256(tmp / STATE)
        atomic_write_json(tmp / MANIFEST, {"format": FORMAT, "sha256": files})
    if staged is not None:
        shutil.rmtree(staged, ignore_errors=True)
    _rotate(run_dir, keep, newest=path, newest_good=bool(counters["finite"]))
    return path


def verify(path: str | Path) -> dict[str, Any]:
    """Check a checkpoint folder against its manifest; returns its state.json.

    Raises:
        CheckpointError: format 1 (pickle), no manifest, a file missing, changed or not in the manifest,
            or an unreadable state.json; the message names the folder and the problem.
    """
    path = Path(path)
    if not (path / MANIFEST).is_file():
        if any(path.glob("*.pt")):
            raise CheckpointError(
                f"{path}: written in checkpoint format 1 (pickled *.pt files) by an older version of this "
                "project; it is not loaded, because unpickling files from a run folder can run arbitrary code. "
                "Resume it with the version that wrote it, or start a new run (--name / --overwrite)")
        raise CheckpointError(f"{path}: no {MANIFEST} (an interrupted or foreign folder)")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        expected: dict[str, str] = manifest["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: unreadable {MANIFEST} ({e})") from None
    present = set(_files(path)) - {MANIFEST}
    for name in sorted(present - expected.keys()):
        raise CheckpointError(f"{path}: {name} is not in the manifest (added after the checkpoint was written)")
    for name, digest in sorted(expected.items()):
        if name not in present:
            raise CheckpointError(f"{path}: {name} is missing")
        if _sha256(path / name) != digest:
            raise CheckpointError(f"{path}: {name} does not match its sha256 in the manifest (changed or corrupted "
                                  "after it was written)")
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {STATE} ({e})") from None
    if "contents" in state and state["contents"] != _contents(expected):
        raise CheckpointError(f"{path}: its files are not the ones {STATE} was written with (the manifest was made "
                              "again over changed files)")
    if "digest" in state and state["digest"] != _digest(state):
        raise CheckpointError(f"{path}: {STATE} is not as it was written (its config or counters were edited, and "
                              "the manifest made again)")
    try:
        where = _position(path)
    except ValueError:
        where = None
    if where is not None and (state.get("step"), state.get("phase")) != where:
        raise CheckpointError(f"{path}: {STATE} says step {state.get('step')}, phase {state.get('phase')}, but the "
                              f"checkpoint was written at step {where[0]}, phase {where[1]} (its name)")
    return state


def is_good(path: str | Path) -> bool:
    """True when ``path`` verifies and its weights were finite when saved."""
    try:
        return bool(verify(path).get("finite", False))
    except CheckpointError:
        return False


def latest_good(run_dir: str | Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest good checkpoint of a run, or None; ``warn`` receives one line per newer one skipped."""
    for path in reversed(list_checkpoints(run_dir)):
        try:
            state = verify(path)
        except CheckpointError as e:
            if warn:
                warn(f"skipping checkpoint: {e}")
            continue
        if state.get("finite", False):
            return path
        if warn:
            warn(f"skipping checkpoint: {path}: its weights were not finite when saved")
    return None


def resume_point(run_dir: str | Path, warn: Callable[[str], None]) -> Path:
    """The checkpoint ``--resume`` continues from: the newest good one (``warn`` hears of every newer one
    that is skipped, and why).

    Raises:
        FileNotFoundError: the run has no checkpoint at all.
        CheckpointError: none is usable; the message lists each one's problem.
    """
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"--resume: no checkpoint under {checkpoint_dir(run_dir)}")
    problems: list[str] = []
    path = latest_good(run_dir, warn=lambda msg: (problems.append(msg), warn(msg)))
    if path is None:
        raise CheckpointError("--resume: no usable checkpoint:\n  " + "\n  ".join(problems))
    return path


def _rotate(run_dir: str | Path, keep: int, newest: Path, newest_good: bool) -> None:
    # The checkpoint just written was hashed from disk, so it is good when its weights are finite; only
    # otherwise are the older ones verified, to spare the newest good one from deletion.
    found = list_checkpoints(run_dir)
    old, kept = found[:-keep], found[-keep:]
    if old and not newest_good and not any(is_good(p) for p in reversed(kept)):
        spare = next((p for p in reversed(old) if is_good(p)), None)
        old = [p for p in old if p != spare]
    for p in old:
        if p != newest:
            shutil.rmtree(p, ignore_errors=True)


def read_state(path: str | Path) -> dict[str, Any]:
    """The counters and config of a checkpoint (state.json) without verifying or loading its tensors."""
    return json.loads((Path(path) / STATE).read_text())


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify and read a checkpoint folder; returns (state.json, {part name: loaded tree}).

    Raises:
        CheckpointError: see ``verify``; also a part whose files cannot be parsed.
    """
    path = Path(path)
    state = verify(path)
    parts = {}
    for name in PARTS:
        if name in ("model", "optimizer") and state.get("sharded"):
            continue  # in sharded/, read by every process (progressive.run.shards)
        try:
            parts[name] = load_tree(path, name)
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{path}: part {name!r} cannot be read ({e})") from None
    return state, parts
