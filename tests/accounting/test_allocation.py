"""Random allocation's accounting: closed forms, Monte Carlo of the mechanism itself, properties."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from budgetplan.accounting import account
from budgetplan.accounting import allocation as alloc
from budgetplan.errors import UnsupportedError
from budgetplan.mechanisms import AllocationDPSGD
from budgetplan.units import PrivacyUnit

ORDERS = np.asarray(alloc.ORDERS, dtype=float)


def _trapezoid_log_negative_moments(sigma, t, top, z_step=0.05, w_step=0.02):
    """ln E_Q[Z^{-b}], b = 1..top, by the trapezoid rule: accurate (~1e-11) but not a bound; the cross-check."""
    v = 1.0 / sigma**2
    span = 12.0 + 1.2 * (top + 1) * math.sqrt(v) / t
    z = np.arange(-span, span + z_step / 2, z_step)
    log_weights = -z * z / 2
    log_weights -= special.logsumexp(log_weights)
    y = np.exp(-v / 2 + math.sqrt(v) * z)
    w = np.arange(-20.0, math.log(t) + v / 2 + top * v / t + 12.0 + 12.0 * math.sqrt(v) + math.log(top + 1), w_step)
    uy = (np.exp(w) / t)[:, None] * y[None, :]
    gap = -np.expm1(-uy) @ np.exp(log_weights)
    with np.errstate(divide="ignore"):
        log_phi = np.where(gap < 0.5, np.log1p(-np.minimum(gap, 0.5)),
                           special.logsumexp(log_weights[None, :] - uy, axis=1))
    b = np.arange(1, top + 1, dtype=float)[:, None]
    trap = np.full(w.size, math.log(w_step))
    trap[[0, -1]] -= math.log(2.0)
    body = special.logsumexp(b * w[None, :] + t * log_phi[None, :] + trap[None, :], axis=1)
    return np.logaddexp(body, b[:, 0] * -20.0 - np.log(b[:, 0])) - special.gammaln(b[:, 0])


def _bound_and_reference(sigma, t):
    bound = alloc._log_negative_moments(sigma, t)
    return bound, _trapezoid_log_negative_moments(sigma, t, bound.size), np.arange(1, bound.size + 1)


@pytest.mark.parametrize("sigma", [0.6, 3.0])
def test_one_step_per_epoch_is_the_gaussian_mechanism(sigma):
    # T = 1: the example is in the only step: both directions are N(1) against N(0), D_a = a / (2 sigma^2)
    gauss = ORDERS / (2 * sigma**2)
    assert np.allclose(alloc.remove_rdp(noise_multiplier=sigma, steps_per_epoch=1), gauss, rtol=1e-9)
    bound, reference, b = _bound_and_reference(sigma, 1)  # the bound itself, not the Jensen cap
    exact = b * (b + 1) / (2 * sigma**2)  # Z = Y, ln Y ~ N(-v/2, v): E[Y^{-b}] = exp(b (b + 1) v / 2)
    assert np.allclose(reference, exact, rtol=1e-9)
    assert np.all(bound >= exact)
    assert np.max((bound - exact) / exact) < 3e-4


def test_reference_quadrature_has_converged():
    coarse = _trapezoid_log_negative_moments(0.9, 30, 200)
    fine = _trapezoid_log_negative_moments(0.9, 30, 200, z_step=0.025, w_step=0.01)
    assert np.max(np.abs(coarse - fine) / np.abs(fine)) < 1e-9


@pytest.mark.parametrize("sigma, t", [(0.7, 2), (1.0, 13), (0.5, 26), (0.8, 1953), (3.0, 1953), (1.0, 100_000)])
def test_add_bound_is_above_the_accurate_quadrature_and_close_to_it(sigma, t):
    bound, reference, b = _bound_and_reference(sigma, t)
    assert np.all(bound > reference)
    # the gap in Renyi divergence per epoch: below 3e-3 at a few steps, below 2e-4 at thousands
    assert np.max((bound - reference) / b) < (3e-3 if t < 100 else 2e-4)


@settings(max_examples=6, deadline=None)
@given(sigma=st.floats(0.5, 5.0), t=st.integers(1, 3000))
def test_add_bound_property(sigma, t):
    bound, reference, b = _bound_and_reference(sigma, t)
    v = 1 / sigma**2
    assert np.all(bound > reference)
    assert np.max((bound - reference) / b) < 3e-3
    assert np.max((bound - reference) / reference) < 2e-2
    assert np.all(bound <= (b * v / 2 + b * b * v / (2 * t)) * (1 + 3e-4))  # Jensen (AM-GM), exact at T = 1


def test_a_finer_grid_never_gives_a_larger_bound():
    for sigma, t in [(0.8, 5), (1.0, 300)]:
        coarse = alloc._log_negative_moments(sigma, t)
        finer = alloc._log_negative_moments(sigma, t, alloc.Z_STEP / 2, alloc.W_STEP / 2)
        assert np.all(finer <= coarse + 1e-9)
        assert np.all(finer > _trapezoid_log_negative_moments(sigma, t, coarse.size))


def _log_phi_reference(u, v, z_low=-65.0):
    """ln E[e^{-u Y}] by a trapezoid 40 times finer than the bound's grid: accurate, not a bound."""
    step = alloc.Z_STEP / 40
    z = np.arange(z_low, 12.0, step)
    log_weights = -z * z / 2 - 0.5 * math.log(2 * math.pi) + math.log(step)
    y = np.exp(-v / 2 + math.sqrt(v) * z)
    out = []
    for chunk in np.array_split(u, max(1, u.size // 16)):
        uy = chunk[:, None] * y[None, :]
        gap = -np.expm1(-uy) @ np.exp(log_weights)
        out.append(np.where(gap < 0.5, np.log1p(-np.minimum(gap, 0.5)),
                            special.logsumexp(log_weights[None, :] - uy, axis=1)))
    return np.concatenate(out)


def test_phi_upper_bounds_the_laplace_transform():
    # phi_up >= phi at every u, from the tiny u where 1 - phi ~ u to where phi ~ e^-700
    v = 1 / 0.8**2
    nodes = alloc._phi_nodes(v, -60.0, alloc.Z_STEP)
    u = np.exp(np.linspace(-25, 40, 400))
    bound, exact = alloc._log_phi_upper(u, *nodes), _log_phi_reference(u, v)
    assert np.all(bound >= exact)
    assert np.all(bound - exact <= 1e-2 * np.abs(exact))
    assert np.all(np.diff(bound) <= 0)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 100.0])
