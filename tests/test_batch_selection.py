"""Batch selection as a plan decision: scenario key, plan, verify, CLI, training and the audit per choice."""

import json

import pyarrow.parquet as pq
import pytest

from budgetplan.accounting import account
from budgetplan.audit.verify import verify_plan
from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import AllocationDPSGD, PoissonDPSGD, ShuffledDPSGD
from budgetplan.plan import Plan
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario

N = 2000
SCENARIO = """
[budget]
epsilon = 4.0
delta = 1e-6

[privacy]
adjacency = "{adjacency}"
unit = "impression"

[data]
dataset_size = {n}

[algorithm]
name = "dpsgd"

[dpsgd]
batch_size = 100
{length}
clipping_norm = 1.0
sampling = "{sampling}"
[calibration]  # off: these tests plan the training phases alone
share = 0
"""
MECHANISM = {"poisson": PoissonDPSGD, "allocation": AllocationDPSGD, "shuffle": ShuffledDPSGD}


def scenario(sampling, *, adjacency="add-remove", length="epochs = 2", n=N, features=""):
    return parse_scenario(SCENARIO.format(adjacency=adjacency, n=n, length=length, sampling=sampling) + features)


@pytest.mark.parametrize("sampling", ["poisson", "allocation", "shuffle"])
def test_each_choice_plans_to_its_own_accounting_and_verifies(sampling):
    plan = build_plan(scenario(sampling))
    phase = plan.dpsgd
    assert isinstance(phase.mechanism, MECHANISM[sampling]) and phase.params.sampling == sampling
    assert phase.params.expected_batch_size == 100 and phase.params.steps == 40
    assert phase.guarantee.epsilon <= 4.0 * (1 + 1e-9)
    # calibrated: a little less noise would not do
    less = account(type(phase.mechanism)(**{**_fields(phase.mechanism),
                                           "noise_multiplier": phase.params.noise_multiplier * 0.97}),
                   delta=1e-6, adjacency="add-remove", method=phase.method).epsilon
    assert less > 4.0
    again = Plan.from_json(plan.to_json())
    report = verify_plan(again)
    assert report.ok, report.problems
    assert again.sha256 == plan.sha256


def _fields(mech):
    from dataclasses import fields

    return {f.name: getattr(mech, f.name) for f in fields(mech)}


def test_a_tampered_sampling_choice_does_not_verify():
    plan = build_plan(scenario("shuffle"))
    data = json.loads(plan.to_json())
    data["phases"][0]["parameters"]["sampling"] = "poisson"  # the stale hash is not what is tested here
    tampered = Plan.from_dict(data)
    assert not verify_plan(tampered).ok


def test_shuffle_needs_more_noise_than_allocation_and_poisson():
    sigma = {s: build_plan(scenario(s)).dpsgd.params.noise_multiplier for s in MECHANISM}
    assert sigma["shuffle"] > sigma["allocation"] and sigma["shuffle"] > sigma["poisson"]


@pytest.mark.parametrize("sampling, adjacency, length, message", [
    ("allocation", "add-remove", "epochs = 1.5", "[dpsgd].epochs must be a whole number"),
    ("shuffle", "add-remove", "steps = 30", "[dpsgd].steps must be a multiple of the 20 steps"),
    ("allocation", "replace-one", "epochs = 2", "add-remove only"),
])
def test_scenario_refuses_what_the_choice_cannot_run(sampling, adjacency, length, message):
    with pytest.raises(InvalidParameterError) as exc:
        scenario(sampling, adjacency=adjacency, length=length)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(InvalidParameterError, match="max_batch_size"):
        scenario("allocation", length="epochs = 1\nmax_batch_size = 200")


def test_cli_batch_selection(runner):
    def run(*args):
        result = runner.invoke(cli, ["dpsgd", "--delta", "1e-6", "--dataset-size", "2000", "--batch-size", "100",
                                     *args])
        return result

    out = json.loads(run("--noise-multiplier", "1.5", "--epochs", "2", "--batch-selection", "shuffle",
                         "--json").stdout)
    assert out["batch_selection"] == "shuffle" and out["poisson_is_guarantee"] is False
    assert out["shuffle_lower_bound"] < out["epsilon"] and out["poisson_epsilon"] < out["epsilon"]
    assert out["guarantee"]["method"] == "exact"
    cal = json.loads(run("--epsilon", "4", "--epochs", "2", "--batch-selection", "allocation", "--json").stdout)
    assert cal["epsilon"] <= 4 and cal["noise_multiplier"] == pytest.approx(
        build_plan(scenario("allocation")).dpsgd.params.noise_multiplier, rel=1e-9)
    text = run("--noise-multiplier", "1.5", "--epochs", "2", "--batch-selection", "shuffle")
    flat = " ".join(text.output.split())  # the notes wrap at the terminal's width
    assert text.exit_code == 0 and "NOT a guarantee for shuffled batches" in flat
    assert "lower bound for shuffled batches" in flat
    bad = run("--noise-multiplier", "1.5", "--epochs", "1.5", "--batch-selection", "allocation")
    assert bad.exit_code == 2 and "--epochs must be a whole number" in bad.output
    assert "Traceback" not in bad.output
    other = run("--noise-multiplier", "1.5", "--epochs", "2", "--batch-selection", "shuffle", "--accountant", "rdp")
    assert other.exit_code == 2 and "--accountant rdp does not apply to --batch-selection shuffle" in other.output
    rdp = json.loads(run("--noise-multiplier", "1.5", "--epochs", "2", "--batch-selection", "allocation",
                         "--accountant", "rdp", "--json").stdout)
    pld = json.loads(run("--noise-multiplier", "1.5", "--epochs", "2", "--batch-selection", "allocation",
                         "--json").stdout)
    assert rdp["guarantee"]["method"] == "rdp" and pld["guarantee"]["method"] == "pld"
    assert pld["epsilon"] < rdp["epsilon"]


