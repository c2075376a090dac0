"""Ending Accelerate trackers cleanly (shared by train.py and the eval CLIs)."""

from __future__ import annotations

import sys
from typing import Any


def end_trackers(accelerator: Any) -> None:
    """``accelerator.end_training()``, plus ``trackio.finish()`` when trackio is in use.

    Accelerate finishes trackio's run object but leaves trackio's current run set, so trackio's exit
    hook would finish it again later and print after everything else (e.g. after pytest's summary).
    """
    accelerator.end_training()
    trackio = sys.modules.get("trackio")
    if trackio is not None:
        try:
            trackio.finish()
        except RuntimeError:  # no current run: nothing left to finish
            pass
