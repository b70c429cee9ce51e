"""The double mixture of Gaussians: replace-one accounting of Poisson DP-SGD for K examples per unit.

Judged against independent references: the subsampled Gaussian's REPLACE pmf (K = 1), the
analytic Gaussian of sensitivity 2K (q = 1), the hockey-stick divergence of the pair by
scipy quadrature (one step), the actual vector-valued output pair of one step integrated on
a 2-D grid (domination), group privacy and the example level (composed), and the planner.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, optimize, special, stats

from budgetplan.accounting import fastpld as F
from budgetplan.accounting import gaussian, mixture_pld
from budgetplan.accounting.account import account
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from budgetplan.units import PrivacyUnit


def double_mixture(sigma: float, q: float, k: int, d: float = 1e-4) -> F.PLD:
    probs = stats.binom.pmf(np.arange(k + 1), k, q)
    return F.double_mixture_of_gaussians(standard_deviation=sigma, sensitivities=[float(i) for i in range(k + 1)],
                                         probabilities=[float(p) for p in probs], discretization=d)


def quad_delta(sigma: float, q: float, k: int, eps: float, keep: slice = slice(None)) -> float:
    """delta(eps) of sum_i b_i N(-i) vs sum_i b_i N(+i) by quadrature of the densities, nothing shared.

    ``keep`` selects the atoms i (the others are left out: a sub-probability pair).
    """
    i = np.arange(k + 1)[keep]
    log_b = np.log(stats.binom.pmf(np.arange(k + 1), k, q))[keep]

    def log_up(x):
        return special.logsumexp(log_b + stats.norm.logpdf(x, -i, sigma))

    def log_low(x):
        return special.logsumexp(log_b + stats.norm.logpdf(x, i, sigma))

    root = optimize.brentq(lambda x: log_up(x) - log_low(x) - eps, -200.0, 200.0, xtol=1e-14)
    value, _ = integrate.quad(lambda x: math.exp(log_up(x)) - math.exp(eps + log_low(x)), -np.inf, root,
                              epsabs=1e-16, epsrel=1e-12, limit=200)
    return value


# ------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("sigma, q", [(1.0, 0.01), (0.8, 0.3), (2.0, 1e-3), (0.6, 0.05), (1.5, 1.0)])
def test_one_example_is_the_subsampled_gaussian_replace_pair(sigma, q):
    mine = double_mixture(sigma, q, 1)
    ref = F.gaussian(noise_multiplier=sigma, sampling_rate=q, relation="replace-one")
    (a,), (b,) = mine.pmfs, ref.pmfs
    assert mine.relation == "replace-one"
    assert (a.lower_index, a.probs.size) == (b.lower_index, b.probs.size)
    # the same grid; the masses differ by rounding only (second differences of deltas formed apart)
    assert np.abs(a.probs - b.probs).sum() < 1e-7
    assert a.infinity_mass == pytest.approx(b.infinity_mass, rel=1e-9, abs=1e-30)
    for delta in (1e-3, 1e-6, 1e-9):
        assert F.epsilon_for_delta(mine, delta) == pytest.approx(F.epsilon_for_delta(ref, delta), rel=1e-9,
                                                                 abs=1e-12)


@pytest.mark.parametrize("k, sigma", [(1, 2.0), (3, 2.0), (5, 4.0), (5, 12.0)])
def test_no_subsampling_is_the_gaussian_of_sensitivity_2k(k, sigma):
    d = 1e-4
    one = double_mixture(sigma, 1.0, k, d)
    for steps in (1, 10):
        pld = one if steps == 1 else F.self_compose(one, steps, delta=1e-6)
        for delta in (1e-3, 1e-6):
            exact = gaussian.analytic_epsilon(sigma=sigma, delta=delta, sensitivity=2 * k * math.sqrt(steps))
            got = F.epsilon_for_delta(pld, delta)
            # pessimistic: never below; each step's losses rounded up by at most one grid step
            assert exact <= got <= exact + steps * d + 1e-9, (steps, delta, got, exact)


@pytest.mark.parametrize("sigma, q, k", [(1.0, 0.1, 2), (0.7, 0.4, 4), (2.0, 0.02, 10), (1.2, 0.9, 3)])
def test_one_step_delta_is_the_quadrature_of_the_pair(sigma, q, k):
    d = 1e-4
    pld = double_mixture(sigma, q, k, d)
    inf_mass = pld.pmfs[0].infinity_mass
    on_grid = np.array([0.0, 0.1, 0.5, 1.0, 2.0, -0.3])
    off_grid = on_grid[:-1] + 0.37 * d
    for eps in on_grid:
        ref = quad_delta(sigma, q, k, float(eps))
        got = float(F.delta_for_epsilon(pld, float(eps)))
        # on the grid connect-the-dots is exact up to the truncated tail moved to +infinity
        assert got >= ref * (1 - 1e-9) - 1e-15
        assert got <= ref * (1 + 1e-7) + inf_mass + 1e-15, (eps, got, ref)
    for eps in off_grid:  # between grid points it interpolates above the convex curve
        got = float(F.delta_for_epsilon(pld, float(eps)))
        assert quad_delta(sigma, q, k, float(eps)) * (1 - 1e-9) <= got <= quad_delta(sigma, q, k, float(eps) - d)


def test_dropped_binomial_mass_is_an_infinite_sensitivity():
    sigma, q, k, d = 1.0, 0.3, 6, 1e-4
    probs = stats.binom.pmf(np.arange(k + 1), k, q)
    full = double_mixture(sigma, q, k, d)
    # leave out the two top atoms and the bottom one: their mass moves to an infinite sensitivity
    keep = slice(1, k - 1)
    dropped = float(probs[-2:].sum() + probs[0])
    window = F.double_mixture_of_gaussians(
        standard_deviation=sigma, sensitivities=[float(i) for i in range(1, k - 1)],
        probabilities=[float(p) for p in probs[keep]], dropped_mass=dropped, discretization=d)
    eps = np.round(np.linspace(-1.0, 4.0, 21) / d) * d  # grid points, where connect-the-dots is exact
    a, b = F.delta_for_epsilon(full, eps), F.delta_for_epsilon(window, eps)
    assert np.all(b >= a - 1e-12)  # pessimistic
    # exactly the kept atoms' divergence plus the dropped mass (a kernel maps the one pair onto the other)
    kept = np.array([quad_delta(sigma, q, k, float(e), keep) for e in eps])
    assert b == pytest.approx(kept + dropped, rel=1e-7, abs=1e-12)


def test_loss_distribution_is_symmetric():
    # the pair is mirror-symmetric, so the pmf satisfies p(-l) = e^{-l} p(l)
    pmf = double_mixture(1.0, 0.2, 3, d=1e-3).pmfs[0]
    losses, p = pmf.losses, pmf.probs
    idx = {round(x / 1e-3): i for i, x in enumerate(losses)}
    pairs = [(idx[j], idx[-j]) for j in range(1, 4000, 37) if j in idx and -j in idx]
    assert len(pairs) > 50
    for i, m in pairs:
        assert p[m] == pytest.approx(math.exp(-losses[i]) * p[i], rel=2e-2, abs=1e-12)


# ------------------------------------------------------------------ domination


def output_pair_delta(g: np.ndarray, g2: np.ndarray, q: float, sigma: float, eps: list[float]) -> list[float]:
    """delta(eps) of one step's actual outputs: each row of g (g2) joins with probability q, plus
    N(0, sigma^2 I) in 2-D; the same sampling indicators in both datasets. Midpoint rule on a grid."""
    k = len(g)
    patterns = np.array(list(itertools.product((0, 1), repeat=k)), dtype=bool)
    weights = q ** patterns.sum(axis=1) * (1 - q) ** (k - patterns.sum(axis=1))
    h = sigma / 60
    r = k + 9 * sigma
    t = np.arange(-r + h / 2, r, h)
    x, y = np.meshgrid(t, t, indexing="ij")

    def density(rows):
        out = np.zeros_like(x)
        for w, pat in zip(weights, patterns):
            m = rows[pat].sum(axis=0) if pat.any() else np.zeros(2)
            out += w * np.exp(-((x - m[0]) ** 2 + (y - m[1]) ** 2) / (2 * sigma**2))
        return out / (2 * math.pi * sigma**2)

    p, p2 = density(g), density(g2)
    return [float(np.maximum(p - math.exp(e) * p2, 0.0).sum() * h * h) for e in eps]


EPS = [0.25, 1.0, 2.0]
# The grid integration's error (the integrand's kink along p = e^eps p'), measured on the aligned case below,
# which equals the pair: at most 1e-5 here.
INTEGRATION_TOL = 3e-5


def test_aligned_contributions_attain_the_double_mixture():
    # every example moves from +C e1 to -C e1: the 1-D pair itself, so the 2-D integral must equal it
    for k, q, sigma in ((1, 0.5, 1.0), (3, 0.3, 0.8), (4, 0.6, 2.0)):
        g = np.tile([1.0, 0.0], (k, 1))
        got = output_pair_delta(g, -g, q, sigma, EPS)
        ref = [quad_delta(sigma, q, k, e) for e in EPS]
        assert got == pytest.approx(ref, abs=INTEGRATION_TOL / 2)


# Near the worst case as well as anywhere: the examples' directions and each one's change are drawn
# either exactly aligned, slightly off, or at random; the norms either 1 or anything up to 1.
_NORM = st.one_of(st.just(1.0), st.floats(0.9, 1.0), st.floats(0.0, 1.0))
_TURN = st.one_of(st.just(0.0), st.floats(-0.3, 0.3), st.floats(-math.pi, math.pi))


@st.composite
def _step(draw):
    k = draw(st.integers(1, 4))
    base = draw(st.floats(0.0, 2 * math.pi))
    g, g2 = np.empty((k, 2)), np.empty((k, 2))
    for i in range(k):
        a = base + draw(_TURN)
        b = a + math.pi + draw(_TURN)  # the replacement points the other way, or not
        g[i] = draw(_NORM) * np.array([math.cos(a), math.sin(a)])
        g2[i] = draw(_NORM) * np.array([math.cos(b), math.sin(b)])
    return k, g, g2, draw(st.floats(0.05, 0.9)), draw(st.floats(0.8, 2.0))


@settings(max_examples=10, deadline=None)
@given(_step())
def test_double_mixture_dominates_vector_valued_steps(case):
    k, g, g2, q, sigma = case
    actual = output_pair_delta(g, g2, q, sigma, EPS)
    bound = F.delta_for_epsilon(double_mixture(sigma, q, k), np.array(EPS))
    assert np.all(np.array(actual) <= bound + INTEGRATION_TOL), (actual, bound)


# ------------------------------------------------------------------ composed


Q_DOMAIN = 16384 / 32e6
STEPS = 5859  # 3 epochs


def test_composed_between_example_level_and_group_privacy():
    mech = PoissonDPSGD(noise_multiplier=1.0, sampling_rate=Q_DOMAIN, steps=STEPS)
    example = account(mech, delta=1e-7, adjacency="replace-one").epsilon
    one = account(mech, delta=1e-7, adjacency="replace-one", unit=PrivacyUnit.capped(1)).epsilon
    assert one == example
    tight = []
    for k in (2, 5, 10):
        unit = PrivacyUnit.capped(k)
        g = account(mech, delta=1e-7, adjacency="replace-one", unit=unit, unit_accounting="tight")
        grp = account(mech, delta=1e-7, adjacency="replace-one", unit=unit, unit_accounting="group")
        assert g.method == "double-mixture-of-gaussians(pld)" and any("2403.04867" in n for n in g.notes)
        assert grp.method == "group(pld)"
        assert example < g.epsilon <= grp.epsilon
        tight.append(g.epsilon)
    assert tight == sorted(tight) and tight[0] < tight[-1]
    # and replace-one costs more than add-remove for the same unit (sensitivity 2C per example)
    ar = account(mech, delta=1e-7, adjacency="add-remove", unit=PrivacyUnit.capped(10)).epsilon
    assert ar < tight[-1]


def test_rdp_and_prv_stay_refused_for_replace_one_units():
    mech = PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.01, steps=10)
    for method in ("rdp", "prv"):
        with pytest.raises(UnsupportedError, match="add-remove only"):
            account(mech, delta=1e-6, adjacency="replace-one", unit=PrivacyUnit.capped(3), method=method)


# ------------------------------------------------------------------ inputs


@pytest.mark.parametrize("kwargs", [
    dict(standard_deviation=float("nan"), sensitivities=[0, 1], probabilities=[0.5, 0.5]),
    dict(standard_deviation=1.0, sensitivities=[0, -1], probabilities=[0.5, 0.5]),
    dict(standard_deviation=1.0, sensitivities=[0, 1], probabilities=[0.5]),
    dict(standard_deviation=1.0, sensitivities=[0, 1], probabilities=[0.5, 0.4]),
    dict(standard_deviation=1.0, sensitivities=[0, 1], probabilities=[1.0, 0.0]),
    dict(standard_deviation=1.0, sensitivities=[0, 1], probabilities=[0.5, 0.5], dropped_mass=float("inf")),
])
def test_rejects_nonsense(kwargs):
    with pytest.raises(InvalidParameterError) as info:
        F.double_mixture_of_gaussians(**kwargs)
    assert "\n" not in str(info.value)


def test_work_limit_names_the_discretization_that_fits(monkeypatch):
    # a lower limit, so that building at the discretization named stays cheap
    monkeypatch.setattr(mixture_pld, "MAX_MIXTURE_WORK", 1 << 18)
    k = 20
    probs = [float(p) for p in stats.binom.pmf(np.arange(k + 1), k, 0.5)]
    sens = [float(i) for i in range(k + 1)]
    with pytest.raises(F.GridLimitError, match=r"use discretization >= [0-9.e+-]+$") as info:
        F.double_mixture_of_gaussians(standard_deviation=1.0, sensitivities=sens, probabilities=probs,
                                      discretization=1e-3)
    fits = float(str(info.value).rsplit(" ", 1)[1])
    pld = F.double_mixture_of_gaussians(standard_deviation=1.0, sensitivities=sens, probabilities=probs,
                                        discretization=fits)
    assert pld.pmfs[0].probs.size * (k + 1) <= 1 << 18


# ------------------------------------------------------------------ the planner

HYBRID_USERS = """
[budget]
epsilon = 8.0
delta = 1e-9
[privacy]
adjacency = "replace-one"
unit = "user"
cap = 5
unit_accounting = "tight"
[data]
dataset_size = 100000
[algorithm]
name = "hybrid"
split = "paper-v1"
[rr]
epochs = 3
batch_size = 256
[dpsgd]
batch_size = 500
epochs = 3
clipping_norm = 2.0
"""


def test_hybrid_plan_with_a_capped_unit_uses_the_double_mixture():
    p = build_plan(parse_scenario(HYBRID_USERS))
    dp = next(ph for ph in p.phases if ph.name == "dpsgd")
    assert dp.unit_accounting == "tight"
    assert dp.guarantee.method == "double-mixture-of-gaussians(pld)"
    assert dp.guarantee.epsilon <= dp.target_epsilon
    rows = {a.bounding: a for a in p.unit_alternatives if a.phase == "dpsgd"}
    tight, grp = rows["double mixture of Gaussians"], rows["group privacy (pld)"]
    assert tight.applies and tight.noise_multiplier == pytest.approx(dp.params.noise_multiplier, rel=1e-3)
    assert tight.noise_multiplier <= grp.noise_multiplier
    assert not rows["group privacy (rdp)"].applies
    assert verify_plan(p).ok, verify_plan(p).problems
    # the verifier recomputes the guarantee: a stated epsilon below the double mixture's is caught
    forged = dataclasses.replace(dp, guarantee=dataclasses.replace(dp.guarantee, epsilon=0.9 * dp.guarantee.epsilon))
    phases = tuple(forged if ph is dp else ph for ph in p.phases)
    report = verify_plan(dataclasses.replace(p, phases=phases), replan=False)
    assert not report.ok and any("dpsgd" in problem for problem in report.problems)
