"""GLUE and image-classification metrics, computed with scikit-learn / scipy (no network).

Official GLUE definitions (the same keys and values as HF ``evaluate.load("glue", cfg)``, which needs the
Hub at run time, so we do not use it):

    cola          matthews_correlation   (sklearn.metrics.matthews_corrcoef)
    stsb          pearson, spearmanr     (scipy.stats.pearsonr / spearmanr on float predictions)
    mrpc, qqp     accuracy, f1           (f1: sklearn binary F1, class 1 = "paraphrase/duplicate" positive)
    everything    accuracy
    else

Values are fractions in [0, 1] (correlations in [-1, 1]); tables and the GLUE average are x100, as papers print.

GLUE average, the convention used here (papers differ; ours is written out so numbers can be compared):
    1. per evaluation set, the mean of its metrics (MRPC: (acc + F1) / 2, STS-B: (Pearson + Spearman) / 2,
       QQP: (acc + F1) / 2, CoLA: Matthews, others: accuracy) -- the GLUE benchmark's rule for tasks with
       two metrics;
    2. MNLI contributes two entries, matched (``mnli_m``) and mismatched (``mnli_mm``), as in the BERT
       paper's Table 1 (its 79.6 average for BERT-Base is the mean of nine numbers: MNLI-m, MNLI-mm, QQP,
       QNLI, SST-2, CoLA, STS-B, MRPC, RTE);
    3. WNLI is left out by default (BERT, RoBERTa and most follow-ups do: its dev set is adversarial and
       fine-tuned models score below the majority class); ``include_wnli=True`` keeps it;
    4. the average is the plain mean of the entries present, x100. Entries that were not run (e.g. QQP
       offline) are simply absent, so always report *which* entries went into an average.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

# Metric names per GLUE evaluation set (keys as HF evaluate returns them).
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "qqp": ("accuracy", "f1"),
    "mnli_m": ("accuracy",),
    "mnli_mm": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def accuracy(preds: Sequence, labels: Sequence) -> float:
    """Fraction of ``preds`` equal to ``labels`` (top-1 accuracy when preds are argmax classes).

    Raises:
        ValueError: different lengths or no examples.
    """
    p, y = _pair(preds, labels)
    return float(accuracy_score(y, p))


def f1_binary(preds: Sequence, labels: Sequence) -> float:
    """Binary F1 with class 1 positive: 2 TP / (2 TP + FP + FN); 0.0 when there is no positive at all."""
    p, y = _pair(preds, labels)
    return float(f1_score(y, p, pos_label=1, average="binary", zero_division=0.0))


def matthews(preds: Sequence, labels: Sequence) -> float:
    """Matthews correlation (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)); 0.0 if a marginal is empty."""
    p, y = _pair(preds, labels)
    return float(matthews_corrcoef(y, p))


def pearson(preds: Sequence, labels: Sequence) -> float:
    """Pearson correlation of float predictions with gold scores (nan if either side is constant)."""
    p, y = _pair(preds, labels)
    if np.ptp(p) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(pearsonr(p.astype(np.float64), y.astype(np.float64))[0])


def spearman(preds: Sequence, labels: Sequence) -> float:
    """Spearman rank correlation (ties get average ranks) of predictions with gold scores."""
    p, y = _pair(preds, labels)
    if np.ptp(p) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(p.astype(np.float64), y.astype(np.float64))[0])


_FNS = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "matthews_correlation": matthews,
    "pearson": pearson,
    "spearmanr": spearman,
}


def glue_metrics(eval_set: str, preds: Sequence, labels: Sequence) -> dict[str, float]:
    """The official metrics of one GLUE evaluation set.

    Args:
        eval_set: a key of GLUE_METRICS (``mnli_m`` / ``mnli_mm`` for MNLI's two dev sets).
        preds: class ids (argmax of the logits), or float scores for ``stsb``.
        labels: gold class ids, or gold float scores for ``stsb``.

    Returns:
        ``{metric_name: value}`` with the names HF ``evaluate`` uses (fractions, not percentages).

    Raises:
        KeyError: unknown evaluation set.
    """
    if eval_set not in GLUE_METRICS:
        raise KeyError(f"unknown GLUE evaluation set {eval_set!r}; known: {', '.join(GLUE_METRICS)}")
    return {name: _FNS[name](preds, labels) for name in GLUE_METRICS[eval_set]}


def glue_score(metrics: Mapping[str, float]) -> float:
    """One number per evaluation set: the mean of its metrics (e.g. MRPC (acc + F1) / 2), as a fraction."""
    if not metrics:
        raise ValueError("glue_score needs at least one metric")
    return float(np.mean([float(v) for v in metrics.values()]))


def glue_average(results: Mapping[str, Mapping[str, float]], include_wnli: bool = False) -> float:
    """The GLUE average, x100, by the convention in this module's docstring.

    Args:
        results: ``{eval_set: {metric: value}}``, values as fractions (e.g. ``{"cola": {"matthews_correlation":
            0.52}, "mrpc": {"accuracy": 0.85, "f1": 0.89}, ...}``).
        include_wnli: count WNLI too (the GLUE leaderboard does; papers usually do not).

    Returns:
        Mean over the entries present of each entry's ``glue_score``, times 100.

    Raises:
        ValueError: no entry left to average, or an unknown evaluation set.
    """
    unknown = set(results) - set(GLUE_METRICS)
    if unknown:
        raise ValueError(f"unknown GLUE evaluation set(s) {sorted(unknown)}; known: {', '.join(GLUE_METRICS)}")
    entries = [glue_score(m) for k, m in results.items() if include_wnli or k != "wnli"]
    if not entries:
        raise ValueError("no GLUE results to average (WNLI alone is excluded unless include_wnli=True)")
    return 100.0 * float(np.mean(entries))


def _pair(preds: Sequence, labels: Sequence) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(preds), np.asarray(labels)
    if p.shape != y.shape:
        raise ValueError(f"predictions and labels differ in shape: {p.shape} vs {y.shape}")
    if p.size == 0:
        raise ValueError("no examples to score")
    return p.reshape(-1), y.reshape(-1)
