"""Typed run configuration: dataclasses, YAML recipes, ``--key value`` overrides, validation, diffs.

A run is one ``RunConfig``: ``model`` (family and full-size shape), ``data`` (progressive.data.DataConfig),
``train`` (budget, optimizer, precision, logging), ``method`` (which method and its settings) and
``parallel`` (pipeline parallelism: progressive/pipeline/, when not "none").
Recipes live in configs/*.yaml; every key is checked against the dataclasses, so a typo is an error that
names the field instead of a silently ignored setting. Command-line overrides use dotted paths, list
items by index: ``--train.lr 1e-3 --method.vcycle.levels.1.down.fraction 0.4``. This module is the schema;
the conversion between dataclasses and nested dicts is progressive.config.tree (re-exported here).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import yaml

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
from progressive.data.config import DataConfig

__all__ = ["ConfigError", "RunConfig", "ModelConfig", "MethodConfig", "TrainConfig", "ParallelConfig",
           "METHOD_OPTIONS", "register_method_options", "load_config", "dump_yaml", "diff", "resume_diff",
           "validate", "check_schedule", "replace", "from_dict", "to_dict", "set_dotted", "flatten"]

TASKS = ("pretrain", "classify")
DECAYS = ("linear", "cosine", "constant")
PRECISIONS = ("no", "bf16", "fp16")
REDUCE_DTYPES = ("fp32", "bf16")  # train.fsdp_reduce_dtype
OPTIMIZER_IMPLS = ("auto", "fused", "foreach", "plain")
TRACKERS = ("none", "wandb", "tensorboard", "trackio")
PIPELINES = ("none", "fixed", "elastic")
SCHEDULES = ("gpipe", "1f1b")
BALANCES = ("time", "params", "uniform")
COMPILES = (True, False, "auto")
LOSSES = ("auto", "chunked", "model")
# Fields that may differ when resuming: they change how a run is watched, not what it computes.
RESUME_MAY_CHANGE = frozenset({"train.report_to", "train.progress", "train.plots", "train.project",
                               "train.stop_timeout", "train.group", "train.log_checkpoint",
                               "train.with_baseline", "train.baseline_lr"})  # what a comparison adds, not one run
# Fields that may differ when resuming, with a printed warning: they change what is computed from now on
# but cannot corrupt the state that was saved (the data order, the plan and the shapes stay the same).
# train.lr rescales every phase's peak LR from the resumed step on (the remedy after a NaN stop).
RESUME_MAY_CHANGE_WITH_WARNING = frozenset({
    "train.lr", "train.max_grad_norm", "train.eval_every", "train.eval_batches", "train.log_every",
    "train.checkpoint_every", "train.keep_checkpoints", "train.threads", "train.mixed_precision",
    "train.compile", "train.loss",  # which kernels compute the same functions: the numbers move by rounding only
    "train.fsdp_reduce_dtype",  # the rounding of the gradients' sum, not the state
    "data.num_proc",  # how many processes tokenize, not what they produce
    # how the pipeline splits and orders work, not what it computes (losses move by fp32 rounding only)
    "parallel.microbatches", "parallel.schedule", "parallel.balance", "parallel.profile_steps",
    # where things lie, not what they hold: a run folder moved or renamed, a cache or a local dataset
    # moved; the data's identity is its content, which the resume checks itself (the data fingerprint)
    "name", "output_dir", "data.cache_dir", "data.dataset", "data.tokenizer",
})


@dataclass
class ModelConfig:
    """The full-size model (level 0 of a V-cycle, the last stage of Apollo). ``task``: "pretrain" trains the
    family's own objective (causal LM, masked LM, image classification); "classify" fine-tunes a text family
    for sequence classification (data.dataset "glue:<task>" or a Hugging Face dataset). ``init_from``: start
    from a checkpoint's weights; its config.json then defines the shape (the size fields here are ignored).
    ``None`` sizes are derived: intermediate_size =
    4 * hidden (Llama: 8/3 * hidden rounded to 32), vocab_size = the tokenizer's, max_position =
    data.seq_len, num_kv_heads = num_heads. Vision models use data.image_size and ``patch_size``."""

    family: str = "gpt2"  # one of progressive.model.build.FAMILIES (checked there, by get_family)
    task: str = "pretrain"  # "pretrain" (the family's objective) | "classify" (text classification)
    init_from: str | None = None  # a Hugging Face checkpoint folder (or Hub id) to start from
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    max_position: int | None = None
    dropout: float = 0.0
    tie_word_embeddings: bool = True
    patch_size: int = 4


METHOD_OPTIONS: dict[str, type] = {}  # method name -> its options dataclass (filled by register_method)


def register_method_options(name: str, options: type) -> None:
    """Make ``method.<name>:`` a recipe section parsed into the dataclass ``options`` (progressive.methods
    calls this when a method with options registers; this module knows no method by name)."""
    if not is_dataclass(options):
        raise TypeError(f"options of method {name!r} must be a dataclass, got {options!r}")
    METHOD_OPTIONS[name] = options


@dataclass
class MethodConfig:
    """Which method runs (``name``) and, per registered method, its options: ``method.<name>: {...}`` in
    YAML, ``cfg.method.<name>`` in code. Every registered method's section is present (defaults if not
    given), so recipes, dumps and resume diffs see one shape."""

    name: str = "baseline"
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
    ``min_lr_ratio`` are the baseline's schedule."""

    steps: int = 200
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 1e-3
    warmup: float = 0.05
    decay: str = "cosine"
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    optimizer: str = "auto"
    mixed_precision: str | None = None  # None: the launcher's (accelerate launch), else bf16 on a GPU, fp32 on CPU
    # torch.compile (inductor): true, false or "auto" (on where a GPU trains; progressive/run/compiled.py)
    compile: bool | str = "auto"
    # the LM loss: "chunked" (the head and cross-entropy a chunk of rows at a time, no whole logits:
    # progressive/model/loss.py), "model" (transformers'), "auto" (chunked where a micro-batch's fp32 logits would
    # exceed 1 GiB, i.e. where chunking splits them)
    loss: str = "auto"
    cpu: bool = False
    fsdp: bool = False  # FSDP2 (fully_shard per block, sharded checkpoints); on by itself under an FSDP2 launcher
    fsdp_reduce_dtype: str = "fp32"  # FSDP2: the dtype gradients are reduced (summed over processes) in, whatever
    # the parameters' (the launcher's bf16 included); "bf16" halves the traffic and rounds the sum
    seed: int = 0
    threads: int | None = None
    keep_host_memory: bool = True  # glibc keeps freed host memory: no mmap/munmap of large tensors every CPU step
    # (common.device.keep_freed_host_memory); the same numbers, the resident set stays at its peak
    eval_every: int = 50
    eval_batches: int = 4
    log_every: int = 1
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    report_to: str = "none"
    project: str = "growtrain"
    group: str | None = None  # W&B group; None: the run's name (a --compare groups its runs under its own name)
    log_checkpoint: bool = False  # W&B: upload final/ as a model artifact at the end
    with_baseline: bool = False  # first train the baseline of the same size on the same data, budget and seed, then
    # the method, and print the method's saving against it (what --compare baseline,<method> does)
    baseline_lr: float | None = None  # the baseline's own learning rate in a comparison (its tuned one); None: train.lr
    progress: bool = True
    plots: bool = True  # draw the loss plots at the end (and --compare's compare.png); off: a sweep's many runs
    peak_tflops: float | None = None  # the device's peak bf16 TFLOP/s for MFU; None: a known GPU's data sheet figure
    stop_timeout: float = 20.0  # after SIGINT/SIGTERM: seconds to reach a step boundary and checkpoint (0: no bound)


