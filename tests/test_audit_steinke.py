"""Steinke et al.'s one-run bound (arXiv:2305.08846): closed forms, Clopper-Pearson, validity, the legacy check."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from budgetplan.audit.canary import guesses
from budgetplan.audit.steinke import check_legacy, epsilon_lower_bound, p_value
from budgetplan.errors import InvalidParameterError


def logit(p: float) -> float:
    return math.log(p / (1 - p))


@given(r=st.integers(1, 3000), frac=st.floats(0.5, 1.0), level=st.sampled_from([0.9, 0.95, 0.99]))
@settings(max_examples=60, deadline=None)
def test_without_delta_the_bound_is_the_clopper_pearson_logit(r, frac, level):
    # With delta = 0 the bound solves P[Binomial(r, q) >= v] = 1 - level for q: the one-sided
    # Clopper-Pearson lower limit, which scipy's beta quantile gives by another path.
    v = max(1, min(r, round(frac * r)))
    q_low = stats.beta.ppf(1 - level, v, r - v + 1)
    expected = max(0.0, logit(q_low)) if q_low < 1 else math.inf
    got = epsilon_lower_bound(10 * r, r, v, delta=0.0, confidence=level)
    assert got == pytest.approx(expected, abs=1e-6)


def test_all_guesses_right_has_a_closed_form():
    # P[B >= r] = q^r: r right guesses refute every eps with q^r < 1 - confidence.
    for r in (10, 100, 1000):
        expected = logit(0.05 ** (1 / r))
        assert epsilon_lower_bound(r, r, r, delta=0.0) == pytest.approx(expected, abs=1e-6)


def test_delta_costs_and_grows_with_the_canaries():
    no_delta = epsilon_lower_bound(1000, 200, 190, delta=0.0)
    small = epsilon_lower_bound(1000, 200, 190, delta=1e-8)
    large = epsilon_lower_bound(100_000, 200, 190, delta=1e-5)
    assert 0 < large < small <= no_delta
    assert p_value(1000, 200, 190, 1.0, 1e-5) >= p_value(1000, 200, 190, 1.0, 0.0)


def test_p_value_at_the_bound_is_the_level():
    eps = epsilon_lower_bound(5000, 400, 370, delta=1e-7, confidence=0.95)
    assert p_value(5000, 400, 370, eps, 1e-7) == pytest.approx(0.05, rel=1e-6)
    assert p_value(5000, 400, 370, eps + 0.01, 1e-7) > 0.05


def test_chance_guessing_proves_nothing():
    assert epsilon_lower_bound(1000, 200, 100, delta=1e-6) == 0.0


def test_bound_is_valid_for_a_mechanism_exactly_at_epsilon():
    # Randomized response at eps on each secret bit is exactly eps-DP: its best guesses are
    # right with probability e^eps / (1 + e^eps), and the bound may exceed eps only 5% of the time.
    rng = np.random.default_rng(7)
    eps, m, over = 2.0, 2000, 0
    for _ in range(200):
        bits = rng.integers(0, 2, m)
        keep = rng.random(m) < 1 / (1 + math.exp(-eps))
        released = np.where(keep, bits, 1 - bits) + 0.01 * rng.random(m)  # the score: the released bit
        r, v = guesses(released, bits, 100, 100)
        over += epsilon_lower_bound(m, r, v, delta=0.0) > eps
    assert over <= 20  # Binomial(200, <= 0.05): P[> 20] < 1e-3


@pytest.mark.parametrize("m, r, v", [(10, 11, 5), (10, 5, 6), (0, 0, 0), (10, -1, 0)])
def test_counts_are_validated(m, r, v):
    with pytest.raises(InvalidParameterError):
        epsilon_lower_bound(m, r, v, delta=0.0)


def test_legacy_check_recomputes_and_compares_with_the_plan():
    # a one_run entry as written before the f-DP analysis: no method, Steinke's bound
    res = {"canaries": 1000, "guesses": 1000, "correct": 1000, "level": 1 - 0.05 / 7, "confidence": 0.95}
    res["epsilon_lower_bound"] = epsilon_lower_bound(1000, 1000, 1000, delta=1e-8, confidence=res["level"])
    assert res["epsilon_lower_bound"] > 3
    ok, detail = check_legacy(res, planned_epsilon=8.0, planned_delta=1e-8)
    assert ok and "1000 of 1000 guesses" in detail
    ok, detail = check_legacy(res, planned_epsilon=2.0, planned_delta=1e-8)
    assert not ok and "leaks more than the plan allows" in detail
    ok, detail = check_legacy({**res, "correct": res["correct"] - 100}, planned_epsilon=8.0, planned_delta=1e-8)
    assert not ok and "does not recompute" in detail
    ok, detail = check_legacy({"canaries": 3}, planned_epsilon=8.0, planned_delta=1e-8)
    assert not ok and "malformed" in detail


@given(r=st.integers(1, 20_000), frac=st.floats(0.3, 1.0), eps=st.floats(0.0, 12.0))
@settings(max_examples=60, deadline=None)
def test_delta_term_is_the_theorem_s_maximum(r, frac, eps):
    # 2 m delta max_i P[v - i <= B < v] / i, from scipy's cdf term by term (the module sums a window)
    v = max(1, min(r, round(frac * r)))
    q = 1 / (1 + math.exp(-eps))
    i = np.arange(1, v + 1)
    full = float(np.max((stats.binom.cdf(v - 1, r, q) - stats.binom.cdf(v - 1 - i, r, q)) / i))
    expected = min(1.0, float(stats.binom.sf(v - 1, r, q)) + 2 * 10 * r * 1e-6 * full)
    got = p_value(10 * r, r, v, eps, 1e-6)
    assert expected * (1 - 1e-9) - 1e-15 <= got <= expected * (1 + 1e-6) + 1e-12
