"""The f-DP one-run test (arXiv:2410.22235): its curve, its greedy bound against a linear program, its validity.

Cross-checks by independent paths: the hockey-stick envelope against the Gaussian trade-off
curve in closed form; the greedy least mass against the exact minimum of the linear
program over every distribution of the correct count; at delta = 0 against the exact
binomial tail of randomized response (Steinke et al.'s bound is the Clopper-Pearson limit
there, which randomized response attains, so no valid test may go beyond it); and
simulated runs exactly at the hypothesis.
"""

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from budgetplan.audit.canary import GUESS_FRACTIONS, guesses
from budgetplan.audit.fdp import (
    DIVISOR_TOLERANCE,
    NOISE_DIVISOR_RANGE,
    Curve,
    MechanismFamily,
    PairFamily,
    least_mass,
    noise_divisor_bound,
    plan_family,
    refutes,
    scaled,
)
from budgetplan.audit.steinke import epsilon_lower_bound as steinke_bound
from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import Composition, DiscreteLaplaceCount, PoissonDPSGD, RandomizedResponse
from budgetplan.units import Adjacency, PrivacyUnit


@dataclass(frozen=True)
class Noiseless:
    rows: int = 1


def gaussian_delta(mu: float, eps: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        d = stats.norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    return np.nan_to_num(d, nan=0.0)


def gaussian_curve(mu: float, top: float = 30.0, points: int = 3001) -> Curve:
    eps = np.linspace(0.0, top, points)
    return Curve.from_hockey_stick(eps, gaussian_delta(mu, eps))


@pytest.mark.parametrize("mu", [0.3, 1.0, 2.5])
def test_gaussian_envelope_is_the_closed_form_from_below(mu):
    curve = gaussian_curve(mu)
    x = np.r_[np.geomspace(1e-7, 0.1, 40), np.linspace(0.1, 0.99, 40)]
    exact = stats.norm.cdf(stats.norm.ppf(x) - mu)  # mu-GDP: g(x) = Phi(Phi^-1(x) - mu)
    got = np.array([curve(v) for v in x])
    assert np.all(got <= exact * (1 + 1e-12) + 1e-300)
    assert np.all(got >= exact * (1 - 3e-4))


@given(eps=st.floats(0.0, 8.0), delta=st.floats(0.0, 0.2), x=st.floats(0.0, 1.0))
@settings(max_examples=200, deadline=None)
def test_epsilon_delta_curve_is_its_three_lines(eps, delta, x):
    expected = max(0.0, (x - delta) * math.exp(-eps), 1 - delta - math.exp(eps) * (1 - x))
    assert Curve.epsilon_delta(eps, delta)(x) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_curve_refuses_bad_lines():
    with pytest.raises(InvalidParameterError, match="as many"):
        Curve.from_hockey_stick([0.0, 1.0], [0.1])
    with pytest.raises(InvalidParameterError, match="NaN"):
        Curve.from_hockey_stick([1.0], [math.nan])
    with pytest.raises(InvalidParameterError, match="epsilon"):
        Curve.epsilon_delta(-1.0, 0.0)


def lp_least_mass(pairs, m: int, cp: int, c: int, tau: float) -> float:
    """min sum_k p_k over every distribution of N (k = 0..c') with P[N >= c] >= tau, under (1), times c'/m.

    Variables p_0..p_c'; for each level j and each (eps, delta) line:
    H_j >= (R_{j+1} - delta) e^-eps and H_j >= 1 - delta - e^eps (1 - R_{j+1}), H_j >= H_{j+1} being
    automatic. Written directly from the module note's definitions, not from the greedy.
    """
    k = np.arange(cp + 1)
    rows, rhs = [], []
    for j in range(cp):
        hj = np.where(k >= j, (cp - k) / m, 0.0)
        rj1 = np.where(k >= j + 1, k / m, 0.0)
        for e, d in pairs:
            rows.append(-(hj - math.exp(-e) * rj1))       # hj - e^-eps r >= -delta e^-eps
            rhs.append(d * math.exp(-e))
            rows.append(-(hj - math.exp(e) * rj1))        # hj - e^eps r >= 1 - delta - e^eps
            rhs.append(-(1 - d - math.exp(e)))
    rows.append(-np.where(k >= c, 1.0, 0.0))
    rhs.append(-tau)
    # HiGHS's default feasibility tolerance (1e-7, absolute) is 1e-5 of a least mass near 1e-2: the
    # reference would undercut the exact greedy by that much, so it is solved to 1e-10
    res = optimize.linprog(np.ones(cp + 1), A_ub=np.array(rows), b_ub=np.array(rhs), bounds=(0, None),
                           method="highs", options={"primal_feasibility_tolerance": 1e-10,
                                                    "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0
    return res.fun * cp / m


@given(cp=st.integers(1, 10), cfrac=st.floats(0.0, 1.0), extra=st.integers(0, 40), tau=st.floats(1e-3, 1.0),
       pairs=st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 0.3)), min_size=1, max_size=3))
