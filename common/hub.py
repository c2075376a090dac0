"""Hugging Face Hub access that fails fast and says what to do, instead of retrying for half a minute.

``hub_call(what, fn)`` runs ``fn`` (a ``datasets.load_dataset`` / ``from_pretrained`` call by name):
- in offline mode (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set) the libraries read only the local cache;
  a miss becomes one line naming what is missing and that offline mode is on;
- otherwise the Hub endpoint (HF_ENDPOINT, default https://huggingface.co) is probed first with a
  3-second TCP connect, or the proxy the libraries would use for it (HTTPS_PROXY / ALL_PROXY, either case,
  unless NO_PROXY names the host); when it cannot be reached, one line says so and names the variables that
  make the libraries use the local cache (where a dataset or model fetched earlier is found).
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


def _proxy_for(url) -> str | None:
    """The proxy the Hugging Face libraries (requests / httpx) use for ``url``: HTTPS_PROXY (or HTTP_PROXY
    for http), else ALL_PROXY, either case; None when NO_PROXY names the host (or is "*")."""
    env = {k.lower(): v for k, v in os.environ.items() if k.lower().endswith("_proxy") and v}
    host = (url.hostname or "").lower()
    for entry in (e.strip().lower() for e in env.get("no_proxy", "").split(",")):
        if entry and (entry == "*" or host == entry.lstrip(".") or host.endswith("." + entry.lstrip("."))):
            return None
    return env.get(f"{url.scheme}_proxy") or env.get("all_proxy")


def probe_target() -> tuple[str, int]:
    """(host, port) to probe before a Hub call: the proxy the libraries would go through, else the endpoint."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    proxy = _proxy_for(url)
    if proxy:
        p = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        return p.hostname or "localhost", p.port or (443 if p.scheme == "https"
                                                     else 1080 if "socks" in p.scheme else 80)
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def _reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(probe_target(), timeout=timeout).close()
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
