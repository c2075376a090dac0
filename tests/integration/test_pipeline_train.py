"""The pipeline engine with 4 processes (torchrun, gloo, CPU) against one process, on tiny models.

fp32 tolerance: the pipeline computes the same math in another order (gradients averaged over 2 or 4
replicas, a micro-batch loss mean of means, the clip norm summed over stages), so each loss may differ from
the one-process run in its last bits; over a few steps that stays below 1e-6 here (losses ~2-6). We assert
5e-6, the same order as the trainer's DDP test measures (4.8e-7) with room for one more rounding per step.
Partitions and micro-batch counts are pinned (balance uniform/params, microbatches 4): no test depends on
timing. A resumed run repeats the uninterrupted one bit for bit (same layout, same reduction order).
"""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from common.safetree import load_tree
from progressive.config import dump_yaml
from progressive.run.trainer import KILL_ENV, SIGNAL_ENV, Trainer
from tests.procs import run_tree
from tests.train_utils import ROOT, assert_same_rows, rows, stderr_of, tiny_cfg, torchrun

pytestmark = pytest.mark.slow  # 4 torchrun processes per run

TOL = 5e-6
ELASTIC = dict(method="autofreeze", model__num_layers=4, train__steps=8, train__eval_every=4, train__cpu=True,
               train__threads=1, method__autofreeze__criterion="bound", method__autofreeze__alpha=0.5,
               method__autofreeze__freeze_every=2, parallel__stages=4, parallel__microbatches=4,
               parallel__balance="params")


def _torchrun(cfg, tmp, *extra, env=None):
    path = tmp / f"{cfg.name}.yaml"
    path.write_text(dump_yaml(cfg))
    return run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           str(ROOT / "train.py"), "--config", str(path), *extra], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, **(env or {})})


def _losses(run_dir):
    return [r.get("loss", r.get("val_loss")) for r in rows(run_dir)]


FIXED = dict(method="baseline", model__num_layers=4, model__tie_word_embeddings=False, train__steps=6,
             train__eval_every=3, train__cpu=True, train__threads=1, parallel__stages=2,
             parallel__microbatches=2, parallel__balance="uniform", parallel__schedule="1f1b")
