"""Data identity is the content: a same-size edit with its mtime restored refuses a resume, a touch does not;
digests are cached per file (a second start reads nothing); a run folder and its dataset moved elsewhere
resume the same run bit for bit."""

import os
import shutil

import pytest

import progressive.data.identity as identity
from progressive import checkpoint as ckpt
from progressive import cli as train_cli
from progressive.config import ConfigError
from progressive.data.identity import content_identity
from progressive.trainer import SIGNAL_ENV, Trainer
from tests.train_utils import rows, tiny_cfg

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
    from progressive.stop import Stopped

    monkeypatch.setenv(SIGNAL_ENV, "3:SIGINT")
    with pytest.raises(Stopped):
        Trainer(cfg).run()
    monkeypatch.delenv(SIGNAL_ENV)


def _same_size_edit_with_mtime_restored(path):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[100:103] = b"cat" if bytes(data[100:103]) != b"cat" else b"dog"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_a_same_size_edit_with_the_mtime_restored_refuses_the_resume_and_a_touch_does_not(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "data")
    cfg = _cfg(tmp_path, corpus)
    _stop_at_step_3(cfg, monkeypatch)
    os.utime(corpus)  # touched: same bytes, new mtime
    identity._memo.clear()  # as a new process
    ref = _cfg(tmp_path / "ref", corpus)
    Trainer(ref).run()
    Trainer(cfg, resume=True).run()  # the content is the same: it resumes, and continues the same run
    assert [[r.get(k) for k in KEYS] for r in rows(cfg.run_dir)] == [[r.get(k) for k in KEYS] for r in rows(ref.run_dir)]

    other = _cfg(tmp_path / "edited", corpus)
    _stop_at_step_3(other, monkeypatch)
    _same_size_edit_with_mtime_restored(corpus)
    identity._memo.clear()
    with pytest.raises(ConfigError, match="content of the training data or the tokenizer changed since this run"):
        Trainer(other, resume=True).run()


def test_digests_are_cached_per_file_and_a_second_start_reads_nothing(tmp_path, monkeypatch):
    root = tmp_path / "data"
    files = []
    for i in range(3):
        files.append(root / f"part{i}.txt")
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_text(f"document {i} " * 100)
    read = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda p: (read.append(p.name), real(p))[1])
    first = content_identity(files, root, tmp_path / "cache")
    assert sorted(read) == ["part0.txt", "part1.txt", "part2.txt"]
    identity._memo.clear()  # a new process reads the index from disk
    read.clear()
    assert content_identity(files, root, tmp_path / "cache") == first and read == []
    _same_size_edit_with_mtime_restored(files[1])
    identity._memo.clear()
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
    identity._memo.clear()
    assert train_cli.main(["--resume", "--output_dir", str(moved), "--name", "renamed", "--data.dataset",
                           str(tmp_path / "data2" / "corpus.txt"), "--data.cache_dir", str(tmp_path / "cache2")]) == 0
    err = capsys.readouterr().err
    assert "warning: resuming with a changed setting: output_dir" in err
    assert "resuming renamed from step 3" in err
    got = [[r.get(k) for k in KEYS] for r in rows(moved / "renamed")]
    assert got == [[r.get(k) for k in KEYS] for r in rows(ref.run_dir)]
    assert ckpt.list_checkpoints(moved / "renamed")


def test_a_checkpoint_from_before_content_fingerprints_resumes_with_a_warning(tmp_path, monkeypatch, capsys):
    import json

    from progressive.checkpoint import MANIFEST, STATE, _sha256

    corpus = _corpus(tmp_path / "data")
    cfg = _cfg(tmp_path, corpus)
    _stop_at_step_3(cfg, monkeypatch)
    (last,) = ckpt.list_checkpoints(cfg.run_dir)
    state = json.loads((last / STATE).read_text())
    state["data"] = "0123456789abcdef0123"  # an old-style fingerprint: a cache key over paths and mtimes
    (last / STATE).write_text(json.dumps(state))
    manifest = json.loads((last / MANIFEST).read_text())
    manifest["sha256"] = {f: _sha256(last / f) for f in manifest["sha256"]}
    (last / MANIFEST).write_text(json.dumps(manifest))
    Trainer(cfg, resume=True).run()
    assert "written by an older version that identified data by paths" in capsys.readouterr().err
    assert rows(cfg.run_dir, "train")[-1]["step"] == 6
