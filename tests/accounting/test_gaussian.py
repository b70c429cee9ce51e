"""The analytic Gaussian mechanism and the classical formula."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetplan.accounting import gaussian as g


def test_reference_sigma():
    # DOMAIN.md section 3: analytic Gaussian, eps=1, delta=1e-5, sensitivity 1 -> 3.7306.
    assert round(g.analytic_sigma(epsilon=1.0, delta=1e-5), 4) == 3.7306


def test_agrees_with_dp_accounting_gaussian_mechanism():
    from dp_accounting import gaussian_mechanism as gm

    for eps, delta in [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-9), (12.0, 1e-7)]:
        ours = g.analytic_sigma(epsilon=eps, delta=delta)
        theirs = gm.get_sigma_gaussian(eps, delta)
        assert ours == pytest.approx(theirs, rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(0.01, 40), log_delta=st.floats(-15, -1.5), sens=st.floats(0.01, 100))
def test_calibration_never_overshoots_and_round_trips(eps, log_delta, sens):
    delta = 10**log_delta
    sigma = g.analytic_sigma(epsilon=eps, delta=delta, sensitivity=sens)
    assert g.analytic_delta(epsilon=eps, sigma=sigma, sensitivity=sens) <= delta
    assert g.analytic_epsilon(sigma=sigma, delta=delta, sensitivity=sens) <= eps
    assert g.analytic_epsilon(sigma=sigma, delta=delta, sensitivity=sens) == pytest.approx(eps, rel=1e-6)
    assert g.analytic_delta(epsilon=eps, sigma=sigma * 0.999, sensitivity=sens) > delta


@settings(max_examples=30, deadline=None)
@given(log_sigma=st.floats(-1, 2), log_delta=st.floats(-12, -2))
def test_epsilon_decreases_with_sigma_and_delta(log_sigma, log_delta):
    s, d = 10**log_sigma, 10**log_delta
    e = g.analytic_epsilon(sigma=s, delta=d)
    assert g.analytic_epsilon(sigma=s * 1.1, delta=d) <= e
    assert g.analytic_epsilon(sigma=s, delta=d * 2) <= e


def test_scale_invariance():
    # only Delta / sigma matters
    assert g.analytic_epsilon(sigma=7.0, delta=1e-6, sensitivity=2.0) == pytest.approx(
        g.analytic_epsilon(sigma=3.5, delta=1e-6, sensitivity=1.0), rel=1e-12)


def test_classical_overnoises_below_one_and_is_unsafe_at_large_eps():
    # below eps=1 the classical sigma is valid and larger than needed
    for eps in (0.1, 0.5, 0.9):
        assert g.classical_sigma(epsilon=eps, delta=1e-5) > g.analytic_sigma(epsilon=eps, delta=1e-5)
    # at large eps it gives less noise than the exact requirement: not a guarantee
    sigma = g.classical_sigma(epsilon=20.0, delta=1e-5)
    assert sigma < g.analytic_sigma(epsilon=20.0, delta=1e-5)
    assert g.analytic_epsilon(sigma=sigma, delta=1e-5) > 20.0


def test_epsilon_zero_when_delta_large():
    assert g.analytic_epsilon(sigma=100.0, delta=0.5) == 0.0


def test_subnormal_delta_and_underflowing_ratio():
    # 1.25 / 5e-324 overflows; ln 1.25 - ln delta does not
    sigma = g.analytic_sigma(epsilon=1.0, delta=5e-324)
    assert 38 < sigma < 39 and g.classical_sigma(epsilon=1.0, delta=5e-324) < 39
    # sensitivity / sigma underflows to 0: nothing is revealed at any float delta
    assert g.analytic_epsilon(sigma=1e300, delta=1e-300, sensitivity=1e-300) == 0.0
