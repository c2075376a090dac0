"""docs/results/frontier.md and frontier_layers.md: each grid's page, from its rows and its savings.

Every figure comes from ``bench/results/frontier<stem>.csv`` (the runs), ``savings<stem>.csv`` (each method's
saving and the deciding rule's verdict, written by ``python -m bench.frontier``, which computes them) and
``frontier_runs<stem>.json`` (the machine and dates of the runs); the fitted law is fitted again from the rows (the
same fit the rule made). The paragraphs are templates (bench/pages/templates/frontier*.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean
from typing import Any

from bench.lib import envelope, predictions
from bench.lib import verdict as rule
from bench.lib.grid import GRIDS, Grid
from bench.lib.rows import read_rows, read_savings  # each file checked field by field, refused in one line
from bench.pages.text import DOCS, RESULTS, fill, splice
from common.table import format_table
from progressive.config import registry as method_folders

CMD = "python -m bench.frontier"
LAYER_NAMES = {"vcycle_paper": "V-cycle (paper's recipe)", "vcycle_coarse_lr2x": "V-cycle (coarse LR 2x)",
               "vcycle_coarse_lr1x": "V-cycle (coarse LR 1x)", "stackbert": "StackBERT",
               "gstack2": "G_stack 2x (2 → 4 layers)", "gstack": "G_stack 4x (1 → 4 layers, the paper's growth)",
               "apollo_authors": "Apollo", "vcycle_paper_gstack": "V-cycle + G_stack",
               "width_grow": "width growth (from half the width)",
               "width_grow_noise1": "width growth (from half the width, split noise 1.0)",
               "vcycle_paper_width": "V-cycle (paper's, width-only coarse level)",
               "late_expansion": "late expansion (from half the depth, at 0.8)",
               "late_expansion_1": "late expansion (from one layer, at 0.8)",
               **method_folders.variant_names()}  # a method folder's cells: its results-page line's title
GUIDE = DOCS.parent / "frontier.md"  # the method's hand-written guide: generated blocks, the counts and deciding cells
CLOSEST_BEGIN, CLOSEST_END = "<!-- closest:begin (python -m bench.pages) -->", "<!-- closest:end -->"
COUNTS_BEGIN, COUNTS_END = "<!-- counts:begin (python -m bench.pages) -->", "<!-- counts:end -->"
SHAPES_BEGIN, SHAPES_END = "<!-- shapes:begin (python -m bench.pages) -->", "<!-- shapes:end -->"


def page(g: Grid, results: Path = RESULTS) -> str:
    """The page of grid ``g`` from the files in ``results``."""
    rows = read_rows(results / f"frontier{g.stem}.csv") if (results / f"frontier{g.stem}.csv").is_file() else []
    law = rule.envelope_law(rows, g.baseline_sizes, g.all_budgets) if rows else None
    table, line = predictions.listing(g, rows, results / "predictions")
    text = render(g, rows, read_savings(results / f"savings{g.stem}.csv"), runs_made(results, g.stem), law,
                  (table, line) if table else None)
    if g.beside and rows:
        other = GRIDS[g.beside]
        text += "\n" + fill("frontier_beside", grid=g.beside, stem=other.stem, table=format_table(
            beside(rows, read_rows(results / f"frontier{other.stem}.csv")))) + "\n"
    return text


def beside(rows: list[dict[str, Any]], other: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each tuned baseline cell of ``rows`` beside the same size and budget in ``other`` (a grid one change apart:
    the schedule): each one's tuned LR and mean test loss over its reference seeds (seed 0's where only it ran, said
    so), and the difference."""
    def read(rs: list[dict[str, Any]], size: tuple[int, int], b: int) -> tuple[str, float | None, str]:
        ref = envelope.reference_runs(rs, size, b) or [r for r in envelope.tuned_runs(rs, size, b)
                                                       if int(r["seed"]) == envelope.CHOOSER_SEED]
        if not ref:
            return "", None, "not run"
        m = mean(float(r["test_loss"]) for r in ref)
        seeds = ",".join(str(int(r["seed"])) for r in sorted(ref, key=lambda r: int(r["seed"])))
        return f"{envelope.tuned_lr(rs, size, b):g}", m, f"{m:.4f} (seeds {seeds})"

    out = []
    for size, b in sorted({(envelope.size_of(r), int(r["budget"])) for r in rows if r["method"] == "baseline"},
                          key=lambda k: (k[1], k[0])):
        lr, here, said = read(rows, size, b)
        lr_o, there, said_o = read(other, size, b)
        out.append({"size": f"{size[0]}x{size[1]}", "budget (steps)": b, "LR (this grid)": lr,
                    "test loss (this grid)": said, "LR (beside)": lr_o, "test loss (beside)": said_o,
                    "difference": "" if here is None or there is None else f"{here - there:+.4f}"})
    return out


