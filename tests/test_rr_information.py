"""The yardstick of benchmarks/rr_information.py: the share of the labels' Fisher information RR keeps."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from rr_information import fisher_share, kept_users  # noqa: E402


@pytest.mark.parametrize("p", [0.01, 0.04, 0.3])
@pytest.mark.parametrize("epsilon", [1.0, 3.0, 8.0])
def test_the_share_is_the_rr_labels_information_over_the_clean_labels(p, epsilon):
    """Simulated: the variance of the logit's score from flipped labels over that from clean ones."""
    rng = np.random.default_rng(7)
    rho = 1 / (1 + math.exp(epsilon))
    n = 2_000_000
    y = rng.random(n) < p
    z = y ^ (rng.random(n) < rho)
    q = rho + (1 - 2 * rho) * p
    dq = (1 - 2 * rho) * p * (1 - p)  # d q / d logit(p)
    rr_information = np.mean((dq * (z - q) / (q * (1 - q))) ** 2)
    clean_information = np.mean((y - p) ** 2)
    assert fisher_share([p], epsilon) == pytest.approx(rr_information / clean_information, rel=0.02)


def test_the_share_over_rows_weighs_each_row_by_its_clean_information():
    p = np.array([0.01, 0.2, 0.5])
    rho = 1 / (1 + math.exp(3.0))
    shares = [fisher_share([x], 3.0) for x in p]
    weights = p * (1 - p)
    assert fisher_share(p, 3.0) == pytest.approx(float(np.dot(shares, weights) / weights.sum()), rel=1e-12)
    assert 0 < shares[0] < shares[1] < shares[2] < 1  # rare positives lose most to the flips
    assert shares[2] == pytest.approx((1 - 2 * rho) ** 2, rel=1e-12)  # at p = 1/2, q = 1/2
    assert fisher_share(p, 40.0) == pytest.approx(1.0, abs=1e-12)


def test_the_users_kept_are_about_the_share_and_nested():
    ids = np.arange(1, 200_001)
    small, large = kept_users(ids, 0.3), kept_users(ids, 0.6)
    assert abs(small.mean() - 0.3) < 0.005 and abs(large.mean() - 0.6) < 0.005
    assert not (small & ~large).any()
    assert kept_users(ids, 1.0).all() and not kept_users(ids, 0.0).any()
