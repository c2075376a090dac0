"""GLUE tasks as data: the task table, reading the bundled TSVs with label checks, and the Hub fallback.

Shared by eval.glue (fine-tuning evaluation of a checkpoint) and progressive.data.classify (training
through train.py). Bundled files: data/glue/<TASK>/{train,dev}.tsv.gz, GLUE's own unquoted TSVs (CoLA
without header; MRPC's header starts with a UTF-8 BOM). QNLI has dev only there; QNLI, MNLI and QQP
train come from TSVs in ``data_dir`` if present, else from the Hugging Face ``glue`` dataset when online,
else ``OfflineSkip``. Label ids follow HF ``glue``'s ClassLabel order (RTE/QNLI: entailment=0,
not_entailment=1; MNLI: entailment, neutral, contradiction).
"""

from __future__ import annotations

import csv
import gzip
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common.paths import DATA

log = logging.getLogger("glue")
DATA_DIR = DATA / "glue"
HF_GLUE_REPO = "nyu-mll/glue"  # the Hub's canonical id of the `glue` dataset (the bare name redirects to it)


@dataclass(frozen=True)
class Task:
    """Where one GLUE task's data lives and how to read it."""

    name: str                      # HF config name
    dirname: str                   # GLUE folder name
    text: tuple[str, ...]          # TSV header columns (CoLA has no header: column indices as strings)
    label: str                     # TSV label column
    dev: dict[str, str]            # eval set -> dev file stem
    labels: tuple[str, ...] = ("0", "1")   # TSV label strings, in HF ClassLabel order; () = regression
    hf_text: tuple[str, ...] = ("sentence1", "sentence2")
    hf_dev: dict[str, str] = field(default_factory=lambda: {})
    header: bool = True

    @property
    def num_labels(self) -> int:
        return len(self.labels) or 1


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("cola", "CoLA", ("3",), "1", {"cola": "dev"}, hf_text=("sentence",), header=False),
    Task("sst2", "SST-2", ("sentence",), "label", {"sst2": "dev"}, hf_text=("sentence",)),
    Task("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", {"mrpc": "dev"}),
    Task("stsb", "STS-B", ("sentence1", "sentence2"), "score", {"stsb": "dev"}, labels=()),
    Task("qqp", "QQP", ("question1", "question2"), "is_duplicate", {"qqp": "dev"}, hf_text=("question1", "question2")),
    Task("mnli", "MNLI", ("sentence1", "sentence2"), "gold_label",
         {"mnli_m": "dev_matched", "mnli_mm": "dev_mismatched"},
         labels=("entailment", "neutral", "contradiction"), hf_text=("premise", "hypothesis"),
         hf_dev={"mnli_m": "validation_matched", "mnli_mm": "validation_mismatched"}),
    Task("qnli", "QNLI", ("question", "sentence"), "label", {"qnli": "dev"}, labels=("entailment", "not_entailment"),
         hf_text=("question", "sentence")),
    Task("rte", "RTE", ("sentence1", "sentence2"), "label", {"rte": "dev"}, labels=("entailment", "not_entailment")),
    Task("wnli", "WNLI", ("sentence1", "sentence2"), "label", {"wnli": "dev"}),
]}
ALIASES = {"sst-2": "sst2", "sts-b": "stsb", "mnli-m": "mnli"}


class OfflineSkip(Exception):
    """A task whose data needs the network, which is not available (documented skip, not a failure)."""


