"""Hugging Face Hub access that fails fast and says what to do, instead of retrying for half a minute.

``hub_call(what, fn)`` runs ``fn`` (a ``datasets.load_dataset`` / ``from_pretrained`` call by name):
- in offline mode (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set) the libraries read only the local cache;
  a miss becomes one line naming what is missing and that offline mode is on;
- otherwise the Hub endpoint (HF_ENDPOINT, default https://huggingface.co) is probed first with a
  3-second TCP connect; when it cannot be reached, one line says so and names the variables that make
  the libraries use the local cache (where a dataset or model fetched earlier is found).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlparse

__all__ = ["HubUnavailable", "hub_call", "offline", "OFFLINE_VARS"]

T = TypeVar("T")
OFFLINE_VARS = "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1"


class HubUnavailable(ValueError):
    """Something was asked of the Hub by name and the Hub cannot be used; the message says what to do."""


def offline() -> bool:
    """True when the Hugging Face libraries are told to stay offline."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _reachable(timeout: float = 3.0) -> bool:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout).close()
        return True
    except OSError:
        return False


def hub_call(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, a Hub lookup of ``what`` (e.g. "dataset 'imdb'"), failing fast with one clear line.

    Raises:
        HubUnavailable: offline and not cached, or the Hub cannot be reached.
    """
    if offline():
        try:
            return fn()
        except (OSError, ConnectionError, FileNotFoundError, ValueError) as e:
            raise HubUnavailable(f"{what} is not in the local Hugging Face cache and offline mode is on "
                                 f"(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); fetch it once with network access, or "
                                 f"give a local path ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    if not _reachable():
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        raise HubUnavailable(f"{what}: cannot reach the Hugging Face Hub at {endpoint} (no network?). To use what "
                             f"is in the local cache, set {OFFLINE_VARS}; otherwise give a local path")
    return fn()
