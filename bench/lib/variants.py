"""The one table of run variants: every named configuration a bench trains, as overrides of its recipe.

``overrides(name, layers)`` gives a variant's method overrides for a target model of ``layers`` layers (the
model, LR and budget are set apart by the bench that runs it). Two groups share the table:

- **the frontier's** (``FRONTIER``; ``python -m bench.frontier``, and the papers' pages that reuse its runs):
  the V-cycle (the recipe's own and the paper's), Apollo with each optimizer rule, StackBERT- and
  G_stack-style stacking, and a V-cycle whose depth de-coalescing is G_stack's stacking; the growth
  schedules scale with the target's depth; and the recipe's V-cycle at coarse-level LR scales 2 and 1 (its own
  is 4), for the frontier's tuning checks (``COARSE_LR``);
- **the V-cycle's recipe search** (``SWEEP``; ``python -m bench.claims.vcycle_recipes``): one knob of the
  paper's GPT recipe changed at a time, then the knobs that helped combined (the last is
  configs/default.yaml), and depth growth on the same 4-layer model.

The paper's GPT recipe is not written here: ``paper_vcycle()`` reads it from ``VCycleConfig``'s defaults
(progressive/methods/vcycle/options.py), and names each knob in full, so that changing configs/default.yaml changes
no variant. The fine-tuning benches' pre-trained models (``AUTOFREEZE_PRETRAIN``) live here too, since two
benches start from them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from progressive.config import registry as method_folders
from progressive.methods.vcycle import options as vcycle_options

VC = "method.vcycle"
Overrides = dict[str, Any]


def paper_vcycle() -> Overrides:
    """The paper's GPT recipe as overrides (alpha, E_a, the coarse level's share and LR scale, depth mode and
    optimizer rule), read from ``VCycleConfig``'s defaults, the one place it is written."""
    paper = vcycle_options.VCycleConfig()
    fine, coarse = paper.levels[0], paper.levels[1]
    return {"method.name": "vcycle", f"{VC}.depth_mode": paper.depth_mode,
            f"{VC}.optimizer_state": paper.optimizer_state, f"{VC}.levels.0.alpha": fine.alpha,
            f"{VC}.levels.0.down.fraction": fine.down.fraction, f"{VC}.levels.1.down.fraction": coarse.down.fraction,
            f"{VC}.levels.1.down.lr_scale": coarse.down.lr_scale}


def _fixed(over: Overrides) -> Callable[[int], Overrides]:
    return lambda layers: dict(over)


def _paper_with(knobs: Overrides) -> Callable[[int], Overrides]:
    """The paper's recipe with ``knobs`` (keys under method.vcycle) changed."""
    return lambda layers: {**paper_vcycle(), **{f"{VC}.{k}": v for k, v in knobs.items()}}


def _paper_k3(layers: int) -> Overrides:
    """Three levels: the paper's knobs without its two-level list, and levels of width 2 then depth 2."""
    return {**{k: v for k, v in paper_vcycle().items() if ".levels." not in k}, f"{VC}.levels": [
        {"alpha": 0.25, "down": {"fraction": 0.05, "warmup": 1.0}, "up": {"warmup": 0.0, "decay": "linear"}},
        {"width": 2, "depth": 1, "alpha": 0.25, "down": {"fraction": 0.05, "lr_scale": 2.0},
         "up": {"fraction": 0.15, "lr_scale": 2.0}},
        {"width": 2, "depth": 2, "down": {"fraction": 0.5, "lr_scale": 4.0}}]}


