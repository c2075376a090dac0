"""Silence transformers' import-time chatter (e.g. one warning per image processor that would use
torchvision, which has no CPU build here), keeping real errors visible."""

from __future__ import annotations

import os


def quiet_transformers() -> None:
    """Set transformers' logging to errors only; call before importing model classes."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging

        logging.set_verbosity_error()
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        pass
