"""Starting and ending Accelerate trackers cleanly (shared by train.py and the eval CLIs)."""

from __future__ import annotations

import netrc
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

OFFLINE_MODES = ("offline", "disabled", "dryrun")


def wandb_credentials() -> str | None:
    """Where W&B would find credentials, without importing wandb: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or
    a netrc entry for the W&B host (WANDB_BASE_URL, default api.wandb.ai; NETRC or ~/.netrc), or None."""
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE"):
        if os.environ.get(var):
            return var
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if path.is_file() and netrc.netrc(path).authenticators(host):
            return str(path)
    except (OSError, netrc.NetrcParseError):
        return None
    return None


def wandb_offline_fallback(where: str) -> str | None:
    """Before anything is created: when W&B would fail for want of a login (no credentials, WANDB_MODE not
    set to online or offline), switch this process to offline logging and return the warning to print;
    else None. ``WANDB_MODE=online`` insists on online logging (credentials found some other way)."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in OFFLINE_MODES or mode == "online" or wandb_credentials():
        return None
    os.environ["WANDB_MODE"] = "offline"
    return (f"W&B has no credentials here (wandb login, WANDB_API_KEY or ~/.netrc): logging offline under {where}; "
            "upload later with `wandb sync <its offline-run folder>` (WANDB_MODE=online insists on online)")


def end_training(accelerator: Any) -> None:
    """Accelerate's ``end_training`` without ending a process group that other trainings still use: finish the
    trackers, wait for their background writers, and destroy the default process group only when it is a
    group of one (made for a single-process FSDP2 or pipeline run, or by a single-process launch).

    A group of several processes lives until the process ends (common.cli.leave_if_distributed): one
    process may run several trainings (``train.py --compare`` under torchrun or accelerate launch; Accelerate's
    ``end_training`` destroyed the group after the first method, and the second found none).

    W&B writes through a separate service process: ``run.finish()`` can return before the offline
    ``.wandb`` file holds the logged rows (seen under load: only its 7-byte header), so ``wandb.teardown()``
    (documented: "waits for W&B to finish") follows, and the file is complete when this returns.
    Accelerate finishes trackio's run object but leaves trackio's current run set, so trackio's exit
    hook would finish it again later and print after everything else (e.g. after pytest's summary); finishing
    both ways said "Uploading logs to Trackio" twice. So trackio's run is finished once, by ``trackio.finish()``,
    which ends the current run (the one Accelerate started) and forgets it.
    """
    used = {type(t).__name__ for t in getattr(accelerator, "trackers", [])}
    for tracker in getattr(accelerator, "trackers", []):
        if getattr(tracker, "name", None) != "trackio":  # finished below
            tracker.finish()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() == 1:
        dist.destroy_process_group()
    wandb = sys.modules.get("wandb")
    if wandb is not None and any("WandB" in n for n in used):
        wandb.teardown()
    trackio = sys.modules.get("trackio")
    if trackio is not None:
        try:
            trackio.finish()
        except RuntimeError:  # no current run: nothing left to finish
            pass
