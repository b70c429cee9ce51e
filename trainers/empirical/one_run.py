"""The DP-SGD step audited in one run with replace-one gradient canaries, white box.

An auditor who sees every intermediate model, each a release the guarantee covers, can use
a million canaries where a trained model holds a few thousand (``trainers.canary``). The
real ``trainers.dpsgd.run_dpsgd`` (looked up at call time) runs the plan's sigma, q and C
for its first steps on m canary examples (``canaries.CanaryModel``: example i's gradient
is 4C on its own coordinate, clipped to C), each labelled by a secret fair coin S_i. At
logit 0 the label decides the gradient's sign, +C for label 0 and -C for label 1: 2C
apart, the replace-one sensitivity the plan accounts. Coordinate i moves by x_t = (1 -
2 S_i) b_t + sigma z_t per step (in C per expected batch), b_t ~ Bernoulli(q); canary i's
score is the log-likelihood ratio of S_i = 1 against S_i = 0 over the steps. The k highest
are guessed 1, the k lowest 0, and the counts test the steps' own trade-off curve
(``budgetplan.audit.canary``, the f-DP one-run analysis of arXiv:2410.22235 in the game of
arXiv:2305.08846); the bound is the epsilon of those steps with the noise divided by the
largest refuted divisor. The test needs no independence between the canaries.
"""

from __future__ import annotations

import time

import numpy as np

from budgetplan.accounting import DEFAULT_DISCRETIZATION
from budgetplan.audit.canary import DEFAULT_CONFIDENCE, GUESS_FRACTIONS, bound_from_scores
from budgetplan.audit.fdp import MechanismFamily
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.plan.phases import DPSGDPhase
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate
from trainers.empirical.execution import EPOCH_SAMPLING, canary_params, observed_run, truncation_note
from trainers.empirical.stats import default_randomness

__all__ = ["ONE_RUN_CANARIES", "ONE_RUN_STEPS", "dpsgd_one_run", "one_run_rows"]

ONE_RUN_CANARIES = 1_000_000  # at 5,000 even ideal canaries cannot show the noise halved (benchmarks/one_run_audit.py)
ONE_RUN_STEPS = 200           # longer phases are audited on their first steps, against those steps' epsilon


def dpsgd_one_run(phase, *, canaries: int = ONE_RUN_CANARIES, steps: int | None = None, randomness=None,
                  confidence: float = DEFAULT_CONFIDENCE, fractions: tuple[float, ...] = GUESS_FRACTIONS,
                  device="cpu", processes: int = 1) -> dict:
    """The one-run audit of a plan's DP-SGD ``phase`` on the installed ``run_dpsgd``: one row for the audit.

    Args:
        phase: the plan's ``DPSGDPhase`` (compared with its replace-one epsilon at its delta;
            when fewer steps are run, with the epsilon of those steps).
        canaries: m, the canary examples (each its own coordinate and secret label).
        steps: steps run (default all, at most ``ONE_RUN_STEPS``).
        randomness: a ``Randomness`` for the coins, the sampler and the noise (default a
            fresh CSPRNG one).
        processes: run the canaries over this many gloo ranks, as the run trained
            (``execution``); the plan's units, allocation or shuffled batches are run as planned.

    Returns:
        {"name": "one-run dpsgd", "passed", "epsilon_lower_bound", "planned_epsilon", "compared",
        "failing", "detail", "seconds", "steps", and the ``bound_from_scores`` fields}.
    """
    t0 = time.perf_counter()
    params = phase.params
    m = validate.positive_int("canaries", canaries)
    t = validate.positive_int("steps", steps if steps is not None else min(params.steps, ONE_RUN_STEPS))
    run_par, m = canary_params(params, m, t)
    sigma, q = params.noise_multiplier, run_par.sampling_rate  # q: each canary's inclusion rate per step
    delta = phase.guarantee.delta
    # Poisson steps at q: the plan's own curve for Poisson sampling of examples or units (one_run_rows refuses
    # allocation and shuffled batches, which have no replace-one curve here)
    family = MechanismFamily(PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=t), Adjacency.REPLACE_ONE,
                             PrivacyUnit.example(), delta, DEFAULT_DISCRETIZATION,
                             description=f"the phase's first {t} steps (replace-one) with the noise divided by s")
    planned = phase.guarantee.epsilon if t == params.steps else family.epsilon(1.0)
    rnd = default_randomness(randomness)
    bits = rnd.bernoulli(0.5, m).astype(np.int8)
    obs = observed_run(run_par, present=m, absent=0, labels=bits, signs=True, randomness=rnd, processes=processes,
                       device=device)
    res = bound_from_scores(obs["llr"], bits, family=family, confidence=confidence, fractions=fractions)
    eps = res["epsilon_lower_bound"]
    seen = len(obs["step_sumsq"])
    failing = (["plan's trade-off curve"] if res["refutes_plan"] else []) + ([] if seen == t == obs["executed"]
                                                                            else ["every step observed"])
    steps_text = f"all {t} steps" if t == params.steps else f"the first {t} of {params.steps} steps"
    how = {"allocation": "randomly allocated, ", "shuffle": "in shuffled batches, "}.get(params.sampling, "") + (
        "each a unit of one row, " if params.samples_units else "") + (
        f"over {processes} processes, " if processes > 1 else "")
    detail = (f"{res['correct']} of {res['guesses']} guesses right on {m} gradient canaries ({how}{steps_text}, "
              f"{seen} observed; q = {q:g}, sigma = {sigma:g}): epsilon >= {eps:.4g} at confidence {confidence:g} "
              f"(the steps with sigma / {res['noise_divisor']:.3g}), against the phase's replace-one {planned:.4g}"
              + (": the guesses refute the phase's trade-off curve" if res["refutes_plan"] else "")
              + truncation_note(params))
    return {"name": "one-run dpsgd", "passed": not failing, "epsilon_lower_bound": eps, "planned_epsilon": planned,
            "compared": f"the phase's replace-one epsilon of {steps_text}; one canary is one row"
                        + truncation_note(params),
            "failing": failing, "detail": detail, "seconds": time.perf_counter() - t0, "steps": t, **res}


def one_run_rows(plan, *, randomness=None, confidence: float = DEFAULT_CONFIDENCE, processes: int = 1) -> list[dict]:
    """One row per DP-SGD phase of ``plan``: Poisson (a truncated Poisson phase run as Poisson at its q, uncut, as
    its row says), unit-sampled, allocated or shuffled, run over ``processes`` ranks as the run was."""
    rows = []
    for p in plan.phases:
        if not isinstance(p, DPSGDPhase):
            continue
        rows.append(_refused(p) if p.params.sampling in EPOCH_SAMPLING else
                    dpsgd_one_run(p, randomness=randomness, confidence=confidence, processes=processes))
    return rows


def _refused(phase) -> dict:
    """The row of a phase the one-run audit has no trade-off curve for: a failing check that says so."""
    what = {"allocation": "random allocation", "shuffle": "shuffled batches"}[phase.params.sampling]
    return {"name": "one-run dpsgd", "passed": False, "epsilon_lower_bound": 0.0,
            "planned_epsilon": float(phase.guarantee.epsilon), "failing": [f"one-run curve of {what}"],
            "detail": f"the one-run audit tests replace-one sign canaries against the phase's trade-off curve, and "
                      f"budgetplan has no replace-one curve of {what} to test them against: not audited in one run "
                      "(audit --empirical runs this phase's canary audit on the real sampler)",
            "seconds": 0.0, "steps": 0}
