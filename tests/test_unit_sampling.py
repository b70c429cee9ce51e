"""User-level DP-SGD by sampling units: scenario key, accounting, plan, verify, alternatives, statement."""

import dataclasses
import json

import pytest

from budgetplan.accounting import account
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import Composition, PoissonDPSGD, RandomizedResponse, UnitPoissonDPSGD
from budgetplan.plan import Plan
from budgetplan.planning.calibrate import dpsgd_noise_multiplier
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.units import PrivacyUnit

N, M = 20_000, 5_000
SCENARIO = """
[budget]
epsilon = 2.0
delta = 1e-6

[privacy]
adjacency = "{adjacency}"
unit = "user"
cap = {cap}

[data]
dataset_size = {n}
{units}

[algorithm]
name = "dpsgd"

[dpsgd]
batch_size = {batch}
epochs = 2
clipping_norm = 1.0
sample_by = "{sample_by}"
{extra}
[calibration]  # off: these tests plan the training phases alone
share = 0
"""


def scenario(sample_by="unit", *, adjacency="add-remove", cap=5, n=N, units=f"units = {M}", batch=100, extra=""):
    return parse_scenario(SCENARIO.format(adjacency=adjacency, cap=cap, n=n, units=units, batch=batch,
                                          sample_by=sample_by, extra=extra))


USER = PrivacyUnit.capped(5, name="user")


@pytest.mark.parametrize("adjacency", ["add-remove", "replace-one"])
def test_a_unit_sampled_mechanism_costs_what_one_example_does_over_units(adjacency):
    # Independent route: the example-level Poisson accounting at the same q and T (the unit
    # is the element sampled and clipped); the cap must not enter.
    unit_m = UnitPoissonDPSGD(noise_multiplier=0.9, sampling_rate=0.01, steps=400)
    example = account(PoissonDPSGD(noise_multiplier=0.9, sampling_rate=0.01, steps=400), delta=1e-6,
                      adjacency=adjacency)
    for cap in (2, 5, 50):
        g = account(unit_m, delta=1e-6, adjacency=adjacency, unit=PrivacyUnit.capped(cap, name="user"))
        assert g.epsilon == example.epsilon and g.unit.cap == cap
        assert "arXiv:2407.07737" in " ".join(g.notes)
    # group privacy is no looser for it: there is no group step to take
    assert account(unit_m, delta=1e-6, adjacency=adjacency, unit=USER, unit_accounting="group").epsilon == \
        example.epsilon
    if adjacency == "add-remove":
        rdp = account(unit_m, delta=1e-6, adjacency=adjacency, unit=USER, method="rdp").epsilon
        assert rdp == account(unit_m.as_poisson(), delta=1e-6, adjacency=adjacency, method="rdp").epsilon
        # and less than the example-sampled unit's mixture of Gaussians at the same sigma, q, T
        mog = account(unit_m.as_poisson(), delta=1e-6, adjacency=adjacency, unit=USER).epsilon
        assert example.epsilon < mog


def test_it_composes_with_the_rr_phase_at_the_units_level():
    # A Hybrid-like composition: RR spends its epsilon on each of the K labels, DP-SGD once per unit.
    unit_m = UnitPoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.01, steps=200)
    both = account(Composition(phases=(RandomizedResponse(epsilon=0.2), unit_m)), delta=1e-6,
                   adjacency="replace-one", unit=USER).epsilon
    alone = account(unit_m, delta=1e-6, adjacency="replace-one", unit=USER).epsilon
    assert 5 * 0.2 < both <= 5 * 0.2 + alone + 1e-3


def test_the_plan_samples_units_verifies_and_round_trips():
    plan = build_plan(scenario())
    phase = plan.dpsgd
    assert isinstance(phase.mechanism, UnitPoissonDPSGD)
    par = phase.params
    assert (par.sample_by, par.units, par.sampling_rate) == ("unit", M, 100 / M)
    assert par.expected_batch_size == 100 and par.steps == 100 and par.sensitivity == 1.0
    assert phase.unit_accounting == "tight" and phase.guarantee.epsilon <= 2.0 * (1 + 1e-9)
    # calibrated as example-level DP-SGD over the M units
    cal = dpsgd_noise_multiplier(epsilon=2.0, delta=1e-6, sampling_rate=100 / M, steps=100)
    assert par.noise_multiplier == pytest.approx(cal.value, rel=1e-3)
    again = Plan.from_json(plan.to_json())
    assert again.sha256 == plan.sha256
    report = verify_plan(again)
    assert report.ok, report.problems
    # replace-one doubles the sensitivity, as for examples
    assert build_plan(scenario(adjacency="replace-one")).dpsgd.params.sensitivity == 2.0


