"""Calibration and inverse queries: tight, and never overshooting when re-accounted finer."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgetplan import (
    InfeasibleError,
    PoissonDPSGD,
    PrivacyUnit,
    account,
    dpsgd_max_steps,
    dpsgd_min_dataset_size,
    dpsgd_noise_multiplier,
    gaussian_noise_std,
    rr_per_example_epsilon,
    steps_for_epochs,
)

Q = 16384 / 32e6


def dp_accounting_eps(sigma, q, steps, delta, discretization, relation="add"):
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pa

    rel = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if relation == "add" else dpa.NeighboringRelation.REPLACE_ONE
    acc = pa.PLDAccountant(neighboring_relation=rel, value_discretization_interval=discretization)
    acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps))
    return acc.get_epsilon(delta)


def test_steps_for_epochs_rounds_up():
    assert steps_for_epochs(epochs=64, dataset_size=32_000_000, batch_size=16384) == 125_000
    assert steps_for_epochs(epochs=3, dataset_size=32_000_000, batch_size=16384) == 5860
    assert steps_for_epochs(epochs=1, dataset_size=10, batch_size=10) == 1


def test_paper_setting_matches_dp_accounting():
    # DOMAIN.md section 3: dp_accounting's calibrate_dp_mechanism over PLD gives sigma 0.7751.
    cal = dpsgd_noise_multiplier(epsilon=2.0, delta=1 / 32e6, sampling_rate=Q, steps=125_000)
    assert cal.value == pytest.approx(0.7751, abs=2e-4)
    assert cal.guarantee.epsilon <= 2.0 and cal.verified_epsilon <= 2.0
    assert cal.guarantee.epsilon > 1.999  # tight


def test_rdp_calibration_reference():
    # DOMAIN.md section 3: over RDP, sigma 0.8647 for the same setting.
    cal = dpsgd_noise_multiplier(epsilon=2.0, delta=1 / 32e6, sampling_rate=Q, steps=125_000, method="rdp")
    assert cal.value == pytest.approx(0.8647, abs=2e-4)
    assert cal.guarantee.method == "rdp" and cal.guarantee.epsilon <= 2.0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    log_q=st.floats(-3.5, -1.0),
    steps=st.integers(1, 200),
    eps=st.floats(0.3, 8.0),
    log_delta=st.floats(-9, -4),
    relation=st.sampled_from(["add", "replace"]),
)
def test_never_overshoots_when_reaccounted_finer(log_q, steps, eps, log_delta, relation):
    q, delta = 10**log_q, 10**log_delta
    adjacency = "add-remove" if relation == "add" else "replace-one"
    cal = dpsgd_noise_multiplier(epsilon=eps, delta=delta, sampling_rate=q, steps=steps, adjacency=adjacency)
    assert cal.guarantee.epsilon <= eps
    # independent re-accounting: dp_accounting itself, at a 10x finer grid
    assert dp_accounting_eps(cal.value, q, steps, delta, 1e-5, relation) <= eps
    # and tight: 0.1% less noise no longer meets the target
    assert account(PoissonDPSGD(noise_multiplier=cal.value * 0.999, sampling_rate=q, steps=steps),
                   delta=delta, adjacency=adjacency).epsilon > eps


def test_user_level_calibration_k8():
    unit = PrivacyUnit.capped(8)
    cal = dpsgd_noise_multiplier(epsilon=2.0, delta=1e-7, sampling_rate=Q, steps=5860, unit=unit)
    assert cal.guarantee.method == "mixture-of-gaussians(pld)"
    assert cal.guarantee.epsilon <= 2.0 < account(
        PoissonDPSGD(noise_multiplier=cal.value * 0.999, sampling_rate=Q, steps=5860),
        delta=1e-7, adjacency="add-remove", unit=unit).epsilon


def test_group_calibration_needs_more_noise_than_mixture():
    unit = PrivacyUnit.capped(4)
    mog = dpsgd_noise_multiplier(epsilon=2.0, delta=1e-6, sampling_rate=0.01, steps=200, unit=unit)
    grp = dpsgd_noise_multiplier(epsilon=2.0, delta=1e-6, sampling_rate=0.01, steps=200, unit=unit,
                                 unit_accounting="group")
    assert grp.value > mog.value
    assert grp.guarantee.epsilon <= 2.0


def test_max_steps_is_the_largest():
    cal = dpsgd_max_steps(noise_multiplier=1.0, sampling_rate=0.01, epsilon=1.0, delta=1e-6)
    t = int(cal.value)
    assert cal.guarantee.epsilon <= 1.0
    over = account(PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.01, steps=t + 1), delta=1e-6,
                   adjacency="add-remove")
    assert over.epsilon > 1.0


def test_max_steps_infeasible_names_the_knob():
    with pytest.raises(InfeasibleError) as err:
        dpsgd_max_steps(noise_multiplier=0.2, sampling_rate=0.5, epsilon=0.1, delta=1e-8)
    assert err.value.knob == "noise_multiplier" and err.value.suggestion > 0.2
    assert "one step needs noise_multiplier >=" in str(err.value)
    # the suggested noise does allow one step
    g = account(PoissonDPSGD(noise_multiplier=err.value.suggestion, sampling_rate=0.5, steps=1), delta=1e-8,
                adjacency="add-remove")
    assert g.epsilon <= 0.1


def test_min_dataset_size_is_the_smallest():
    cal = dpsgd_min_dataset_size(noise_multiplier=1.0, batch_size=256, epochs=10, epsilon=2.0, delta=1e-6)
    n = int(cal.value)

    def eps(rows):
        return account(PoissonDPSGD(noise_multiplier=1.0, sampling_rate=256 / rows,
                                    steps=steps_for_epochs(epochs=10, dataset_size=rows, batch_size=256)),
                       delta=1e-6, adjacency="add-remove").epsilon

    assert eps(n) <= 2.0 < eps(n - 1)


def test_gaussian_and_rr_calibration():
    cal = gaussian_noise_std(epsilon=1.0, delta=1e-5, sensitivity=2.0, cap=3)
    assert cal.value == pytest.approx(6 * 3.7306, rel=1e-4)
    assert cal.guarantee.epsilon <= 1.0
    splits = rr_per_example_epsilon(epsilon=1.0, cap=50, delta=1e-7)
    assert splits["eps/K"] == 0.02 and round(splits["tight"], 3) == 0.031


def test_calibration_bad_input():
    from budgetplan import InvalidParameterError

    for kwargs, match in [
        (dict(epsilon=math.nan), "epsilon must be a finite number > 0, got nan"),
        (dict(epsilon=-1.0), "epsilon must be a finite number > 0"),
        (dict(epsilon=1.0, delta=1.0), "delta must be in"),
        (dict(epsilon=1.0, steps=0), "steps must be an integer >= 1, got 0"),
    ]:
        args = dict(epsilon=1.0, delta=1e-6, sampling_rate=0.01, steps=10) | kwargs
        with pytest.raises(InvalidParameterError, match=match):
            dpsgd_noise_multiplier(**args)


def test_min_dataset_size_stops_at_the_pld_step_limit():
    # More rows mean more steps; past the PLD engine's step limit the search stops with the
    # knob named instead of failing on the step count it was never given.
    with pytest.raises(InfeasibleError) as err:
        dpsgd_min_dataset_size(noise_multiplier=1.0, batch_size=256, epochs=1, epsilon=1e-6, delta=1e-5)
    assert err.value.knob == "dataset_size" and "step limit" in str(err.value)


def test_solver_does_not_creep_from_one_side():
    """Steep below the root and nearly flat above it, the secant creeps from the flat side: plain
    Illinois took 57 evaluations here; a bisection after three moves of the same end bounds it.
    The answer still meets the target and lies within the tolerance above the root."""
    from budgetplan.planning.calibrate import REL_TOL, solve_decreasing

    root = 1.9

    def eps_of(x):
        return math.exp(min(700.0, 30 * (root - x))) if x < root else 1.0 - 1e-6 * (x - root)

    x, e, n = solve_decreasing(eps_of, 1.0, 1.0, step=0.25, lo_limit=1e-3, hi_limit=1e4)
    assert eps_of(x) <= 1.0 and e == eps_of(x)
    assert root <= x <= root * math.exp(REL_TOL)
    assert n <= 40


@pytest.mark.parametrize("start", [0.3, 1.0, 1.9, 2.1, 7.0])
def test_solver_returns_the_epsilon_it_accounted_at_its_answer(start):
    """The Illinois step halves the stale end's g to unstick the secant; the epsilon returned
    beside x must still be eps_of(x) (the calibration measures the coarse grid's bias with it).
    Before, the halved g came back: 0.99989 for an answer at 0.99653 (from 1.0, target 1)."""
    from budgetplan.planning.calibrate import solve_decreasing

    curves = [lambda x: 1.0 + 0.05 * (2.0 - x) if x < 2.0 else math.exp(-3 * (x - 2.0)),
              lambda x: (2.0 / x) ** 0.5 + 0.01 * math.sin(3 * x) ** 2]
    for eps_of in curves:
        for target in (0.9, 1.0):
            x, e, _ = solve_decreasing(eps_of, target, start, step=0.25, lo_limit=1e-3, hi_limit=1e4, rel_tol=1e-3)
            assert e == eps_of(x) <= target


def test_fine_solve_costs_three_accountings_and_brackets_its_answer(monkeypatch):
    """After the coarse solves, the working grid is accounted at the coarse answer (its bias), then
    at the answer and one tolerance below it, which must fail: the answer is certified within
    REL_TOL of the smallest noise that meets the target, in three fine accountings."""
    from budgetplan.planning import calibrate
    from budgetplan.planning.calibrate import REL_TOL

    fine = []
    real = calibrate.pld_of

    def counted(mech, **kw):
        if kw["discretization"] == 1e-4:
            fine.append(mech.noise_multiplier)
        return real(mech, **kw)

    monkeypatch.setattr(calibrate, "pld_of", counted)
    for eps in (1.0, 4.0):
        fine.clear()
        cal = dpsgd_noise_multiplier(epsilon=eps, delta=1e-6, sampling_rate=0.01, steps=1000, verify=False)
        assert len(set(fine)) <= 3, fine
        below = account(PoissonDPSGD(noise_multiplier=cal.value * math.exp(-REL_TOL), sampling_rate=0.01, steps=1000),
                        delta=1e-6, adjacency="add-remove")
        aim = eps * (1 - 2e-5)  # the PLD search aims this far inside the target
        assert cal.guarantee.epsilon <= aim < below.epsilon


def test_throw_away_builds_leave_the_kept_plds_in_place():
    """A calibration's coarse evaluations build with keep=False: the working grid's PLD of the noise it
    settles on is still the one kept when the calibration re-accounts it (no second composition)."""
    from budgetplan.accounting.pld_build import build
    from budgetplan.units import Adjacency

    def built(sigma, d, keep=True):
        mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=0.01, steps=100)
        return build(mech, adjacency=Adjacency.ADD_REMOVE, unit=PrivacyUnit.example(), discretization=d, delta=1e-6,
                     keep=keep)

    kept = built(2.0, 1e-3)
    for i in range(6):
        assert built(2.0 + 0.01 * (i + 1), 1e-2, keep=False) is not built(2.0 + 0.01 * (i + 1), 1e-2, keep=False)
    assert built(2.0, 1e-3) is kept
    for i in range(6):  # kept builds push it out, as before
        built(2.0 + 0.01 * (i + 1), 1e-2)
    assert built(2.0, 1e-3) is not kept


def _stepped(finer_eps, sigma, epsilon, most=50):
    """The re-check as it was: sigma up one REL_TOL at a time until the finer grid agrees."""
    from budgetplan.planning.calibrate import REL_TOL

    for n in range(1, most + 1):
        if finer_eps(sigma) <= epsilon:
            return sigma, n
        sigma *= 1 + REL_TOL
    raise AssertionError("never agreed")


def test_finer_grid_disagreement_is_bracketed_not_stepped():
    """At q = 1.6e-8 over 1.8e8 steps the finer grid's epsilon sat 0.28% above the working grid's
    (its rounding allowance is larger): the re-check stepped sigma up 1e-4 at a time, nine
    accountings of ~2 s. The bracketing search lands within a tolerance of the stepped answer,
    meets the target at the finer grid, and is minimal within REL_TOL, in at most four."""
    from budgetplan.planning.calibrate import REL_TOL, _verified_sigma

    s0, slope = 0.3839425, -3.6  # the measured answer and d ln eps / d ln sigma there
    for first in (4.6127, 4.6003, 4.62, 4.66):
        calls = []

        def finer_eps(s, first=first, calls=calls):
            calls.append(s)
            return first * (s / s0) ** slope

        old, old_n = _stepped(finer_eps, s0, 4.6)
        calls.clear()
        for known in (slope, None):
            calls.clear()
            new, e, n = _verified_sigma(finer_eps, s0, 4.6, known)
            assert n == len(calls) and e == finer_eps(new) <= 4.6
            assert new / old - 1 <= REL_TOL and old / new - 1 <= REL_TOL
            assert new * math.exp(-REL_TOL) < s0 or finer_eps(new * math.exp(-REL_TOL)) > 4.6
            if known is not None:
                assert n <= 4 < old_n or old_n <= 2


def test_finer_grid_recheck_matches_the_stepped_one_on_a_real_curve():
    """The same at a moderate q on the real finer grid: from a sigma 0.1% short of the finer answer,
    the bracketing search and the 1e-4 steps agree within REL_TOL, and it passes where sigma
    already agrees without a second accounting."""
    from budgetplan.planning.calibrate import REL_TOL, _EpsilonCurve, _verified_sigma
    from budgetplan.units import Adjacency

    curve = _EpsilonCurve(Adjacency.ADD_REMOVE, PrivacyUnit.example(), 0.01, 1000, 1e-6, 1e-4)
    target = curve(1.0)
    old, old_n = _stepped(curve, 0.999, target)
    new, e, n = _verified_sigma(curve, 0.999, target, None)
    assert e <= target and abs(new / old - 1) <= REL_TOL and old_n >= 5
    assert _verified_sigma(curve, 1.0, target, None) == (1.0, target, 1)


def test_finer_grid_that_never_agrees_is_refused():
    """A planted disagreement no noise within 0.5% fixes: refused, naming the grids, not looped on."""
    from budgetplan.errors import AccountingError
    from budgetplan.planning.calibrate import _verified_sigma

    calls = []
    with pytest.raises(AccountingError, match="grids disagree"):
        _verified_sigma(lambda s: calls.append(s) or 5.0, 1.0, 4.0, -3.0)
    assert len(calls) <= 12


def test_group_floor_is_below_the_group_epsilon():
    """K eps_e(delta / K) never exceeds the group-privacy epsilon (it reads delta_e <= delta / K)."""
    from budgetplan.planning.calibrate import _group_floor
    from budgetplan.units import Adjacency

    unit = PrivacyUnit.capped(4)
    for sigma in (0.6, 1.0, 3.0):
        mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=0.01, steps=200)
        floor = _group_floor(mech, 1e-6, Adjacency.ADD_REMOVE, unit, "pld", 1e-4)
        full = account(mech, delta=1e-6, adjacency="add-remove", unit=unit, unit_accounting="group").epsilon
        assert 0 < floor <= full


def test_group_calibration_skips_hopeless_noise_and_answers_as_before(monkeypatch):
    """Noise whose floor is above the target is not accounted in full (a dozen compositions each at
    q near 1e-8): fewer full group accountings, and the answer of the search without the floor
    within REL_TOL, meeting the target."""
    from budgetplan.accounting import group as group_module
    from budgetplan.planning import calibrate
    from budgetplan.planning.calibrate import REL_TOL

    full = []
    real_group = group_module.group_from_curve

    def counted(*a, **kw):
        full.append(1)
        return real_group(*a, **kw)

    monkeypatch.setattr(group_module, "group_from_curve", counted)
    unit = PrivacyUnit.capped(4)
    kw = dict(epsilon=2.0, delta=1e-6, sampling_rate=0.01, steps=200, unit=unit, unit_accounting="group",
              verify=False)
    new = dpsgd_noise_multiplier(**kw)
    n_new = len(full)
    full.clear()
    monkeypatch.setattr(calibrate, "_group_floor", lambda *a: 0.0)  # the search as it was
    old = dpsgd_noise_multiplier(**kw)
    assert new.guarantee.epsilon <= 2.0 and abs(new.value / old.value - 1) <= REL_TOL
    assert n_new < len(full)
