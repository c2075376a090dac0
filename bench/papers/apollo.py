"""Pan et al., AAAI 2024 (Apollo): the loss-vs-FLOPs figure for GPT-2 and BERT (baseline, Apollo, StackBERT,
G_stack) and the GLUE table after pre-training, at this machine's scale (``python -m bench.papers apollo``).

The 12-layer x 64 models of configs/apollo.yaml, configs/stackbert.yaml and configs/gstack.yaml (depth is what
these methods grow), GPT-2 on the bundled corpus and the same methods on a BERT masked LM (configs/bert_mlm.yaml
at 12 x 64), the same steps and LR for all; every run evaluated every 20 steps on the whole validation split.
Saving = the FLOPs (wall-clock) at which the baseline's own curve first reaches the method's final validation
loss, over the method's cost (the definition of Apollo's README figure and of bert2BERT / LiGO); then every
BERT is fine-tuned on the bundled GLUE dev sets with the recipe of bench/papers/multilevel.py. The command records
the page's data (bench/results/papers_apollo.json) and its figure (apollo.png) beside it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.lib.variants import overrides
from bench.papers import core
from bench.papers.multilevel import GLUE_FULL, GLUE_SMOKE, TINY_TEXT

METHODS = {"baseline": "configs/baseline.yaml", "Apollo": "configs/apollo.yaml",
           "StackBERT": "configs/stackbert.yaml", "G_stack": "configs/gstack.yaml"}
# The authors' README figure (the paper's tables were not retrieved)
PAPER = {"GPT-2": "57.6% (GPT-2-Base, FLOPs to scratch's final training loss)",
         "BERT": "45.2% (BERT-Base, FLOPs to scratch's final MLM loss)"}
RECIPES = {"GPT-2": "launch/recipes/gpt2_base_apollo.yaml", "BERT": "launch/recipes/bert_base_apollo.yaml"}
SHAPE = {"model.hidden_size": 64, "model.num_layers": 12, "model.num_heads": 4}
SMOKE_SHAPE = {"model.num_layers": 4, "train.steps": 12, "train.eval_every": 4}
# --smoke: 4 layers, so each method's shape for a 4-layer target (the frontier's, bench/frontier/run.py)
SMOKE_VARIANTS = {"Apollo": "apollo_authors", "StackBERT": "stackbert", "G_stack": "gstack"}
FIGURE = "apollo.png"  # validation loss vs FLOPs of every run, beside the json


def method_block(name: str, smoke: bool = False) -> dict[str, Any]:
    """The ``method`` overrides of ``name``: its recipe's method block (baseline: none); ``smoke``: the same
    method's shape for the smoke test's 4 layers."""
    import yaml

    if smoke and name in SMOKE_VARIANTS:

        return overrides(SMOKE_VARIANTS[name], SMOKE_SHAPE["model.num_layers"])

    m = yaml.safe_load((core.ROOT / METHODS[name]).read_text())["method"]
    return {"method.name": "baseline"} if m["name"] == "baseline" else {"method.name": m["name"],
                                                                          "method.apollo": m["apollo"]}


def pretrain(ctx: core.Context, model: str) -> dict[str, dict[str, Any]]:
    """Baseline, Apollo, StackBERT and G_stack pre-training runs of ``model`` (GPT-2 or BERT)."""
    recipe = "configs/apollo.yaml" if model == "GPT-2" else "configs/bert_mlm.yaml"
    if ctx.smoke:
        shape = {**TINY_TEXT, **SMOKE_SHAPE, "data.cache_dir": str(core.ROOT / ".cache" / "data")}
    else:
        shape = {**SHAPE, "train.steps": 300, "train.batch_size": 16, "train.lr": 2e-3, "train.eval_every": 20,
                 "train.eval_batches": 10**5, "train.checkpoint_every": 100}
    out = {}
    for name in METHODS:
        rows, folder, summ = core.train(ctx, recipe, {**shape, **method_block(name, ctx.smoke)}, f"{model} {name}",
                                           cell=model)
        out[name] = {"rows": rows, "folder": folder, "summary": summ}
    return out


def tokens_per_param(summary: dict[str, Any]) -> float:
    """Training tokens over the final model's parameters (the scale the papers' savings depend on)."""
    return summary["tokens"] / summary["phases"][-1]["params"]


def loss_table(model: str, runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    base = runs["baseline"]["rows"]
    table = []
    for name, r in runs.items():
        final = [x for x in r["rows"] if x["kind"] == "val"][-1]
        table.append({"model": model, "method": name, "FLOPs": f"{final['flops']:.3g}",
                      "wall s": f"{final['wall']:.0f}",
                      "tokens/param": f"{tokens_per_param(r['summary']):.2f}", "val loss": f"{final['val_loss']:.4f}",
                      "FLOPs saved": "—" if name == "baseline" else core.pct(core.saved(base, r["rows"], "flops")),
                      "wall saved": "—" if name == "baseline" else core.pct(core.saved(base, r["rows"], "wall"))})
    table.append({"model": model, "method": "paper: Apollo", "FLOPs saved": PAPER[model]})
    return table


def glue_note(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Why the GLUE table can or cannot tell the pre-trainings apart: the baseline's tokens per parameter and
    final MLM loss."""
    loss = [r for r in runs["baseline"]["rows"] if r["kind"] == "val"][-1]["val_loss"]
    return {"tokens_per_param": tokens_per_param(runs["baseline"]["summary"]), "mlm_loss": loss}


def run(ctx: core.Context, results: Path) -> dict[str, Any]:
    """Pre-train both models four ways, fine-tune every BERT on GLUE, draw the figure into ``results``; return the
    page's data."""

    t0 = time.time()
    settings = GLUE_SMOKE if ctx.smoke else GLUE_FULL
    ctx.plan(2 * len(METHODS) + len(METHODS) * len(settings["tasks"]) / 2)
    curves = {model: pretrain(ctx, model) for model in ("GPT-2", "BERT")}
    core.plot_curves({f"{m}, 12 x 64": runs for m, runs in curves.items()}, results / FIGURE)
    losses = [row for model, runs in curves.items() for row in loss_table(model, runs)]
    glue_rows, skipped = [], set()
    for name, r in curves["BERT"].items():
        res = core.glue(ctx, r["folder"], settings)
        skipped |= set(res.get("skipped", {}))
        scores = core.glue_scores(res)
        glue_rows.append({"pre-training": name, **{t: f"{v:.1f}" for t, v in scores.items() if t != "average"},
                          "GLUE avg": f"{scores['average']:.1f}"})
    notes = {"recipes": RECIPES, **glue_note(curves["BERT"]), "glue": core.glue_settings(settings, skipped)}
    return {"run": core.run_info(ctx, time.time() - t0), "figure": FIGURE,
            "tables": {"loss": losses, "glue": glue_rows}, "notes": notes, "commands": core.commands(ctx)}
