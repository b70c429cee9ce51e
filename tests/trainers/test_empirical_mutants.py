"""Planted defects in the training loops fail `budgetplan audit --empirical` at the README's plans.

The run is the README's: ``example:synthetic-hybrid`` (Hybrid at (8, 0.1/N), N = 200,000; RR
at eps1 = 3.8 (alpha-by-eps: 0.5 of the 7.6 the training phases get), then DP-SGD at batch N/50 = 4,000
for 10 epochs, 500 steps at sigma 1.198, C = 5)
trained once on the built-in
synthetic data (a smaller model than the default: the model is not what is audited). WALR
has no trainable example (``example:walr`` has no features), so its plan is audited through
``audit_plan``, the driver ``audit --empirical`` calls.

The audit measures the trainer code installed when it runs, not the code that trained the
run: each defect is planted (``mutants.py``) after the run exists, and the audit of the same
honest run then fails. The audits use fresh CSPRNG randomness, as a user's would.

Margins, measured over 4-8 audits each at the README plan as it was then (batch 4,096 for 3
epochs: 147 steps at sigma 0.761; 200,000 canaries present, 2,000,000 absent, all 147
steps; an audit of the run takes 5-10 s on 2 idle cores):
- honest: RR bound 2.986-2.994 against 3; DP-SGD bound 1.52-1.94 against the add-remove
  4.39 (the plan's replace-one epsilon is 5.00); WALR bound 0 against 1. The smallest p of
  any check in 14 honest audits was 0.004.
- noise halved: DP-SGD bound 6.18-6.64 against 4.39 (1.8 above it at worst; the absent
  canaries above the threshold number 6-25 of 1M, each moving the bound by ~0.05), and the
  measured noise multiplier 0.380 against 0.761 (chi-square p = 0 in float64).
- clipping off: bound 10.47-10.84; a canary moves 4.01 C per inclusion (z = 430).
- noise once per epoch (step or loop): measured noise multiplier 4e-8 on 144 of 147 steps.
- noise generator reseeded every step: the summed noise has 147x its independent variance.
- normalised by the realised batch size: per-step noise multiplier 0.73-0.80 (z ~ 20 per
  step: the sd of B_t / (q N) is 1.5%, the chi-square's resolution 0.07%).
- RR flip probability 0.8x: bound 3.217-3.225 against 3; flip rate z ~ 300.
- WALR noise halved: measured noise std 11.4 against 22.8 over 400,000 residuals.
"""

import json

import pyarrow.parquet as pq
import pytest

from budgetplan.cli import cli
from budgetplan.plan import load_plan
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.examples import path as example_path
from budgetplan.scenario.model import load_scenario
from tests.trainers.mutants import (
    CLIPPING_OFF,
    NOISE_HALVED,
    NOISE_ONCE_PER_EPOCH_IN_LOOP,
    NOISE_ONCE_PER_EPOCH_IN_STEP,
    NOISE_REUSED_EVERY_STEP,
    REALISED_BATCH,
    RR_FLIP_08_IN_PHASE,
    RR_FLIP_08_IN_RANDOMIZE,
    WALR_NOISE_HALVED_IN_RELEASE,
    WALR_NOISE_HALVED_IN_RUN,
)
from trainers.audit import audit_run
from trainers.empirical import audit_plan

# what each defect must fail (it may fail more)
CAUGHT = [
    (NOISE_HALVED, "empirical dpsgd", {"epsilon lower bound", "noise std per step"}),
    (CLIPPING_OFF, "empirical dpsgd", {"epsilon lower bound", "canary gradient is C at rate q"}),
    (NOISE_ONCE_PER_EPOCH_IN_STEP, "empirical dpsgd", {"noise std per step"}),
    (NOISE_ONCE_PER_EPOCH_IN_LOOP, "empirical dpsgd", {"noise std per step"}),
    (NOISE_REUSED_EVERY_STEP, "empirical dpsgd", {"noise independent across steps"}),
    (REALISED_BATCH, "empirical dpsgd", {"noise std per step"}),
    (RR_FLIP_08_IN_PHASE, "empirical rr", {"epsilon lower bound", "flip rate"}),
    (RR_FLIP_08_IN_RANDOMIZE, "empirical rr", {"epsilon lower bound", "flip rate"}),
]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory):
    from click.testing import CliRunner

    from trainers.data.synth import synthesize
    from trainers.run import RunOptions, TrainSettings, execute_plan

    root = tmp_path_factory.mktemp("readme")
    pq.write_table(synthesize(200_000, 40_000, 1), root / "train.parquet")
    made = CliRunner().invoke(cli, ["plan", "example:synthetic-hybrid", "-o", str(root / "plan.json")])
    assert made.exit_code == 0, made.output
    plan = load_plan(root / "plan.json")
    execute_plan(plan, root / "train.parquet", RunOptions(
        out_dir=root / "run", settings=TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,))))
    return root / "run", plan


