"""Randomized response: closed forms, exact composition, and the dp_accounting count gap."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetplan.accounting import rr


def test_reference_flip_probability():
    # DOMAIN.md section 3: RR at eps=1 flips with probability 0.268941.
    assert rr.flip_probability(1.0) == pytest.approx(0.268941, abs=5e-7)
    # the slides' form: with prob p = 2/(e^eps+1) output a uniform label -> flip prob p/2
    assert rr.flip_probability(1.0) == pytest.approx(1.0 / (math.exp(1.0) + 1.0), rel=1e-15)


@given(st.floats(min_value=1e-6, max_value=30))
def test_flip_round_trip(eps):
    assert rr.epsilon_from_flip_probability(rr.flip_probability(eps)) == pytest.approx(eps, rel=1e-9, abs=1e-12)


def test_pure_composition_is_exactly_k_eps():
    assert rr.composed_epsilon(0.1, 10, 0.0) == pytest.approx(1.0, rel=1e-15)


def test_single_rr_with_delta_closed_form():
    # one RR: delta(eps') = (1-rho) (1 - e^{eps' - eps}) for eps' in [-eps, eps)
    eps, delta = 1.0, 1e-5
    keep = 1 - rr.flip_probability(eps)
    expected = eps + math.log1p(-delta / keep)
    assert rr.composed_epsilon(eps, 1, delta) == pytest.approx(expected, rel=1e-12)


def test_composed_delta_matches_brute_force():
    # enumerate all 2^K outcomes of K independent RRs for a tiny K
    import itertools

    eps, k, at = 0.7, 4, 1.3
    rho = rr.flip_probability(eps)
    total = 0.0
    for flips in itertools.product([0, 1], repeat=k):
        p = math.prod(rho if f else 1 - rho for f in flips)
        loss = sum(-eps if f else eps for f in flips)
        total += p * max(0.0, 1 - math.exp(at - loss))
    assert rr.composed_delta(eps, k, at) == pytest.approx(total, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.01, 3.0), k=st.integers(1, 60), log_delta=st.floats(-12, -2))
def test_composed_epsilon_inverts_composed_delta(eps, k, log_delta):
    delta = 10**log_delta
    e = rr.composed_epsilon(eps, k, delta)
    assert 0 <= e <= k * eps + 1e-12
    # never overshoots: within the resolution of a float epsilon (delta'(eps) can be >> delta)
    assert rr.composed_delta(eps, k, e + 1e-13 * max(1.0, e)) <= delta
    if e > 1e-9:  # tight: a little less epsilon needs more delta
        assert rr.composed_delta(eps, k, e - 1e-7 * max(1, e)) > delta * (1 - 1e-6)


def test_tight_per_impression_reference():
    # DOMAIN.md section 2: K=50, total (1, 1e-7): 0.031 per impression instead of 0.02.
    per = rr.max_per_example_epsilon(1.0, 50, 1e-7)
    assert round(per, 3) == 0.031
    assert rr.composed_epsilon(per, 50, 1e-7) <= 1.0
    assert rr.composed_epsilon(per * (1 + 1e-9), 50, 1e-7) > 1.0 - 1e-9


def test_tight_per_impression_without_delta_is_the_even_split():
    assert rr.max_per_example_epsilon(2.0, 8, 0.0) == 0.25


def test_exact_rr_composition_matches_dp_accounting_composed_events():
    """dp_accounting pitfall: SelfComposedDpEvent(RR) ignores its count under PLD.

    SelfComposedDpEvent(RR(eps=0.1), 10) reports 0.100; ten ComposedDpEvent copies report
    1.0009 (pessimistic rounding of the exact 1.0). Ours is exact and never builds the
    self-composed event.
    """
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pa

    rr_event = dpa.RandomizedResponseDpEvent(noise_parameter=2 / (math.exp(0.1) + 1), num_buckets=2)
    rel = dpa.NeighboringRelation.REPLACE_ONE

    def eps(event):
        acc = pa.PLDAccountant(neighboring_relation=rel)
        acc.compose(event)
        return acc.get_epsilon(1e-12)

    self_composed = eps(dpa.SelfComposedDpEvent(rr_event, 10))
    composed = eps(dpa.ComposedDpEvent([rr_event] * 10))
    ours = rr.composed_epsilon(0.1, 10, 1e-12)
    assert self_composed == pytest.approx(0.1, abs=2e-3)  # the gap is still there in 0.6.0
    assert composed == pytest.approx(1.0009, abs=5e-4)
    assert ours == pytest.approx(1.0, abs=1e-9) and ours <= composed


def test_replace_special_is_not_label_dp():
    """dp_accounting pitfall: RR under REPLACE_SPECIAL reports 0.62 for an exactly eps=1 mechanism."""
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pa

    acc = pa.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(dpa.RandomizedResponseDpEvent(noise_parameter=2 / (math.e + 1), num_buckets=2))
    assert acc.get_epsilon(1e-12) == pytest.approx(0.62, abs=0.01)
    assert rr.composed_epsilon(1.0, 1, 1e-12) == pytest.approx(1.0, abs=1e-9)
