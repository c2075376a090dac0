"""The data cache's own files: a trained tokenizer is sealed like the block files (damage is one line naming the file
and the entry to delete), an entry's meta.json that does not parse is named, and a block file's space is reserved
before it is memory-mapped (a full disk is the one-line "disk full", never SIGBUS)."""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
from pathlib import Path

import numpy as np
import pytest

from common.cli import run_cli
from progressive.config import DataConfig
from progressive.data import build_tokenizer, load_token_blocks

BPE = dict(tokenizer="bpe", vocab_size=384, max_tokens=20000)


def _refused(capsys, work) -> str:
    """The one line that ``run_cli`` prints for ``work()``'s failure (exit code 2, no traceback)."""
    capsys.readouterr()
    assert run_cli(lambda argv: work(), []) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer(DataConfig(tokenizer="gpt2"))


# ------------------------------------------------------------------------------------------ the tokenizer entry


def _entry(cfg: DataConfig) -> str:
    (entry,) = (Path(cfg.cache_dir) / "tokenizers").iterdir()  # the one trained tokenizer's folder
    return str(entry)


def test_a_damaged_cached_tokenizer_is_refused_naming_the_file_and_the_entry_to_delete(tmp_path, capsys):
    """A cut tokenizer.json said "Expecting ',' delimiter: line 49 column 13" (naming neither the file nor the
    cache); one edited into other valid JSON (the end-of-text token renamed) was used as it lay."""
    cfg = DataConfig(cache_dir=str(tmp_path / "c"), **BPE)
    ids = build_tokenizer(cfg)("hello world")["input_ids"]
    folder = _entry(cfg)
    path = os.path.join(folder, "tokenizer.json")
    good = open(path, "rb").read()
    fix = f"delete {folder} and it is built again"
    open(path, "wb").write(good[:1000])
    assert _refused(capsys, lambda: build_tokenizer(cfg)) == (
        f"error: data cache {path} has 1000 bytes, {len(good)} were written (truncated or replaced); {fix}")
    edited = good.replace(b"<|endoftext|>", b"<|endoftexx|>")
    assert len(edited) == len(good) and edited != good
    open(path, "wb").write(edited)
    assert _refused(capsys, lambda: build_tokenizer(cfg)) == (
        f"error: data cache {path} was changed after it was written (its sha256 differs); {fix}")
    open(path, "wb").write(good)  # put back: the same bytes are accepted again
    assert build_tokenizer(cfg)("hello world")["input_ids"] == ids
    os.remove(path)
    assert _refused(capsys, lambda: build_tokenizer(cfg)) == f"error: data cache {path} is missing; {fix}"


def test_a_tokenizer_entry_from_before_sealing_is_sealed_on_its_first_read_or_named_if_damaged(tmp_path, capsys):
    """An entry written without a seal (meta.json) is trusted once and sealed; one that no longer loads is named."""
    cfg = DataConfig(cache_dir=str(tmp_path / "c"), **BPE)
    ids = build_tokenizer(cfg)("hello world")["input_ids"]
    folder = _entry(cfg)
    meta = json.loads(open(os.path.join(folder, "meta.json")).read())
    assert sorted(meta["files"]) == sorted(n for n in os.listdir(folder) if n != "meta.json")
    os.remove(os.path.join(folder, "meta.json"))
    assert build_tokenizer(cfg)("hello world")["input_ids"] == ids
    assert json.loads(open(os.path.join(folder, "meta.json")).read()) == meta  # sealed again, the same
    os.remove(os.path.join(folder, "meta.json"))
    path = os.path.join(folder, "tokenizer.json")
    open(path, "w").write(open(path).read()[:1000])
    line = _refused(capsys, lambda: build_tokenizer(cfg))
    assert line.startswith(f"error: data cache {path} cannot be read as a tokenizer (")
    assert line.endswith(f"); delete {folder} and it is built again")


