"""Intercept calibration: the plan's calibration phase, its accounting, and the shift solved from the release."""

import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize
from scipy.special import expit

from budgetplan import intercept
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError
from budgetplan.plan import Plan, canonical_json
from budgetplan.plan.phases import CalibrationPhase, DPSGDPhase, RRPhase, phase_from_dict, phase_to_dict
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario


def scenario(*, eps=4.0, algorithm="dpsgd", calibration="share = 0.05", cap=1, adjacency="add-remove",
             unit_accounting="tight", n=100_000, extra=""):
    unit = 'unit = "impression"' if cap == 1 else (f'unit = "user"\ncap = {cap}\ncapping = "random"\n'
                                                   f'unit_accounting = "{unit_accounting}"')
    algo = 'name = "dpsgd"' if algorithm == "dpsgd" else (
        f'name = "{algorithm}"\nsplit = "paper-v1"\ntower = "frozen"\n[rr]\nepochs = 1\nbatch_size = 512')
    # None: opted out (share = 0); "absent": no table, which calibrates by default
    cal = {None: "[calibration]\nshare = 0\n", "absent": ""}.get(calibration, f"[calibration]\n{calibration}\n")
    return parse_scenario(f"""name = "calibrated"
[budget]
epsilon = {eps!r}
delta = 1e-6
[privacy]
adjacency = "{adjacency}"
{unit}
[data]
dataset_size = {n}
[algorithm]
{algo}
[dpsgd]
batch_size = 1000
steps = 20
clipping_norm = 5.0
{cal}{extra}""")


@pytest.fixture(scope="module")
def plan():
    return build_plan(scenario())


# ---------------------------------------------------------------------------- the plan

def test_the_release_takes_its_share_last_and_the_guarantee_stays_the_declared_total(plan):
    sgd, cal = plan.phases
    assert isinstance(sgd, DPSGDPhase) and isinstance(cal, CalibrationPhase) and plan.calibration is cal
    # by default the two phases are planned to the run epsilon E' > 4 whose PLD composition is 4
    e = plan.run_epsilon
    assert plan.scenario.composition == "pld" and 4.0 < e < 4.4
    assert cal.target_epsilon == pytest.approx(0.05 * e) and cal.target_delta == pytest.approx(0.05 * 1e-6)
    assert sgd.target_epsilon + cal.target_epsilon <= e and sgd.target_delta + cal.target_delta <= 1e-6
    assert plan.total.epsilon == math.fsum([sgd.guarantee.epsilon, cal.guarantee.epsilon]) <= e
    assert plan.guarantee == plan.total_pld and 0.999 * 4.0 <= plan.guarantee.epsilon <= 4.0
    assert cal.params.coordinates == len(intercept.SHIFTS) + 1 == 14
    assert cal.params.sensitivity == cal.mechanism.sensitivity == math.sqrt(14)
    assert verify_plan(plan).ok


