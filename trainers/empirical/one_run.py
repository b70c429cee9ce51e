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
from dataclasses import replace

import numpy as np
import torch

from budgetplan.accounting import DEFAULT_DISCRETIZATION
from budgetplan.audit.canary import DEFAULT_CONFIDENCE, GUESS_FRACTIONS, bound_from_scores
from budgetplan.audit.fdp import MechanismFamily
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.plan.phases import DPSGDPhase
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate
from trainers import dpsgd
from trainers.empirical.canaries import CanaryModel, CanaryObserver, canary_data
from trainers.empirical.stats import default_randomness

__all__ = ["ONE_RUN_CANARIES", "ONE_RUN_STEPS", "dpsgd_one_run", "one_run_rows"]

ONE_RUN_CANARIES = 1_000_000  # at 5,000 even ideal canaries cannot show the noise halved (benchmarks/one_run_audit.py)
ONE_RUN_STEPS = 200           # longer phases are audited on their first steps, against those steps' epsilon


class _SignObserver(CanaryObserver):
    """The canary observer with each coordinate's statistic the log-likelihood ratio of label 1 to label 0."""

    def add(self, x: torch.Tensor) -> None:
        self.step_sumsq.append(0.0)  # counts the steps observed
        a = x.mul_(self._scale)
        up = torch.logaddexp(a + self._shift, self._stay)     # ln(1 - q + q e^{(2x - 1) / 2 sigma^2}): label 0
        down = torch.logaddexp(self._shift - a, self._stay)   # ln(1 - q + q e^{(-2x - 1) / 2 sigma^2}): label 1
        self.llr.add_(down - up)


def dpsgd_one_run(phase, *, canaries: int = ONE_RUN_CANARIES, steps: int | None = None, randomness=None,
                  confidence: float = DEFAULT_CONFIDENCE, fractions: tuple[float, ...] = GUESS_FRACTIONS,
                  device="cpu") -> dict:
    """The one-run audit of a plan's DP-SGD ``phase`` on the installed ``run_dpsgd``: one row for the audit.

    Args:
        phase: the plan's ``DPSGDPhase`` (compared with its replace-one epsilon at its delta;
            when fewer steps are run, with the epsilon of those steps).
        canaries: m, the canary examples (each its own coordinate and secret label).
        steps: steps run (default all, at most ``ONE_RUN_STEPS``).
        randomness: a ``Randomness`` for the coins, the sampler and the noise (default a
            fresh CSPRNG one).

    Returns:
        {"name": "one-run dpsgd", "passed", "epsilon_lower_bound", "planned_epsilon", "compared",
        "failing", "detail", "seconds", "steps", and the ``bound_from_scores`` fields}.
    """
    t0 = time.perf_counter()
    params = phase.params
    sigma, q, c = params.noise_multiplier, params.sampling_rate, params.clipping_norm
    m = validate.positive_int("canaries", canaries)
    t = validate.positive_int("steps", steps if steps is not None else min(params.steps, ONE_RUN_STEPS))
    delta = phase.guarantee.delta
    family = MechanismFamily(PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=t), Adjacency.REPLACE_ONE,
                             PrivacyUnit.example(), delta, DEFAULT_DISCRETIZATION,
                             description=f"the phase's first {t} steps (replace-one) with the noise divided by s")
    planned = phase.guarantee.epsilon if t == params.steps else family.epsilon(1.0)
    rnd = default_randomness(randomness)
    bits = rnd.bernoulli(0.5, m).astype(np.int8)
    device = torch.device(device)
    model = CanaryModel(m, scale=8.0 * c).to(device)
    data = replace(canary_data(m, m, device), label=torch.as_tensor(bits, dtype=torch.float32, device=device))
    obs = _SignObserver(model.table.weight, m, q=q, c=c, sigma=sigma, expected=q * m)
    run_par = replace(params, dataset_size=m, steps=t, sampling="poisson", max_batch_size=None)
    dpsgd.run_dpsgd(model, data, run_par, trainable=[model.table.weight], randomness=rnd,
                    settings=dpsgd.DPSGDSettings(optimizer="sgd", lr=1.0), checkpoint=obs.checkpoint,
                    checkpoint_every=1)
    if obs.lr is None:  # one step: no checkpoint ran
        obs.lr = 1.0
    obs.observe()
    res = bound_from_scores(obs.llr.double().cpu().numpy(), bits, family=family, confidence=confidence,
                            fractions=fractions)
    eps = res["epsilon_lower_bound"]
    seen = len(obs.step_sumsq)
    failing = (["plan's trade-off curve"] if res["refutes_plan"] else []) + ([] if seen == t else
                                                                            ["every step observed"])
    steps_text = f"all {t} steps" if t == params.steps else f"the first {t} of {params.steps} steps"
    detail = (f"{res['correct']} of {res['guesses']} guesses right on {m} gradient canaries ({steps_text}, "
              f"{seen} observed; q = {q:g}, sigma = {sigma:g}): epsilon >= {eps:.4g} at confidence {confidence:g} "
              f"(the steps with sigma / {res['noise_divisor']:.3g}), against the phase's replace-one {planned:.4g}"
              + (": the guesses refute the phase's trade-off curve" if res["refutes_plan"] else ""))
    return {"name": "one-run dpsgd", "passed": not failing, "epsilon_lower_bound": eps, "planned_epsilon": planned,
            "compared": f"the phase's replace-one epsilon of {steps_text}; one canary is one row",
            "failing": failing, "detail": detail, "seconds": time.perf_counter() - t0, "steps": t, **res}


def one_run_rows(plan, *, randomness=None, confidence: float = DEFAULT_CONFIDENCE) -> list[dict]:
    """One row per Poisson DP-SGD phase of ``plan`` (a truncated phase's batches are not audited so)."""
    return [dpsgd_one_run(p, randomness=randomness, confidence=confidence) for p in plan.phases
            if isinstance(p, DPSGDPhase) and p.params.sampling == "poisson"]
