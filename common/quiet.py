"""Silence transformers' import-time chatter (e.g. one warning per image processor that would use
torchvision, which has no CPU build here), keeping real errors visible."""

from __future__ import annotations

import os
import sys


def quiet_transformers() -> None:
    """Set transformers' logging to errors only; call before importing model classes. Imports nothing: before
    transformers is loaded, its TRANSFORMERS_VERBOSITY setting does it (so ``--help`` stays instant); after, its
    logging is set too."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.set_verbosity_error()

