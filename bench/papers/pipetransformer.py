"""He et al., ICML 2021 (PipeTransformer): Table 1 and its ablation at this machine's scale
(``python -m bench.papers pipetransformer``).

Fine-tuning from checkpoints trained here (the multi-level page's baselines: a 4x128 DeiT pre-trained on
CIFAR-10 images, a 4x128 BERT masked LM), ViT on a CIFAR-10 subset (several epochs, so AutoCache can hit) and
BERT on SST-2, each way:
- one process (2 threads): plain, AutoFreeze, AutoFreeze + AutoCache;
- **two processes of one thread each (torchrun, gloo), actually run**: the paper's baseline (a fixed GPipe
  pipeline, K = 2), freezing only (frozen layers stay in their stage, forward only), AutoPipe + AutoDP
  (elastic: K 2 -> 1 and the freed process becomes a data-parallel replica) and all four (+ AutoCache).
  AutoPipe + AutoCache *without* AutoDP (freed processes idle) is not a mode of this engine: that column of
  the paper's ablation is not measured here.
Speed-up = the baseline's training wall-clock over the run's, with the final validation accuracy beside it;
and at equal accuracy: the wall-clock at which the baseline first reached the run's final accuracy over the
run's (the paper's Table 1 compares at equal accuracy).
The **simulator** (the bubble model of bench/speed/elastic.py) predicts each two-process run from the engine's own
per-layout profile (ms per stage for one micro-batch, in summary.json), the frozen prefix's forward (1/3 of a
layer's forward + backward), and communication from transfer times measured here between two gloo processes
(point-to-point activations, all-reduce of the trainable gradients): its speed-up is printed beside the
measured one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.lib.comm import measure_comm
from bench.lib.envelope import frontier, saving
from bench.lib.runs import config_hash
from bench.papers import core
from bench.papers import multilevel as ML
from progressive.config import load_config

PAPER = "ViT-B: 2.83x (ImageNet), 2.44x (CIFAR-100); BERT-large SQuAD 1.1: 2.10x; ablation (ViT-B, ImageNet): " \
        "freeze only 0.95x, + AutoPipe + AutoCache 1.26x, + AutoPipe + AutoDP 2.27x, all four 2.83x"
RECIPES = {"ViT / CIFAR-10": "launch/recipes/vit_b_elastic_cifar100.yaml",
           "BERT / SST-2": "launch/recipes/bert_base_autofreeze_sst2.yaml"}
AF = {"method.name": "autofreeze", "method.autofreeze.cache.enabled": False}  # the ViT recipe turns it on
CACHE = {"method.autofreeze.cache.enabled": True}
VARIANTS = (  # (label, overrides, processes)
    ("plain, 1 process", {"method.name": "baseline"}, 1),
    ("AutoFreeze, 1 process", AF, 1),
    ("AutoFreeze + AutoCache, 1 process", {**AF, **CACHE}, 1),
    ("GPipe K=2 (the paper's baseline)", {"method.name": "baseline", "parallel.pipeline": "fixed"}, 2),
    ("freeze only (fixed K=2)", {**AF, "parallel.pipeline": "fixed"}, 2),
    ("AutoPipe + AutoDP", {**AF, "parallel.pipeline": "elastic"}, 2),
    ("all four (+ AutoCache)", {**AF, **CACHE, "parallel.pipeline": "elastic"}, 2),
)
SMOKE_VARIANTS = (0, 2, 3, 6)  # --smoke: plain, AutoFreeze + AutoCache, GPipe and all four (two torchrun runs)
BINARY = ("BERT / SST-2",)  # two balanced classes: chance is 50%
CHANCE_BELOW = 55  # % validation accuracy under which every run of a binary task is said to be at chance


def checkpoints(ctx: core.Context) -> dict[str, Path]:
    """The pre-trained DeiT and BERT the fine-tuning starts from (the multi-level page's baselines)."""

    root = ctx.out if ctx.smoke else ctx.out.parent / "multilevel"
    out = {}
    for task, recipe, extra in (("ViT / CIFAR-10", ML.DEIT, {"data.max_images": 200}),
                                ("BERT / SST-2", ML.BERT, {})):
        over = ({"data.cache_dir": str(core.ROOT / ".cache" / "data"),
                 **(ML.TINY_TEXT if "BERT" in task else {**ML.TINY, **extra})} if ctx.smoke
                else {"train.eval_every": 20, "train.eval_batches": 10**5})
        _, folder, _ = core.train(ctx, recipe, {**over, "method.name": "baseline"}, f"pre-train {task}", root,
                                  cell=task)
        out[task] = folder / "final"
    return out


def finetune_overrides(ctx: core.Context, task: str, init: Path) -> tuple[str, dict[str, Any]]:
    """(recipe, overrides) of the fine-tuning runs of ``task``."""
    common = {"model.init_from": str(init), "train.checkpoint_every": 10**6, "method.autofreeze.criterion": "argmin",
              "method.autofreeze.alpha": 0.3333, "parallel.stages": 2, "parallel.balance": "params"}
    if ctx.smoke:
        common.update({"train.steps": 8, "train.batch_size": 8, "train.eval_every": 4, "train.eval_batches": 2,
                       "method.autofreeze.freeze_every": 2, "data.cache_dir": str(core.ROOT / ".cache" / "data")})
    else:
        common.update({"train.steps": 200, "train.eval_every": 40, "method.autofreeze.freeze_every": 40})
    if task.startswith("ViT"):
        return "configs/autofreeze_cifar10.yaml", {**common, "data.max_images": 64 if ctx.smoke else 2560,
                                                   **({} if ctx.smoke else {"train.eval_batches": 10**5})}
    return "configs/autofreeze_sst2.yaml", {**common, **({"data.seq_len": 32} if ctx.smoke else {})}


def torchrun(ctx: core.Context, recipe: str, overrides: dict[str, Any], label: str) -> Path:
    """Train ``recipe`` with 2 processes of one thread (torchrun, gloo) unless a finished run is there."""

    over = {**overrides, "train.threads": 1, "train.cpu": True, "train.progress": False, "train.report_to": "none"}
    key = config_hash(load_config(core.ROOT / recipe, over))
    folder = ctx.out / key
    core.record_command(ctx, recipe, over, "OMP_NUM_THREADS=1 torchrun --nproc_per_node 2")
    if not (folder / "summary.json").is_file():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in over.items()]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               str(core.ROOT / "train.py"), "--config", str(core.ROOT / recipe), "--name", key,
               "--output_dir", str(ctx.out), *args]
        print(f"   {label}: torchrun, 2 processes x 1 thread, in {folder}", flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(ctx.out / f"{key}.log", "w") as log:
            subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=core.ROOT)
    ctx.step(f"{label}: {key}")
    return folder


