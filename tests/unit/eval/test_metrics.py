"""GLUE / top-1 metric definitions against values computed by hand (eval/metrics.py)."""

import math

import pytest

from eval import metrics as M

# 6 binary predictions: TP = 2 (rows 0, 4), FP = 1 (row 1), TN = 2 (rows 2, 3), FN = 1 (row 5)
PRED = [1, 1, 0, 0, 1, 0]
GOLD = [1, 0, 0, 0, 1, 1]


def test_accuracy_counts_equal_predictions():
    assert M.accuracy(PRED, GOLD) == pytest.approx(4 / 6)


def test_f1_is_two_tp_over_two_tp_plus_fp_plus_fn():
    assert M.f1_binary(PRED, GOLD) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))


def test_matthews_matches_confusion_matrix_formula():
    tp, fp, tn, fn = 2, 1, 2, 1
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert mcc == pytest.approx(1 / 3)
    assert M.matthews(PRED, GOLD) == pytest.approx(mcc)


def test_matthews_is_zero_for_constant_predictions():
    assert M.matthews([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0


def test_pearson_matches_hand_computed_covariance():
    # dx = [-1.5, -.5, .5, 1.5], dy = [-3, -1, 0, 4]: sum dx dy = 11, sum dx^2 = 5, sum dy^2 = 26
    assert M.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(5 * 26))


def test_spearman_uses_average_ranks_for_ties():
    # ranks x = [1, 2.5, 2.5, 4], y = [1, 3, 2, 4] -> Pearson of ranks = 4.5 / sqrt(4.5 * 5)
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_glue_metrics_names_per_task_match_hf_evaluate():
    assert set(M.glue_metrics("cola", PRED, GOLD)) == {"matthews_correlation"}
    assert M.glue_metrics("mrpc", PRED, GOLD) == pytest.approx({"accuracy": 4 / 6, "f1": 2 / 3})
    assert set(M.glue_metrics("qqp", PRED, GOLD)) == {"accuracy", "f1"}
    assert set(M.glue_metrics("stsb", [0.1, 2.0, 3.5], [0.0, 2.5, 5.0])) == {"pearson", "spearmanr"}
    for k in ("sst2", "qnli", "rte", "wnli", "mnli_m", "mnli_mm"):
        assert set(M.glue_metrics(k, PRED, GOLD)) == {"accuracy"}
    with pytest.raises(KeyError, match="unknown GLUE evaluation set"):
        M.glue_metrics("squad", PRED, GOLD)


def test_glue_average_means_paired_metrics_and_excludes_wnli():
    res = {"mrpc": {"accuracy": 0.80, "f1": 0.90}, "stsb": {"pearson": 0.70, "spearmanr": 0.90},
           "cola": {"matthews_correlation": 0.50}, "wnli": {"accuracy": 0.90}}
    assert M.glue_average(res) == pytest.approx((85 + 80 + 50) / 3)
    assert M.glue_average(res, include_wnli=True) == pytest.approx((85 + 80 + 50 + 90) / 4)


def test_glue_average_reproduces_bert_base_table1_with_mnli_m_and_mm_separate():
    # BERT paper Table 1, BERT-Base row (one metric per task there): average 79.6 = mean of 9 numbers
    res = {"mnli_m": {"accuracy": 0.846}, "mnli_mm": {"accuracy": 0.834}, "qqp": {"f1": 0.712},
           "qnli": {"accuracy": 0.905}, "sst2": {"accuracy": 0.935}, "cola": {"matthews_correlation": 0.521},
           "stsb": {"spearmanr": 0.858}, "mrpc": {"f1": 0.889}, "rte": {"accuracy": 0.664}}
    assert round(M.glue_average(res), 1) == 79.6


def test_metric_errors_name_the_problem():
    with pytest.raises(ValueError, match="differ in shape"):
        M.accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="no GLUE results"):
        M.glue_average({"wnli": {"accuracy": 0.5}})
    with pytest.raises(ValueError, match="unknown GLUE evaluation set"):
        M.glue_average({"mnli": {"accuracy": 0.5}})
