"""Cache keys for the data caches (tokenizers, token streams, blocks, decoded images) under data.cache_dir.

A key is a short hash of everything that determines a cache entry's content (source identity, tokenizer
content, cut parameters, a format version), so a changed input never reads a stale entry. Entries are
published atomically with common.io.publish_once: the first complete copy wins when DDP ranks race.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["cache_key"]


def cache_key(obj: Any, length: int = 20) -> str:
    """The first ``length`` hex digits of sha256 over ``obj`` as canonical JSON (sorted keys; str() for the rest)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]