@settings(max_examples=150, deadline=None)
def test_greedy_is_the_least_mass_of_every_distribution(cp, cfrac, extra, tau, pairs):
    c = round(cfrac * cp)
    m = cp + extra
    curve = Curve.from_hockey_stick([p[0] for p in pairs], [p[1] for p in pairs])
    greedy = least_mass(curve, m, cp, c, tau)
    exact = lp_least_mass(pairs, m, cp, c, tau)
    if exact > cp / m * (1 + 1e-7):
        assert greedy > cp / m  # the greedy may stop early once past c'/m
    else:
        assert greedy == pytest.approx(exact, rel=1e-6, abs=1e-12)


def fdp_pair_bound(m: int, r: int, v: int, delta: float, level: float) -> float:
    lo, hi = 0.0, 60.0
    if not refutes(Curve.epsilon_delta(0.0, delta), m, r, v, level):
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if refutes(Curve.epsilon_delta(mid, delta), m, r, v, level):
            lo = mid
        else:
            hi = mid
    return lo


@given(r=st.integers(1, 400), frac=st.floats(0.5, 1.0), extra=st.integers(0, 2000))
@settings(max_examples=80, deadline=None)
def test_pure_dp_never_beyond_what_randomized_response_attains(r, frac, extra):
    # eps-randomized response gets each guess right with probability e^eps / (1 + e^eps),
    # independently, and is eps-DP: an eps whose binomial tail at v is above the level is
    # attained, so no valid test refutes it. Steinke et al.'s bound at delta = 0 is exactly
    # the largest eps whose tail is below the level.
    v = max(0, min(r, round(frac * r)))
    m = r + extra
    ours = fdp_pair_bound(m, r, v, 0.0, 0.05)
    attained = steinke_bound(m, r, v, delta=0.0, confidence=0.95)
    assert ours <= attained + 1e-6
    if v == r and r >= 20:
        assert ours >= 0.95 * attained  # and near it where the evidence is strongest


def test_tighter_than_steinke_where_delta_matters():
    # a million canaries at delta 1e-5: Steinke et al.'s 2 m delta term costs most of the bound
    ours = fdp_pair_bound(1_000_000, 10_000, 9_900, 1e-5, 0.05)
    theirs = steinke_bound(1_000_000, 10_000, 9_900, delta=1e-5, confidence=0.95)
    assert ours > theirs + 1.0


def test_refutation_grows_with_correct_guesses_and_with_the_curve():
    curve = gaussian_curve(1.0)
    hits = [refutes(curve, 5000, 500, c, 0.01) for c in range(250, 501)]
    first = hits.index(True)
    assert not any(hits[:first]) and all(hits[first:])
    leakier = gaussian_curve(1.5)
    assert not refutes(leakier, 5000, 500, 250 + first, 0.01)