def test_the_release_noise_meets_its_share_by_dp_accounting():
    """The analytic-Gaussian noise against dp_accounting's PLD of the same Gaussian (an independent method)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    for eps in (0.5, 3.0, 8.0):
        cal = build_plan(scenario(eps=eps)).calibration
        m = cal.mechanism
        ref = pld.from_gaussian_mechanism(m.noise_std / m.sensitivity, value_discretization_interval=1e-5)
        got = ref.get_epsilon_for_delta(cal.target_delta)
        # PLD is pessimistic by its discretisation; the analytic sigma is exact at the target
        assert cal.target_epsilon * (1 - 1e-3) <= got <= cal.target_epsilon * (1 + 2e-3), (eps, got)


def test_pld_total_matches_dp_accounting_composing_dpsgd_and_the_release(plan):
    from dp_accounting.pld import privacy_loss_distribution as pld

    m, c = plan.dpsgd.mechanism, plan.calibration.mechanism
    ref = pld.from_gaussian_mechanism(m.noise_multiplier, sampling_prob=m.sampling_rate,
                                      value_discretization_interval=1e-4).self_compose(m.steps)
    ref = ref.compose(pld.from_gaussian_mechanism(c.noise_std / c.sensitivity, value_discretization_interval=1e-4))
    want = ref.get_epsilon_for_delta(1e-6)
    assert want * (1 - 1e-4) <= plan.total_pld.epsilon <= want * (1 + 1e-4)


def test_a_unit_of_k_rows_gets_k_times_the_sensitivity():
    basic = '[accounting]\ncomposition = "basic"\n'  # the release's share of the same epsilon in each plan
    one = build_plan(scenario(eps=2.0, extra=basic)).calibration
    for accounting in ("tight", "group"):
        four = build_plan(scenario(eps=2.0, cap=4, unit_accounting=accounting, extra=basic)).calibration
        assert four.params.unit_sensitivity == 4 * four.params.sensitivity == 4 * math.sqrt(14)
        assert four.guarantee.epsilon <= 2.0 * 0.05 * (1 + 1e-9)
        if accounting == "tight":  # the Gaussian at sensitivity 4 sqrt(14): four times the noise
            assert four.params.noise_std == pytest.approx(4 * one.params.noise_std, rel=1e-9)
        else:  # group privacy over 4 rows is looser than the exact Gaussian at 4 times the sensitivity
            assert four.params.noise_std > 4 * one.params.noise_std


def test_hybrid_plans_rr_dpsgd_and_the_release_to_the_budget():
    p = build_plan(scenario(eps=8.0, algorithm="hybrid", adjacency="replace-one"))
    assert [type(x) for x in p.phases] == [RRPhase, DPSGDPhase, CalibrationPhase]
    assert p.calibration.params.target == "positives and rr labels"
    assert p.phases[0].target_epsilon == 3.0  # paper-v1: min(0.6 eps, 3) of what the release leaves
    assert math.fsum(x.target_epsilon for x in p.phases) <= p.run_epsilon and p.total.epsilon <= p.run_epsilon
    assert p.guarantee == p.total_pld and p.guarantee.epsilon <= 8.0 < p.run_epsilon
    assert verify_plan(p).ok


def test_share_zero_opts_out_and_plans_as_before_the_release_existed():
    p = build_plan(scenario(calibration=None))
    assert p.calibration is None and "calibration" not in p.to_json()
    assert [type(x) for x in p.phases] == [DPSGDPhase] and p.phases[0].target_epsilon == 4.0
    assert build_plan(scenario(calibration="")).calibration.params.share == intercept.SHARE


def test_without_the_table_every_dpsgd_and_hybrid_plan_calibrates():
    for algorithm, adjacency in (("dpsgd", "add-remove"), ("hybrid", "replace-one")):
        p = build_plan(scenario(calibration="absent", algorithm=algorithm, adjacency=adjacency))
        assert p.calibration is not None and p.calibration.params.share == intercept.SHARE
        assert "intercept" in " ".join(render_statement(p).split()).lower()
    grid = scenario(calibration="absent", extra='[tuning]\nclipping_norm = [1.0, 5.0]\n')
    assert grid.calibration is None and any("no intercept calibration" in w for w in grid.warnings)


@settings(max_examples=10, deadline=None)
@given(eps=st.floats(0.5, 10.0), share=st.floats(0.001, 0.5), cap=st.sampled_from([1, 3]))
def test_any_calibrated_plan_meets_its_budget(eps, share, cap):
    p = build_plan(scenario(eps=eps, calibration=f"share = {share!r}", cap=cap))
    # the release takes its share of the run epsilon the phases are planned to (above eps where they
    # compose by PLD: the default), and the headline guarantee is within the budget either way
    assert p.run_epsilon >= eps and p.guarantee.epsilon <= eps * (1 + 1e-9)
    assert p.calibration.guarantee.epsilon <= p.run_epsilon * share * (1 + 1e-9)
    assert p.total.epsilon <= p.run_epsilon * (1 + 1e-9)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(calibration="share = -0.1"), "[calibration].share"),
    (dict(calibration="share = -0.0"), "[calibration].share"),
    (dict(calibration="share = 0.6"), "at most 0.5"),
    (dict(calibration="share = nan"), "[calibration].share"),
    (dict(calibration="share = inf"), "[calibration].share"),
    (dict(calibration='share = "5%"'), "[calibration].share"),
    (dict(calibration="shares = 0.1"), "shares"),
])
def test_bad_calibration_tables_are_refused_in_one_line(kwargs, fragment):
    with pytest.raises(InvalidParameterError) as exc:
        scenario(**kwargs)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("example, table, fragment", [
    ("walr", "", "does not apply to algorithm 'walr'"),
    ("rr-impression", "share = 0.05\n", "calibrates its intercept for free"),
])
def test_tables_that_do_not_apply_are_refused(example, table, fragment):
    from budgetplan.scenario import examples

    text = open(examples.path(example)).read()
    with pytest.raises(InvalidParameterError, match=r"\[calibration\]") as exc:
        parse_scenario(text + "\n[calibration]\n" + table)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def _rr_text():
    from budgetplan.scenario import examples

    return open(examples.path("rr-impression")).read() + "\n[calibration]\n"  # RR is replace-one: labels only


def test_rr_alone_calibrates_for_free():
    p = build_plan(parse_scenario(_rr_text()))
    assert build_plan(parse_scenario(_rr_text().replace("[calibration]", ""))).free_calibration  # by default
    bare = build_plan(parse_scenario(_rr_text() + "share = 0\n"))
    assert p.free_calibration and p.calibration is None and not bare.free_calibration
    # the same RR phase at the same epsilon: nothing spent
    assert [phase_to_dict(x) for x in p.phases] == [phase_to_dict(x) for x in bare.phases]
    assert p.guarantee.epsilon == bare.guarantee.epsilon and verify_plan(p).ok
    assert "at no cost" in " ".join(render_statement(p).split())


def test_plan_json_round_trips_with_its_calibration_phase(plan):
    data = json.loads(plan.to_json())
    assert data["phases"][-1]["name"] == "calibration" and data["scenario"]["calibration"] == {"share": 0.05}
    again = Plan.from_json(plan.to_json())
    assert again.sha256 == plan.sha256 and again.calibration == plan.calibration
    entry = phase_to_dict(plan.calibration)
    assert phase_from_dict(entry) == plan.calibration
    with pytest.raises(InvalidParameterError, match="shifts"):
        phase_from_dict({**entry, "parameters": {**entry["parameters"], "shifts": [1.0, 2.0]}})


def _rehash(data: dict) -> Plan:
    body = {k: v for k, v in data.items() if k != "sha256"}
    body["sha256"] = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    return Plan.from_json(json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n")


def test_verify_detects_an_edited_calibration_phase(plan):
    def less_noise(d):
        d["phases"][-1]["mechanism"]["noise_std"] /= 2

    def less_noise_everywhere(d):
        c = d["phases"][-1]
        c["mechanism"]["noise_std"] /= 2
        c["parameters"]["noise_std"] /= 2

    def fewer_coordinates(d):
        c = d["phases"][-1]
        c["parameters"]["shifts"] = c["parameters"]["shifts"][1:]
        c["parameters"]["coordinates"] -= 1

    def dropped(d):
        d["phases"] = d["phases"][:-1]
        d["total"]["basic"] = d["phases"][0]["guarantee"]

    def bigger_share(d):
        d["phases"][-1]["parameters"]["share"] = 0.01

    for edit, fragment in ((less_noise, "noise_std"), (less_noise_everywhere, "guarantee"),
                           (fewer_coordinates, "shifts"), (dropped, "calibration phase"),
                           (bigger_share, "share vs scenario")):
        data = json.loads(plan.to_json())
        edit(data)
        problems = verify_plan(_rehash(data)).problems
        assert any(fragment in p for p in problems), (edit.__name__, problems)


def test_statement_describes_the_release(plan):
    text = " ".join(render_statement(plan).split())
    assert "intercept calibration" in text and "14 numbers" in text and "post-processing" in text


# ------------------------------------------------------------------ the release and the solve

def _release(logits, labels, shifts=intercept.SHIFTS):
    return np.array([expit(logits + d).sum() for d in shifts] + [labels.sum()])


def test_sensitivity_is_attained_and_never_exceeded():
    """sqrt(m + 1) bounds one row's change under both adjacencies, and rows at the extremes reach it."""
    rng = np.random.default_rng(0)
    z, y = rng.normal(-2, 2, 500), rng.integers(0, 2, 500)
    base = _release(z, y)
    worst = 0.0
    for _ in range(300):
        i = rng.integers(500)
        z2, y2 = z.copy(), y.copy()
        z2[i], y2[i] = rng.normal(0, 30), rng.integers(0, 2)
        worst = max(worst, np.linalg.norm(_release(z2, y2) - base),  # replace-one
                    np.linalg.norm(_release(np.delete(z, i), np.delete(y, i)) - base))  # add-remove
    assert worst <= intercept.sensitivity()
    far = np.linalg.norm(_release(np.array([60.0]), np.array([1])) - _release(np.array([-60.0]), np.array([0])))
    assert far == pytest.approx(intercept.sensitivity(), rel=1e-12)


