"""The README's results block, docs/results/index.md and docs/results/vcycle_recipes.md, from bench/results/.

The README's block: two plain lines, then one table row per method and regime (the paper's claim, ours against the
same size and against the envelope, the regime, a verdict from ``saves``). index.md: the verdicts in full, one line
per method; every method beside its paper, cell by cell; the papers' tables; the recipe search; elastic pipelining;
AutoFreeze. vcycle_recipes.md: the recipe search's table as recorded. Sources, each written by the command beside it:
- bench/results/savings.csv and frontier.csv: every method against the compute-optimal baseline envelope and
  the same-size tuned baseline, at equal test loss, 3 budgets x 3 seeds (``python -m bench.frontier``).
- bench/results/vcycle_recipes.json: the V-cycle's recipe search (``python -m bench.claims.vcycle_recipes``),
  an older protocol (64 validation blocks, one untuned baseline size): how the default recipe was chosen.
- bench/results/elastic.json: the elastic-pipelining simulation (``python -m bench.speed.elastic``).
- bench/results/autofreeze.json, autofreeze_epochs.json, autofreeze_lm.json: AutoFreeze / AutoCache
  fine-tuning (``python -m bench.claims.autofreeze``, ``.autofreeze_epochs``, ``.autofreeze_lm``).
The papers' figures are from their abstracts and tables, as docs/<method>.md cite them. The paragraphs are
templates (bench/pages/templates/); this module computes the values, lines and tables that fill them.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path

from bench.lib import predictions
from bench.lib import verdict as rule
from bench.lib.envelope import CHOOSER_SEED, gap_text
from bench.lib.grid import FULL, LAYERS, regime
from bench.lib.rows import read_rows
from bench.lib.rows import read_savings as savings_csv  # (this module's read_savings reads the recipe search)
from bench.pages.frontier import LAYER_NAMES
from bench.pages.text import DOCS, README, RESULTS, ROOT, fill, splice
from common.table import format_table
from progressive.config import load_config
from progressive.config import registry as method_folders

PAGE, RECIPES_PAGE = DOCS / "index.md", DOCS / "vcycle_recipes.md"
FRONTIER_CMD = "python -m bench.frontier"
TARGET = "4x128"  # configs/default.yaml's model: the headline's target
BEGIN, END = "<!-- results:begin (python -m bench.pages) -->", "<!-- results:end -->"

SAVINGS_CMD = "python -m bench.claims.vcycle_recipes --train.eval_every 50 --results bench/results --docs docs/results"
ELASTIC_CMD = "python -m bench.speed.elastic --results bench/results"
AUTOFREEZE_CMD = "python -m bench.claims.autofreeze --results bench/results"

# the recipe search's variants -> what they are (its own names stay in docs/results/vcycle_recipes.md)
LABELS = {
    "vcycle_a0.5_Ea0.1_coarse1.0": "V-cycle, this project's default (α 0.5, E_a 10%, coarse level 100%)",
    "vcycle_paper": "V-cycle, the paper's GPT recipe (α 0.25, E_a 5%, coarse 50%)",
    "vcycle_alpha0.5": "one knob: α 0.5",
    "vcycle_Ea0.1": "one knob: E_a 10%",
    "vcycle_coarse0.8": "one knob: coarse level 80%",
    "vcycle_coarse0.3": "one knob: coarse level 30%",
    "vcycle_coarse_lr2x": "one knob: coarse LR 2x instead of 4x",
    "vcycle_identity_a1": "one knob: exact up-step (depth identity, α 1)",
    "vcycle_asym_identity_a1": "exact up-step + asymmetric width split",
    "vcycle_asym_a0.5": "α 0.5 + asymmetric width split",
    "vcycle_reset": "one knob: fresh AdamW at level changes (the papers' restarts)",
    "vcycle_K3": "K = 3 levels",
    "vcycle_a0.5_Ea0.1": "combined: α 0.5 + E_a 10%",
    "vcycle_a0.5_Ea0.1_coarse0.8": "combined: α 0.5 + E_a 10% + coarse 80%",
    "apollo": "Apollo in proportion (1 → 2 → 4 layers, LVPS)",
    "stack": "stacking (2 → 4 layers at 30%, no sampling)",
}
PAPERS = {
    "vcycle": "BERT-Base 19.0%, GPT-Base 24.1%, DeiT-B 27.1%, BERT-Large (3 levels) 51.6% FLOPs saved",
    "apollo": "BERT-Base 45.2%, GPT-2-Base 57.6% FLOPs saved (the authors' README figure)",
    "stack": "StackBERT and G_stack are the baselines Apollo's paper compares with",
    "autofreeze": "freezing alone 0.95x; + AutoPipe + AutoCache 1.26x (ViT-B, ImageNet, Fig. 9)",
    "elastic": "ViT-B ImageNet 2.83x, CIFAR-100 2.44x, BERT-Large SQuAD 2.10x (Table 1)",
}


def read_savings(path: Path | None = None) -> tuple[str, list[dict], dict[str, dict[int, dict]]]:
    """(the search's note, its rows, {variant: {budget: row}}) from bench/results/vcycle_recipes.json."""
    data = json.loads((path or RESULTS / "vcycle_recipes.json").read_text())
    rows: dict[str, dict[int, dict]] = {}
    for row in data["results"]:
        rows.setdefault(row["variant"], {})[int(row["budget"])] = row
    return data["note"], data["results"], rows


def _cell(v: object) -> str:
    """A value as common.table.format_table writes it (floats with 4 significant digits)."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _json(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


Frontier = dict[tuple[str, str], dict[int, dict[str, dict]]]  # {(method, variant): {budget: {reference: row}}}


def read_frontier(path: Path | None = None, target: str = TARGET) -> Frontier:
    """{(method, variant): {budget: {reference: row}}} of bench/results/savings.csv at ``target``."""
    path = path or RESULTS / "savings.csv"
    out: Frontier = {}
    for r in savings_csv(path):  # each field checked: a damaged file is one line naming it
        if r["target"] == target:
            out.setdefault((r["method"], r["variant"]), {}).setdefault(int(r["budget"]), {})[r["reference"]] = r
    return out


def baseline_sizes(path: Path | None = None) -> list[str]:
    """The baseline's sizes in frontier.csv ("2x16", ...), smallest first: the envelope is over all of them."""
    path = path or RESULTS / "frontier.csv"
    if not path.is_file():
        return []
    sizes = {(int(r["layers"]), int(r["width"])) for r in read_rows(path)
             if r["method"] == "baseline" and int(r["seed"]) != CHOOSER_SEED}
    return [f"{a}x{b}" for a, b in sorted(sizes, key=lambda s: (s[0] * s[1], s))]


def envelope_targets(path: Path | None = None) -> list[str]:
    """The targets of savings.csv other than the default one: the sizes the envelope chose at some budget when the
    methods ran there (smallest first)."""
    path = path or RESULTS / "savings.csv"
    if not path.is_file():
        return []
    sizes = {r["target"] for r in savings_csv(path)} - {TARGET}
    return sorted(sizes, key=lambda t: tuple(int(x) for x in t.split("x")))


MARK = {"=": "", ">=": "≥", "<=": "≤", "~": "~"}


def _saved(r: dict, axis: str = "flops") -> str:
    """"+26% [+23, +28]": a savings row's mean and 95% interval on ``axis``, each marked when it is a bound: in
    FLOPs the deciding rule's (bench/lib/verdict.py: the Welch test's, carried to the saving, at the levels Holm
    compared it with where it was judged) where savings.csv has it, else the bootstrap's."""
    if axis == "flops" and r.get("flops_saved_t_lo") not in (None, ""):
        k = "holm" if r.get("flops_saved_holm_lo") not in (None, "") else "t"
        lo, hi = MARK[r[f"flops_{k}_lo_bound"]], MARK[r[f"flops_{k}_hi_bound"]]
        return (f"{MARK[r['flops_bound']]}{_p(r['flops_saved_mean'])}% "
                f"[{lo}{_p(r[f'flops_saved_{k}_lo'])}, {hi}{_p(r[f'flops_saved_{k}_hi'])}]")
    ci = MARK[r[f"{axis}_ci_bound"]]
    return (f"{MARK[r[f'{axis}_bound']]}{_p(r[f'{axis}_saved_mean'])}% "
            f"[{ci}{_p(r[f'{axis}_saved_lo'])}, {ci}{_p(r[f'{axis}_saved_hi'])}]")


def _p(fraction: str | float) -> str:
    """A fraction as a signed percentage, whole (one decimal where the whole would read as 0)."""
    v = 100 * float(fraction)
    return f"{v:+.0f}" if abs(v) >= 0.5 or v == 0 else f"{v:+.1f}"


def saves(row: dict) -> bool:
    """Whether a savings row (bench/results/savings*.csv) is a saving: the one decision every verdict on these pages
    reads (the README's table, its summary, the verdict lines): the deciding rule's (bench/lib/verdict.py: a Welch
    test of the loss gap against the hull at every LR its cells ran, Holm-corrected)."""
    return rule.saves(row)


def loses(row: dict) -> bool:
    """Whether the deciding rule finds a savings row a loss (the reference gets there with less, at every LR the
    method ran)."""
    return rule.loses(row)


def _where(row: dict) -> str:
    """What the deciding rule (bench/lib/verdict.py) says of a savings row."""
    holm = f" (Holm over {int(float(row['holm_n']))} cells)" if row.get("holm_n") not in (None, "") else ""
    return {rule.SAVES: f"a saving by the rule{holm}", rule.LOSES: f"a loss by the rule{holm}",
            rule.INELIGIBLE: "one seed: no verdict"}.get(row.get("verdict"),
                                                         f"no evidence either way by the rule{holm}")


def _pcts(by_budget: dict[int, dict[str, dict]], ref: str, axis: str) -> str:
    """"a / b / c": the saving against ``ref`` on ``axis`` at each budget, mean [95% interval], with bound markers."""
    return " / ".join("–" if (r := by_budget[b].get(ref)) is None else _saved(r, axis) for b in sorted(by_budget))


def _seeds(by_budget: dict[int, dict[str, dict]]) -> str:
    return "/".join(map(str, sorted({int(r["seeds"]) for b in by_budget.values() for r in b.values()})))


def _frontier_cell(by_budget: dict[int, dict[str, dict]] | None,
                   grown: dict[str, dict[int, dict[str, dict]]] | None = None) -> str:
    """"FLOPs saved vs the envelope a / b / c (wall x / y / z); vs the same size d / e / f" over the budgets, and
    for each size in ``grown`` (the envelope's sizes used as the target) its saving against that size trained
    directly."""
    if not by_budget:
        return f"not run yet (`{FRONTIER_CMD}`)"
    budgets = sorted(by_budget)
    text = (f"vs the envelope {_pcts(by_budget, 'envelope', 'flops')} FLOPs ({_pcts(by_budget, 'envelope', 'wall')} "
            f"wall-clock); vs the tuned {TARGET} baseline {_pcts(by_budget, 'same_size', 'flops')} FLOPs, at budgets "
            f"{' / '.join(map(str, budgets))} (seeds: {_seeds(by_budget)})")
    for size, rows in (grown or {}).items():
        if rows:
            text += (f"; grown into {size}, vs {size} trained directly "
                     f"{_pcts(rows, 'same_size', 'flops')} FLOPs at budgets {' / '.join(map(str, sorted(rows)))} "
                     f"(seeds: {_seeds(rows)})")
    return text


def _pct(cell: str) -> str:
    return f"{cell}%" if re.match(r"^[≥≤~ ]*-?\d", cell) else cell


FRONTIER_ROWS = [  # (label, (method, variant), the paper's figure)
    ("V-cycle (multi-level), this project's recipe", ("vcycle", "vcycle"), PAPERS["vcycle"]),
    ("V-cycle, the paper's recipe", ("vcycle", "vcycle_paper"), "(same)"),
    ("Apollo, the authors' optimizer rule", ("apollo", "apollo_authors"), PAPERS["apollo"]),
    ("Apollo, `first_copy`", ("apollo", "apollo_first_copy"), "(same)"),
    ("Apollo, `mapped`", ("apollo", "apollo_mapped"), "(same)"),
    ("StackBERT-style stacking", ("stacking", "stackbert"), PAPERS["stack"]),
    ("G_stack-style stacking", ("stacking", "gstack"), "(same)"),
    ("V-cycle grown with G_stack's stacking (no paper)", ("vcycle", "vcycle_gstack"), "none: a combination"),
]


def headline(frontier: dict, elastic: dict | None, autofreeze: dict | None,
             grown: dict[str, Frontier] | None = None) -> str:
    """The README's table: each method, the paper's figure, ours, and the command that measured it; ``grown``:
    {size: the frontier at that target} for the envelope's sizes."""
    out = ["| method | the paper | ours, at this repository's small scale (CPU) | measured by |", "|---|---|---|---|"]
    for i, (label, key, paper) in enumerate(FRONTIER_ROWS):
        cell = _frontier_cell(frontier.get(key), {s: f.get(key) for s, f in (grown or {}).items()})
        out.append(f"| {label} | {paper} | {cell} | "
                   f"{f'`{FRONTIER_CMD}`' if i == 0 else '(same)'} |")
    if autofreeze:
        for r, plain in _autofreeze_pairs(autofreeze):
            out.append(fill("headline_autofreeze", task=r["task"], paper=PAPERS["autofreeze"],
                            speedup=f"{r['speed-up (wall)']:.2f}x", flops=f"{r['FLOPs vs plain']:.2f}x",
                            acc=f"{r['dev acc % (mean)']:.1f}", plain=f"{plain['dev acc % (mean)']:.1f}",
                            command=AUTOFREEZE_CMD))
    else:
        out.append(fill("headline_autofreeze_none", paper=PAPERS["autofreeze"], command=AUTOFREEZE_CMD))
    out += _autofreeze_more_rows(_json("autofreeze_epochs"), _json("autofreeze_lm"))
    if elastic:
        vit = next(r for r in elastic["results"] if r["model"].startswith("ViT-B"))
        s = vit["speedup"]
        out.append(fill("headline_elastic", paper=PAPERS["elastic"], device=elastic["device"], command=ELASTIC_CMD,
                        speedup=f"{s[next(k for k in s if k.startswith('all four (authors'))]:.2f}x"))
    return "\n".join(out)


def _autofreeze_more_rows(epochs: dict | None, lm: dict | None) -> list[str]:
    """README rows of the multi-epoch ViT bench and the GPT-2 fine-tuning bench (when recorded)."""
    out = []
    if epochs:
        r = {x["variant"]: x for x in epochs["results"]}
        rel = r.get("relative")
        c = r["argmin+cache"]
        out.append(fill(
            "headline_autofreeze_epochs", paper=PAPERS["autofreeze"], speedup=f"{c['speed-up (wall)']:.2f}x",
            plain_speedup=f"{r['argmin']['speed-up (wall)']:.2f}x", hits=f"{100 * c['cache hits (run)']:.0f}",
            acc=f"{c['dev acc %']:.1f}", plain_acc=f"{r['plain']['dev acc %']:.1f}",
            decided=r["argmin"]["criterion decided"], seeds=len(epochs["seeds"]), command=epochs["command"],
            relative=(f", the relative rule {rel['criterion decided']} ({rel['dev acc %']:.1f}%, "
                      f"{rel['speed-up (wall)']:.2f}x)" if rel else "")))
    if lm:
        r = {x["variant"]: x for x in lm["results"]}
        cells = "; ".join(f"{v}: {r[v]['FLOPs saved at equal loss']} FLOPs, {r[v]['wall saved at equal loss']} "
                          f"wall-clock (decided {r[v]['criterion decided']})" for v in ("bound", "argmin", "relative")
                          if v in r)
        pre = lm.get("pretraining") or []
        pre_cell = (f"; pre-training from scratch instead: {', '.join(str(x['FLOPs saved vs same size']) for x in pre)}"
                    " FLOPs saved vs the tuned same-size baseline" if pre else "")
        out.append(fill("headline_autofreeze_lm", paper=PAPERS["autofreeze"], cells=cells, seeds=len(lm["seeds"]),
                        pretraining=pre_cell, command=lm["command"]))
    return out


def savings_table(savings: dict) -> str:
    cols = ["final val loss", "FLOPs", "wall s", "FLOPs saved %", "wall saved %"]
    out = ["| method | budget (steps) | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for variant, by_budget in savings.items():
        for b in sorted(by_budget):
            r = by_budget[b]
            name = "baseline (frontier)" if variant == "baseline" else LABELS.get(variant, variant)
            out.append(f"| {name} | {b} | " + " | ".join(_pct(r[c]) if "saved" in c else _cell(r[c]) for c in cols)
                       + " |")
    return "\n".join(out)


def elastic_table(elastic: dict) -> str:
    models = [r["model"] for r in elastic["results"]]
    variants = list(elastic["results"][0]["speedup"])
    out = ["| variant (simulated speed-up vs fixed GPipe) | " + " | ".join(models) + " |",
           "|---|" + "---|" * len(models)]
    for v in variants:
        out.append(f"| {v} | " + " | ".join(f"{r['speedup'][v]:.2f}x" for r in elastic["results"]) + " |")
    out.append("| the paper | " + " | ".join(r["paper"] for r in elastic["results"]) + " |")
    return "\n".join(out)


def autofreeze_table(autofreeze: dict) -> str:
    cols = ["task", "variant", "dev acc % (mean)", "spread", "samples/s", "wall s", "FLOPs vs plain",
            "speed-up (wall)", "frozen at end", "cache hit rate"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in autofreeze["results"]:
        out.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- the README's verdicts

VERDICT_GROUPS = [  # (method, its variants on the frontier)
    ("V-cycle (multi-level)", [("vcycle", "vcycle"), ("vcycle", "vcycle_paper")]),
    ("Apollo", [("apollo", "apollo_authors"), ("apollo", "apollo_first_copy"), ("apollo", "apollo_mapped")]),
    ("Stacking (StackBERT-, G_stack-style)", [("stacking", "stackbert"), ("stacking", "gstack")]),
    ("V-cycle grown with G_stack's stacking (no paper)", [("vcycle", "vcycle_gstack")]),
    *method_folders.groups(),  # every method folder's line (progressive/config/registry.py)
]
SHORT = {"vcycle": "this project's recipe", "vcycle_paper": "the paper's recipe", "apollo_authors": "the authors' rule",
         "apollo_first_copy": "first_copy", "apollo_mapped": "mapped", "stackbert": "StackBERT", "gstack": "G_stack",
         "vcycle_gstack": ""}
LINK = ""  # the verdict lines live on docs/results/index.md: their links are to its own sections
TASKS = {"bert": "BERT", "vit": "ViT"}


NOTES = {"vcycle": "a recipe searched on this setting"}  # what a reader must know beside a variant's figure


def _best(frontier: Frontier, keys: list[tuple[str, str]], ref: str) -> tuple[float, dict, str, int] | None:
    """(mean FLOPs saving, row, variant, budget) of the best cell of ``keys`` against ``ref`` (None: no cell)."""
    cells = [(float(r["flops_saved_mean"]), r, key[1], b) for key in keys
             for b, by in frontier.get(key, {}).items() if (r := by.get(ref))]
    return max(cells, key=lambda c: (c[0], c[3], c[2])) if cells else None


def _said(best: tuple[float, dict, str, int], several: bool, frontier: Frontier | None = None,
          keys: list[tuple[str, str]] = (), ref: str = "") -> str:
    """"+26% [+23, +28] at budget 300 (this project's recipe, ...; the paper's recipe there -17% [-34, -2])": a
    best cell with its interval, naming its variant when the method has several, and the others at that budget."""
    _, row, variant, budget = best
    text = f"{_saved(row)} at budget {budget}"
    if several:
        note = [SHORT[variant], *([NOTES[variant]] if variant in NOTES else [])]
        others = [f"{SHORT[k[1]]} there {_saved(r)}" for k in keys if k[1] != variant and frontier
                  and (r := frontier.get(k, {}).get(budget, {}).get(ref))]
        text += f" ({', '.join(note)}{'; ' + '; '.join(others) if others else ''})"
    return text


def _frontier_verdict(name: str, keys: list[tuple[str, str]], frontier: Frontier,
                      grown: dict[str, Frontier]) -> str:
    """One line: the method's regime, whether it beats the compute-optimal baseline (a saving by the deciding rule,
    bench/lib/verdict.py), its best cells with their intervals."""
    rows = [r for key in keys for by in frontier.get(key, {}).values() for r in by.values()]
    if not rows:
        return fill("verdict_method_none", method=name, command=FRONTIER_CMD)
    budgets = sorted({int(r["budget"]) for r in rows})
    tpp = [float(r["tokens_per_param"]) for r in rows]
    seeds = "/".join(map(str, sorted({int(r["seeds"]) for r in rows})))
    regime = fill("verdict_method_regime", target=TARGET, made=_made_of(TARGET), first=budgets[0], last=budgets[-1],
                  tpp=f"{min(tpp):.1f}-{max(tpp):.1f}", seeds=seeds)
    several = len(keys) > 1
    env, same = _best(frontier, keys, "envelope"), _best(frontier, keys, "same_size")
    wins = [r for r in rows if r["reference"] == "envelope" and saves(r)]
    text = (fill("verdict_method_saves", wins=len(wins), best=_said(env, several, frontier, keys, "envelope"))
            if wins else fill("verdict_method_no_saving", best=_said(env, several)) if env else "no envelope measured")
    if same:
        text += fill("verdict_method_same", best=_said(same, several, frontier, keys, "same_size"),
                     where=_where(same[1]))
    for size, front in grown.items():
        if (g := _best(front, keys, "same_size")) is not None:
            e = _best(front, keys, "envelope")
            text += fill("verdict_method_grown", size=size, made=_made_of(size), best=_said(g, several),
                         where=_where(g[1]), envelope=f", and {_said(e, several)} against the envelope" if e else "")
    return fill("verdict_method", method=name, regime=regime, text=text, link=LINK)


def _made_of(size: str) -> str:
    """"1.33M parameters; the layers 64% of a step's FLOPs, the LM head 36%" for a size of the frontier's grid
    ("4x128"): FLOPs shares, what depth growth can make cheaper (the embeddings' parameters cost no FLOPs)."""
    r = regime(FULL, tuple(int(x) for x in size.split("x")))
    return (f"{r['params'] / 1e6:.2f}M parameters; the layers {100 * (1 - r['head_flops_share']):.0f}% of a step's "
            f"FLOPs, the LM head {100 * r['head_flops_share']:.0f}%")


def _overall(targets: dict[str, Frontier]) -> str:
    """The block's first line: whether any method saves compute against the envelope at any target and budget
    (``targets``: {target: its frontier}, every target of savings.csv)."""
    rows = [r for f in targets.values() for by in f.values() for refs in by.values()
            for r in refs.values() if r["reference"] == "envelope"]
    wins = [r for r in rows if saves(r)]
    if not rows:
        return f"- The frontier has not run yet (`{FRONTIER_CMD}`)."
    if wins:
        return fill("verdict_overall_wins", wins=len(wins), cells=len(rows))
    return fill("verdict_overall_none", cells=len(rows))



def _layers_verdict(path: Path | None = None) -> str | None:
    """The block's first line: the layer-dominated grid (``--grid layers``), where growth has the most room. Every
    method's saving against the envelope and against its target trained directly, at each budget run so far, best
    first, decided by the rule (bench/lib/verdict.py; "k of n eligible cells"), and the budgets still to run (None:
    nothing has run). The axis is tokens per parameter: the budgets differ in it, and nothing here varies the
    layers' share alone."""
    path = path or RESULTS / f"savings{LAYERS.stem}.csv"
    target = f"{LAYERS.target[0]}x{LAYERS.target[1]}"
    if not path.is_file():
        return None
    rows = [r for r in savings_csv(path) if r["target"] == target]
    if not rows:
        return None
    reg = regime(LAYERS, LAYERS.target)
    env = [r for r in rows if r["reference"] == "envelope"]
    eligible = [r for r in env if rule.eligible(r)]
    same_eligible = [r for r in rows if r["reference"] == "same_size" and rule.eligible(r)]
    wins, same_wins = [r for r in env if saves(r)], [r for r in same_eligible if saves(r)]

    def named(r: dict) -> str:
        return f"{LAYER_NAMES.get(r['variant'], r['variant'])} at {int(r['budget'])} steps"

    lost = [r for r in eligible if loses(r)]
    head = (fill("verdict_layers_saves", wins=len(wins), eligible=len(eligible), s="s" if len(wins) == 1 else "",
                 cells=", ".join(f"{named(r)}: {_saved(r)}{_gap_text(r)}" for r in wins))
            if wins else fill("verdict_layers_no_saving", eligible=len(eligible))) \
        + (f"; **{len(lost)} lose** ({', '.join(named(r) for r in lost)})" if lost else "")

    def said(r: dict | None) -> str:  # a cell's saving, and its verdict where the rule finds one
        if r is None:
            return "–"
        return _saved(r) + (f" {r['verdict']}" if r.get("verdict") in (rule.SAVES, rule.LOSES) else "")
    parts = []
    for b in sorted({int(r["budget"]) for r in rows}):
        at = {(r["variant"], r["reference"]): r for r in rows if int(r["budget"]) == b}
        names = sorted({v for v, _ in at}, key=lambda v: (-float(at.get((v, "envelope"), at.get((v, "same_size")))[
            "flops_saved_mean"]), v))  # ties (savings bounded at -100%) by name, not by a set's order
        one = next(iter(at.values()))
        cells = [f"{LAYER_NAMES.get(v, v)} {said(at.get((v, 'envelope')))} / {said(at.get((v, 'same_size')))}"
                 + _gap_text(at.get((v, "envelope"))) for v in names]
        tpp = float(one["tokens_per_param"]) / float(one["tokens_vs_baseline"] or 1)  # the target baseline's
        parts.append(fill("verdict_layers_budget", flops=f"{float(one['budget_flops']):.2g}", steps=b,
                          tpp=f"{tpp:.0f}", target=target, cells="; ".join(cells),
                          seeds="/".join(map(str, sorted({r["seeds"] for r in at.values()})))))
    todo = [b for b in LAYERS.budgets if b not in {int(r["budget"]) for r in rows}]
    tpps = [float(r["tokens_per_param"]) / float(r["tokens_vs_baseline"] or 1) for r in env]
    same_lost = [r for r in same_eligible if loses(r)]
    same = (f"{len(same_wins)} of {len(same_eligible)}" + (f" ({', '.join(named(r) for r in same_wins)})"
                                                           if same_wins else "")
            + (f", {len(same_lost)} lose ({', '.join(named(r) for r in same_lost)})" if same_lost else ""))
    return fill("verdict_layers", tpp=f"{min(tpps):.0f}-{max(tpps):.0f}", target=target,
                params=f"{reg['params'] / 1e6:.2f}M", layers=f"{100 * (1 - reg['head_flops_share']):.0f}",
                head=f"{100 * reg['head_flops_share']:.0f}", sizes=_shapes(),
                verdict=head, eligible=len(eligible), same=same, budgets=". ".join(parts),
                bound=fill("verdict_layers_bound") if any(r["flops_bound"] == ">=" for r in rows) else "",
                todo=f" Budgets {', '.join(map(str, todo))} not run yet." if todo else "")


def _gap_text(row: dict | None) -> str:
    """", Δ mean [lo, hi]" of a savings row's test-loss gap at equal FLOPs with the rule's (Welch) interval where
    savings.csv has it ("" where it has none)."""
    if row is not None and row.get("gap_t_lo") not in (None, ""):
        return (f", Δ {float(row['loss_gap_mean']):+.3f} [{float(row['gap_t_lo']):+.3f}, "
                f"{float(row['gap_t_hi']):+.3f}]")
    text = gap_text(row)
    return f", Δ {text}" if text else ""


def _autofreeze_pairs(autofreeze: dict) -> list[tuple[dict, dict]]:
    """(AutoFreeze's row, the plain fine-tuning row of the same task) for each task of the AutoFreeze bench."""
    rows = autofreeze["results"]
    return [(r, next(p for p in rows if p["task"] == r["task"] and p["variant"] == "plain"))
            for r in rows if r["variant"] == "autofreeze"]


def _autofreeze_verdict(autofreeze: dict | None, epochs: dict | None, lm: dict | None) -> str | None:
    """One line for AutoFreeze / AutoCache from the fine-tuning benches (None: none recorded)."""
    parts = []
    if autofreeze:
        for r, plain in _autofreeze_pairs(autofreeze):
            parts.append(fill("verdict_autofreeze_task", task=TASKS.get(r["task"], r["task"]),
                              speedup=f"{r['speed-up (wall)']:.2f}x", acc=f"{r['dev acc % (mean)']:.1f}",
                              plain=f"{plain['dev acc % (mean)']:.1f}"))
    if epochs:
        r = {x["variant"]: x for x in epochs["results"]}
        parts.append(fill("verdict_autofreeze_epochs", speedup=f"{r['argmin+cache']['speed-up (wall)']:.2f}x",
                          acc=f"{r['argmin+cache']['dev acc %']:.1f}", plain=f"{r['plain']['dev acc %']:.1f}"))
    if lm:
        best = max((x for x in lm["results"] if x["variant"] != "plain"),
                   key=lambda x: float(str(x["FLOPs saved at equal loss"]).split("%")[0].lstrip("≥≤~ ")))
        parts.append(fill("verdict_autofreeze_lm", saved=best["FLOPs saved at equal loss"], variant=best["variant"]))
    if not parts:
        return None
    return fill("verdict_autofreeze", parts="; ".join(parts), link=LINK)


def _elastic_verdict(elastic: dict | None) -> str | None:
    if not elastic:
        return None
    vit = next(r for r in elastic["results"] if r["model"].startswith("ViT-B"))
    s = vit["speedup"]
    return fill("verdict_elastic", model=vit["model"], device=elastic["device"], paper=vit["paper"], link=LINK,
                speedup=f"{s[next(k for k in s if k.startswith('all four (authors'))]:.2f}")


def verdicts(frontier: Frontier, grown: dict[str, Frontier], elastic: dict | None, autofreeze: dict | None) -> str:
    """The verdicts in full (docs/results/index.md): whether anything saves against the envelope, then one verdict
    line per method, with its regime and a link to its cells."""
    lines = [x for x in (_layers_verdict(),) if x]
    lines += [_overall({t: read_frontier(target=t) for t in [TARGET, *envelope_targets()]})]
    lines += [_frontier_verdict(name, keys, frontier, grown) for name, keys in VERDICT_GROUPS]
    lines += [x for x in (_autofreeze_verdict(autofreeze, _json("autofreeze_epochs"), _json("autofreeze_lm")),
                          _elastic_verdict(elastic)) if x]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the README's table

# The table's frontier rows: (method, the paper's claim, {grid: its rows there, each the variants that are this
# method in that row}). The default grid's V-cycle rows are its two recipes (its coarse-LR checks stay on the frontier
# pages); G_stack has a row per growth factor in the layer grid (this grid's 2x and the paper's 4x).
TABLE = [
    ("V-cycle", "19-27% (Base), 52% (BERT-Large)",
     {"default": [["vcycle", "vcycle_paper"]],
      "layers": [["vcycle_paper", "vcycle_coarse_lr2x", "vcycle_coarse_lr1x"]]}),
    ("Apollo", "45% (BERT-Base), 58% (GPT-2-Base)",
     {"default": [["apollo_authors", "apollo_first_copy", "apollo_mapped"]], "layers": [["apollo_authors"]]}),
    ("StackBERT-style stacking", "Apollo's paper's baseline",
     {"default": [["stackbert"]], "layers": [["stackbert"]]}),
    ("G_stack-style stacking", "Apollo's paper's baseline",
     {"default": [["gstack"]], "layers": [["gstack2"], ["gstack"]]}),
    ("V-cycle + G_stack", "none: a combination",
     {"default": [["vcycle_gstack"]], "layers": [["vcycle_paper_gstack"]]}),
]
VARIANT = {"vcycle": "own recipe", "vcycle_paper": "paper's recipe", "vcycle_coarse_lr2x": "coarse LR 2x",
           "vcycle_coarse_lr1x": "coarse LR 1x", "apollo_authors": "authors' rule", "apollo_first_copy": "first_copy",
           "apollo_mapped": "mapped", "gstack": "4x growth", "gstack2": "2x growth"}  # a method's variants
NAMED = {"gstack", "gstack2"}  # variants named even alone, beside the method: it grows by another factor in each grid


def _grids() -> dict[str, tuple[Path, str, int]]:
    """{grid: (its savings file, its target size, its vocabulary)}: the default grid (the main job's model) and the
    layer-dominated one."""

    vocab = load_config(ROOT / FULL.recipe).data.vocab_size
    return {"default": (RESULTS / "savings.csv", TARGET, vocab),
            "layers": (RESULTS / f"savings{LAYERS.stem}.csv", "x".join(map(str, LAYERS.target)),
                       int(dict(LAYERS.overrides).get("data.vocab_size", vocab)))}


def _shapes() -> str:
    """The baseline shapes the layer grid's envelope is over, from its rows (a cell enters it with a seed beyond the
    one that chose its LR): "1-8 layers at width 64 only" while one width has, else each width's depths ("" before
    any)."""
    path = RESULTS / f"frontier{LAYERS.stem}.csv"
    if not path.is_file():
        return ""
    sizes = {(int(r["layers"]), int(r["width"])) for r in read_rows(path)
             if r["method"] == "baseline" and int(r["seed"]) != CHOOSER_SEED}
    widths = sorted({w for _, w in sizes})
    depths = {w: sorted(n for n, ww in sizes if ww == w) for w in widths}
    span = {w: f"{d[0]}-{d[-1]}" if len(d) > 1 else f"{d[0]}" for w, d in depths.items()}
    if len(widths) == 1:
        return f"{span[widths[0]]} layers at width {widths[0]} only"
    return ", ".join(f"{span[w]} layers at width {w}" for w in widths)


def _savings(path: Path, target: str, variants: list[str]) -> list[dict]:
    """The savings rows of ``variants`` at ``target`` (both references, every budget)."""
    if not path.is_file():
        return []
    return [r for r in savings_csv(path) if r["target"] == target and r["variant"] in variants]


def verdict(rows: list[dict]) -> str:
    """The table's verdict on one method in one regime from its savings ``rows`` (both references), read through
    ``saves`` and ``loses`` only: a saving against the envelope first, then against the same size; then the cells
    that lose, against the envelope and against the same size ("k/n": of the cells the rule decided, where not all;
    "loses" where every one of both does)."""
    if not rows:
        return f"not run yet (`{FRONTIER_CMD}`)"
    decided = [r for r in rows if r.get("verdict") not in (None, "", rule.INELIGIBLE)]
    env = [r for r in decided if r["reference"] == "envelope"]
    same = [r for r in decided if r["reference"] == "same_size"]
    won = [r for r in env if saves(r)]
    if won:
        return f"**saves**: {len(won)} of {len(env)} cells vs the envelope"
    if decided and all(loses(r) for r in decided):
        return "loses"
    said = ["saves vs same size only"] if any(saves(r) for r in same) else []
    for name, cells in (("envelope", env), ("same size", same)):
        lost = [r for r in cells if loses(r)]
        if lost:
            said.append(f"{len(lost)}/{len(cells)} lose vs {name}" if len(lost) < len(cells) else f"loses vs {name}")
    return "; ".join(said) or "no saving shown"


def _short(row: dict) -> str:
    """A savings row's FLOPs saving, compact: "+26% [+23, +28]", or "≤-101%" where all three are one bound."""
    text = _saved(row)
    mean, _, rest = text.partition(" [")
    return mean if rest.rstrip("]").split(", ") == [mean.rstrip("%")] * 2 else text


def _top(rows: list[dict], reference: str) -> dict | None:
    """The best cell against ``reference`` (a saving by the rule first, so the cell shown is the one the verdict
    rests on; then a cell the rule tests, 2+ seeds in each arm, over a one-seed one whose interval is no interval;
    then the highest mean saving; the larger budget on a tie), or None."""
    cells = [r for r in rows if r["reference"] == reference]
    return max(cells, key=lambda r: (saves(r), rule.eligible(r), float(r["flops_saved_mean"]), int(r["budget"]))
               ) if cells else None


def _best_cell(best: dict | None, several: bool) -> str:
    """A best cell in the table: its saving, budget, and variant when the method has several."""
    if best is None:
        return "–"
    return (f"{_short(best)}, {int(best['budget'])} steps"
            + (f" ({VARIANT.get(best['variant'], best['variant'])})" if several else ""))


def _growth(variants: Iterable[str]) -> str:
    """"2x growth": the ``NAMED`` variants among ``variants``, as the table and the summary name them."""
    return ", ".join(sorted({VARIANT[v] for v in variants if v in NAMED}))


def _tpp(row: dict) -> float:
    """The tokens per parameter of the target trained directly at a savings row's budget (the regime's axis)."""
    return float(row["tokens_per_param"]) / float(row["tokens_vs_baseline"] or 1)


def _num(x: float) -> str:
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def _regime(rows: list[dict], target: str, vocab: int) -> str:
    """"4x128, vocab 4,096, 0.1-0.5 tokens/param": the target baseline's tokens per parameter over the budgets."""
    tpp = sorted(map(_tpp, rows))
    return f"{target}, vocab {vocab:,}" + (f", {_span(tpp)} tokens/param" if tpp else "")


def _span(xs: list[float]) -> str:
    """"21-84" (or "84" where the values are one), from sorted ``xs``."""
    lo, hi = _num(xs[0]), _num(xs[-1])
    return lo if lo == hi else f"{lo}-{hi}"


def _other_rows(elastic: dict | None, autofreeze_lm: dict | None, epochs: dict | None) -> list[str]:
    """The table's rows of the methods measured outside the frontier: AutoFreeze (+ AutoCache), elastic pipelining."""
    out = []
    if epochs or autofreeze_lm:
        parts, verdicts = [], []
        if epochs:
            r = {x["variant"]: x for x in epochs["results"]}
            c, plain = r["argmin+cache"], r["plain"]
            parts.append(fill("table_autofreeze_vit", speedup=f"{c['speed-up (wall)']:.2f}x",
                              acc=f"{c['dev acc %']:.1f}", plain=f"{plain['dev acc %']:.1f}"))
            verdicts.append("faster (ViT)" if c["speed-up (wall)"] > 1 and c["dev acc %"] >= plain["dev acc %"] - 1
                            else "faster, less accurate (ViT)")
        if autofreeze_lm:
            best = max((x for x in autofreeze_lm["results"] if x["variant"] != "plain"),
                       key=lambda x: float(str(x["FLOPs saved at equal loss"]).split("%")[0].lstrip("≥≤~ ")))
            saved = str(best["FLOPs saved at equal loss"]).split(" [")[0].replace(".0%", "%")
            parts.append(fill("table_autofreeze_lm", saved=saved))
            verdicts.append("loses (GPT-2)" if saved.lstrip("≥≤~ ").startswith("-") else "saves (GPT-2)")
        out.append(fill("table_autofreeze", parts="; ".join(parts), verdicts=", ".join(verdicts)))
    if elastic:
        vit = next(r for r in elastic["results"] if r["model"].startswith("ViT-B"))
        s = vit["speedup"]
        out.append(fill("table_elastic", paper=vit["paper"].split(" (")[0],
                        speedup=f"{s[next(k for k in s if k.startswith('all four (authors'))]:.2f}x"))
    return out


def results_table() -> tuple[str, str]:
    """(the two summary lines, the README's table with its legend): each method beside its paper, against the
    baseline of its own size and against the compute-optimal envelope, in each regime, with a verdict
    (``verdict``)."""
    grids = _grids()
    lines = ["| method | the paper (FLOPs saved) | ours vs the same size | ours vs the envelope | regime (GPT-2) "
             "| verdict |",
             "|---|---|---|---|---|---|"]
    said: dict[str, dict[str, list[str]]] = {g: {"envelope": [], "same_size": []} for g in grids}  # method names
    # the regime's axis: the target's tokens per parameter where a method saves against each reference, and over all
    tpp: dict[str, dict[str, list[float]]] = {g: {"envelope": [], "same_size": [], "all": []} for g in grids}
    seeds: set[int] = set()  # of the cells shown
    for name, paper, grid_rows in TABLE:
        first = True
        for grid, (path, target, vocab) in grids.items():
            for variants in grid_rows[grid]:
                rows = _savings(path, target, variants)
                v = verdict(rows)
                for reference in ("envelope", "same_size"):
                    won = [r for r in rows if r["reference"] == reference and saves(r)]
                    if won:
                        grown = _growth(r["variant"] for r in won)
                        said[grid][reference].append(name + (f" ({grown})" if grown else ""))
                    tpp[grid][reference] += map(_tpp, won)
                tpp[grid]["all"] += map(_tpp, rows)
                same, env = _top(rows, "same_size"), _top(rows, "envelope")
                seeds |= {int(r["seeds"]) for r in (same, env) if r is not None}
                named = _growth(variants)
                label = " ".join(x for x in (name if first else "", f"({named})" if named else "") if x)
                several = len(variants) > 1
                lines.append(f"| {label} | {paper if first else ''} | {_best_cell(same, several)} | "
                             f"{_best_cell(env, several)} | {_regime(rows, target, vocab)} | {v} |")
                first = False
    lines += _other_rows(_json("elastic"), _json("autofreeze_lm"), _json("autofreeze_epochs"))
    shown = "/".join(map(str, sorted(seeds))) + " seeds" if seeds else "the seeds"
    return _summary(said, tpp, grids), "\n".join(lines) + "\n\n" + fill("readme_legend", seeds=shown,
                                                                                  predictions=predictions.held(RESULTS))


def _names(names: list[str]) -> str:
    names = [n.replace("-style stacking", "") for n in names]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else (names[0] if names else "none")


def _summary(said: dict[str, dict[str, list[str]]], tpp: dict[str, dict[str, list[float]]],
             grids: dict[str, tuple[Path, str, int]]) -> str:
    """The two plain lines above the table: which methods save compute against a baseline of their own size, and
    which against the best baseline of any size, at the main job's scale and in the layer-dominated grid, named by
    its tokens per parameter (where the savers save, else the grid's range): what was measured, not a cause."""
    (_, target, _), (_, ltarget, lvocab) = grids["default"], grids["layers"]

    def line(reference: str) -> str:
        at = sorted(tpp["layers"][reference] or tpp["layers"]["all"])
        shapes = f"; the envelope over {_shapes()}" if reference == "envelope" and _shapes() else ""
        where = (f"at {_span(at)} tokens/param ({ltarget}, vocab {lvocab}{shapes})" if at
                 else f"at {ltarget}, vocab {lvocab}{shapes}")
        return (f"{_names(said['default'][reference])} at the main job's scale ({target}); "
                f"{_names(said['layers'][reference])} {where}.")

    text = fill("readme_summary", same=line("same_size"), envelope=line("envelope"))
    return "\n\n".join(textwrap.fill(p, 115, break_long_words=False, break_on_hyphens=False)  # a paragraph each
                       for p in text.strip().split("\n\n"))


# ---------------------------------------------------------------------------------------- the pages


def page(note: str, savings: dict, frontier: dict, elastic: dict | None, autofreeze: dict | None,
         grown: dict[str, Frontier] | None = None) -> str:
    """docs/results/index.md (templates/index.md): the verdicts in full (the README's table in words), every method
    beside its paper, the papers' tables, the recipe search, elastic pipelining, AutoFreeze."""
    if elastic:
        elastic_text = fill("index_elastic", command=elastic["command"], device=elastic["device"],
                            table=elastic_table(elastic))
    else:
        elastic_text = fill("index_elastic_none", command=ELASTIC_CMD)
    if autofreeze:
        autofreeze_text = fill("index_autofreeze", command=autofreeze.get("command", AUTOFREEZE_CMD),
                               seeds=autofreeze["seeds"], table=autofreeze_table(autofreeze))
    else:
        autofreeze_text = fill("index_autofreeze_none", command=AUTOFREEZE_CMD)
    return fill("index", sizes=", ".join(baseline_sizes()), target=TARGET,
                verdicts=verdicts(frontier, grown or {}, elastic, autofreeze),
                headline=headline(frontier, elastic, autofreeze, grown), savings_cmd=SAVINGS_CMD, note=note,
                savings_table=savings_table(savings), elastic=elastic_text, autofreeze=autofreeze_text)


def recipes_page(note: str, rows: list[dict]) -> str:
    """docs/results/vcycle_recipes.md: the recipe search's table under its own variant names, as recorded."""
    return fill("vcycle_recipes", savings_cmd=SAVINGS_CMD, note=note, table=format_table(rows)) + "\n"


def render() -> dict[Path, str]:
    """{path: text} of the README with its results block regenerated, docs/results/index.md and
    docs/results/vcycle_recipes.md."""
    note, rows, savings = read_savings()
    frontier = read_frontier()
    grown = {t: read_frontier(target=t) for t in envelope_targets()[:1]}  # the smallest: the envelope's at most budgets
    elastic, autofreeze = _json("elastic"), _json("autofreeze")
    summary, table = results_table()
    readme = splice(README.read_text(), BEGIN, END, f"{summary}\n\n{table}", "README.md")
    return {README: readme, PAGE: page(note, savings, frontier, elastic, autofreeze, grown) + "\n",
            RECIPES_PAGE: recipes_page(note, rows)}