@dataclass
class ParallelConfig:
    """``parallel:`` pipeline parallelism (progressive/pipeline/, PipeTransformer's AutoPipe + AutoDP).
    ``pipeline``: "none" (one model per process, DDP: the trainer), "fixed" (K stages for the whole run),
    "elastic" (K halves while AutoFreeze freezes a prefix, and the freed processes become data-parallel
    replicas). ``stages``: K (at the start, for elastic; a power of two there), with world size = K x dp.
    ``microbatches``: per pipeline and step, "auto" (a short profile over K, 2K, 4K, ...) or a number (capped
    by the local batch). ``schedule``: gpipe | 1f1b. ``balance``: what the partition balances: "time"
    (measured per-layer forward+backward), "params" (parameter counts, the authors' proxy) or "uniform"
    (layer counts; deterministic, for tests). ``profile_steps``: repeats of each measurement."""

    pipeline: str = "none"
    stages: int = 2
    microbatches: int | str = "auto"
    schedule: str = "gpipe"
    balance: str = "time"
    profile_steps: int = 3


@dataclass
class RunConfig:
    """Everything a run needs. Outputs go to ``output_dir/name``."""

    name: str = "run"
    output_dir: str = "outputs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    @property
    def run_dir(self) -> Path:
        """outputs/<name>."""
        return Path(self.output_dir) / self.name


