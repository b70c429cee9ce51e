"""Hybrid's units split (``split = "units=<r>"``): the rule, the scenario's refusals, the plan, parallel composition,
verify and the statement."""

import dataclasses
import hashlib
import json
import math

import pytest

from budgetplan.accounting import account
from budgetplan.accounting.tradeoff import mechanism_tradeoff, tpr_from_pair
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import Composition
from budgetplan.plan import Plan, canonical_json
from budgetplan.plan.phases import UNITS_SPLIT_KEY, UnitPart
from budgetplan.planning.composition import basic_total, part_spent, plan_tradeoff, pld_total, unit_parts
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.scenario.split_rules import SplitRule, choose_split, parse_rule, part_rows, units_share

N = 200_000
SCENARIO = """
[budget]
epsilon = {eps}
delta = {delta}

[privacy]
adjacency = "{adjacency}"
unit = "impression"

[data]
dataset_size = {n}

[algorithm]
name = "{algorithm}"
{split}

{rr}
[dpsgd]
batch_size = {batch}
epochs = 5
clipping_norm = 5.0
sampling = "{sampling}"

[calibration]
share = 0.05
{extra}
"""


def text(split='split = "units=0.75"', *, eps=3.0, adjacency="replace-one", n=N, batch='"N/50"',
         sampling="poisson", algorithm="hybrid", extra="", delta='"0.1/N"'):
    return SCENARIO.format(eps=eps, adjacency=adjacency, n=n, split=split, batch=batch, sampling=sampling,
                           algorithm=algorithm, extra=extra, delta=delta,
                           rr="[rr]\nbatch_size = 1024\n" if algorithm == "hybrid" else "")