def test_a_cache_entry_whose_meta_json_does_not_parse_is_refused_naming_it(gpt2, tmp_path, capsys):
    """A cut meta.json of a block entry said "Expecting value: line 1 column 13 (char 12)"."""
    cfg = DataConfig(seq_len=32, max_tokens=20000, cache_dir=str(tmp_path / "c"))
    folder = load_token_blocks(cfg, gpt2).path
    (folder / "meta.json").write_text('{"dataset": ')
    assert _refused(capsys, lambda: load_token_blocks(cfg, gpt2)) == (
        f"error: data cache {folder / 'meta.json'} is not valid JSON (Expecting value: line 1 column 13 (char 12)); "
        f"delete {folder} and it is built again")
    (folder / "meta.json").write_text('["not", "an", "entry"]')
    assert _refused(capsys, lambda: load_token_blocks(cfg, gpt2)) == (
        f"error: data cache {folder / 'meta.json'} is not this project's record of a cache entry; "
        f"delete {folder} and it is built again")


# ------------------------------------------------------------------------------------------ a full disk


def test_a_full_disk_under_the_data_cache_is_one_line_and_leaves_no_half_made_entry(gpt2, tmp_path, capsys,
                                                                                     monkeypatch):
    """A memory-mapped block file on a full disk died of SIGBUS (exit 135, no message): its pages had no blocks
    behind them. The file's space is reserved first, so the disk's refusal is an OSError (ENOSPC), the one line."""
    cfg = DataConfig(seq_len=32, max_tokens=20000, cache_dir=str(tmp_path / "c"))
    asked = []

    def full(fd, offset, size):
        asked.append((offset, size))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    line = _refused(capsys, lambda: load_token_blocks(cfg, gpt2))
    blocks = tmp_path / "c" / "blocks"
    assert line.startswith("error: disk full while writing (")  # common/cli.py's line for ENOSPC, the path first
    assert re.search(  # the path in full at the end: the entry's own name, not its temporary folder's
        r"\[Errno 28\] No space left on device \(reserving 0\.04 MiB for a data cache file; free space under "
        rf"data\.cache_dir, or set it to another disk\): '{re.escape(str(blocks))}/[0-9a-f]{{20}}/train\.npy'$",
        line), line
    n = 20000 // 32
    assert asked == [(0, 128 + (n - round(n * 0.02)) * 32 * 2)]  # header + the train blocks' uint16 tokens
    assert list(blocks.iterdir()) == []  # no entry, no temporary folder, no file
    monkeypatch.undo()
    b = load_token_blocks(cfg, gpt2)  # with room again: built whole
    assert len(b.train) == n - round(n * 0.02) and len(b.val) == round(n * 0.02)


def test_every_block_and_image_file_is_reserved_whole_before_it_is_mapped(gpt2, tmp_path, monkeypatch):
    """When a block file is mapped for writing, every byte of it has disk blocks behind it (st_blocks), so no write
    through the map can find a full disk; a sparse file (np.lib.format.open_memmap's "w+") fails this."""
    from PIL import Image
    from transformers import ViTImageProcessor

    from progressive.data import load_image_split

    mapped = []

    class Checked(mmap.mmap):  # every memory map, as numpy makes it
        def __new__(cls, fileno, length, *args, **kwargs):
            if kwargs.get("access") == mmap.ACCESS_WRITE:
                st = os.fstat(fileno)
                mapped.append((st.st_size, st.st_blocks * 512))
            return super().__new__(cls, fileno, length, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", Checked)
    load_token_blocks(DataConfig(seq_len=32, max_tokens=20000, cache_dir=str(tmp_path / "c")), gpt2)
    for i in range(4):
        (tmp_path / "imgs" / "red").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (20, 12), (255, 0, 0)).save(tmp_path / "imgs" / "red" / f"{i}.png")
    load_image_split(DataConfig(dataset=str(tmp_path / "imgs"), cache_dir=str(tmp_path / "c")), "train",
                     ViTImageProcessor(size={"height": 16, "width": 16}))
    assert len(mapped) == 3  # train.npy, val.npy, pixels_uint8.npy
    for size, backed in mapped:
        assert backed >= size > 0