def pages(results: Path = RESULTS, docs: Path = DOCS) -> dict[Path, str]:
    """{docs/results/frontier<stem>.md: its text} for every grid of ``python -m bench.frontier --grid``, and
    docs/frontier.md with its block of the layer grid's deciding cells (``closest``) regenerated."""
    grids = {docs / f"frontier{g.stem}.md": page(g, results) for g in GRIDS.values()}
    if docs != DOCS or not GUIDE.is_file():  # a page set rendered elsewhere (tests) leaves the guide alone
        return grids
    layers = GRIDS["layers"]
    rows = read_rows(results / f"frontier{layers.stem}.csv") if (results / f"frontier{layers.stem}.csv").is_file() \
        else []
    law = rule.envelope_law(rows, layers.baseline_sizes, layers.all_budgets) if rows else None
    save = read_savings(results / f"savings{layers.stem}.csv")
    guide = splice(GUIDE.read_text(), CLOSEST_BEGIN, CLOSEST_END, closest(save, law), "docs/frontier.md")
    target = f"{layers.target[0]}x{layers.target[1]}"
    guide = splice(guide, COUNTS_BEGIN, COUNTS_END, counts(save, len(rows), target), "docs/frontier.md")
    return {**grids, GUIDE: splice(guide, SHAPES_BEGIN, SHAPES_END, shapes(rows, layers.all_budgets),
                                   "docs/frontier.md")}


def shapes(rows: list[dict[str, Any]], budgets: list[int]) -> str:
    """Per budget, the best tuned shape (the lowest seed-0 validation loss at its tuned LR: the grid's choice) and
    its nearest tried neighbours on both axes (fewer and more layers at its width, narrower and wider at its depth),
    each with its loss; interior where every neighbour was tried and is worse (1 layer has no shallower side)."""
    table, edge = [], 0
    for b in budgets:
        val = {}
        for r in rows:
            if r["method"] == "baseline" and int(r["budget"]) == b and int(r["seed"]) == envelope.CHOOSER_SEED:
                s = envelope.size_of(r)
                val[s] = min(val.get(s, float("inf")), float(r["val_loss"]))
        if len(val) < 2:
            continue
        best = min(val, key=val.get)
        sides = {"fewer layers": [s for s in val if s[1] == best[1] and s[0] < best[0]],
                 "more layers": [s for s in val if s[1] == best[1] and s[0] > best[0]],
                 "narrower": [s for s in val if s[0] == best[0] and s[1] < best[1]],
                 "wider": [s for s in val if s[0] == best[0] and s[1] > best[1]]}
        flops = float(next(r for r in rows if int(r["budget"]) == b)["budget_flops"])
        row = {"budget (steps)": b, "FLOPs": f"{flops:.2g}",
               "best shape (seed-0 val.)": f"**{best[0]}x{best[1]}** ({val[best]:.4f})"}
        open_ = []
        for side, found in sides.items():
            if not found:
                row[side] = "– (none below 1)" if side == "fewer layers" and best[0] == 1 else "not tried"
                if row[side] == "not tried":
                    open_.append(side)
                continue
            near = max(found) if side in ("fewer layers", "narrower") else min(found)
            row[side] = f"{near[0]}x{near[1]} (+{val[near] - val[best]:.4f})"
        row["interior"] = "yes" if not open_ else "no: " + ", ".join(open_) + " untried"
        edge += bool(open_)
        table.append(row)
    if not table:
        return "No budget has two tuned shapes yet."
    head = (f"At {len(rows)} runs the best tuned shape is interior at {len(table) - edge} of {len(table)} budgets "
            "(each neighbour's validation loss above the best's in brackets):")
    return head + "\n\n" + format_table(table)


