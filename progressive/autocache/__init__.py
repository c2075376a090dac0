"""AutoCache (PipeTransformer's frozen-prefix activation cache): the two-tier store (``store.py``) and its
checked on-disk slot file (``slotfile.py``).

The store's public names (``store.__all__``) load on first use. Its settings, ``method.autofreeze.cache``, are
progressive.methods.autofreeze.options.AutoCacheConfig.
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    store = importlib.import_module(f"{__name__}.store")  # not "from . import": that would ask this function again
    if name in store.__all__:
        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