def forged(body: dict) -> Plan:
    """The plan ``body`` (no sha256) re-hashed and written as the planner writes plans: it passes integrity."""
    body = {**body, "sha256": hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()}
    return Plan.from_json(json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n")


BASIC = '[accounting]\ncomposition = "basic"'  # the phases' epsilons add up to the budget: shares checked exactly


def plan_of(**kw) -> Plan:
    return build_plan(parse_scenario(text(**kw)))


# ------------------------------------------------------------------ the rule


def test_the_rule_reads_a_share_strictly_between_0_and_1():
    assert parse_rule("units=0.75") == SplitRule("units", 0.75)
    assert units_share("units=0.25") == 0.25 and units_share("alpha=0.25") is None
    for bad in ("units=0", "units=1", "units=1.5", "units=-0.5", "units= 0.5", "units=nan"):
        with pytest.raises(InvalidParameterError, match="split rule"):
            parse_rule(bad)


def test_a_units_rule_has_no_eps1():
    with pytest.raises(InvalidParameterError, match="splits the units, not the budget"):
        choose_split(3.0, "units=0.75")


@pytest.mark.parametrize("n, share", [(10, 0.5), (200_000, 0.75), (7, 0.3), (1_000_003, 0.9)])
def test_the_parts_rows_add_up_to_n(n, share):
    rr, sgd = part_rows(n, share)
    assert rr + sgd == n and rr == round(share * n) and rr > 0 and sgd > 0


def test_a_part_without_rows_is_refused():
    with pytest.raises(InvalidParameterError, match="leaves a part with no rows"):
        part_rows(3, 0.1)


# ------------------------------------------------------------------ the scenario


@pytest.mark.parametrize("kw, match", [
    ({"adjacency": "add-remove"}, "needs \\[privacy\\].adjacency = \"replace-one\""),
    ({"sampling": "shuffle"}, "needs \\[dpsgd\\].sampling = \"poisson\""),
    ({"extra": "[tuning]\nconfigurations = 2\nselection = \"naive\""}, "with \\[tuning\\] is not supported"),
])
def test_what_the_parallel_composition_does_not_cover_is_refused(kw, match):
    with pytest.raises(InvalidParameterError, match=match):
        parse_scenario(text(**kw))


def test_a_units_rule_is_not_a_grid_value():
    grid = text(split="", extra='[tuning]\nconfigurations = 2\nsplit = ["alpha=0.5", "units=0.5"]')
    with pytest.raises(InvalidParameterError, match="not tuned by a grid"):
        parse_scenario(grid)


def test_n_over_c_is_the_dpsgd_part_rows_over_c():
    # q stays about 1/c: the DP-SGD phase's N is its part's expected rows
    s = parse_scenario(text())
    assert s.dpsgd.batch_size == round(part_rows(N, 0.75)[1] / 50) == 1000
    assert parse_scenario(text(split='split = "alpha=0.75"')).dpsgd.batch_size == N // 50


# ------------------------------------------------------------------ the plan


def test_each_phase_gets_the_whole_training_budget_and_the_run_stays_within_it():
    plan = plan_of(extra=BASIC)
    rr, sgd, cal = plan.phases
    train = 3.0 * (1 - 0.05)
    assert rr.target_epsilon == pytest.approx(train) and sgd.target_epsilon == pytest.approx(train)
    assert rr.params.unit_part == UnitPart(low=0.0, high=0.75, rows=150_000, key=UNITS_SPLIT_KEY)
    assert sgd.params.unit_part == UnitPart(low=0.75, high=1.0, rows=50_000, key=UNITS_SPLIT_KEY)
    assert cal.params.target == "positives"  # the RR labels cover one part: not a count of every positive
    assert plan.total.method == "parallel-composition"
    assert plan.total.epsilon == pytest.approx(3.0) and plan.total.epsilon <= 3.0 * (1 + 1e-9)
    assert plan.total.delta == pytest.approx(plan.delta)
    # the sequential sum of the same phases would be far over the budget
    assert math.fsum(p.guarantee.epsilon for p in plan.phases) > 5.8
    assert verify_plan(plan).ok, verify_plan(plan).problems


def test_the_dpsgd_phase_is_the_plain_dpsgd_plan_of_its_part():
    # independent route: a DP-SGD-only scenario over the part's rows alone, same batch and budget
    plan = plan_of(extra=BASIC)
    alone = plan_of(split="", algorithm="dpsgd", n=50_000, delta=0.1 / N, extra=BASIC)
    a, b = plan.dpsgd.params, alone.dpsgd.params
    assert (a.sampling_rate, a.steps, a.batch_size) == (b.sampling_rate, b.steps, b.batch_size) == (0.02, 250, 1000)
    assert a.noise_multiplier == pytest.approx(b.noise_multiplier, rel=1e-12)


def test_the_rr_phase_is_the_plain_rr_plan_at_the_training_budget():
    plan = plan_of(extra=BASIC)
    budget_split = plan_of(split='split = "alpha=1"', eps=3.0)  # RR alone at eps 3 calibrates for free
    assert plan.rr.params.flip_probability == pytest.approx(1 / (1 + math.exp(2.85)), rel=1e-12)
    assert budget_split.rr.params.flip_probability == pytest.approx(1 / (1 + math.exp(3.0)), rel=1e-12)


def test_by_default_each_part_is_planned_to_the_run_epsilon_whose_worse_part_composes_to_the_budget():
    plan, basic = plan_of(), plan_of(extra=BASIC)
    assert plan.scenario.composition == "pld" and 3.0 < plan.run_epsilon < 3.2
    assert plan.guarantee == plan.total_pld and 0.999 * 3.0 <= plan.guarantee.epsilon <= 3.0
    assert plan.rr.target_epsilon == pytest.approx(0.95 * plan.run_epsilon)
    assert plan.rr.params.flip_probability < basic.rr.params.flip_probability
    assert plan.dpsgd.params.noise_multiplier < basic.dpsgd.params.noise_multiplier
    assert verify_plan(plan).ok, verify_plan(plan).problems


def test_the_pld_total_is_the_worse_part_composed():
    plan = plan_of()
    rr, sgd, cal = plan.phases
    parts = []
    for mechs in ((rr.mechanism, cal.mechanism), (sgd.mechanism, cal.mechanism)):
        g = account(Composition(phases=mechs), delta=plan.total.delta, adjacency=plan.adjacency, unit=plan.unit,
                    method="pld", discretization=plan.scenario.discretization)
        parts.append(g.epsilon)
    assert plan.total_pld is not None
    assert plan.total_pld.epsilon == pytest.approx(max(parts), rel=1e-12)
    assert plan.total_pld.epsilon <= plan.total.epsilon


def test_overlapping_or_unkeyed_parts_compose_in_sequence():
    plan = plan_of(extra=BASIC)
    rr, sgd, cal = plan.phases
    s, unit = plan.scenario, plan.unit
    assert len(unit_parts(plan.phases)) == 2 and part_spent(plan.phases) == pytest.approx(3.0)
    for other in (UnitPart(low=0.5, high=1.0, rows=100_000, key=UNITS_SPLIT_KEY),   # shares [0.5, 0.75)
                  UnitPart(low=0.75, high=1.0, rows=50_000, key="another key")):     # positions not comparable
        moved = dataclasses.replace(sgd, params=dataclasses.replace(sgd.params, unit_part=other))
        phases = (rr, moved, cal)
        assert unit_parts(phases) == [list(phases)]
        assert basic_total(phases, s, unit).epsilon == pytest.approx(math.fsum(p.guarantee.epsilon for p in phases))
        assert pld_total(phases, s, unit, plan.delta)[0].epsilon > 4.0


def test_verify_refuses_a_part_the_scenario_does_not_give():
    plan = plan_of()
    body = json.loads(plan.to_json())
    body.pop("sha256")
    body["phases"][1]["parameters"]["unit_part"]["low"] = 0.5  # DP-SGD now shares units with RR
    body["phases"][1]["parameters"]["unit_part"]["rows"] = 100_000
    report = verify_plan(forged(body))
    assert not report.ok
    assert any("unit_part" in p for p in report.problems), report.problems


def test_verify_refuses_parts_on_a_budget_split():
    plan = plan_of(split='split = "alpha=0.5"')
    body = json.loads(plan.to_json())
    body.pop("sha256")
    body["phases"][0]["parameters"]["unit_part"] = {"low": 0.0, "high": 0.5, "rows": 100_000, "key": UNITS_SPLIT_KEY}
    report = verify_plan(forged(body))
    assert any("phases[0] (rr).parameters.unit_part" in p for p in report.problems), report.problems


def test_the_plan_file_round_trips_and_old_plans_keep_their_bytes():
    plan = plan_of()
    assert Plan.from_json(plan.to_json()).sha256 == plan.sha256
    assert '"unit_part"' not in plan_of(split='split = "alpha=0.5"').to_json()


def test_the_statement_says_the_units_are_split_and_the_phases_compose_in_parallel():
    text = " ".join(render_statement(plan_of()).split())
    assert "The units are split, not the budget" in text
    assert "compose in parallel" in text
    assert "[0, 0.75)" in text and "[0.75, 1)" in text
    assert "one after another" not in text


def test_the_attacker_s_bound_is_the_worse_part_s_curve_at_each_rate():
    plan = plan_of()
    rr, sgd, cal = plan.phases
    out = plan_tradeoff(plan)
    assert out["from"] == "pld"
    curves = [mechanism_tradeoff(Composition(phases=(m, cal.mechanism)), adjacency=plan.adjacency, unit=plan.unit,
                                 discretization=plan.scenario.discretization, alphas=out["alphas"])
              for m in (rr.mechanism, sgd.mechanism)]
    assert out["tpr"] == [max(a, b) for a, b in zip(*curves)]
    # tighter than the one (eps, delta) pair, never looser
    pair = tpr_from_pair(plan.guarantee.epsilon, plan.guarantee.delta, out["alphas"])
    assert all(t <= p * (1 + 1e-12) for t, p in zip(out["tpr"], pair)) and out["tpr"][0] < pair[0]
    text = " ".join(render_statement(plan).split())
    assert "each part's phases composed" in text
