"""AutoCache's store (He et al., PipeTransformer, ICML 2021, sec. 3.4): the frozen prefix's output per sample.

Every training sample has at most one entry: the hidden states that leave the frozen prefix (the input
of the first trainable layer), with the depth d at which they were computed, i.e. the output of layers
0..d-1. A freeze decision raises the frozen depth F; entries at d < F become *stale* but stay useful: they
feed layers d..F-1 only (the incremental path, ``AutoFreeze``'s forward), and the result replaces them
at depth F. Entries are never at a depth above F (freezing is monotone).

Two tiers, each with a byte bound: memory (CPU tensors) and disk (progressive.autocache.slotfile: one file of
fixed-size slots, every entry carrying a checksum and the sample, depth, dtype and shape it was written
for, checked at every read; a failed check is a miss, never a wrong activation). New
entries go to memory while it has room, then to disk; when both are full, a sample is not cached and its
prefix is recomputed each time (no eviction: with a shuffled epoch every sample is equally likely next,
so keeping the first ones is as good as any policy and costs nothing). The authors' disk tier was an empty
stub and their memory tier had no bound but a 65% RAM cap.

Keys are sample indices of the training set (the data stream's permutation indexes a fixed array), so a
cached activation is only right when a sample's model input is the same every time it is drawn. The
method refuses to enable the cache for MLM (re-masked every step); image and text inputs here carry no
random augmentation. Under DDP each process caches the samples it draws. ``save`` / ``load`` write and
read a cache's whole content (a checkpoint's per-process part), so a resumed run continues with the same
entries.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from common.safetree import load_tree, save_tree
from progressive.autocache.slotfile import HEADER, SlotFile, slot_bytes

__all__ = ["ActivationCache", "CacheStats", "save_cache", "load_cache", "check_room"]


@dataclass
class CacheStats:
    """Counters since the cache was created (per process; kept across a resume)."""

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


def check_room(memory_mb: float, disk_mb: float, entry_bytes: int, disk_dir: Path) -> None:
    """Before any data loads: refuse bounds that could never hold one entry of ``entry_bytes``, and a disk
    tier whose folder cannot be written (a full disk or an absurd disk_mb is no error: the tier is capped
    when it starts, with a warning).

    Raises:
        ValueError: the message starts with ": " or ".disk_dir: " (the caller prefixes the config field).
    """
    if memory_mb * 2**20 < entry_bytes and disk_mb * 2**20 < entry_bytes + HEADER.size:
        raise ValueError(f": memory_mb {memory_mb} and disk_mb {disk_mb} cannot hold one sample's activation "
                         f"(at least {entry_bytes / 2**20:.3f} MiB); raise one of them, or set enabled false")
    if disk_mb == 0:
        return
    probe = Path(disk_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f".disk_dir: {probe} is a file, not a folder; choose a folder for the disk tier, or "
                         "set disk_mb 0")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f".disk_dir: this user cannot write in {probe}; choose another folder for the disk "
                         "tier, or set disk_mb 0")


def _say(msg: str) -> None:
    print(f"warning: AutoCache: {msg}", file=sys.stderr, flush=True)


class ActivationCache:
    """Per-sample activations of shape ``shape`` and dtype ``dtype``, at most one per sample id.

    Args:
        shape: one sample's activation shape, e.g. (seq_len, hidden).
        dtype: torch dtype stored (the model's activation dtype).
        memory_bytes: bound of the memory tier (>= 0).
        disk_bytes: bound of the disk tier's file, headers included (>= 0; 0 = no disk tier); capped at the
            free space less a margin, with a warning.
        disk_dir: folder of the disk tier's file (see progressive.autocache.slotfile: only the files the cache
            created are ever deleted).
        name: the disk file's prefix (one file per process, e.g. "rank0").
        warn: receives each warning line (default: stderr, "warning: AutoCache: ...").
        token: the identity written into every disk entry (default: random; ``load_cache`` passes the saved one).
        owned: ``disk_dir`` belongs to this run (stale files of a killed process of it are deleted).

    Raises:
        ValueError: negative bounds.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, memory_bytes: int, disk_bytes: int = 0,
                 disk_dir: str | Path | None = None, name: str = "cache", warn: Callable[[str], None] | None = None,
                 token: bytes | None = None, owned: bool = False):
        if memory_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"cache bounds must be >= 0, got memory {memory_bytes}, disk {disk_bytes}")
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        self.entry_bytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        self.mem_slots = memory_bytes // self.entry_bytes
        self.mem: dict[int, torch.Tensor] = {}
        self.disk_of: dict[int, int] = {}  # sample id -> slot in the disk file
        self.depth_of: dict[int, int] = {}
        self.stats = CacheStats()
        self.token = token or secrets.token_bytes(16)
        self.disk: SlotFile | None = None
        self._say = warn or _say
        want = disk_bytes // slot_bytes(self.shape, dtype)
        if want and disk_dir is not None:
            try:
                self.disk = SlotFile(Path(disk_dir), want, name, self.shape, dtype, self.token, owned, self._say)
            except OSError as e:
                self._say(f"no disk tier: cannot create a file in {disk_dir} ({e.strerror or e}); training goes on "
                          "with the memory tier only")

    @property
    def disk_slots(self) -> int:
        """The disk tier's capacity in entries (0: none)."""
        return self.disk.capacity if self.disk is not None else 0

    @property
    def bad(self) -> int:
        """Disk entries that failed a check when read (each was recomputed)."""
        return self.disk.bad if self.disk is not None else 0

    def depths(self, ids: np.ndarray) -> np.ndarray:
        """The cached depth of each sample of ``ids`` (-1: not cached)."""
        return np.array([self.depth_of.get(int(i), -1) for i in ids], dtype=np.int64)

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
        """(depths [n], values [n, *shape]) of the samples ``ids``: depth -1 where nothing usable is cached
        (a disk entry that fails its checks is forgotten here and reads as -1); rows at -1 are undefined."""
        depths = np.full(len(ids), -1, dtype=np.int64)
        values = torch.empty((len(ids), *self.shape), dtype=self.dtype)
        for k, i in enumerate(map(int, ids)):
            d = self.depth_of.get(i)
            if d is None:
                continue
            v = self.mem[i] if i in self.mem else self.disk.read(self.disk_of[i], i, d)
            if v is None:
                self._forget(i)
                continue
            values[k], depths[k] = v, d
        return depths, values

    def put(self, ids: np.ndarray, depth: int, values: torch.Tensor) -> None:
        """Store ``values[k]`` as sample ``ids[k]``'s activation at ``depth`` (replacing a stale entry in
        its slot); samples that fit in neither tier are left out."""
        values = values.detach().to("cpu", self.dtype)
        for k, i in enumerate(map(int, ids)):
            v = values[k]
            if i in self.mem:
                self.mem[i] = v.clone()
            elif i in self.disk_of:
                if not self.disk.write(self.disk_of[i], i, depth, v):
                    self._forget(i)  # its slot may hold half an entry now
                    continue
            elif len(self.mem) < self.mem_slots:
                self.mem[i] = v.clone()
            elif self.disk is not None and (slot := self.disk.new_slot()) is not None:
                if not self.disk.write(slot, i, depth, v):
                    continue
                self.disk_of[i] = slot
            else:
                continue
            self.depth_of[i] = depth
        self._sizes()

    def _forget(self, i: int) -> None:
        self.mem.pop(i, None)
        self.depth_of.pop(i, None)
        if (slot := self.disk_of.pop(i, None)) is not None:
            self.disk.drop(slot)
        self._sizes()

    def _sizes(self) -> None:
        self.stats.memory_bytes = len(self.mem) * self.entry_bytes
        self.stats.disk_bytes = len(self.disk_of) * self.entry_bytes

    def clear(self) -> None:
        """Forget every entry (the frozen weights changed: all of them are wrong)."""
        for i in list(self.depth_of):
            self._forget(i)

    def close(self) -> None:
        """Forget every entry and delete the disk tier's file (and its folder if the cache created it and
        nothing else is in it)."""
        self.mem.clear()
        self.disk_of.clear()
        self.depth_of.clear()
        self._sizes()
        if self.disk is not None:
            self.disk.close()
            self.disk = None

    def state(self) -> dict:
        """Everything but the disk tier's bytes, as a tree for common.safetree."""
        mem, disk = list(self.mem), sorted(self.disk_of, key=self.disk_of.get)
        d = self.disk
        return {"shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch."), "token": self.token.hex(),
                "mem_ids": np.array(mem, dtype=np.int64),
                "mem_depths": np.array([self.depth_of[i] for i in mem], dtype=np.int64),
                "mem_values": torch.stack([self.mem[i] for i in mem]) if mem else
                torch.zeros((0, *self.shape), dtype=self.dtype),
                "disk_ids": np.array(disk, dtype=np.int64),
                "disk_depths": np.array([self.depth_of[i] for i in disk], dtype=np.int64),
                "disk_slot": np.array([self.disk_of[i] for i in disk], dtype=np.int64),
                "disk_used": d.used if d else 0, "disk_capacity": d.capacity if d else 0,
                "disk_off": bool(d and d.off), "bad": self.bad,
                "stats": {k: v for k, v in asdict(self.stats).items() if not k.endswith("_bytes")}}


