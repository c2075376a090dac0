"""What the frontier writes from its rows: savings.csv (the deciding rule's verdicts) and frontier.png.

Both come from ``bench/results/frontier.csv`` through bench/lib/envelope.py and bench/lib/verdict.py; a re-run of
``python -m bench.frontier --report`` rewrites them from the rows alone, and ``python -m bench.pages`` renders
docs/results/frontier.md from them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from statistics import mean
from typing import Any

from bench.lib import envelope
from bench.lib.rows import SAVINGS_COLUMNS, read_savings, write_csv
from bench.lib.runs import machine
from bench.lib.tracking import Entry, train_curve
from bench.lib.verdict import LOSES, counts, decide
from common.io import atomic_write_json
from common.ownership import WRITTEN_BY

CMD = "python -m bench.frontier"


def report(g: Any, rows: list[dict[str, Any]], results: Path) -> str:
    """Write ``results/savings<stem>.csv`` (every method's saving, decided by the rule) and
    ``results/frontier<stem>.png``; return what was written and the rule's counts (the page is ``python -m
    bench.pages``'s, from these files).

    Raises:
        ValueError: with nothing written, when there are no rows, or when they give no saving while the savings
            file holds some (a damaged or truncated rows file must never empty the results it was read from).
    """
    sizes, budgets = g.baseline_sizes, g.all_budgets
    source, savings, figure = (results / f"frontier{g.stem}.csv", results / f"savings{g.stem}.csv",
                               results / f"frontier{g.stem}.png")
    if not rows:
        said = "holds no finished run" if source.is_file() else "does not exist"
        raise ValueError(f"{source} {said}: nothing to report ({savings.name} and {figure.name} are left as they are)")
    save, law = decide(rows, sizes, budgets, envelope.savings_rows(rows, sizes, budgets))
    kept = _rows_in(savings)
    if not save and kept:
        raise ValueError(f"the rows of {source} give no saving; {savings} holds {kept} rows and is left as it is (as "
                         f"is {figure.name})")
    write_csv(savings, save, SAVINGS_COLUMNS, exact=True)
    plot(g, rows, figure, law)
    (k, n), (ks, ns) = counts(save), counts(save, "same_size")
    kl, ksl = counts(save, direction=LOSES)[0], counts(save, "same_size", LOSES)[0]
    return (f"wrote {savings} and {figure} ({len(rows)} runs): "
            f"{k} of {n} eligible cells save FLOPs against the envelope and {kl} lose, {ks} of {ns} save against the "
            f"target trained directly and {ksl} lose; the page: python -m bench.pages")


def _rows_in(path: Path) -> int:
    """How many rows a CSV file holds below its header (0 where there is no file)."""
    if not path.is_file():
        return 0
    return max(0, sum(1 for line in path.read_text(errors="replace").splitlines() if line.strip()) - 1)


def note_runs_made(results: Path, stem: str = "") -> None:
    """Record that rows were made now on this machine (extends the dates; a new machine is named beside)."""

    path, today, here = results / f"frontier_runs{stem}.json", time.strftime("%Y-%m-%d", time.gmtime()), machine()
    made = json.loads(path.read_text()) if path.is_file() else {"machine": here, "dates": [today, today]}
    if here not in made["machine"].split("; "):
        made["machine"] += f"; {here}"
    made["dates"] = [min(made["dates"][0], today), max(made["dates"][1], today)]
    atomic_write_json(path, {WRITTEN_BY: "growtrain python -m bench.frontier", **made})


def plot(g: Any, rows: list[dict[str, Any]], path: Path, law: Any = None) -> None:
    """Test loss vs training FLOPs and wall-clock: each size's tuned baseline, the envelope, the fitted law (FLOPs
    only; a sensitivity check, it decides nothing), every method (mean over seeds, bars from min to max)."""
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
            ax.plot(xs, [law.loss(x) for x in xs], "--", color="purple", lw=1.5,
                    label="fitted law E + A·C^-a (shown only)")
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

    bench = f"frontier{g.stem}"
    save = read_savings(results / f"savings{g.stem}.csv")  # each field checked: a damaged file is one line naming it
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
