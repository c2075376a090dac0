"""Silence transformers' chatter (e.g. one warning per image processor that would use torchvision, which has no
CPU build here, or the bar it draws over every ``save_pretrained``), keeping real errors visible."""

from __future__ import annotations

import contextlib
import inspect
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


def _on_a_terminal(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


@contextlib.contextmanager
def terminal_bars() -> Iterator[bool]:
    """Inside: progress bars are drawn only when stderr is a terminal. A bar redraws itself with carriage returns
    (and ANSI escapes for nested bars), which a log file (a SLURM log, ``2> eval.log``) keeps as one long line of
    control characters. Ours ask for that with ``disable=None``; transformers' ("Loading weights"), datasets' and
    lm-evaluation-harness's pass ``disable=False`` or their own switches, so on a stream that is not a terminal
    every tqdm bar made inside is off (tqdm's ``__init__`` gets ``disable=True``), and tqdm is as it was on leaving.
    Lines written with ``tqdm.write`` and logging are unchanged.

    Yields:
        whether stderr is a terminal (bars drawn).
    """
    if _on_a_terminal(sys.stderr):
        yield True
        return
    import tqdm.std  # lazy: common/ imports nothing heavy until a bar is to be turned off

    original = tqdm.std.tqdm.__dict__["__init__"]  # a function, or the partialmethod of tqdm's TQDM_* settings
    at = list(inspect.signature(tqdm.std.tqdm.__init__).parameters).index("disable") - 1  # its place after self

    def quiet(self: object, *args: object, **kwargs: object) -> None:
        if len(args) > at:
            args = (*args[:at], True, *args[at + 1:])
        else:
            kwargs["disable"] = True
        original.__get__(self, type(self))(*args, **kwargs)

    tqdm.std.tqdm.__init__ = quiet
    try:
        yield False
    finally:
        tqdm.std.tqdm.__init__ = original
