"""Randomness policy and the RR phase's label randomisation."""

import math

import numpy as np
import pytest
from scipy import stats

from budgetplan.errors import InvalidParameterError
from budgetplan.record.parts import Seeds
from trainers.randomness import Randomness
from trainers.rr_phase import flip_probabilities, randomize_labels


def test_policy_is_recorded():
    assert Randomness().record().policy == "csprng"
    note = "reproducible run: noise derived from an explicit seed, for debugging only"
    assert Randomness(7).record() == Seeds(policy="seeded", seed=7, note=note)
    with pytest.raises(ValueError):
        Randomness(-1)


def test_seeded_is_reproducible_and_csprng_is_not():
    assert np.array_equal(Randomness(3).uniform_u64(100), Randomness(3).uniform_u64(100))
    assert not np.array_equal(Randomness().uniform_u64(100), Randomness().uniform_u64(100))


@pytest.mark.parametrize("p", [0.0, 1e-12, 0.268941421369995, 0.5, 1.0])
def test_bernoulli_threshold_never_below_p(p):
    # the realised probability is ceil(p 2^64) / 2^64 >= p: check the threshold arithmetic exactly
    from fractions import Fraction

    r = Randomness(0)
    draws = r.bernoulli(p, 200_000)
    if p == 0:
        assert not draws.any()
    elif p == 1:
        assert draws.all()
    else:
        hi = math.floor(p * 2**32)
        rest = (p * 2**32 - hi) * 2**32
        threshold = (hi << 32) + math.ceil(rest)
        assert Fraction(threshold, 2**64) >= Fraction(p)
        assert Fraction(threshold, 2**64) - Fraction(p) < Fraction(1, 2**63)
        # and the sample agrees with p (two-sided binomial test, false alarm 1e-6)
        assert stats.binomtest(int(draws.sum()), draws.size, p).pvalue > 1e-6


def test_randomize_labels_flips_at_the_planned_rate():
    rho = 1 / (1 + math.e)  # RR at epsilon 1
    labels = (np.arange(1_000_000) % 7 == 0).astype(np.int8)
    noisy, flipped = randomize_labels(labels, np.full(labels.size, rho), Randomness(11))
    assert flipped == int((noisy != labels).sum())
    assert stats.binomtest(flipped, labels.size, rho).pvalue > 1e-6
    # flips are independent of the label
    pos = labels == 1
    assert abs((noisy[pos] != 1).mean() - (noisy[~pos] != 0).mean()) < 0.01


def _phase(cap=1, **kw):
    from budgetplan.accounting.guarantee import Guarantee
    from budgetplan.mechanisms import RandomizedResponse
    from budgetplan.plan.phases import RRParams, RRPhase
    from budgetplan.units import Adjacency, PrivacyUnit

    par = dict(per_impression_rule="eps/K", unit_epsilon=3.0, per_impression_epsilon=1.0, flip_probability=0.2,
               cap=cap, capping="random" if cap > 1 else None, epochs=1, batch_size=None, dataset_size=4,
               labels_randomised="once", model="truncated") | kw
    unit = PrivacyUnit(name="user", cap=cap, capping=par["capping"])
    return RRPhase(mechanism=RandomizedResponse(epsilon=1.0), params=RRParams(**par), target_epsilon=3.0,
                   target_delta=0.0, method="exact", unit_accounting="tight",
                   guarantee=Guarantee(epsilon=3.0, delta=0.0, method="exact", adjacency=Adjacency.REPLACE_ONE,
                                       unit=unit))


def test_flip_probabilities_by_rule():
    same = flip_probabilities(_phase(flip_probability=0.2), None, 4)
    assert same.tolist() == [0.2] * 4
    by_count = _phase(3, per_impression_rule="eps/K_i", per_impression_epsilon_by_count=(3.0, 1.5, 1.0),
                      flip_probability_by_count=(0.1, 0.2, 0.3))
    assert flip_probabilities(by_count, np.array([1, 3, 2, 3]), 4).tolist() == [0.1, 0.3, 0.2, 0.3]
    with pytest.raises(InvalidParameterError, match="more than the plan's cap 3"):
        flip_probabilities(by_count, np.array([4]), 1)
    with pytest.raises(InvalidParameterError, match="needs unit ids"):
        flip_probabilities(by_count, None, 1)
