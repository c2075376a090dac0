"""``method.autofreeze.cache``: AutoCache's settings (the cache's own; AutoFreeze owns the section)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AutoCacheConfig:
    """``method.autofreeze.cache``: keep the frozen prefix's output per sample. ``memory_mb`` / ``disk_mb``:
    byte bounds of the two tiers (MiB; the disk tier is capped at the free space less 1 GiB, with a warning);
    ``disk_dir``: the disk tier's folder (default <run>/autocache, removed at the end; in a folder of your
    choice only the files the cache created are removed); ``min_frozen``: cache only once this many layers
    are frozen (the paper: 3 for ViT-B)."""

    enabled: bool = False
    memory_mb: float = 1024.0
    disk_mb: float = 0.0
    disk_dir: str | None = None
    min_frozen: int = 1
