"""Kill and --resume for every method and combination: the whole metrics.jsonl of the resumed run equals
the uninterrupted run's row for row, on every key but measured time (tests.train_utils.WALL_CLOCK).

Cases already covered elsewhere (with the same whole-row comparison) are not repeated here: the V-cycle
right after a level change (test_train_resume.py), Apollo after a growth and mid-stage
(test_apollo_train.py), AutoFreeze without the cache after and between decisions
(test_autofreeze_train.py), and the elastic pipeline after a re-mesh, and with AutoCache on a ViT
(integration/test_pipeline_train.py). Dropout is on everywhere, so a resumed run is identical only if every random
generator, and with AutoCache every cached activation (a hit skips the prefix's dropout draws), comes back.
"""

import json
import signal
from dataclasses import dataclass

import pytest

from common.safetree import load_tree
from progressive.autocache.slotfile import KILL_AT_WRITE_ENV
from progressive.config import dump_yaml
from progressive.run.checkpoint import MANIFEST, STATE, list_checkpoints, read_state
from progressive.run.trainer import KILL_ENV, Trainer
from tests.train_utils import assert_same_rows, rows, stderr_of, tiny_cfg, torchrun, train_cli, train_here

AUTOFREEZE = dict(method="autofreeze", model__num_layers=4, model__tie_word_embeddings=False, train__steps=16,
                  train__eval_every=4, data__max_tokens=1500, method__autofreeze__freeze_every=3,
                  method__autofreeze__criterion="argmin", method__autofreeze__alpha=0.5)
CACHE = dict(AUTOFREEZE, method__autofreeze__cache__enabled=True)
DISK = dict(CACHE, method__autofreeze__cache__memory_mb=0.05, method__autofreeze__cache__disk_mb=1.0)
STACK = dict(method="apollo", model__num_layers=4, train__steps=12, train__eval_every=5, method__apollo__sampler="none",
             method__apollo__map="stack")


@dataclass
class Case:
    """A run killed by each of ``kills`` in turn (environment added; the first starts it, the others
    --resume it), then resumed to the end; ``resumes_from``: the step of the checkpoint each kill leaves."""

    over: dict
    kills: list[dict]
    resumes_from: list[int]


CASES = {
    "baseline": Case(dict(method="baseline", train__checkpoint_every=4), [{KILL_ENV: "6"}], [4]),
    # StackBERT-style (stack map, no depth sampling, one LR schedule, moments mapped): killed right after
    # the first growth (its checkpoint), then resumed through the second
    "stackbert": Case(dict(STACK, method__apollo__layers=[1, 2, 4], method__apollo__boundaries=[0.25, 0.5],
                           train__checkpoint_every=100), [{KILL_ENV: "4"}], [3]),
    # G_stack-style (stack once from L/4, fresh AdamW, a schedule per stage): killed mid-stage after the growth
    "gstack": Case(dict(STACK, method__apollo__layers=[1, 4], method__apollo__boundaries=[0.25],
                        method__apollo__optimizer_state="reset", method__apollo__schedule="per_stage",
                        train__checkpoint_every=5), [{KILL_ENV: "7"}], [5]),
    # AutoCache, both tiers: 12 entries fit in memory, the rest go to disk, whose slots the checkpoint copies; the
    # checkpoint at step 8 holds entries at depth 2 (frozen after step 3) and 3 (after step 6); samples come back
    # from step 6 on (hits), at a stale depth after step 9 (partial). The memory tier alone, killed and resumed:
    # tests/unit/run/test_fsdp.py (FSDP2, 2 processes)
    "autofreeze+autocache disk": Case(dict(DISK, train__checkpoint_every=4), [{KILL_ENV: "10"}], [8]),
    # killed in the middle of a step while the cache fills (its 30th disk write, in step 10): the dead
    # process's disk file is newer than the checkpoint of step 8, and must not be what the resumed run reads
    "kill during a cache fill": Case(dict(DISK, train__checkpoint_every=4), [{KILL_AT_WRITE_ENV: "30"}], [8]),
}


