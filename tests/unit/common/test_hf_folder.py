"""common/hf_folder.py: a checkpoint folder is checked at the boundary, so damaged or hostile files are one line
naming the file and what is wrong, never a traceback from safetensors or transformers, and never an allocation of
what a header or a config merely claims."""

from __future__ import annotations

import json
import re
import shutil
import struct

import pytest
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from common import hf_folder
from common.hf_folder import CheckpointFolderError, check_checkpoint_folder, load_weights
from eval import zeroshot
from operators.cli import main as operators_cli

GPT = dict(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=0)


@pytest.fixture
def ckpt(tmp_path):
    GPT2LMHeadModel(GPT2Config(**GPT)).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _header(path):
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _write(path, header, data: bytes, pad: int = 0) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data + b"\0" * pad)


def _first(header) -> str:
    return next(k for k in header if k != "__metadata__")


def _cli_error(capsys, argv) -> str:
    """The one line ``python -m eval.zeroshot ARGV`` prints, asserting exit code 2 and nothing else on stderr."""
    assert zeroshot.cli(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# ---------------------------------------------------------------- the safetensors header


def test_a_header_length_past_the_formats_limit_is_refused_without_reading_it(ckpt):
    """A header claiming 200 MB in a (sparse) file that long was read whole before the check; safetensors' own
    limit is 100,000,000 bytes, so it is refused from its first 8 bytes."""
    f = ckpt / "model.safetensors"
    n = 200_000_000
    with open(f, "wb") as out:
        out.write(struct.pack("<Q", n) + b"{")
        out.truncate(8 + n + 16)
    with pytest.raises(CheckpointFolderError, match=re.escape(f"{f}: its safetensors header claims 200,000,000 "
                                                              "bytes, past the format's limit of 100,000,000")):
        check_checkpoint_folder(ckpt)


@pytest.mark.parametrize("edit, problem", [
    (lambda h, k: h[k].pop("data_offsets"), "has no data_offsets"),
    (lambda h, k: h[k].update(data_offsets=[0]), "data_offsets must be two byte offsets [begin, end], got [0]"),
    (lambda h, k: h[k].update(data_offsets=["0", 4]), "data_offsets must be two byte offsets [begin, end], got "
                                                      "['0', 4]"),
    (lambda h, k: h[k].update(dtype="Q99"), "unknown dtype 'Q99'"),
    (lambda h, k: h[k].pop("dtype"), "unknown dtype None"),
    (lambda h, k: h[k].update(shape=[3, -1]), "shape must be a list of sizes >= 0, got [3, -1]"),
    (lambda h, k: h[k].update(shape="16"), "shape must be a list of sizes >= 0, got '16'"),
    (lambda h, k: h[k].update(shape=[3, 3]), "shape [3, 3] of F32 needs 36 bytes, its data_offsets give"),
    (lambda h, k: h.update({k: 5}), "is not an object"),
    (lambda h, k: h.update(__metadata__={"format": 1}), "__metadata__ must map names to strings"),
])
def test_a_malformed_header_entry_is_refused_naming_the_file_the_tensor_and_the_field(ckpt, capsys, edit, problem):
    """Each of these reached safetensors or our own offsets check as a KeyError, TypeError or SafetensorError."""
    f = ckpt / "model.safetensors"
    header, data = _header(f)
    key = _first(header)
    edit(header, key)
    _write(f, header, data)
    with pytest.raises(CheckpointFolderError) as e:
        check_checkpoint_folder(ckpt)
    assert str(e.value).startswith(f"checkpoint: {f}: ") and problem in str(e.value)
    if problem != "__metadata__ must map names to strings":
        assert f"tensor '{key}'" in str(e.value)
    line = _cli_error(capsys, [str(ckpt), "--tasks", "ptb", "--output", str(ckpt.parent / "r.json")])
    assert problem in line


def test_tensors_that_leave_a_gap_or_overlap_or_leave_bytes_over_are_refused(ckpt):
    """safetensors wants the tensors to tile the data exactly: a gap, an overlap or bytes past the last tensor
    were SafetensorErrors ("invalid offset", "incomplete metadata") after our check had passed them."""
    f = ckpt / "model.safetensors"
    header, data = _header(f)
    _write(f, header, data, pad=8)
    with pytest.raises(CheckpointFolderError, match=f"{len(data) + 8} bytes of tensor data, its header's tensors "
                                                    f"cover {len(data)}"):
        check_checkpoint_folder(ckpt)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [begin + 4, end + 4]
    _write(f, header, data + b"\0" * 4)
    with pytest.raises(CheckpointFolderError, match=f"tensor '{last}' starts at byte {begin + 4}, where the tensor "
                                                    f"before it ends at {begin}"):
        check_checkpoint_folder(ckpt)


# ---------------------------------------------------------------- config.json's model_type


@pytest.mark.parametrize("model_type, said", [("gpt9", "'gpt9'"), (7, "7")])
def test_an_unknown_model_type_is_one_line_naming_it_and_the_transformers_version(ckpt, capsys, model_type, said):
    """transformers' own error was three lines of advice to install from source."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["model_type"] = model_type
    (ckpt / "config.json").write_text(json.dumps(cfg))
    want = (f"{ckpt / 'config.json'} names model_type {said}, which transformers {transformers.__version__} "
            "installed here does not know")
    with pytest.raises(CheckpointFolderError, match=re.escape(want)):
        check_checkpoint_folder(ckpt)
    assert want in _cli_error(capsys, [str(ckpt), "--tasks", "ptb", "--output", str(ckpt.parent / "r.json")])
    assert operators_cli(["decoalesce", str(ckpt), str(ckpt.parent / "out")]) == 2
    assert want in capsys.readouterr().err


# ---------------------------------------------------------------- sizes bounded before allocating


@pytest.fixture
def never_loads(monkeypatch):
    """from_pretrained fails the test instead of allocating (the checks below must refuse before it)."""

    def boom(cls, *a, **k):
        raise AssertionError("from_pretrained was called")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(boom))


def test_a_model_larger_than_the_memory_available_is_refused_before_it_loads(ckpt, monkeypatch, never_loads):
    n = sum(p.numel() for p in GPT2LMHeadModel(GPT2Config(**GPT)).parameters())
    monkeypatch.setattr(hf_folder, "available_memory", lambda: 1_000)
    with pytest.raises(CheckpointFolderError, match=re.escape(
            f"checkpoint: {ckpt}: a GPT2LMHeadModel of {n:,} parameters needs {4 * n:,} bytes in float32, more "
            "than the 1,000 bytes of memory available here")):
        load_weights(GPT2LMHeadModel, ckpt)
    monkeypatch.setattr(hf_folder, "available_memory", lambda: 4 * n)
    with pytest.raises(AssertionError, match="from_pretrained was called"):  # it fits: the load goes on
        load_weights(GPT2LMHeadModel, ckpt)


def test_a_config_and_header_that_agree_on_a_960_gb_model_are_refused_before_any_allocation(tmp_path, capsys,
                                                                                            never_loads):
    """The issue's case: config.json and a (sparse) safetensors file describe a 240-billion-parameter GPT-2, whole
    and consistent; eval loaded it without a size check."""
    big = dict(GPT, n_embd=20_480, n_layer=48, n_head=32, n_positions=1024, vocab_size=50_257)
    folder = tmp_path / "huge"
    folder.mkdir()
    GPT2Config(**big).save_pretrained(folder)
    with torch.device("meta"):
        state = GPT2LMHeadModel(GPT2Config(**big)).state_dict()
    header, offset = {}, 0
    for name, t in state.items():
        if name == "lm_head.weight":  # tied to the embedding
            continue
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + 4 * t.numel()]}
        offset += 4 * t.numel()
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)
    assert offset > 900e9
    check_checkpoint_folder(folder)  # whole and consistent
    line = _cli_error(capsys, [str(folder), "--tasks", "ptb", "--output", str(tmp_path / "r.json")])
    assert re.search(r"a GPT2LMHeadModel of 24\d,\d{3},\d{3},\d{3} parameters needs 9\d\d,\d{3},\d{3},\d{3} bytes "
                     r"in float32, more than the [\d,]+ bytes of memory available here", line), line


def test_a_config_with_more_layers_than_its_weights_hold_tensors_is_refused_before_building_it(ckpt, never_loads):
    """Building even an empty (meta) model takes ~10 ms and ~30 kB a layer (10 million: hours and hundreds of
    gigabytes): the layer count is checked against the tensors in the headers first (every layer holds one or more).
    5,000 layers keep this test's run bounded should the check be switched off."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["n_layer"] = 5_000
    (ckpt / "config.json").write_text(json.dumps(cfg))
    header, _ = _header(ckpt / "model.safetensors")
    with pytest.raises(CheckpointFolderError, match=re.escape(
            f"checkpoint: {ckpt / 'config.json'}: num_hidden_layers 5,000 is more than the "
            f"{len(header) - ('__metadata__' in header)} tensors its weights hold")):
        load_weights(GPT2LMHeadModel, ckpt)


def test_a_folder_save_pretrained_wrote_passes_every_check_and_loads_whole(ckpt, tmp_path):
    """The checks refuse nothing a real save_pretrained folder holds (tied head, metadata, every tensor)."""
    copy = tmp_path / "copy"
    shutil.copytree(ckpt, copy)
    model, new = load_weights(GPT2LMHeadModel, copy)
    assert new == [] and sum(p.numel() for p in model.parameters()) > 0
