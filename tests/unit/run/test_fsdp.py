"""FSDP2 on CPU processes (gloo): every method and every size change trains sharded with DDP's losses, the
sharded checkpoint resumes on another world size, and what the sharded path does not do is refused.

``train.fsdp: true`` applies ``fully_shard`` per block and to the root, as Accelerate's FSDP2 plugin does on
GPUs (progressive.run.sharding); the reference is the same run under DDP with the same number of processes.
"""

import json
import os
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from progressive.config import ConfigError, dump_yaml
from progressive.run.checkpoint import list_checkpoints, read_state, verify
from progressive.run.faults import KILL_ENV
from tests.train_utils import ROOT, rows, stderr_of, tiny_cfg, torchrun, train_cli

COMMON = dict(train__cpu=True, train__threads=1, train__steps=8, train__eval_every=4)
STACK = dict(method="apollo", model__num_layers=4, method__apollo__layers=[1, 2, 4],
             method__apollo__boundaries=[0.25, 0.5])
METHODS = {
    "baseline": dict(method="baseline"),
    # coalesce at step 2, de-coalesce + interpolate at step 5 (tests/train_utils.py's two-level V-cycle)
    "vcycle": dict(method="vcycle"),
    # LVPS depth sampling with weight sharing over 1 -> 2 -> 4 layers, moments mapped along the growth
    "apollo": STACK,
    # StackBERT-style: the stack map, no sampling
    "stackbert": dict(STACK, method__apollo__sampler="none", method__apollo__map="stack"),
    # frozen parameters inside sharded groups: 2 of 4 layers frozen after step 3, all after step 6
    "autofreeze": dict(method="autofreeze", model__num_layers=4, model__tie_word_embeddings=False, train__steps=10,
                       data__max_tokens=1500, method__autofreeze__freeze_every=3,
                       method__autofreeze__criterion="argmin", method__autofreeze__alpha=0.5),
}
# AutoCache on top, with dropout (a hit skips the frozen layers' dropout draws): 16 steps over 1,500 tokens
# bring samples back, so the cache serves hits on both processes, each from its own cache
METHODS["autofreeze+autocache"] = dict(METHODS["autofreeze"], train__steps=16, model__dropout=0.1,
                                       method__autofreeze__cache__enabled=True)
ATOL = 1e-4  # the DDP test's tolerance; measured differences are below 1e-6 (reduce-scatter vs all-reduce order)


def _losses(run_dir, kind="train", key="loss"):
    return [r[key] for r in rows(run_dir, kind)]


FOUR = ("apollo", "autofreeze", "vcycle")  # trained on 4 processes too


@pytest.fixture(scope="module")
def two(ddp_reference, tmp_path_factory):
    """{method: (its DDP run on 2 processes, its FSDP2 run on 2)}, all trained in one launch. The DDP runs are
    the session's (conftest.py): trained once, read by every test that compares with them. Last in the launch (the
    kill ends it), "autofreeze+autocache killed": that run again, a checkpoint at step 10, killed after step 12:
    (config, the launch, a folder holding a copy of its checkpoints as the kill left them), resumed by
    ``resumed_on_two``."""
    overs = {name: dict(COMMON, **over) for name, over in METHODS.items()}
    root = tmp_path_factory.mktemp("fsdp2")
    fsdp = {name: tiny_cfg(root / name, **over, train__fsdp=True) for name, over in overs.items()}
    killed = tiny_cfg(root / "autofreeze+autocache-killed-run", **overs["autofreeze+autocache"], train__fsdp=True)
    ddp = ddp_reference.many(list(overs.values()), *fsdp.values(), killed, last_env={KILL_ENV: "12"})
    shutil.copytree(killed.run_dir / "checkpoints", root / "autofreeze+autocache-as-killed" / "checkpoints")
    runs = {name: (ref, fsdp[name]) for name, ref in zip(overs, ddp)}
    runs["autofreeze+autocache killed"] = (killed, ddp_reference.launch, root / "autofreeze+autocache-as-killed")
    return runs