# ----------------------------------------------------------------------------------------------- data
def read_tsv(path: Path, task: Task) -> tuple[list[tuple[str, ...]], list]:
    """Read one GLUE TSV: texts and labels (class ids, or floats for STS-B).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a row with the wrong number of fields, a missing column, or a label outside the
            task's label set (the message names the file and line).
    """
    if not path.exists():
        raise FileNotFoundError(f"GLUE file not found: {path} (task {task.name}; --data_dir points at the GLUE folder)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as f:  # -sig: MRPC's header starts with a BOM
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))  # GLUE TSVs are unquoted
    if task.header:
        header, rows, first = rows[0], rows[1:], 2
        missing = [c for c in (*task.text, task.label) if c not in header]
        if missing:
            raise ValueError(f"{path}: column(s) {missing} not in header {header}")
        idx = [header.index(c) for c in task.text]
        li = header.index(task.label)
    else:
        header, first = None, 1
        idx, li = [int(c) for c in task.text], int(task.label)
    width = len(header) if header else len(rows[0]) if rows else 0
    texts, labels = [], []
    for n, row in enumerate(rows, start=first):
        if not row:
            continue
        if len(row) != width:
            raise ValueError(f"{path}:{n}: expected {width} tab-separated fields, got {len(row)}")
        texts.append(tuple(row[i] for i in idx))
        labels.append(_label(row[li], task, f"{path}:{n}"))
    return texts, labels


def _label(raw: str | int | float, task: Task, where: str):
    if not task.labels:  # STS-B: similarity score in [0, 5]
        try:
            y = float(raw)
        except ValueError:
            y = float("nan")
        if not 0.0 <= y <= 5.0:
            raise ValueError(f"{where}: STS-B score {raw!r} is not a number in [0, 5]")
        return y
    if isinstance(raw, int | np.integer):  # HF datasets give class ids already
        if not 0 <= raw < task.num_labels:
            raise ValueError(f"{where}: label {raw} outside {task.name}'s classes 0..{task.num_labels - 1}")
        return int(raw)
    if raw not in task.labels:
        raise ValueError(f"{where}: label {raw!r} not in {task.name}'s label set {list(task.labels)}")
    return task.labels.index(raw)


def load_task(task: Task, data_dir: str | Path) -> tuple[tuple, dict[str, tuple]]:
    """Train split and dev split(s) of ``task`` as ``(texts, labels)`` pairs.

    Local TSVs in ``data_dir/<TASK>/`` (``.tsv.gz`` or ``.tsv``) win; QNLI/MNLI/QQP fall back to the HF
    ``glue`` dataset when a local train file is missing and the network is allowed.

    Raises:
        FileNotFoundError: a bundled task's file is missing (the message names the path).
        OfflineSkip: the task needs the Hub and HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set or the
            download failed.
    """
    folder = Path(data_dir) / task.dirname

    def local(stem: str) -> Path:
        gz = folder / f"{stem}.tsv.gz"
        return gz if gz.exists() or not (folder / f"{stem}.tsv").exists() else folder / f"{stem}.tsv"

    files = [local("train")] + [local(s) for s in task.dev.values()]
    if all(p.exists() for p in files) or task.name not in ("qnli", "mnli", "qqp"):
        train = read_tsv(files[0], task)
        return train, {k: read_tsv(p, task) for k, p in zip(task.dev, files[1:])}
    missing = [str(p) for p in files if not p.exists()]
    if _offline():
        raise OfflineSkip(f"{task.name}: no local {', '.join(missing)} and offline (HF_DATASETS_OFFLINE/"
                          f"HF_HUB_OFFLINE set), so its train split cannot come from the Hub")
    try:
        from datasets import load_dataset

        ds = load_dataset(HF_GLUE_REPO, task.name)
    except Exception as e:  # no network, Hub down: documented skip with the reason
        raise OfflineSkip(f"{task.name}: no local {', '.join(missing)} and load_dataset({HF_GLUE_REPO!r}, "
                          f"{task.name!r}) failed: {type(e).__name__}: {e}") from e
    log.info("%s: train/dev from the Hugging Face hub (%s)", task.name, HF_GLUE_REPO)

    def split(name: str) -> tuple:
        d = ds[name]
        texts = list(zip(*(d[c] for c in task.hf_text)))
        return texts, [_label(y, task, f"{HF_GLUE_REPO}/{task.name}/{name} row {i}") for i, y in enumerate(d["label"])]

    return split("train"), {k: split(task.hf_dev.get(k, "validation")) for k in task.dev}


def _offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