def simulate(mu_true: float, curve: Curve, m: int, trials: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    level = 0.05 / len(GUESS_FRACTIONS)
    ks = [max(1, round(f * m)) for f in GUESS_FRACTIONS]
    out = 0
    for _ in range(trials):
        bits = rng.integers(0, 2, m)
        scores = rng.normal(size=m) + mu_true * bits
        out += any(refutes(curve, m, *guesses(scores, bits, k, k), level) for k in ks)
    return out


def test_runs_exactly_at_the_curve_are_rarely_refuted_and_twice_as_leaky_ones_are():
    # Canaries of a mu-Gaussian mechanism (scores N(mu S_i, 1)) against the mu-GDP curve:
    # the test holds at 0.05; with mu doubled (the noise halved) it refutes almost always.
    curve = gaussian_curve(1.0)
    assert simulate(1.0, curve, 2000, 300, 0) <= 25   # P[Binomial(300, 0.05) > 25] < 0.01
    assert simulate(2.0, curve, 2000, 100, 1) >= 90


def test_randomized_response_at_its_epsilon_is_rarely_refuted():
    rng = np.random.default_rng(7)
    eps, m, over = 2.0, 2000, 0
    curve = Curve.epsilon_delta(eps, 0.0)
    level = 0.05 / len(GUESS_FRACTIONS)
    for _ in range(200):
        bits = rng.integers(0, 2, m)
        keep = rng.random(m) < 1 / (1 + math.exp(-eps))
        released = np.where(keep, bits, 1 - bits) + 0.01 * rng.random(m)
        over += any(refutes(curve, m, *guesses(released, bits, k, k), level)
                    for k in [max(1, round(f * m)) for f in GUESS_FRACTIONS])
    assert over <= 20  # Binomial(200, <= 0.05): P[> 20] < 1e-3


def test_noise_divisor_is_where_refutation_stops():
    fam = PairFamily(2.0, 1e-8, description="test")
    counts = [(5000, 100, 95), (5000, 1000, 800)]
    level = 0.01
    s, i = noise_divisor_bound(fam, counts, level)
    assert NOISE_DIVISOR_RANGE[0] <= s < NOISE_DIVISOR_RANGE[1] and i is not None
    assert refutes(fam.curve(s), *counts[i], level)
    above = fam.curve(s * (1 + DIVISOR_TOLERANCE))
    assert not any(refutes(above, *c, level) for c in counts)
    assert s * 2.0 == pytest.approx(fdp_pair_bound(5000, *counts[i][1:], 1e-8, level), rel=2e-3)
    # chance guessing refutes nothing; perfect guessing is capped at the range's top
    assert noise_divisor_bound(fam, [(5000, 1000, 500)], level) == (0.0, None)
    small = PairFamily(0.1, 0.0, description="test")  # the range's top is epsilon 1.6
    assert noise_divisor_bound(small, [(5000, 5000, 5000)], level) == (NOISE_DIVISOR_RANGE[1], 0)


def test_scaling_divides_noise_and_multiplies_rr_epsilon():
    mech = Composition(phases=(RandomizedResponse(epsilon=1.5),
                               PoissonDPSGD(noise_multiplier=4.0, sampling_rate=0.1, steps=7)))
    out = scaled(mech, 2.0)
    assert out.phases[0].epsilon == 3.0 and out.phases[1].noise_multiplier == 2.0
    assert out.phases[1].steps == 7 and out.phases[1].sampling_rate == 0.1
    assert scaled(DiscreteLaplaceCount(epsilon=1.0, sensitivity=1), 3.0).epsilon == 3.0


def test_mechanism_family_is_ordered_and_its_epsilon_is_the_accountant_s():
    from budgetplan.accounting import DEFAULT_DISCRETIZATION, account

    mech = PoissonDPSGD(noise_multiplier=4.386, sampling_rate=0.5, steps=10)
    fam = MechanismFamily(mech, Adjacency.REPLACE_ONE, PrivacyUnit.example(), 1e-8, DEFAULT_DISCRETIZATION)
    assert fam.epsilon(1.0) == pytest.approx(account(mech, delta=1e-8, adjacency="replace-one",
                                                     method="pld").epsilon, rel=1e-9)
    assert fam.epsilon(2.0) == pytest.approx(account(scaled(mech, 2.0), delta=1e-8, adjacency="replace-one",
                                                     method="pld").epsilon, rel=1e-9)
    x = np.r_[np.geomspace(1e-8, 0.1, 30), np.linspace(0.1, 0.9, 20)]
    values = [[fam.curve(s)(v) for v in x] for s in (0.5, 1.0, 2.0)]
    assert np.all(np.diff(values, axis=0) <= 1e-15)  # more noise: a higher curve
    # near the mu-GDP curve of the same epsilon (the CLT), and never far below it
    gdp = stats.norm.cdf(stats.norm.ppf(x) - 0.717)
    assert np.all(np.asarray(values[1]) >= 0.95 * gdp)


def test_plan_family_is_the_joint_pld_or_the_pair():
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.canary import audit_scenario
    from trainers.data.synth import SYNTH_FEATURES

    plan = build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=1e-8, dataset_size=20_000, batch_size=10_000,
                                                    epochs=5, clipping_norm=0.1, spec=SYNTH_FEATURES)))
    fam = plan_family(plan)
    assert isinstance(fam, MechanismFamily) and fam.epsilon(1.0) == pytest.approx(plan.guarantee.epsilon, rel=1e-6)
    user = build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=1e-8, dataset_size=20_000, batch_size=10_000,
                                                    epochs=5, clipping_norm=0.1, spec=SYNTH_FEATURES).replace(
        'unit = "impression"', 'unit = "user"\ncap = 4\ncapping = "random"\nunit_accounting = "group"')))
    pair = plan_family(user)
    assert isinstance(pair, PairFamily) and pair.epsilon(1.0) == user.guarantee.epsilon


def test_least_mass_refuses_bad_counts():
    curve = Curve.epsilon_delta(1.0, 0.0)
    for m, r, v in [(10, 11, 5), (10, 5, 6), (0, 0, 0), (10, -1, 0)]:
        with pytest.raises(InvalidParameterError):
            least_mass(curve, m, r, v, 0.05)
    with pytest.raises(InvalidParameterError, match="level"):
        refutes(curve, 10, 5, 5, 0.0)
    with pytest.raises(UnsupportedError, match="no noise"):
        scaled(Noiseless(), 2.0)


def test_chance_and_no_guesses_refute_nothing():
    curve = Curve.epsilon_delta(0.0, 0.0)
    assert not refutes(curve, 100, 0, 0, 0.5)
    assert not refutes(curve, 1000, 200, 100, 0.5)
