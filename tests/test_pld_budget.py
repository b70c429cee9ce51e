"""A budget met by the phases' PLD composition (``[accounting].composition = "pld"``).

The planner plans the phases to the largest basic epsilon whose PLD total is within the
budget: the headline guarantee is that total, checked here against dp_accounting's own PLDs
of the same mechanisms composed, and each phase draws less noise than under a basic sum.
"""

import json
import math
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from budgetplan.accounting import backends
from budgetplan.audit import reaccount
from budgetplan.audit.verify import verify_plan
from budgetplan.cli import cli as cli_main
from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.plan import load_plan
from budgetplan.planning.composition import unit_parts
from budgetplan.planning.planner import build_plan, check_within_budget, resolve_composition
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.scenario.split_rules import alpha_by_epsilon

N = 200_000


def text(*, eps=3.0, split='"alpha=0.5"', algorithm="hybrid", composition="pld", sampling="poisson", extra="",
         calibration="[calibration]\nshare = 0.05\n"):
    algo = f'name = "{algorithm}"' + (f"\nsplit = {split}\n[rr]\nbatch_size = 1024" if algorithm == "hybrid" else "")
    sgd = "" if algorithm == "rr" else (f'[dpsgd]\nbatch_size = "N/50"\nepochs = 5\nclipping_norm = 5.0\n'
                                        f'sampling = "{sampling}"' + ("\nmax_batch_size = 5000\n"
                                                                      if sampling == "truncated-poisson" else "\n"))
    return f"""name = "pld-budget"
[budget]
epsilon = {eps!r}
delta = "0.1/N"
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = {N}
[algorithm]
{algo}
{sgd}
{calibration if algorithm != "rr" else ""}
{extra}
""" + (f'[accounting]\ncomposition = "{composition}"\n' if composition is not None else "")


def plan_of(**kw):
    return build_plan(parse_scenario(text(**kw)))


def reference_total(plan):
    """dp_accounting's own PLDs of the plan's phases composed (K = 1, Poisson): eps at the plan's delta."""
    worst = 0.0
    for part in unit_parts(plan.phases):
        composed = None
        for p in part:
            m = p.mechanism
            if p.name == "rr":
                ref = backends.reference_pld_rr(epsilon=m.epsilon, discretization=1e-4)
            elif isinstance(m, PoissonDPSGD):
                ref = backends.reference_pld_dpsgd(noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate,
                                                   steps=m.steps, adjacency=plan.adjacency, discretization=1e-4)
            else:
                ref = backends.reference_pld_gaussian(noise_std=m.noise_std, sensitivity=m.sensitivity,
                                                      discretization=1e-4)
            composed = ref if composed is None else composed.compose(ref)
        worst = max(worst, float(composed.get_epsilon_for_delta(plan.total_pld.delta)))
    return worst


@pytest.mark.parametrize("split", ['"alpha=0"', '"alpha=0.5"', '"alpha=0.75"', '"paper-v1"', '"units=0.75"'])
def test_the_pld_total_is_the_budget_and_each_phase_gets_more(split):
    basic, pld = plan_of(split=split, composition="basic"), plan_of(split=split)
    assert basic.guarantee is basic.total and pld.guarantee is pld.total_pld
    # the headline is the PLD total, at the budget to the solver's 1e-4 in the run epsilon, never above
    assert pld.guarantee.epsilon <= pld.epsilon and pld.guarantee.epsilon > pld.epsilon * (1 - 1e-3)
    assert pld.guarantee.delta <= pld.delta * (1 + 1e-12)
    assert pld.run_epsilon > pld.epsilon == basic.run_epsilon
    assert check_within_budget(pld) == [] and verify_plan(pld).ok, verify_plan(pld).problems
    # every phase planned to a larger target, the DP-SGD phase to less noise
    for b, p in zip(basic.phases, pld.phases, strict=True):
        assert p.name == b.name and p.target_epsilon > b.target_epsilon
    assert pld.dpsgd.params.noise_multiplier < basic.dpsgd.params.noise_multiplier
    # an independent back-end composes the same mechanisms to the same total, within the budget
    ref = reference_total(pld)
    assert ref <= pld.epsilon * (1 + 1e-3) and math.isclose(ref, pld.total_pld.epsilon, rel_tol=1e-3)


def test_the_run_epsilon_is_the_largest_that_meets_the_budget():
    """A plan at a basic epsilon 0.1% above the chosen one composes above the budget."""
    from budgetplan.planning.composition import basic_total, pld_total
    from budgetplan.planning.planner import _plan_phases, unit_of

    plan = plan_of(split='"alpha=0.5"')
    s, unit = plan.scenario, unit_of(plan.scenario)
    above = _plan_phases(s, unit, plan.run_epsilon * 1.001, plan.delta, plan.delta)
    g, _ = pld_total(above, s, unit, basic_total(above, s, unit).delta)
    assert g.epsilon > plan.epsilon


