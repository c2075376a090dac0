"""Ending Accelerate trackers cleanly (shared by train.py and the eval CLIs)."""

from __future__ import annotations

import sys
from typing import Any


def end_trackers(accelerator: Any) -> None:
    """``accelerator.end_training()``, then wait for the trackers' background writers.

    W&B writes through a separate service process: ``run.finish()`` can return before the offline
    ``.wandb`` file holds the logged rows (seen under load: only its 7-byte header), so ``wandb.teardown()``
    (documented: "waits for W&B to finish") follows, and the file is complete when this returns.
    Accelerate finishes trackio's run object but leaves trackio's current run set, so trackio's exit
    hook would finish it again later and print after everything else (e.g. after pytest's summary).
    """
    used = {type(t).__name__ for t in getattr(accelerator, "trackers", [])}
    accelerator.end_training()
    wandb = sys.modules.get("wandb")
    if wandb is not None and any("WandB" in n for n in used):
        wandb.teardown()
    trackio = sys.modules.get("trackio")
    if trackio is not None:
        try:
            trackio.finish()
        except RuntimeError:  # no current run: nothing left to finish
            pass
