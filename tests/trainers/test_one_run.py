"""The DP-SGD step audited in one run with a million gradient canaries: the noise halved is caught.

At the audit plan of epsilon 4 (``trainers.canary.audit_scenario``: q = 0.5, 10 steps, sigma
4.39) the honest step's guesses refute the steps with the noise divided by 0.70 (epsilon
2.72) and the noise-halved one's by 1.45 (5.99), seed 0: the plan's own curve is refuted
only for the mutant (benchmarks/one_run_audit.py has more seeds).
"""

import pytest

from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from tests.trainers.mutants import NOISE_HALVED
from trainers.canary import audit_scenario
from trainers.data.synth import SYNTH_FEATURES
from trainers.empirical.one_run import dpsgd_one_run
from trainers.randomness import Randomness


@pytest.fixture(scope="module")
def phase():
    plan = build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=1e-8, dataset_size=20_000, batch_size=10_000,
                                                    epochs=5, clipping_norm=0.1, spec=SYNTH_FEATURES)))
    return plan.dpsgd


def test_honest_step_stays_below_the_plan(phase):
    row = dpsgd_one_run(phase, randomness=Randomness(0))
    assert row["passed"] and 1.0 < row["epsilon_lower_bound"] < phase.guarantee.epsilon, row["detail"]
    assert not row["refutes_plan"] and 0.5 < row["noise_divisor"] < 1
    assert row["planned_epsilon"] == phase.guarantee.epsilon and row["canaries"] == 1_000_000


def test_noise_halved_is_caught(phase, monkeypatch):
    NOISE_HALVED.install(monkeypatch)
    row = dpsgd_one_run(phase, randomness=Randomness(0))
    assert not row["passed"] and row["failing"] == ["plan's trade-off curve"], row["detail"]
    assert row["refutes_plan"] and row["noise_divisor"] > 1.2
    assert row["epsilon_lower_bound"] > phase.guarantee.epsilon
