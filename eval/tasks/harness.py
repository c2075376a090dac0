"""lm-evaluation-harness (0.4.13) as an engine, on the bundled files.

Each bundled task is the harness's OWN task config (loaded from the installed ``lambada_openai.yaml``
and ``wikitext.yaml``: prompts, detokenizer, word/byte counting and aggregation all come from there)
with only the data source and the task name replaced:

- ``lambada_openai_bundled``: ``dataset_path: json`` on data/lambada/lambada_test.jsonl.gz (the same
  file as EleutherAI/lambada_openai's test split);
- ``wikitext2_bundled`` / ``wikitext103_bundled``: the pages of the tokenized test files
  (``eval.tasks.lm_data.load_wikitext``), i.e. EleutherAI/wikitext_document_level's ``wikitext-2-v1`` /
  ``wikitext-103-v1`` test split instead of the task's ``wikitext-2-raw-v1``;
- ``ptb_bundled``: no harness task exists; an inline ``loglikelihood_rolling`` config over the PTB
  stream (``lm_data.load_ptb``) with our word count (words + ``<eos>``) as ``process_results``.

Online, any standard harness task can be named instead (``harness_tasks``, e.g. ``lambada_openai``,
``wikitext``); their metrics are returned under the harness's names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.tasks import lm_data

BUNDLED = {
    "lambada": "lambada_openai_bundled",
    "wikitext2": "wikitext2_bundled",
    "wikitext103": "wikitext103_bundled",
    "ptb": "ptb_bundled",
}


# The harness's own task files (paths inside the installed lm_eval 0.4.13, pinned in requirements.txt).
OFFICIAL_YAML = {"lambada_openai": "lambada/lambada_openai.yaml", "wikitext": "wikitext/wikitext.yaml"}


def _official_config(name: str) -> dict[str, Any]:
    """The harness's own config for task ``name`` with its !function entries resolved.

    Read from its file directly: building a full TaskManager index parses ~14k YAML files (~15 s).
    ``load_yaml`` is internal to lm_eval; if a new version moves it, this fails loudly, not silently.
    """
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    return dict(load_yaml(Path(lm_eval.tasks.__file__).parent / OFFICIAL_YAML[name], resolve_func=True))


def _dataset(docs: list[str], field: str):
    from datasets import Dataset, DatasetDict

    return DatasetDict({"test": Dataset.from_dict({field: docs})})


def _ptb_target(doc: dict) -> str:
    return doc["page"]


def _ptb_process_results(doc: dict, results: Sequence[float]) -> dict[str, tuple[float, int]]:
    (ll,) = results
    words, n_bytes = lm_data.ptb_counts(doc["page"])
    return {"word_perplexity": (ll, words), "byte_perplexity": (ll, n_bytes), "bits_per_byte": (ll, n_bytes)}


def bundled_task_configs(
    tasks: Sequence[str], limit: int | None = None, data_dir: str | Path | None = None
) -> list[dict[str, Any]]:
    """Harness task configs (dicts for ``lm_eval.simple_evaluate``) for our task names on bundled data.

    ``limit``: the first ``limit`` words of every task, cut here exactly as ``eval.zeroshot`` cuts them
    (``lm_data.select``), so the harness scores the same texts and is given no limit of its own.
    """
    out = []
    for task in tasks:
        if task == "lambada":
            cfg = _official_config("lambada_openai")
            if limit is None:  # the released file itself
                cfg.update(dataset_path="json", dataset_name=None,
                           dataset_kwargs={"data_files": {"test": str(lm_data.data_file("lambada", data_dir))}})
            else:
                texts = lm_data.select(task, data_dir, limit).texts
                cfg.update(dataset_path=None, dataset_name=None,
                           custom_dataset=lambda t=texts, **_: _dataset(t, "text"))
                cfg.pop("dataset_kwargs", None)
        elif task in ("wikitext2", "wikitext103"):
            cfg = _official_config("wikitext")
            pages = lm_data.select(task, data_dir, limit).texts
            cfg.update(dataset_path=None, dataset_name=None, custom_dataset=lambda p=pages, **_: _dataset(p, "page"))
            cfg.pop("training_split", None)
            cfg.pop("validation_split", None)
        elif task == "ptb":
            docs = lm_data.select(task, data_dir, limit).texts
            cfg = {
                "output_type": "loglikelihood_rolling",
                "custom_dataset": lambda d=docs, **_: _dataset(d, "page"),
                "test_split": "test",
                "doc_to_text": "",
                "doc_to_target": _ptb_target,
                "process_results": _ptb_process_results,
                "metric_list": [{"metric": m} for m in ("word_perplexity", "byte_perplexity", "bits_per_byte")],
                "metadata": {"version": 1.0},
            }
        else:
            raise KeyError(f"unknown task {task!r}; choose from {', '.join(BUNDLED)}")
        cfg["task"] = BUNDLED[task]
        cfg.pop("tag", None)
        out.append(cfg)
    return out


def run_harness(
    checkpoint: str | Path,
    tasks: Sequence[str] = (),
    harness_tasks: Sequence[str] = (),
    limit: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    data_dir: str | Path | None = None,
    tokenizer: str | Path | None = None,
) -> dict[str, dict[str, float]]:
    """Evaluate ``checkpoint`` with lm-evaluation-harness's HF model on our bundled ``tasks`` and/or any
    standard ``harness_tasks`` (online). Returns {our task name or harness task name: {metric: value}}
    with the harness's ",none" filter suffix removed and its stderr entries dropped."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    if limit is not None and harness_tasks:
        raise ValueError("a limit counts the words of the bundled tasks; the harness's own tasks are not read here: "
                         "run them without one")
    tm = TaskManager(include_defaults=bool(harness_tasks))  # the full index only when names must resolve
    specs: list[Any] = bundled_task_configs(tasks, limit, data_dir) + list(harness_tasks)
    model_args: dict[str, Any] = {"pretrained": str(checkpoint), "dtype": dtype}
    if max_length is not None:
        model_args["max_length"] = int(max_length)
    if tokenizer is not None:
        model_args["tokenizer"] = str(tokenizer)
    try:
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=specs,
            limit=None,  # the bundled tasks' texts were cut to the budget above
            batch_size=batch_size,
            device=device,
            task_manager=tm,
            log_samples=False,
            bootstrap_iters=0,  # no stderr estimates: they cost time and we report point values
        )
    except ConnectionError as e:
        raise ConnectionError(
            f"{e}. Standard harness tasks ({', '.join(harness_tasks)}) download their datasets from the "
            "Hugging Face Hub (or read its cache); offline, evaluate the bundled copies with --tasks instead."
        ) from e
    back = {v: k for k, v in BUNDLED.items()}
    results: dict[str, dict[str, float]] = {}
    for name, metrics in out["results"].items():
        clean = {}
        for key, value in metrics.items():
            metric, _, _filter = key.partition(",")
            if metric.endswith("_stderr") or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            clean["n_examples" if metric == "sample_len" else metric] = float(value)
        results[back.get(name, name)] = clean
    return results
