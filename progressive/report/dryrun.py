"""``train.py --dry_run``: validate a recipe and print its plan without data or training.

Builds every level's model on the meta device (no memory, no initialisation), so paper-scale recipes
(GPT-Base, BERT-Large) check in seconds on a laptop: the operators validate every factor, the method
plans its phases against the budget, and the planned FLOPs are compared with the baseline's. ``depth``
is the mean number of transformer-layer applications per micro-batch (Apollo's sampled depth re-uses
shared layers, so it can exceed the layers a phase's model holds).

The corpus's size (tokens, blocks, the epochs the plan reads) is known when a run has prepared the data in
``data.cache_dir``: the dry run finds that cache entry as the run would, without reading the data, hashing a file
or training a tokenizer (progressive.data.find_token_blocks), and says when it cannot know.
"""

from __future__ import annotations

from typing import Any

from common.table import format_table
from progressive.config import RunConfig, validate
from progressive.data import NotKnown, find_token_blocks
from progressive.methods import Method, get_method, phase_flops
from progressive.model.build import get_family, guess_data_info, step_flops
from progressive.model.flops import model_shape
from progressive.pipeline.checks import check_config
from progressive.run.inputs import block_sizes, sizes_line
from progressive.run.summary import param_count, shape_str


def plan_table(cfg: RunConfig) -> dict[str, Any]:
    """The phase plan of ``cfg`` and of its baseline (same model, same train.steps), with FLOPs.

    Raises:
        ConfigError: anything the trainer would reject before loading data.
    """
    validate(cfg)
    family = get_family(cfg.model.family, cfg.model.task)
    base = family.config_for(cfg.model, guess_data_info(cfg), cfg.data.seq_len)
    if cfg.parallel.pipeline != "none":

        check_config(cfg, family, base)

    def flops(c: Any) -> int:
        return step_flops(cfg, family, c)

    def rows(phases: list) -> list[dict[str, Any]]:
        seq = [family.tokens_per_sample(p.config, cfg.data.seq_len) for p in phases]
        return [{"phase": p.name, "shape": shape_str(p.config), "params": param_count(family, p.config),
                 "depth": round(p.mean_layers if p.mean_layers is not None else model_shape(p.config).n_layers, 3),
                 "steps": p.steps, "peak_lr": p.peak_lr, "warmup": p.warmup, "decay": p.decay,
                 "lr_schedule": _schedule(p), "tokens": p.steps * cfg.train.batch_size * s,
                 "flops": float(phase_flops(p, flops))}
                for p, s in zip(phases, seq)]

    method_rows = rows(get_method(cfg, family).plan(base, flops))
    baseline_rows = rows(Method(cfg, family).plan(base, flops))
    total, ref = sum(r["flops"] for r in method_rows), sum(r["flops"] for r in baseline_rows)
    data, line = corpus(cfg, family, sum(r["steps"] for r in method_rows))
    return {"method": cfg.method.name, "phases": method_rows, "baseline": baseline_rows,
            "planned_flops": total, "baseline_flops": ref, "flops_ratio": total / ref, "data": data,
            "data_line": line}


def corpus(cfg: RunConfig, family: Any, steps: int) -> tuple[dict[str, Any] | None, str]:
    """(the corpus's sizes as a run's summary.json records them (``block_sizes``), or None; the line that says them
    with the cache entry they come from, or why they cannot be known before a run prepares the data). Text
    pre-training only: a run of images or labelled examples says its examples at its start."""
    if not family.is_text or family.objective == "seqcls":
        return None, ("data: the dry run counts the token blocks of text pre-training; a run prints its examples at "
                      "its start")
    try:
        blocks = find_token_blocks(cfg.data)
    except NotKnown as e:
        return None, (f"data: not known before a run prepares it ({e}): the dry run reads neither the data nor a "
                      "tokenizer it would have to train")
    sizes = block_sizes(blocks, steps, cfg.train.batch_size)
    return sizes, f"data (cached in {blocks.path}): {sizes_line(sizes)}"


def _schedule(p: Any) -> str:
    """"own" when the phase is its own LR schedule, else which steps of a longer one it runs."""
    if p.schedule_steps is None and p.schedule_offset == 0:
        return "own"
    return f"steps {p.schedule_offset}-{p.schedule_offset + p.steps} of {p.schedule_steps}"


def dry_run(cfg: RunConfig) -> dict[str, Any]:
    """Print the plan of ``cfg`` (see plan_table) and return it."""
    plan = plan_table(cfg)
    m = cfg.model
    seq = plan["phases"][0]["tokens"] // (plan["phases"][0]["steps"] * cfg.train.batch_size)
    print(f"dry run: {cfg.name} ({cfg.method.name}), {m.family} {m.num_layers}L/{m.hidden_size}d/{m.num_heads}h, "
          f"global batch {cfg.train.batch_size} x {seq} tokens, budget train.steps={cfg.train.steps}")
    cols = ["phase", "shape", "params", "depth", "steps", "peak_lr", "warmup", "decay", "lr_schedule", "tokens",
            "flops"]
    print(format_table(plan["phases"], cols))
    steps, ref_steps = sum(r["steps"] for r in plan["phases"]), sum(r["steps"] for r in plan["baseline"])
    print(f"planned FLOPs {plan['planned_flops']:.4g} vs baseline {plan['baseline_flops']:.4g} "
          f"({plan['flops_ratio']:.1%} of the baseline; {1 - plan['flops_ratio']:.1%} fewer) in {steps} steps "
          f"vs the baseline's {ref_steps}")
    p = cfg.parallel
    if p.pipeline != "none":
        print(f"pipeline: {p.pipeline}, K = {p.stages} stages{' at the start' * (p.pipeline == 'elastic')} "
              f"(schedule {p.schedule}, micro-batches {p.microbatches}, balance {p.balance}); launch a multiple of "
              f"{p.stages} processes, one per device: torchrun --nproc_per_node N train.py --config ...")
    print(memory_line(plan))
    print(plan["data_line"])
    print("config valid; nothing was trained")
    return plan


def memory_line(plan: dict[str, Any], processes: int = 8) -> str:
    """What the model state needs per process at the plan's largest level (activations not counted): fp32
    weights, gradients and two AdamW moments, 16 bytes per parameter, whole under DDP and divided by the
    processes under FSDP2; and what a level change adds under FSDP2, where every process holds whole copies
    of the old and the new model with their moments (12 bytes per parameter each) while the operators run."""
    params = [r["params"] for r in plan["phases"]]
    largest = max(params)
    pairs = [a + b for a, b in zip(params, params[1:]) if a != b]
    gb = 2 ** 30
    line = (f"memory per process at the largest level ({largest:,} parameters; weights, gradients, AdamW in fp32, "
            f"activations not counted): DDP {16 * largest / gb:.2f} GiB; FSDP2 over {processes} processes "
            f"{16 * largest / processes / gb:.2f} GiB")
    if pairs:
        line += f", plus up to {12 * max(pairs) / gb:.2f} GiB of whole copies during a level change"
    return line