# ------------------------------------------------------------------ training and the audit


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from trainers.data.synth import synthesize

    root = tmp_path_factory.mktemp("batch-selection")
    pq.write_table(synthesize(N, 300, 4), root / "train.parquet")
    return root


FEATURES = """
[features]
label = "label"
nonsensitive_categorical = ["publisher", "campaign"]
sensitive_numeric = ["days_since_visit", "visits_7d"]
"""


def _train(root, name, plan, monkeypatch=None, sampler=None):
    from trainers import dpsgd as dpsgd_mod
    from trainers.run import RunOptions, TrainSettings, execute_plan

    if sampler is not None:
        monkeypatch.setattr(dpsgd_mod, "phase_sampler", sampler)
    out = root / name
    execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=2)))
    from budgetplan.audit import audit_run

    return audit_run(out)


def _named(report, prefix):
    return [c for c in report.checks if c.name.startswith(prefix)]


@pytest.mark.parametrize("sampling, prefix", [("poisson", "Poisson"), ("allocation", "Allocation"),
                                              ("shuffle", "Shuffled")])
def test_each_choice_trains_and_audits_clean(data, sampling, prefix):
    plan = build_plan(scenario(sampling, features=FEATURES))
    report = _train(data, sampling, plan)
    assert report.passed, [c for c in report.checks if not c.passed]
    assert _named(report, f"{prefix} batch sizes")
    # the evidence the trainer measured: the noise of every step, and each row's part in every epoch
    assert _named(report, "DP-SGD noise evidence")[0].passed
    if sampling != "poisson":
        (check,) = _named(report, f"{prefix} participation")
        assert "2 whole epoch(s)" in check.detail


def _sampler_of(kind):
    from trainers.sampling import AllocationSampler, PoissonSampler

    def make(rows, params, settings, randomness, **_):
        # the indices live where the data does, as the real sampler's do (a GPU run included)
        device = rows.label.device
        if kind == "poisson":
            return PoissonSampler(len(rows), params.sampling_rate, seed=randomness.torch_seed(), device=device)
        return AllocationSampler(len(rows), params.steps_per_epoch, seed=randomness.torch_seed(), device=device)

    return make


@pytest.mark.parametrize("planned, ran, failing", [
    ("allocation", "poisson", "Allocation batch sizes: epoch totals"),
    ("shuffle", "allocation", "Shuffled batch sizes: fixed size"),
])
def test_the_audit_catches_a_sampler_that_is_not_the_plans(data, monkeypatch, planned, ran, failing):
    plan = build_plan(scenario(planned, features=FEATURES))
    report = _train(data, f"{planned}-ran-{ran}", plan, monkeypatch, _sampler_of(ran))
    assert not report.passed
    assert [c.passed for c in report.checks if c.name == failing] == [False]


def test_epoch_samplings_resume_at_epoch_boundaries_and_run_in_one_process():
    from budgetplan.errors import UnsupportedError
    from trainers.dpsgd import check_resume
    from trainers.ranks import check_distributable

    for sampling, why in [("allocation", "random allocation"), ("shuffle", "one permutation")]:
        plan = build_plan(scenario(sampling))
        check_resume(plan.dpsgd.params, 20)  # a whole epoch of 20 steps is done
        with pytest.raises(UnsupportedError, match="epoch boundary"):
            check_resume(plan.dpsgd.params, 27)
        with pytest.raises(UnsupportedError, match=why):
            check_distributable(plan)
    check_resume(build_plan(scenario("poisson")).dpsgd.params, 27)


