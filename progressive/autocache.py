"""AutoCache's store (He et al., PipeTransformer, ICML 2021, sec. 3.4): the frozen prefix's output per sample.

Every training sample has at most one entry: the hidden states that leave the frozen prefix (the input
of the first trainable layer), with the depth d at which they were computed, i.e. the output of layers
0..d-1. A freeze decision raises the frozen depth F; entries at d < F become *stale* but stay useful: they
feed layers d..F-1 only (the incremental path, ``AutoFreeze``'s forward), and the result replaces them
at depth F. Entries are never at a depth above F (freezing is monotone).

Two tiers, each with a byte bound: memory (CPU tensors) and disk (one pre-allocated ``np.memmap`` of
fixed-size slots, written in place). New entries go to memory while it has room, then to disk; when both
are full, a sample is not cached and its prefix is recomputed each time (no eviction: with a shuffled
epoch every sample is equally likely next, so keeping the first ones is as good as any policy and costs
nothing). The authors' disk tier was an empty stub and their memory tier had no bound but a 65% RAM cap.

Keys are sample indices of the training set (the data stream's permutation indexes a fixed array), so a
cached activation is only right when a sample's model input is the same every time it is drawn. The
method refuses to enable the cache for MLM (re-masked every step); image and text inputs here carry no
random augmentation. Under DDP each process caches the samples it draws.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["ActivationCache", "CacheStats"]


@dataclass
class CacheStats:
    """Counters since the cache was created (per process)."""

    hits: int = 0          # samples served at the current depth
    partial: int = 0       # samples served from a stale depth (incremental path)
    misses: int = 0        # samples whose whole prefix ran
    memory_bytes: int = 0
    disk_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of looked-up samples that skipped at least part of the prefix."""
        total = self.hits + self.partial + self.misses
        return (self.hits + self.partial) / total if total else 0.0


class ActivationCache:
    """Per-sample activations of shape ``shape`` and dtype ``dtype``, at most one per sample id.

    Args:
        shape: one sample's activation shape, e.g. (seq_len, hidden).
        dtype: torch dtype stored (the model's activation dtype).
        memory_bytes: bound of the memory tier (>= 0).
        disk_bytes: bound of the disk tier (>= 0; 0 = no disk tier).
        disk_dir: folder for the disk tier's file (created; removed by ``close``).
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, memory_bytes: int, disk_bytes: int = 0,
                 disk_dir: str | Path | None = None):
        if memory_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"cache bounds must be >= 0, got memory {memory_bytes}, disk {disk_bytes}")
        self.shape, self.dtype = tuple(shape), dtype
        self.entry_bytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        self.mem_slots = memory_bytes // self.entry_bytes
        self.disk_slots = disk_bytes // self.entry_bytes if disk_dir is not None else 0
        self.mem: dict[int, torch.Tensor] = {}
        self.disk_of: dict[int, int] = {}  # sample id -> slot in the memmap
        self.depth_of: dict[int, int] = {}
        self.stats = CacheStats()
        self._disk: np.memmap | None = None
        self._dir = Path(disk_dir) if disk_dir is not None else None
        if self.disk_slots:
            self._dir.mkdir(parents=True, exist_ok=True)
            np_dtype = torch.empty((), dtype=dtype).numpy().dtype if dtype != torch.bfloat16 else np.uint16
            self._disk = np.memmap(self._dir / "activations.bin", dtype=np_dtype, mode="w+",
                                   shape=(self.disk_slots, *self.shape))

    def depths(self, ids: np.ndarray) -> np.ndarray:
        """The cached depth of each sample of ``ids`` (-1: not cached)."""
        return np.array([self.depth_of.get(int(i), -1) for i in ids], dtype=np.int64)

    def get(self, ids: np.ndarray) -> torch.Tensor:
        """The cached activations of ``ids`` stacked [len(ids), *shape] (every id must be cached)."""
        out = []
        for i in map(int, ids):
            if i in self.mem:
                out.append(self.mem[i])
            else:
                raw = torch.from_numpy(np.array(self._disk[self.disk_of[i]]))
                out.append(raw.view(self.dtype) if self.dtype == torch.bfloat16 else raw)
        return torch.stack(out)

    def put(self, ids: np.ndarray, depth: int, values: torch.Tensor) -> None:
        """Store ``values[k]`` as sample ``ids[k]``'s activation at ``depth`` (replacing a stale entry in
        its slot); samples that fit in neither tier are left out."""
        values = values.detach().to("cpu", self.dtype)
        for k, i in enumerate(map(int, ids)):
            v = values[k]
            if i in self.mem:
                self.mem[i] = v.clone()
            elif i in self.disk_of:
                self._write_disk(self.disk_of[i], v)
            elif len(self.mem) < self.mem_slots:
                self.mem[i] = v.clone()
            elif len(self.disk_of) < self.disk_slots:
                self.disk_of[i] = len(self.disk_of)
                self._write_disk(self.disk_of[i], v)
            else:
                continue
            self.depth_of[i] = depth
        self.stats.memory_bytes = len(self.mem) * self.entry_bytes
        self.stats.disk_bytes = len(self.disk_of) * self.entry_bytes

    def _write_disk(self, slot: int, v: torch.Tensor) -> None:
        self._disk[slot] = (v.view(torch.int16).numpy().view(np.uint16) if self.dtype == torch.bfloat16
                            else v.numpy())

    def clear(self) -> None:
        """Forget every entry (the frozen weights changed: all of them are wrong)."""
        self.mem.clear()
        self.disk_of.clear()
        self.depth_of.clear()
        self.stats.memory_bytes = self.stats.disk_bytes = 0

    def close(self) -> None:
        """Release the memory map and delete the disk tier's folder."""
        self.clear()
        self._disk = None
        if self._dir is not None and self.disk_slots:
            shutil.rmtree(self._dir, ignore_errors=True)