@pytest.fixture(scope="module")
def four(ddp_reference, tmp_path_factory):
    """{method: (its DDP run on 2 processes, its FSDP2 run on 4)}, the FSDP2 runs trained in one launch; last in
    it (the kill ends the launch), "vcycle killed": the V-cycle again, a sharded checkpoint at step 5, killed after
    step 6: (config, the launch, a folder holding a copy of its checkpoints as the kill left them), resumed by
    ``resumed_on_two``."""
    ddp = ddp_reference.many([dict(COMMON, **METHODS[name]) for name in FOUR])  # trained by ``two`` when it ran
    root = tmp_path_factory.mktemp("fsdp4")
    fsdp = {name: tiny_cfg(root / name, **dict(COMMON, **METHODS[name]), train__fsdp=True) for name in FOUR}
    killed = tiny_cfg(root / "vcycle-killed", **dict(COMMON, **METHODS["vcycle"], train__checkpoint_every=5),
                      train__fsdp=True)
    proc = torchrun(*fsdp.values(), killed, nproc=4, last_env={KILL_ENV: "6"})
    shutil.copytree(killed.run_dir / "checkpoints", root / "vcycle-as-killed" / "checkpoints")
    runs = {name: (ref, fsdp[name]) for name, ref in zip(FOUR, ddp)}
    runs["vcycle killed"] = (killed, proc, root / "vcycle-as-killed")
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_trains_under_fsdp2_with_the_ddp_losses(two, name):
    ddp, fsdp = two[name]
    a, b = _losses(ddp.run_dir), _losses(fsdp.run_dir)
    assert len(a) == len(b) and np.allclose(a, b, rtol=0, atol=ATOL), (a, b)
    va, vb = _losses(ddp.run_dir, "val", "val_loss"), _losses(fsdp.run_dir, "val", "val_loss")
    assert np.allclose(va, vb, rtol=0, atol=ATOL), (va, vb)
    print(f"fsdp2 vs ddp | {name} | 2 processes | max |loss diff| {max(abs(x - y) for x, y in zip(a, b)):.2e}")
    summary = json.loads((fsdp.run_dir / "summary.json").read_text())
    assert [t["to"] for t in summary["transitions"]] == \
        [t["to"] for t in json.loads((ddp.run_dir / "summary.json").read_text())["transitions"]]
    if name.startswith("autofreeze"):
        assert rows(fsdp.run_dir, "train")[-1]["frozen"] == 4
    if name == "autofreeze+autocache":
        hits = [r.get("cache_hit_rate") for r in rows(fsdp.run_dir, "train")]  # from the first freeze on
        assert hits[-1] > 0.2 and hits == [r.get("cache_hit_rate") for r in rows(ddp.run_dir, "train")]
    # sharded checkpoints (one file per process, in the manifest); final/ is a plain save_pretrained folder
    ckpt = list_checkpoints(fsdp.run_dir)[-1]
    state = verify(ckpt)
    assert state["sharded"] and state["world_size"] == 2 and not (ckpt / "model.safetensors").exists()
    shards = sorted((ckpt / "sharded").glob("*.safetensors"))
    assert len(shards) == 2
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(shards[0], "pt") as f:  # each process wrote its half of the token embeddings' rows
        rows_saved = f.get_slice("model.transformer.wte.weight").get_shape()[0]
    assert rows_saved * 2 == json.loads((fsdp.run_dir / "final" / "config.json").read_text())["vocab_size"]

    final = load_file(fsdp.run_dir / "final" / "model.safetensors")
    ref = load_file(ddp.run_dir / "final" / "model.safetensors")
    assert final.keys() == ref.keys() and max((final[k] - ref[k]).abs().max().item() for k in ref) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", FOUR)
def test_four_processes_train_with_the_ddp_losses(four, name):
    ddp, fsdp = four[name]
    a, b = _losses(ddp.run_dir), _losses(fsdp.run_dir)
    assert len(a) == len(b) and np.allclose(a, b, rtol=0, atol=ATOL), (a, b)
    print(f"fsdp2 vs ddp | {name} | 4 processes | max |loss diff| {max(abs(x - y) for x, y in zip(a, b)):.2e}")


@pytest.fixture(scope="module")
def resumed_on_two(two, four):
    """The killed runs resumed together in one launch of 2 processes (tests/train_many.py --resume): {name: (config,
    the launch that killed it, a folder holding a copy of its checkpoints as the kill left them, the resumed run's
    stderr)}.
    - "vcycle": the V-cycle under FSDP2 on 4 processes, killed in ``four``'s launch (see there), resumed on 2: DCP
      re-shards 4 -> 2;
    - "autofreeze+autocache": on 2 processes, killed in ``two``'s launch (see there), resumed on 2 (so a test that
      asks for this fixture alone trains ``two``'s launch too)."""
    killed = {"autofreeze+autocache": two["autofreeze+autocache killed"], "vcycle": four["vcycle killed"]}
    proc = torchrun(*(c for c, _, _ in killed.values()), nproc=2, resume=True)
    return {name: (c, launch, copy, stderr_of(proc, c)) for name, (c, launch, copy) in killed.items()}


