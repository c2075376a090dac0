"""Silence transformers' chatter (e.g. one warning per image processor that would use torchvision, which has no
CPU build here, or the bar it draws over every ``save_pretrained``), keeping real errors visible."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def quiet_transformers() -> None:
    """Set transformers' logging to errors only; call before importing model classes. Imports nothing: before
    transformers is loaded, its TRANSFORMERS_VERBOSITY setting does it (so ``--help`` stays instant); after, its
    logging is set too."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.set_verbosity_error()


@contextlib.contextmanager
def no_save_bar() -> Iterator[None]:
    """Inside: transformers draws no progress bar ("Writing model shards", one per ``save_pretrained``, which
    a log would keep). Its switch is global (the Hub's bars too), so it is on again on leaving, as it was."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    if was_on:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()
