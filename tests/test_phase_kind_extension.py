"""A phase kind added from outside the package: planned, trained, recorded, stated and audited.

The kind here exists only in this test: ``base-rate``, one Gaussian release of the count of
positive labels, after which the model predicts the noisy base rate for every row. It is
registered at each layer through that layer's public registry (the plan file, the planner,
the records, the one-shot releases, the statement, plan verification, the audit's
re-accounting, the trainers' executor) and no dispatch site of budgetplan or the trainers
is edited. The registrations are undone after the module, so no other test sees the kind.

What must hold, as for a built-in kind: the plan round-trips through its file and verifies;
its statement describes the release; the run writes a record with the kind's entries and a
ledgered release, made once for all ranks over several processes (``release_once``); the
audit passes the honest run and fails a run whose release was forged, or whose noise was
planned smaller than its budget allows.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.accounting.gaussian import analytic_epsilon, analytic_sigma
from budgetplan.audit import reaccount, verify
from budgetplan.audit.reaccount import reaccounts
from budgetplan.audit.record import entry_of
from budgetplan.audit.verify import checks_phase, verify_plan
from budgetplan.errors import UnsupportedError
from budgetplan.mechanisms import GaussianRelease
from budgetplan.plan import load_plan, phases
from budgetplan.plan.phases import PhaseBase, register_phase_kind
from budgetplan.planning import planner
from budgetplan.planning.planner import build_plan, pending_guarantee, register_algorithm, with_guarantee
from budgetplan.record import ledger, records
from budgetplan.record.ledger import register_one_shot_release
from budgetplan.record.parts import ModelInfo, json_table
from budgetplan.record.records import load_record, register_phase_entries
from budgetplan.report import statement
from budgetplan.report.statement import describes, describes_entry, render_run_statement, render_statement
from budgetplan.scenario import model as scenario_model
from budgetplan.scenario.model import parse_scenario
from budgetplan.util import validate
from trainers import distributed
from trainers.audit import audit_run
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.metrics import evaluate_model
from trainers.phases import registry as executors
from trainers.phases.registry import PhaseContext, register_executor
from trainers.randomness import Randomness
from trainers.run import RunOptions, execute_plan
from trainers.session import Session

N = 3000
KIND = "base-rate"


# ---------------------------------------------------------------- the kind, one piece per layer


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseRateParams:
    noise_std: float
    sensitivity: float
    dataset_size: int
    cap: int

    def __post_init__(self) -> None:
        validate.positive("noise_std", self.noise_std)
        validate.positive("sensitivity", self.sensitivity)


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseRatePhase(PhaseBase):
    """One Gaussian release of the number of positive labels."""

    name: ClassVar[str] = KIND
    mechanism: GaussianRelease
    params: BaseRateParams

    def __post_init__(self) -> None:
        self._check_common()


def plan_base_rate(s, unit, eps, delta, plan_delta) -> list:
    sigma = analytic_sigma(epsilon=eps, delta=delta, sensitivity=1.0)
    phase = BaseRatePhase(
        mechanism=GaussianRelease(noise_std=sigma, sensitivity=1.0), target_epsilon=eps, target_delta=delta,
        method="exact", unit_accounting="tight", guarantee=pending_guarantee(s, unit),
        params=BaseRateParams(noise_std=sigma, sensitivity=1.0, dataset_size=s.dataset_size, cap=unit.cap))
    return [with_guarantee(phase, s, unit)]


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseRateRun:
    name: ClassVar[str] = KIND
    noise_std: float
    noise_draws: int
    release_sha256: str
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseRateStats:
    name: ClassVar[str] = KIND
    positives: int  # the true count: it depends on the data, so it stays in the private record


def base_rate_words(plan, i, p) -> str:
    return (f"Phase {i}, the base rate: one Gaussian release of the number of positive labels, noise standard "
            f"deviation {p.params.noise_std:.6g}; the model predicts the released rate for every row.")


def check_base_rate(plan, where, p, close, problems) -> None:
    close(f"{where}.mechanism.noise_std", p.mechanism.noise_std, p.params.noise_std)
    close(f"{where}.mechanism.sensitivity", p.mechanism.sensitivity, p.params.sensitivity)


def reaccount_base_rate(phase, record, plan):
    m, g = phase.mechanism, phase.guarantee
    other = analytic_epsilon(sigma=m.noise_std, delta=g.delta, sensitivity=m.sensitivity * plan.unit.cap)
    ran = entry_of(record, phase)
    problems = []
    if abs(other - g.epsilon) > 1e-6 * g.epsilon:
        problems.append(f"{KIND}: the analytic Gaussian gives {other:.6g}, the plan {g.epsilon:.6g}")
    if ran is None or ran.noise_std != m.noise_std or ran.noise_draws != 1:
        problems.append(f"{KIND}: the record's release is not the planned one draw of std {m.noise_std:.6g}")
    return f"{KIND}: analytic Gaussian {other:.6g}", problems


@dataclass
class ConstantModel:
    logit: float
    vocabulary = None
    compares_baseline = False
    reports_sizes = False

    def state(self) -> dict:
        return {"logit": torch.tensor(self.logit)}

    def describe(self) -> ModelInfo:
        return ModelInfo(kind="constant", config=json_table("model.config", {}), final=KIND)

    def training(self) -> dict:
        return {}

    def evaluate(self, eval_prep, eval_path) -> tuple[dict, float]:
        labels = eval_prep.data.label.cpu().numpy()
        metrics = evaluate_model(labels, np.full(len(labels), 1 / (1 + math.exp(-self.logit))))
        return {**metrics, "rows": len(labels)}, 0.0


def execute_base_rate(phase: BaseRatePhase, c: PhaseContext) -> list:
    t0 = time.perf_counter()
    positives = int(c.data.label.sum().item())

    def draw():
        return np.array([positives + c.randomness.generator().normal(0.0, phase.params.noise_std)]), {}

    noisy, note = distributed.release_once(c.collective, c.session, KIND, draw)
    rate = min(max(float(noisy[0]) / phase.params.dataset_size, 1e-6), 1 - 1e-6)
    c.final = ConstantModel(math.log(rate / (1 - rate)))
    public = BaseRateRun(noise_std=phase.params.noise_std, noise_draws=1, release_sha256=note["sha256"],
                         seconds=time.perf_counter() - t0)
    return [(public, BaseRateStats(positives=positives))]


@pytest.fixture(scope="module")
def kind():
    """The kind registered at every layer; every registry is put back as it was afterwards."""
    registries = [scenario_model._REGISTERED, phases._KINDS, planner._PLANNERS, records._RUN_KINDS,
                  records._STATS_KINDS, ledger.RELEASE_FILES, statement._DESCRIBE, statement._ENTRY_WORDS,
                  verify._PHASE_CHECKS, reaccount._REACCOUNT, executors.REGISTRY]
    saved = [r.copy() for r in registries]
    register_phase_kind(BaseRatePhase, BaseRateParams)
    register_algorithm(KIND, plan_base_rate)
    register_phase_entries(BaseRateRun, BaseRateStats)
    register_one_shot_release(KIND)
    describes(BaseRatePhase)(base_rate_words)
    describes_entry(BaseRateRun)(lambda e: f"The base rate was released once ({e.noise_draws} noise draw).")
    checks_phase(BaseRatePhase)(check_base_rate)
    reaccounts(BaseRatePhase)(reaccount_base_rate)
    register_executor(BaseRatePhase, follows=((),), torch_model=False)(execute_base_rate)
    yield
    for registry, before in zip(registries, saved):
        registry.clear()
        (registry.extend if isinstance(registry, list) else registry.update)(before)


SCENARIO = f"""name = "base-rate"
[budget]
epsilon = 1.0
delta = 1e-6
[privacy]
adjacency = "add-remove"
[data]
dataset_size = {N}
[algorithm]
name = "{KIND}"
{SYNTH_FEATURES.to_toml()}"""


@pytest.fixture(scope="module")
def run(kind, tmp_path_factory):
    root = tmp_path_factory.mktemp("base-rate")
    table = synthesize(2 * N, 500, 3)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    pq.write_table(table.slice(N, N), root / "eval.parquet")
    plan = build_plan(parse_scenario(SCENARIO))
    record = execute_plan(plan, root / "train.parquet",
                          RunOptions(out_dir=root / "run", eval_path=root / "eval.parquet", seed=5))
    return plan, record, root


def test_the_plan_accounts_the_kind_and_round_trips_through_its_file(kind, tmp_path):
    plan = build_plan(parse_scenario(SCENARIO))
    (p,) = plan.phases
    assert isinstance(p, BaseRatePhase)
    assert p.guarantee.epsilon == pytest.approx(1.0, rel=1e-6) and p.guarantee.epsilon <= 1.0 * (1 + 1e-9)
    (tmp_path / "plan.json").write_text(plan.to_json())
    again = load_plan(tmp_path / "plan.json")
    assert again == plan and again.sha256 == plan.sha256
    assert verify_plan(again).ok, verify_plan(again).problems


def test_verification_fails_a_plan_whose_noise_was_edited(kind):
    plan = build_plan(parse_scenario(SCENARIO))
    (p,) = plan.phases
    smaller = replace(p, params=replace(p.params, noise_std=p.params.noise_std / 2))
    report = verify_plan(replace(plan, phases=(smaller,)))
    assert not report.ok and any("noise_std" in problem for problem in report.problems)


def test_the_statement_describes_the_release(kind):
    text = render_statement(build_plan(parse_scenario(SCENARIO)))
    assert "the base rate: one Gaussian release of the number of positive labels" in text


def test_a_kind_without_a_statement_paragraph_gets_no_statement(kind, monkeypatch):
    monkeypatch.setattr(statement, "_DESCRIBE", {k: v for k, v in statement._DESCRIBE.items()
                                                 if k is not BaseRatePhase})
    with pytest.raises(UnsupportedError, match="BaseRatePhase"):
        render_statement(build_plan(parse_scenario(SCENARIO)))


def test_the_run_records_the_kind_and_its_release(run):
    plan, record, root = run
    (entry,) = record.phases
    assert isinstance(entry, BaseRateRun) and entry.noise_draws == 1
    on_disk = load_record(root / "run")
    assert on_disk.phases == record.phases
    (stats,) = on_disk.private_part.phases
    labels = pq.read_table(root / "train.parquet").column("label").to_numpy()
    assert stats.positives == int(labels.sum())
    assert (root / "run" / f"{KIND}_release.npy").exists()
    text = render_run_statement(plan, on_disk)
    assert "the base rate: one Gaussian release" in text and "The base rate was released once (1 noise" in text


def test_the_audit_passes_the_honest_run(run):
    _, _, root = run
    report = audit_run(root / "run")
    assert report.passed, [c for c in report.checks if not c.passed]
    assert any(KIND in c.detail for c in report.checks if c.name == "independent re-accounting")


def test_the_audit_fails_a_forged_release(run, tmp_path):
    import shutil

    _, _, root = run
    forged = tmp_path / "run"
    shutil.copytree(root / "run", forged)
    release = forged / f"{KIND}_release.npy"
    np.save(release, np.load(release) + 100.0)
    report = audit_run(forged)
    failed = {c.name for c in report.checks if not c.passed}
    assert "ledger" in failed


def test_the_audit_fails_a_plan_planned_below_its_budget(run, kind):
    """A plan whose guarantee was re-stated without re-accounting: the independent path disagrees."""
    plan, record, _ = run
    (p,) = plan.phases
    looser = replace(p, mechanism=replace(p.mechanism, noise_std=p.mechanism.noise_std / 2))
    check = reaccount.reaccount_check(record, replace(plan, phases=(looser,)))
    assert not check.passed and "analytic Gaussian" in check.detail



class _Ranks:
    """Two ranks' collective in one process: rank 0's broadcasts are recorded, and rank 1 receives them in order."""

    def __init__(self, rank: int, sent: list):
        self.rank, self.sent = rank, sent

    def broadcast_object(self, value):
        if self.rank == 0:
            self.sent.append(value)
            return value
        return self.sent.pop(0)


class _NoPersist:
    """Rank 1's session: a rank other than 0 must never persist (nor log) a release."""

    def release(self, phase, make):
        raise AssertionError(f"rank 1 persisted the {phase} release")

    def released(self, phase):
        raise AssertionError("rank 1 judged whether the release was made")