def _exact_shift(z, rate):
    return optimize.brentq(lambda d: expit(z + d).mean() - rate, -20, 20, xtol=1e-13)


@pytest.mark.parametrize("loc, scale, rate", [(-2.0, 1.5, 0.2), (-3.0, 2.5, 0.12), (0.5, 1.0, 0.5), (-1.0, 3.0, 0.2)])
def test_the_solve_recovers_the_base_rate_as_the_noise_vanishes(loc, scale, rate):
    rng = np.random.default_rng(1)
    z = rng.normal(loc, scale, 20_000)
    sums = _release(z, np.zeros(1))[:-1]
    d, clamped = intercept.solve_shift(sums, rows=z.size, target=rate * z.size)
    assert not clamped
    # the interpolation in logit is close to the exact shift, and the mean it gives closer still to the rate
    assert d == pytest.approx(_exact_shift(z, rate), abs=0.05)
    assert expit(z + d).mean() / rate == pytest.approx(1.0, abs=0.01)


def test_the_solve_under_noise_lands_near_the_rate():
    rng = np.random.default_rng(2)
    z, n, rate = rng.normal(-2.5, 1.5, 50_000), 50_000, 0.15
    ratios = []
    for _ in range(50):
        sums = _release(z, np.zeros(1))[:-1] + rng.normal(0, 40.0, len(intercept.SHIFTS))
        target = rate * n + rng.normal(0, 40.0)
        d, _ = intercept.solve_shift(sums, rows=n, target=target)
        ratios.append(expit(z + d).mean() / rate)
    assert abs(np.mean(ratios) - 1) < 0.01 and np.std(ratios) < 0.02


