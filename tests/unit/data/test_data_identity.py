"""Data identity is the content: a same-size edit with its mtime restored refuses a resume, a touch does not;
digests are cached per file (a second start reads nothing); a run folder and its dataset moved elsewhere
resume the same run bit for bit."""

import json
import os
import shutil
from dataclasses import replace

import pytest

import progressive.data.identity as identity
from progressive import cli as train_cli
from progressive.config import ConfigError
from progressive.data import classify, images, sources
from progressive.data.identity import content_identity
from progressive.run import checkpoint as ckpt
from progressive.run.start import decide
from progressive.run.trainer import SIGNAL_ENV, Trainer
from tests.train_utils import ROOT, rows, tiny_cfg

KEYS = ("kind", "step", "phase", "tokens", "flops", "loss", "lr", "val_loss")
TEXT = "the quick brown fox jumps over the lazy dog. " * 400


def _corpus(folder):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "corpus.txt"
    path.write_text(TEXT)
    return path


def _cfg(tmp_path, corpus, **extra):
    over = dict(method="baseline", train__steps=6, train__checkpoint_every=100, train__eval_every=3,
                model__dropout=0.1, data__dataset=str(corpus), data__max_tokens=None, data__vocab_size=300,
                data__cache_dir=str(tmp_path / "cache"), **extra)
    return tiny_cfg(tmp_path, **over)


def _stop_at_step_3(cfg, monkeypatch):
    from progressive.run.stop import Stopped

    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")
    with pytest.raises(Stopped):
        Trainer(cfg).run()
    monkeypatch.delenv(SIGNAL_ENV)


def _same_size_edit_with_mtime_restored(path):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[40:43] = b"cat" if bytes(data[40:43]) != b"cat" else b"dog"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    while path.stat().st_ctime_ns == st.st_ctime_ns:  # the kernel's ctime clock ticks every few ms
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_file_that_changed_just_before_it_was_hashed_is_hashed_again_next_time(tmp_path, monkeypatch):
    f = tmp_path / "data" / "fresh.txt"
    f.parent.mkdir()
    f.write_text("just written")
    read = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda p: (read.append(p.name), real(p))[1])
    content_identity([f], f.parent, tmp_path / "cache")
    content_identity([f], f.parent, tmp_path / "cache")
    assert read == ["fresh.txt", "fresh.txt"]  # written within RACY_SECONDS: not trusted to the index


def test_a_same_size_edit_with_the_mtime_restored_refuses_the_resume_and_a_touch_does_not(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "data")
    cfg = _cfg(tmp_path, corpus)
    _stop_at_step_3(cfg, monkeypatch)
    os.utime(corpus)  # touched: same bytes, new mtime
    ref = _cfg(tmp_path / "ref", corpus)
    Trainer(ref).run()
    Trainer(cfg, decide(cfg.run_dir, True)).run()  # the content is the same: it resumes, and continues the same run
    assert ([[r.get(k) for k in KEYS] for r in rows(cfg.run_dir)]
            == [[r.get(k) for k in KEYS] for r in rows(ref.run_dir)])

    other = _cfg(tmp_path / "edited", corpus)
    _stop_at_step_3(other, monkeypatch)
    _same_size_edit_with_mtime_restored(corpus)
    saved_config = (other.run_dir / "config.yaml").read_text()
    with pytest.raises(ConfigError, match="content of the training data or the tokenizer changed since this run"):
        Trainer(replace(other, train=replace(other.train, lr=1e-3)), decide(other.run_dir, True)).run()
    assert (other.run_dir / "config.yaml").read_text() == saved_config  # a refused resume leaves it as it was


def test_digests_are_cached_per_file_and_a_second_start_reads_nothing(tmp_path, monkeypatch):
    root = tmp_path / "data"
    files = []
    for i in range(3):
        files.append(root / f"part{i}.txt")
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_text(f"document {i} " * 100)
    monkeypatch.setattr(identity, "RACY_SECONDS", 0.0)  # the files were written just now
    read = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda p: (read.append(p.name), real(p))[1])
    first = content_identity(files, root, tmp_path / "cache")
    assert sorted(read) == ["part0.txt", "part1.txt", "part2.txt"]
    read.clear()  # a new start: the index is read from disk
    assert content_identity(files, root, tmp_path / "cache") == first and read == []
    _same_size_edit_with_mtime_restored(files[1])
    second = content_identity(files, root, tmp_path / "cache")
    assert read == ["part1.txt"] and second[1] != first[1] and second[0] == first[0]
    assert [name for name, _ in first] == ["part0.txt", "part1.txt", "part2.txt"]  # relative names, no paths


