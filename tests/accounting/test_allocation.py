"""Random allocation's accounting: closed forms, Monte Carlo of the mechanism itself, properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgetplan.accounting import account
from budgetplan.accounting import allocation as alloc
from budgetplan.errors import UnsupportedError
from budgetplan.mechanisms import AllocationDPSGD

ORDERS = np.asarray(alloc.ORDERS, dtype=float)


@pytest.mark.parametrize("sigma", [0.6, 3.0])
def test_one_step_per_epoch_is_the_gaussian_mechanism(sigma):
    # T = 1: the example is in the only step: both directions are N(1) against N(0), D_a = a / (2 sigma^2)
    gauss = ORDERS / (2 * sigma**2)
    assert np.allclose(alloc.remove_rdp(noise_multiplier=sigma, steps_per_epoch=1), gauss, rtol=1e-9)
    logs = alloc._log_negative_moments(sigma, 1)  # the quadrature itself, not the Jensen cap
    b = np.arange(1, logs.size + 1)
    assert np.allclose(logs, b * (b + 1) / (2 * sigma**2), rtol=1e-5)
    assert np.all(logs >= b * (b + 1) / (2 * sigma**2))  # rounded up


@pytest.mark.parametrize("sigma, t", [(0.7, 2), (1.0, 5), (2.0, 50)])
def test_low_remove_orders_match_their_closed_forms(sigma, t):
    # E[S^a] for S a sum of t iid Y with E[Y^m] = exp(m (m-1) / (2 sigma^2)), expanded by hand
    m = [math.exp(j * (j - 1) / (2 * sigma**2)) for j in range(4)]
    second = t * m[2] + t * (t - 1) * m[1] ** 2
    third = t * m[3] + 3 * t * (t - 1) * m[2] * m[1] + t * (t - 1) * (t - 2) * m[1] ** 3
    rdp = alloc.remove_rdp(noise_multiplier=sigma, steps_per_epoch=t)
    # exact but for the 1e-9 added to every log moment (rounded up)
    assert 0 <= rdp[0] - math.log(second / t**2) < 2e-9
    assert 0 <= rdp[1] - math.log(third / t**3) / 2 < 2e-9


def test_add_direction_quadrature_has_converged(monkeypatch):
    coarse = alloc._log_negative_moments(0.9, 30).copy()
    monkeypatch.setattr(alloc, "_Z_STEP", alloc._Z_STEP / 2)
    monkeypatch.setattr(alloc, "_W_STEP", alloc._W_STEP / 2)
    alloc._log_negative_moments.cache_clear()
    fine = alloc._log_negative_moments(0.9, 30)
    alloc._log_negative_moments.cache_clear()
    assert np.max(np.abs(coarse - fine) / np.abs(fine)) < alloc._ADD_MARGIN / 100


def test_add_direction_negative_moments_match_monte_carlo():
    rng = np.random.default_rng(7)
    sigma, t = 1.0, 3
    x = rng.standard_normal((400_000, t)) * sigma
    z = np.mean(np.exp((x - 0.5) / sigma**2), axis=1)
    logs = alloc._log_negative_moments(sigma, t)
    for b in (1, 2):
        v = z ** (-b)
        se = v.std() / math.sqrt(v.size)
        assert abs(math.exp(logs[b - 1]) - v.mean()) < 5 * se


def _mc_deltas(sigma, t, epochs, eps, samples, rng):
    """delta(eps) of both directions, estimated from the mechanism's outputs with and without the example."""
    def loss(x):  # ln dP/dQ of each epoch's T sums, added over epochs
        return np.logaddexp.reduce((x - 0.5) / sigma**2, axis=-1).sum(axis=-1) - epochs * math.log(t)

    with_example = rng.standard_normal((samples, epochs, t)) * sigma
    with_example[np.arange(samples)[:, None], np.arange(epochs)[None, :], rng.integers(t, size=(samples, epochs))] += 1
    remove = np.maximum(0.0, 1 - np.exp(eps - loss(with_example)))
    add = np.maximum(0.0, 1 - np.exp(eps + loss(rng.standard_normal((samples, epochs, t)) * sigma)))
    return [(d.mean(), d.std() / math.sqrt(samples)) for d in (remove, add)]


@pytest.mark.parametrize("sigma, t, epochs", [(0.8, 4, 1), (1.0, 8, 2)])
def test_the_bound_is_never_below_the_mechanisms_monte_carlo_delta(sigma, t, epochs):
    rng = np.random.default_rng(11)
    delta = 1e-2
    eps = alloc.epsilon(noise_multiplier=sigma, steps_per_epoch=t, epochs=epochs, delta=delta)
    for mean, se in _mc_deltas(sigma, t, epochs, eps, 200_000, rng):
        assert mean <= delta + 4 * se
    # and it is not vacuous: at a fifth of the bound the mechanism's delta is well above the target
    remove, _ = _mc_deltas(sigma, t, epochs, eps / 5, 50_000, rng)
    assert remove[0] > delta


def test_allocation_is_no_worse_than_poisson_at_q_one_over_t_under_the_same_rdp_conversion():
    # Poisson at q = 1/T over the same steps, by dp_accounting's RDP (an independent implementation)
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    for sigma, t, epochs, delta in [(1.0, 2000, 3, 1e-5), (0.8, 1953, 1, 1 / 32e6), (2.0, 1953, 16, 1 / 32e6)]:
        acc = rdp.RdpAccountant(orders=list(alloc.ORDERS))
        acc.compose(dpa.PoissonSampledDpEvent(1 / t, dpa.GaussianDpEvent(sigma)), t * epochs)
        poisson = acc.get_epsilon(delta)
        ours = alloc.epsilon(noise_multiplier=sigma, steps_per_epoch=t, epochs=epochs, delta=delta)
        assert 0.9 * poisson < ours <= poisson


@settings(max_examples=8, deadline=None)
@given(sigma=st.floats(0.7, 3.0), t=st.integers(50, 500), epochs=st.integers(1, 4))
def test_more_noise_fewer_epochs_more_steps_never_cost_more(sigma, t, epochs):
    def eps(s=sigma, tt=t, e=epochs):
        return alloc.epsilon(noise_multiplier=s, steps_per_epoch=tt, epochs=e, delta=1e-6)

    base = eps()
    assert eps(s=sigma * 1.2) <= base
    assert eps(e=epochs + 1) >= base
    assert eps(tt=t * 2) <= base * (1 + 1e-9)
    assert alloc.add_epsilon(noise_multiplier=sigma, steps_per_epoch=t, epochs=epochs, delta=1e-6) <= \
        alloc.jensen_add_epsilon(noise_multiplier=sigma, steps_per_epoch=t, epochs=epochs, delta=1e-6) + 1e-9


def test_account_reports_the_worse_direction_and_refuses_what_it_cannot_bound():
    mech = AllocationDPSGD(noise_multiplier=1.0, steps_per_epoch=100, epochs=2)
    g = account(mech, delta=1e-6, adjacency="add-remove")
    assert g.method == "rdp" and g.bound == "upper"
    assert g.epsilon == alloc.epsilon(noise_multiplier=1.0, steps_per_epoch=100, epochs=2, delta=1e-6)
    with pytest.raises(UnsupportedError, match="add-remove only"):
        account(mech, delta=1e-6, adjacency="replace-one")
    with pytest.raises(UnsupportedError, match="pld"):
        account(mech, delta=1e-6, adjacency="add-remove", method="pld")