def test_the_solve_clamps_to_the_grid_and_survives_non_monotone_noise():
    z = np.full(100, -1.0)
    sums = _release(z, np.zeros(1))[:-1]
    assert intercept.solve_shift(sums, rows=100, target=99.9) == (3.0, True)
    assert intercept.solve_shift(sums, rows=100, target=0.01) == (-3.0, True)
    assert intercept.solve_shift(sums, rows=100, target=-5.0) == (-3.0, True)  # a noisy count below zero
    jumbled = sums.copy()
    jumbled[7] = jumbled[5] - 3  # noise that breaks monotonicity
    d, clamped = intercept.solve_shift(jumbled, rows=100, target=float(sums[6]))
    assert not clamped and -3 <= d <= 3


@pytest.mark.parametrize("call, fragment", [
    (lambda: intercept.solve_shift([1.0, 2.0], rows=10, target=3.0), "one value per shift"),
    (lambda: intercept.solve_shift([math.nan] * 13, rows=10, target=3.0), "finite"),
    (lambda: intercept.solve_shift([1.0] * 13, rows=10, target=math.inf), "finite"),
    (lambda: intercept.solve_shift([1.0] * 13, rows=0, target=3.0), "rows"),
    (lambda: intercept.rr_estimate([0, 1, 2], 0.1), "noisy_labels"),
    (lambda: intercept.rr_estimate([0, 1], 0.5), "flip_probability"),
    (lambda: intercept.combine(), "at least one"),
    (lambda: intercept.combine((1.0, -1.0)), "variance"),
])
def test_bad_inputs_are_refused_in_one_line(call, fragment):
    with pytest.raises(InvalidParameterError) as exc:
        call()
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_rr_estimate_is_unbiased_with_its_stated_variance():
    rng = np.random.default_rng(3)
    y, rho = (rng.random(5_000) < 0.2).astype(float), 0.3
    draws = []
    for _ in range(400):
        flips = rng.random(y.size) < rho
        value, var = intercept.rr_estimate(np.where(flips, 1 - y, y), rho)
        draws.append(value)
    assert var == pytest.approx(y.size * rho * (1 - rho) / (1 - 2 * rho) ** 2)
    assert abs(np.mean(draws) - y.sum()) < 4 * math.sqrt(var / 400)
    assert np.var(draws) == pytest.approx(var, rel=0.2)