def _named(r: dict[str, Any]) -> str:
    """"G_stack 2x (2 → 4 layers) at 9934 steps": a savings row's cell."""
    return f"{LAYER_NAMES.get(r['variant'], r['variant'])} at {int(r['budget'])} steps"


def counts(save: list[dict[str, Any]], runs: int, target: str) -> str:
    """The rule's counts on the layer grid (templates/frontier_counts.md): against the envelope and against the
    target trained directly, how many eligible cells save and lose, each such cell with its interval."""
    if not save:
        return fill("frontier_closest_none")

    def cells(reference: str, direction: str) -> str:
        found = [r for r in save if r["reference"] == reference and r.get("verdict") == direction]
        return f" ({'; '.join(f'{_named(r)}, {_t_pct(r)}'.replace('**', '') for r in found)})" if found else ""

    (k, n), (kl, _), (ks, ns), (ksl, _) = (rule.counts(save, ref, d) for ref in rule.REFERENCES
                                           for d in (rule.SAVES, rule.LOSES))
    return fill("frontier_counts", runs=runs, k=k, n=n, kl=kl, saves=cells("envelope", rule.SAVES),
                loses=cells("envelope", rule.LOSES), target=target, ks=ks, ns=ns, ksl=ksl,
                same_saves=cells("same_size", rule.SAVES), same_loses=cells("same_size", rule.LOSES))


def closest(save: list[dict[str, Any]], law: Any = None, n: int = 3) -> str:
    """The ``n`` eligible cells closest to a saving against the envelope (the smallest p of the rule's test), each
    with its test, the smallest saving it could detect, the law's test beside it (shown only) and the rule's
    verdict, and the law (templates/frontier_closest.md)."""
    cells = sorted((r for r in save if r["reference"] == "envelope" and rule.eligible(r)),
                   key=lambda r: float(r["p_saves"]))[:n]
    if not cells:
        return fill("frontier_closest_none")
    table = format_table([{
        "method": LAYER_NAMES.get(r["variant"], r["variant"]),
        "steps (FLOPs)": f"{int(r['budget'])} ({float(r['budget_flops']):.1e})",
        "seeds (method / ref.)": f"{int(r['seeds'])} / {int(r['reference_seeds'])}",
        "saved vs the hull [Welch 95%, every LR]": _t_pct(r).replace("**", ""),
        "p (hull)": f"{float(r['p_saves']):.2g}", "detectable (80%)": _mde(r),
        "saved vs the law (shown only)": _law_pct(r),
        "p (law)": f"{float(r['law_p_saves']):.2g}" if r.get("law_p_saves") not in (None, "") else "",
        "verdict": _verdict(r)} for r in cells])
    holm = int(cells[0]["holm_n"])
    return fill("frontier_closest", k=len(cells), n=holm, first=f"{rule.ALPHA / holm:.2g}", alpha=rule.ALPHA,
                table=table, law=fill("frontier_law", law=law.text()) if law is not None else fill("frontier_no_law"))


def _flag(g: Any) -> str:
    """The --grid flag that names grid ``g`` in a command ("" for the default grid)."""
    return f" --grid {g.stem.lstrip('_')}" if g.stem else ""


def runs_made(results: Path, stem: str = "") -> str | None:
    """"<machine>, <first date> to <last date>" of the rows of frontier<stem>.csv in ``results`` (None: not
    recorded)."""
    path = results / f"frontier_runs{stem}.json"
    if not path.is_file():
        return None
    made = json.loads(path.read_text())
    first, last = made["dates"]
    return f"{made['machine']}, {first if first == last else f'{first} to {last}'}"


MARK = {"=": "", ">=": "≥ ", "<=": "≤ ", "~": "~ "}