# ---------------------------------------------------------------------------------------------- simulator


def simulate(summary: dict[str, Any], comm: dict[str, tuple[float, float]], act_bytes: float,
             grad_bytes_per_layer: float, layers: int, local_batch: int) -> float:
    """Predicted training seconds of a two-process run from its own layouts (summary["transitions"]): per
    layout, a step = frozen prefix forward + (M + K - 1) x the slowest stage's time for one micro-batch +
    2 (K - 1) M activation transfers + the gradient all-reduce over dp; plus the measured re-mesh seconds.

    The engine profiles one micro-batch of ``local_batch / world`` samples (M = K at the start), while AutoPipe
    may choose another M: a stage's time is scaled to the micro-batch actually run (linear in samples)."""
    lat_p, per_p = comm["p2p"]
    lat_a, per_a = comm["allreduce"]
    lays = summary["transitions"]
    first = lays[0]
    prof_n = local_batch / (first["k"] * first["dp"])  # the profiled micro-batch (progressive/pipeline/engine.py)
    layer_ms = sum(first["profiled_ms_per_stage"]) / max(1, layers)  # one layer, one profiled micro-batch
    total = 0.0
    for lay in lays:
        steps = lay["steps"][1] - lay["steps"][0]
        k, dp, m = lay["k"], lay["dp"], lay["microbatches"]
        mb = local_batch / dp / m
        stage_ms = max(lay["profiled_ms_per_stage"] or [0.0]) * mb / prof_n
        prefix_ms = lay["frozen"] * layer_ms / 3 * (local_batch / dp) / prof_n
        p2p_s = 2 * (k - 1) * m * (lat_p + per_p * act_bytes * mb)
        ar_s = (lat_a + per_a * grad_bytes_per_layer * (layers - lay["frozen"])) if dp > 1 else 0.0
        total += steps * ((m + k - 1) * stage_ms / 1000 + prefix_ms / 1000 + p2p_s + ar_s) + lay["seconds"]
    return total


# ---------------------------------------------------------------------------------------------- the page's data


