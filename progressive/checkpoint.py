"""Full training-state checkpoints: written atomically, the last K kept, loaded for ``--resume``.

A checkpoint is a folder ``<run>/checkpoints/step<step>-phase<phase>/`` holding:

    state.json     counters (phase index, global step, step in phase, tokens, FLOPs, wall-clock), the run's
                   config, world size; written last inside the temporary folder
    model.pt       the unwrapped model's state_dict (tied weights stay tied: torch.save keeps aliases)
    optimizer.pt   the optimizer's state_dict (AdamW moments and step counts)
    scheduler.pt   the LR scheduler's state_dict (its position in the phase's schedule)
    method.pt      Method.state_dict() (the V-cycle's kept pre-coalescing weights)
    rng.pt         Python, NumPy, torch CPU and CUDA generator states (of the main process)

The folder is built under a temporary name and renamed (common.io.atomic_dir), so a crash mid-write
leaves the previous checkpoints untouched. The data position is the global step: batches are a pure
function of (seed, step) (progressive.data.batch_indices).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.io import atomic_dir, atomic_write_json

CHECKPOINTS = "checkpoints"


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


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary/partial folders are ignored)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    done = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / "state.json").is_file()]
    return sorted(done, key=lambda p: (read_state(p)["step"], read_state(p)["phase"]))


def save_checkpoint(run_dir: str | Path, counters: dict[str, Any], parts: dict[str, Any], keep: int) -> Path:
    """Write one checkpoint atomically and delete all but the newest ``keep``.

    Args:
        run_dir: the run's output folder.
        counters: JSON-able training position (must hold "step" and "phase") plus anything to keep.
        parts: {"model": ..., "optimizer": ..., "scheduler": ..., "method": ..., "rng": ...}, each saved
            with torch.save as <name>.pt.
        keep: how many checkpoints to keep (>= 1).

    Returns:
        The checkpoint folder.
    """
    path = checkpoint_dir(run_dir) / f"step{counters['step']:08d}-phase{counters['phase']:02d}"
    with atomic_dir(path, overwrite=True) as tmp:
        for name, obj in parts.items():
            torch.save(obj, tmp / f"{name}.pt")
        atomic_write_json(tmp / "state.json", counters)
    for old in list_checkpoints(run_dir)[:-keep]:
        if old != path:
            shutil.rmtree(old, ignore_errors=True)
    return path


def read_state(path: str | Path) -> dict[str, Any]:
    """The counters and config of a checkpoint (state.json) without loading its tensors."""
    return json.loads((Path(path) / "state.json").read_text())


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a checkpoint folder; returns (counters from state.json, {part name: loaded object})."""
    path = Path(path)
    counters = json.loads((path / "state.json").read_text())
    parts = {p.stem: torch.load(p, map_location="cpu", weights_only=False) for p in sorted(path.glob("*.pt"))}
    return counters, parts
