"""A declared grid of configurations: its scenario keys, plan, accounting, statement and verification."""

import dataclasses
import json
import math

import pytest

from budgetplan.audit.verify import verify_plan
from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from budgetplan.plan import Plan
from budgetplan.plan.tuning import GridEntry, read_tuning
from budgetplan.planning import grid
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.util.typed import from_json_object, to_json
from tests.test_planner import DPSGD, HYBRID

DPSGD_GRID = DPSGD.format(unit="impression", cap="", extra="", tuning="""[tuning]
clipping_norm = [0.5, 2.0]
dpsgd_learning_rate = [0.003, 0.01, 0.03]
""")
HYBRID_GRID = HYBRID.replace('split = "{split}"\n', "").format(eps=8.0) + """[tuning]
split = ["alpha=0.25", "alpha=0.75"]
clipping_norm = [1.0, 4.0]
selection_share = 0.1
"""


@pytest.fixture(scope="module")
def dpsgd_plan():
    return build_plan(parse_scenario(DPSGD_GRID))


@pytest.fixture(scope="module")
def hybrid_plan():
    return build_plan(parse_scenario(HYBRID_GRID))


def test_configurations_are_the_product_in_order(dpsgd_plan):
    t = dpsgd_plan.tuning
    assert t.configurations == 6 and dpsgd_plan.scenario.tuning.configurations == 6
    assert [(c.clipping_norm, c.dpsgd_learning_rate) for c in t.grid] == [
        (0.5, 0.003), (0.5, 0.01), (0.5, 0.03), (2.0, 0.003), (2.0, 0.01), (2.0, 0.03)]
    assert [c.index for c in t.grid] == list(range(6))
    assert [c.split for c in t.grid] == [None] * 6


def test_budget_is_divided_as_declared(dpsgd_plan):
    sel = dpsgd_plan.tuning.noisy_max
    assert sel.share == 0.05 and sel.epsilon == pytest.approx(0.1)  # 5% of epsilon 2
    assert dpsgd_plan.run_epsilon == pytest.approx((2.0 - 0.1) / 6) and dpsgd_plan.run_delta == pytest.approx(1e-7 / 6)
    assert 6 * dpsgd_plan.run_epsilon + sel.epsilon <= 2.0
    # Delta = K log(1/p), Gumbel scale 2 Delta / eps_sel: the exponential mechanism's
    assert sel.sensitivity == pytest.approx(math.log(1000.0))
    assert sel.gumbel_scale == pytest.approx(2 * math.log(1000.0) / 0.1)
    g = dpsgd_plan.guarantee
    totals = [c.total.epsilon for c in dpsgd_plan.tuning.grid]
    assert g.epsilon == pytest.approx(math.fsum(totals) + sel.epsilon, rel=1e-12) and g.epsilon <= 2.0
    assert g.delta <= 1e-7 and g.method == "naive-composition"


def test_each_configuration_is_planned_with_its_own_clipping_norm(dpsgd_plan):
    runs = grid.runs_of(dpsgd_plan)
    sigmas = {ph[0].params.noise_multiplier for _, ph in runs}
    assert len(sigmas) == 1  # C does not change sigma ...
    for c, (phase,) in runs:  # ... but it is the phase's C, and sets the noise std
        assert phase.params.clipping_norm == c.clipping_norm
        assert phase.params.noise_std == pytest.approx(phase.params.noise_multiplier * c.clipping_norm)
    assert dpsgd_plan.phases == runs[0][1]


def test_accounting_cross_checked_with_dp_accounting(dpsgd_plan):
    """An independent PLD composition of all n runs' DP-SGD events, plus the selection's pure eps, is within
    the declared total; each run alone is within its per-run budget."""
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pld

    def run_event(phase):
        m = phase.mechanism
        return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(m.sampling_rate,
                                                                 dpa.GaussianDpEvent(m.noise_multiplier)), m.steps)

    runs = grid.runs_of(dpsgd_plan)
    one = pld.PLDAccountant(value_discretization_interval=1e-4)
    one.compose(run_event(runs[0][1][0]))
    eps_one = one.get_epsilon(dpsgd_plan.run_delta)
    assert eps_one <= dpsgd_plan.run_epsilon * (1 + 1e-6) and eps_one >= 0.97 * dpsgd_plan.run_epsilon
    every = pld.PLDAccountant(value_discretization_interval=1e-4)
    every.compose(dpa.ComposedDpEvent([run_event(ph[0]) for _, ph in runs]))
    eps_sel = dpsgd_plan.tuning.noisy_max.epsilon
    assert every.get_epsilon(dpsgd_plan.delta) + eps_sel <= dpsgd_plan.guarantee.epsilon


