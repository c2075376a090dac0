"""AutoCache's store: byte bounds per tier, the disk tier round-trips, one entry per sample, depths; the disk
tier is safe (a truncated, corrupted, swapped or foreign file is a miss with one warning, never SIGBUS or a
wrong activation; a full disk or an absurd bound is a warning; only the cache's own file is deleted); and
save_cache / load_cache give back the same cache."""

import errno
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from progressive.autocache import ActivationCache, load_cache, save_cache, slotfile
from progressive.autocache.slotfile import HEADER, SUFFIX
from tests.train_utils import ROOT, rows

SHAPE = (4, 8)
ENTRY = 32 * 4  # float32


def _cache(tmp_path, mem=0, disk=4, **kw):
    warnings = []
    slot = HEADER.size + ENTRY
    cache = ActivationCache(SHAPE, torch.float32, mem * ENTRY, disk * slot, tmp_path / "c", warn=warnings.append, **kw)
    return cache, warnings


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_memory_then_disk_tiers_respect_their_byte_bounds_and_round_trip(tmp_path, dtype):
    entry = 32 * torch.empty((), dtype=dtype).element_size()
    slot = HEADER.size + entry  # a disk entry's bytes include its header
    cache = ActivationCache(SHAPE, dtype, memory_bytes=3 * entry + 1, disk_bytes=2 * slot + 1, disk_dir=tmp_path / "c")
    x = torch.randn(7, *SHAPE).to(dtype)
    cache.put(np.arange(7), depth=2, values=x)
    assert len(cache.mem) == 3 and len(cache.disk_of) == 2  # samples 5, 6 fit nowhere: not cached
    assert cache.stats.memory_bytes == 3 * entry and cache.stats.disk_bytes == 2 * entry
    assert cache.depths(np.array([0, 4, 5])).tolist() == [2, 2, -1]
    depths, values = cache.lookup(np.array([4, 0, 3, 6]))
    assert depths.tolist() == [2, 2, 2, -1] and torch.equal(values[:3], x[[4, 0, 3]])  # disk, memory, disk, none
    y = torch.randn(2, *SHAPE).to(dtype)
    cache.put(np.array([0, 4]), depth=3, values=y)  # a deeper entry replaces the stale one in place
    assert cache.depths(np.array([0, 4, 1])).tolist() == [3, 3, 2]
    assert torch.equal(cache.lookup(np.array([0, 4]))[1], y) and len(cache.mem) == 3 and len(cache.disk_of) == 2
    assert os.path.getsize(cache.disk.path) == 2 * slot  # the file holds the slots it reserved, no more
    cache.close()
    assert not (tmp_path / "c").exists()


def test_negative_bounds_are_refused():
    with pytest.raises(ValueError, match="cache bounds must be >= 0"):
        ActivationCache((2,), torch.float32, memory_bytes=-1)


def _bad_file(tmp_path, damage):
    """Four disk entries, ``damage(cache)`` done to the file, then every entry looked up."""
    cache, warnings = _cache(tmp_path)
    x = torch.randn(4, *SHAPE)
    cache.put(np.arange(4), depth=1, values=x)
    damage(cache)
    depths, values = cache.lookup(np.arange(4))
    return cache, warnings, x, depths, values


def _flip(cache, slot, offset):
    with open(cache.disk.path, "r+b") as f:
        f.seek(slot * cache.disk.slot_bytes + offset)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))


@pytest.mark.parametrize("case, damage, bad, kind", [
    ("payload", lambda c: [_flip(c, s, HEADER.size + 7) for s in (1, 2)], [1, 2], "fails its checksum"),
    ("depth", lambda c: _flip(c, 3, 32), [3], "not the sample, depth, dtype or shape"),
    ("swapped", lambda c: _swap(c, 0, 1), [0, 1], "not the sample, depth, dtype or shape"),
    ("foreign", lambda c: _foreign(c), [0, 1, 2, 3], "did not write"),
])
def test_a_damaged_entry_is_a_miss_with_one_warning_never_a_wrong_activation(tmp_path, case, damage, bad, kind):
    cache, warnings, x, depths, values = _bad_file(tmp_path, damage)
    assert depths.tolist() == [-1 if i in bad else 1 for i in range(4)]  # recomputed, as never cached
    good = [i for i in range(4) if i not in bad]
    assert torch.equal(values[good], x[good])
    assert len(warnings) == 1 and kind in warnings[0] and "recomputed" in warnings[0]
    assert cache.bad == len(bad) and all(i not in cache.depth_of for i in bad)
    cache.put(np.array(bad), depth=2, values=x[bad])  # the recomputed ones are cached again
    assert cache.lookup(np.array(bad))[0].tolist() == [2] * len(bad) and len(warnings) == 1