def _pct(row: dict[str, Any], axis: str) -> str:
    """"mean% [lo, hi]": the bootstrap's percentile interval, each end marked when it is a bound (a description of
    the spread: it decides nothing)."""
    ci = MARK[row[f"{axis}_ci_bound"]]
    return (f"{MARK[row[f'{axis}_bound']]}{100 * float(row[f'{axis}_saved_mean']):.1f}% "
            f"[{ci}{100 * float(row[f'{axis}_saved_lo']):.1f}, {ci}{100 * float(row[f'{axis}_saved_hi']):.1f}]")


def _t_pct(row: dict[str, Any]) -> str:
    """"mean% [lo, hi]": the FLOPs saving with the Welch test's interval propagated to it, at the levels Holm
    compared it with where it was judged (else at 2.5% each side); bold where the rule finds a saving
    (``verdict.saves``)."""
    if row.get("flops_saved_t_lo") in (None, ""):
        return _pct(row, "flops").split(" [")[0]
    k = "holm" if row.get("flops_saved_holm_lo") not in (None, "") else "t"
    lo, hi = MARK[row[f"flops_{k}_lo_bound"]], MARK[row[f"flops_{k}_hi_bound"]]
    text = (f"{MARK[row['flops_bound']]}{100 * float(row['flops_saved_mean']):.1f}% "
            f"[{lo}{100 * float(row[f'flops_saved_{k}_lo']):.1f}, {hi}{100 * float(row[f'flops_saved_{k}_hi']):.1f}]")
    return f"**{text}**" if rule.saves(row) else text


def _law_pct(row: dict[str, Any] | None) -> str:
    """The saving against the fitted law ("~": the law extrapolated past its budgets), and its test's verdict where
    it finds one (shown only: the law decides nothing)."""
    if row is None or row.get("law_flops_saved") in (None, ""):
        return ""
    said = row.get("verdict_law")
    return (f"{MARK[row['law_flops_bound']]}{100 * float(row['law_flops_saved']):.1f}%"
            + (f" ({said})" if said in (rule.SAVES, rule.LOSES) else ""))


def _mde(row: dict[str, Any] | None) -> str:
    """The smallest FLOPs saving the cell's test could detect with 80% power at Holm's first threshold ("~": read
    past the reference's budgets, along its last segment); "" where there is none (not eligible)."""
    if row is None or row.get("mde_flops_saved") in (None, ""):
        return ""
    return f"{MARK[row['mde_flops_bound']]}{100 * float(row['mde_flops_saved']):.0f}%"


def _verdict(row: dict[str, Any] | None) -> str:
    """The rule's verdict (the hull's test, or the same size's); a saving or a loss with its interval, the test's
    95% interval carried to the FLOPs saving."""
    if row is None or not row.get("verdict"):
        return ""
    if row["verdict"] in (rule.SAVES, rule.LOSES):
        return f"**{row['verdict']}**: {_t_pct(row).replace('**', '')}"
    return row["verdict"]


def _gap(row: dict[str, Any] | None) -> str:
    """A savings row's test-loss gap at equal FLOPs with the Welch test's interval, "mean [lo, hi]"."""
    if row is None or row.get("gap_t_lo") in (None, ""):
        return envelope.gap_text(row)
    return f"{float(row['loss_gap_mean']):+.3f} [{float(row['gap_t_lo']):+.3f}, {float(row['gap_t_hi']):+.3f}]"