PATHS = ("model.init_from", "data.dataset", "data.tokenizer", "data.cache_dir")  # and output_dir, at the top


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
    if isinstance(tree.get("output_dir"), str) and tree["output_dir"].startswith("~"):
        tree["output_dir"] = os.path.expanduser(tree["output_dir"])
    for key in PATHS:  # "~/runs" is the home folder's runs, as in a shell (not a folder named "~")
        section, field_ = key.split(".")
        value = tree[section].get(field_)
        if isinstance(value, str) and value.startswith("~"):
            tree[section][field_] = os.path.expanduser(value)
    return from_dict(RunConfig, tree)


def dump_yaml(cfg: RunConfig) -> str:
    """The config as YAML text (what a run saves next to its outputs)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def diff(old: dict, new: dict, ignore: frozenset[str] = RESUME_MAY_CHANGE) -> list[str]:
    """Human-readable lines "field: old -> new" for every flattened field that differs. A method's options
    section that only one side has is skipped when that method runs in neither config: a method added to
    the codebase after ``old`` was saved cannot have changed that run. Likewise a field that ``old`` lacks
    and ``new`` holds at its default was added later (e.g. method.vcycle.width_split); defaults keep the
    earlier behaviour, so it cannot have changed the run either."""
    a, b = flatten(old), flatten(new)
    defaults = flatten(to_dict(RunConfig()))
    running = {"name", (old.get("method") or {}).get("name"), (new.get("method") or {}).get("name")}
    lines = []
    for k in sorted(a.keys() | b.keys()):
        if k in ignore or (k.startswith("method.") and k.split(".")[1] not in running and (k in a) != (k in b)):
            continue
        if k not in a and k in defaults and b[k] == defaults[k]:
            continue
        if a.get(k, "<absent>") != b.get(k, "<absent>"):
            lines.append(f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}")
    return lines


def resume_diff(saved: dict, now: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed) "field: old -> new" lines between a saved run's config and the resuming one;
    allowed lines are the RESUME_MAY_CHANGE_WITH_WARNING fields (printed as warnings by the trainer)."""
    lines = diff(saved, now)
    allowed = [ln for ln in lines if ln.split(":", 1)[0] in RESUME_MAY_CHANGE_WITH_WARNING]
    return [ln for ln in lines if ln not in allowed], allowed


def replace(cfg: Any, **changes: Any) -> Any:
    """dataclasses.replace, re-exported for callers that build variants (compare runs)."""
    return dataclasses.replace(cfg, **changes)


# ------------------------------------------------------------------------------------ validation