def test_hybrid_grid_plans_each_split(hybrid_plan):
    runs = grid.runs_of(hybrid_plan)
    assert [(c.split, c.clipping_norm) for c, _ in runs] == [
        ("alpha=0.25", 1.0), ("alpha=0.25", 4.0), ("alpha=0.75", 1.0), ("alpha=0.75", 4.0)]
    eps_run = hybrid_plan.run_epsilon
    assert eps_run == pytest.approx(8.0 * 0.9 / 4)
    for c, (rr, sgd) in runs:
        alpha = float(c.split.split("=")[1])
        assert rr.target_epsilon == pytest.approx(alpha * eps_run)
        assert sgd.target_epsilon == pytest.approx((1 - alpha) * eps_run)
    # a larger DP-SGD share needs less noise
    assert runs[0][1][1].params.noise_multiplier < runs[2][1][1].params.noise_multiplier
    assert hybrid_plan.scenario.split is None


def test_plan_round_trips_and_verifies(dpsgd_plan, hybrid_plan):
    for plan in (dpsgd_plan, hybrid_plan):
        text = plan.to_json()
        again = Plan.from_json(text)
        assert again == plan and again.to_json() == text
        report = verify_plan(again)
        assert report.ok, report.problems


def test_statement_lists_grid_run_budget_and_selection_cost(hybrid_plan):
    text = " ".join(render_statement(hybrid_plan).split())
    assert "grid of 4 configurations (split in {alpha=0.25, alpha=0.75}; clipping norm in {1, 4})" in text
    assert f"per-run budget ({hybrid_plan.run_epsilon:.6g}," in text
    assert "Configuration 3, split alpha=0.75:" in text
    sel = hybrid_plan.tuning.noisy_max
    assert f"({sel.epsilon:.6g}, 0)-DP, 10% of the budget" in text
    assert "No parallel composition between the training and validation parts is claimed" in text


def _forged(plan, **tuning_changes):
    return dataclasses.replace(plan, tuning=dataclasses.replace(plan.tuning, **tuning_changes))


def _noisy_max(p, **changes):
    return dataclasses.replace(p.tuning.noisy_max, **changes)


@pytest.mark.parametrize("forge, fragment", [
    (lambda p: _forged(p, grid=p.tuning.grid[:-1]), "tuning.grid: the plan lists"),
    (lambda p: _forged(p, noisy_max=_noisy_max(p, epsilon=0.01)), "tuning.noisy_max.epsilon"),
    (lambda p: _forged(p, noisy_max=_noisy_max(p, gumbel_scale=1.0)), "tuning.noisy_max.gumbel_scale"),
    (lambda p: _forged(p, noisy_max=_noisy_max(p, sensitivity=1.0)), "tuning.noisy_max.sensitivity"),
    (lambda p: _forged(p, grid=(p.tuning.grid[0], dataclasses.replace(p.tuning.grid[1], dpsgd_learning_rate=0.5),
                                *p.tuning.grid[2:])), "tuning.grid: the plan lists"),
])
def test_verify_fails_on_forged_grids(dpsgd_plan, forge, fragment):
    problems = verify_plan(forge(dpsgd_plan), replan=False).problems
    assert any(fragment in p for p in problems), problems


def test_a_grid_without_its_selection_or_a_key_of_it_does_not_load(dpsgd_plan):
    content = dpsgd_plan.content()
    with pytest.raises(InvalidParameterError, match="lists its configurations and its selection together"):
        read_tuning("tuning", {k: v for k, v in content["tuning"].items() if k != "noisy_max"})
    noisy_max = {k: v for k, v in content["tuning"]["noisy_max"].items() if k != "sensitivity"}
    with pytest.raises(InvalidParameterError, match="tuning.noisy_max is missing the field 'sensitivity'"):
        read_tuning("tuning", {**content["tuning"], "noisy_max": noisy_max})


def test_verify_fails_on_a_configuration_with_less_noise(dpsgd_plan):
    entry = to_json(dpsgd_plan.tuning.grid[4])
    entry["phases"][0]["parameters"]["noise_multiplier"] *= 0.5
    entry["phases"][0]["mechanism"]["noise_multiplier"] *= 0.5
    entry["phases"][0]["parameters"]["noise_std"] *= 0.5
    grid_ = (*dpsgd_plan.tuning.grid[:4], from_json_object(GridEntry, entry, "entry"), *dpsgd_plan.tuning.grid[5:])
    problems = verify_plan(_forged(dpsgd_plan, grid=grid_), replan=False).problems
    assert any(p.startswith("tuning.grid[4].phases[0] (dpsgd): the recomputed guarantee") for p in problems), problems


