"""Typed run configuration: dataclasses, YAML recipes, ``--key value`` overrides, validation, diffs.

A run is one ``RunConfig``: ``model`` (family and full-size shape), ``data`` (``DataConfig``, data.py),
``train`` (budget, optimizer, precision, logging), ``method`` (which method and its settings: the sections
of methods.py) and ``parallel`` (pipeline parallelism: progressive/pipeline/, when not "none"). Each field
says what changing it affects (its mark, fields.py: ``mark(key)``); each section checks its own fields.
Recipes live in configs/*.yaml; every key is checked against the dataclasses, so a typo is an error that
names the field instead of a silently ignored setting. Command-line overrides use dotted paths, list
items by index: ``--train.lr 1e-3 --method.vcycle.levels.1.down.fraction 0.4``. This module is the schema;
the conversion between dataclasses and nested dicts is progressive.config.tree (re-exported here).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from progressive.config.data import DataConfig
from progressive.config.fields import (
    MARKS,
    NON_EMPTY,
    WSD,
    Decay,
    Mark,
    check_branches,
    check_choices,
    check_ranges,
    check_schedule,
    drop_inert,
    field_marks,
    keep,
    mark_of,
    setting,
)
from progressive.config.methods import METHOD_OPTIONS, register_method_options
from progressive.config.reader import read_text, read_yaml
from progressive.config.tree import (
    ConfigError,
    Verbatim,
    coerce,
    flatten,
    from_dict,
    plain,
    set_dotted,
    show,
    to_dict,
)

__all__ = ["ConfigError", "RunConfig", "ModelConfig", "DataConfig", "MethodConfig", "TrainConfig", "ParallelConfig",
           "METHOD_OPTIONS", "register_method_options", "load_config", "dump_yaml", "diff", "resume_diff",
           "validate", "check_schedule", "replace", "from_dict", "to_dict", "set_dotted", "flatten", "Mark",
           "MARKS", "mark", "keep_marked", "counted", "PATHS", "read_paths"]

@dataclass
class ModelConfig:
    """The full-size model (level 0 of a V-cycle, the last stage of Apollo). Sizes left unset are derived:
    intermediate_size = 4 * hidden (Llama: 8/3 * hidden rounded to 32), vocab_size = the tokenizer's, max_position =
    data.seq_len, num_kv_heads = num_heads; vision models use data.image_size and patch_size. ``task``: "pretrain"
    trains the family's own objective (causal LM, masked LM, image classification); "classify" fine-tunes a text
    family for sequence classification (data.dataset "glue:<task>" or a Hugging Face dataset). ``init_from``: start
    from a checkpoint's weights; its config.json then defines the shape (the size fields here are ignored)."""

    family: str = setting("gpt2", "numbers")  # one of progressive.model.build.FAMILIES (checked there, by get_family)
    task: Literal["pretrain", "classify"] = setting("pretrain", "numbers")  # the family's objective | text classes
    # a Hugging Face checkpoint folder (or Hub id) to start from
    init_from: str | None = setting(None, "numbers", path=True)
    hidden_size: int = setting(256, "numbers", at_least=1, at_most=65_536)  # the width: the residual stream's size
    num_layers: int = setting(4, "numbers", at_least=1, at_most=1_024)  # transformer blocks
    num_heads: int = setting(4, "numbers", at_least=1, at_most=1_024)  # attention heads (they divide hidden_size)
    # key/value heads (grouped-query attention; unset: num_heads)
    num_kv_heads: int | None = setting(None, "numbers", at_least=1)
    # the MLP's inner width (unset: 4 x hidden, Llama 8/3 x hidden rounded to 32)
    intermediate_size: int | None = setting(None, "numbers", at_least=1)
    # the embedding's rows (unset: the tokenizer's vocabulary)
    vocab_size: int | None = setting(None, "numbers", at_least=1)
    max_position: int | None = setting(None, "numbers", at_least=1)  # learned positions (unset: data.seq_len)
    dropout: float = setting(0.0, "numbers")  # dropout probability, in [0, 1)
    tie_word_embeddings: bool = setting(True, "numbers")  # the LM head shares the input embedding's weights
    patch_size: int = setting(4, "numbers", at_least=1)  # vision models: the side of a patch, in pixels

    def validate(self, where: str = "model") -> None:
        """Raise ConfigError naming ``where.<field>`` (the family is checked by progressive.model.build)."""
        check_choices(self, where)
        check_ranges(self, where)
        _check(self.init_from is None or bool(str(self.init_from).strip()),
               f"{where}.init_from: a checkpoint folder or Hub id")
        _check(self.hidden_size % self.num_heads == 0,
               f"{where}.hidden_size: {self.hidden_size} is not divisible by {where}.num_heads={self.num_heads}")
        kv = self.num_kv_heads or self.num_heads
        _check(self.num_heads % kv == 0,
               f"{where}.num_kv_heads: {kv} does not divide {where}.num_heads={self.num_heads}")
        _check(0 <= self.dropout < 1, f"{where}.dropout: must be in [0, 1), got {self.dropout}")