def test_the_plan_round_trips_and_a_basic_plan_keeps_its_bytes(tmp_path):
    plan = plan_of()
    (tmp_path / "plan.json").write_text(plan.to_json())
    again = load_plan(tmp_path / "plan.json")
    assert again.sha256 == plan.sha256 and again.guarantee == plan.guarantee
    assert plan.scenario.to_dict()["composition"] == "pld"
    assert "composition" not in plan_of(composition="basic").scenario.to_dict()


def test_a_table_driven_split_reads_its_alpha_at_the_budget():
    """At eps 5.2 the training epsilon (4.94) is below the table's step at 5, the larger one planned to
    is above it: the alpha is the budget's."""
    eps = 5.2
    plan = plan_of(eps=eps, split='"alpha-by-eps"')
    want = alpha_by_epsilon(eps * 0.95).alpha
    assert alpha_by_epsilon(plan.run_epsilon * 0.95).alpha != want  # the case the rule guards
    assert plan.split.alpha == want and plan.split.epsilon == pytest.approx(plan.run_epsilon * 0.95)
    assert "read at the budget's training epsilon" in plan.split.reason
    assert verify_plan(plan).ok, verify_plan(plan).problems


def test_one_phase_has_nothing_to_compose():
    basic, pld = plan_of(algorithm="rr", composition="basic"), plan_of(algorithm="rr")
    assert pld.phases == basic.phases and pld.run_epsilon == pld.epsilon
    assert pld.guarantee.epsilon == basic.guarantee.epsilon


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"composition": "rdp"}, InvalidParameterError, "[accounting].composition"),
    ({"extra": "[tuning]\nconfigurations = 4\nselection = \"naive\""}, InvalidParameterError, "[tuning]"),
    ({"sampling": "truncated-poisson"}, UnsupportedError, "truncated-Poisson"),
])
def test_what_has_no_pld_composition_is_refused(kw, error, words):
    with pytest.raises(error, match=None) as info:
        plan_of(**kw)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_pld_budget_whose_total_is_over_is_caught():
    from dataclasses import replace

    plan = plan_of()
    forged = replace(plan, total_pld=replace(plan.total_pld, epsilon=plan.epsilon * 1.01))
    assert any("exceeds the budget" in p for p in check_within_budget(forged))
    assert not verify_plan(forged).ok


def test_the_audit_composes_the_phases_with_another_back_end():
    """The re-accounting composes dp_accounting's PLDs: it passes a true plan and fails one whose DP-SGD
    noise was lowered after planning (its stated totals unchanged)."""
    from dataclasses import replace

    plan = plan_of()
    record = SimpleNamespace(phases=())
    note, problems = reaccount._pld_total(record, plan)
    assert problems == [] and "dp_accounting PLD" in note
    sgd = plan.dpsgd
    weaker = replace(sgd, mechanism=replace(sgd.mechanism, noise_multiplier=sgd.mechanism.noise_multiplier * 0.9))
    forged = replace(plan, phases=tuple(weaker if p is sgd else p for p in plan.phases))
    _, problems = reaccount._pld_total(record, forged)
    assert problems and "> the budget" in problems[0]


def test_the_statement_and_the_cli_say_which_total_is_the_budget(tmp_path):
    plan = plan_of()
    words = " ".join(render_statement(plan).split())
    assert 'the one planned to ([accounting].composition = "pld", which the default "auto" chooses' in words
    assert f"larger basic budget of epsilon {plan.run_epsilon:.6g}" in words
    (tmp_path / "s.toml").write_text(text())
    got = CliRunner().invoke(cli_main, ["plan", str(tmp_path / "s.toml"), "-o", str(tmp_path / "p.json"), "--json"])
    assert got.exit_code == 0, got.output
    out = json.loads(got.output)
    assert out["budget"]["composition"] == "pld" and out["epsilon"] <= 3.0 < out["run_budget"]["epsilon"]


def test_units_of_k_examples_compose_by_their_own_pld_and_the_audit_recomputes_it_finer():
    """At K = 2 (mixture-of-Gaussians DP-SGD, the release at K x its sensitivity) the total is still
    the budget, and the audit's composition, with no dp_accounting event for a unit of K, is this
    library's PLD at half the grid."""
    plan = build_plan(parse_scenario("""
[budget]
epsilon = 2.0
delta = 1e-7
[privacy]
adjacency = "add-remove"
unit = "user"
cap = 2
[data]
dataset_size = 100000
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = "N/50"
epochs = 2
clipping_norm = 1.0
[accounting]
composition = "pld"
"""))
    assert plan.guarantee is plan.total_pld and plan.epsilon * (1 - 1e-3) < plan.guarantee.epsilon <= plan.epsilon
    assert plan.run_epsilon > plan.epsilon and verify_plan(plan).ok
    note, problems = reaccount._pld_total(SimpleNamespace(phases=()), plan)
    assert problems == [] and "half the grid" in note


