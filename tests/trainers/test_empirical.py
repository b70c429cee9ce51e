"""Empirical lower bounds on epsilon, measured on the trainer's real mechanism code.

Every check is seeded, so a run is reproducible. False-alarm rates, for a correct
implementation and an unseeded (CSPRNG) run:
- "bound <= planned epsilon": at most 1 - confidence = 1e-6 (the two Clopper-Pearson bounds
  hold with that probability; the threshold is chosen on a disjoint half).
- RR "bound >= eps - 0.05": the bound sits 0.004 to 0.008 below eps with a standard deviation
  of about 0.001 at 5M labels per neighbour: a miss is 35 standard deviations away.
- "bound > 0" (power) and "mutant caught": margins measured by simulating the same
  statistic on exact samples of each mechanism's output distribution (300 replicates for
  the Gaussian, 200 for DP-SGD), stated at each test; none is closer than 7 standard
  deviations (normal tail below 1e-11).
"""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from budgetplan.accounting import account
from budgetplan.accounting.gaussian import analytic_epsilon, analytic_sigma
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import PoissonDPSGD
from trainers.dpsgd import noisy_gradient
from trainers.empirical import (
    DEFAULT_CONFIDENCE,
    Result,
    _walr_neighbours,
    dpsgd_lower_bound,
    epsilon_from_counts,
    gaussian_lower_bound,
    rr_lower_bound,
)
from trainers.randomness import Randomness
from trainers.rr_phase import randomize_labels
from trainers.walr import release

DELTA = 1e-5
DPSGD_PLAN = {"noise_multiplier": 1.0, "sampling_rate": 0.1, "steps": 20, "clipping_norm": 0.5, "delta": DELTA}


# ---- the statistics -------------------------------------------------------------------------


def test_clopper_pearson_matches_the_closed_forms_at_the_extremes():
    n, alpha = 1000, (1 - DEFAULT_CONFIDENCE) / 2
    # no event under the denominator: upper bound 1 - alpha^(1/n); every trial an event: lower alpha^(1/n)
    eps, lo, hi = epsilon_from_counts(hits_numerator=n, n_numerator=n, hits_denominator=0, n_denominator=n,
                                      delta=0.0)
    assert lo == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert hi == pytest.approx(-math.expm1(math.log(alpha) / n), rel=1e-9)
    assert eps == pytest.approx(math.log(lo / hi), rel=1e-12)


def test_bound_subtracts_delta_and_is_never_negative():
    base = {"hits_numerator": 30_000, "n_numerator": 100_000, "hits_denominator": 10_000, "n_denominator": 100_000}
    e0, lo, hi = epsilon_from_counts(**base, delta=0.0)
    assert e0 == pytest.approx(math.log(lo / hi)) and 0.9 < e0 < math.log(3)
    e1, _, _ = epsilon_from_counts(**base, delta=0.1)
    assert e1 == pytest.approx(math.log((lo - 0.1) / hi)) and 0 < e1 < e0
    assert epsilon_from_counts(**base, delta=lo)[0] == 0.0
    assert epsilon_from_counts(hits_numerator=1000, n_numerator=100_000, hits_denominator=3000,
                               n_denominator=100_000, delta=0.0)[0] == 0.0


def test_clopper_pearson_covers_at_the_stated_rate():
    # 2000 binomial draws at a loose level (alpha = 0.05 per side): coverage failures ~ Binomial(2000, <= 0.05)
    rng = np.random.default_rng(1)
    p, n = 0.03, 500
    ks = rng.binomial(n, p, 2000)
    lows = np.array([epsilon_from_counts(hits_numerator=int(k), n_numerator=n, hits_denominator=0, n_denominator=n,
                                         delta=0.0, confidence=0.9)[1] for k in ks])
    misses = int(np.count_nonzero(lows > p))
    assert misses <= stats.binom.ppf(1 - 1e-6, 2000, 0.05)


def test_counts_are_validated():
    with pytest.raises(InvalidParameterError, match="hits_numerator"):
        epsilon_from_counts(hits_numerator=11, n_numerator=10, hits_denominator=0, n_denominator=10, delta=0.0)
    with pytest.raises(InvalidParameterError, match="confidence"):
        epsilon_from_counts(hits_numerator=1, n_numerator=10, hits_denominator=0, n_denominator=10, delta=0.0,
                            confidence=1.0)


def test_inputs_are_validated():
    with pytest.raises(InvalidParameterError, match="epsilon"):
        rr_lower_bound(epsilon=float("nan"))
    with pytest.raises(InvalidParameterError, match="noise_std"):
        gaussian_lower_bound(noise_std=0.0, sensitivity=1.0, delta=DELTA)
    with pytest.raises(InvalidParameterError, match="delta"):
        dpsgd_lower_bound(**{**DPSGD_PLAN, "delta": 0.0})


# ---- randomized response --------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_rr_bound_is_tight_and_never_above_the_plan(epsilon):
    r = rr_lower_bound(epsilon=epsilon, randomness=Randomness(11))
    assert isinstance(r, Result) and r.mechanism == "randomized-response" and r.delta == 0.0
    assert r.samples == 5_000_000 and r.confidence == DEFAULT_CONFIDENCE
    assert r.passed and r.epsilon_lower_bound <= epsilon
    assert r.tight and r.epsilon_lower_bound >= epsilon - 0.05


