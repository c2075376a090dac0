"""What a pipelined run refuses, before any data loads or process starts to wait on another (errors name the
field). ``check_config`` needs only the config; ``check_world`` the number of processes the launcher gave."""

from __future__ import annotations

from typing import Any

from operators import family_of, head_is_tied
from progressive.config import ConfigError, RunConfig

METHODS = ("baseline", "autofreeze")


def check_config(cfg: RunConfig, family: Any, base_config: Any) -> None:
    """Raise ConfigError for a pipelined run that cannot work, whatever the world size.

    Args:
        cfg: the run's config (``cfg.parallel.pipeline`` is not "none").
        family: its progressive.model.build.Family.
        base_config: the full model's HF config (sizes, tying).
    """

    p, t = cfg.parallel, cfg.train
    if cfg.method.name not in METHODS:
        raise ConfigError(f"method.name: {cfg.method.name!r} changes the model's shape; a pipeline (parallel.pipeline "
                          f"{p.pipeline}) runs {' or '.join(METHODS)}. Use parallel.pipeline none for it")
    if p.pipeline == "elastic" and cfg.method.name != "autofreeze":
        raise ConfigError("parallel.pipeline: elastic shortens the pipeline as AutoFreeze freezes layers; with method "
                          f"{cfg.method.name!r} nothing freezes: use parallel.pipeline fixed, or method autofreeze")
    if p.pipeline == "elastic" and p.stages & (p.stages - 1):
        raise ConfigError(f"parallel.stages: an elastic pipeline halves K (8 -> 4 -> 2 -> 1): "
                          f"K must be a power of two, got {p.stages}")
    layers = family_of(base_config).sizes(base_config)["layers"]
    if p.stages > layers:
        raise ConfigError(f"parallel.stages: {p.stages} stages > the model's {layers} layers "
                          "(a stage holds one at least)")
    if t.grad_accum != 1:
        raise ConfigError("train.grad_accum: the pipeline splits each batch into parallel.microbatches itself; "
                          "set train.grad_accum 1")
    if t.compile is True:
        raise ConfigError("train.compile: the pipeline engine runs its stages uncompiled (a stage is rebuilt at every "
                          "change); set train.compile false (or auto) with parallel.pipeline")
    if t.mixed_precision == "fp16":
        raise ConfigError("train.mixed_precision: fp16 needs a gradient scaler across stages, which the pipeline does "
                          "not have; use bf16 or no")
    if head_is_tied(family.build_model(base_config, meta=True)):
        raise ConfigError("model.tie_word_embeddings: the input embedding (first stage) would be the output head (last "
                          "stage); a pipeline needs them untied: set model.tie_word_embeddings false")


def check_world(cfg: RunConfig, world: int) -> None:
    """Raise ConfigError when ``world`` processes cannot run the config's pipeline.

    Every layout has dp = world / K replicas of the global batch split into micro-batches: the batch must
    divide by every dp the run can reach (world / K_0 up to world for an elastic run), and a fixed number of
    micro-batches (capped by the local batch) must divide each local batch.
    """
    p, b = cfg.parallel, cfg.train.batch_size
    if world % p.stages:
        raise ConfigError(f"parallel.stages: {p.stages} stages do not divide the {world} processes (world = K x dp); "
                          f"launch a multiple of {p.stages} processes, e.g. torchrun --nproc_per_node {p.stages} "
                          "(accelerate 1.15 starts one process for --cpu --num_processes N)")
    reachable = [world // p.stages]
    while p.pipeline == "elastic" and reachable[-1] < world:
        reachable.append(reachable[-1] * 2)
    for dp in reachable:
        if b % dp:
            raise ConfigError(f"train.batch_size: {b} does not split over {dp} data-parallel replicas (world {world} "
                              f"/ K {world // dp}); use a multiple of {reachable[-1]}")
        m = p.microbatches
        if isinstance(m, int) and (b // dp) % min(m, b // dp):
            raise ConfigError(f"parallel.microbatches: {m} micro-batches do not split the local batch {b // dp} "
                              f"(batch {b} / dp {dp}); use a divisor of it, or auto")