def test_tampered_unit_fields_do_not_verify():
    plan = build_plan(scenario())
    doc = json.loads(plan.to_json())
    doc["phases"][0]["parameters"]["units"] = M * 2
    report = verify_plan(Plan.from_dict(doc))
    assert not report.ok and any("units vs scenario" in p for p in report.problems)
    # swapping the mechanism for the example-level one is refused at load
    doc = json.loads(plan.to_json())
    doc["phases"][0]["mechanism"]["type"] = "PoissonDPSGD"
    with pytest.raises(InvalidParameterError, match="UnitPoissonDPSGD"):
        Plan.from_dict(doc)


def test_example_sampled_plans_keep_their_bytes():
    plan = build_plan(scenario("example", units=""))
    doc = json.loads(plan.to_json())
    assert "sample_by" not in doc["scenario"]["dpsgd"] and "units" not in doc["scenario"]
    assert "sample_by" not in doc["phases"][0]["parameters"]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(units=""), r"needs \[data\].units"),
    (dict(cap=1, n=M), r"K > 1"),
    (dict(units="units = 3000"), r"units <= dataset_size <= cap x units"),
    (dict(units="units = 30000"), r"units <= dataset_size"),
    (dict(batch=6000, units="units = 5000"), r"counts units"),
    (dict(extra='sampling = "shuffle"'), r'sampling = "poisson"'),
])
def test_the_scenario_refuses_what_unit_sampling_cannot_run(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        scenario(**kwargs)


def test_bad_sample_by_value_names_the_key():
    with pytest.raises(InvalidParameterError, match=r"\[dpsgd\].sample_by"):
        parse_scenario(SCENARIO.format(adjacency="add-remove", cap=5, n=N, units=f"units = {M}", batch=100,
                                       sample_by="users", extra=""))


def _alternatives(plan):
    return [a for a in plan.unit_alternatives if a.phase == "dpsgd" and a.applies]


@pytest.mark.parametrize("sample_by", ["example", "unit"])
def test_alternatives_list_both_executions_and_recommend_one(sample_by):
    plan = build_plan(scenario(sample_by))
    rows = _alternatives(plan)
    executions = {a.execution for a in rows}
    assert executions == {"example sampling", "unit sampling"}
    unit_row = next(a for a in rows if a.execution == "unit sampling")
    # the same target, the same q and T: the unit row is the example-level noise over units
    cal = dpsgd_noise_multiplier(epsilon=2.0, delta=1e-6, sampling_rate=plan.dpsgd.mechanism.sampling_rate,
                                 steps=plan.dpsgd.mechanism.steps, verify=False)
    assert unit_row.noise_multiplier == pytest.approx(cal.value, rel=1e-3)
    q = plan.dpsgd.mechanism.sampling_rate
    assert unit_row.expected_contributions == pytest.approx(q * M)
    for a in rows:
        assert a.noise_per_contribution == pytest.approx(a.noise_multiplier / a.expected_contributions)
        if a.execution == "example sampling":
            assert a.expected_contributions == pytest.approx(q * N)
            # a unit of K examples each sampled alone needs more noise than one sampled unit
            assert a.noise_multiplier > unit_row.noise_multiplier
    recommended = [a for a in rows if a.recommended]
    # the least noise at the same q and T: sampling units, whose sigma does not grow with K
    assert recommended == [unit_row]
    assert unit_row.noise_multiplier == min(a.noise_multiplier for a in rows)


def test_the_recommendation_says_when_clipping_would_reverse_it():
    # Full units of K = 5 at a small q: the mixture's sigma is far below 5x the unit one, so per
    # clipped contribution example sampling has less noise, and the recommendation says so;
    # with single-row units (N = M + 10) the unit sampling wins both ways.
    full = next(a for a in _alternatives(build_plan(scenario("example"))) if a.recommended)
    assert full.execution == "unit sampling"
    assert "if most contributions are clipped, example sampling" in full.recommendation
    sparse = next(a for a in _alternatives(build_plan(scenario("example", n=M + 10))) if a.recommended)
    assert sparse.recommendation == "the least noise, also per clipped contribution"


def test_without_a_unit_count_the_alternative_says_what_it_assumed():
    plan = build_plan(scenario("example", units=""))
    unit_row = next(a for a in _alternatives(plan) if a.execution == "unit sampling")
    assert "N/K" in unit_row.note and unit_row.expected_contributions == pytest.approx(
        plan.dpsgd.mechanism.sampling_rate * N / 5)


def test_the_statement_says_units_are_sampled_and_clipped_once():
    text = " ".join(render_statement(build_plan(scenario())).split())  # the statement wraps its lines
    assert "samples every one of the M = 5000 user units" in text
    assert "clips that sum to L2 norm C = 1 once per unit" in text
    assert "divides by the expected units per batch q M" in text
    assert "Poisson sampling of units" in text
    example = " ".join(render_statement(build_plan(scenario("example"))).split())
    assert "once per unit" not in example and "clips each example's gradient" in example


def test_params_refuse_half_a_unit_declaration():
    par = build_plan(scenario()).dpsgd.params
    with pytest.raises(InvalidParameterError, match="go together"):
        dataclasses.replace(par, units=None)
    with pytest.raises(InvalidParameterError, match="Poisson batches"):
        dataclasses.replace(par, sampling="shuffle")


# ------------------------------------------------------------------ training and the audit

FEATURES = """
[features]
label = "label"
unit_id = "user_id"
nonsensitive_categorical = ["publisher", "campaign"]
sensitive_numeric = ["days_since_visit", "visits_7d"]
"""


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """Synthetic rows capped at 3 per user beforehand, so the plan's N and M are exact."""
    import numpy as np
    import pyarrow.parquet as pq

    from trainers.data.capping import cap_units
    from trainers.data.synth import synthesize

    root = tmp_path_factory.mktemp("unit-sampling")
    table = synthesize(3000, 600, 11)
    users = table.column("user_id").to_numpy()
    kept, _ = cap_units(users, 3, rule="first")
    table = table.take(kept)
    pq.write_table(table, root / "train.parquet")
    return root, table.num_rows, int(np.unique(users[kept]).size)


def _trained(root, n, m, name, *, by="unit", adjacency="add-remove", monkeypatch=None, sampler=None):
    from trainers import dpsgd as dpsgd_mod
    from trainers.audit import audit_run
    from trainers.run import RunOptions, TrainSettings, execute_plan

    plan = build_plan(scenario(by, adjacency=adjacency, cap=3, n=n, units=f"units = {m}", batch=50,
                               extra=FEATURES))
    if sampler is not None:
        monkeypatch.setattr(dpsgd_mod, "phase_sampler", sampler)
    out = root / name
    record = execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out,
                                                                   settings=TrainSettings(embedding_dim=2), seed=3))
    return plan, record, audit_run(out, data_path=root / "train.parquet")


