"""The debiased validation metrics estimate the true-label metrics from RR labels.

Exactness in expectation is checked by enumerating every flip pattern of a small set of rows
with its probability (a closed-form expectation, no sampling); the AUC ratio, which is only
consistent, by simulation at several flip probabilities; and each test is shown able to fail
(the naive metrics on noisy labels are measurably biased under the same checks).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.intercept import rr_estimate
from trainers.debiased import debiased_auc, debiased_auc_parts, debiased_log_loss
from trainers.metrics import auc, log_loss


def _expectation(fn, y, rho):
    """E[fn(noisy)] over every flip pattern of y, row i flipped with probability rho[i]."""
    total = 0.0
    for flips in itertools.product((0, 1), repeat=y.size):
        f = np.array(flips)
        weight = np.prod(np.where(f == 1, rho, 1 - rho))
        total += weight * fn(np.where(f == 1, 1 - y, y))
    return total


CASES = [
    (np.array([1, 0, 0, 1, 0, 0, 1]), np.array([0.9, 0.2, 0.4, 0.4, 0.1, 0.75, 0.3]), 0.1),
    (np.array([0, 1, 0, 0, 1, 0, 0, 0]), np.array([0.5, 0.5, 0.2, 0.8, 0.8, 0.1, 0.5, 0.3]), 0.3),  # ties
    (np.array([1, 1, 0, 0, 0, 1]), np.array([0.6, 0.3, 0.3, 0.05, 0.7, 0.9]),
     np.array([0.01, 0.2, 0.45, 0.1, 0.3, 0.25])),  # a flip probability per row (eps/K_i)
]


@pytest.mark.parametrize("y, p, rho", CASES)
def test_log_loss_is_unbiased_exactly(y, p, rho):
    rho = np.broadcast_to(rho, y.shape).astype(float)
    expected = _expectation(lambda r: debiased_log_loss(p, r, rho), y, rho)
    assert expected == pytest.approx(log_loss(y, p), rel=1e-12)
    naive = _expectation(lambda r: log_loss(r, p), y, rho)
    assert abs(naive - log_loss(y, p)) > 1e-3  # the check can fail: noisy labels alone are biased


@pytest.mark.parametrize("y, p, rho", CASES)
def test_auc_numerator_and_denominator_are_unbiased_exactly(y, p, rho):
    rho = np.broadcast_to(rho, y.shape).astype(float)
    n1, n0 = int(y.sum()), int(y.size - y.sum())
    numerator = _expectation(lambda r: debiased_auc_parts(p, r, rho)[0], y, rho)
    denominator = _expectation(lambda r: debiased_auc_parts(p, r, rho)[1], y, rho)
    assert denominator == pytest.approx(n1 * n0, rel=1e-12)
    assert numerator / (n1 * n0) == pytest.approx(auc(y, p), rel=1e-12)
    assert _expectation(lambda r: rr_estimate(r, rho)[0], y, rho) == pytest.approx(n1, rel=1e-12)


def test_without_flips_the_estimates_are_the_true_metrics():
    rng = np.random.default_rng(0)
    y = (rng.random(500) < 0.2).astype(int)
    p = np.round(0.01 + 0.98 * rng.random(500), 2)  # many ties, none at 0 or 1 (the clips differ)
    assert debiased_auc(p, y, 0.0) == pytest.approx(auc(y, p), abs=1e-12)
    assert debiased_log_loss(p, y, 0.0) == pytest.approx(log_loss(y, p), rel=1e-9)


@pytest.mark.parametrize("rho", [0.05, 0.2, 0.35])
def test_auc_ratio_is_unbiased_by_simulation(rho):
    rng = np.random.default_rng(int(rho * 100))
    n, draws = 4000, 400
    z = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(z - 1.5)))).astype(int)
    true = auc(y, z)
    estimates, naive = [], []
    for _ in range(draws):
        noisy = np.where(rng.random(n) < rho, 1 - y, y)
        estimates.append(debiased_auc(z, noisy, rho))
        naive.append(auc(noisy, z))
    estimates = np.array(estimates)
    standard_error = estimates.std() / np.sqrt(draws)
    assert abs(estimates.mean() - true) < 4 * standard_error + 1e-4
    assert abs(np.mean(naive) - true) > 10 * standard_error  # the naive AUC on noisy labels is biased


def test_bad_input_is_refused():
    with pytest.raises(InvalidParameterError, match="flip probabilities"):
        debiased_log_loss([0.5], [1], 0.5)
    with pytest.raises(InvalidParameterError, match="0 or 1"):
        debiased_auc([0.5, 0.2], [1, 2], 0.1)
    with pytest.raises(InvalidParameterError, match="same length"):
        debiased_auc([0.5, 0.2], [1], 0.1)
    with pytest.raises(InvalidParameterError, match="finite"):
        debiased_log_loss([np.nan], [1], 0.1)