LARGEST = {"model.hidden_size": 65_536, "model.num_layers": 1_024, "model.num_heads": 1_024, "data.seq_len": 1 << 20,
           "train.threads": 1_024, "data.num_proc": 1_024}


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def check_schedule(warmup: float, decay: str, min_lr_ratio: float, where: str) -> None:
    """Raise ConfigError unless (warmup, decay, min_lr_ratio) describe an LR schedule (progressive.methods.base)."""
    _check(0 <= warmup <= 1, f"{where}.warmup: a fraction of the phase in [0, 1], got {warmup}")
    _check(decay in DECAYS, f"{where}.decay: must be one of {', '.join(DECAYS)}, got {decay!r}")
    _check(0 <= min_lr_ratio <= 1, f"{where}.min_lr_ratio: must be in [0, 1], got {min_lr_ratio}")


def validate(cfg: RunConfig) -> None:
    """Checks that need no model or data (choices, ranges); each method's options dataclass checks its own
    fields (``validate(where)``), and the method checks its plan (factors that divide, a schedule that fits
    the budget) in ``Method.plan``.

    Raises:
        ConfigError: the first problem, starting with the dotted field name.
    """
    m, t, d = cfg.model, cfg.train, cfg.data
    n = cfg.name
    _check(bool(n) and n not in (".", "..") and not any(c in n for c in "/\\\0") and n == n.strip(),
           f"name: a run name is one folder name (no '/', not '.' or '..', no surrounding spaces), got {n!r}")
    _check(len(n.encode()) <= 255, f"name: at most 255 bytes (a folder name), got {len(n.encode())}")
    _check(m.task in TASKS, f"model.task: one of {', '.join(TASKS)}, got {m.task!r}")
    _check(m.init_from is None or bool(str(m.init_from).strip()), "model.init_from: a checkpoint folder or Hub id")
    for k in ("hidden_size", "num_layers", "num_heads", "patch_size"):
        _check(getattr(m, k) >= 1, f"model.{k}: must be >= 1, got {getattr(m, k)}")
    _check(m.hidden_size % m.num_heads == 0,
           f"model.hidden_size: {m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    kv = m.num_kv_heads or m.num_heads
    _check(m.num_heads % kv == 0, f"model.num_kv_heads: {kv} does not divide model.num_heads={m.num_heads}")
    _check(0 <= m.dropout < 1, f"model.dropout: must be in [0, 1), got {m.dropout}")
    for k, most in LARGEST.items():  # past these a typo allocates petabytes before anything says so
        section, field_ = k.split(".")
        v = getattr(getattr(cfg, section), field_)
        _check(v is None or v <= most, f"{k}: at most {most:,}, got {v if v is None else format(v, ',')}")
    _check(d.seq_len >= 2, f"data.seq_len: must be >= 2, got {d.seq_len}")
    _check(0 < d.val_fraction < 1, f"data.val_fraction: must be in (0, 1): validation losses need held-out "
                                   f"data, got {d.val_fraction}")
    _check(0 <= d.test_fraction < 1 and d.val_fraction + d.test_fraction < 1,
           f"data.test_fraction: in [0, 1) with val_fraction + test_fraction < 1, got {d.test_fraction}")
    _check(d.num_proc >= 1, f"data.num_proc: processes that tokenize, >= 1, got {d.num_proc}")
    _check(t.steps >= 1, f"train.steps: must be >= 1, got {t.steps}")
    _check(t.batch_size >= 1 and t.grad_accum >= 1, "train.batch_size / train.grad_accum: must be >= 1")
    _check(t.batch_size % t.grad_accum == 0,
           f"train.batch_size: {t.batch_size} is not divisible by train.grad_accum={t.grad_accum}")
    _check(t.lr > 0, f"train.lr: must be > 0, got {t.lr}")
    _check(t.baseline_lr is None or t.baseline_lr > 0, f"train.baseline_lr: must be > 0 (or unset), got {t.baseline_lr}")
    check_schedule(t.warmup, t.decay, t.min_lr_ratio, "train")
    _check(t.max_grad_norm >= 0, f"train.max_grad_norm: must be >= 0 (0 = no clipping), got {t.max_grad_norm}")
    _check(t.optimizer in OPTIMIZER_IMPLS, f"train.optimizer: one of {', '.join(OPTIMIZER_IMPLS)}, got {t.optimizer!r}")
    _check(t.mixed_precision is None or t.mixed_precision in PRECISIONS,
           f"train.mixed_precision: one of {', '.join(PRECISIONS)} (or unset: the launcher's), got "
           f"{t.mixed_precision!r}")
    _check(t.report_to in TRACKERS, f"train.report_to: one of {', '.join(TRACKERS)}, got {t.report_to!r}")
    for k in ("eval_every", "eval_batches", "log_every", "checkpoint_every", "keep_checkpoints"):
        _check(getattr(t, k) >= 1, f"train.{k}: must be >= 1, got {getattr(t, k)}")
    _check(t.stop_timeout >= 0, f"train.stop_timeout: seconds >= 0 (0 = wait for the step boundary however long), "
                                f"got {t.stop_timeout}")
    _check(t.fsdp_reduce_dtype in REDUCE_DTYPES,
           f"train.fsdp_reduce_dtype: one of {', '.join(REDUCE_DTYPES)}, got {t.fsdp_reduce_dtype!r}")
    p = cfg.parallel
    _check(not (t.fsdp and p.pipeline != "none"),
           f"train.fsdp: parallel.pipeline {p.pipeline!r} runs its own distributed engine and cannot be combined "
           "with FSDP2; use DDP (train.fsdp: false) for pipeline runs")
    _check(t.compile in COMPILES, f"train.compile: true, false or auto, got {t.compile!r}")
    _check(t.loss in LOSSES, f"train.loss: one of {', '.join(LOSSES)}, got {t.loss!r}")
    _check(p.pipeline in PIPELINES, f"parallel.pipeline: one of {', '.join(PIPELINES)}, got {p.pipeline!r}")
    _check(p.stages >= 1, f"parallel.stages: must be >= 1, got {p.stages}")
    _check(p.microbatches == "auto" or (isinstance(p.microbatches, int) and p.microbatches >= 1),
           f"parallel.microbatches: 'auto' or a number >= 1, got {p.microbatches!r}")
    _check(p.schedule in SCHEDULES, f"parallel.schedule: one of {', '.join(SCHEDULES)}, got {p.schedule!r}")
    _check(p.balance in BALANCES, f"parallel.balance: one of {', '.join(BALANCES)}, got {p.balance!r}")
    _check(p.profile_steps >= 1, f"parallel.profile_steps: must be >= 1, got {p.profile_steps}")
    for name, options in cfg.method.options.items():  # a method's options check themselves
        if hasattr(options, "validate"):
            options.validate(f"method.{name}")
    _check_numbers(cfg)


# Sizes and counts that may be left unset (None: derived or unlimited) but are >= 1 when set.
POSITIVE_OR_UNSET = ("model.num_kv_heads", "model.intermediate_size", "model.vocab_size", "model.max_position",
                     "data.vocab_size", "data.max_tokens", "data.image_size", "data.max_images", "train.threads")
SEEDS = ("data.seed", "train.seed")


def _check_numbers(cfg: RunConfig) -> None:
    """Every number anywhere in the config (method sections included) is finite and not negative: no field
    here is a signed quantity, so a negative value is always a typo that would otherwise train (a negative
    token cap is "no cap" to a slice). Sizes and counts that may be unset are >= 1 when set; seeds fit the
    generators (NumPy takes 0 .. 2**32 - 1)."""
    import math

    flat = flatten(to_dict(cfg))
    for key in POSITIVE_OR_UNSET:
        v = flat.get(key)
        _check(v is None or (isinstance(v, int) and v >= 1), f"{key}: must be >= 1 (or unset), got {v}")
    for key in SEEDS:
        _check(0 <= flat[key] < 2**32, f"{key}: a seed in 0 .. 2**32 - 1, got {flat[key]}")
    for key, v in flat.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        _check(math.isfinite(v), f"{key}: must be a finite number, got {v}")
        _check(v >= 0, f"{key}: must be >= 0, got {v}")
