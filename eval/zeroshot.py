"""Zero-shot evaluation of a causal-LM checkpoint: LAMBADA, WikiText-2, WikiText-103 and PTB, offline.

    python -m eval.zeroshot outputs/default/vcycle/final      # a train.py checkpoint; --help for all options

Metrics (lm-evaluation-harness 0.4.13 definitions; ``eval.tasks.scoring`` has the scoring rules):

- LAMBADA (OpenAI version, ``lambada_openai``): context = passage without its last space-separated word,
  target = " " + word. ``acc`` = fraction of passages where EVERY token of the target is the greedy argmax;
  ``perplexity`` = exp(-mean over passages of the target's summed log-likelihood) (a per-word perplexity).
- WikiText-2 / WikiText-103 test (``wikitext``): each page is detokenized with the harness's detokenizer
  and scored with rolling windows of ``max_length`` tokens. With LL = summed log-likelihood over all pages,
  ``word_perplexity`` = exp(-LL / words), ``byte_perplexity`` = exp(-LL / bytes), ``bits_per_byte`` =
  -LL / (bytes ln 2); words = ``len(re.split(r"\\s+", page))`` and bytes = UTF-8 bytes, both of the ORIGINAL
  page. Corpus-weighted, not a mean of per-page values. Offline we have the tokenized v1 files (``<unk>``
  present); the harness's task reads the raw pages, so its numbers differ (``eval.tasks.lm_data``).
- PTB test: the whole test set as one stream (sentences end in "\\n"), rolling windows as above,
  ``word_perplexity`` = exp(-LL / (words + sentences)), i.e. per PTB token including ``<eos>`` (82,430).

``--limit N`` scores the first N words of every task, the same budget for each (it used to be N examples, so 20
meant 0.4% of LAMBADA's passages but 31% of WikiText's pages): whole LAMBADA passages and PTB sentences, and
WikiText pages whole up to the one the budget ends in, which keeps its first lines; at least one of each. The words
are each metric's own count (``eval.tasks.lm_data.select``). Each task's result says what it scored ("50 of 5153
passages: 2,951 of 306,006 words (0.96%)") and the log says it before scoring. ``max_length``
defaults to the model's context (``n_positions`` / ``max_position_embeddings``); longer documents go
through windows, never truncation; a LAMBADA context longer than the model's context is cut from the
left, as in the harness, and counted in ``n_truncated`` with a warning.

Data (data/SOURCES.md has hashes and licences): LAMBADA test as released by OpenAI (mirrored as
EleutherAI/lambada_openai; Paperno et al. 2016, CC BY 4.0); WikiText-2 / WikiText-103 v1 test (Merity et
al. 2016, CC BY-SA); PTB test in Mikolov's language-modelling version (derived from the LDC Penn Treebank).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.cli import run_cli
from common.device import timed
from common.quiet import quiet_transformers, terminal_bars
from common.table import format_table
from eval.report import TRACKERS, add_run_args, default_output, log_results, output_or, results_path, save_results
from eval.tasks import lm_data
from eval.tasks.causal_lm import (  # noqa: F401  (part of this module's API)
    DTYPES,
    CheckpointError,
    check_causal,
    check_checkpoint_config,
    load_causal_lm,
    load_tokenizer,
    resolve_max_length,
)
from eval.tasks.harness import run_harness
from eval.tasks.scoring import (
    encode,
    lambada_request,
    prefix_token_id,
    rolling_requests,
    score_requests,
)

TOOL = "eval.zeroshot"  # names this CLI in the results JSON it writes (written_by)

log = logging.getLogger("eval.zeroshot")

TASKS = ("lambada", "wikitext2", "wikitext103", "ptb")
ENGINES = ("ours", "harness")


@dataclass
class ZeroShotConfig:
    """What to evaluate and how (the CLI flags of ``python -m eval.zeroshot``)."""

    checkpoint: str
    tasks: tuple[str, ...] = TASKS
    harness_tasks: tuple[str, ...] = ()  # standard lm-evaluation-harness task names (need the network)
    engine: str = "ours"  # "ours": batched scorer here; "harness": lm-evaluation-harness
    limit: int | None = None
    batch_size: int = 8
    max_length: int | None = None  # None: the model's context length
    dtype: str = "float32"
    tokenizer: str | None = None  # None: the checkpoint's own tokenizer
    data_dir: str | None = None  # None: the bundled data/
    output: str | None = None  # None: <run>.final.eval_zeroshot.json beside the run (eval.report.default_output)
    report_to: str = "none"
    project: str | None = None  # None: the training run's (a train.py final/), else "zeroshot"
    run_name: str | None = None
    logging_dir: str | None = None  # None: <output folder>/zeroshot_logs
    cpu: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        bad = [t for t in self.tasks if t not in TASKS]
        if bad:
            raise ValueError(f"--tasks: unknown {bad}; choose from {', '.join(TASKS)}")
        if not self.tasks and not self.harness_tasks:
            raise ValueError("nothing to evaluate: --tasks and --harness_tasks are both empty")
        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {ENGINES}, got {self.engine!r}")
        if self.dtype not in (*DTYPES, "auto"):
            raise ValueError(f"--dtype must be one of {(*DTYPES, 'auto')}, got {self.dtype!r}")
        wiki = [t for t in self.tasks if t.startswith("wikitext")]
        if (wiki or self.engine == "harness" or self.harness_tasks) and importlib.util.find_spec("lm_eval") is None:
            what = f"--tasks {','.join(wiki)} (scored with lm-evaluation-harness's own WikiText detokenizer)" if wiki \
                else "--engine harness / --harness_tasks"
            raise ValueError(f"{what} needs lm-evaluation-harness: pip install lm-eval==0.4.13 (with the eval CLIs' "
                             "other needs: pip install 'growtrain[eval]'), or choose --tasks "
                             f"from {', '.join(t for t in TASKS if not t.startswith('wikitext'))}")
        if self.report_to not in TRACKERS:
            raise ValueError(f"--report_to must be one of {TRACKERS}, got {self.report_to!r}")
        if self.limit is not None and self.harness_tasks:
            raise ValueError(f"--limit counts the words of the bundled tasks; the harness's own tasks (--harness_tasks "
                             f"{','.join(self.harness_tasks)}) are not read here, so no budget of words can be cut "
                             "from them: run them without --limit")
        for name in ("limit", "batch_size", "max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")


def check_scored(task: str, n_tokens: int, n_texts: int, unit: str) -> None:
    """A task with no token to score is an error, never a score: over nothing, a perplexity is 1.0 and bits per
    byte 0.0.

    Raises:
        ValueError: ``n_tokens`` is 0, naming ``task``.
    """
    if n_tokens == 0:
        what = f"{n_texts} {unit}" if n_texts != 1 else f"1 {unit.removesuffix('s')}"
        raise ValueError(f"{task}: 0 tokens to score in {what}: the tokenizer encodes them to nothing (an empty "
                         "tokenizer? pass --tokenizer), or there is no text")


def evaluate_lambada(model, tokenizer, texts: Sequence[str], max_length: int, batch_size: int = 8,
                     accelerator=None) -> dict[str, float]:
    """LAMBADA ``acc`` and ``perplexity`` (harness ``lambada_openai``) over ``texts``."""
    prefix = prefix_token_id(tokenizer)
    requests = [lambada_request(tokenizer, t, prefix) for t in texts]
    check_scored("lambada", sum(len(r.continuation) for r in requests), len(texts), "passages")
    empty = next((i for i, r in enumerate(requests) if not r.continuation), None)
    if empty is not None:
        raise ValueError(f"lambada: passage {empty + 1} has nothing to score: its last word encodes to no tokens")
    n_trunc = sum(r.truncated(max_length) for r in requests)
    if n_trunc and (accelerator is None or accelerator.is_main_process):
        log.warning("LAMBADA: %d of %d contexts exceed max_length=%d tokens; they are cut from the left "
                    "(as in the harness)", n_trunc, len(requests), max_length)
    scores = score_requests(model, requests, max_length, batch_size, accelerator, desc="lambada")
    lls = [ll for ll, _ in scores]
    return {
        "acc": sum(g for _, g in scores) / len(scores),
        "perplexity": math.exp(-sum(lls) / len(lls)),
        "n_examples": len(scores),
        "n_truncated": n_trunc,
    }


def evaluate_documents(model, tokenizer, docs: Sequence[str], max_length: int,
                       counts: Callable[[str], tuple[int, int]], transform: Callable[[str], str] | None = None,
                       batch_size: int = 8, accelerator=None, desc: str = "documents") -> dict[str, float]:
    """Corpus-level ``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte`` with rolling windows.

    Args:
        docs: original documents; ``counts(doc)`` gives its (words, bytes).
        transform: applied to each document before tokenizing (the WikiText detokenizer), or None.
    """
    prefix = prefix_token_id(tokenizer)
    requests, n_tokens = [], 0
    for doc in docs:
        tokens = encode(tokenizer, transform(doc) if transform else doc, prefix)
        n_tokens += len(tokens)
        requests += rolling_requests(tokens, prefix, max_length)
    check_scored(desc, n_tokens, len(docs), "texts")
    scores = score_requests(model, requests, max_length, batch_size, accelerator, desc=desc)
    ll = sum(s for s, _ in scores)
    words = sum(counts(d)[0] for d in docs)
    n_bytes = sum(counts(d)[1] for d in docs)
    return {
        "word_perplexity": math.exp(-ll / words),
        "byte_perplexity": math.exp(-ll / n_bytes),
        "bits_per_byte": -ll / (n_bytes * math.log(2)),
        "loglikelihood": ll,
        "n_docs": len(docs),
        "n_words": words,
        "n_bytes": n_bytes,
        "n_tokens": n_tokens,
        "n_windows": len(requests),
    }


def evaluate_task(task: str, model, tokenizer, max_length: int, limit: int | None = None, batch_size: int = 8,
                  accelerator=None, data_dir: str | Path | None = None) -> dict[str, float]:
    """Evaluate one of TASKS on its bundled test file: its first ``limit`` words (all of it when None; the same
    budget for every task: ``lm_data.select``), said in the log first and in the result (``scored``: "50 of 5153
    passages: 2,951 of 306,006 words (0.96%)"; ``words``, ``words_total``, ``n_units``, ``n_units_total``)."""
    chosen = lm_data.select(task, data_dir, limit)
    if accelerator is None or accelerator.is_main_process:
        log.info("%s: scoring %s", task, chosen.describe())
    common = {"batch_size": batch_size, "accelerator": accelerator}
    if task == "lambada":
        out = evaluate_lambada(model, tokenizer, chosen.texts, max_length, **common)
    elif task in ("wikitext2", "wikitext103"):
        out = evaluate_documents(model, tokenizer, chosen.texts, max_length, lm_data.wikitext_counts,
                                 lm_data.wikitext_detokenize, desc=task, **common)
    else:
        out = evaluate_documents(model, tokenizer, chosen.texts, max_length, lm_data.ptb_counts, desc=task, **common)
    return {**out, "scored": chosen.describe(), "words": chosen.words, "words_total": chosen.words_total,
            "n_units": chosen.units, "n_units_total": chosen.units_total}


@terminal_bars()  # a log file gets lines, not the bars of transformers or the harness
def run(cfg: ZeroShotConfig) -> dict[str, Any]:
    """Evaluate, then (main process) write the JSON, print the table and send metrics to the tracker.

    Returns:
        {"results": {task: {metric: value, "seconds": s}}, "max_length": ..., ...}: what the JSON holds.

    Raises:
        ValueError: a bad option; FileNotFoundError: a missing checkpoint or data file (checked before
        any model loads); CheckpointError: not a causal LM.
    """
    from accelerate import Accelerator

    cfg.validate()
    data = {t: str(lm_data.data_file(t, cfg.data_dir)) for t in cfg.tasks}  # fail before loading a model
    config = check_checkpoint_config(cfg.checkpoint, cfg.dtype)  # a causal LM that fits in memory
    load_tokenizer(cfg.checkpoint, cfg.tokenizer)  # one that encodes text, for either engine
    output = results_path(output_or(cfg.output, default_output(cfg.checkpoint, "eval_zeroshot.json")), TOOL)
    max_length = resolve_max_length(config, None, cfg.max_length)
    accelerator = Accelerator(cpu=cfg.cpu)
    results: dict[str, dict[str, float]] = {}
    if cfg.engine == "ours" and cfg.tasks:
        model, tok = load_causal_lm(cfg.checkpoint, cfg.tokenizer, cfg.dtype)
        model.to(accelerator.device)
        for task in cfg.tasks:
            with timed(accelerator.device) as seconds:
                results[task] = evaluate_task(task, model, tok, max_length, cfg.limit, cfg.batch_size,
                                              accelerator, cfg.data_dir)
            results[task]["seconds"] = seconds[0]
    if cfg.engine == "harness" or cfg.harness_tasks:

        # One harness call per bundled task so that each gets its own wall-clock; standard tasks together.
        calls = [((t,), ()) for t in (cfg.tasks if cfg.engine == "harness" else ())]
        calls += [((), cfg.harness_tasks)] if cfg.harness_tasks else []
        for bundled, standard in calls:
            t0 = time.perf_counter()
            got = run_harness(cfg.checkpoint, bundled, standard, cfg.limit, cfg.batch_size, max_length,
                              cfg.dtype, str(accelerator.device), cfg.data_dir, cfg.tokenizer)
            for metrics in got.values():
                metrics["seconds"] = time.perf_counter() - t0  # standard tasks: their total
            for task in bundled:  # what it scored, as the other engine says it
                got[task]["scored"] = lm_data.select(task, cfg.data_dir, cfg.limit).describe()
            results.update(got)
    payload = {
        "checkpoint": str(cfg.checkpoint),
        "engine": cfg.engine,
        "max_length": max_length,
        "num_processes": accelerator.num_processes,
        "config": asdict(cfg),
        "data": data,
        "results": results,
    }
    if accelerator.is_main_process:
        save_results(payload, output, TOOL)
        rows = [{"task": t, **m} for t, m in results.items()]
        cols = ["task", "acc", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "seconds", "scored"]
        print(format_table(rows, cols))
        print(f"results: {output}")
        flat = {f"zeroshot/{t}/{k}": v for t, m in results.items() for k, v in m.items()
                if isinstance(v, int | float)}
        log_results(flat, cfg.report_to, cfg.project, cfg.run_name, cfg.logging_dir or output.parent / "zeroshot_logs",
                    config=payload["config"], checkpoint=cfg.checkpoint, kind="zeroshot", default_project="zeroshot",
                    default_name=Path(cfg.checkpoint).name)
    return payload


def _split(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


EPILOG = """examples:
  python -m eval.zeroshot outputs/default/vcycle/final            # all four tasks; the results go beside the run,
                                                                  #   outputs/default.vcycle.final.eval_zeroshot.json
  python -m eval.zeroshot CKPT --limit 5000                       # a quick look: 5,000 words of each task
  python -m eval.zeroshot CKPT --engine harness                   # the same through lm-evaluation-harness
  torchrun --nproc_per_node 2 -m eval.zeroshot CKPT --cpu         # 2 CPU processes (GPUs: accelerate launch -m ...)

metrics (lm-evaluation-harness definitions):
  lambada     acc: every token of the last word is the greedy argmax; perplexity: exp(-mean word log-lik.)
  wikitext*   word_perplexity, byte_perplexity, bits_per_byte over whole pages with rolling windows
              (tokenized v1 test files: <unk> present, so not the harness's raw-page numbers)
  ptb         word_perplexity per PTB token incl. <eos>, whole test set as one stream
"""


def build_parser() -> argparse.ArgumentParser:
    """The CLI of ``python -m eval.zeroshot``."""
    p = argparse.ArgumentParser(
        prog="python -m eval.zeroshot",
        description="Zero-shot LAMBADA / WikiText-2 / WikiText-103 / PTB for a Hugging Face causal-LM folder "
        "(e.g. a train.py checkpoint), on the bundled test files, with lm-evaluation-harness semantics.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
    )
    p.add_argument("checkpoint", help="folder with config.json, weights and tokenizer (save_pretrained)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from {', '.join(TASKS)} (default: all)")
    p.add_argument("--limit", type=int, default=None, metavar="WORDS",
                   help="score the first WORDS words of every task, the same budget for each (whole LAMBADA "
                   "passages and PTB sentences, WikiText pages cut at a line; at least one of each; the test files "
                   "hold 306,006 / 241,335 / 82,430 words); each result says what it scored (a quick look: "
                   "--limit 5000)")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per forward pass (default: 8)")
    p.add_argument("--max_length", type=int, default=None,
                   help="window length in tokens (default: the model's context); longer text is windowed")
    p.add_argument("--engine", choices=ENGINES, default="ours",
                   help="ours (default): fast batched scorer; harness: lm-evaluation-harness on the same data")
    p.add_argument("--harness_tasks", default="",
                   help="standard lm-evaluation-harness tasks to run too, e.g. lambada_openai,wikitext (online)")
    p.add_argument("--dtype", default="float32", choices=[*DTYPES, "auto"],
                   help="model weights dtype (default: float32)")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder/name if the checkpoint has none")
    p.add_argument("--data_dir", default=None, help="folder laid out like data/ (default: bundled data/)")
    p.add_argument("--output", default=None, help="results JSON (default: beside the run, never inside it: "
                   "outputs/<run>.final.eval_zeroshot.json for outputs/<run>/final)")
    add_run_args(p, "zeroshot", "the checkpoint folder name", "<output folder>/zeroshot_logs", mixed_precision=False)
    return p


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """CLI entry point; returns what ``run`` returns."""
    quiet_transformers()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    a = build_parser().parse_args(argv)
    cfg = ZeroShotConfig(
        checkpoint=a.checkpoint, tasks=_split(a.tasks), harness_tasks=_split(a.harness_tasks), engine=a.engine,
        limit=a.limit, batch_size=a.batch_size, max_length=a.max_length, dtype=a.dtype, tokenizer=a.tokenizer,
        data_dir=a.data_dir, output=a.output, report_to=a.report_to, project=a.project, run_name=a.run_name,
        logging_dir=a.logging_dir, cpu=a.cpu,
    )
    return run(cfg)


def cli(argv: list[str] | None = None) -> int:
    """``python -m ...``: ``main`` with one-line errors (exit code 2) instead of tracebacks (``--debug``)."""

    return run_cli(main, argv)


if __name__ == "__main__":
    sys.exit(cli())