def test_a_run_folder_and_its_dataset_moved_elsewhere_resume_the_same_run(tmp_path, monkeypatch, capsys):
    corpus = _corpus(tmp_path / "data")
    ref = _cfg(tmp_path / "ref", corpus)
    Trainer(ref).run()
    cfg = _cfg(tmp_path / "first", corpus)
    _stop_at_step_3(cfg, monkeypatch)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    shutil.move(str(cfg.run_dir), str(moved / "renamed"))
    shutil.move(str(tmp_path / "data"), str(tmp_path / "data2"))
    shutil.move(cfg.data.cache_dir, str(tmp_path / "cache2"))
    assert train_cli.main(["--resume", "--output_dir", str(moved), "--name", "renamed", "--data.dataset",
                           str(tmp_path / "data2" / "corpus.txt"), "--data.cache_dir", str(tmp_path / "cache2")]) == 0
    err = capsys.readouterr().err
    assert "warning: resuming with a changed setting: output_dir" in err
    assert "resuming renamed from step 3" in err
    got = [[r.get(k) for k in KEYS] for r in rows(moved / "renamed")]
    assert got == [[r.get(k) for k in KEYS] for r in rows(ref.run_dir)]
    assert ckpt.list_checkpoints(moved / "renamed")


def test_a_checkpoint_from_before_content_fingerprints_resumes_with_a_warning(tmp_path, monkeypatch, capsys):

    from progressive.run.checkpoint import MANIFEST, STATE, _sha256

    corpus = _corpus(tmp_path / "data")
    cfg = _cfg(tmp_path, corpus)
    _stop_at_step_3(cfg, monkeypatch)
    (last,) = ckpt.list_checkpoints(cfg.run_dir)
    state = json.loads((last / STATE).read_text())
    state["data"] = "0123456789abcdef0123"  # an old-style fingerprint: a cache key over paths and mtimes
    state.pop("digest")  # and, as that version wrote it, no digest of state.json's own fields
    (last / STATE).write_text(json.dumps(state))
    manifest = json.loads((last / MANIFEST).read_text())
    manifest["sha256"] = {f: _sha256(last / f) for f in manifest["sha256"]}
    (last / MANIFEST).write_text(json.dumps(manifest))
    Trainer(cfg, decide(cfg.run_dir, True)).run()
    assert "written by an older version that identified data by paths" in capsys.readouterr().err
    assert rows(cfg.run_dir, "train")[-1]["step"] == 6


def _text_source(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text(TEXT)
    (root / "sub" / "b.jsonl").write_text('{"text": "a line"}\n')
    return root, {"dataset": str(root)}, lambda cfg: sources.source_identity(cfg)


def _image_source(root):
    from PIL import Image

    for c, colour in (("cat", (200, 10, 10)), ("dog", (10, 200, 10))):
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), colour).save(root / c / f"{i}.png")
    return root, {"dataset": str(root)}, lambda cfg: images._identity(cfg)


def _glue_source(root, monkeypatch):
    shutil.copytree(ROOT / "data" / "glue" / "RTE", root / "glue" / "RTE")
    monkeypatch.setattr(classify, "DATA_ROOT", root)
    return root / "glue" / "RTE", {"dataset": "glue:RTE"}, lambda cfg: classify._identity(cfg)


def _first_file(root):
    return sorted(p for p in root.rglob("*") if p.is_file())[0]