@pytest.mark.parametrize("adjacency", ["add-remove", "replace-one"])
def test_a_unit_sampled_plan_trains_and_audits_clean(capped, adjacency):
    root, n, m = capped
    plan, record, report = _trained(root, n, m, f"units-{adjacency}", adjacency=adjacency)
    assert report.passed, [c for c in report.checks if not c.passed]
    run = next(p for p in record.phases if p.name == "dpsgd")
    assert run.clipped_per == "unit" and run.batch_size_expected == pytest.approx(50)
    # the batch sizes count units: Binomial(M, q) with q M = 50, checked over units
    total = next(c for c in report.checks if c.name.endswith("batch sizes: total"))
    assert " units over " in total.detail and total.passed
    whole = next(c for c in report.checks if c.name == "Units kept whole")
    assert whole.passed and f"of the session's {run.steps_this_session} steps" in whole.detail
    # re-accounted on its own path: dp_accounting's PLD of the example-level mechanism over units
    again = next(c for c in report.checks if c.name == "independent re-accounting")
    assert "by dp_accounting PLD" in again.detail


def test_the_audit_catches_units_sampled_as_rows(capped, monkeypatch):
    # The planted fault: the run draws Poisson batches of rows at the units' q and clips rows one
    # by one; the noise is right, the execution is not the plan's.
    from trainers.sampling import PoissonSampler

    root, n, m = capped

    def rows_sampler(data, params, settings, randomness, **_):
        return PoissonSampler(len(data), params.sampling_rate, seed=randomness.torch_seed(),
                              device=data.label.device)

    original = __import__("trainers.dpsgd", fromlist=["DPSGDStep"]).DPSGDStep.__init__

    def as_examples(self, model, params, **kw):
        original(self, model, params, **kw)
        self.unit_rows = 1

    monkeypatch.setattr("trainers.dpsgd.DPSGDStep.__init__", as_examples)
    _, _, report = _trained(root, n, m, "units-as-rows", monkeypatch=monkeypatch, sampler=rows_sampler)
    assert not report.passed
    failed = {c.name for c in report.checks if not c.passed}
    assert any(name.endswith("batch sizes: total") for name in failed), failed