def test_plain_configurations_keep_their_accounting_and_bytes():
    p = build_plan(parse_scenario(DPSGD.format(unit="impression", cap="", extra="",
                                               tuning="[tuning]\nconfigurations = 4")))
    assert p.tuning.grid is None and p.tuning.noisy_max is None
    assert json.loads(p.to_json())["scenario"]["tuning"] == {"configurations": 4, "distribution": "poisson",
                                                             "selection": "naive"}


BAD = [
    ('clipping_norm = [1.0, 1.0]', "[tuning].clipping_norm lists the same value twice"),
    ('clipping_norm = [1.0, nan]', "[tuning].clipping_norm[1] must be a finite number > 0, got nan"),
    ('clipping_norm = [1.0, inf]', "[tuning].clipping_norm[1] must be a finite number > 0, got inf"),
    ('dpsgd_learning_rate = [0.01, -1.0]', "[tuning].dpsgd_learning_rate[1] must be a finite number > 0"),
    ('dpsgd_learning_rate = []', "[tuning].dpsgd_learning_rate must be a non-empty list"),
    ('clipping_norm = [1.0, 2.0]\nconfigurations = 3', "[tuning].configurations = 3 disagrees with the grid"),
    ('clipping_norm = [1.0]', "grid has 1 configuration"),
    ('clipping_norm = [1.0, 2.0]\nselection = "repeat-and-select"', "with a grid is not supported"),
    ('split = ["alpha=0.5", "alpha=0.25"]', "[tuning].split applies to hybrid only"),
    ('configurations = 2\nselection_share = 0.1', "[tuning].selection_share applies to a grid"),
    ('clipping_norm = [1.0, 2.0]\nselection_share = 1.0', "[tuning].selection_share must be"),
    ('clipping_norm = [1.0, 2.0]\nprediction_clip = 0.5', "[tuning].prediction_clip must be below 0.5"),
    ('clipping_norm = [1.0, 2.0]\nvalidation_fraction = 0', "[tuning].validation_fraction must be"),
]


@pytest.mark.parametrize("tuning, fragment", BAD)
def test_bad_grids_are_one_line_errors_exit_2(runner, tmp_path, tuning, fragment):
    path = tmp_path / "s.toml"
    path.write_text(DPSGD.format(unit="impression", cap="", extra="", tuning="[tuning]\n" + tuning))
    with pytest.raises(InvalidParameterError) as exc:
        parse_scenario(path.read_text())
    assert fragment in str(exc.value)
    out = runner.invoke(cli, ["plan", str(path), "-o", str(tmp_path / "plan.json")])
    assert out.exit_code == 2 and fragment in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("edit, fragment", [
    (lambda t: t.replace('name = "hybrid"', 'name = "hybrid"\nsplit = "paper-v1"'),
     "[algorithm].split = 'paper-v1' and [tuning].split are both given"),
    (lambda t: t.replace('"alpha=0.75"', '"alpha =0.75"'), "[tuning].split[1] must be"),
    (lambda t: t.replace('"alpha=0.75"', '"alpha=.25"'), "[tuning].split lists the same value twice"),
    (lambda t: t.replace('"alpha=0.75"', '"eps1=9"'), "[tuning].split = 'eps1=9'"),
])
def test_bad_hybrid_grids(edit, fragment):
    with pytest.raises(InvalidParameterError) as exc:
        parse_scenario(edit(HYBRID_GRID))
    assert fragment in str(exc.value)


def test_an_eps1_beyond_the_run_budget_names_the_configuration():
    text = HYBRID_GRID.replace('"alpha=0.75"', '"eps1=3"')  # below eps = 8, above the run's 1.8
    with pytest.raises(InvalidParameterError, match=r"configuration #2 \(split eps1=3, C = 1\) at the run budget"):
        build_plan(parse_scenario(text))


def test_cli_plans_verifies_and_states_a_grid(runner, tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(HYBRID_GRID)
    plan_path = tmp_path / "plan.json"
    made = runner.invoke(cli, ["plan", str(path), "-o", str(plan_path)])
    assert made.exit_code == 0, made.output
    assert runner.invoke(cli, ["verify", str(plan_path)]).exit_code == 0
    stmt = runner.invoke(cli, ["statement", str(plan_path)])
    assert stmt.exit_code == 0 and "report-noisy-max" in stmt.stdout


def test_a_grid_with_a_calibration_release_is_refused_in_one_line():
    with pytest.raises(InvalidParameterError, match=r"^\[calibration\] with a \[tuning\] grid is not supported"):
        opted_out = "[calibration]  # off: these tests plan the training phases alone\nshare = 0\n"
        parse_scenario(HYBRID_GRID.replace(opted_out, "[calibration]\nshare = 0.05\n"))
