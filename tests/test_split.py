"""Hybrid's split rules: the alpha-by-eps table, strict parsing, and what a plan records of the choice."""

import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from budgetplan.audit.verify import verify_plan
from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.scenario.split_rules import (
    ALPHA_BY_EPSILON,
    AlphaStep,
    _check_table,
    alpha_by_epsilon,
    choose_split,
    parse_rule,
    split_budget,
)
from tests.test_planner import HYBRID


def test_table_gives_the_measured_best_alpha_at_each_measured_epsilon():
    # The 1M-row frontier (balanced and mixed, 3 seeds): plain DP-SGD up to eps 3, alpha 0.5 at 8;
    # the earlier 200,000-row measurements had 0.5 tied with 0.75 at 12.
    assert alpha_by_epsilon(1.0).alpha == alpha_by_epsilon(3.0).alpha == 0.0
    assert alpha_by_epsilon(8.0).alpha == alpha_by_epsilon(12.0).alpha == 0.5


def test_table_has_the_least_worst_regret_on_the_committed_frontier():
    """At each epsilon of benchmarks/results/utility_frontier.json, the alpha the table gives (at the
    epsilon the split divides: the total less the calibration share) loses least, in the worst case
    over the shapes, against the best alpha of the grid on each shape."""
    import json
    from collections import defaultdict
    from pathlib import Path

    state = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" /
                        "utility_frontier.json").read_text())
    share = state["settings"]["values"]["scenario"]["calibration"]["share"]
    losses = defaultdict(list)
    for c in state["cells"].values():
        if c["arm"] in ("RR", "DP-SGD") or c["arm"].startswith("alpha="):
            # a plan's alpha is eps1 over the epsilon split, which a PLD budget's larger epsilon rounds
            losses[(c["epsilon"], c["shape"], round(c["alpha"], 9))].append(c["relative_auc_loss"])
    mean = {k: sum(v) / len(v) for k, v in losses.items()}
    shapes = {s for _, s, _ in mean}
    assert len(shapes) >= 2
    for eps in state["settings"]["values"]["epsilons"]:
        alphas = sorted({a for e, _, a in mean if e == eps})
        best = {s: min(mean[(eps, s, a)] for a in alphas) for s in shapes}
        worst = {a: max(mean[(eps, s, a)] - best[s] for s in shapes) for a in alphas}
        chosen = alpha_by_epsilon(eps * (1 - share)).alpha
        assert worst[chosen] == min(worst.values()), (eps, chosen, worst)


def test_table_is_a_step_function_with_its_steps_where_stated():
    for below, step in zip(ALPHA_BY_EPSILON, ALPHA_BY_EPSILON[1:]):
        edge = step.from_epsilon
        assert alpha_by_epsilon(math.nextafter(edge, 0.0)).alpha == below.alpha
        assert alpha_by_epsilon(edge).alpha == step.alpha
    assert alpha_by_epsilon(1e6).alpha == ALPHA_BY_EPSILON[-1].alpha


@pytest.mark.parametrize("table, fragment", [
    ((), "start at from_epsilon = 0"),
    ((AlphaStep(1.0, 0.0, "x"),), "start at from_epsilon = 0"),
    ((AlphaStep(0.0, 0.0, "x"), AlphaStep(0.0, 0.5, "y")), "step upward"),
    ((AlphaStep(0.0, 1.5, "x"),), "out of range"),
])
def test_a_malformed_table_is_refused(table, fragment):
    with pytest.raises(ValueError, match=fragment):
        _check_table(table)


@given(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False))
def test_choice_splits_the_whole_epsilon_at_the_tables_alpha(eps):
    c = choose_split(eps, "alpha-by-eps")
    assert c.epsilon1 + c.epsilon2 == eps and (c.epsilon1, c.epsilon2) == split_budget(eps, "alpha-by-eps")
    assert c.alpha == pytest.approx(alpha_by_epsilon(eps).alpha, abs=1e-15)
    assert c.rule == "alpha-by-eps" and "utility frontier" in c.reason


@pytest.mark.parametrize("rule", ["alpha-by-eps ", " alpha-by-eps", "Alpha-By-Eps", "alpha_by_eps", "alpha-by-eps=1",
                                  "alpha-by-epsilon", "", "alpha=", "alpha=0.5 ", 3])
def test_parsing_is_strict(rule):
    with pytest.raises(InvalidParameterError, match="must be"):
        parse_rule(rule)


