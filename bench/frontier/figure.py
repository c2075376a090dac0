"""The answer in one picture: FLOPs saved per method against tokens per parameter, for both grids.

    python -m bench.frontier.figure       # docs/savings.png, from bench/results/savings*.csv (the README shows it)

Four panels: the FLOPs saved at equal test loss against the target trained directly (the papers' protocol) and
against the compute-optimal envelope (the best baseline of any size), each against tokens per parameter of the
target counted two ways, with all parameters and without the token and position embeddings (at vocabulary 4,096
and width 128 the embeddings are 0.6 of 4x128's parameters, at vocabulary 512 and width 64 0.2 of 4x64's, so the
regime a cell belongs to depends on the convention). Each cell (every recipe and LR check of a method, in its
method's colour) is its mean over seeds with the interval its
verdict was decided on (the Welch test's 95%, carried to FLOPs); a filled marker is a verdict (saves or loses,
after Holm), an open one no evidence either way, a triangle a bound (the reference never reached the loss). The
20 tokens per parameter line is Chinchilla's compute-optimal ratio. Colour: the method; marker size: the budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.lib import verdict as rule
from bench.lib.grid import FULL, LAYERS, ROOT, Grid, regime
from bench.lib.rows import read_savings
from common.cli import run_cli

OUT = ROOT / "docs" / "savings.png"
CHINCHILLA = 20.0  # tokens per parameter (Hoffmann et al. 2022)


def family(variant: str) -> str:
    """The method a variant is a recipe of, as the figure colours it."""
    if "gstack" in variant and variant.startswith("vcycle"):
        return "V-cycle + G_stack"
    if variant.startswith("vcycle") or variant == "width_grow":
        return "V-cycle (any recipe)" if variant != "width_grow" else "width growth"
    if variant.startswith("apollo"):
        return "Apollo (any optimizer rule)"
    if variant.startswith("late_expansion"):
        return "late expansion"
    return {"stackbert": "StackBERT", "gstack": "G_stack (4x)", "gstack2": "G_stack (2x)"}.get(variant, variant)


def points(g: Grid, results: Path) -> list[dict[str, Any]]:
    """One point per savings row of grid ``g``: its reference, method, budget, tokens per parameter (all / without
    embeddings), the mean FLOPs saved and the deciding test's interval (at Holm's levels where it was judged), the
    verdict, whether it is a bound."""
    path = results / f"savings{g.stem}.csv"
    if not path.is_file():
        return []
    shares: dict[str, float] = {}
    out = []
    for r in read_savings(path):
        if not rule.eligible(r) or r.get("flops_saved_t_lo") is None:
            continue
        target = r["target"]
        if target not in shares:
            size = tuple(int(x) for x in target.split("x"))
            shares[target] = regime(g, size)["embedding_share"]
        tpp = float(r["tokens_per_param"])
        k = "holm" if r.get("flops_saved_holm_lo") is not None else "t"  # the interval the verdict used
        out.append({"grid": g.stem or "_default", "reference": r["reference"], "variant": family(r["variant"]),
                    "budget": int(r["budget"]), "tpp_all": tpp, "tpp_nonembed": tpp / (1 - shares[target]),
                    "saved": float(r["flops_saved_mean"]), "lo": float(r[f"flops_saved_{k}_lo"]),
                    "hi": float(r[f"flops_saved_{k}_hi"]), "verdict": r["verdict"],
                    "bound": r.get("flops_bound") not in ("=", None) or r.get(f"flops_{k}_lo_bound") not in ("=", None)
                    or r.get(f"flops_{k}_hi_bound") not in ("=", None)})
    return out


def draw(pts: list[dict[str, Any]], path: Path) -> Path | None:
    """The figure of ``pts`` (``points``) at ``path``; None where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({p["variant"] for p in pts})
    colors = plt.cm.tab10.colors
    budgets = sorted({p["budget"] for p in pts})
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharey="row")
    for row, reference in enumerate(("same_size", "envelope")):
        for col, (key, xlabel) in enumerate((("tpp_all", "tokens per parameter (all parameters)"),
                                             ("tpp_nonembed", "tokens per parameter (without embeddings)"))):
            ax = axes[row][col]
            for p in (q for q in pts if q["reference"] == reference):
                c = colors[variants.index(p["variant"]) % len(colors)]
                lo, hi = sorted((p["lo"], p["hi"]))  # (bounds aside, the interval brackets the mean)
                clip = [max(-1.0, min(1.0, v)) for v in (min(lo, p["saved"]), p["saved"], max(hi, p["saved"]))]
                decided = p["verdict"] in (rule.SAVES, rule.LOSES)
                size = 4 + 2 * budgets.index(p["budget"]) / max(1, len(budgets) - 1) * 3
                ax.errorbar([p[key]], [clip[1]], yerr=[[clip[1] - clip[0]], [clip[2] - clip[1]]],
                            fmt="^" if p["bound"] else "o", ms=size, color=c, mfc=c if decided else "none",
                            capsize=2, lw=1, alpha=0.85)
            ax.axhline(0, color="k", lw=0.8)
            ax.axvline(CHINCHILLA, color="grey", ls="--", lw=1)
            ax.text(CHINCHILLA * 1.05, 0.92, "20 tokens/param", color="grey", fontsize=8,
                    transform=ax.get_xaxis_transform())
            ax.set_xscale("log")
            ax.set_ylim(-1.05, 1.05)
            against = "the same size" if reference == "same_size" else "the envelope"
            ax.set(xlabel=xlabel, ylabel=f"FLOPs saved vs {against}")
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color=colors[i % len(colors)], label=v)
               for i, v in enumerate(variants)]
    handles += [plt.Line2D([], [], marker="o", ls="", color="k", label="a verdict (saves / loses, after Holm)"),
                plt.Line2D([], [], marker="o", ls="", color="k", mfc="none", label="no evidence either way"),
                plt.Line2D([], [], marker="^", ls="", color="k", label="a bound (clipped at ±100%)")]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle("FLOPs saved at equal test loss, mean over seeds [the deciding test's 95%]; marker size: budget")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line (2 with one line on a damaged savings file)."""
    return run_cli(_main, argv)


def _main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(ROOT / "bench" / "results"), help="folder of savings*.csv")
    ap.add_argument("--out", default=str(OUT), help="the figure (PNG)")
    args = ap.parse_args(argv)
    pts = [p for g in (FULL, LAYERS) for p in points(g, Path(args.results))]
    if not pts:
        raise ValueError(f"no eligible savings row in {args.results}: run python -m bench.frontier --report first")
    out = draw(pts, Path(args.out))
    print(f"wrote {out} ({len(pts)} cells)" if out else "matplotlib is not installed: pip install -e '.[plots]'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
