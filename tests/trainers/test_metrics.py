"""Evaluation metrics: AUC against brute-force pair counts, the rest against hand computations."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from budgetplan.errors import InvalidParameterError
from trainers.metrics import auc, auc_standard_error, calibration_ratio, evaluate, log_loss, relative_auc_loss


def brute_force_auc(y, s) -> float:
    """P(score of a random positive > that of a random negative), ties 1/2, over all pairs: O(n^2)."""
    pos = [si for yi, si in zip(y, s) if yi == 1]
    neg = [si for yi, si in zip(y, s) if yi == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


# Few distinct scores so that ties are the rule, not the exception.
labelled_scores = st.lists(st.tuples(st.integers(0, 1), st.integers(-4, 4)), min_size=2, max_size=60)


@settings(max_examples=300, deadline=None)
@given(labelled_scores)
def test_auc_matches_brute_force_with_ties(pairs):
    y = [p[0] for p in pairs]
    s = [p[1] / 8 for p in pairs]  # dyadic: 1 - s below is exact, so ties survive the transform
    assume(0 < sum(y) < len(y))
    expected = brute_force_auc(y, s)
    assert auc(y, s) == pytest.approx(expected, abs=1e-15)
    # Reversing the order swaps wins and losses; ties still count one half.
    assert auc(y, [1 - v for v in s]) == pytest.approx(1 - expected, abs=1e-15)
    assert auc(y, [-v for v in s]) == pytest.approx(1 - expected, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(labelled_scores)
def test_auc_invariant_to_monotone_transforms(pairs):
    y = np.array([p[0] for p in pairs])
    s = np.array([p[1] for p in pairs], dtype=float)
    assume(0 < y.sum() < y.size)
    base = auc(y, s)
    for transform in (lambda x: 3 * x + 7, lambda x: x ** 3 + x, np.exp, lambda x: 1 / (1 + np.exp(-x))):
        assert auc(y, transform(s)) == pytest.approx(base, abs=1e-15)


def test_auc_closed_forms():
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.5]) == 0.5  # all tied
    assert auc([0, 1, 1], [0.2, 0.2, 0.9]) == 0.75           # one tie (1/2) and one win
    assert auc(np.array([False, True]), np.array([1, 2])) == 1.0


def test_auc_agrees_with_scipy_mann_whitney_at_scale():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(7)
    n = 200_000
    y = rng.random(n) < 0.05
    s = np.round(rng.normal(size=n) + 0.8 * y, 2)  # rounding: many ties
    u = mannwhitneyu(s[y], s[~y]).statistic
    assert auc(y.astype(np.int8), s) == pytest.approx(u / (y.sum() * (~y).sum()), rel=1e-12)


@pytest.mark.parametrize("y, s, match", [
    ([1, 1, 1], [0.1, 0.2, 0.3], "both classes"),
    ([0, 0], [0.1, 0.2], "both classes"),
    ([0, 1], [0.1, 0.2, 0.3], "same length"),
    ([0, 2], [0.1, 0.2], "only 0 and 1"),
    ([0, 1], [0.1, float("nan")], "finite"),
    ([], [], "empty"),
])
def test_auc_errors(y, s, match):
    with pytest.raises(ValueError, match=match):
        auc(y, s)


def test_log_loss_by_hand():
    y, p = [1, 0, 1], [0.9, 0.2, 0.6]
    expected = -(math.log(0.9) + math.log(0.8) + math.log(0.6)) / 3
    assert log_loss(y, p) == pytest.approx(expected, rel=1e-14)


def test_log_loss_clips_certain_mistakes():
    # 1 - (1 - 1e-15) is 9.992e-16 in float64, so the upper clip costs slightly more than 1e-15's.
    expected = -(math.log(1e-15) + math.log1p(-(1 - 1e-15))) / 2
    assert log_loss([1, 0], [0.0, 1.0]) == pytest.approx(expected, rel=1e-14)
    assert math.isfinite(log_loss([1], [0.0]))
    assert log_loss([1, 0], [1.0, 0.0]) == pytest.approx(-math.log(1 - 1e-15), abs=1e-15)


def test_log_loss_refuses_non_probabilities():
    with pytest.raises(ValueError, match="probabilities"):
        log_loss([0, 1], [-0.5, 2.0])


def test_calibration_ratio_by_hand():
    assert calibration_ratio([1, 0, 0, 1], [0.5, 0.25, 0.25, 0.5]) == pytest.approx(0.375 / 0.5)
    with pytest.raises(ValueError, match="positive"):
        calibration_ratio([0, 0], [0.1, 0.2])


def test_relative_auc_loss_by_hand():
    assert relative_auc_loss(0.7, 0.8) == pytest.approx(50.0)
    assert relative_auc_loss(0.8, 0.8) == 0.0
    assert relative_auc_loss(0.81, 0.8) == pytest.approx(-5.0)
    with pytest.raises(ValueError, match="auc_baseline"):
        relative_auc_loss(0.7, 1.0)
    with pytest.raises(ValueError, match="auc_private"):
        relative_auc_loss(float("nan"), 0.8)


def test_evaluate_dict():
    y = np.array([0, 0, 1, 1, 0])
    p = np.array([0.1, 0.4, 0.35, 0.8, 0.2])
    out = evaluate(y, p)
    assert set(out) == {"auc", "auc_loss", "log_loss", "calibration_ratio", "n", "positives"}
    assert out["auc"] == pytest.approx(brute_force_auc(y, p))
    assert out["auc_loss"] == pytest.approx(1 - out["auc"])
    assert out["log_loss"] == pytest.approx(log_loss(y, p))
    assert out["calibration_ratio"] == pytest.approx(p.mean() / 0.4)
    assert (out["n"], out["positives"]) == (5, 2)
    assert all(type(v) in (int, float) for v in out.values())
    with_baseline = evaluate(y, p, auc_baseline=0.9)
    assert with_baseline["relative_auc_loss"] == pytest.approx(relative_auc_loss(out["auc"], 0.9))


def test_metrics_do_not_import_torch():
    code = "import sys, trainers.metrics; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_diverged_model_gets_null_metrics_not_an_error():
    """Its privacy is spent by then: the record must be written, saying the model diverged."""
    import json

    from trainers.metrics import evaluate_model

    out = evaluate_model([0, 1, 1], [0.2, float("nan"), 0.9])
    assert out["auc"] is None and out["log_loss"] is None and "1 of 3 predictions" in out["diverged"]
    json.dumps(out, allow_nan=False)
    assert evaluate_model([0, 1], [0.2, 0.9])["auc"] == 1.0


def _exponential_scores(rng, positives, negatives, rate_pos, rate_neg):
    y = np.r_[np.ones(positives), np.zeros(negatives)]
    return y, np.r_[rng.exponential(1 / rate_pos, positives), rng.exponential(1 / rate_neg, negatives)]


def test_auc_standard_error_is_the_spread_of_the_auc_over_replicate_samples():
    """Hanley-McNeil is exact for exponential scores: Monte Carlo over 3000 replicate data sets.

    Scores Exp(rate 1) for positives and Exp(rate 4) for negatives have AUC = 4/5 exactly.
    With 20 positives and 200 negatives the two Q terms weigh very differently, so swapping
    them (or the class counts) moves the error by a third: 0.041 instead of 0.061.
    """
    rng = np.random.default_rng(1)
    areas = [auc(*_exponential_scores(rng, 20, 200, 1.0, 4.0)) for _ in range(3000)]
    assert np.mean(areas) == pytest.approx(0.8, abs=0.003)
    # the sample standard deviation of 3000 draws is within 3% of the truth (its own error ~1.3%)
    assert auc_standard_error(0.8, 20, 200) == pytest.approx(np.std(areas, ddof=1), rel=0.03)
    assert auc_standard_error(0.8, 200, 20) < 0.8 * np.std(areas, ddof=1)


@pytest.mark.parametrize("seed", [0, 1])
def test_auc_standard_error_agrees_with_a_stratified_bootstrap(seed):
    """One data set, its AUC's error by resampling each class (1000 times) against the formula."""
    rng = np.random.default_rng(seed)
    y, s = _exponential_scores(rng, 300, 3000, 1.0, 3.0)
    boot = [auc(y, np.r_[rng.choice(s[:300], 300), rng.choice(s[300:], 3000)]) for _ in range(1000)]
    assert auc_standard_error(auc(y, s), 300, 3000) == pytest.approx(np.std(boot, ddof=1), rel=0.1)


def test_auc_standard_error_closed_forms_and_bad_input():
    # A = 1/2 with one example per class: A(1-A) / 1 = 1/4, both Q terms multiplied by zero.
    assert auc_standard_error(0.5, 1, 1) == pytest.approx(0.5)
    # A perfect (or perfectly reversed) ranking has no spread to estimate.
    assert auc_standard_error(1.0, 50, 50) == 0.0 and auc_standard_error(0.0, 50, 50) == 0.0
    # More examples, less error: 1/sqrt(n) once both classes grow together.
    assert auc_standard_error(0.7, 400, 4000) == pytest.approx(auc_standard_error(0.7, 100, 1000) / 2, rel=0.01)
    for args in ((float("nan"), 5, 5), (1.2, 5, 5), (0.7, 0, 5), (0.7, 5, 2.5)):
        with pytest.raises(InvalidParameterError):
            auc_standard_error(*args)
