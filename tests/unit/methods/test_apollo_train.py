"""Apollo end to end on the bundled corpus (tiny GPT-2, 4 layers, stages 1 -> 2 -> 4): both maps, the
FLOPs of the depths that ran, a plain HF checkpoint, SIGKILL + resume right after a growth and in the
middle of a stage, and DDP with two processes drawing the same depths."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import GPT2LMHeadModel

from progressive.config import dump_yaml
from progressive.methods.apollo.method import DEPTH_LOG_ENV
from progressive.model.build import get_family, step_flops
from progressive.run.checkpoint import list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.procs import run_tree
from tests.train_utils import ROOT, assert_same_rows, rows, tiny_cfg, train_here


def _cfg(out, **over):
    # one thread: two OpenMP threads on a shared 2-core machine can stall for seconds per step
    base = dict(model__num_layers=4, train__steps=12, train__grad_accum=2, train__eval_every=100, train__threads=1,
                method__apollo__layers=[1, 2, 4], method__apollo__boundaries=[0.25, 0.5])
    return tiny_cfg(out, method="apollo", **{**base, **over})


@pytest.mark.parametrize("kind, sampler", [("interpolation", "lvps"), ("stack", "none")])
def test_run_grows_through_the_stages_counts_the_depths_that_ran_and_saves_a_plain_hf_model(tmp_path, kind, sampler):
    cfg = _cfg(tmp_path, method__apollo__map=kind, method__apollo__sampler=sampler)
    tr = Trainer(cfg)
    summary = tr.run()
    train = rows(cfg.run_dir, "train")
    assert [t["to"] for t in summary["transitions"]] == ["stage1-2L", "stage2-4L"]
    assert [(r["stage"], r["layers"]) for r in train[:6]] == [(0, 1)] * 3 + [(1, 2)] * 3
    assert {(r["stage"], r["layers"], r["depth"]) for r in train[6:]} == {(2, 4, 4.0)}
    final = GPT2LMHeadModel.from_pretrained(cfg.run_dir / "final")  # plain transformers, no code of ours
    assert final.config.n_layer == 4 and len(final.transformer.h) == 4
    assert all(torch.equal(a, b.cpu()) for a, b in zip(final.state_dict().values(), tr.raw.state_dict().values()))
    fam = get_family("gpt2")
    head, layer = step_flops(cfg, fam, final.config, n_layers=0), step_flops(cfg, fam, final.config, n_layers=1)
    prev, ran = 0, []
    for r in train:  # every step's FLOPs: the mean over its 2 micro-batches of head + D layers, D as drawn
        d = tr.method.depths(r["step"] - 1, np.arange(2), r["layers"])[0]
        assert r["flops"] - prev == (2 * head + (layer - head) * int(d.sum())) // 2 and r["depth"] == d.mean()
        prev = r["flops"]
        ran += d.tolist()
    assert (max(ran[:6]) > 1) == (sampler == "lvps")  # LVPS ran deeper shared stacks in stage 0


def _train(config_path, *extra, env):
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config", str(config_path), *extra],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.slow
def test_sigkill_right_after_a_growth_and_mid_stage_then_resume_matches_the_uninterrupted_run(tmp_path):
    # Dropout on, so the restored RNG state matters. Stage 1 starts at step 3 (checkpointed by the growth),
    # stage 2 at step 6; checkpoint_every 8 adds a mid-stage checkpoint at step 8.
    over = dict(model__dropout=0.1, train__checkpoint_every=8, train__eval_every=5)
    ref = _cfg(tmp_path / "ref", **over)
    Trainer(ref).run()
    cfg = _cfg(tmp_path / "killed", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    killed = _train(path, env={**os.environ, KILL_ENV: "4"})  # one step after the growth 1 -> 2
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    last = read_state(list_checkpoints(cfg.run_dir)[-1])
    assert (last["step"], last["phase_name"]) == (3, "stage1-2L")  # the growth's checkpoint
    killed = _train(path, "--resume", env={**os.environ, KILL_ENV: "10"})  # through the growth 2 -> 4
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    last = read_state(list_checkpoints(cfg.run_dir)[-1])
    assert (last["step"], last["phase_name"]) == (8, "stage2-4L")  # mid-stage
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    n = assert_same_rows(ref.run_dir, cfg.run_dir)  # every key but measured time, bit for bit
    print(f"resume matrix | apollo | rows compared {n} | rows equal {n}")


@pytest.mark.slow
def test_ddp_two_processes_draw_the_same_depths_and_match_one_process(tmp_path):
    over = dict(train__cpu=True, train__threads=1, train__steps=10, train__eval_every=5)
    cfg = _cfg(tmp_path / "ddp", **over)
    path = tmp_path / "ddp.yaml"
    path.write_text(dump_yaml(cfg))
    logs = tmp_path / "depths"
    logs.mkdir()
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "train.py"), "--config", str(path)],
                          capture_output=True, text=True, timeout=400, cwd=ROOT,
                          env={**os.environ, DEPTH_LOG_ENV: str(logs)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert [t["to"] for t in summary["transitions"]] == ["stage1-2L", "stage2-4L"]
    rank0, rank1 = ((logs / f"depths.rank{r}.txt").read_text().split("\n") for r in (0, 1))
    assert rank0 == rank1 and len(rank0) == 2 * summary["steps"] + 1  # (step, micro, depth) identical on both ranks
    assert len({line.split()[2] for line in rank0[:6]}) > 1  # and stage 0 did vary the depth
    one = _cfg(tmp_path / "one", **over)
    Trainer(one).run()
    la, lb = ([r["loss"] for r in rows(c.run_dir, "train")] for c in (cfg, one))
    assert len(la) == len(lb) and np.allclose(la, lb, rtol=0, atol=1e-4), (la, lb)
    assert [r["flops"] for r in rows(cfg.run_dir, "train")] == [r["flops"] for r in rows(one.run_dir, "train")]