def _run_case(tmp_path, case: Case):
    over = dict(case.over, model__dropout=0.1)
    ref = tiny_cfg(tmp_path / "ref", **over)
    Trainer(ref).run()
    cfg = tiny_cfg(tmp_path / "killed", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    caches, logged = [], []  # per kill: the cache in the checkpoint it resumes from; the last step it logged
    for i, (env, step) in enumerate(zip(case.kills, case.resumes_from)):
        killed = train_cli(path, *(["--resume"] if i else []), env=env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        last = list_checkpoints(cfg.run_dir)[-1]
        assert read_state(last)["step"] == step
        caches.append(load_tree(last, "rank0.method")["cache"] if (last / "rank0.method.json").is_file() else None)
        logged.append(rows(cfg.run_dir, "train")[-1]["step"])
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"from step {case.resumes_from[-1]} " in resumed.stderr and "warning" not in resumed.stderr
    return ref, cfg, caches, logged


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_kill_then_resume_gives_the_uninterrupted_metrics_row_for_row(tmp_path, name):
    case = CASES[name]
    ref, cfg, caches, logged = _run_case(tmp_path, case)
    n = assert_same_rows(ref.run_dir, cfg.run_dir)
    print(f"resume matrix | {name} | rows compared {n} | rows equal {n}")
    # each case exercises what it claims
    train = rows(ref.run_dir, "train")
    if case.over["method"] == "apollo":
        assert len({r["stage"] for r in train}) == len(case.over["method__apollo__layers"])
    if "autocache" in name or "cache fill" in name:
        cache, step = caches[-1], case.resumes_from[-1]
        held = len(cache["mem_ids"]) + len(cache["disk_ids"])  # entries at two depths, served after the resume
        assert held > 0 and len(set(cache["mem_depths"].tolist() + cache["disk_depths"].tolist())) == 2
        assert train[-1]["cache_hit_rate"] > train[step - 1]["cache_hit_rate"] > 0
        assert not (cfg.run_dir / "autocache").exists()  # the killed process's disk file is gone too
    if "disk" in name or "cache fill" in name:
        assert len(caches[-1]["disk_ids"]) > 0 and train[-1]["cache_disk_mb"] > 0
    if name == "kill during a cache fill":
        assert logged == [case.resumes_from[-1] + 1]  # died in the step after the one it logged last


@pytest.mark.slow
def test_ddp_two_processes_with_autocache_resume_bit_for_bit(tmp_path):
    """Each process caches the samples it draws and skips their dropout draws on a hit, so each has its own
    cache and random state: both must come back, each process its own (the other's is written to the
    checkpoint's staging folder and moved in by the main process). The killed run is resumed in the launch that
    trains the uninterrupted one (``--resume auto``: the reference, with no checkpoint, starts fresh)."""
    over = dict(DISK, model__dropout=0.1, train__cpu=True, train__threads=1, train__checkpoint_every=4,
                train__steps=16)
    ref = tiny_cfg(tmp_path / "ref", **over)
    cfg = tiny_cfg(tmp_path / "killed", **over)
    path = tmp_path / "killed.yaml"
    path.write_text(dump_yaml(cfg))
    killed = train_cli(path, nproc=2, env={KILL_ENV: "10"})
    assert killed.returncode != 0 and read_state(list_checkpoints(cfg.run_dir)[-1])["step"] == 8
    ckpt = list_checkpoints(cfg.run_dir)[-1]
    parts = [load_tree(ckpt, f"rank{r}.method")["cache"] for r in (0, 1)]
    assert all(len(p["mem_ids"]) and len(p["disk_ids"]) for p in parts)  # both processes' caches, both tiers
    assert parts[0]["mem_ids"].tolist() != parts[1]["mem_ids"].tolist()  # each the samples it drew
    assert not list(ckpt.parent.glob(".*"))  # no staging folder left behind
    both = torchrun(ref, cfg, nproc=2, resume="auto")  # asserts both finished, on 2 processes
    assert "resuming" not in stderr_of(both, ref)
    assert both.stderr.count(f"{cfg.run_dir} holds a checkpoint; resuming") == 1  # said by the main process only
    resumed = stderr_of(both, cfg)
    assert "from step 8 " in resumed and "warning" not in resumed
    assert rows(ref.run_dir, "train")[-1]["cache_hit_rate"] > rows(ref.run_dir, "train")[7]["cache_hit_rate"] > 0
    n = assert_same_rows(ref.run_dir, cfg.run_dir)
    print(f"resume matrix | autofreeze+autocache disk, DDP 2 processes | rows compared {n} | rows equal {n}")


@pytest.mark.slow
def test_a_checkpoint_from_another_world_size_resumes_with_an_empty_cache_and_says_so(tmp_path):
    """The cache is per process: a checkpoint written by another number of processes has no part for this
    one. (Simulated by rewriting the saved world size and re-hashing the manifest, as a 2-process run
    resumed on one would see it.)"""
    over = dict(CACHE, model__dropout=0.1, train__checkpoint_every=4, train__steps=12)
    cfg = tiny_cfg(tmp_path, **over)
    path = tmp_path / "run.yaml"
    path.write_text(dump_yaml(cfg))
    assert train_cli(path, env={KILL_ENV: "10"}).returncode == -signal.SIGKILL
    ckpt = list_checkpoints(cfg.run_dir)[-1]
    from progressive.run.checkpoint import _digest

    state = {**json.loads((ckpt / STATE).read_text()), "world_size": 2}
    (ckpt / STATE).write_text(json.dumps({**state, "digest": _digest(state)}))  # as that run would have written it
    _rehash(ckpt)
    resumed = train_here(path, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = [ln for ln in resumed.stderr.splitlines() if ln.startswith("warning")]
    assert len(lines) == 1 and "no per-process state for process 0 of 1 (saved by 2 processes" in lines[0]
    assert "starts empty; the run continues, but not bit-identically" in lines[0]
    assert rows(cfg.run_dir, "train")[-1]["step"] == 12


def _rehash(ckpt):
    from progressive.run.checkpoint import _sha256

    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["sha256"] = {f: _sha256(ckpt / f) for f in manifest["sha256"]}
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