def rows(report_or_rows) -> dict:
    items = report_or_rows.empirical if hasattr(report_or_rows, "empirical") else report_or_rows
    return {e["name"]: e for e in items}


def test_the_readme_plan_is_the_one_described(readme_run):
    _, plan = readme_run
    assert [p.name for p in plan.phases] == ["rr", "dpsgd", "calibration"]
    rr, dp = plan.rr, plan.dpsgd
    # alpha 0.5 of what the calibration release leaves of the run epsilon whose PLD total is the budget 8
    assert plan.scenario.composition == "pld" and plan.guarantee.epsilon <= 8.0 < plan.run_epsilon
    assert (rr.params.per_impression_epsilon, plan.dataset_size) == (pytest.approx(0.5 * 0.95 * plan.run_epsilon),
                                                                     200_000)
    par = dp.params
    assert (par.steps, par.clipping_norm, par.sampling_rate, par.sampling) == (500, 5.0, 0.02, "poisson")


def test_an_honest_run_passes_the_cli_audit(readme_run, runner):
    run, plan = readme_run
    result = runner.invoke(cli, ["audit", str(run), "--empirical", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    by = rows(out["empirical"])
    assert out["passed"] and set(by) == {"empirical rr", "empirical dpsgd"}
    rr, dp = by["empirical rr"], by["empirical dpsgd"]
    assert rr["passed"] and rr["tight"] and rr["planned_epsilon"] == pytest.approx(plan.rr.guarantee.epsilon)
    assert rr["planned_epsilon"] - 0.05 <= rr["epsilon_lower_bound"] <= rr["planned_epsilon"]
    # the canaries are add-remove trials: compared with the add-remove epsilon, below the plan's
    assert dp["passed"] and 0 < dp["epsilon_lower_bound"] <= dp["planned_epsilon"] < dp["phase_epsilon"]
    assert dp["phase_epsilon"] == plan.phases[1].guarantee.epsilon
    assert all(c["passed"] for c in dp["checks"]) and len(dp["checks"]) == 4
    assert (dp["samples"], dp["absent"]) == (200_000, 460_000)  # 330M coordinate-steps / 500 steps


@pytest.mark.parametrize(("mutant", "row", "expected"), CAUGHT, ids=[m.name for m, _, _ in CAUGHT])
def test_a_planted_defect_fails_the_audit_of_the_readme_run(readme_run, runner, monkeypatch, mutant, row, expected):
    run, _ = readme_run
    mutant.install(monkeypatch)
    if mutant is RR_FLIP_08_IN_RANDOMIZE:  # as a user runs it: exit 1, the failing phase named on stderr
        # (the same defect planted in run_rr_phase shows the failing checks by name below)
        result = runner.invoke(cli, ["audit", str(run), "--empirical"])
        assert result.exit_code == 1 and f"audit failed: {row}" in result.stderr, result.output
        return
    if mutant is NOISE_HALVED:  # the CLI's JSON: the failing phase, its failing checks, and why
        result = runner.invoke(cli, ["audit", str(run), "--empirical", "--json"])
        out = json.loads(result.stdout)
        assert result.exit_code == 1 and out["failing"] == [row]
        dp = rows(out["empirical"])[row]
        assert expected <= set(dp["failing"]) and dp["epsilon_lower_bound"] > dp["planned_epsilon"]
        assert "FAIL noise std per step" in dp["detail"]
        return
    report = audit_run(run, empirical=True)
    assert not report.passed and report.failing() == [row]  # the run itself is honest: only the code changed
    assert expected <= set(rows(report)[row]["failing"]), rows(report)[row]["detail"]


@pytest.fixture(scope="module")
def walr_plan():
    return build_plan(load_scenario(example_path("walr")))


def test_the_walr_example_passes(walr_plan):
    (walr,) = audit_plan(walr_plan)
    assert walr["name"] == "empirical walr" and walr["passed"], walr["detail"]
    assert walr["planned_epsilon"] == pytest.approx(walr_plan.phases[0].guarantee.epsilon, rel=1e-9)


@pytest.mark.parametrize("mutant", [WALR_NOISE_HALVED_IN_RUN, WALR_NOISE_HALVED_IN_RELEASE], ids=lambda m: m.name)
def test_walr_with_half_its_noise_fails(walr_plan, monkeypatch, mutant):
    from trainers.audit import run_empirical

    mutant.install(monkeypatch)
    (walr,) = run_empirical(walr_plan, progress=False)
    assert not walr["passed"] and "noise std" in walr["failing"], walr["detail"]