def task_table(ctx: core.Context, task: str, init: Path, comm: dict[str, tuple[float, float]]) -> list[dict]:

    from transformers import AutoConfig

    recipe, over = finetune_overrides(ctx, task, init)
    runs = {}
    for label, extra, procs in (VARIANTS[i] for i in (SMOKE_VARIANTS if ctx.smoke else range(len(VARIANTS)))):
        if procs == 1:
            _, folder, _ = core.train(ctx, recipe, {**over, **extra, "train.threads": 2}, f"{task} {label}",
                                      cell=task)
        else:
            folder = torchrun(ctx, recipe, {**over, **extra}, f"{task} {label}")
        runs[label] = (folder, json.loads((folder / "summary.json").read_text()), procs)
    cfg = AutoConfig.from_pretrained(init)
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers

    rc = load_config(core.ROOT / recipe, over)
    tokens = (rc.data.image_size // cfg.patch_size) ** 2 + 2 if task.startswith("ViT") else rc.data.seq_len
    act = 4.0 * hidden * tokens  # fp32 hidden state per sample
    grad = 4.0 * 12 * hidden * hidden  # one layer's weights
    base_label = VARIANTS[3][0]
    base_wall = runs[base_label][1]["train_wall_s"]
    base_sim = simulate(runs[base_label][1], comm, act, grad, layers, rc.train.batch_size)
    base_metrics = _metrics(runs[base_label][0])
    rows = []
    for label, (folder, summ, procs) in runs.items():
        metrics = _metrics(folder)
        val = [r for r in metrics if r["kind"] == "val"][-1]
        train = [r for r in metrics if r["kind"] == "train"][-1]
        sim = simulate(summ, comm, act, grad, layers, rc.train.batch_size) if procs == 2 else None
        rows.append({"task": task, "run": label, "processes": f"{procs} x {'1' if procs == 2 else '2'} thread",
                     "val acc": f"{100 * val['val_accuracy']:.1f}", "wall s": f"{summ['train_wall_s']:.1f}",
                     "speed-up (measured)": f"{base_wall / summ['train_wall_s']:.2f}x",
                     "speed-up at equal acc": equal_accuracy_speedup(base_metrics, metrics),
                     "speed-up (simulated)": f"{base_sim / sim:.2f}x" if sim else "—",
                     "simulated s": f"{sim:.1f}" if sim else "—", "frozen": train.get("frozen", 0),
                     "cache hits": f"{100 * train['cache_hit_rate']:.0f}%" if "cache_hit_rate" in train else "—",
                     "criterion decided": _criterion_decided(metrics),
                     "FLOPs": f"{summ['flops']:.3g}"})
    return rows


def _metrics(folder: Path) -> list[dict[str, Any]]:

    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def equal_accuracy_speedup(base: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> str:
    """The wall-clock at which the baseline's validation accuracy first reaches the run's final accuracy (error
    rate interpolated log-log between its evaluations, bench.lib.envelope) over the run's: "1.43x", or a bound
    (">=" / "<=") where the run's accuracy is outside the baseline's range."""

    curve = frontier((1.0 - r["val_accuracy"], r["wall"]) for r in base if r["kind"] == "val" and r["step"] > 0)
    final = [r for r in metrics if r["kind"] == "val"][-1]
    if not curve or final["val_accuracy"] >= 1.0:
        return "—"
    s, kind = saving(final["wall"], curve, 1.0 - final["val_accuracy"])
    return f"{'' if kind == '=' else kind + ' '}{1.0 / (1.0 - s):.2f}x" if s < 1 else "—"


def _criterion_decided(metrics: list[dict[str, Any]]) -> str:
    """"k of n": the freeze decisions where AutoFreeze's gradient criterion froze fewer layers than the bound
    allowed (the criterion, not the schedule, decided), from the logged freeze_bound / freeze_criterion."""
    seen: dict[int, tuple[int, int]] = {}
    for r in metrics:
        if r["kind"] == "train" and r.get("freeze_decisions"):
            seen[r["freeze_decisions"]] = (r["freeze_bound"], r["freeze_criterion"])
    return f"{sum(c < b for b, c in seen.values())} of {len(seen)}" if seen else "—"


def run(ctx: core.Context, results: Path) -> dict[str, Any]:
    """Pre-train (or reuse) the checkpoints, fine-tune every way, measure the links; return the page's data (this
    page draws no figure into ``results``)."""

    t0 = time.time()
    tasks = ("ViT / CIFAR-10",) if ctx.smoke else ("ViT / CIFAR-10", "BERT / SST-2")
    ctx.plan(2 + len(tasks) * (len(SMOKE_VARIANTS) if ctx.smoke else len(VARIANTS)))
    inits = checkpoints(ctx)
    comm = measure_comm((1 << 12, 1 << 16) if ctx.smoke else (1 << 12, 1 << 16, 1 << 20, 1 << 22))
    rows = [r for task in tasks for r in task_table(ctx, task, inits[task], comm)]
    chance = [t for t in BINARY if t in tasks
              and all(float(r["val acc"]) < CHANCE_BELOW for r in rows if r["task"] == t)]
    links = {k: {"latency_us": 1e6 * lat, "mb_per_s": 1e-6 / per if per else None} for k, (lat, per) in comm.items()}
    notes = {"links": links, "paper": PAPER, "recipes": RECIPES, "at_chance": chance, "chance_below_pct": CHANCE_BELOW}
    return {"run": core.run_info(ctx, time.time() - t0), "tables": {"runs": rows}, "notes": notes,
            "commands": core.commands(ctx)}