def test_the_kind_is_released_once_for_all_ranks_and_reloaded_on_resume(kind, tmp_path):
    """Through ``release_once``, as the trainers' built-in kinds: rank 0 logs, draws and persists; every
    rank runs ``make`` (its side of the collectives) while the release is fresh, and gets rank 0's."""
    plan = build_plan(parse_scenario(SCENARIO))
    calls = {0: 0, 1: 0}

    def make(rank):
        def draw():
            calls[rank] += 1
            return np.array([100.0 + rank]), {"rank": rank}
        return draw

    def both(session):
        sent: list = []
        mine = distributed.release_once(_Ranks(0, sent), session, KIND, make(0))
        theirs = distributed.release_once(_Ranks(1, sent), _NoPersist(), KIND, make(1))
        assert not sent  # rank 1 consumed every broadcast
        return mine, theirs

    first = Session(tmp_path / "run", plan, randomness=Randomness(5))
    try:
        (data0, note0), (data1, note1) = both(first)
    finally:
        first.close()
    assert calls == {0: 1, 1: 1} and data0.tolist() == data1.tolist() == [100.0] and note1 == note0
    assert note0["phase"] == KIND and note0["rank"] == 0
    assert np.load(tmp_path / "run" / f"{KIND}_release.npy").tolist() == [100.0]
    assert first.ledger.count(KIND) == 1 and len(first.ledger.events("released", KIND)) == 1

    again = Session(tmp_path / "run", plan, randomness=Randomness(5), resume=True)
    try:
        (data0, note0), (data1, _) = both(again)
        assert again.ledger.count(KIND) == 1  # no second intent: the release is reloaded, not redrawn
    finally:
        again.close()
    assert calls == {0: 1, 1: 1} and data0.tolist() == data1.tolist() == [100.0] and note0["rank"] == 0