def render(g: Any, rows: list[dict[str, Any]], save: list[dict[str, Any]], made: str | None = None,
           law: Any = None, preds: tuple[list[dict[str, Any]], str] | None = None) -> str:
    """The Markdown page: protocol, envelope, savings, zero-shot, the LR sweep, the predictions. ``save``: the
    savings rows (with the rule's columns); ``made``: "<machine>, <dates>" of the runs (``runs_made``), None when not
    recorded; ``law``: the fitted envelope (bench.lib.verdict.Law); ``preds``: the grid's predictions beside their
    outcomes and their count line (bench.frontier.predict.listing), None when it has none."""
    if not rows:
        empty = fill("frontier_empty", about=f", {g.about}" if g.about else "", flag=_flag(g), stem=g.stem)
        return empty + ("\n\n" + fill("frontier_predictions", line=preds[1], table=format_table(preds[0]))
                        if preds else "") + "\n"
    sizes, budgets = g.baseline_sizes, g.all_budgets
    loads = [float(r["load1"]) for r in rows if r.get("load1") is not None]
    (k, n), (ks, ns) = rule.counts(save), rule.counts(save, "same_size")
    kl, ksl = rule.counts(save, direction=rule.LOSES)[0], rule.counts(save, "same_size", rule.LOSES)[0]
    sections = [fill("frontier", about=f", {g.about}" if g.about else "", cmd=CMD, flag=_flag(g), stem=g.stem,
                     runs=len(rows), split_note=g.split_note,
                     test_split_note=g.split_note.replace(" of 128 tokens", ""),
                     bootstrap=envelope.BOOTSTRAP, rng_seed=envelope.RNG_SEED, made=made or "a machine not recorded",
                     loads=f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}", k=k, n=n, ks=ks, ns=ns,
                     kl=kl, ksl=ksl,
                     law=fill("frontier_law", law=law.text()) if law is not None else fill("frontier_no_law"))]
    env, on = [], {(s, b) for s, b, *_ in envelope.envelope_points(rows, sizes, budgets, "flops")}
    for b in budgets:
        for s in sizes:
            runs = envelope.tuned_runs(rows, s, b)
            if not runs:
                continue
            ref = envelope.reference_runs(rows, s, b)
            chooser = [float(r["test_loss"]) for r in runs if int(r["seed"]) == envelope.CHOOSER_SEED]
            tl = [float(r["test_loss"]) for r in ref]
            env.append({"budget": b, "FLOPs": f"{runs[0]['budget_flops']:.3g}", "size": f"{s[0]}x{s[1]}",
                        "tuned lr": envelope.tuned_lr(rows, s, b),
                        "lrs tried": len([r for r in envelope.baseline_rows(rows, s, b)
                                          if int(r["seed"]) == envelope.CHOOSER_SEED]),
                        "test loss, seed 0 (chose)": f"{chooser[0]:.4f}" if chooser else "",
                        "reference seeds": len(ref),
                        "val loss (ref.)": round(mean(float(r["val_loss"]) for r in ref), 4) if ref else "",
                        "test loss (ref.)": f"{mean(tl):.4f} [{min(tl):.4f}, {max(tl):.4f}]" if tl else "",
                        "tokens/param": round(mean(float(r["tokens_per_param"]) for r in runs), 3),
                        "envelope": "**on it**" if (s, b) in on else ""})
    sections.append(fill("frontier_baseline", table=format_table(env)))
    for target in sorted({r["target"] for r in save}):
        part = [r for r in save if r["target"] == target]
        table = []
        for key in sorted({(r["method"], r["variant"], r["budget"]) for r in part}, key=lambda k: (k[2], k[0], k[1])):
            by = {r["reference"]: r for r in part if (r["method"], r["variant"], r["budget"]) == key}
            any_row = next(iter(by.values()))
            table.append({"variant": key[1], "budget": key[2],
                          "seeds (method / ref.)":
                              f"{any_row['seeds']} / {by.get('envelope', any_row)['reference_seeds']}",
                          "test loss": round(any_row["test_loss_mean"], 4),
                          "tokens/param": round(any_row["tokens_per_param"], 3),
                          "tokens vs baseline": "" if any_row["tokens_vs_baseline"] is None
                          else f"{any_row['tokens_vs_baseline']:.2f}x",
                          "FLOPs saved vs envelope (hull)": _t_pct(by["envelope"]) if "envelope" in by else "",
                          "verdict vs envelope": _verdict(by.get("envelope")),
                          "detectable vs envelope (80%)": _mde(by.get("envelope")),
                          "vs the fitted law (shown only)": _law_pct(by.get("envelope")),
                          "test loss vs envelope, equal FLOPs": _gap(by.get("envelope")),
                          "bootstrap (description)": _pct(by["envelope"], "flops") if "envelope" in by else "",
                          "wall saved vs envelope (bootstrap)": _pct(by["envelope"], "wall") if "envelope" in by
                          else "",
                          "FLOPs saved vs same size": _t_pct(by["same_size"]) if "same_size" in by else "",
                          "verdict vs same size": _verdict(by.get("same_size")),
                          "detectable vs same size (80%)": _mde(by.get("same_size")),
                          "test loss vs same size, equal FLOPs": _gap(by.get("same_size"))})
        sections.append(fill("frontier_savings", target=target, table=format_table(table)))
    zs = zeroshot_rows(rows)
    if zs:
        table = [{"method": r["method"], "variant": r["variant"], "size": f"{r['layers']}x{r['width']}",
                  "budget": r["budget"], "lr": r["lr"], "test loss": round(float(r["test_loss"]), 4),
                  "LAMBADA acc": round(float(r["lambada_acc"]), 4), "LAMBADA ppl": f"{float(r['lambada_ppl']):.4g}",
                  "WikiText-2 word ppl": f"{float(r['wikitext2_word_ppl']):.4g}",
                  "PTB word ppl": f"{float(r['ptb_word_ppl']):.4g}"}
                 for r in sorted(zs, key=lambda r: float(r["test_loss"]))]
        sections.append(fill("frontier_zeroshot", table=format_table(table)))
    for c, table in checks_tables(g, rows):
        several = len(c.factors) > 1
        sections.append(fill("frontier_tuning", what="each method's LR" if several else " / ".join(c.variants),
                             cell=f"{c.size[0]}x{c.size[1]} at budget {c.budget}", seeds=", ".join(map(str, c.seeds)),
                             factor="each factor of " if several else "",
                             lr=f"{envelope.tuned_lr(rows, c.size, c.budget):g}",
                             lowest="of each method" if several else "of the variants", table=format_table(table)))
    if preds:
        table, line = preds
        sections.append(fill("frontier_predictions", line=line, table=format_table(table)))
    sections.append(fill("frontier_plot", stem=g.stem))
    return "\n\n".join(sections) + "\n"