def _apollo(rule: str) -> Callable[[int], Overrides]:
    """Apollo's recipe in proportion: 1 -> L/2 -> L distinct layers after 10% and 25% of the FLOPs, LVPS,
    the interpolation map, one global LR schedule, the optimizer state carried by ``rule``."""
    def over(layers: int) -> Overrides:
        stages = sorted({1, max(1, layers // 2), layers})
        return {"method.name": "apollo", "method.apollo": {
            "layers": stages, "boundaries": [0.10, 0.25][-(len(stages) - 1):] if len(stages) > 1 else [],
            "sampler": "lvps", "map": "interpolation", "schedule": "global", "optimizer_state": rule}}
    return over


def _stackbert(layers: int) -> Overrides:
    """StackBERT-style: L/2 layers stacked into L at 30%, no sampling, moments mapped."""
    return {"method.name": "apollo", "method.apollo": {"layers": [max(1, layers // 2), layers], "boundaries": [0.30],
                                                       "sampler": "none", "map": "stack",
                                                       "optimizer_state": "mapped", "schedule": "global"}}


def _gstack(layers: int) -> Overrides:
    """G_stack-style: L/4 layers stacked into L at 10%, a fresh optimizer and LR schedule per stage."""
    return {"method.name": "apollo", "method.apollo": {"layers": [max(1, layers // 4), layers], "boundaries": [0.10],
                                                       "sampler": "none", "map": "stack",
                                                       "optimizer_state": "reset", "schedule": "per_stage"}}


def _gstack2(layers: int) -> Overrides:
    """G_stack-style with 2x growth: L/2 layers stacked into L at 10%, a fresh optimizer and LR schedule per
    stage."""
    return {**_gstack(layers), "method.apollo": {**_gstack(layers)["method.apollo"], "layers": [max(1, layers // 2),
                                                                                            layers]}}


def _width_grow(layers: int) -> Overrides:
    """Width growth into the target (L x W) from L x W/2, exact (issue: grow into the compute-optimal shape, whose
    depth is 2 at this grid's budgets, so depth growth cannot end there): the V-cycle's operators with a coarse
    level of half the width and the same depth trained for the first 30% of the budget's steps, de-coalesced at
    alpha 1 (the grown model computes what the small one did) with LEMON's symmetry-breaking split (the paper's
    symmetric split at alpha 1 would leave the copied neurons identical for ever), the moments mapped; one warmup
    at the start (the full model's single step is only what coalescing starts from) and a cosine decay after the
    growth, as the baseline's schedule ends."""
    return {"method.name": "vcycle", f"{VC}.width_split": "asymmetric", f"{VC}.optimizer_state": "mapped",
            f"{VC}.levels": [
                {"alpha": 1.0, "down": {"steps": 1}, "up": {"warmup": 0.0, "decay": "cosine", "min_lr_ratio": 0.1}},
                {"width": 2, "depth": 1, "down": {"fraction": 0.3, "warmup": 0.15, "decay": "constant"}}]}


def _late_expansion(first: Callable[[int], int]) -> Callable[[int], Overrides]:
    """Late expansion (Bu, ICML 2026, arXiv 2511.04981): ``first(L)`` layers stacked into L at 80% of the budget, no
    sampling, moments mapped, one LR schedule under WSD (its cooldown at the end of the whole run, after the
    growth). The variant sets train.decay itself, so its name means WSD; its baselines need a WSD grid (``WSD``)."""
    def over(layers: int) -> Overrides:
        stages = sorted({first(layers), layers})
        return {"method.name": "apollo", "train.decay": "wsd", "method.apollo": {
            "layers": stages, "boundaries": [0.8] if len(stages) > 1 else [], "sampler": "none", "map": "stack",
            "optimizer_state": "mapped", "schedule": "global"}}
    return over


# a grid's overrides (bench.lib.grid.Grid.overrides) that put its baselines and every method reading train's schedule
# on WSD (Hägele et al. 2024), so that a method on WSD is compared with baselines on WSD; the V-cycle reads train's
# schedule only with method.vcycle.schedule: global (the *_global variants below)
WSD: Overrides = {"train.decay": "wsd", "train.cooldown": 0.2}
WSD_SQRT: Overrides = {"train.decay": "wsd_sqrt", "train.cooldown": 0.2}


VARIANTS: dict[str, Callable[[int], Overrides]] = {
    # the frontier's
    "vcycle": _fixed({"method.name": "vcycle"}),  # the recipe's own V-cycle (configs/default.yaml)
    "vcycle_paper": _paper_with({}),
    "apollo_authors": _apollo("authors"),
    "apollo_first_copy": _apollo("first_copy"),
    "apollo_mapped": _apollo("mapped"),
    "stackbert": _stackbert,
    "gstack": _gstack,
    "vcycle_gstack": _fixed({"method.name": "vcycle", f"{VC}.levels.1.depth_pairing": "stride"}),
    # the recipe's V-cycle with its coarse level at 2x and 1x the target's LR (its own is 4x)
    "vcycle_coarse2x": _fixed({"method.name": "vcycle", f"{VC}.levels.1.down.lr_scale": 2.0}),
    "vcycle_coarse1x": _fixed({"method.name": "vcycle", f"{VC}.levels.1.down.lr_scale": 1.0}),
    # the combination at coarse scale 1, run at every cell with the recipe at 1x (the coarse-LR finding, docs/vcycle.md)
    "vcycle_gstack_coarse1x": _fixed({"method.name": "vcycle", f"{VC}.levels.1.depth_pairing": "stride",
                                      f"{VC}.levels.1.down.lr_scale": 1.0}),
    # the layer-dominated grid's: the paper's V-cycle at coarse LR scales 1, 2 and 4 (the paper's), G_stack with 2x
    # growth, and the combination in the paper's proportions
    "vcycle_coarse_lr1x": _paper_with({"levels.1.down.lr_scale": 1.0}),
    "gstack2": _gstack2,
    "vcycle_paper_gstack": _paper_with({"levels.1.depth_pairing": "stride"}),
    # growing into the envelope's shape (2 layers at this grid's budgets): width growth from half the width, and the
    # paper's V-cycle with a width-only coarse level (its depth factor 1)
    "width_grow": _width_grow,
    # its split's noise at 1.0 of the tensor's std, not 0.1: at 0.1 the copied neurons stay near-identical and the
    # grown model learned slowly (2.8164 test at 3.6e13 on seed 0, against 2x128's own 2.6884); a one-seed
    # diagnostic at 9.7e12 (1,500 2x128 steps of FLOPs) gave validation 3.0305 at 1.0 against 3.1586 at 0.1 and the
    # baseline's 3.0092
    "width_grow_noise1": lambda layers: {**_width_grow(layers), f"{VC}.split_noise": 1.0},
    "vcycle_paper_width": _paper_with({"levels.1.depth": 1}),
    # the recipe search's (vcycle_paper above is its first)
    "vcycle_identity_a1": _paper_with({"depth_mode": "identity", "levels.0.alpha": 1.0}),
    "vcycle_reset": _paper_with({"optimizer_state": "reset"}),
    "vcycle_alpha0.5": _paper_with({"levels.0.alpha": 0.5}),
    "vcycle_asym_identity_a1": _paper_with({"depth_mode": "identity", "levels.0.alpha": 1.0,
                                            "width_split": "asymmetric"}),
    "vcycle_asym_a0.5": _paper_with({"levels.0.alpha": 0.5, "width_split": "asymmetric"}),
    "vcycle_Ea0.1": _paper_with({"levels.0.down.fraction": 0.1}),
    "vcycle_coarse0.3": _paper_with({"levels.1.down.fraction": 0.3}),
    "vcycle_coarse0.8": _paper_with({"levels.1.down.fraction": 0.8}),
    "vcycle_coarse_lr2x": _paper_with({"levels.1.down.lr_scale": 2.0}),
    "vcycle_K3": _paper_k3,
    "vcycle_a0.5_Ea0.1": _paper_with({"levels.0.alpha": 0.5, "levels.0.down.fraction": 0.1}),
    "vcycle_a0.5_Ea0.1_coarse0.8": _paper_with({"levels.0.alpha": 0.5, "levels.0.down.fraction": 0.1,
                                                "levels.1.down.fraction": 0.8}),
    "vcycle_a0.5_Ea0.1_coarse1.0": _paper_with({"levels.0.alpha": 0.5, "levels.0.down.fraction": 0.1,
                                                "levels.1.down.fraction": 1.0}),
    # depth growth on the 4-layer default model: Apollo in proportion (1 -> 2 -> 4 layers after 10% and 25%)
    # and StackBERT-style stacking (2 -> 4 at 30%), with the method's other options at their defaults
    "apollo": _fixed({"method.name": "apollo", "method.apollo": {"layers": [1, 2, 4], "boundaries": [0.10, 0.25]}}),
    "stack": _fixed({"method.name": "apollo", "method.apollo": {"layers": [2, 4], "boundaries": [0.30],
                                                                "sampler": "none", "map": "stack"}}),
    # the newest recipe (issue 67 item 3): late expansion under WSD from L/2 and from 1 layer, and the paper's
    # V-cycle on one schedule over its phases (train's: under a WSD grid, one cooldown at the end of the run)
    "late_expansion": _late_expansion(lambda layers: max(1, layers // 2)),
    "late_expansion_1": _late_expansion(lambda layers: 1),
    "vcycle_paper_global": _paper_with({"schedule": "global"}),
    # every method folder's own (progressive/config/registry.py)
    **method_folders.variants(),
}
FRONTIER = ("vcycle", "vcycle_paper", "apollo_authors", "apollo_first_copy", "apollo_mapped", "stackbert", "gstack",
            "vcycle_gstack")
COARSE_LR = ("vcycle", "vcycle_coarse2x", "vcycle_coarse1x")  # the frontier's coarse-LR check (bench.lib.grid.Check)
LAYER_VARIANTS = ("vcycle_paper", "vcycle_coarse_lr2x", "vcycle_coarse_lr1x", "stackbert", "gstack2", "apollo_authors",
                  "vcycle_paper_gstack")
SWEEP = ("vcycle_paper", "vcycle_identity_a1", "vcycle_reset", "vcycle_alpha0.5", "vcycle_asym_identity_a1",
         "vcycle_asym_a0.5", "vcycle_Ea0.1", "vcycle_coarse0.3", "vcycle_coarse0.8", "vcycle_coarse_lr2x",
         "vcycle_K3", "vcycle_a0.5_Ea0.1", "vcycle_a0.5_Ea0.1_coarse0.8", "vcycle_a0.5_Ea0.1_coarse1.0", "apollo",
         "stack")


def overrides(name: str, layers: int = 4) -> Overrides:
    """The method overrides of variant ``name`` for a target of ``layers`` layers; raises ValueError naming the
    variants for an unknown name."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    return VARIANTS[name](layers)


def method_of(variant: str) -> str:
    """The method a variant belongs to: vcycle, apollo or stacking (width growth is the V-cycle's width operators),
    or the method folder whose variant it is."""
    if variant in method_folders.variants():
        return VARIANTS[variant](4)["method.name"]
    if variant.startswith("width_grow"):
        return "vcycle"
    return variant.split("_")[0] if variant.startswith(("vcycle", "apollo")) else "stacking"


# the fine-tuning benches' pre-trained models (bench.claims.autofreeze, bench.claims.autofreeze_epochs)
AUTOFREEZE_PRETRAIN: dict[str, Overrides] = {
    "bert": {"model.family": "bert", "model.hidden_size": 128, "model.num_layers": 6, "model.num_heads": 4,
             "model.tie_word_embeddings": False, "data.dataset": "bundled", "data.tokenizer": "wordpiece",
             "data.vocab_size": 4096, "data.seq_len": 64, "train.steps": 800, "train.batch_size": 32,
             "train.lr": 1e-3, "train.warmup": 0.05, "train.decay": "linear", "train.min_lr_ratio": 0.0},
    "vit": {"model.family": "vit", "model.hidden_size": 128, "model.num_layers": 6, "model.num_heads": 4,
            "model.patch_size": 4, "data.dataset": "cifar10", "data.image_size": 32, "data.max_images": 10000,
            "train.steps": 800, "train.batch_size": 64, "train.lr": 1e-3, "train.weight_decay": 0.05,
            "train.warmup": 0.05, "train.decay": "cosine", "train.min_lr_ratio": 0.0},
}
# --smoke: tiny sizes so that CI checks the fine-tuning benches end to end in seconds (numbers mean nothing)
AUTOFREEZE_SMOKE: Overrides = {
    "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2, "data.vocab_size": 384,
    "data.seq_len": 32, "data.max_images": 64, "data.max_tokens": 40000, "train.steps": 4,
    "train.batch_size": 8, "train.eval_every": 2, "train.eval_batches": 2,
    "method.autofreeze.freeze_every": 2, "method.autofreeze.cache.memory_mb": 1}