def save_cache(cache: ActivationCache | None, folder: Path, name: str) -> None:
    """Write ``cache`` (None: no cache yet) as ``folder/<name>.{json,safetensors}`` and, when its disk tier
    holds entries, ``folder/<name>.disk``: the used slots of its file, copied as they are (entries keep their
    headers and checksums, and the disk tier does not pass through memory at once).

    A disk tier whose file was cut outside the run loses its entries here (with a warning) instead of failing
    the checkpoint: the disk tier never stops training.

    Raises:
        OSError: the files cannot be written (a full disk fails the checkpoint, as any other part would).
    """
    if cache is not None and cache.disk_of and not cache.disk.intact():  # damaged outside this run: not saved
        cache._say(f"the disk tier's file {cache.disk.path} is shorter than its {len(cache.disk_of)} entries (cut "
                   "outside this run): they are forgotten and recomputed when drawn; the checkpoint is written without "
                   "them")
        for i in list(cache.disk_of):
            cache._forget(i)
    save_tree({"cache": None if cache is None else cache.state()}, folder, name)
    if cache is not None and cache.disk_of:
        cache.disk.copy_out(folder / f"{name}.disk")


def load_cache(folder: Path, name: str, memory_bytes: int, disk_bytes: int, disk_dir: Path | None,
               file_name: str = "cache", warn: Callable[[str], None] | None = None,
               owned: bool = False) -> ActivationCache | None:
    """The cache ``save_cache`` wrote (None if there was none), its disk entries copied into a new file in
    ``disk_dir`` (``file_name``, ``owned``: as ActivationCache's ``name``, ``owned``). Its disk capacity is
    the saved one, so it fills as the uninterrupted run's did, unless there is less free space now: then
    disk entries that do not fit are dropped with a warning (recomputed when drawn: not bit-identical).

    Raises:
        ValueError / OSError: unreadable files (the checkpoint's manifest was checked before this).
    """
    tree = load_tree(folder, name)["cache"]
    if tree is None:
        return None
    shape, dtype = tuple(tree["shape"]), getattr(torch, tree["dtype"])
    disk_bytes = min(disk_bytes, tree["disk_capacity"] * slot_bytes(shape, dtype))
    cache = ActivationCache(shape, dtype, memory_bytes, disk_bytes, disk_dir, file_name, warn,
                            bytes.fromhex(tree["token"]), owned)
    for i, d, v in zip(tree["mem_ids"].tolist(), tree["mem_depths"].tolist(), tree["mem_values"]):
        cache.mem[i], cache.depth_of[i] = v.clone(), d
    ids, slots = tree["disk_ids"].tolist(), tree["disk_slot"].tolist()
    used = int(tree["disk_used"])
    unused = sorted(set(range(used)) - set(slots))
    if ids and not (cache.disk and cache.disk.copy_in(folder / f"{name}.disk", used, unused)):
        cache._say(f"the {len(ids)} disk entries saved in {folder} do not fit in the disk tier now (less free "
                   "space, or a failed copy): they are recomputed when drawn, so this run is not bit-identical to "
                   "an uninterrupted one")
        ids = []
    for i, d, s in zip(ids, tree["disk_depths"].tolist(), slots):
        cache.disk_of[i], cache.depth_of[i] = s, d
    if cache.disk is not None:
        cache.disk.bad = tree["bad"]
        if tree["disk_off"]:
            cache.disk.off, cache.disk._free = True, []  # as it was: a full disk had turned it off
    cache.stats = CacheStats(**tree["stats"])
    cache._sizes()
    return cache