def zeroshot_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with zero-shot results that are a method's or a size's result: seed 0 at its cell's tuned LR (an LR
    check's other LRs are not, nor rows zero-shot before bench.frontier planned zero-shot at the tuned LR only)."""
    return [r for r in rows if r.get("lambada_acc") not in (None, "") and int(r["seed"]) == envelope.CHOOSER_SEED
            and float(r["lr"]) == envelope.own_lr(rows, r)]


def checks_tables(g: Any, rows: list[dict[str, Any]]) -> list[tuple[Any, list[dict[str, str]]]]:
    """(check, its table) for each of ``g.all_checks`` (its checks and its settling runs' LR checks) with a run: a
    row per variant, a column per LR factor, each cell the validation loss's mean [min, max] over the seeds run; bold
    the lowest of the cells compared (each row where there are several factors, the column where one), compared on
    the seeds all of them ran (paired)."""
    out = []
    for c in g.all_checks:
        lr = envelope.tuned_lr(rows, c.size, c.budget)
        if lr is None:
            continue
        runs: dict[tuple[str, float], dict[int, float]] = {}
        for r in rows:
            if (r["variant"] in c.variants and envelope.size_of(r) == c.size and int(r["budget"]) == c.budget
                    and int(r["seed"]) in c.seeds):
                f = next((f for f in c.factors if float(r["lr"]) == f * lr), None)
                if f is not None:
                    runs.setdefault((r["variant"], f), {})[int(r["seed"])] = float(r["val_loss"])
        if not runs:
            continue
        several = len(c.factors) > 1
        groups = ([[(v, f) for f in c.factors] for v in c.variants] if several
                  else [[(v, c.factors[0]) for v in c.variants]])
        won = set()
        for group in groups:
            ran = [k for k in group if k in runs]
            common = set.intersection(*(set(runs[k]) for k in ran)) if ran else set()
            if common:
                won.add(min(ran, key=lambda k: mean(runs[k][s] for s in common)))
        table = []
        for v in c.variants:
            row = {"variant": v}
            for f in c.factors:
                val = list(runs.get((v, f), {}).values())
                n = "" if len(val) == len(c.seeds) else f" ({len(val)} run)"
                text = f"{mean(val):.4f} [{min(val):.4f}, {max(val):.4f}]{n}" if val else ""
                row[f"LR x{f:g}" if several else "val loss"] = f"**{text}**" if (v, f) in won else text
            table.append(row)
        out.append((c, table))
    return out
