"""docs/results/{multilevel,apollo,pipetransformer}.md: the three papers' pages, each from
bench/results/papers_<paper>.json (``python -m bench.papers <paper>`` records it, its figure beside it).

The json holds what the page shows: ``run`` (the command, machine, library versions, wall time), ``tables`` (rows as
the paper command built them: a cell such as a saving over seeds, "mean% [min, max]", is formatted there, where its
seeds are), ``notes`` (the numbers the paragraphs quote), ``commands`` (the training commands behind the runs) and
``figure`` (a file name beside the json). Each page is one template (bench/pages/templates/papers_<paper>.md); the
header, the GLUE caption and the commands section are templates the three share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.pages.text import DOCS, RESULTS, fill
from common.table import format_table

PAPERS = ("multilevel", "apollo", "pipetransformer")


def data_path(paper: str, results: Path = RESULTS) -> Path:
    """Where ``python -m bench.papers <paper>`` records the page's data."""
    return results / f"papers_{paper}.json"


def pages(results: Path = RESULTS, docs: Path = DOCS) -> dict[Path, str]:
    """{docs/<paper>.md: its text} for each paper with its data in ``results`` (its figure linked from there)."""
    out = {}
    for paper in PAPERS:
        path = data_path(paper, results)
        if path.is_file():
            data = json.loads(path.read_text())
            figure = Path(os.path.relpath(results / data["figure"], docs)).as_posix() if "figure" in data else ""
            out[docs / f"{paper}.md"] = render(paper, data, figure)
    return out


def render(paper: str, data: dict[str, Any], figure: str = "") -> str:
    """The page of ``paper`` from its json's ``data``; ``figure``: the link to its figure from the page's folder.

    Raises:
        KeyError: a value the page shows is missing from ``data``.
    """
    return {"multilevel": multilevel, "apollo": apollo, "pipetransformer": pipetransformer}[paper](data, figure) + "\n"


def header(run: dict[str, Any]) -> str:
    """The paragraph under the title: the command, the machine and library versions, the command's wall time."""
    return fill("papers_header", command=run["command"], machine=run["machine"], transformers=run["transformers"],
                accelerate=run["accelerate"], minutes=f"{run['wall_s'] / 60:.1f}")


def glue(g: dict[str, Any]) -> str:
    """What a GLUE table ran: the dev sets scored (and those skipped), the fine-tuning recipe, the score."""
    skipped = " " + fill("papers_glue_skipped", tasks=", ".join(sorted(g["skipped"]))) if g["skipped"] else ""
    return fill("papers_glue", tasks=", ".join(g["tasks"]), skipped=skipped, lrs=tuple(g["lrs"]),
                seeds=tuple(g["seeds"]), epochs=f"{g['epochs']:g}", max_train_samples=g["max_train_samples"],
                max_eval_samples=g["max_eval_samples"], max_seq_len=g["max_seq_len"])


def commands(lines: list[str]) -> str:
    """The training commands behind the runs (the run folders also keep each config.yaml)."""
    return fill("papers_commands", commands="\n".join(lines))


def recipes(names: dict[str, str]) -> str:
    """The full-scale recipes, each in backticks."""
    return ", ".join(f"`{r}`" for r in names.values())


def multilevel(data: dict[str, Any], figure: str) -> str:
    """Zou et al.: the GPT-2, BERT and DeiT tables, each with its note and full-scale recipe."""
    t, n = data["tables"], data["notes"]
    gpt, bert, deit = n["gpt"], n["bert"], n["deit"]
    return fill("papers_multilevel", header=header(data["run"]), figure=figure, commands=commands(data["commands"]),
                gpt_table=format_table(t["gpt"]), gpt_steps=gpt["budget_steps"],
                gpt_model="x".join(map(str, gpt["size"])), gpt_flops=f"{gpt['budget_flops']:.3g}",
                gpt_budgets=gpt["budgets"], gpt_recipe=gpt["recipe"],
                bert_table=format_table(t["bert"]), bert_tokens_per_param=f"{bert['tokens_per_param']:.1f}",
                bert_loss=f"{bert['mlm_loss']:.2f}", glue=glue(bert["glue"]), bert_recipe=bert["recipe"],
                deit_table=format_table(t["deit"]), deit_seeds=", ".join(map(str, deit["seeds"])),
                deit_recipe=deit["recipe"])


def apollo(data: dict[str, Any], figure: str) -> str:
    """Pan et al.: loss vs FLOPs (the figure and its table), then GLUE after pre-training."""
    t, n = data["tables"], data["notes"]
    return fill("papers_apollo", header=header(data["run"]), figure=figure, commands=commands(data["commands"]),
                loss_table=format_table(t["loss"]), recipes=recipes(n["recipes"]), glue_table=format_table(t["glue"]),
                tokens_per_param=f"{n['tokens_per_param']:.1f}", loss=f"{n['mlm_loss']:.2f}", glue=glue(n["glue"]))


def pipetransformer(data: dict[str, Any], figure: str) -> str:
    """He et al.: Table 1 and its ablation, measured and simulated, with the links the simulator used."""
    n = data["notes"]
    links = ", ".join(f"{kind}: {v['latency_us']:.0f} us + {_inf(v['mb_per_s']):.0f} MB/s"
                      for kind, v in n["links"].items())
    chance = (" " + fill("papers_pipetransformer_chance", tasks=", ".join(n["at_chance"]),
                         below=n["chance_below_pct"])) if n["at_chance"] else ""
    return fill("papers_pipetransformer", header=header(data["run"]), table=format_table(data["tables"]["runs"]),
                links=links, paper=n["paper"], recipes=recipes(n["recipes"]), chance=chance,
                commands=commands(data["commands"]))


def _inf(v: float | None) -> float:
    return float("inf") if v is None else v
