"""Time is the device's, and the data path builds only what a process trains on, ahead of time.

GPU kernels are asynchronous: a clock read before the device has finished measures kernel launches. The
trainer reads its clock through ``common.device.Stopwatch``, which synchronizes first; these tests replace
the synchronization by one that sleeps and counts, so a CPU shows where it happens and how often.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import common.device as device
from progressive.run.feed import BatchFeed
from tests.train_utils import ROOT, rows, tiny_cfg

NAP = 0.05


@pytest.fixture
def slow_sync(monkeypatch):
    """``synchronize`` that takes NAP seconds (as a GPU with queued work would) and counts its calls."""
    calls = []

    def sync(dev):
        calls.append(time.perf_counter())
        time.sleep(NAP)

    monkeypatch.setattr(device, "synchronize", sync)
    return calls


def test_stopwatch_waits_for_the_device_inside_the_timed_window(slow_sync):
    watch = device.Stopwatch("cpu")
    seconds = watch.lap()
    assert len(slow_sync) == 1 and seconds >= NAP  # the wait is counted: it happened before the clock was read
    watch.restart()  # no wait: for right after work that ended on the host
    assert len(slow_sync) == 1
    with device.timed("cpu") as t:
        pass
    assert len(slow_sync) == 3 and NAP <= t[0] < 3 * NAP  # synced at both ends; only the closing wait counts


def test_trainer_wall_is_device_time_with_one_sync_per_logged_row(tmp_path, slow_sync, monkeypatch):
    """20 steps logged every 5: the trainer waits for the device at the logged rows (the evaluations share them)
    and at the one checkpoint, not once per step, and every wait is inside ``wall``. The loss is read at the
    logged rows only (one host sync each, no ``.item()`` per step)."""
    from progressive.run.loop import TrainingRun
    from progressive.run.trainer import Trainer

    flushes = []
    real_flush = TrainingRun._flush_loss
    monkeypatch.setattr(TrainingRun, "_flush_loss", lambda self: flushes.append(self.c.step) or real_flush(self))
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=20, train__log_every=5, train__eval_every=10,
                   train__checkpoint_every=10)
    Trainer(cfg).run()
    train = rows(cfg.run_dir, "train")
    assert [r["step"] for r in train] == [5, 10, 15, 20]
    # 4 logged rows + 2 checkpoints (steps 10 and 20, after their rows: a sync that finds the queue empty)
    assert len(slow_sync) == 6, len(slow_sync)
    assert train[-1]["wall"] >= 6 * NAP  # each wait was inside the timed window
    assert sorted(set(flushes)) == [5, 10, 15, 20]
    for r in train:  # throughput in every train row
        assert r["tok_s"] > 0 and r["tflops"] > 0 and r["mem_gb"] > 0 and r["batch_ms"] >= 0 and "wait_ms" in r
        assert "mfu" not in r  # a CPU has no peak in the table (train.peak_tflops sets one)


def test_mfu_against_the_given_peak(tmp_path):
    from progressive.run.trainer import Trainer

    # A peak of 1 MFLOP/s makes MFU = TFLOP/s * 1e6. Both are stored to 4 significant digits from the unrounded
    # clock; the rows' wall is rounded to 0.1 ms, so the window it gives is off by up to 1e-4 s (a 1% error on
    # a fast machine's 10 ms window): the tolerance is that rounding, not a guess at the machine's load.
    cfg = tiny_cfg(tmp_path, method="baseline", train__steps=4, train__log_every=2, train__peak_tflops=1e-6)
    Trainer(cfg).run()
    a, b = rows(cfg.run_dir, "train")[-2:]
    window = b["wall"] - a["wall"]  # the row's window: since the previous row
    per_device = (b["flops"] - a["flops"]) / window
    assert b["mfu"] == pytest.approx(per_device / 1e6, rel=1.05e-4 / window + 1e-3)
    assert b["tflops"] == pytest.approx(b["mfu"] * 1e-6, rel=1.1e-3)  # the same measure against the given peak


def test_known_gpus_have_a_peak_and_a_cpu_has_none():
    assert device.peak_flops("cpu") is None and device.peak_flops("cpu", 2.0) == 2e12
    assert all(v > 0 for v in device.PEAK_BF16_TFLOPS.values())


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H200 NVL", 835.0),            # not the SXM's 989 ("H200" is in its name)
    ("NVIDIA H800 PCIe", 756.0),           # not the SXM's 989 ("H800")
    ("AMD Instinct MI250X", 191.5),        # one die (GCD) of the two in a package: 383 / 2
    ("AMD Instinct MI250X/MI250", 191.5),  # ROCm's name for either: the more specific key wins
    ("AMD Instinct MI250", 181.05),        # 362.1 / 2
    ("NVIDIA H100 PCIe", 756.0),
    ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H100 80GB HBM3", 989.0),
    ("NVIDIA H200", 989.0),
    ("NVIDIA H800", 989.0),
    ("NVIDIA GH200 480GB", 989.0),         # its own key, not a match of "H200" inside "GH200"
    ("NVIDIA A100-SXM4-80GB", 312.0),      # "A100", not "A10"
    ("NVIDIA A10", 125.0),
    ("NVIDIA A10G", 70.0),
    ("NVIDIA L4", 121.0),
    ("NVIDIA L40S", 362.0),
    ("NVIDIA L40", None),                  # not in the table: no guess from "L4" (pass --train.peak_tflops)
    ("NVIDIA GeForce RTX 4090", 165.0),
])
def test_peak_table_takes_the_most_specific_device_name(name, tflops):
    assert device.peak_tflops_of(name) == tflops



_MMAPPED = """
import ctypes, sys, torch
import common.device as device
class Info(ctypes.Structure):  # glibc's struct mallinfo2: hblks counts the blocks served by their own mmap
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
kept = device.keep_freed_host_memory() if sys.argv[1] == "keep" else False
before = libc.mallinfo2().hblks
x = torch.empty(40 * 2**20 // 4)  # 40 MB: above glibc's largest default mmap threshold (32 MB)
print(kept, libc.mallinfo2().hblks - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="mallopt and mallinfo2 are glibc's (Linux; CI runs it)")
def test_freed_host_memory_is_kept_instead_of_mapped_per_tensor():
    """A 40 MB tensor (a CPU step's logits at vocabulary 4,096) gets its own mmap, unmapped at free, unless the
    trainer has told glibc to keep freed memory: then it comes from the heap (bench/speed/host_alloc.py times it)."""
    out = {mode: subprocess.run([sys.executable, "-c", _MMAPPED, mode], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split() for mode in ("keep", "default")}
    assert out == {"keep": ["True", "0"], "default": ["False", "1"]}, out


@pytest.mark.parametrize("keep", [True, False])
def test_trainer_keeps_host_memory_unless_told_not_to(tmp_path, monkeypatch, keep):
    import progressive.run.trainer as trainer

    calls = []
    monkeypatch.setattr(trainer, "keep_freed_host_memory", lambda: calls.append(1))
    trainer.Trainer(tiny_cfg(tmp_path, method="baseline", train__steps=1, train__keep_host_memory=keep)).run()
    assert len(calls) == int(keep)


# --------------------------------------------------------------------------------------------- the data path

def test_feed_builds_the_next_step_ahead_and_rebuilds_after_a_jump():
    built = []

    def build(step):
        built.append(step)
        return np.arange(step, step + 2), {"x": torch.full((2,), step)}

    feed = BatchFeed(build, pin=False)
    ids, batch = feed.get(3)
    assert batch["x"].tolist() == [3, 3] and ids.tolist() == [3, 4]
    _, batch = feed.get(4)  # built on the thread while step 3 ran
    assert batch["x"].tolist() == [4, 4]
    _, batch = feed.get(9)  # a resume elsewhere: the batch built ahead (step 5) is not used
    assert batch["x"].tolist() == [9, 9]
    feed.close()
    assert built[:2] == [3, 4] and 9 in built  # (step 5's build may or may not have started before it was dropped)
    times = feed.take_times()
    assert set(times) == {"batch_ms", "wait_ms"}


def test_feed_reraises_what_the_thread_raised_at_that_step():
    def build(step):
        if step == 1:
            raise ValueError("bad block 1")
        return np.arange(1), {"x": torch.zeros(1)}

    feed = BatchFeed(build, pin=False)
    feed.get(0)
    with pytest.raises(ValueError, match="bad block 1"):
        feed.get(1)
    feed.close()


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_each_process_builds_only_its_rows_and_they_are_the_whole_batchs(tmp_path, family):
    """Rank r of W builds rows [rB/W, (r+1)B/W) of step s's batch, and only those; with BERT the masks are
    drawn for the whole batch, so any world size trains on the tensors one process would."""
    from progressive.model.build import get_family
    from progressive.run.inputs import RunData

    cfg = tiny_cfg(tmp_path, family=family, method="baseline")
    data = RunData.load(cfg, get_family(family))
    runs = [(world, rank, data.step_batch(cfg, 7, rank, world)) for world in (1, 2, 4) for rank in range(world)]
    whole = runs[0][2][1]
    for world, rank, (ids, batch) in runs:
        share = cfg.train.batch_size // world
        assert len(ids) == cfg.train.batch_size
        for k, v in batch.items():
            assert v.shape[0] == share
            assert torch.equal(v, whole[k][rank * share:(rank + 1) * share]), (world, rank, k)


@pytest.mark.slow
def test_steps_run_under_autocast_without_accelerates_fp32_copy_of_the_logits(tmp_path):
    """Accelerate wraps a prepared model's forward in autocast and then copies every output to fp32 (the whole
    B x T x V logits, 3% of a GPT-2-124M step on an H200). The trainer restores the forward and runs each step
    and evaluation under ``acc.autocast()`` instead: the same precision for every model, sharded ones included
    (train.fsdp without Accelerate's launcher trained in fp32 before), and the logits stay bf16. Its own process:
    Accelerate keeps one precision per process."""
    script = f"""
import json, torch
from progressive.methods.base import Method
from progressive.run.trainer import Trainer
from tests.train_utils import tiny_cfg
seen, real = [], Method.forward
def forward(self, model, batch, ids):
    out = real(self, model, batch, ids)
    seen.append([torch.is_autocast_enabled("cpu"), str(out.logits.dtype)])
    return out
Method.forward = forward
tr = Trainer(tiny_cfg({str(tmp_path)!r}, method="baseline", train__steps=2, train__mixed_precision="bf16"))
tr.run()
print(json.dumps({{"seen": seen, "wrapped": hasattr(tr.raw.forward, "__wrapped__")}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["seen"] and all(s == [True, "torch.bfloat16"] for s in got["seen"]), got
    assert not got["wrapped"]  # Accelerate's fp32-converting wrapper is gone


@pytest.mark.slow
def test_datapath_bench_builds_the_same_pixels_both_ways(tmp_path):
    from bench.speed import datapath

    out = datapath.main(["--images", "16", "--batch", "8", "--world", "2", "--image_size", "16", "--repeats", "1",
                         "--out", str(tmp_path / "d.json")])
    assert out["bit_identical"] and out["rows_per_process"] == 4 and out["median_ms"]["after"] > 0


@pytest.mark.slow
def test_host_alloc_bench_trains_both_ways_to_the_same_loss_and_its_smoke_leaves_the_results_alone():
    from bench.speed import host_alloc

    results = ROOT / "bench" / "results"
    before = _tree(results)
    out = host_alloc.main(["--smoke"])
    (shape,) = out["shapes"].values()
    losses = {r["loss"] for runs in shape["runs"].values() for r in runs}
    assert len(losses) == 1 and shape["same_loss"] and set(shape["median_ms"]) == {"default", "kept"}
    written = ROOT / "outputs" / "bench" / "host_alloc.json"
    assert json.loads(written.read_text())["shapes"].keys() == out["shapes"].keys()
    assert _tree(results) == before


def _tree(folder):
    """{relative path: (size, mtime_ns)} of every file under ``folder``."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_mfu_lab_measures_each_setting_from_the_same_start_and_profiles_the_kernels(tmp_path, monkeypatch):
    """--smoke (CPU figures, not a measurement) writes into a work folder and leaves bench/results/ as it was."""
    from bench.speed import mfu

    root = tmp_path / "clone"  # the checkout as mfu.py sees it, with a results file of a real run
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "results" / "mfu.json").write_text('{"written_by": "a GPU run"}')
    before = _tree(root / "bench" / "results")
    monkeypatch.setattr(mfu, "ROOT", root)
    out = mfu.main(["--smoke", "--only", "compiled,plain_sdpa,batch16", "--steps", "2", "--warmup", "1"])
    s = out["settings"]
    assert s["compiled"]["loss"] == s["plain_sdpa"]["loss"]  # fresh from seed 0, same batches; is_causal = the mask
    assert out["environment"]["sdpa_mask_under_compile"] is False  # torch >= 2.13 hands SDPA is_causal=True
    assert s["batch16"]["batch"] * 2 == s["compiled"]["batch"] and all(r["tok_s"] > 0 for r in s.values())
    assert abs(sum(out["profile"]["shares"].values()) - 1) < 1e-3 and out["profile"]["top"]
    assert json.loads((root / "outputs" / "mfu" / "mfu.json").read_text())["settings"].keys() == s.keys()
    assert _tree(root / "bench" / "results") == before
    with pytest.raises(ValueError, match="--smoke measures nothing and writes no file into"):
        mfu.main(["--smoke", "--out", str(root / "bench" / "results" / "mfu.json")])
    assert _tree(root / "bench" / "results") == before
    with pytest.raises(ValueError, match="unknown setting"):
        mfu.main(["--smoke", "--only", "bogus"])


def test_mfu_lab_sees_a_mask_handed_to_sdpa_under_compile(monkeypatch):
    """What torch 2.11 does (its dynamo folds torch.compiler.is_exporting() to True): transformers then builds the
    causal mask, and the lab's probe must say so."""
    import transformers.masking_utils as masking

    from bench.speed import mfu

    assert mfu.mask_under_compile() is False
    monkeypatch.setattr(masking, "is_torchdynamo_exporting", lambda: True)
    assert mfu.mask_under_compile() is True
