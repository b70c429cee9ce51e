"""Scenario -> plan: splits, calibrated phases, totals, tuning, user-level alternatives."""

import math

import pytest

from budgetplan.accounting import gaussian as gauss
from budgetplan.accounting import rr as rr_math
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InfeasibleError, UnsupportedError
from budgetplan.plan import Plan
from budgetplan.planning.planner import build_plan, check_within_budget
from budgetplan.scenario import examples, load_scenario, parse_scenario

HYBRID = """
[budget]
epsilon = {eps}
delta = 1e-9
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = 100000
[algorithm]
name = "hybrid"
split = "{split}"
[rr]
epochs = 3
batch_size = 256
[dpsgd]
batch_size = 500
epochs = 2
clipping_norm = 2.0
[calibration]  # off: these tests plan the training phases alone
share = 0
"""

DPSGD = """
[budget]
epsilon = 2.0
delta = 1e-7
[privacy]
adjacency = "add-remove"
unit = "{unit}"
{cap}
[data]
dataset_size = 100000
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = 1000
epochs = 3
clipping_norm = 1.0
{extra}
{tuning}
[calibration]  # off: these tests plan the training phases alone
share = 0
"""


def hybrid(eps=8.0, split="paper-v1"):
    return build_plan(parse_scenario(HYBRID.format(eps=eps, split=split)))


def dpsgd(unit="impression", cap="", extra="", tuning=""):
    return build_plan(parse_scenario(DPSGD.format(unit=unit, cap=cap, extra=extra, tuning=tuning)))


@pytest.mark.parametrize("name", examples.names())
def test_examples_plan_verify_and_round_trip(name):
    p = build_plan(load_scenario(examples.path(name)))
    assert check_within_budget(p) == []
    text = p.to_json()
    again = Plan.from_json(text)
    assert again == p and again.to_json() == text
    assert verify_plan(again).ok, verify_plan(again).problems


def test_paper_v1_split_and_trainer_parameters():
    p = hybrid(8.0)
    rr, sgd = p.phases
    assert (rr.name, sgd.name) == ("rr", "dpsgd")
    # the default composition ("auto") plans the phases to the run epsilon E' > 8 whose PLD total is 8
    assert p.scenario.composition == "pld" and 8.0 < p.run_epsilon < 8.5
    assert rr.target_epsilon == 3.0 and sgd.target_epsilon == pytest.approx(p.run_epsilon - 3.0, rel=1e-12)
    assert rr.params.flip_probability == pytest.approx(1 / (1 + math.exp(3)))
    par = sgd.params
    assert par.sampling_rate == 500 / 100000 and par.steps == 400 and par.dataset_size == 100000
    assert par.noise_std == pytest.approx(par.noise_multiplier * 2.0)
    assert par.sensitivity == 4.0  # replace-one: 2C
    assert sgd.guarantee.epsilon <= sgd.target_epsilon and sgd.guarantee.delta == 1e-9
    assert p.total.epsilon <= p.run_epsilon and p.guarantee == p.total_pld and 7.99 < p.guarantee.epsilon <= 8.0
    pinned = HYBRID.format(eps=8.0, split="paper-v1") + '[accounting]\ncomposition = "basic"\n'
    basic = build_plan(parse_scenario(pinned))
    assert [x.target_epsilon for x in basic.phases] == [3.0, 5.0] and basic.guarantee == basic.total
    assert basic.total.epsilon <= 8.0 and basic.total_pld.epsilon < basic.total.epsilon
    assert basic.dpsgd.params.noise_multiplier > sgd.params.noise_multiplier
    assert sgd.params.warm_start.startswith("rr") and sgd.params.nonsensitive_tower == "frozen"


def test_alpha_ends_are_the_two_baselines():
    only_sgd = hybrid(4.0, "alpha=0")
    only_rr = hybrid(4.0, "alpha=1")
    assert [ph.name for ph in only_sgd.phases] == ["dpsgd"]
    assert [ph.name for ph in only_rr.phases] == ["rr"] and only_rr.total.delta == 0.0
    explicit = hybrid(4.0, "eps1=1.5")
    assert explicit.phases[0].target_epsilon == 1.5 and explicit.run_epsilon > 4.0
    assert explicit.phases[1].target_epsilon == pytest.approx(explicit.run_epsilon - 1.5, rel=1e-12)
    assert only_sgd.run_epsilon == only_rr.run_epsilon == 4.0  # one phase: nothing to compose
    assert only_sgd.scenario.composition == only_rr.scenario.composition == "basic"


def test_explicit_eps1_above_total_is_refused():
    from budgetplan.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="split eps1 must be below the total epsilon 4"):
        hybrid(4.0, "eps1=5")


def test_fixed_noise_too_small_names_both_knobs():
    with pytest.raises(InfeasibleError) as err:
        dpsgd(extra="noise_multiplier = 0.8")
    msg = str(err.value)
    assert "use noise_multiplier >=" in msg and "epochs" in msg
    assert err.value.knob == "noise_multiplier" and err.value.suggestion > 0.8
    ok = dpsgd(extra=f"noise_multiplier = {err.value.suggestion * 1.001}")
    assert ok.phases[0].guarantee.epsilon <= 2.0


def test_noise_cap_names_the_most_epochs():
    with pytest.raises(InfeasibleError) as err:
        dpsgd(extra="max_noise_multiplier = 0.85")
    assert err.value.knob == "epochs" and "at most" in str(err.value) and "max_noise_multiplier" in str(err.value)


