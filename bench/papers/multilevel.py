"""Zou, Zhang, Deng, ICLR 2024 (multi-level training, V-cycle): the paper's GPT, BERT and DeiT tables at this
machine's scale, baseline beside V-cycle (``python -m bench.papers multilevel``).

- **GPT**: the frontier's runs (bench/frontier/run.py: same configs, same cache, same checkpoints): the 4x128 GPT-2
  baseline at its tuned LR over every budget it ran (its own loss-vs-FLOPs curve), the V-cycle (this
  project's recipe and the paper's proportions) at the largest methods' budget, 3 seeds. FLOPs and wall-clock
  saved at equal *test* loss against that curve (the paper's protocol: same model size) and against the
  frontier's envelope over sizes; zero-shot LAMBADA, PTB, WikiText-2 and WikiText-103 (seed 0).
- **BERT**: configs/bert_mlm.yaml (4x128 masked LM), baseline and V-cycle for the same FLOPs budget, then
  GLUE on the bundled dev sets (eval.glue, a short recipe: see the page).
- **DeiT**: configs/deit_cifar10.yaml (a 4x128 DeiT on the bundled CIFAR-10), baseline and V-cycle; accuracy on
  the whole validation split. BERT and DeiT savings are at equal validation loss against the baseline's own
  curve (evaluated every ``eval_every`` steps on the whole validation split).
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import mean
from typing import Any

from bench.lib import envelope
from bench.lib import grid as F
from bench.lib.rows import COLUMNS, rows_or_exit, sorted_rows, write_csv
from bench.papers import core

# As reported in reviews of the paper's text (its PDF tables were not seen).
PAPER = {
    "gpt": ("GPT-Base, 2 levels", "24.1%", "16.5%", "PTB ppl 142.5 vs baseline 146.3; LAMBADA ppl ~54.5 quoted"),
    "bert": ("BERT-Base, 2 levels", "19.0%", "10.8%", "GLUE avg 79.8 +- 0.1 vs baseline 79.7 +- 0.2"),
    "deit": ("DeiT-B, 2 levels", "27.1%", "24.3%", "ImageNet top-1 81.5 vs baseline 81.1"),
}
RECIPES = {"gpt": "launch/recipes/gpt2_base_vcycle.yaml", "bert": "launch/recipes/bert_base_vcycle.yaml",
           "deit": "launch/recipes/deit_b_vcycle.yaml"}
ZS_TASKS = ("lambada", "wikitext2", "wikitext103", "ptb")
BERT = "configs/bert_mlm.yaml"
DEIT = "configs/deit_cifar10.yaml"
TINY = {"model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2, "train.batch_size": 8,
        "train.eval_every": 3, "train.eval_batches": 2, "train.steps": 9, "train.checkpoint_every": 10**6}
TINY_TEXT = {**TINY, "data.vocab_size": 384, "data.max_tokens": 40000, "data.seq_len": 32}
GLUE_FULL = {"tasks": core.GLUE_TASKS, "lrs": (1e-4,), "seeds": (0,), "epochs": 2.0, "max_train_samples": 2000,
             "max_eval_samples": 1000, "max_seq_len": 128}
GLUE_SMOKE = {"tasks": ("rte", "sst2"), "lrs": (1e-4,), "seeds": (0,), "epochs": 1.0, "max_train_samples": 16,
              "max_eval_samples": 16, "max_seq_len": 32}


def pretrain_pair(ctx: core.Context, recipe: str, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Baseline and V-cycle of ``recipe`` at the same FLOPs budget, evaluated on the whole validation split."""
    base = {**({"data.cache_dir": str(core.ROOT / ".cache" / "data")} if ctx.smoke else {}),
            **(TINY_TEXT if ctx.smoke and name == "bert" else TINY if ctx.smoke else
               {"train.eval_every": 20, "train.eval_batches": 10**5}), **extra}
    out = {}
    for method in ("baseline", "vcycle"):
        rows, folder, summ = core.train(ctx, recipe, {**base, "method.name": method}, f"{name} {method}",
                                           cell=name)
        out[method] = {"rows": rows, "folder": folder, "summary": summ}
    return out


DEIT_SEEDS = (0, 1, 2)  # --smoke: the first only
FIGURE = "multilevel.png"  # validation loss vs FLOPs of the BERT and DeiT runs, beside the json


