"""``python -m operators`` bounds what it writes by the disk space free where it writes, before anything loads: the
output folder's size (the resized model's parameters in its dtype, the tokenizer files it copies, a margin for the
small files) is estimated from the configs on the meta device, and a folder that cannot fit is refused in one line
naming the folder and the sizes (a full disk was met only at the write, after the loading and the resizing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import Shape, make_model
from transformers import LlamaForCausalLM

import operators as ops
import operators.cli
from operators.cli import DISK_MARGIN
from operators.cli import main as cli


@pytest.fixture
def ckpt(tmp_path):
    m = make_model(Shape(LlamaForCausalLM, heads=4, head_dim=4, layers=2, ffn_mult=2, kv_heads=2))
    m.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    return m, tmp_path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    return err


def _written(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


CASES = {  # op: (its arguments after IN OUT, the output's config from the input's)
    "decoalesce": (["--width", "2", "--depth", "2"], lambda c: ops.resized_config(c, 2, 2, "decoalesce")),
    "coalesce": (["--width", "2"], lambda c: ops.resized_config(c, 2, 1, "coalesce")),
    "interpolate": (["--alpha", "0.5"], lambda c: c),
}


@pytest.mark.parametrize("op", CASES)
def test_an_output_that_cannot_fit_on_the_disk_is_refused_before_anything_loads(ckpt, capsys, monkeypatch, op):
    m, tmp = ckpt
    extra, resized = CASES[op]
    with torch.device("meta"):
        n = sum(p.numel() for p in type(m)(resized(m.config)).parameters())
    need = 4 * n + len((tmp / "base" / "tokenizer_config.json").read_bytes()) + DISK_MARGIN  # float32
    inputs = [str(tmp / "base")] * (2 if op == "interpolate" else 1)
    argv = [op, *inputs, str(tmp / "out"), *extra]

    def loaded(*args, **kwargs):
        raise AssertionError("a checkpoint was loaded")

    monkeypatch.setattr(operators.cli, "free_disk", lambda path: need - 1)
    monkeypatch.setattr(operators.cli, "load_checkpoint", loaded)
    assert cli(argv) == 2
    assert _one_error_line(capsys) == (
        f"error: {tmp / 'out'}: the LlamaForCausalLM written there needs about {need:,} bytes on disk ({n:,} "
        f"parameters, {4 * n:,} bytes in float32, and {need - 4 * n - DISK_MARGIN:,} bytes of tokenizer files), more "
        f"than the {need - 1:,} bytes free in {tmp}; free some space or write elsewhere")
    assert not (tmp / "out").exists()
    monkeypatch.undo()
    monkeypatch.setattr(operators.cli, "free_disk", lambda path: need)  # exactly enough: written
    assert cli(argv) == 0
    assert need - DISK_MARGIN <= _written(tmp / "out") <= need  # the estimate bounds what is written, closely


def test_the_free_space_is_read_where_the_output_is_written(tmp_path, monkeypatch):
    """A new output folder under folders not made yet is written on the file system of its nearest folder."""
    import shutil
    from types import SimpleNamespace

    seen = []
    monkeypatch.setattr(shutil, "disk_usage", lambda path: seen.append(path) or SimpleNamespace(free=123))
    assert operators.cli.free_disk(tmp_path / "a" / "b" / "out") == 123 and seen == [tmp_path]