def test_rr_with_too_small_a_flip_probability_is_caught():
    # rho / 2 at eps = 1 is RR at eps 1.86; the bound (1.84 at 1M labels, sd ~0.003) is far above 1
    r = rr_lower_bound(epsilon=1.0, samples=1_000_000, randomness=Randomness(12),
                       flip=lambda labels, rho, rnd: randomize_labels(labels, rho / 2, rnd))
    assert not r.passed and not r.tight and r.epsilon_lower_bound > 1.5


def test_rr_default_randomness_is_the_csprng():
    r = rr_lower_bound(epsilon=1.0, samples=200_000)
    assert r.passed


# ---- Gaussian release -----------------------------------------------------------------------


@pytest.mark.parametrize("sensitivity", [0.3, 1.0, 2.5])
def test_the_walr_neighbours_differ_by_the_planned_sensitivity(sensitivity):
    Xc, wc, y1, y0, u, shift = _walr_neighbours(sensitivity)
    assert shift <= sensitivity and shift == pytest.approx(sensitivity, rel=1e-12)
    # the real release accepts the rows at this sensitivity, and the two sums differ by exactly w_0 x_0
    a, _ = release(Xc, y1, wc, noise_std=1e-300, randomness=Randomness(0), sensitivity=sensitivity)
    b, _ = release(Xc, y0, wc, noise_std=1e-300, randomness=Randomness(0), sensitivity=sensitivity)
    assert float((a - b).numpy() @ u) == pytest.approx(shift, rel=1e-12)


def _gaussian_plan(epsilon=2.0, sensitivity=2.0):
    return {"noise_std": analytic_sigma(epsilon=epsilon, delta=DELTA, sensitivity=sensitivity),
            "sensitivity": sensitivity, "delta": DELTA}


def test_gaussian_bound_is_below_the_plan_and_positive():
    # simulated: bound 0.58 +- 0.05 at 2 x 20,000 releases (worst of 300: 0.44), 11 sd above 0
    plan = _gaussian_plan()
    r = gaussian_lower_bound(**plan, samples=20_000, randomness=Randomness(21))
    assert r.planned_epsilon == pytest.approx(2.0, abs=1e-9)
    assert r.planned_epsilon == analytic_epsilon(sigma=plan["noise_std"], delta=DELTA, sensitivity=2.0)
    assert r.passed and 0 < r.epsilon_lower_bound <= r.planned_epsilon
    assert r.evaluated == 10_000


def test_gaussian_release_with_a_third_of_the_noise_is_caught():
    # true eps of the mutant 7.1; simulated bound 2.92 +- 0.12 at 2 x 40,000 (worst of 300: 2.64): 7.7 sd above 2
    def weak(Xc, y, wc, *, noise_std, randomness, **kw):
        return release(Xc, y, wc, noise_std=noise_std / 3, randomness=randomness, **kw)

    r = gaussian_lower_bound(**_gaussian_plan(), samples=40_000, randomness=Randomness(22), release_fn=weak)
    assert not r.passed and r.epsilon_lower_bound > r.planned_epsilon


# ---- DP-SGD canaries ------------------------------------------------------------------------


def test_each_canary_adds_exactly_c_on_its_own_coordinate():
    # noise-free steps: each present coordinate sums C per inclusion, each absent one stays 0
    seen = []

    def spy(model, data, batch, trainable, **kw):
        out = noisy_gradient(model, data, batch, trainable, **{**kw, "noise_std": 0.0})
        g = trainable[0].grad[:, 0] * kw["expected_batch"]
        rows = torch.cat([idx[mask > 0] for idx, mask in batch.chunks])
        seen.append((g.clone(), rows.clone()))
        return out

    dpsgd_lower_bound(**{**DPSGD_PLAN, "steps": 3}, trials=2000, randomness=Randomness(30), step_fn=spy)
    assert len(seen) == 3
    for g, rows in seen:
        expected = torch.zeros_like(g)
        expected[rows] = 0.5
        assert torch.allclose(g, expected, rtol=1e-6, atol=1e-7)
        assert 100 <= rows.numel() <= 300 and bool((rows < 2000).all())  # Binomial(2000, 0.1)


def test_dpsgd_bound_is_below_the_plan_and_positive():
    # simulated: bound 1.13 +- 0.06 at 200,000 canaries (worst of 200: 0.97), 19 sd above 0
    r = dpsgd_lower_bound(**DPSGD_PLAN, trials=200_000, randomness=Randomness(31))
    planned = account(PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.1, steps=20), delta=DELTA,
                      adjacency="add-remove").epsilon
    assert r.planned_epsilon == planned and 3 < planned < 4
    assert r.passed and 0 < r.epsilon_lower_bound <= planned


def test_dpsgd_with_noise_once_per_epoch_is_caught():
    # noise on 2 of 20 steps; simulated bound 5.56 +- 0.17 at 500,000 canaries (worst of 200: 5.14),
    # 11 sd above the planned 3.59
    q = DPSGD_PLAN["sampling_rate"]
    calls, every = itertools.count(), round(1 / q)

    def once_per_epoch(*args, noise_std, **kw):
        return noisy_gradient(*args, noise_std=noise_std if next(calls) % every == 0 else 0.0, **kw)

    r = dpsgd_lower_bound(**DPSGD_PLAN, trials=500_000, randomness=Randomness(32), step_fn=once_per_epoch)
    assert next(calls) == DPSGD_PLAN["steps"]
    assert not r.passed and r.epsilon_lower_bound > r.planned_epsilon