def test_phi_weights_are_within_their_rounding_slack(sigma):
    # the chord weights against 50-digit arithmetic, at nodes from z = -60 to 12: the slack that
    # covers their rounding is at least 10 times their error
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    v = 1 / sigma**2
    y, log_w, log_floor, slack = alloc._phi_nodes(v, -60.0, alloc.Z_STEP)
    z = -60.0 + alloc.Z_STEP * np.arange(y.size)
    root = mp.sqrt(mp.mpf(v))

    def node(k):
        return mp.e ** (-mp.mpf(v) / 2 + root * mp.mpf(z[k]))

    def cell(k):  # P(cell k), E[Y 1{cell k}]
        a, b = mp.mpf(z[k]), mp.mpf(z[k + 1])
        return mp.ncdf(b) - mp.ncdf(a), mp.ncdf(b - root) - mp.ncdf(a - root)

    for k in [0, 1, 200, 1000, 2399, 2400, 2879, 2880]:
        w = mp.mpf(0)
        if k > 0:
            p, m = cell(k - 1)
            w += (m - node(k - 1) * p) / (node(k) - node(k - 1))
        if k < y.size - 1:
            p, m = cell(k)
            w += (node(k + 1) * p - m) / (node(k + 1) - node(k))
        w += mp.ncdf(mp.mpf(z[0]) - root) / node(0) if k == 0 else 0
        w += 1 - mp.ncdf(mp.mpf(z[-1])) if k == y.size - 1 else 0
        assert abs(float(mp.log(w)) - log_w[k]) < slack / 10
    floor = mp.ncdf(mp.mpf(z[0])) - mp.ncdf(mp.mpf(z[0]) - root) / node(0)
    assert abs(float(mp.log(floor)) - log_floor) < slack / 10


@pytest.mark.parametrize("sigma, t, log_s, top", [(1.0, 4, 1.8, 4), (2.0, 50, 1.0, 3)])
def test_the_outer_tail_bound_holds_where_it_is_not_negligible(sigma, t, log_s, top):
    # S and g small enough that the tail is a sizeable part of E[Z^{-b}] (S g > b - 1 still): the
    # bound must hold, and (being a bound through the geometric mean) may be loose
    v = 1 / sigma**2
    b = np.arange(1, top + 1, dtype=float)
    log_g = np.full(b.size, -v / 2)
    bound = alloc._log_tail(b, v, t, log_g, log_s)
    w = np.arange(log_s, log_s + 12.0, 5e-3)
    log_f = t * _log_phi_reference(np.exp(w) / t, v, z_low=-25.0)
    trap = np.full(w.size, math.log(5e-3))
    trap[[0, -1]] -= math.log(2.0)
    exact = special.logsumexp(b[:, None] * w[None, :] + log_f[None, :] + trap[None, :], axis=1) - special.gammaln(b)
    assert np.all(bound >= exact)
    assert np.all(exact > np.log(0.01))  # not vacuous: E[Z^{-b}] >= 1, the tail is over 1% of it here


def test_add_direction_negative_moments_match_monte_carlo():
    rng = np.random.default_rng(7)
    sigma, t = 1.0, 3
    x = rng.standard_normal((400_000, t)) * sigma
    z = np.mean(np.exp((x - 0.5) / sigma**2), axis=1)
    bound, reference, _ = _bound_and_reference(sigma, t)
    for b in (1, 2, 3):
        v = z ** (-b)
        se = v.std() / math.sqrt(v.size)
        assert abs(math.exp(reference[b - 1]) - v.mean()) < 5 * se
        assert math.exp(bound[b - 1]) >= v.mean() - 5 * se


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
    g = account(mech, delta=1e-6, adjacency="add-remove", method="rdp")
    assert g.method == "rdp" and g.bound == "upper"
    assert g.epsilon == alloc.epsilon(noise_multiplier=1.0, steps_per_epoch=100, epochs=2, delta=1e-6)
    for method in ("rdp", "pld"):
        with pytest.raises(UnsupportedError, match="add-remove only"):
            account(mech, delta=1e-6, adjacency="replace-one", method=method)
        with pytest.raises(UnsupportedError, match="group"):
            account(mech, delta=1e-6, adjacency="add-remove", method=method, unit=PrivacyUnit.capped(2))
    with pytest.raises(UnsupportedError, match="prv"):
        account(mech, delta=1e-6, adjacency="add-remove", method="prv")