def test_solve_free_is_the_exact_shift():
    rng = np.random.default_rng(4)
    z = rng.normal(-2.0, 1.5, 10_000)
    for rate in (0.05, 0.2, 0.4):
        d, clamped = intercept.solve_free(z, target=rate * z.size)
        assert not clamped and d == pytest.approx(_exact_shift(z, rate), abs=1e-9)
    assert intercept.solve_free(z, target=0.0) == (-3.0, True)
    assert intercept.solve_free(z, target=float(z.size)) == (3.0, True)
    # a NaN logit counts as 1/2 at every shift, as in the release
    d, _ = intercept.solve_free(np.array([np.nan, 0.0]), target=1.0)
    assert d == pytest.approx(0.0, abs=1e-9)
    for bad in (dict(logits=[], target=1.0), dict(logits=[0.0], target=math.nan)):
        with pytest.raises(InvalidParameterError):
            intercept.solve_free(**bad)


def test_combine_weights_by_inverse_variance():
    value, var = intercept.combine((10.0, 1.0), (20.0, 4.0))
    assert value == pytest.approx((10 / 1 + 20 / 4) / (1 + 1 / 4)) and var == pytest.approx(1 / (1 + 1 / 4))
    assert intercept.combine((7.0, 2.0)) == (7.0, 2.0)


@pytest.mark.parametrize("selection", ["naive", "repeat-and-select"])
def test_tuned_plans_account_the_release_in_every_run(selection):
    tuning = f'[tuning]\nconfigurations = 4\nselection = "{selection}"\n'
    p = build_plan(scenario(eps=4.0, extra=tuning))
    sgd, cal = p.phases
    assert cal.target_epsilon == pytest.approx(0.05 * (sgd.target_epsilon + cal.target_epsilon))
    assert p.guarantee.epsilon <= 4.0 and verify_plan(p).ok
    if selection == "repeat-and-select":  # the release is composed into the run that is repeated
        bare = build_plan(scenario(eps=4.0, calibration=None, extra=tuning))
        assert sgd.mechanism.noise_multiplier > bare.dpsgd.mechanism.noise_multiplier


def test_repeat_and_select_refuses_hybrid_with_its_release():
    from budgetplan.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="naive"):
        build_plan(scenario(eps=8.0, algorithm="hybrid", adjacency="replace-one",
                            extra='[tuning]\nconfigurations = 4\nselection = "repeat-and-select"\n'))