@dataclass
class MethodConfig:
    """Which method runs (``name``) and, per registered method, its options: ``method.<name>: {...}`` in
    YAML, ``cfg.method.<name>`` in code. Every registered method's section is present (defaults if not
    given), so recipes, dumps and resume diffs see one shape."""

    name: str = "baseline"  # the method that runs: baseline or a registered method (progressive/config/registry.py)
    options: dict[str, Any] = field(default_factory=lambda: {n: cls() for n, cls in METHOD_OPTIONS.items()})

    def __getattr__(self, key: str) -> Any:
        options = self.__dict__.get("options", {})
        if key in options:
            return options[key]
        raise AttributeError(f"method has no options section {key!r} (registered: {', '.join(options) or 'none'})")

    def as_tree(self) -> dict[str, Any]:
        """{"name": ..., "<method>": {...}, ...}: the recipe's shape."""
        return {"name": self.name, **{n: plain(o) for n, o in self.options.items()}}

    @classmethod
    def section_types(cls) -> dict[str, type]:
        """{"<method>": its options dataclass}: the types of ``as_tree``'s sections (fields.drop_inert walks them)."""
        return dict(METHOD_OPTIONS)

    @classmethod
    def from_tree(cls, data: Any, where: str) -> MethodConfig:
        """Parse the ``method:`` section; unknown keys name the field and list the valid ones."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping, got {show(data)}")
        valid = {"name", *METHOD_OPTIONS}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key; valid keys here: {', '.join(sorted(valid))}")
        name = coerce(data.get("name", "baseline"), str, f"{where}.name")
        options = {n: from_dict(opt_cls, data.get(n), f"{where}.{n}") for n, opt_cls in METHOD_OPTIONS.items()}
        return cls(name=name, options=options)


@dataclass
class TrainConfig:
    """Budget, optimizer, precision and bookkeeping. ``steps`` is the budget: optimizer steps of the full
    model (the baseline's length); methods spend the same FLOPs. ``batch_size`` is the global batch per
    optimizer step (split over processes and ``grad_accum`` micro-batches). ``warmup``/``decay``/
    ``min_lr_ratio``/``cooldown`` are the baseline's schedule (and that of the methods that run one schedule over
    their stages): ``decay: wsd`` / ``wsd_sqrt`` hold the peak after the warm-up and cool down over the last
    ``cooldown`` fraction of the steps, linearly / as 1 - sqrt (progressive.methods.base.LRSchedule)."""

    # the budget: optimizer steps of the full model (methods spend the same FLOPs)
    steps: int = setting(200, "numbers", at_least=1)
    # the global batch of an optimizer step, in samples (blocks of data.seq_len tokens)
    batch_size: int = setting(16, "numbers")
    grad_accum: int = setting(1, "numbers")  # micro-batches a step accumulates (they divide batch_size)
    lr: float = setting(1e-3, "tuning")  # rescales every phase's peak LR from a resumed step on (after a NaN stop)
    warmup: float = setting(0.05, "numbers")  # the linear warm-up, a fraction of the schedule's steps
    # the LR's shape after the warm-up: linear, cosine, constant, wsd or wsd_sqrt
    decay: Decay = setting("cosine", "numbers", choices="must be one of linear, cosine, constant, wsd, wsd_sqrt")
    min_lr_ratio: float = setting(0.1, "numbers")  # the LR at the schedule's end, a fraction of the peak
    # a WSD decay's cooldown, a fraction of the schedule's steps; no effect (nor part of a bench key) under the others
    cooldown: float = setting(0.2, "numbers", counts_if=("decay", WSD))
    # WSD cooldown branches: for each length b (steps, < steps) the model is also cooled down from step b -
    # cooldown * b of this run's stable phase and evaluated, as if trained for b steps with this run's warm-up
    # (progressive/run/branches.py); the run itself is unchanged. Several budgets for about the largest's FLOPs
    branches: list[int] = setting(affects="records", factory=list, counts_if=("branches", NON_EMPTY))
    weight_decay: float = setting(0.01, "numbers")  # AdamW's decoupled weight decay
    adam_beta1: float = setting(0.9, "numbers")  # AdamW's first-moment decay
    adam_beta2: float = setting(0.95, "numbers")  # AdamW's second-moment decay
    adam_eps: float = setting(1e-8, "numbers")  # AdamW's epsilon
    max_grad_norm: float = setting(1.0, "tuning")  # clip the gradients' global norm to this (0: no clipping)
    # AdamW's kernels: fused, foreach, plain, or auto (fused where the device has it)
    optimizer: Literal["auto", "fused", "foreach", "plain"] = setting("auto", "numbers")
    # None: the launcher's (accelerate launch), else bf16 on a GPU, fp32 on CPU
    mixed_precision: Literal["no", "bf16", "fp16"] | None = setting(
        None, "tuning", choices="one of no, bf16, fp16 (or unset: the launcher's)")
    # torch.compile (inductor): true, false or "auto" (on where a GPU trains; progressive/run/compiled.py); which
    # kernels compute the same functions: the numbers move by rounding only
    compile: bool | Literal["auto"] = setting("auto", "tuning", choices="true, false or auto")
    # the LM loss: "chunked" (the head and cross-entropy a chunk of rows at a time, no whole logits:
    # progressive/model/loss.py), "model" (transformers'), "auto" (chunked where a micro-batch's fp32 logits would
    # exceed 1 GiB, i.e. where chunking splits them)
    loss: Literal["auto", "chunked", "model"] = setting("auto", "tuning")
    cpu: bool = setting(False, "numbers")  # train on the CPU even where a GPU is present
    # FSDP2 (fully_shard per block, sharded checkpoints); on by itself under an FSDP2 launcher
    fsdp: bool = setting(False, "device")
    # FSDP2: the dtype gradients are reduced (summed over processes) in, whatever the parameters' (the launcher's
    # bf16 included); "bf16" halves the traffic and rounds the sum
    fsdp_reduce_dtype: Literal["fp32", "bf16"] = setting("fp32", "speed")
    # the run's seed: initialisation, data order, masks
    seed: int = setting(0, "numbers", limits="a seed in 0 .. 2**32 - 1", at_least=0, at_most=2**32 - 1)
    # torch's CPU threads (unset: torch's default)
    threads: int | None = setting(None, "tuning", at_least=1, at_most=1_024)
    # glibc keeps freed host memory: no mmap/munmap of large tensors every CPU step
    # (common.device.keep_freed_host_memory); the same numbers, the resident set stays at its peak
    keep_host_memory: bool = setting(True, "device")
    # steps between validation evaluations (and at each phase's end)
    eval_every: int = setting(50, "records", at_least=1)
    # validation batches an evaluation reads (of batch_size samples)
    eval_batches: int = setting(4, "tuning", at_least=1)
    log_every: int = setting(1, "records", at_least=1)  # steps between train rows in metrics.jsonl
    checkpoint_every: int = setting(100, "records", at_least=1)  # steps between checkpoints (and at every level change)
    keep_checkpoints: int = setting(2, "records", at_least=1)  # the newest checkpoints kept (older ones are removed)
    # a tracker: none, wandb, tensorboard or trackio
    report_to: Literal["none", "wandb", "tensorboard", "trackio"] = setting("none", "bookkeeping")
    project: str = setting("growtrain", "bookkeeping")  # the tracker's project
    # W&B group; None: the run's name (a --compare groups its runs under its own name)
    group: str | None = setting(None, "bookkeeping")
    log_checkpoint: bool = setting(False, "bookkeeping")  # W&B: upload final/ as a model artifact at the end
    # first train the baseline of the same size on the same data, budget and seed, then the method, and print the
    # method's saving against it (what --compare baseline,<method> does)
    with_baseline: bool = setting(False, "bookkeeping")
    # the baseline's own learning rate in a comparison (its tuned one); None: train.lr
    baseline_lr: float | None = setting(None, "bookkeeping")
    progress: bool = setting(True, "bookkeeping")  # show a progress bar (lines in a log file)
    plots: bool = setting(True, "bookkeeping")  # draw the loss plots at the end (and --compare's compare.png)
    # the device's peak bf16 TFLOP/s for MFU; None: a known GPU's data sheet figure
    peak_tflops: float | None = setting(None, "device")
    # after SIGINT/SIGTERM: seconds to reach a step boundary and checkpoint (0: no bound)
    stop_timeout: float = setting(20.0, "bookkeeping")
    # a launch whose environment names several ranks (WORLD_SIZE, MASTER_ADDR, ... set by hand or a scheduler, not
    # torchrun): seconds to wait for all of them before the run starts (progressive/run/rendezvous.py; 0: no bound)
    rendezvous_timeout: float = setting(600.0, "bookkeeping")

    def validate(self, where: str = "train") -> None:
        """Raise ConfigError naming ``where.<field>`` for a value that cannot work."""
        check_ranges(self, where)
        _check(self.batch_size >= 1 and self.grad_accum >= 1, f"{where}.batch_size / {where}.grad_accum: must be >= 1")
        _check(self.batch_size % self.grad_accum == 0,
               f"{where}.batch_size: {self.batch_size} is not divisible by {where}.grad_accum={self.grad_accum}")
        _check(self.lr > 0, f"{where}.lr: must be > 0, got {self.lr}")
        _check(self.baseline_lr is None or self.baseline_lr > 0,
               f"{where}.baseline_lr: must be > 0 (or unset), got {self.baseline_lr}")
        check_schedule(self.warmup, self.decay, self.min_lr_ratio, where, self.cooldown)
        check_branches(self.branches, self.steps, self.warmup, self.decay, self.cooldown, where)
        _check(self.max_grad_norm >= 0,
               f"{where}.max_grad_norm: must be >= 0 (0 = no clipping), got {self.max_grad_norm}")
        check_choices(self, where)
        _check(self.rendezvous_timeout >= 0, f"{where}.rendezvous_timeout: seconds >= 0 (0 = no bound), got "
                                             f"{self.rendezvous_timeout}")
        _check(self.stop_timeout >= 0, f"{where}.stop_timeout: seconds >= 0 (0 = wait for the step boundary however "
                                       f"long), got {self.stop_timeout}")


@dataclass
class ParallelConfig:
    """``parallel:`` pipeline parallelism (progressive/pipeline/, PipeTransformer's AutoPipe + AutoDP).
    ``pipeline``: "none" (one model per process, DDP: the trainer), "fixed" (K stages for the whole run),
    "elastic" (K halves while AutoFreeze freezes a prefix, and the freed processes become data-parallel
    replicas). ``stages``: K (at the start, for elastic; a power of two there), with world size = K x dp.
    ``microbatches``: per pipeline and step, "auto" (a short profile over K, 2K, 4K, ...) or a number (capped
    by the local batch). ``schedule``: gpipe | 1f1b. ``balance``: what the partition balances: "time"
    (measured per-layer forward+backward), "params" (parameter counts, the authors' proxy) or "uniform"
    (layer counts; deterministic, for tests). ``profile_steps``: repeats of each measurement. How the pipeline
    splits and orders work may change on resume: the losses move by fp32 rounding only."""

    pipeline: Literal["none", "fixed", "elastic"] = setting("none", "numbers")
    stages: int = setting(2, "numbers")
    microbatches: int | Literal["auto"] = setting("auto", "tuning", choices="'auto' or a number >= 1")
    schedule: Literal["gpipe", "1f1b"] = setting("gpipe", "tuning")
    balance: Literal["time", "params", "uniform"] = setting("time", "tuning")
    profile_steps: int = setting(3, "tuning")

    def validate(self, where: str = "parallel") -> None:
        """Raise ConfigError naming ``where.<field>`` for a value that cannot work."""
        check_choices(self, where)
        _check(self.stages >= 1, f"{where}.stages: must be >= 1, got {self.stages}")
        _check(isinstance(self.microbatches, str) or self.microbatches >= 1,
               f"{where}.microbatches: 'auto' or a number >= 1, got {self.microbatches!r}")
        _check(self.profile_steps >= 1, f"{where}.profile_steps: must be >= 1, got {self.profile_steps}")


@dataclass
class RunConfig:
    """Everything a run needs. Outputs go to ``output_dir/name``."""

    name: str = setting("run", "place")  # the run's folder name under output_dir (auto: one made from the settings)
    output_dir: str = setting("outputs", "place", path=True)  # where run folders go
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = setting(affects="numbers", factory=MethodConfig)  # every option of every method
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def run_dir(self) -> Path:
        """outputs/<name>."""
        return Path(self.output_dir) / self.name


FIELDS = field_marks(RunConfig)  # "train.lr" -> its field (whose metadata holds its mark); "method" for its section
PATHS = tuple(k for k, f in FIELDS.items() if f.metadata["path"])  # the fields that name a file or folder


def mark(key: str) -> Mark:
    """What the field at dotted ``key`` affects ("train.lr", "method.vcycle.levels.0.alpha"; see
    progressive.config.fields): the one answer the resume diff, the bench cache key, ``--name auto`` and the
    baseline look-up read."""
    return mark_of(FIELDS, key)


def read_paths(cfg: RunConfig) -> dict[str, str | None]:
    """{"data.dataset": ..., ...}: the fields marked as paths that name what a run reads (not its own place)."""
    tree = flatten(to_dict(cfg))
    return {k: tree[k] for k in PATHS if mark(k).name != "place"}


def keep_marked(tree: dict, wanted: Any) -> dict:
    """``tree`` (``to_dict(cfg)``) without the fields whose mark fails ``wanted(mark) -> bool``, nor those that have no
    effect in it (fields.drop_inert: a cooldown under a cosine decay); order kept."""
    return keep(drop_inert(tree, RunConfig), FIELDS, wanted)


def counted(tree: dict, wanted: Any = lambda mark: True) -> dict:
    """The one rule for which options of a config tree (``to_dict(cfg)``, or a saved run's) count: the fields that
    have an effect in it (``keep_marked``: not a cooldown under a cosine decay) and, of the method section, only the
    running method's options; ``wanted(mark)`` narrows it to a use's fields (the cache key's, a comparison's). The
    resume check (``diff``), the cache key (bench.lib.runs.config_hash) and the baseline a run is plotted against
    (run/summary.find_baseline) all read it."""
    tree = keep_marked(tree, wanted)
    method = tree.get("method")
    if isinstance(method, dict) and "name" in method:
        name = method["name"]
        tree["method"] = {"name": name, **({name: method[name]} if name in method else {})}
    return tree


def load_config(path: str | Path | None, overrides: dict[str, str] | None = None,
                base: dict | None = None) -> RunConfig:
    """Read a YAML recipe (or ``base``, a saved run's config tree, or the defaults when both are None),
    apply dotted overrides, validate types.

    Raises:
        ConfigError: unknown key, wrong type, a YAML file that is empty, malformed or not a mapping.
        FileNotFoundError: ``path`` does not exist.
    """
    tree = to_dict(RunConfig())
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"--config {path}: no such file")
        raw = read_yaml(read_text(path, f"--config {path}"), f"--config {path}")
        if raw is None:
            raise ConfigError(f"--config {path}: the file is empty; a recipe needs at least one section "
                              "(model, data, train, method); configs/default.yaml is an example")
        # Validate the file alone first, so its errors name the file's keys; then merge onto defaults.
        tree = to_dict(from_dict(RunConfig, raw))
    elif base is not None:
        tree = to_dict(from_dict(RunConfig, base))
    for key, text in (overrides or {}).items():  # command-line text stays as typed: tree.Verbatim
        set_dotted(tree, key, Verbatim(text) if isinstance(text, str) else text)
    for key in PATHS:  # "~/runs" is the home folder's runs, as in a shell (not a folder named "~")
        *sections, field_ = key.split(".")
        node = tree
        for section in sections:
            node = node[section]
        value = node.get(field_)
        if isinstance(value, str) and value.startswith("~"):
            node[field_] = os.path.expanduser(value)
    return from_dict(RunConfig, tree)


def dump_yaml(cfg: RunConfig) -> str:
    """The config as YAML text (what a run saves next to its outputs)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def diff(old: dict, new: dict) -> list[str]:
    """Human-readable lines "field: old -> new" for every field that counts (``counted``: those with an effect, the
    running method's options only) and differs, but for the fields whose mark lets them change freely on resume
    (bookkeeping). A field that ``old`` lacks and ``new`` holds at its default was added later (e.g.
    method.vcycle.width_split); defaults keep the earlier behaviour, so it cannot have changed the run either."""
    a, b = flatten(counted(old)), flatten(counted(new))
    defaults = flatten(to_dict(RunConfig()))
    lines = []
    for k in sorted(a.keys() | b.keys()):
        if mark(k).resume == "free":
            continue
        if k not in a and k in defaults and b[k] == defaults[k]:
            continue
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            lines.append(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
    return lines


def resume_diff(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed) "field: old -> new" lines between a saved run's config and the resuming one;
    allowed lines are the fields whose mark says "warned" on resume (printed as warnings by the trainer)."""
    lines = diff(saved, now)
    allowed = [ln for ln in lines if mark(ln.split(":", 1)[0]).resume == "warned"]
    return [ln for ln in lines if ln not in allowed], allowed


def replace(cfg: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for callers that build variants (compare runs)."""
    return dataclasses.replace(cfg, **changes)


# ------------------------------------------------------------------------------------ validation


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate(cfg: RunConfig) -> None:
    """Checks that need no model or data (choices, ranges): each section checks its own fields (``validate(where)``,
    choices from its Literal types), the method options' sections included; then what spans sections. The
    method checks its plan (factors that divide, a schedule that fits the budget) in ``Method.plan``.

    Raises:
        ConfigError: the first problem, starting with the dotted field name.
    """
    n = cfg.name
    _check(bool(n) and n not in (".", "..") and not any(c in n for c in "/\\\0") and n == n.strip(),
           f"name: a run name is one folder name (no '/', not '.' or '..', no surrounding spaces), got {n!r}")
    _check(len(n.encode()) <= 255, f"name: at most 255 bytes (a folder name), got {len(n.encode())}")
    cfg.model.validate("model")
    cfg.data.validate("data")
    cfg.train.validate("train")
    _check(not (cfg.train.fsdp and cfg.parallel.pipeline != "none"),
           f"train.fsdp: parallel.pipeline {cfg.parallel.pipeline!r} runs its own distributed engine and cannot be "
           "combined with FSDP2; use DDP (train.fsdp: false) for pipeline runs")
    cfg.parallel.validate("parallel")
    for name, options in cfg.method.options.items():  # a method's options check themselves
        if hasattr(options, "validate"):
            options.validate(f"method.{name}")
    _check_numbers(cfg)
    tree = flatten(to_dict(cfg))
    for key in PATHS:  # an empty path is the working folder (a script's empty variable): data.dataset "" read
        _check(tree[key] is None or bool(str(tree[key]).strip()),  # every .jsonl under it, its runs' metrics too
               f"{key}: empty; give a path or name ('.' names the working folder)")


def _check_numbers(cfg: RunConfig) -> None:
    """Every number anywhere in the config (method sections included) is finite and not negative: no field
    here is a signed quantity, so a negative value is always a typo that would otherwise train (a negative
    token cap is "no cap" to a slice). Sizes and counts that may be unset are >= 1 when set; seeds fit the
    generators (NumPy takes 0 .. 2**32 - 1)."""
    flat = flatten(to_dict(cfg))
    for key, v in flat.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        _check(math.isfinite(v), f"{key}: must be a finite number, got {v}")
        _check(v >= 0, f"{key}: must be >= 0, got {v}")