def test_allocation_spread_check_against_the_multinomial():
    # N = 2000 rows over T = 20 steps, 50 epochs: multinomial sizes pass; fixed sizes (which also total N)
    # and Poisson sizes (which do not) fail, each on the check that sees them
    import numpy as np

    from budgetplan.audit.sampling import epoch_size_checks

    par = build_plan(scenario("allocation")).dpsgd.params
    rng = np.random.default_rng(5)
    honest = rng.multinomial(2000, [1 / 20] * 20, size=50).ravel().tolist()
    checks = {c.name: c.passed for c in epoch_size_checks("A", honest, len(honest), par, 1e-6)}
    assert checks == {"A: epoch totals": True, "A: spread": True}
    fixed = [100] * 1000
    checks = {c.name: c.passed for c in epoch_size_checks("A", fixed, len(fixed), par, 1e-6)}
    assert checks == {"A: epoch totals": True, "A: spread": False}
    poisson = rng.binomial(2000, 1 / 20, size=1000).tolist()
    assert not {c.name: c.passed for c in epoch_size_checks("A", poisson, len(poisson), par, 1e-6)}["A: epoch totals"]


@pytest.mark.parametrize("sampling, says, never", [
    ("poisson", "independently with probability q", "NOT a guarantee here"),
    ("allocation", "exactly one uniformly random step", "independently with probability q ="),
    ("shuffle", "NOT a guarantee here", "independently with probability q ="),
])
def test_the_statement_describes_the_batches_the_plan_draws(sampling, says, never):
    from budgetplan.report.statement import render_statement

    text = render_statement(build_plan(scenario(sampling)))
    assert says in text and never not in text


def test_the_audit_catches_an_example_allocated_twice_in_an_epoch(data, monkeypatch):
    """The planted defect (``mutants.ALLOCATED_TWICE``): in every epoch one row takes the slot of another, so it
    takes part twice and the other not at all. The epochs still total N and the sizes stay multinomial: only
    the participation counts the trainer measured on its batches show it."""
    from tests.trainers.mutants import ALLOCATED_TWICE
    from trainers.sampling import AllocationSampler

    plan = build_plan(scenario("allocation", features=FEATURES))
    monkeypatch.setattr(AllocationSampler, "_epoch", ALLOCATED_TWICE.build().AllocationSampler._epoch)
    report = _train(data, "allocated-twice", plan)
    assert {c.name for c in report.checks if not c.passed} == {"Allocation participation"}
    (check,) = _named(report, "Allocation participation")
    assert "1 row(s) 0 time(s), 1998 row(s) 1 time(s), 1 row(s) 2 time(s)" in check.detail


@pytest.mark.parametrize("sampling, what", [("allocation", "random allocation"), ("shuffle", "shuffled batches")])
def test_the_empirical_audits_run_allocated_and_shuffled_plans(data, sampling, what):
    """`--empirical` runs the canaries on the real sampler (each canary once per epoch) against the phase's
    planned epsilon and passes; `--one-run` has no replace-one curve of such batches and fails a named check:
    a failing audit (exit 1), never a usage error (exit 2)."""
    from click.testing import CliRunner

    plan = build_plan(scenario(sampling, features=FEATURES))
    assert _train(data, f"{sampling}-empirical", plan).passed
    result = CliRunner().invoke(cli, ["audit", str(data / f"{sampling}-empirical"), "--empirical", "--one-run",
                                      "--json"])
    assert result.exit_code == 1, result.output
    rows = {e["name"]: e for e in json.loads(result.stdout)["empirical"]}
    empirical = rows["empirical dpsgd"]
    assert empirical["passed"] and "in each epoch once" in empirical["compared"], empirical["detail"]
    assert empirical["planned_epsilon"] == plan.dpsgd.guarantee.epsilon
    assert rows["one-run dpsgd"]["failing"] == [f"one-run curve of {what}"]


def test_the_participation_check_on_shuffled_epochs_whose_last_rows_sit_out():
    """N = 2,050 in batches of 100: T = 20 steps an epoch use 2,000 rows once and 50 sit out. The counts of an
    honest run pass; a row used twice, or an epoch whose counts are missing, fails."""
    from types import SimpleNamespace

    from budgetplan.audit.step_evidence import participation_check

    par = build_plan(scenario("shuffle", n=2050)).dpsgd.params
    assert (par.steps_per_epoch, par.steps) == (20, 40)
    ran = SimpleNamespace(steps_this_session=40)
    honest = {"counts": {"0": 50, "1": 2000}, "whole": True}
    check = participation_check({"participation": [honest, honest]}, ran, par)
    assert check.passed and "2000 rows once, 50 sat out" in check.detail
    twice = {"counts": {"0": 51, "1": 1998, "2": 1}, "whole": True}
    check = participation_check({"participation": [honest, twice]}, ran, par)
    assert not check.passed and "epoch 1: rows took part 51 row(s) 0 time(s)" in check.detail
    assert not participation_check({"participation": [honest]}, ran, par).passed
    assert not participation_check({}, ran, par).passed