def test_fixed_rules_are_unchanged():
    assert split_budget(8.0, "paper-v1") == (3.0, 5.0)
    assert split_budget(8.0, "alpha=0.25") == (2.0, 6.0)
    assert split_budget(8.0, "alpha=1") == (8.0, 0.0)
    assert str(parse_rule("alpha-by-eps")) == "alpha-by-eps" and str(parse_rule("alpha=.5")) == "alpha=0.5"


@pytest.mark.parametrize("eps, alpha, phases", [(1.0, 0.0, ["dpsgd"]), (8.0, 0.5, ["rr", "dpsgd"]),
                                                (12.0, 0.5, ["rr", "dpsgd"])])
def test_plan_records_the_alpha_and_the_statement_says_why(eps, alpha, phases):
    plan = build_plan(parse_scenario(HYBRID.format(eps=eps, split="alpha-by-eps")))
    assert plan.split.alpha == alpha and plan.split.rule == "alpha-by-eps"
    assert [p.name for p in plan.phases] == phases
    # the alpha is read at the budget's epsilon, and splits the run epsilon the phases are planned to
    # (above eps where they compose by PLD: the default composition)
    assert plan.run_epsilon >= eps and plan.guarantee.epsilon <= eps
    assert plan.dpsgd.target_epsilon == pytest.approx((1 - alpha) * plan.run_epsilon)
    text = " ".join(render_statement(plan).split())
    assert f"The split rule alpha-by-eps chose alpha = {alpha:g} at the run's epsilon {plan.run_epsilon:g}" in text
    assert "1M-row utility frontier" in text
    assert verify_plan(plan).ok, verify_plan(plan).problems
    again = type(plan).from_json(plan.to_json())
    assert again == plan


def test_fixed_rule_plans_record_no_choice_and_keep_their_keys():
    plan = build_plan(parse_scenario(HYBRID.format(eps=8.0, split="alpha=0.5")))
    assert plan.split is None and "split" not in json.loads(plan.to_json())


def test_verify_catches_a_forged_choice():
    plan = build_plan(parse_scenario(HYBRID.format(eps=8.0, split="alpha-by-eps")))
    forged = dataclasses.replace(plan, split=dataclasses.replace(plan.split, alpha=0.75, epsilon1=6.0, epsilon2=2.0))
    problems = verify_plan(forged, replan=False).problems
    assert any(p.startswith("split: stored") for p in problems), problems
    dropped = dataclasses.replace(plan, split=None)
    assert any(p.startswith("split: stored None") for p in verify_plan(dropped, replan=False).problems)


def test_cli_split_accepts_the_rule(runner):
    base = ["split", "--delta", "1e-7", "--dataset-size", "100000", "--batch-size", "1000", "--epochs", "1"]
    out = runner.invoke(cli, [*base, "--epsilon", "8", "--rule", "alpha-by-eps", "--json"])
    assert out.exit_code == 0, out.output
    cell = json.loads(out.stdout)
    assert cell["rule"] == "alpha-by-eps" and cell["alpha"] == 0.5 and cell["epsilon1"] == 4.0
    human = runner.invoke(cli, [*base, "--epsilon", "1", "--rule", "alpha-by-eps"])
    assert human.exit_code == 0 and "alpha = 0 for eps >= 0" in " ".join(human.stdout.split())
    bad = runner.invoke(cli, [*base, "--epsilon", "8", "--rule", "alpha-by-eps=2"])
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "alpha-by-eps" in bad.stderr


def test_with_a_calibration_release_the_rule_splits_what_the_training_phases_get():
    text = HYBRID.format(eps=8.0, split="alpha-by-eps").replace("share = 0\n", "share = 0.05\n")
    plan = build_plan(parse_scenario(text))
    assert plan.split.epsilon == pytest.approx(0.95 * plan.run_epsilon) and plan.split.alpha == pytest.approx(0.5)
    rr, dpsgd, calibration = plan.phases
    assert rr.target_epsilon == plan.split.epsilon1 and dpsgd.target_epsilon == plan.split.epsilon2
    assert rr.target_epsilon + dpsgd.target_epsilon + calibration.target_epsilon <= plan.run_epsilon
    assert plan.run_epsilon > 8.0 and plan.guarantee.epsilon <= 8.0
    assert verify_plan(plan).ok, verify_plan(plan).problems
