"""Group privacy: the generic formula and its optimisation over the example-level delta."""

import math

import pytest

from budgetplan.accounting.group import group_from_curve, group_privacy


def test_formula():
    eps, delta = group_privacy(epsilon=1.0, delta=1e-7, group_size=5)
    assert eps == 5.0
    assert delta == pytest.approx(1e-7 * sum(math.exp(i) for i in range(5)), rel=1e-12)


def test_group_of_one_is_identity_and_pure_stays_pure():
    assert group_privacy(epsilon=0.3, delta=1e-6, group_size=1) == pytest.approx((0.3, 1e-6))
    assert group_privacy(epsilon=0.3, delta=0.0, group_size=4) == (pytest.approx(1.2), 0.0)


def test_group_from_curve_is_valid_and_near_best():
    # a Gaussian mechanism's curve: the optimum over delta_e is found to within 1%
    from budgetplan.accounting import gaussian

    def curve(d):
        return gaussian.analytic_epsilon(sigma=4.0, delta=d)

    k, target = 3, 1e-5
    eps, delta_e = group_from_curve(curve, group_size=k, delta=target)
    assert group_privacy(epsilon=curve(delta_e), delta=delta_e, group_size=k)[1] <= target
    assert eps == pytest.approx(k * curve(delta_e))
    brute = min(
        k * curve(d) for d in (10 ** (x / 200) for x in range(-4000, -1000))
        if group_privacy(epsilon=curve(d), delta=d, group_size=k)[1] <= target
    )
    assert eps <= brute  # at least as good as a grid search over delta_e
    # and near the optimum: a 1% larger example-level delta is already infeasible
    bigger = delta_e * 1.01
    assert group_privacy(epsilon=curve(bigger), delta=bigger, group_size=k)[1] > target


def test_search_reads_a_bounded_number_of_deltas():
    # Each reading may cost a PLD composition: a vacuous curve is given up on after the
    # doubling descent reaches delta_e ~ 1e-300, a dozen readings, not hundreds.
    calls = []

    def never(d):
        calls.append(d)
        return math.inf

    assert group_from_curve(never, group_size=1000, delta=1e-5)[0] == math.inf
    assert len(calls) <= 12 and min(calls) >= 1e-300


@pytest.mark.parametrize("kwargs", [dict(epsilon=math.nan), dict(delta=math.inf), dict(group_size=0)])
def test_group_privacy_refuses_bad_input(kwargs):
    from budgetplan import InvalidParameterError

    with pytest.raises(InvalidParameterError):
        group_privacy(**(dict(epsilon=1.0, delta=1e-6, group_size=3) | kwargs))



def test_a_loose_reading_does_not_steer_the_answer():
    """Every feasible reading is a valid guarantee, so the smallest is kept. Planted as a PLD tilt
    failure once read it (issue 27): from 4.7e-11 up the curve is loose (0.40, still feasible,
    then 0.6, not), below it tight (0.25); the largest feasible delta_e is in the loose band."""
    def curve(d):
        return 0.6 if d >= 5e-11 else 0.40 if d > 4.7e-11 else 0.25

    eps, delta_e = group_from_curve(curve, group_size=8, delta=3e-9)
    assert delta_e * (math.expm1(eps) / math.expm1(eps / 8)) <= 3e-9 * (1 + 1e-12)
    assert eps == pytest.approx(8 * 0.25)