def test_a_reserved_file_holds_a_valid_empty_array_when_a_split_has_no_blocks(gpt2, tmp_path):
    """val_fraction 0: the val file has 0 rows; its reservation and map must still make a loadable .npy."""
    b = load_token_blocks(DataConfig(seq_len=32, max_tokens=20000, val_fraction=0.0,
                                     cache_dir=str(tmp_path / "c")), gpt2)
    assert b.val.shape == (0, 32) and b.val.dtype == np.uint16 and len(b.train) == 20000 // 32


def test_a_damaged_token_stream_is_refused_naming_it_when_blocks_are_cut_from_it(gpt2, tmp_path, capsys):
    """The token stream (tokens/<key>.u16) was the one cache file left unsealed: cut to an odd size it said "Size of
    available data is not a multiple of the data-type size" (naming nothing); cut to an even size, or edited, new
    blocks (another seq_len) were cut from it silently."""
    cfg = DataConfig(seq_len=32, max_tokens=20000, cache_dir=str(tmp_path / "c"))
    load_token_blocks(cfg, gpt2)
    (stream,) = (tmp_path / "c" / "tokens").glob("*.u16")
    good = stream.read_bytes()
    other = DataConfig(seq_len=64, max_tokens=20000, cache_dir=str(tmp_path / "c"))  # new blocks, the same stream
    fix = f"delete {stream} and it is built again"
    stream.write_bytes(good[:-3])
    assert _refused(capsys, lambda: load_token_blocks(other, gpt2)) == (
        f"error: data cache {stream} has {len(good) - 3} bytes, {len(good)} were written (truncated or replaced); "
        f"{fix}")
    stream.write_bytes(good[2:] + good[:2])  # the same size, the tokens shifted by one
    assert _refused(capsys, lambda: load_token_blocks(other, gpt2)) == (
        f"error: data cache {stream} was changed after it was written (its sha256 differs); {fix}")
    stream.write_bytes(good)
    assert len(load_token_blocks(other, gpt2).train) + len(load_token_blocks(other, gpt2).val) == 20000 // 64


# ------------------------------------------------------------------------------------------ one builder a folder

_LOAD = """
import sys
from progressive.config import DataConfig
from progressive.data import build_tokenizer, load_token_blocks
cfg = DataConfig(cache_dir=sys.argv[1], tokenizer="bpe", vocab_size=384, max_tokens=20000)
blocks = load_token_blocks(cfg, build_tokenizer(cfg))
print(blocks.path.name, int(blocks.train.sum()), flush=True)
"""


def test_processes_that_need_one_entry_at_once_build_it_once_and_read_the_same_blocks(tmp_path):
    """Two processes (two ranks of a node, or two nodes sharing a cache folder) start while the tokenizer's entry is
    being built elsewhere (this test holds its lock): both wait, then one trains the tokenizer and cuts the blocks and
    the other reads them; without the lock both would build (each saw no entry)."""
    import subprocess
    import sys

    from progressive.data.cache import building
    from progressive.data.tokenizers import tokenizer_entry
    from tests.train_utils import ROOT

    cfg = DataConfig(cache_dir=str(tmp_path), **BPE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with building(tokenizer_entry(cfg)):
        procs = [subprocess.Popen([sys.executable, "-c", _LOAD, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        waiting = [p.stderr.readline() for p in procs]  # each announces its wait before it blocks
    out = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in out]
    assert all(w.startswith("waiting for another process that is building ") for w in waiting), waiting
    said = "".join(e for _, e in out)
    assert said.count("training a bpe tokenizer") == 1, said
    assert out[0][0] == out[1][0] and out[0][0].split()[0] == Path(load_token_blocks(
        cfg, build_tokenizer(cfg)).path).name  # the same entry, the same tokens
    assert sorted(p.name for p in (tmp_path / "tokenizers").iterdir()) == [tokenizer_entry(cfg).name]