@pytest.mark.slow
def test_a_run_killed_on_four_processes_resumes_on_two_with_the_uninterrupted_losses(four, resumed_on_two):
    """The V-cycle under FSDP2 killed after step 6 on 4 processes and resumed from its sharded checkpoint of
    step 5 on 2 processes (DCP re-shards 4 -> 2) gives the uninterrupted 4-process run's losses."""
    b = _losses(four["vcycle"][1].run_dir)
    cfg, killed, as_killed, resumed = resumed_on_two["vcycle"]
    assert killed.returncode != 0
    last = list_checkpoints(as_killed)[-1]
    assert read_state(last)["step"] == 5 and len(list((last / "sharded").glob("*.safetensors"))) == 4
    assert "from step 5 " in resumed
    c = _losses(cfg.run_dir)
    assert len(c) == len(b) and np.allclose(b, c, rtol=0, atol=ATOL), (b, c)
    print(f"fsdp2 resume | vcycle | 4 -> 2 processes | max |loss diff| {max(abs(x - y) for x, y in zip(b, c)):.2e}")
    # the manifest covers the shards: one changed byte in the newest checkpoint's shard skips it for the older
    from progressive.run.checkpoint import latest_good

    older, newest = list_checkpoints(cfg.run_dir)[-2:]
    shard = sorted((newest / "sharded").glob("*.safetensors"))[-1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    skipped = []
    assert latest_good(cfg.run_dir, warn=skipped.append) == older
    assert "does not match its sha256" in skipped[0] and "sharded/" in skipped[0]


@pytest.mark.slow
def test_autocache_under_fsdp2_resumes_bit_for_bit(two, resumed_on_two):
    """Each process's cache and generators come back from the checkpoint's per-process parts beside the
    shards; killed after step 12, resumed from step 10, the metrics equal the uninterrupted run's."""
    from tests.train_utils import assert_same_rows

    ref = two["autofreeze+autocache"][1]
    cfg, killed, as_killed, _ = resumed_on_two["autofreeze+autocache"]
    assert cfg.train.checkpoint_every == ref.train.checkpoint_every == 5
    assert killed.returncode != 0
    last = list_checkpoints(as_killed)[-1]
    assert read_state(last)["step"] == 10 and (last / "rank1.method.json").is_file() and (last / "sharded").is_dir()
    n = assert_same_rows(ref.run_dir, cfg.run_dir)
    print(f"fsdp2 resume | autofreeze+autocache | 2 processes | rows compared {n} | rows equal {n}")


@pytest.mark.parametrize("over, message", [
    (dict(parallel__pipeline="elastic"), "train.fsdp: parallel.pipeline"),
])
def test_what_fsdp2_does_not_do_is_refused_before_any_work(tmp_path, over, message):
    from progressive.config import validate

    with pytest.raises(ConfigError, match=message):
        validate(tiny_cfg(tmp_path, train__fsdp=True, **over))


def test_gathered_moments_are_cut_locally_in_one_key_order(tmp_path):
    """distribute_named_state sorts each entry's keys: a gather walks them in order on every process, and a
    method that built the dict from a set would otherwise pair one process's exp_avg with another's
    exp_avg_sq (seen as NaN losses after a V-cycle level change)."""
    from progressive.run.sharding import distribute_named_state

    model = torch.nn.Linear(3, 2)
    named = {"weight": {"step": torch.tensor(1.0), "exp_avg_sq": torch.ones(2, 3), "exp_avg": torch.zeros(2, 3)}}
    out = distribute_named_state(model, named)
    assert list(out["weight"]) == ["exp_avg", "exp_avg_sq", "step"]


def test_dry_run_memory_line_counts_sixteen_bytes_per_parameter_and_the_level_change_copies():
    from progressive.report.dryrun import memory_line

    gib = 2 ** 30
    plan = {"phases": [{"params": gib // 16}, {"params": gib // 32}, {"params": gib // 16}]}
    line = memory_line(plan, processes=4)
    # 16 B/param whole under DDP, a quarter under FSDP2 on 4, 12 B/param of old + new during a change
    assert "DDP 1.00 GiB" in line and "FSDP2 over 4 processes 0.25 GiB" in line and "1.12 GiB" in line
    assert "level change" not in memory_line({"phases": [{"params": 10}]})


@pytest.mark.slow
def test_a_deepspeed_launcher_is_refused_in_one_line_before_anything_is_built(tmp_path):
    """accelerate launch with a DeepSpeed config sets ACCELERATE_USE_DEEPSPEED; deepspeed is not installed
    here, and the refusal must come before Accelerate would need it."""
    cfg = tiny_cfg(tmp_path, method="baseline", train__cpu=True)
    path = tmp_path / "c.yaml"
    path.write_text(dump_yaml(cfg))
    proc = train_cli(path, env={"ACCELERATE_USE_DEEPSPEED": "true"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and "DeepSpeed is not supported" in errors[0] and "fsdp.yaml" in errors[0]
    assert not (cfg.run_dir / "metrics.jsonl").exists()


def _launcher_env(config_file):
    """The FSDP_* variables (and the mixed precision) that ``accelerate launch --config_file FILE`` gives the
    training process: Accelerate's own launcher code turns the file into them."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "--num_processes", "1", "train.py"])
    env = prepare_multi_gpu_env(_validate_launch_command(args)[0])
    return {k: v for k, v in env.items()
            if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP", "ACCELERATE_MIXED_PRECISION"))}


def _launcher_plugin(monkeypatch, config_file):
    """The FSDP plugin that ``accelerate launch --config_file FILE`` gives the training process, which reads the
    launcher's FSDP_* variables."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    for k, v in _launcher_env(config_file).items():
        monkeypatch.setenv(k, v)
    return FullyShardedDataParallelPlugin()


@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    mine = not dist.is_initialized()
    if mine:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    if mine and dist.is_initialized():  # (a run's end may have destroyed it already)
        dist.destroy_process_group()


def _accelerate_looks_up_no_split_modules_unfiltered() -> bool:
    """Before Accelerate 1.16 a policy taken from the model's ``_no_split_modules`` failed on a name the model
    lacks; 1.16 drops such names first, so there only a block class the user's file names still fails."""
    import accelerate
    from packaging.version import Version

    return Version(accelerate.__version__).release < (1, 16)


@pytest.mark.parametrize("named_block", [False, True])
@pytest.mark.parametrize("cls", ["GPT2LMHeadModel", "BertForMaskedLM", "LlamaForCausalLM", "ViTForImageClassification"])
def test_accelerate_fsdp2_launch_config_accepts_the_sharded_model_of_every_family(monkeypatch, one_process_group, cls,
                                                                                 named_block):
    """``accelerate launch --config_file launch/accelerate/fsdp.yaml train.py`` failed at start: Accelerate's
    _prepare_fsdp2 first resolves the plugin's wrap policy against the model the trainer hands it, whose blocks
    fully_shard has renamed (GPT2Block -> FSDPGPT2Block). The same calls, on CPU, with that file's plugin (and
    with a user's file that names the block class, as the file used to, which fails on every Accelerate release the
    ranges allow)."""

    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    from bench.lib import tiny as tm
    from progressive.run import sharding

    model = tm.make_model(tm.Shape(getattr(tm, cls), heads=2, head_dim=4, layers=2, ffn_mult=2))
    if named_block:
        monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", type(_blocks(model)[0]).__name__)
    config_file = ROOT / "launch" / "accelerate" / "fsdp.yaml"
    plugin = _launcher_plugin(monkeypatch, config_file)
    acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), is_fsdp2=True)
    model = sharding.shard(model, acc)  # what the trainer hands Accelerate
    if named_block or _accelerate_looks_up_no_split_modules_unfiltered():
        with pytest.raises(ValueError, match="Could not find the transformer layer class"):
            _launcher_plugin(monkeypatch, config_file).set_auto_wrap_policy(model)  # the failure, as it was
    sharding.take_over_wrapping(acc)
    plugin.set_auto_wrap_policy(model)  # Accelerate's first call in _prepare_fsdp2 passes now
    assert fsdp2_prepare_model(acc, model) is model  # and the model stays as the trainer sharded it


def test_fsdp2_compiles_each_block_before_sharding_it_and_trains_the_same_losses(tmp_path, monkeypatch,
                                                                               one_process_group, settled_dynamo):
    """Under FSDP2 every block is compiled (in place: its names stay) before fully_shard wraps it, so FSDP2's hooks
    run between compiled blocks; a V-cycle trains through its level changes with the eager run's losses. (Dynamo's
    tracing with the eager backend: the mechanism, not inductor's kernels.)"""
    from progressive.run import compiled, sharding
    from progressive.run.trainer import Trainer

    monkeypatch.setattr(compiled, "BACKEND", "eager")
    seen, shard = [], sharding.shard

    def spy(model, *args):
        seen.append([getattr(b, "_compiled_call_impl", None) is not None for b in _blocks(model)])
        return shard(model, *args)

    monkeypatch.setattr(sharding, "shard", spy)
    runs = {}
    for compile_ in (False, True):
        cfg = tiny_cfg(tmp_path / str(compile_), **COMMON, train__fsdp=True, train__compile=compile_)
        Trainer(cfg).run()
        runs[compile_] = _losses(cfg.run_dir)
    eager, compiled_ = seen[:3], seen[3:]
    assert len(compiled_) == 3 and all(all(s) for s in compiled_) and not any(any(s) for s in eager)
    assert np.allclose(runs[True], runs[False], rtol=0, atol=1e-5)


def _blocks(model):
    from operators.freeze import layer_list

    return layer_list(model)[1]


# Two processes shard a tiny GPT-2 through the trainer's seam (Sharded.place -> sharding.shard) with the plugin
# of launch/accelerate/fsdp.yaml, its mixed precision set as Accelerate's state sets it (mixed_precision: bf16),
# and record the dtype of every all-gather (the parameters FSDP2 computes with) and reduce-scatter (the
# gradients' sum over processes) of one forward and backward.
_REDUCE_DTYPES = """
import json, os, sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from accelerate.utils import FullyShardedDataParallelPlugin

from bench.lib import tiny as tm
from progressive.config import RunConfig
from progressive.run import sharding

dist.init_process_group("gloo")
seen = {"all_gather": [], "reduce_scatter": []}
for name in ("all_gather_single", "reduce_scatter_single"):  # (output, input, ...), by position or by name
    def spy(*a, _real=getattr(dist, name), _name=name.rsplit("_", 1)[0], **k):
        seen[_name].append(str((a[1] if len(a) > 1 else k["input"]).dtype))
        return _real(*a, **k)
    setattr(dist, name, spy)
plugin = FullyShardedDataParallelPlugin()
plugin.set_mixed_precision(os.environ["ACCELERATE_MIXED_PRECISION"])  # what Accelerate's state does
acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), is_fsdp2=True, device=torch.device("cpu"))
out = {"world": dist.get_world_size(), "launcher_policy": str(plugin.mixed_precision_policy.reduce_dtype)}
for asked in (RunConfig().train.fsdp_reduce_dtype, "bf16"):  # the default, then a recipe's bf16
    seen["all_gather"].clear(), seen["reduce_scatter"].clear()
    model = tm.make_model(tm.Shape(tm.GPT2LMHeadModel, heads=2, head_dim=4, layers=2, ffn_mult=2)).train()
    sharding.Sharded(acc, sharding.REDUCE_DTYPES[asked]).place(model, None)
    ids = torch.randint(0, tm.VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    out[asked] = {k: sorted(set(v)) for k, v in seen.items()} | {
        "grads": sorted({str(p.grad.dtype) for p in model.parameters()}),
        "reduce_scatters": len(seen["reduce_scatter"])}
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_fsdp2_reduces_gradients_in_fp32_under_the_launchers_bf16_policy(tmp_path):
    """Accelerate's FSDP2 policy for ``mixed_precision: bf16`` reduces gradients in bf16; the trainer's seam keeps
    the bf16 parameters and reduces in fp32 (train.fsdp_reduce_dtype's default), bf16 only when asked."""

    from tests.procs import run_tree

    script = tmp_path / "reduce.py"
    script.write_text(_REDUCE_DTYPES)
    env = {**os.environ, **_launcher_env(ROOT / "launch" / "accelerate" / "fsdp.yaml"), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    proc = run_tree([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                     str(script), str(tmp_path)], cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["world"] == 2 and got["launcher_policy"] == "torch.bfloat16"  # what the plugin alone would do
        fp32, bf16 = got["fp32"], got["bf16"]
        assert fp32["all_gather"] == ["torch.bfloat16"] and fp32["reduce_scatter"] == ["torch.float32"], fp32
        assert bf16["all_gather"] == ["torch.bfloat16"] and bf16["reduce_scatter"] == ["torch.bfloat16"], bf16
        assert fp32["grads"] == bf16["grads"] == ["torch.float32"]  # the sharded gradients AdamW reads: fp32 both ways
        assert fp32["reduce_scatters"] == 3  # one per FSDP group: two blocks and the root
        print(f"fsdp2 reduce dtype | rank {rank} | launcher policy {got['launcher_policy']} | default "
              f"{fp32['reduce_scatter']} | asked bf16 {bf16['reduce_scatter']} | parameters {fp32['all_gather']}")
