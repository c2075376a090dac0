"""What the frontier writes from its rows: savings.csv, frontier.png and docs/results/frontier.md (never typed).

Every figure on the page comes from ``bench/results/frontier.csv`` through bench/lib/envelope.py; a re-run of
``python -m bench.frontier --report`` rewrites all three from the rows alone.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

from bench.lib import envelope

CMD = "python -m bench.frontier"


def _flag(g: Any) -> str:
    """The --grid flag that names grid ``g`` in a command ("" for the default grid)."""
    return f" --grid {g.stem.lstrip('_')}" if g.stem else ""


def report(g: Any, rows: list[dict[str, Any]], results: Path, docs: Path | None) -> str:
    """Write ``results/savings.csv`` and ``results/frontier.png`` (and ``docs/results/frontier.md``; ``docs`` is
    docs/results by default); return the page."""
    from bench.lib.rows import SAVINGS_COLUMNS, write_csv
    from bench.lib.verdict import decide
    from common.io import atomic_write_text

    sizes, budgets = g.baseline_sizes, g.all_budgets
    save, law = decide(rows, sizes, budgets, envelope.savings_rows(rows, sizes, budgets))
    write_csv(results / f"savings{g.stem}.csv", save, SAVINGS_COLUMNS)
    plot(g, rows, results / f"frontier{g.stem}.png", law)
    page = render(g, rows, save, runs_made(results, g.stem), law)
    if docs is not None:
        atomic_write_text(docs / f"frontier{g.stem}.md", page)
    return page


def _made(results: Path, stem: str) -> Path:
    """Beside frontier<stem>.csv: the machine and the dates its rows were made on."""
    return results / f"frontier_runs{stem}.json"


def runs_made(results: Path, stem: str = "") -> str | None:
    """"<machine>, <first date> to <last date>" of the rows of frontier<stem>.csv in ``results`` (None: not
    recorded)."""
    import json

    path = _made(results, stem)
    if not path.is_file():
        return None
    made = json.loads(path.read_text())
    first, last = made["dates"]
    return f"{made['machine']}, {first if first == last else f'{first} to {last}'}"


def note_runs_made(results: Path, stem: str = "") -> None:
    """Record that rows were made now on this machine (extends the dates; a new machine is named beside)."""
    import json
    import time

    from bench.lib.runs import machine
    from common.io import atomic_write_json
    from common.ownership import WRITTEN_BY

    path, today, here = _made(results, stem), time.strftime("%Y-%m-%d", time.gmtime()), machine()
    made = json.loads(path.read_text()) if path.is_file() else {"machine": here, "dates": [today, today]}
    if here not in made["machine"].split("; "):
        made["machine"] += f"; {here}"
    made["dates"] = [min(made["dates"][0], today), max(made["dates"][1], today)]
    atomic_write_json(path, {WRITTEN_BY: "growtrain python -m bench.frontier", **made})


MARK = {"=": "", ">=": "≥ ", "<=": "≤ ", "~": "~ "}


def _pct(row: dict[str, Any], axis: str) -> str:
    """"mean% [lo, hi]": the bootstrap's percentile interval, each end marked when it is a bound (a description of
    the spread: it decides nothing)."""
    ci = MARK[row[f"{axis}_ci_bound"]]
    return (f"{MARK[row[f'{axis}_bound']]}{100 * float(row[f'{axis}_saved_mean']):.1f}% "
            f"[{ci}{100 * float(row[f'{axis}_saved_lo']):.1f}, {ci}{100 * float(row[f'{axis}_saved_hi']):.1f}]")


def _t_pct(row: dict[str, Any]) -> str:
    """"mean% [lo, hi]": the FLOPs saving with the Welch test's interval propagated to it; bold where the rule
    finds a saving (``verdict.saves``)."""
    from bench.lib.verdict import saves

    if row.get("flops_saved_t_lo") in (None, ""):
        return _pct(row, "flops").split(" [")[0]
    lo, hi = MARK[row["flops_t_lo_bound"]], MARK[row["flops_t_hi_bound"]]
    text = (f"{MARK[row['flops_bound']]}{100 * float(row['flops_saved_mean']):.1f}% "
            f"[{lo}{100 * float(row['flops_saved_t_lo']):.1f}, {hi}{100 * float(row['flops_saved_t_hi']):.1f}]")
    return f"**{text}**" if saves(row) else text


def _law_pct(row: dict[str, Any] | None) -> str:
    """The saving against the fitted law ("~": the law extrapolated past its budgets)."""
    if row is None or row.get("law_flops_saved") in (None, ""):
        return ""
    return f"{MARK[row['law_flops_bound']]}{100 * float(row['law_flops_saved']):.1f}%"


def _verdict(row: dict[str, Any] | None) -> str:
    """The rule's verdict, and each test's where there are two (the hull's and the law's)."""
    from bench.lib.verdict import INELIGIBLE

    if row is None or not row.get("verdict"):
        return ""
    if row["verdict"] == INELIGIBLE or row.get("verdict_law") in (None, "") or row["verdict_law"] == row["verdict_hull"]:
        return row["verdict"]
    return f"{row['verdict']} (hull: {row['verdict_hull']}; law: {row['verdict_law']})".replace(" either way;", ";")


HULL_WHY = (
    "**The hull, and a fitted law beside it.** The envelope is the lower convex hull in (log FLOPs, log validation "
    "loss) of the tuned cells (reference seeds), after dropping every cell that a cheaper cell matches or beats: a "
    "true compute-optimal curve only falls with compute and is convex in those coordinates, so a measured cell "
    "above the chord of its neighbours is a flat or noisy stretch, or a budget where the size grid missed the best "
    "size. The hull passes only through measured cells and never extrapolates, but its reading depends on which "
    "cells are near it; a fitted L(C) = E + A·C^-a through the best tuned cell of each budget is smooth but decided "
    "by its form where the curve flattens. So each is read, and a verdict stands only where the two agree.")
RULE = (
    "**The rule** (bench/lib/verdict.py, fixed before the runs that settle the deciding cells reported): a cell is "
    "eligible with 2+ seeds in the method's arm and in every reference cell its value is read on. Its test is a "
    "Welch t test of the test-loss gap at equal FLOPs (the method's seeds against the reference's, the reference "
    "read between its one or two cells with their pooled seed variance), one-sided at 2.5% in each direction, with "
    "Holm's correction over the grid's eligible cells of that reference; against the envelope it is run twice, on "
    "the hull and on the fitted law (whose own error replaces the cells'). A method **saves** (bold) only where both "
    "find its gap below 0, and **loses** only where both find it above; every other eligible cell is \"no evidence "
    "either way\". Its false-positive rate is measured on null data with this estimator (`python -m "
    "bench.frontier.false_positives`, and in the test suite); the interval beside a saving is the test's, carried to the FLOPs "
    "axis. The percentile bootstrap of earlier pages stays beside it as a description of the spread, labelled so: "
    "with 3 method seeds against 2 reference seeds it lies above 0 in several times 2.5% of null experiments.")


def _gap(row: dict[str, Any] | None) -> str:
    """A savings row's test-loss gap at equal FLOPs with the Welch test's interval, "mean [lo, hi]"."""
    if row is None or row.get("gap_t_lo") in (None, ""):
        return envelope.gap_text(row)
    return f"{float(row['loss_gap_mean']):+.3f} [{float(row['gap_t_lo']):+.3f}, {float(row['gap_t_hi']):+.3f}]"


def render(g: Any, rows: list[dict[str, Any]], save: list[dict[str, Any]], made: str | None = None,
           law: Any = None) -> str:
    """The Markdown page: protocol, envelope, savings, zero-shot, the LR sweep. ``made``: "<machine>, <dates>"
    of the runs (``runs_made``), None when not recorded; ``law``: the fitted envelope (bench.lib.verdict.Law)."""
    from bench.lib.verdict import counts
    from common.table import format_table

    if not rows:
        return "# The compute-optimal frontier\n\nNo run has finished yet: run `python -m bench.frontier`.\n"
    sizes, budgets = g.baseline_sizes, g.all_budgets
    loads = [float(r["load1"]) for r in rows if r.get("load1") is not None]
    out = [f"# The compute-optimal frontier{', ' + g.about if g.about else ''}: every method against the best "
           "baseline at each budget", "",
           f"Generated by `{CMD}{_flag(g)} --report` from `bench/results/frontier{g.stem}.csv` ({len(rows)} runs); "
           "protocol in the "
           "module docstrings of bench/frontier/run.py and bench/lib/envelope.py. Losses are on the bundled "
           f"corpus: validation over the whole validation split{g.split_note}, **test over the whole "
           f"test split{g.split_note.replace(' of 128 tokens', '')}, which nothing was tuned on**. LRs and the envelope's size are chosen on "
           f"validation (seed 0), and **reference values are means over seeds 1-2 only** (seed 0 chose the LR, and over the "
           "tuned cells it tests better than the other seeds: the selection, not the LR); savings are at equal test "
           "loss, the mean over the method's seeds, decided by the rule below; a percentile bootstrap that resamples "
           f"the seeds of both arms ({envelope.BOOTSTRAP} draws, RNG seed {envelope.RNG_SEED}) describes their "
           f"spread beside it. Runs made on {made or 'a machine not recorded'}, "
           "two at a time, one thread each; load average "
           f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f} at the runs' starts (each row keeps its own). "
           "A wall-clock saving is evidence only where the method's rows and its reference's were timed together "
           "(`--retime SIZE` runs a size's reference rows again for that), and indicative otherwise; FLOPs are "
           "exact.", "", HULL_WHY, "", RULE, ""]
    k, n = counts(save)
    ks, ns = counts(save, "same_size")
    out += [f"**By the rule: {k} of {n} eligible cells save FLOPs against the compute-optimal envelope** (the hull "
            f"and the fitted law agreeing, Holm over {n}); against the target trained directly {ks} of {ns}. "
            + (f"The fitted law: {law.text()}." if law is not None else "No law is fitted (fewer than 4 budgets)."),
            ""]
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
    out += ["## The baseline: tuned LR per size and budget, and the envelope", "",
            "Test loss (ref.): mean [min, max] over the reference seeds (1-2); seed 0's, which chose the LR, beside "
            "it. **on it**: the cell is on the envelope in FLOPs (the lower convex hull of the cells' validation "
            "losses; a cell above the chord of its neighbours, or not below a cheaper cell, is off it).", "",
            format_table(env), ""]
    for target in sorted({r["target"] for r in save}):
        part = [r for r in save if r["target"] == target]
        table = []
        for key in sorted({(r["method"], r["variant"], r["budget"]) for r in part}, key=lambda k: (k[2], k[0], k[1])):
            by = {r["reference"]: r for r in part if (r["method"], r["variant"], r["budget"]) == key}
            any_row = next(iter(by.values()))
            table.append({"variant": key[1], "budget": key[2],
                          "seeds (method / ref.)": f"{any_row['seeds']} / {by.get('envelope', any_row)['reference_seeds']}",
                          "test loss": round(any_row["test_loss_mean"], 4),
                          "tokens/param": round(any_row["tokens_per_param"], 3),
                          "tokens vs baseline": "" if any_row["tokens_vs_baseline"] is None
                          else f"{any_row['tokens_vs_baseline']:.2f}x",
                          "FLOPs saved vs envelope (hull)": _t_pct(by["envelope"]) if "envelope" in by else "",
                          "vs the fitted law": _law_pct(by.get("envelope")),
                          "verdict vs envelope": _verdict(by.get("envelope")),
                          "test loss vs envelope, equal FLOPs": _gap(by.get("envelope")),
                          "bootstrap (description)": _pct(by["envelope"], "flops") if "envelope" in by else "",
                          "wall saved vs envelope (bootstrap)": _pct(by["envelope"], "wall") if "envelope" in by
                          else "",
                          "FLOPs saved vs same size": _t_pct(by["same_size"]) if "same_size" in by else "",
                          "verdict vs same size": _verdict(by.get("same_size")),
                          "test loss vs same size, equal FLOPs": _gap(by.get("same_size"))})
        out += [f"## Savings, target model {target}", "",
                "Mean over the method's seeds [the Welch test's 95% interval, carried to the FLOPs axis]; negative: "
                "the reference reaches that test loss with less. ≥ / ≤: the method's loss (or an end of the interval) "
                "lies outside the reference's range, so only a bound is known; ~: bounds of both directions mixed, or "
                "against the law, a reading past its budgets. **Bold**: a saving by the rule (the hull's and the law's "
                "tests agree, Holm-corrected). Verdict: saves / loses / no evidence either way, or not eligible (fewer "
                "than 2 seeds in an arm). Seeds: the method's / the fewest of the envelope's cells it is read between. "
                "Test loss vs envelope (vs same size), equal FLOPs: the method's test loss minus the reference's at the "
                "method's FLOPs, mean [Welch 95% interval]. Bootstrap (description): the earlier pages' percentile "
                "interval, which decides nothing (its false-positive rate at these seed counts is far above 2.5%).",
                "",
                format_table(table), ""]
    zs = zeroshot_rows(rows)
    if zs:
        out += ["## Zero-shot (seed 0, at the tuned LR)", "",
                format_table([{"method": r["method"], "variant": r["variant"], "size": f"{r['layers']}x{r['width']}",
                               "budget": r["budget"], "lr": r["lr"], "test loss": round(float(r["test_loss"]), 4),
                               "LAMBADA acc": round(float(r["lambada_acc"]), 4),
                               "LAMBADA ppl": f"{float(r['lambada_ppl']):.4g}",
                               "WikiText-2 word ppl": f"{float(r['wikitext2_word_ppl']):.4g}",
                               "PTB word ppl": f"{float(r['ptb_word_ppl']):.4g}"}
                              for r in sorted(zs, key=lambda r: float(r["test_loss"]))]), ""]
    for c, table in checks_tables(g, rows):
        several = len(c.factors) > 1
        cell = f"{c.size[0]}x{c.size[1]} at budget {c.budget}"
        out += [f"## Tuning: each method's LR, {cell}" if several else f"## Tuning: {' / '.join(c.variants)}, {cell}",
                "", f"Validation loss, mean [min, max] over seeds {', '.join(map(str, c.seeds))} (the number run, "
                f"where fewer), at {'each factor of ' if several else ''}the size's tuned baseline LR "
                f"({envelope.tuned_lr(rows, c.size, c.budget):g}). **Bold**: the lowest "
                f"{'of each method' if several else 'of the variants'}, compared on the seeds they all ran (paired). "
                "Only the rows at 1x enter the savings above.",
                "", format_table(table), ""]
    out += [f"![test loss vs FLOPs](../../bench/results/frontier{g.stem}.png)", ""]
    return "\n".join(out)


def zeroshot_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with zero-shot results that are a method's or a size's result: seed 0 at its cell's tuned LR (an LR
    check's other LRs are not, nor rows zero-shot before bench.frontier planned zero-shot at the tuned LR only)."""
    return [r for r in rows if r.get("lambada_acc") not in (None, "") and int(r["seed"]) == envelope.CHOOSER_SEED
            and float(r["lr"]) == envelope.tuned_lr(rows, envelope.size_of(r), int(r["budget"]))]


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


