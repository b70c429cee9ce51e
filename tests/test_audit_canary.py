"""The one-run audit from scores: guesses, the record's fields, and ``check_one_run`` recomputing them from the plan."""

import numpy as np
import pytest

from budgetplan.audit.canary import GUESS_FRACTIONS, bound_from_scores, check_one_run, guesses
from budgetplan.audit.fdp import DIVISOR_TOLERANCE, METHOD, plan_family, refutes
from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from trainers.canary import audit_scenario
from trainers.data.synth import SYNTH_FEATURES


def test_guesses_count_both_tails():
    scores = np.array([0.1, 0.9, 0.5, 0.2, 0.8])
    bits = np.array([0, 1, 0, 1, 0])
    assert guesses(scores, bits, 2, 2) == (4, 2)  # top: 0.9 (1, right), 0.8 (0); bottom: 0.1 (0, right), 0.2 (1)
    assert guesses(scores, bits, 0, 1) == (1, 1)
    with pytest.raises(InvalidParameterError, match="at most"):
        guesses(scores, bits, 3, 3)
    with pytest.raises(InvalidParameterError, match="finite"):
        guesses(np.array([np.nan, 1, 2, 3, 4]), bits, 1, 1)



@pytest.fixture(scope="module")
def plan():
    return build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=1e-8, dataset_size=20_000, batch_size=10_000,
                                                    epochs=5, clipping_norm=0.1, spec=SYNTH_FEATURES)))


def ideal(mu: float, m: int = 5000, seed: int = 0):
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, m)
    return rng.normal(size=m) + mu * bits, bits


def test_record_fields_and_bonferroni(plan):
    fam = plan_family(plan)
    res = bound_from_scores(*ideal(1.434), family=fam)  # the noise halved on ideal canaries
    assert res["method"] == METHOD and res["canaries"] == 5000 and res["fractions"] == list(GUESS_FRACTIONS)
    assert res["level"] == pytest.approx(1 - 0.05 / 7) and res["delta"] == 1e-8
    assert [c["k"] for c in res["counts"]] == [25, 50, 100, 250, 500, 1000, 2500]
    assert {"guesses": res["guesses"], "correct": res["correct"], "k": res["k_pos"]} in res["counts"]
    assert res["refutes_plan"] and res["noise_divisor"] > 1
    assert res["epsilon_lower_bound"] == pytest.approx(fam.epsilon(res["noise_divisor"]))
    assert res["epsilon_lower_bound"] > plan.guarantee.epsilon
    # the stated counts refute the stated divisor at the per-fraction level
    assert refutes(fam.curve(res["noise_divisor"]), 5000, res["guesses"], res["correct"], 1 - res["level"])


def test_honest_ideal_canaries_stay_below_the_plan(plan):
    res = bound_from_scores(*ideal(0.717), family=plan_family(plan))
    assert not res["refutes_plan"] and 0 < res["noise_divisor"] < 1
    assert 0 < res["epsilon_lower_bound"] < plan.guarantee.epsilon


def test_chance_scores_give_zero(plan):
    rng = np.random.default_rng(3)
    res = bound_from_scores(rng.normal(size=2000), rng.integers(0, 2, 2000), family=plan_family(plan))
    assert res["noise_divisor"] == 0.0 and res["epsilon_lower_bound"] == 0.0 and not res["refutes_plan"]
    assert check_one_run(res, plan)[0]


def test_check_recomputes_from_the_plan_and_fails_a_refuted_curve(plan):
    halved = bound_from_scores(*ideal(1.434), family=plan_family(plan))
    ok, detail = check_one_run(halved, plan)
    assert not ok and "refute the plan's trade-off curve" in detail
    honest = bound_from_scores(*ideal(0.717), family=plan_family(plan))
    ok, detail = check_one_run(honest, plan)
    assert ok and f"{honest['correct']:,} of {honest['guesses']:,} guesses" in detail


@pytest.mark.parametrize("doctor, words", [
    (lambda r: {**r, "noise_divisor": r["noise_divisor"] * (1 + 3 * DIVISOR_TOLERANCE)}, "noise divisor"),
    (lambda r: {**r, "noise_divisor": r["noise_divisor"] / 1.5}, "noise divisor"),
    (lambda r: {**r, "epsilon_lower_bound": r["epsilon_lower_bound"] * 0.9}, "recorded epsilon"),
    (lambda r: {**r, "counts": [{**c, "correct": c["guesses"] // 2} for c in r["counts"]],
                "correct": r["guesses"] // 2}, "noise divisor"),
    (lambda r: {**r, "counts": r["counts"][:-1]}, "one entry per fraction"),
    (lambda r: {**r, "counts": [{**c, "k": c["k"] + 1} for c in r["counts"]]}, "guesses"),
    (lambda r: {**r, "correct": r["correct"] - 1}, "one fraction's counts"),
    (lambda r: {**r, "level": 0.99}, "confidence split"),
    (lambda r: {**r, "method": "made up"}, "method"),
    (lambda r: {k: v for k, v in r.items() if k != "counts"}, "malformed"),
])
def test_check_catches_a_doctored_record(plan, doctor, words):
    res = bound_from_scores(*ideal(0.717), family=plan_family(plan))
    ok, detail = check_one_run(doctor(res), plan)
    assert not ok and words in detail, detail


def test_a_legacy_record_is_checked_by_steinke_s_bound(plan):
    from budgetplan.audit.steinke import epsilon_lower_bound

    level = 1 - 0.05 / 7
    legacy = {"canaries": 5000, "guesses": 50, "correct": 48, "level": level, "confidence": 0.95,
              "epsilon_lower_bound": epsilon_lower_bound(5000, 50, 48, delta=1e-8, confidence=level)}
    ok, detail = check_one_run(legacy, plan)
    assert ok and "Steinke" in detail


def test_bad_arguments_are_refused(plan):
    fam = plan_family(plan)
    scores, bits = ideal(1.0, 100)
    with pytest.raises(InvalidParameterError, match="fractions"):
        bound_from_scores(scores, bits, family=fam, fractions=(0.6,))
    with pytest.raises(InvalidParameterError, match="confidence"):
        bound_from_scores(scores, bits, family=fam, confidence=1.0)
    with pytest.raises(InvalidParameterError, match="at least 2"):
        bound_from_scores(scores[:1], bits[:1], family=fam)