CACHED = {**ELASTIC, "data__max_images": 48, "train__steps": 18, "train__eval_every": 6,
          "method__autofreeze__cache__enabled": True, "method__autofreeze__cache__memory_mb": 0.01,
          "method__autofreeze__cache__disk_mb": 1.0}  # 4 samples per process in memory, the rest on disk


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The uninterrupted runs, on 4 processes in one launch (tests/train_many.py), each with its stderr:
    - "fixed": a tiny GPT-2 (4 layers) in a fixed pipeline of 2 stages x 2 replicas, 1F1B;
    - "elastic": a tiny ViT (4 layers) whose AutoFreeze (bound, alpha 1/2, every 2 steps) freezes 2, 3, 4
      layers, so AutoPipe goes K 4 -> 2 -> 1;
    - "cached": the same with AutoCache over three epochs of 48 images, so samples come back to the rank
      that cached them (at K 4, 2 and 1 every stage-0 rank has its own cache), at the depth they were
      cached or an earlier one;
    and, last in the launch (its stop ends it), "signalled": "elastic" again, SIGTERM to rank 2 of 4 only after step
    2 (the step that re-meshed K 4 -> 2), no checkpoint before: (config, the launch, a copy of its checkpoints as the
    stop left them, its stderr), resumed by ``resumed``."""
    tmp = tmp_path_factory.mktemp("pipelines")
    cfgs = {"fixed": tiny_cfg(tmp / "fixed", **FIXED, parallel__pipeline="fixed"),
            "elastic": tiny_cfg(tmp / "elastic", family="vit", **ELASTIC, parallel__pipeline="elastic"),
            "cached": tiny_cfg(tmp / "cached", family="vit", **CACHED, parallel__pipeline="elastic")}
    signalled = tiny_cfg(tmp / "signalled", family="vit", **dict(ELASTIC, train__checkpoint_every=100),
                         parallel__pipeline="elastic")
    proc = torchrun(*cfgs.values(), signalled, nproc=4, last_env={SIGNAL_ENV: "2:SIGTERM:2"})
    shutil.copytree(signalled.run_dir / "checkpoints", tmp / "signalled-checkpoints")
    runs = {name: (cfg, stderr_of(proc, cfg)) for name, cfg in cfgs.items()}
    runs["signalled"] = (signalled, proc, tmp / "signalled-checkpoints", stderr_of(proc, signalled))
    return runs


def test_fixed_pipeline_pp2_dp2_1f1b_matches_one_process_gpt2(uninterrupted, tmp_path):
    cfg, stderr = uninterrupted["fixed"]
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4
    (start,) = summary["transitions"]
    assert (start["k"], start["dp"], start["layers_per_stage"], start["microbatches"]) == (2, 2, [2, 2], 2)
    assert [(r["mesh"], r["dp_rank"], r["pp_rank"]) for r in start["ranks"]] == [
        ([2, 2], d, s) for d in range(2) for s in range(2)]  # rank = replica * K + stage
    one = tiny_cfg(tmp_path / "one", **FIXED)
    Trainer(one).run()
    a, b = rows(cfg.run_dir), rows(one.run_dir)
    assert [(r["kind"], r["step"], r["tokens"], r["flops"]) for r in a] == [
        (r["kind"], r["step"], r["tokens"], r["flops"]) for r in b]
    assert np.allclose(_losses(cfg.run_dir), _losses(one.run_dir), rtol=0, atol=TOL)
    assert "[steps 0-6] frozen 0 | K 2 | dp 2 | layers/stage [2, 2] | measured ms/step per stage" in stderr


@pytest.fixture(scope="module")
def elastic_vit(uninterrupted):
    return uninterrupted["elastic"]


def test_elastic_pipeline_remeshes_4_2_1_and_matches_one_process_autofreeze_vit(elastic_vit, tmp_path):
    cfg, stderr = elastic_vit
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4
    shapes = [(t["step"], t["frozen"], t["k"], t["dp"], t["layers_per_stage"]) for t in summary["transitions"]]
    assert shapes == [(0, 0, 4, 1, [1, 1, 1, 1]), (2, 2, 2, 2, [1, 1]), (4, 3, 1, 4, [1]), (6, 4, 1, 4, [0])]
    for t in summary["transitions"]:  # what every rank's process groups say after each change
        k, dp = t["k"], t["dp"]
        assert [(r["mesh"], r["dp_size"], r["pp_size"], r["dp_rank"], r["pp_rank"]) for r in t["ranks"]] == [
            ([dp, k], dp, k, rank // k, rank % k) for rank in range(4)]
    assert "K 4 -> 2: only 2 active layers for 4 stages" in summary["transitions"][1]["why"]
    assert summary["transitions"][1]["why"][-1].startswith("K stays 2: K 1 would need")
    assert "AutoDP: mesh (dp 1, pp 4) -> (dp 2, pp 2)" in stderr
    assert "AutoDP: mesh (dp 2, pp 2) -> (dp 4, pp 1)" in stderr
    one = tiny_cfg(tmp_path / "one", family="vit", **ELASTIC)  # the trainer's AutoFreeze, one process
    Trainer(one).run()
    a, b = rows(cfg.run_dir, "train"), rows(one.run_dir, "train")
    assert [r["frozen"] for r in a] == [r["frozen"] for r in b] == [0, 0, 2, 2, 3, 3, 4, 4]
    assert [(r["k"], r["dp"]) for r in a] == [(4, 1)] * 2 + [(2, 2)] * 2 + [(1, 4)] * 4
    assert [r["flops"] for r in a] == [r["flops"] for r in b]
    assert np.allclose(_losses(cfg.run_dir), _losses(one.run_dir), rtol=0, atol=TOL)
    # accuracy counts the real micro-batches only (not the schedule's shape-inference forward)
    assert ([r["val_accuracy"] for r in rows(cfg.run_dir, "val")]
            == [r["val_accuracy"] for r in rows(one.run_dir, "val")])


@pytest.fixture(scope="module")
def resumed(uninterrupted, tmp_path_factory):
    """The interrupted runs resumed together in one launch of 4 processes (tests/train_many.py --resume): {name:
    (config, the launch that stopped it, a copy of its checkpoints as the stop left them, its stderr there, the
    resumed run's stderr)}.
    - "signalled": stopped in ``uninterrupted``'s launch (see there);
    - "cached": the ViT with AutoCache, a checkpoint at step 8 (K 1, dp 4, caches filled), killed at step 11 in a
      launch of its own: a kill (no stop of its own) resumed from a periodic checkpoint."""
    tmp = tmp_path_factory.mktemp("interrupted")
    cfg = tiny_cfg(tmp / "cached", family="vit", **dict(CACHED, train__checkpoint_every=4),
                   parallel__pipeline="elastic")
    Path(cfg.output_dir).mkdir(parents=True)
    killed = _torchrun(cfg, Path(cfg.output_dir), env={KILL_ENV: "11"})
    shutil.copytree(cfg.run_dir / "checkpoints", tmp / "cached-checkpoints")
    signalled, stopped, checkpoints, stopped_stderr = uninterrupted["signalled"]
    proc = torchrun(signalled, cfg, nproc=4, resume=True)
    return {"signalled": (signalled, stopped, checkpoints, stopped_stderr, stderr_of(proc, signalled)),
            "cached": (cfg, killed, tmp / "cached-checkpoints", killed.stderr, stderr_of(proc, cfg))}


def test_a_signal_on_one_rank_at_a_remesh_stops_the_elastic_pipeline_with_a_checkpoint_that_resumes(elastic_vit,
                                                                                                      resumed):
    """The stop comes on the step whose AutoFreeze re-meshed (K 4 -> 2): the checkpoint keeps the new layout, the
    resumed run starts from it, re-meshes again at step 4 (K 2 -> 1) and repeats the uninterrupted rows bit for bit."""
    ref, _ = elastic_vit
    cfg, stopped, checkpoints, said, resumed_stderr = resumed["signalled"]
    assert stopped.returncode != 0 and "stopped by a signal on another process after step 2" in said, said[-3000:]
    assert "AutoDP: mesh (dp 1, pp 4) -> (dp 2, pp 2)" in said
    assert "resume with: <the same launcher> train.py --resume" in said
    assert [p.name for p in checkpoints.iterdir()] == ["step00000002-phase00"]
    assert json.loads((checkpoints / "step00000002-phase00" / "state.json").read_text())[
        "pipeline"]["layout"]["bounds"] == [2, 3, 4]
    assert f"resuming {cfg.name} from step 2" in resumed_stderr
    assert "AutoDP: mesh (dp 2, pp 2) -> (dp 4, pp 1)" in resumed_stderr
    n = assert_same_rows(ref.run_dir, cfg.run_dir)  # every key but measured time, bit for bit
    print(f"resume matrix | elastic pipeline | rows compared {n} | rows equal {n}")


@pytest.fixture(scope="module")
def cached_vit(uninterrupted):
    return uninterrupted["cached"][0]


def test_autocache_feeds_the_first_stage_with_the_same_losses_and_fewer_flops_vit(cached_vit, tmp_path):
    cfg = cached_vit
    one = tiny_cfg(tmp_path / "one", family="vit", **{**CACHED, "method__autofreeze__cache__enabled": False})
    Trainer(one).run()  # the trainer, one process, no cache
    a, b = rows(cfg.run_dir, "train"), rows(one.run_dir, "train")
    assert [r["frozen"] for r in a] == [r["frozen"] for r in b] and a[-1]["frozen"] == 4
    assert np.allclose(_losses(cfg.run_dir), _losses(one.run_dir), rtol=0, atol=TOL)
    assert a[-1]["cache_hit_rate"] > 0 and a[-1]["flops"] < b[-1]["flops"]  # what the caches served did not run
    assert all(x["flops"] <= y["flops"] for x, y in zip(a, b))


def test_kill_with_filled_caches_then_resume_continues_the_same_metrics_vit(cached_vit, resumed):
    """Every stage-0 process's cache (both tiers) is in the checkpoint and comes back to its process."""
    ref = cached_vit
    cfg, killed, checkpoints, _, resumed_stderr = resumed["cached"]
    assert killed.returncode != 0
    ckpt = checkpoints / "step00000008-phase00"
    parts = [load_tree(ckpt, f"rank{r}.method")["cache"] for r in range(4)]
    assert all(len(p["mem_ids"]) == 4 and len(p["disk_ids"]) > 0 for p in parts)
    assert f"resuming {cfg.name} from step 8" in resumed_stderr and "warning" not in resumed_stderr
    assert rows(ref.run_dir, "train")[8]["cache_hit_rate"] > 0  # step 9 hits entries from before the checkpoint
    n = assert_same_rows(ref.run_dir, cfg.run_dir)  # every key but measured time, bit for bit
    print(f"resume matrix | elastic pipeline + autocache (both tiers) | rows compared {n} | rows equal {n}")