def plot(g: Any, rows: list[dict[str, Any]], path: Path, law: Any = None) -> None:
    """Test loss vs training FLOPs and wall-clock: each size's tuned baseline, the envelope, the fitted law (FLOPs
    only), every method (mean over seeds, bars from min to max)."""
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, budgets = g.baseline_sizes, g.all_budgets
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    colors, markers = plt.cm.tab10.colors, "osD^v<>PX*"
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in envelope.method_rows(rows):  # (an LR check's rows at another LR are not the method's)
        groups.setdefault((r["variant"], envelope.size_of(r)), []).append(r)
    for ax, axis, label in zip(axes, ("flops", "wall_s"), ("training FLOPs", "training wall-clock (s)")):
        for i, s in enumerate(sizes):
            curve = envelope.same_size_curve(rows, s, budgets, axis)
            if curve:
                ax.plot([c for _, c in curve], [lo for lo, _ in curve], ":", color="grey", lw=1,
                        marker=markers[i % len(markers)], ms=4, label=f"baseline {s[0]}x{s[1]} (tuned LR)")
        env = envelope.envelope_curve(rows, sizes, budgets, axis)
        if env:
            ax.plot([c for _, c in env], [lo for lo, _ in env], "k-", lw=2.5, label="envelope (best size per budget)")
        if law is not None and axis == "flops":
            lo, hi = min(c for c, _ in law.points), max(c for c, _ in law.points)
            xs = [lo * (hi / lo) ** (i / 40) for i in range(41)]
            ax.plot(xs, [law.loss(x) for x in xs], "--", color="purple", lw=1.5, label="fitted law E + A·C^-a")
        variants = sorted({v for v, _ in groups})
        for (variant, size), runs in sorted(groups.items()):
            # colour: the variant; marker: the target size (a filled circle is the default target)
            i = variants.index(variant)
            shape = "o" if size == g.target else "s" if size == sizes[0] else "^"
            labelled = False
            for b in budgets:
                at = [r for r in runs if int(r["budget"]) == b]
                if not at:
                    continue
                x, ys = mean(float(r[axis]) for r in at), [float(r["test_loss"]) for r in at]
                y = mean(ys)
                ax.errorbar([x], [y], yerr=[[y - min(ys)], [max(ys) - y]], fmt=shape, color=colors[i % len(colors)],
                            ms=5, capsize=2, mfc=colors[i % len(colors)] if size == g.target else "none",
                            label=None if labelled else f"{variant} ({size[0]}x{size[1]})")
                labelled = True
        ax.set_xscale("log")
        ax.set(xlabel=label, ylabel="test loss (mean over seeds, bars min-max)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def tracker_entries(g: Any, rows: list[dict[str, Any]], results: Path, root: Path) -> list:
    """For ``--report_to``: each row as a W&B run in the group of its cell (``frontier<stem>/<size>@<budget>``),
    with its training curve where its run folder is under ``root``; a method's run carries its cell's savings
    (mean and interval, against the envelope and the same-size baseline); and one run of the results (the
    savings table and the plot)."""
    import csv

    from bench.lib.tracking import Entry, number, train_curve

    bench = f"frontier{g.stem}"
    with open(results / f"savings{g.stem}.csv", newline="") as f:
        save = [{k: number(v) for k, v in r.items()} for r in csv.DictReader(f)]
    out = []
    for r in rows:
        size, b = f"{r['layers']}x{r['width']}", int(r["budget"])
        name = f"{bench}/{r['variant'] if r['method'] != 'baseline' else 'baseline'}-{size}-lr{float(r['lr']):g}-" \
               f"budget{b}-seed{r['seed']}"
        summary = {k: r.get(k) for k in ("val_loss", "test_loss", "flops", "tokens", "params", "tokens_per_param",
                                         "wall_s", "steps", "code_version")}
        for s in save:
            if (s["variant"], s["target"], int(s["budget"])) == (r["variant"], size, b):
                for axis in ("flops", "wall"):
                    for part in ("mean", "lo", "hi"):
                        summary[f"{s['reference']}/{axis}_saved_{part}"] = s[f"{axis}_saved_{part}"]
        out.append(Entry(name=name, group=f"{bench}/{size}@{b}", config={k: r[k] for k in (
            "method", "variant", "layers", "width", "lr", "budget", "budget_flops", "seed")},
            summary=summary, history=train_curve(root / r["key"]), tags=(r["method"], f"budget-{b}")))
    out.append(Entry(name=f"{bench}/results", group=bench, tables={"savings": save},
                     images={"frontier": results / f"frontier{g.stem}.png"}, tags=("results",)))
    return out