def _swap(cache, a, b):
    n = cache.disk.slot_bytes
    with open(cache.disk.path, "r+b") as f:
        f.seek(a * n)
        first = f.read(n)
        f.seek(b * n)
        second = f.read(n)
        f.seek(a * n)
        f.write(second)
        f.seek(b * n)
        f.write(first)


def _foreign(cache):
    """Another cache's entries (its own token, same samples, depths and shapes) written over this one's."""
    other = ActivationCache(SHAPE, torch.float32, 0, 4 * cache.disk.slot_bytes, cache.disk.folder, name="other")
    other.put(np.arange(4), depth=1, values=torch.randn(4, *SHAPE))
    cache.disk.path.write_bytes(other.disk.path.read_bytes())  # in place: the same file, other bytes
    other.close()


def test_a_truncated_file_is_a_miss_not_sigbus(tmp_path):
    # In a child process, so that a SIGBUS would show as its exit status instead of killing the test
    # runner. Entries of 16 KiB: the cut leaves whole pages of the slots' range beyond the end of the
    # file, which is what raises SIGBUS when read through a memory map.
    code = f"""
import sys; sys.path.insert(0, {str(ROOT)!r})
import numpy as np, torch
from progressive.autocache import ActivationCache
warnings = []
cache = ActivationCache((64, 64), torch.float32, 0, 10**6, {str(tmp_path / "c")!r}, warn=warnings.append)
x = torch.randn(4, 64, 64)
cache.put(np.arange(4), depth=1, values=x)
cache.lookup(np.arange(4))  # read once before the cut
with open(cache.disk.path, "r+b") as f:
    f.truncate(cache.disk.slot_bytes + 100)  # slot 0 whole, slot 1 cut, slots 2 and 3 gone
depths, values = cache.lookup(np.arange(4))
assert depths.tolist() == [1, -1, -1, -1] and torch.equal(values[0], x[0]), depths
assert len(warnings) == 1 and "truncated" in warnings[0], warnings
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


def test_a_full_disk_turns_the_disk_tier_off_with_one_warning(tmp_path, monkeypatch):
    cache, warnings = _cache(tmp_path, disk=8)
    x = torch.randn(8, *SHAPE)
    cache.put(np.arange(2), depth=1, values=x[:2])
    monkeypatch.setattr(slotfile.os, "pwritev", _enospc)  # the disk fills up
    cache.put(np.arange(2, 8), depth=1, values=x[2:])
    cache.put(np.arange(2), depth=2, values=x[:2])  # rewriting an entry fails too: it is dropped
    assert len(warnings) == 1 and "No space left on device" in warnings[0] and "no new entries" in warnings[0]
    assert cache.depth_of == {} and cache.disk.off and cache.disk.new_slot() is None
    monkeypatch.undo()
    cache.put(np.arange(2), depth=2, values=x[:2])  # off stays off (no half-full retries every step)
    assert cache.depth_of == {}


def test_a_failed_reservation_turns_the_disk_tier_off(tmp_path, monkeypatch):
    monkeypatch.setattr(slotfile.os, "posix_fallocate", _enospc)
    cache, warnings = _cache(tmp_path, mem=1)
    cache.put(np.arange(3), depth=1, values=torch.randn(3, *SHAPE))
    assert list(cache.depth_of) == [0] and len(warnings) == 1 and "could not reserve" in warnings[0]


def _enospc(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _free_space(monkeypatch, free):
    monkeypatch.setattr(slotfile.shutil, "disk_usage", lambda p: SimpleNamespace(total=2**40, used=0, free=free))


def test_an_absurd_disk_bound_is_capped_by_the_free_space_and_the_file_grows_only_as_used(tmp_path, monkeypatch):
    _free_space(monkeypatch, 10 * 2**30)  # 10 GiB free (what the tier sees)
    warnings = []
    cache = ActivationCache(SHAPE, torch.float32, 0, 2**62, tmp_path / "c", warn=warnings.append)
    assert len(warnings) == 1 and "capped at 9216.0 MiB" in warnings[0]  # free space less the 1 GiB margin
    assert cache.disk_slots == 9 * 2**30 // cache.disk.slot_bytes
    cache.put(np.arange(3), depth=1, values=torch.randn(3, *SHAPE))
    assert os.path.getsize(cache.disk.path) <= slotfile.CHUNK_BYTES  # one chunk reserved, not 9 GiB
    cache.close()
    _free_space(monkeypatch, 2**20)  # less than the margin: no disk tier at all, one warning
    warnings.clear()
    cache = ActivationCache(SHAPE, torch.float32, 0, 2**20, tmp_path / "d", warn=warnings.append)
    assert cache.disk_slots == 0 and len(warnings) == 1 and "no disk tier" in warnings[0]
    cache.put(np.arange(3), depth=1, values=torch.randn(3, *SHAPE))
    assert cache.depth_of == {}


def test_only_the_caches_own_file_is_deleted_and_foreign_files_are_never_read(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("the user's")
    stale = folder / f"rank0-{'ab' * 16}{SUFFIX}"  # another run's (or a killed process's) file
    stale.write_bytes(b"x" * 1000)
    warnings = []
    cache = ActivationCache(SHAPE, torch.float32, 0, 10**6, folder, name="rank0", warn=warnings.append)
    assert len(warnings) == 1 and "never read by this run, and not deleted" in warnings[0]
    cache.put(np.arange(2), depth=1, values=torch.randn(2, *SHAPE))
    cache.close()
    assert sorted(p.name for p in folder.iterdir()) == sorted(["notes.txt", stale.name])
    # in a folder the run owns (<run>/autocache), a stale file with this process's prefix is a killed
    # process's of the same run: it is deleted; another process's prefix is left alone
    other = folder / f"rank1-{'cd' * 16}{SUFFIX}"
    other.write_bytes(b"y")
    cache = ActivationCache(SHAPE, torch.float32, 0, 10**6, folder, name="rank0", warn=warnings.append, owned=True)
    assert not stale.exists() and other.exists()
    cache.close()


def test_save_and_load_give_back_every_entry_depth_counter_and_the_disk_bytes(tmp_path):
    cache, _ = _cache(tmp_path, mem=2, disk=4)
    x = torch.randn(6, *SHAPE)
    cache.put(np.array([5, 3, 9, 1, 7]), depth=1, values=x[:5])
    cache.put(np.array([9]), depth=2, values=x[5:])
    cache._forget(1)  # a freed slot in the middle of the disk file
    cache.stats.hits, cache.stats.misses = 4, 7
    part = tmp_path / "ckpt"
    part.mkdir()
    save_cache(cache, part, "rank0.method")
    assert sorted(p.name for p in part.iterdir()) == ["rank0.method.disk", "rank0.method.json",
                                                      "rank0.method.safetensors"]
    warnings = []
    back = load_cache(part, "rank0.method", 2 * ENTRY, 4 * (HEADER.size + ENTRY), tmp_path / "c2",
                      warn=warnings.append)
    assert warnings == [] and back.token == cache.token and back.disk.path != cache.disk.path
    assert back.depth_of == cache.depth_of and back.disk_of == cache.disk_of and back.mem.keys() == cache.mem.keys()
    ids = np.array([5, 3, 9, 7])
    for a, b in zip(back.lookup(ids), cache.lookup(ids)):
        assert (a == b).all() if isinstance(a, np.ndarray) else torch.equal(a, b)
    assert back.stats == cache.stats and back.disk.used == cache.disk.used
    assert back.disk.new_slot() == cache.disk.new_slot() == 1  # sample 1's freed slot first
    empty = tmp_path / "none"
    empty.mkdir()
    save_cache(None, empty, "rank1.method")
    assert load_cache(empty, "rank1.method", 0, 0, None) is None


def test_saved_disk_entries_that_no_longer_fit_are_dropped_with_a_warning(tmp_path, monkeypatch):
    cache, _ = _cache(tmp_path, mem=1, disk=4)
    cache.put(np.arange(4), depth=1, values=torch.randn(4, *SHAPE))
    part = tmp_path / "ckpt"
    part.mkdir()
    save_cache(cache, part, "p")
    _free_space(monkeypatch, slotfile.MARGIN_BYTES + 100)  # the disk filled up since the checkpoint
    warnings = []
    back = load_cache(part, "p", ENTRY, 4 * (HEADER.size + ENTRY), tmp_path / "c2", warn=warnings.append)
    assert list(back.depth_of) == [0] and back.stats.disk_bytes == 0  # the memory entry only
    assert any("not bit-identical" in w for w in warnings)


# ------------------------------------------------------------------ train.py: one line, before any data loads

def _cli(tmp_path, capsys, *over):
    from progressive import cli as train_cli
    from progressive.config import dump_yaml
    from tests.train_utils import tiny_cfg

    cfg = tiny_cfg(tmp_path / "out", method="autofreeze", model__num_layers=2, model__tie_word_embeddings=False,
                   train__steps=6, data__max_tokens=1500, method__autofreeze__freeze_every=2,
                   method__autofreeze__alpha=0.5, method__autofreeze__criterion="bound",
                   method__autofreeze__cache__enabled=True, method__autofreeze__cache__memory_mb=0.01)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    code = train_cli.main(["--config", str(path), *map(str, over)])
    return code, capsys.readouterr().err, cfg


@pytest.mark.parametrize("over, needle", [
    (["--method.autofreeze.cache.disk_mb", "1", "--method.autofreeze.cache.disk_dir", "{file}"],
     "is a file, not a folder"),
    (["--method.autofreeze.cache.disk_mb", "inf"], "cache.disk_mb: a size in MiB, >= 0 and finite, got inf"),
    (["--method.autofreeze.cache.memory_mb", "nan"], "cache.memory_mb: a size in MiB, >= 0 and finite, got nan"),
    (["--method.autofreeze.cache.memory_mb", "0"], "cannot hold one sample's activation"),
])
def test_a_cache_that_cannot_work_is_refused_in_one_line_before_any_data_loads(tmp_path, capsys, over, needle):
    (tmp_path / "a_file").write_text("not a folder")
    code, err, cfg = _cli(tmp_path, capsys, *[o.format(file=tmp_path / "a_file") for o in over])
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: method.autofreeze.cache") and needle in err
    assert not cfg.run_dir.exists()


def test_an_absurd_disk_mb_trains_with_one_warning_line(tmp_path, capsys):
    code, err, cfg = _cli(tmp_path, capsys, "--method.autofreeze.cache.disk_mb", "1e12")  # 1 EiB
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning")]
    assert code == 0 and len(warnings) == 1
    assert "asked for 1000000000000.0 MiB" in warnings[0] and "capped at" in warnings[0]
    assert rows(cfg.run_dir, "train")[-1]["cache_disk_mb"] > 0 and not (cfg.run_dir / "autocache").exists()


def test_a_disk_dir_of_the_users_keeps_its_files_and_foreign_cache_files_are_not_read(tmp_path, capsys):
    mine = tmp_path / "scratch"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    foreign = mine / f"rank0-{'ab' * 16}{SUFFIX}"
    foreign.write_bytes(os.urandom(4096))
    code, err, cfg = _cli(tmp_path, capsys, "--method.autofreeze.cache.disk_mb", "1",
                          "--method.autofreeze.cache.disk_dir", mine)
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning")]
    assert code == 0 and len(warnings) == 1 and "never read by this run, and not deleted" in warnings[0]
    assert rows(cfg.run_dir, "train")[-1]["cache_disk_mb"] > 0
    assert sorted(p.name for p in mine.iterdir()) == sorted(["notes.txt", foreign.name])  # ours removed, theirs kept


def test_a_disk_file_cut_before_a_checkpoint_loses_its_entries_not_the_run(tmp_path):
    """The disk tier's file truncated just before a checkpoint crashed the run (OSError from the copy); the disk
    tier never stops training: the entries are forgotten (recomputed when drawn) and the checkpoint is written."""
    cache, warnings = _cache(tmp_path, mem=1, disk=4)
    cache.put(np.arange(4), depth=1, values=torch.randn(4, *SHAPE))
    assert len(cache.disk_of) == 3
    os.truncate(cache.disk.path, HEADER.size)
    part = tmp_path / "ckpt"
    part.mkdir()
    save_cache(cache, part, "rank0.method")
    assert not (part / "rank0.method.disk").exists() and cache.disk_of == {} and len(cache.mem) == 1
    assert any("shorter than its 3 entries" in w for w in warnings), warnings
    back = load_cache(part, "rank0.method", ENTRY, 4 * (HEADER.size + ENTRY), tmp_path / "c2")
    assert back.disk_of == {} and list(back.mem) == list(cache.mem)
