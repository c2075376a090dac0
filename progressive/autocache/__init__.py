"""AutoCache (PipeTransformer's frozen-prefix activation cache): the two-tier store (``store.py``) and its
checked on-disk slot file (``slotfile.py``)."""

from progressive.autocache.store import *  # noqa: F403
from progressive.autocache.store import __all__  # noqa: F401