def test_the_audit_composes_the_steps_the_run_executed(monkeypatch):
    """A run stopped early (half its planned DP-SGD steps) composes below the planned total."""
    plan = plan_of()
    half = SimpleNamespace(steps_executed=plan.dpsgd.mechanism.steps // 2)
    monkeypatch.setattr(reaccount, "record_entry", lambda record, kind: half)
    note, problems = reaccount._pld_total(SimpleNamespace(phases=()), plan)
    composed = float(note.split("composed ")[1].split(" ")[0])
    assert problems == [] and composed < 0.95 * plan.total_pld.epsilon
    assert reaccount._executed(plan.dpsgd.mechanism, half).steps == half.steps_executed


# ------------------------------------------------------------- the default: "auto"


@pytest.mark.parametrize(("kw", "resolved"), [
    ({}, "pld"),
    ({"split": '"paper-v1"'}, "pld"),
    ({"split": '"units=0.75"'}, "pld"),
    ({"algorithm": "dpsgd"}, "pld"),  # DP-SGD and its calibration release
    ({"algorithm": "rr"}, "basic"),  # one phase: nothing to compose
    ({"algorithm": "dpsgd", "calibration": "[calibration]\nshare = 0\n"}, "basic"),  # one phase
    pytest.param({"sampling": "truncated-poisson"}, "basic", id="truncated-poisson"),  # basic composition only
    ({"extra": "[tuning]\nconfigurations = 4\nselection = \"naive\""}, "basic"),  # tuning composes whole runs
])
def test_a_scenario_without_the_key_is_planned_to_the_pld_total_where_its_phases_have_one(kw, resolved):
    """Absent, [accounting].composition is "auto": the plan is the explicit "pld" plan where the phases
    compose by PLD, else the "basic" one, never a refusal; the plan's scenario says which."""
    s = parse_scenario(text(composition=None, **kw))
    assert s.composition == "auto"
    plan = build_plan(s)
    assert plan.scenario.composition == resolved == resolve_composition(s).composition
    explicit = plan_of(composition=resolved, **kw)
    assert plan.phases == explicit.phases and plan.run_epsilon == explicit.run_epsilon
    assert plan.guarantee == explicit.guarantee and plan.guarantee.epsilon <= plan.epsilon
    assert plan.pld_budget == (resolved == "pld") and (plan.run_epsilon > plan.epsilon) == (resolved == "pld")
    assert verify_plan(plan).ok, verify_plan(plan).problems


@pytest.mark.parametrize("algorithm, privacy, data", [
    ("hybrid", 'unit = "user"\ncap = 4\ncapping = "random"\nunit_accounting = "group"', f"dataset_size = {N}"),
    ("dpsgd", 'unit = "impression"', f"dataset_size = {N}\nsize_release_epsilon = 0.1"),  # add-remove only
])
def test_group_privacy_and_a_dp_count_are_planned_by_basic_composition_by_default(algorithm, privacy, data):
    body = (text(composition=None, algorithm=algorithm).replace('unit = "impression"', privacy)
            .replace(f"dataset_size = {N}", data))
    if algorithm == "dpsgd":
        body = body.replace('adjacency = "replace-one"', 'adjacency = "add-remove"')
    plan = build_plan(parse_scenario(body))
    assert plan.scenario.composition == "basic" and plan.guarantee == plan.total and plan.run_epsilon <= 3.0
    with pytest.raises((InvalidParameterError, UnsupportedError), match="composition"):
        build_plan(parse_scenario(body + '[accounting]\ncomposition = "pld"\n'))


def test_a_plan_file_without_the_key_was_planned_by_basic_composition(tmp_path):
    plan = plan_of(composition="basic")
    body = json.loads(plan.to_json())
    assert "composition" not in body["scenario"]  # as every plan made before the PLD budget
    (tmp_path / "plan.json").write_text(plan.to_json())
    again = load_plan(tmp_path / "plan.json")
    assert again.scenario.composition == "basic" and again.guarantee == plan.total and verify_plan(again).ok


def test_a_signed_off_scenario_without_the_key_matches_the_plan_it_resolves_to():
    signed = parse_scenario(text(composition=None))
    assert verify_plan(build_plan(signed), replan=False, signed=signed).ok
    problems = verify_plan(plan_of(composition="basic"), replan=False, signed=signed).problems
    assert any(p.startswith("scenario.composition") for p in problems), problems