def test_a_budget_below_any_noise_names_the_epsilon():
    """No noise multiplier up to the search's end meets epsilon 1e-4 over 300 steps: the refusal says which
    budget, the phase's share of it and what to change, not only that the search ended."""
    with pytest.raises(InfeasibleError) as err:
        build_plan(parse_scenario(DPSGD.format(unit="impression", cap="", extra="", tuning="")
                                  .replace("epsilon = 2.0", "epsilon = 1e-4")))
    assert err.value.knob == "epsilon"
    assert "[budget].epsilon (it is 0.0001)" in str(err.value) and "300 steps" in str(err.value)


def test_user_level_dpsgd_alternatives(monkeypatch):
    """The mixture row is the phase's own calibration (the same question), not a second search."""
    from budgetplan.planning import calibrate

    tight = []
    real = calibrate.dpsgd_noise_multiplier

    def counted(**kw):
        if kw.get("unit_accounting") == "tight" and kw["unit"].cap > 1:
            tight.append(kw)
        return real(**kw)

    monkeypatch.setattr(calibrate, "dpsgd_noise_multiplier", counted)
    p = dpsgd(unit="user x time", cap="cap = 4")
    ph = p.phases[0]
    assert ph.guarantee.method == "mixture-of-gaussians(pld)"
    costs = {a.bounding: a.noise_multiplier for a in p.unit_alternatives}
    assert costs["mixture of Gaussians"] == ph.params.noise_multiplier and len(tight) == 1
    assert costs["mixture of Gaussians"] <= costs["group privacy (pld)"] < costs["group privacy (rdp)"]


def test_user_level_rr_alternatives_and_eps_over_k_i():
    text = HYBRID.format(eps=4.0, split="alpha=1").replace('unit = "impression"', 'unit = "user"\ncap = 5')
    text = text.replace("batch_size = 256", 'batch_size = 256\nper_impression = "eps/K_i"')
    p = build_plan(parse_scenario(text))
    rr = p.phases[0]
    assert rr.params.per_impression_rule == "eps/K_i"
    shares = rr.params.per_impression_epsilon_by_count
    assert shares[0] == 4.0 and shares[-1] == pytest.approx(0.8)
    assert rr.params.flip_probability_by_count[1] == pytest.approx(rr_math.flip_probability(2.0))
    assert rr.guarantee.epsilon <= 4.0
    rows = {a.bounding for a in p.unit_alternatives}
    assert rows == {"eps/K", "eps/K_i", "tight composition", "group privacy"}
    assert verify_plan(p).ok


def test_rr_tight_per_impression_with_delta():
    text = """
[budget]
epsilon = 1.0
delta = 1e-7
[privacy]
adjacency = "replace-one"
unit = "user"
cap = 50
[data]
dataset_size = 1000000
[algorithm]
name = "rr"
[rr]
per_impression = "tight"
"""
    p = build_plan(parse_scenario(text))
    per = p.phases[0].params.per_impression_epsilon
    assert round(per, 3) == 0.031 and p.phases[0].guarantee.epsilon <= 1.0


def test_walr_uses_the_analytic_gaussian():
    p = build_plan(load_scenario(examples.path("walr")))
    par = p.phases[0].params
    assert par.sensitivity == pytest.approx(math.sqrt(20))
    assert par.noise_std == pytest.approx(gauss.analytic_sigma(epsilon=1.0, delta=1e-8, sensitivity=math.sqrt(20)))
    assert par.classical_valid is False  # eps = 1 is outside the classical formula


def test_naive_tuning_splits_the_budget():
    p = dpsgd(tuning="[tuning]\nconfigurations = 4")
    assert p.run_epsilon == 0.5 and p.run_delta == pytest.approx(2.5e-8)
    assert p.guarantee.method == "naive-composition" and p.guarantee.epsilon <= 2.0
    assert p.tuning.pld_guarantee.epsilon < p.guarantee.epsilon


def test_repeat_and_select_beats_naive():
    rs = dpsgd(tuning='[tuning]\nconfigurations = 4\nselection = "repeat-and-select"')
    naive = dpsgd(tuning="[tuning]\nconfigurations = 4")
    assert rs.guarantee.method == "repeat-and-select(rdp)" and rs.guarantee.epsilon <= 2.0 * (1 + 1e-9)
    assert rs.phases[0].params.noise_multiplier < naive.phases[0].params.noise_multiplier
    with pytest.raises(UnsupportedError, match="single-phase"):
        build_plan(parse_scenario(HYBRID.format(eps=8.0, split="paper-v1") +
                                  '[tuning]\nconfigurations = 3\nselection = "repeat-and-select"\n'))


def test_truncated_poisson_plan():
    text = """
[budget]
epsilon = 3.0
delta = 1e-6
[privacy]
adjacency = "add-remove"
unit = "impression"
[data]
dataset_size = 20000
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = 200
steps = 40
clipping_norm = 1.0
sampling = "truncated-poisson"
max_batch_size = 260
"""
    p = build_plan(parse_scenario(text))
    ph = p.phases[0]
    assert type(ph.mechanism).__name__ == "TruncatedPoissonDPSGD" and ph.guarantee.epsilon <= 3.0
    assert ph.params.max_batch_size == 260
