"""GLUE fine-tuning of a BERT-family checkpoint folder, with the papers' recipe and official metrics.

Recipe (BERT, Devlin et al. 2019, Sec. 4.1 / App. A.3, as the multi-level and Apollo papers use it): for
every task fine-tune for 5 epochs at batch 32 and sequence length 128, for each LR in
{5e-6, 1e-5, 2e-5, 3e-5, 5e-5} and seeds {0, 1, 2}; pick the LR whose *median* dev score over the seeds is
highest (first in grid order on a tie); report mean +- std (sample std, ddof=1; 0 with one seed) over the
seeds at that LR. A task's dev score is the mean of its metrics (MNLI: mean of matched and mismatched).
Metrics and the GLUE-average convention: eval/metrics.py. Data, encoding, truncation: eval/glue_data.py.

    python -m eval.glue --checkpoint outputs/bert_mlm/final --quick            # minutes on a laptop CPU
    accelerate launch -m eval.glue --checkpoint outputs/bert_mlm/final         # the full recipe, data parallel
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from common.cli import check_flags, comma_list, run_cli
from common.hf_folder import HEADS, check_checkpoint_folder, load_weights
from common.quiet import terminal_bars
from common.table import format_table
from eval import metrics as M
from eval.finetune import FinetuneConfig, finetune, make_accelerator, start_cli
from eval.glue_data import (
    ALIASES,
    DATA_DIR,
    TASKS,
    OfflineSkip,
    Task,
    collate_fn,
    encode,
    load_task,
    load_tokenizer,
    subsample,
)
from eval.report import add_run_args, default_output, log_results, output_or, results_path, save_results

TOOL = "eval.glue"  # names this CLI in the results JSON it writes (written_by)

log = logging.getLogger("eval.glue")
LR_GRID = (5e-6, 1e-5, 2e-5, 3e-5, 5e-5)
ENCODERS = {"bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "xlm-roberta",
            "camembert", "mpnet", "megatron-bert", "modernbert", "ernie", "nezha", "roformer"}
QUICK = {"lrs": (5e-5,), "seeds": (0,), "epochs": 1.0, "max_train_samples": 1000, "max_eval_samples": 500}


@dataclass
class GlueConfig:
    """Everything one `eval.glue` invocation does (defaults = the paper recipe)."""

    checkpoint: str
    tasks: tuple[str, ...] = tuple(TASKS)
    lrs: tuple[float, ...] = LR_GRID
    seeds: tuple[int, ...] = (0, 1, 2)
    epochs: float = 5.0
    batch_size: int = 32
    max_seq_len: int = 128
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    data_dir: str = str(DATA_DIR)
    tokenizer: str | None = None
    include_wnli: bool = False
    dropout: float | None = 0.1    # None: keep the checkpoint's dropout
    cpu: bool = False
    mixed_precision: str = "no"

    def __post_init__(self) -> None:

        check_flags({"--lrs": self.lrs, "--seeds": self.seeds, "--batch_size": self.batch_size,
                     "--max_seq_len": self.max_seq_len, "--max_train_samples": self.max_train_samples,
                     "--max_eval_samples": self.max_eval_samples, "--dropout": self.dropout},
                    at_least_one=("--batch_size", "--max_seq_len", "--max_train_samples", "--max_eval_samples"),
                    fractions=("--dropout",), seeds=("--seeds",))
        if not all(lr > 0 for lr in self.lrs) or not self.lrs:
            raise ValueError(f"--lrs must be learning rates > 0, got {self.lrs}")


def check_checkpoint(checkpoint: str):
    """Load and check the config: the folder must hold a BERT-family encoder.

    Raises:
        FileNotFoundError: the folder or its config.json is missing.
        ValueError: the checkpoint is not an encoder (e.g. GPT-2: use eval.zeroshot).
    """
    from transformers import AutoConfig

    path = Path(checkpoint)
    check_checkpoint_folder(path, "--checkpoint")  # config.json and whole weights, before any work
    config = AutoConfig.from_pretrained(path)
    if config.model_type not in ENCODERS:
        raise ValueError(f"{path} is a {config.model_type!r} checkpoint ({', '.join(config.architectures or [])}); "
                         f"eval.glue fine-tunes BERT-family encoders ({', '.join(sorted(ENCODERS))}). "
                         "For GPT-style causal LMs use eval.zeroshot.")
    return config


DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout")


def build_model(checkpoint: str, task: Task, dropout: float | None = 0.1):
    """A sequence classifier from the checkpoint: encoder weights loaded, a new head (and pooler if absent).

    Args:
        dropout: fine-tuning dropout on hidden states and attention (BERT's 0.1; pre-training runs often
            use 0, which fine-tuning should not inherit); None keeps the checkpoint's values.

    Raises:
        ValueError: encoder weights did not load (names do not match the architecture).
    """
    from transformers import AutoModelForSequenceClassification

    kw = {"problem_type": "regression"} if not task.labels else {
        "id2label": dict(enumerate(task.labels)), "label2id": {s: i for i, s in enumerate(task.labels)}}
    if dropout is not None:
        from transformers import AutoConfig

        fields_ = AutoConfig.from_pretrained(checkpoint).to_dict()
        kw.update({f: dropout for f in DROPOUT_FIELDS if f in fields_})
    # the encoder loads whole or not at all; the classifier (and BERT's pooler) are new
    return load_weights(AutoModelForSequenceClassification, checkpoint, HEADS, what="--checkpoint",
                        num_labels=task.num_labels, **kw)[0]


def run_task(task: Task, cfg: GlueConfig, accelerator, tokenizer) -> dict:
    """Fine-tune on one task for every (LR, seed) of ``cfg``; return runs and the recipe's summary.

    Raises:
        OfflineSkip: the task's data needs the network and there is none.
    """
    t0 = time.time()
    train, devs = load_task(task, cfg.data_dir)
    train = subsample(train, cfg.max_train_samples)
    devs = {k: subsample(v, cfg.max_eval_samples) for k, v in devs.items()}
    regression = not task.labels
    train_ds, n_trunc = encode(tokenizer, train, cfg.max_seq_len, regression)
    truncated = {"train": n_trunc}
    dev_ds = {}
    for k, d in devs.items():
        dev_ds[k], truncated[k] = encode(tokenizer, d, cfg.max_seq_len, regression)
    for split, n in truncated.items():
        if n:
            log.info("%s %s: %d examples longer than %d tokens, truncated longest-first", task.name, split, n,
                     cfg.max_seq_len)

    def predict(logits):
        return logits.squeeze(-1) if regression else logits.argmax(-1)

    runs = []
    for lr in cfg.lrs:
        for seed in cfg.seeds:
            ft = FinetuneConfig(lr=lr, epochs=cfg.epochs, batch_size=cfg.batch_size, seed=seed)
            t_run = time.time()
            out = finetune(lambda: build_model(cfg.checkpoint, task, cfg.dropout), train_ds, dev_ds,
                           collate_fn(tokenizer.pad_token_id), ft, accelerator, predict,
                           desc=f"{task.name} lr={lr:g} seed={seed}")
            mets = {k: M.glue_metrics(k, p.numpy(), y.numpy()) for k, (p, y) in out.items()}
            score = float(np.mean([M.glue_score(m) for m in mets.values()]))
            runs.append({"lr": lr, "seed": seed, "metrics": mets, "score": score,
                         "n_scored": {k: len(p) for k, (p, _) in out.items()},  # after gather: = dev size
                         "seconds": round(time.time() - t_run, 2)})  # model load + fine-tune + dev eval
            log.info("%s lr=%g seed=%d: %s", task.name, lr, seed, mets)
    summary = summarize(runs)
    summary.update(runs=runs, n_train=len(train_ds), n_eval={k: len(d) for k, d in dev_ds.items()},
                   truncated=truncated, seconds=round(time.time() - t0, 1))
    return summary


def summarize(runs: list[dict]) -> dict:
    """The recipe's choice: best LR by median score over seeds; mean / std of every metric at that LR.

    Returns:
        ``{"best_lr", "median_score_by_lr", "mean": {eval_set: {metric: v}}, "std": {...}, "seeds"}``.
    """
    lrs = list(dict.fromkeys(r["lr"] for r in runs))
    med = {lr: float(np.median([r["score"] for r in runs if r["lr"] == lr])) for lr in lrs}
    best = max(lrs, key=lambda lr: -np.inf if np.isnan(med[lr]) else med[lr])
    at = [r for r in runs if r["lr"] == best]
    mean, std = {}, {}
    for k, mets in at[0]["metrics"].items():
        vals = {m: [r["metrics"][k][m] for r in at] for m in mets}
        mean[k] = {m: float(np.mean(v)) for m, v in vals.items()}
        std[k] = {m: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for m, v in vals.items()}
    return {"best_lr": best, "median_score_by_lr": {str(lr): v for lr, v in med.items()}, "mean": mean, "std": std,
            "seeds": [r["seed"] for r in at]}


@terminal_bars()  # a log file gets lines, not the bars of transformers or datasets
def run_glue(cfg: GlueConfig, accelerator=None) -> dict:
    """Run the recipe on every task of ``cfg``; tasks whose data needs the network go under ``skipped``.

    Returns:
        JSON-able results: ``tasks`` (per task the runs and summary), ``skipped`` ({task: reason}),
        ``glue_average`` (x100, over ``glue_average_sets``) and the config.

    Raises:
        FileNotFoundError / ValueError: bad checkpoint, tokenizer, task name or data (see the helpers).
    """
    names = [ALIASES.get(t.lower(), t.lower()) for t in cfg.tasks]
    unknown = [t for t in names if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown GLUE task(s) {unknown}; choose from {', '.join(TASKS)}")
    config = check_checkpoint(cfg.checkpoint)
    limit = getattr(config, "max_position_embeddings", None)
    if limit and cfg.max_seq_len > limit:
        raise ValueError(f"--max_seq_len {cfg.max_seq_len} exceeds the model's max_position_embeddings {limit}; "
                         f"pass --max_seq_len {limit} or less (and say so next to the scores)")
    tokenizer = load_tokenizer(cfg.checkpoint, cfg.tokenizer)
    accelerator = accelerator or make_accelerator(cpu=cfg.cpu, mixed_precision=cfg.mixed_precision)
    results: dict = {"checkpoint": str(cfg.checkpoint), "config": asdict(cfg),
                     "num_processes": accelerator.num_processes, "tasks": {}, "skipped": {}}
    for name in names:
        try:
            results["tasks"][name] = run_task(TASKS[name], cfg, accelerator, tokenizer)
        except OfflineSkip as e:
            log.warning("skipping %s", e)
            results["skipped"][name] = str(e)
    means = {k: m for t in results["tasks"].values() for k, m in t["mean"].items()}
    used = {k: m for k, m in means.items() if cfg.include_wnli or k != "wnli"}
    results["glue_average"] = M.glue_average(used, include_wnli=cfg.include_wnli) if used else None
    results["glue_average_sets"] = sorted(used)
    results["glue_average_convention"] = ("mean over the listed dev sets of (mean of each set's metrics), x100; "
                                          "MNLI-m and MNLI-mm separate; WNLI " +
                                          ("included" if cfg.include_wnli else "excluded"))
    return results


def table_rows(results: dict) -> list[dict]:
    """One row per dev set (metrics as mean +- std x100) plus the GLUE average, for format_table."""
    rows = []
    for t in results["tasks"].values():
        for k, mets in t["mean"].items():
            cells = [f"{m} {100 * v:.2f} ± {100 * t['std'][k][m]:.2f}" for m, v in mets.items()]
            rows.append({"dev set": k, "metrics (mean ± std over seeds)": ", ".join(cells),
                         "best lr": f"{t['best_lr']:g}",
                         "seeds": len(t["seeds"]), "train": t["n_train"], "dev": t["n_eval"][k], "s": t["seconds"]})
    for name, why in results["skipped"].items():
        rows.append({"dev set": name, "metrics (mean ± std over seeds)": "skipped: " + why[:60]})
    avg = results["glue_average"]
    rows.append({"dev set": "GLUE avg", "metrics (mean ± std over seeds)":
                 f"{avg:.2f} over {', '.join(results['glue_average_sets'])}" if avg is not None else "n/a"})
    return rows


def tracker_metrics(results: dict) -> dict[str, float]:
    """Flat ``glue/<set>/<metric>`` (x100) means and ``_std``s plus ``glue/average``, for log_results."""
    out = {}
    for t in results["tasks"].values():
        for k, mets in t["mean"].items():
            for m, v in mets.items():
                out[f"glue/{k}/{m}"] = 100 * v
                out[f"glue/{k}/{m}_std"] = 100 * t["std"][k][m]
    if results["glue_average"] is not None:
        out["glue/average"] = results["glue_average"]
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m eval.glue", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fine-tune a BERT-family checkpoint folder (e.g. from train.py) on GLUE and report dev scores.\n\n"
        "Default = the papers' recipe: per task, LR grid {5e-6,1e-5,2e-5,3e-5,5e-5} x 3 seeds, 5 epochs, batch 32,\n"
        "max_seq_len 128; best LR by median dev score over seeds; mean ± std over seeds at that LR.\n"
        "Metrics: CoLA Matthews; STS-B Pearson & Spearman; MRPC/QQP accuracy & F1; others accuracy.\n"
        "GLUE average: mean over dev sets of each set's mean metric, MNLI-m/-mm separate, WNLI excluded.\n"
        "Inputs are [CLS] a [SEP] b [SEP]; longer pairs are truncated longest-first to --max_seq_len (counts logged).\n"
        "Data: bundled TSVs (data/glue). QNLI/MNLI/QQP train needs the HF hub or local TSVs in --data_dir;\n"
        "offline those tasks are skipped with a message. Multi-GPU: accelerate launch -m eval.glue ...",
        epilog="examples:\n  python -m eval.glue --checkpoint outputs/bert_mlm/final --quick --tasks rte,mrpc\n"
               "  accelerate launch -m eval.glue --checkpoint outputs/bert_mlm/final --report_to wandb")
    p.add_argument("--checkpoint", required=True,
                   help="folder written by save_pretrained (config.json, weights, tokenizer)")
    p.add_argument("--tasks", default=",".join(TASKS), help="comma list of %(default)s (aliases SST-2, STS-B ok)")
    p.add_argument("--quick", action="store_true", help="CI/laptop smoke run: one LR (5e-5), seed 0, 1 epoch, "
                   "1000 train / 500 dev examples per task (each overridable by the flags below)")
    p.add_argument("--lrs", help="comma list of learning rates (default: the 5-value grid)")
    p.add_argument("--seeds", help="comma list of seeds (default 0,1,2)")
    p.add_argument("--epochs", type=float, help="epochs per run, fractions ok (default 5; --quick: 1)")
    p.add_argument("--batch_size", type=int, default=32, help="global batch over all processes (default 32)")
    p.add_argument("--max_seq_len", type=int, default=128, help="tokens per input incl. [CLS]/[SEP] (default 128)")
    p.add_argument("--max_train_samples", type=int, help="random subset of the train split (fixed seed 0)")
    p.add_argument("--max_eval_samples", type=int, help="random subset of each dev split (fixed seed 0)")
    p.add_argument("--data_dir", default=str(DATA_DIR), help="GLUE folder with <TASK>/train.tsv[.gz], dev.tsv[.gz]")
    p.add_argument("--tokenizer", help="tokenizer folder if the checkpoint has none")
    p.add_argument("--include_wnli", action="store_true", help="count WNLI in the GLUE average")
    p.add_argument("--dropout", default="0.1", help="fine-tuning dropout (BERT's 0.1, the default), or 'checkpoint' "
                   "to keep the checkpoint's (pre-training configs often set 0)")
    p.add_argument("--output", help="results JSON (default: beside the run, never inside it: "
                   "outputs/<run>.final.glue_results[_quick].json for outputs/<run>/final)")
    add_run_args(p, "growtrain-eval", "glue-<checkpoint folder name>")
    return p.parse_args(argv)


def config_from_args(a: argparse.Namespace) -> GlueConfig:
    """Build the GlueConfig: explicit flags win over --quick's defaults, which win over the recipe's."""
    over = dict(QUICK) if a.quick else {}
    if a.lrs is not None:
        over["lrs"] = tuple(comma_list("--lrs", a.lrs, float))
    if a.seeds is not None:
        over["seeds"] = tuple(comma_list("--seeds", a.seeds, int))
    for k in ("epochs", "max_train_samples", "max_eval_samples"):
        if getattr(a, k) is not None:
            over[k] = getattr(a, k)
    names = {f.name for f in fields(GlueConfig)}
    base = {k: v for k, v in vars(a).items() if k in names and k not in over and v is not None}
    base["tasks"] = tuple(comma_list("--tasks", a.tasks))
    base["dropout"] = None if a.dropout == "checkpoint" else float(a.dropout)
    cfg = GlueConfig(**{**base, **over})
    FinetuneConfig(epochs=cfg.epochs, batch_size=cfg.batch_size)  # bad values fail before any loading
    return cfg


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point: run, save JSON beside the checkpoint (``default_output``), log to the tracker, print the
    table."""

    a = parse_args(argv)
    cfg = config_from_args(a)
    ckpt = Path(cfg.checkpoint)
    default = default_output(ckpt, "glue_results_quick.json" if a.quick else "glue_results.json")  # outside the run
    out = results_path(output_or(a.output, default), TOOL)
    accelerator = start_cli(cpu=cfg.cpu, mixed_precision=cfg.mixed_precision)
    results = run_glue(cfg, accelerator)
    if accelerator.is_main_process:
        out = save_results(results, out, TOOL)
        print(format_table(table_rows(results)))
        print(f"results: {out}")
    log_results(tracker_metrics(results), a.report_to, a.project, a.run_name, a.logging_dir or out.parent / "eval_logs",
                config=results["config"], checkpoint=ckpt, kind="glue", default_name=f"glue-{ckpt.name}")
    return results


def cli(argv: list[str] | None = None) -> int:
    """``python -m ...``: ``main`` with one-line errors (exit code 2) instead of tracebacks (``--debug``)."""

    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