@pytest.mark.parametrize("kind", ["text folder", "image folder", "GLUE TSVs"])
def test_identity_is_the_content_for_every_local_source(tmp_path, monkeypatch, kind):
    from progressive.config import DataConfig

    monkeypatch.setattr(identity, "RACY_SECONDS", 0.0)
    root = tmp_path / "src"
    make = {"text folder": _text_source, "image folder": _image_source,
            "GLUE TSVs": lambda r: _glue_source(r, monkeypatch)}[kind]
    root, fields, ident = make(root)
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), **fields)
    first = ident(cfg)
    assert str(tmp_path) not in json.dumps(first)  # no absolute path in it
    victim = _first_file(root)
    os.utime(victim)  # touched
    assert ident(cfg) == first
    _same_size_edit_with_mtime_restored(victim)
    edited = ident(cfg)
    assert edited != first
    if kind != "GLUE TSVs":  # a copy elsewhere holds the same content: the same identity
        shutil.copytree(root, tmp_path / "copy")
        assert ident(DataConfig(cache_dir=str(tmp_path / "cache"), dataset=str(tmp_path / "copy"))) == edited


def test_a_saved_hugging_face_dataset_moved_elsewhere_keeps_its_identity(tmp_path):
    import datasets

    from progressive.config import DataConfig

    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c", "d e f"]})}).save_to_disk(
        str(tmp_path / "saved"))
    first = sources.source_identity(DataConfig(dataset=f"hf:{tmp_path / 'saved'}", cache_dir=str(tmp_path / "c")))
    shutil.move(str(tmp_path / "saved"), str(tmp_path / "moved"))
    again = sources.source_identity(DataConfig(dataset=f"hf:{tmp_path / 'moved'}", cache_dir=str(tmp_path / "c")))
    assert again == first and str(tmp_path) not in json.dumps(first)


def test_a_damaged_block_cache_is_refused_naming_the_file(tmp_path):
    """The tokenized-block cache was trusted as it lay: shuffled in place (same size, valid ids) a resume trained on
    it silently, truncated it failed with "mmap length is greater than file size". Entries are sealed now."""
    import numpy as np

    from progressive.config import DataConfig
    from progressive.data import build_tokenizer, load_token_blocks
    from progressive.data.cache import CacheDamaged

    cfg = DataConfig(tokenizer="bpe", vocab_size=384, seq_len=32, max_tokens=20000, cache_dir=str(tmp_path / "c"))
    tok = build_tokenizer(cfg)
    blocks = load_token_blocks(cfg, tok)
    folder = blocks.path
    train = np.load(folder / "train.npy", mmap_mode="r+")
    first = train[0].copy()
    train[0], train[1] = train[1].copy(), first  # same bytes, other order
    train.flush()
    del train, blocks
    with pytest.raises(CacheDamaged, match=r"train.npy was changed after it was written .* delete .* built again"):
        load_token_blocks(cfg, tok)
    train = np.load(folder / "train.npy", mmap_mode="r+")
    train[0], train[1] = train[1].copy(), train[0].copy()  # put back: the same bytes are accepted again
    train.flush()
    del train
    load_token_blocks(cfg, tok)
    data = (folder / "val.npy").read_bytes()
    (folder / "val.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(CacheDamaged, match=r"val.npy has \d+ bytes, \d+ were written"):
        load_token_blocks(cfg, tok)
    # an entry written before sealing is sealed on its first read, then checked like any other
    shutil.rmtree(folder)
    load_token_blocks(cfg, tok)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "files"}))
    load_token_blocks(cfg, tok)
    assert "files" in json.loads((folder / "meta.json").read_text())
    (folder / "train_ids.npy").unlink()
    with pytest.raises(CacheDamaged, match="train_ids.npy is missing"):
        load_token_blocks(cfg, tok)


def test_a_renamed_copy_of_a_single_data_file_resumes_the_same_run(tmp_path, monkeypatch):
    """A single data file is identified by its bytes and its format, not its name: a copy with another name (the
    same bytes) resumes, as docs/reliability.md says; it was refused as "content changed"."""
    corpus = _corpus(tmp_path / "data")
    cfg = _cfg(tmp_path, corpus)
    _stop_at_step_3(cfg, monkeypatch)
    copy = tmp_path / "elsewhere" / "renamed.txt"
    copy.parent.mkdir()
    shutil.copy(corpus, copy)
    corpus.unlink()
    ref = _cfg(tmp_path / "ref", copy)
    Trainer(ref).run()
    Trainer(replace(cfg, data=replace(cfg.data, dataset=str(copy))), decide(cfg.run_dir, True)).run()
    assert ([[r.get(k) for k in KEYS] for r in rows(cfg.run_dir)]
            == [[r.get(k) for k in KEYS] for r in rows(ref.run_dir)])
