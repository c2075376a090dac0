"""A log file holds lines: with stderr not a terminal (a SLURM log, `2> eval.log`), no progress bar writes carriage
returns or ANSI escapes into it, ours or a library's (transformers' "Loading weights", datasets', the harness's)."""

from __future__ import annotations

import contextlib
import io

import pytest
from test_zeroshot_helpers import make_tiny_gpt2
from tqdm import std as tqdm_std
from tqdm.auto import tqdm

from eval import zeroshot


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"), n_positions=80)


def test_an_eval_cli_with_stderr_to_a_file_writes_no_carriage_return_or_escape(tiny, tmp_path):
    log = tmp_path / "eval.log"
    with open(log, "w") as f, contextlib.redirect_stderr(f):
        zeroshot.main([str(tiny), "--tasks", "lambada,ptb", "--limit", "100", "--batch_size", "2",
                       "--output", str(tmp_path / "r.json")])
    text = log.read_bytes()
    assert b"\r" not in text and b"\x1b" not in text, text[:400]
    assert (tmp_path / "r.json").is_file()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_is_off_inside_when_stderr_is_a_file_and_drawn_on_a_terminal_and_the_switch_is_given_back():
    from common.quiet import terminal_bars

    before = tqdm_std.tqdm.__dict__["__init__"]
    for stream, drawn in ((io.StringIO(), False), (_Terminal(), True)):
        with contextlib.redirect_stderr(stream), terminal_bars():
            for _ in tqdm(range(3), desc="x", disable=False):  # as lm-evaluation-harness asks: explicitly on
                pass
        assert ("\r" in stream.getvalue()) is drawn, stream.getvalue()
    assert tqdm_std.tqdm.__dict__["__init__"] is before  # nothing left patched after the block