def deit_section(ctx: core.Context) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Baseline and V-cycle DeiT for every seed; the V-cycle's saving against the same seed's baseline, mean
    [min, max] over seeds (one seed moves it by tens of percent at this scale). Returns (table, the note's values,
    seed 0's runs)."""

    over = {"data.max_images": 200} if ctx.smoke else {}
    seeds = DEIT_SEEDS[:1] if ctx.smoke else DEIT_SEEDS
    per_seed = [pretrain_pair(ctx, DEIT, "deit", {**over, **({"train.seed": s} if s else {})}) for s in seeds]
    finals = {m: [[x for x in r[m]["rows"] if x["kind"] == "val"][-1] for r in per_seed] for m in per_seed[0]}
    table = []
    for method, rows in finals.items():
        saved = {ax: [core.saved(r["baseline"]["rows"], r[method]["rows"], ax) for r in per_seed]
                 for ax in ("flops", "wall")}
        table.append({"model": f"{method} (4x128 DeiT)" if not ctx.smoke else method, "seeds": len(seeds),
                      **{f"{ax} saved": "—" if method == "baseline" else core.spread(saved[key])
                         for ax, key in (("FLOPs", "flops"), ("wall", "wall"))},
                      "FLOPs": f"{mean(f['flops'] for f in rows):.3g}",
                      "val loss": f"{mean(f['val_loss'] for f in rows):.4f}",
                      "top-1 (CIFAR-10 val)": _acc(rows)})
    name, f, w, q = PAPER["deit"]
    table.append({"model": f"paper: {name}", "FLOPs saved": f, "wall saved": w, "FLOPs": "", "val loss": "",
                  "top-1 (CIFAR-10 val)": q})
    return table, {"seeds": list(seeds), "recipe": RECIPES["deit"]}, per_seed[0]


def _acc(rows: list[dict[str, Any]]) -> str:
    acc = [100 * r["val_accuracy"] for r in rows]
    return f"{sum(acc) / len(acc):.1f}" + (f" [{min(acc):.1f}, {max(acc):.1f}]" if len(acc) > 1 else "")


def bert_section(ctx: core.Context) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Baseline and V-cycle BERT at the same FLOPs, then GLUE: (table, the note's values, the runs)."""
    runs = pretrain_pair(ctx, BERT, "bert", {})
    settings = GLUE_SMOKE if ctx.smoke else GLUE_FULL
    base = runs["baseline"]["rows"]
    table = []
    skipped: set[str] = set()
    for method, r in runs.items():
        res = core.glue(ctx, r["folder"], settings)
        skipped |= set(res.get("skipped", {}))
        scores = core.glue_scores(res)
        final = [x for x in r["rows"] if x["kind"] == "val"][-1]
        table.append({"model": method,
                      "FLOPs saved": "—" if method == "baseline" else core.pct(core.saved(base, r["rows"], "flops")),
                      "wall saved": "—" if method == "baseline" else core.pct(core.saved(base, r["rows"], "wall")),
                      "MLM val loss": f"{final['val_loss']:.4f}",
                      **{t: f"{v:.1f}" for t, v in scores.items() if t != "average"},
                      "GLUE avg": f"{scores['average']:.1f}"})
        r["glue"] = scores
    name, f, w, q = PAPER["bert"]
    table.append({"model": f"paper: {name}", "FLOPs saved": f, "wall saved": w, "GLUE avg": q})
    summ = runs["baseline"]["summary"]
    tpp = summ["tokens"] / summ["phases"][-1]["params"]
    note = {"tokens_per_param": tpp, "mlm_loss": runs["baseline"]["rows"][-1].get("val_loss", float("nan")),
            "glue": core.glue_settings(settings, skipped), "recipe": RECIPES["bert"]}
    return table, note, runs


def gpt_section(ctx: core.Context) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The frontier's 4x128 runs (reused, or trained into its cache), savings at equal test loss and zero-shot
    scores: (table, the note's values)."""

    g = F.SMOKE if ctx.smoke else F.FULL
    seeds = g.seeds[:1] if ctx.smoke else g.seeds
    base_seeds = (0, 1) if ctx.smoke else seeds  # a reference needs a seed besides the one that chose the LR
    csv_path = ctx.frontier_results / "frontier.csv"
    rows = rows_or_exit(csv_path)
    size, top = g.target, max(g.budgets)
    budgets = sorted({b for s, b in g.baseline_cells() if s == size})
    flops = {size: F.step_flops_of(g, size)}
    default_lr = g.lrs[len(g.lrs) // 2]
    lrs = {b: envelope.tuned_lr(rows, size, b) or default_lr for b in budgets}
    jobs = [F.make_job(g, "baseline", "tuned", size, b, lrs[b], s, flops, 0) for b in budgets for s in base_seeds]
    jobs += [F.make_job(g, "vcycle", v, size, top, lrs[top], s, flops, 0) for v in ("vcycle", "vcycle_paper")
             for s in seeds]
    ctx.plan(len(jobs) + 3)
    have = {r["key"]: r for r in rows}
    got: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job["key"] not in have:
            have[job["key"]] = F.train(job, g.recipe, str(ctx.frontier_out))
            rows.append(have[job["key"]])
            write_csv(csv_path, sorted_rows(rows), COLUMNS)
        got[job["key"]] = have[job["key"]]
        m = job["meta"]
        ctx.step(f"gpt {m['variant']} budget {m['budget']} seed {m['seed']}")
    sizes = sorted({envelope.size_of(r) for r in rows if r["method"] == "baseline"})
    curves = {("same size", ax): envelope.same_size_curve(rows, size, budgets, ax) for ax in ("flops", "wall_s")}
    curves.update({("envelope", ax): envelope.envelope_curve(rows, sizes, g.all_budgets, ax)
                   for ax in ("flops", "wall_s")})
    table = []
    for label, variant, budget in (("baseline (tuned LR)", "tuned", top), ("V-cycle (this project's recipe)",
                                   "vcycle", top), ("V-cycle (paper's proportions)", "vcycle_paper", top)):
        runs = [r for j, r in ((j, got[j["key"]]) for j in jobs)
                if j["meta"]["variant"] == variant and j["meta"]["budget"] == budget]
        job0 = next(j for j in jobs if j["meta"]["variant"] == variant and j["meta"]["budget"] == budget
                    and j["meta"]["seed"] == seeds[0])
        core.record_command(ctx, g.recipe, job0["overrides"])
        folder = ctx.frontier_out / job0["key"]
        if not (folder / "final" / "config.json").is_file():  # a row from another machine: its checkpoint again
            F.train(job0, g.recipe, str(ctx.frontier_out))
        z = core.zeroshot(ctx, folder, ZS_TASKS)
        row = {"model": label, "seeds": len(runs)}
        for ref in ("same size", "envelope"):
            for ax, name in (("flops", "FLOPs"), ("wall_s", "wall")):
                if (variant == "tuned" and ref == "same size") or not curves[(ref, ax)]:
                    row[f"{name} saved ({ref})"] = "—"  # (no curve: only the seed that chose the LR ran, --smoke)
                    continue
                vals = [envelope.saving(float(r[ax]), curves[(ref, ax)], float(r["test_loss"])) for r in runs]
                row[f"{name} saved ({ref})"] = core.spread(vals)
        row.update({"test loss": f"{sum(float(r['test_loss']) for r in runs) / len(runs):.4f}",
                    "tokens/param": f"{float(runs[0]['tokens_per_param']):.1f}",
                    "LAMBADA acc": f"{100 * z['lambada']['acc']:.1f}",
                    "LAMBADA ppl": f"{z['lambada']['perplexity']:.3g}",
                    "PTB ppl": f"{z['ptb']['word_perplexity']:.3g}", "WikiText-2 ppl":
                    f"{z['wikitext2']['word_perplexity']:.3g}", "WikiText-103 ppl":
                    f"{z['wikitext103']['word_perplexity']:.3g}"})
        table.append(row)
    name, f, w, q = PAPER["gpt"]
    table.append({"model": f"paper: {name}", "FLOPs saved (same size)": f, "wall saved (same size)": w,
                  "PTB ppl": q})
    note = {"budget_steps": top, "size": list(size), "budget_flops": top * flops[size], "budgets": budgets,
            "recipe": RECIPES["gpt"]}
    return table, note


def run(ctx: core.Context, results: Path) -> dict[str, Any]:
    """Train and evaluate everything, draw the figure into ``results``; return the page's data."""

    t0 = time.time()
    glue_tasks = (GLUE_SMOKE if ctx.smoke else GLUE_FULL)["tasks"]
    ctx.plan(4 + 2 * (1 if ctx.smoke else len(DEIT_SEEDS)) + 2 * len(glue_tasks) / 2)
    gpt_table, gpt_note = gpt_section(ctx)
    bert_table, bert_note, bert = bert_section(ctx)
    deit_table, deit_note, deit = deit_section(ctx)
    core.plot_curves({"BERT masked LM": bert, "DeiT on CIFAR-10": deit}, results / FIGURE)
    return {"run": core.run_info(ctx, time.time() - t0), "figure": FIGURE,
            "tables": {"gpt": gpt_table, "bert": bert_table, "deit": deit_table},
            "notes": {"gpt": gpt_note, "bert": bert_note, "deit": deit_note}, "commands": core.commands(ctx)}