def test_the_audit_catches_a_unit_split_across_batches(capped, monkeypatch):
    # The planted fault (mutants.UNIT_SPLIT): 20 units are cut in two table entries, each sampled and clipped
    # on its own, so a unit can weigh 2C in a step or be spread over two. The batch sizes barely move (M + 20
    # entries); the blocks the trainer checked against the data's unit ids show it.
    from tests.trainers.mutants import UNIT_SPLIT

    root, n, m = capped
    UNIT_SPLIT.install(monkeypatch)
    _, _, report = _trained(root, n, m, "units-split")
    assert {c.name for c in report.checks if not c.passed} == {"Units kept whole"}
    (check,) = [c for c in report.checks if c.name == "Units kept whole"]
    assert "did not hold all the rows of one unit" in check.detail


def test_the_empirical_audits_run_a_unit_sampled_plan(capped):
    """`audit --empirical` on a unit-sampled run: the canaries are units of one row on the real unit sampler
    (it once exited 2, "data has no unit ids"); the one-run audit runs them so too."""
    from click.testing import CliRunner

    from budgetplan.cli import cli
    from trainers.empirical.one_run import dpsgd_one_run
    from trainers.randomness import Randomness
    from trainers.run import RunOptions, TrainSettings, execute_plan

    root, n, m = capped
    plan = build_plan(scenario(cap=3, n=n, units=f"units = {m}", batch=50, extra=FEATURES))
    execute_plan(plan, root / "train.parquet", RunOptions(out_dir=root / "units-empirical",
                                                          settings=TrainSettings(embedding_dim=2), seed=4))
    result = CliRunner().invoke(cli, ["audit", str(root / "units-empirical"), "--empirical", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = [e for e in json.loads(result.stdout)["empirical"] if e["name"] == "empirical dpsgd"]
    assert row["passed"] and "one canary is one unit of one row" in row["compared"]
    one = dpsgd_one_run(plan.dpsgd, canaries=20_000, randomness=Randomness(6))
    assert one["passed"] and "each a unit of one row" in one["detail"], one["detail"]


def test_the_trainer_refuses_data_with_another_unit_count(capped):
    root, n, m = capped
    with pytest.raises(InvalidParameterError, match=f"accounts M = {m + 1}"):
        _trained(root, n, m + 1, "wrong-m")
    assert not (root / "wrong-m").exists()  # refused before the run directory, or any phase, began


def test_unit_sampling_refuses_canaries_but_not_several_processes(capped):
    from budgetplan.errors import UnsupportedError
    from trainers.canary import check_canary_plan
    from trainers.ranks import check_distributable

    root, n, m = capped
    plan = build_plan(scenario(adjacency="replace-one", cap=3, n=n, units=f"units = {m}", batch=50, extra=FEATURES))
    check_distributable(plan)  # each rank holds whole units (tests/trainers/test_unit_ranks.py)
    with pytest.raises(UnsupportedError, match="whole canary units"):
        check_canary_plan(plan)


def test_the_phase_sampler_keeps_units_whole_within_the_chunk_limit():
    # max_chunk counts rows: a chunk holds whole units of K rows, never more rows than allowed,
    # and the batch's units are all there (sizes count units).
    from types import SimpleNamespace

    import torch

    from trainers.dpsgd import DPSGDSettings, phase_sampler
    from trainers.randomness import Randomness

    plan = build_plan(scenario(batch=400))
    k = plan.dpsgd.params.cap
    unit = torch.arange(M).repeat_interleave(N // M)  # every unit full: 4 rows of K = 5
    data = SimpleNamespace(unit=unit, label=torch.zeros(N))
    sampler = phase_sampler(data, plan.dpsgd.params, DPSGDSettings(max_chunk=256), Randomness(5))
    assert sampler.padded_size <= 256 and sampler.padded_size % k == 0
    batch = sampler.sample()
    assert len(batch.chunks) > 1
    real = torch.cat([idx[mask > 0] for idx, mask in batch.chunks])
    assert real.numel() == batch.rows and torch.unique(unit[real]).numel() == batch.size
