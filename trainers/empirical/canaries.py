"""DP-SGD audited with canaries on the real ``run_dpsgd``, observed after every step.

The real ``trainers.dpsgd.run_dpsgd`` (looked up at call time, so an edited loop or step
is what gets measured) runs the plan's sigma, q and C for the plan's T steps on a canary
dataset of R examples. Example r looks up row r of an ``nn.Embedding(R + A, 1)`` and its
logit is scale (e_r - e_r.detach()): always 0, with a gradient of norm 4C whatever the
parameters, which the real clipping cuts to C on coordinate r (less its margin against
float rounding, 64 float32 epsilons: 7.6e-6 relative). Rows R..R+A-1 are read by no
example: A absent canaries. One canary present against one absent is the
add-remove relation; every coordinate is an independent trial, because each canary's
gradient lives on its own coordinate and its Poisson inclusions and noise are independent
of the others'.

Every intermediate model is a release the guarantee covers, so the audit reads the table
after every step (``run_dpsgd``'s checkpoint callback, then the returned model) and
recovers each step's noisy gradient from the change: optimisation is post-processing, so
plain SGD is used and its momentum undone exactly (g_t = v_t - mu v_{t-1}, v_t the weight
change over the learning rate). In units of C times the expected batch q R, coordinate r
then moves by x_t = b_t + sigma z_t per step: b_t ~ Bernoulli(q) for a canary present,
0 for one absent, z_t ~ N(0, 1).

Evidence (compare Nasr et al., arXiv:2302.07956, who audit DP-SGD with gradient canaries
observed at every step; the one-run audits of Andrew et al., arXiv:2302.03098, and
Steinke, Nasr and Jagielski, arXiv:2305.08846, do without independent trials):

- the lower bound: each coordinate's Neyman-Pearson statistic, the log-likelihood ratio of
  present against absent sum_t ln(1 - q + q exp((2 x_t - 1) / (2 sigma^2))), is thresholded
  (threshold chosen on one half, bound on the other). It is compared with the add-remove
  epsilon of the same sigma, q and T, which is at most the plan's replace-one epsilon
  (sensitivity 2C) for the same noise: the stricter comparison.
- mechanism checks, false-alarm rate ``ALPHA`` each: every step observed; the absent
  coordinates' noise has std sigma at every step (chi-square per step and pooled); it is
  independent across steps (an F test of its sum over steps against the rest); present
  canaries move by q per step on average and absent ones by 0 (clipping to C, sampling at q).
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy import stats

from budgetplan.accounting import account
from budgetplan.errors import UnsupportedError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.util import validate
from trainers.empirical.execution import (
    EPOCH_SAMPLING,
    CanaryModel,
    CanaryObserver,
    canary_data,
    canary_params,
    observed_run,
    truncation_note,
)
from trainers.empirical.stats import (
    ALPHA,
    DEFAULT_CONFIDENCE,
    Result,
    alpha_of,
    check,
    default_randomness,
    make_result,
    split_threshold_bound,
    two_sided_chi2,
)

__all__ = ["dpsgd_lower_bound", "canary_counts", "CanaryModel", "canary_data", "CanaryObserver"]

MAX_PRESENT = 200_000       # canaries present (examples): the README plan's N
MAX_ABSENT = 2_000_000      # canaries absent (table rows no example reads)
# Coordinates x steps per audit (147 steps x 2.2M coordinates, the README plan when it was set;
# 500 steps x 660,000 today): plans with more steps get fewer canaries, so the cost stays about the same.
WORK = 330_000_000
MAX_STEPS = 2_000           # longer plans are audited on their first steps (stated in the result)


def canary_counts(dataset_size: int, steps: int) -> tuple[int, int, int]:
    """(present, absent, steps audited) for a plan of N = ``dataset_size`` rows and T = ``steps``."""
    t = min(int(steps), MAX_STEPS)
    budget = WORK // t
    present = min(int(dataset_size), MAX_PRESENT, max(budget // 2, 1000))
    absent = min(MAX_ABSENT, max(budget - present, present))
    return present, absent, t


def dpsgd_lower_bound(params, *, delta: float, epsilon: float | None = None, present: int | None = None,
                      absent: int | None = None, steps: int | None = None, randomness=None,
                      confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA, progress: str | None = None,
                      device="cpu", processes: int = 1) -> Result:
    """Audit the DP-SGD phase with canaries on the real ``run_dpsgd`` (see the module docstring).

    Args:
        params: the plan's ``DPSGDParams``, run as the plan executes (``execution``): Poisson
            (a truncated plan run as Poisson at its q, uncut, as ``compared`` says), units,
            allocation or shuffled batches.
        delta: the plan's delta.
        epsilon: the epsilon to compare with; default budgetplan's PLD add-remove epsilon of
            the audited steps (Poisson). Allocation and shuffled batches must be given one
            (``audit_plan`` gives the phase's planned epsilon).
        present, absent, steps: canaries present and absent, steps run; default
            ``canary_counts`` (the README plan: 200,000, 460,000 and all 500 steps).
        randomness: a ``Randomness`` (default: a fresh CSPRNG one); ``run_dpsgd`` seeds its
            sampler and noise from it as in a real run.
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of each mechanism check.
        progress: a progress-bar label, or None.
        device: where the canaries train.
        processes: the processes the run trained with: the canaries are run over as many gloo
            ranks (on the CPU), each sampling its block of them.
    """
    t0 = time.perf_counter()
    sigma = params.noise_multiplier
    delta = validate.open_unit("delta", delta)
    r_def, a_def, t_def = canary_counts(params.dataset_size, params.steps)
    r = validate.positive_int("present", present if present is not None else r_def)
    a = validate.positive_int("absent", absent if absent is not None else a_def)
    t = validate.positive_int("steps", steps if steps is not None else t_def)
    run_par, r = canary_params(params, r, t)
    q = run_par.sampling_rate  # each canary's inclusion rate per step
    if epsilon is None and params.sampling in EPOCH_SAMPLING:
        raise UnsupportedError(f"{params.sampling} batches are compared with the phase's planned epsilon: pass it")
    planned = (account(PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=t), delta=delta,
                       adjacency="add-remove", method="pld").epsilon if epsilon is None
               else validate.non_negative("epsilon", epsilon))
    obs = observed_run(run_par, present=r, absent=a, randomness=default_randomness(randomness),
                       processes=processes, progress=progress, device=device)

    seen = len(obs["step_sumsq"])
    executed = obs["executed"]
    checks = [check("every step observed", 1.0 if seen == t == executed else 0.0,
                    f"{seen} updates observed, {executed} executed, {t} run", alpha)]
    s2 = sigma ** 2
    per_step = np.asarray(obs["step_sumsq"]) / s2
    p_steps = np.array([two_sided_chi2(s, a) for s in per_step])
    p_pooled = two_sided_chi2(per_step.sum(), a * seen)
    measured = sigma * np.sqrt(per_step / a)
    checks.append(check(
        "noise std per step", min(1.0, 2 * min(seen * p_steps.min(), p_pooled)),
        f"noise multiplier measured {measured.min():.5g} to {measured.max():.5g} over {seen} steps, "
        f"{sigma * math.sqrt(per_step.sum() / (a * seen)):.6g} pooled, against the planned {sigma:.6g} "
        f"(chi-square per step, Bonferroni over steps, and pooled)", alpha))
    if seen >= 2:
        # the noise summed over steps, against the rest of its variation: for each absent coordinate,
        # the projection of its T per-step values on the all-ones direction and the T - 1 orthogonal ones;
        # independent N(0, s^2) steps make P / A over Q / (A (T - 1)) exactly F(A, A (T - 1)), whatever s
        along = float(np.sum(np.square(obs["absent_sum"]))) / seen
        across = float(np.sum(obs["step_sumsq"])) - along
        f = (along / a) / (across / (a * (seen - 1))) if across > 0 else math.inf  # no noise at all: fails
        p_f = min(1.0, 2 * min(stats.f.cdf(f, a, a * (seen - 1)), stats.f.sf(f, a, a * (seen - 1))))
        checks.append(check("noise independent across steps", p_f,
                            f"variance of the noise summed over the {seen} steps {f:.5g} x the sum of its per-step "
                            "variances (1 when independent; F test)", alpha))
    m_p, m_a = obs["present_total"] / (seen * r), float(np.sum(obs["absent_sum"])) / (seen * a)
    z_p = (m_p - q) / math.sqrt((q * (1 - q) + s2) / (seen * r))
    z_a = m_a / math.sqrt(s2 / (seen * a))
    checks.append(check("canary gradient is C at rate q", min(1.0, 4 * stats.norm.sf(max(abs(z_p), abs(z_a)))),
                        f"a present canary moves {m_p / q:.5g} C per inclusion on average (z = {z_p:.3g}), an absent "
                        f"one {m_a:.3g} C per step (z = {z_a:.3g})", alpha))

    llr = obs["llr"]
    split = split_threshold_bound(llr[:r], llr[r:], delta=delta, alpha=alpha_of(confidence),
                                  unit="canary's log-likelihood ratio")
    split.pop("absent_evaluated")
    split["event"] += f"; {t} steps at q = {q:g}, sigma = {sigma:g}"
    steps_text = f"all {t} steps" if t == params.steps else f"the first {t} of {params.steps} steps"
    how = _execution(params, processes)
    compared = (f"add-remove epsilon of {steps_text}, PLD; one canary is one {how}" if epsilon is None or
                params.sampling not in EPOCH_SAMPLING else
                f"the phase's planned epsilon ({steps_text} audited; one canary is one {how}, in each epoch once)"
                ) + truncation_note(params)
    return make_result(mechanism=f"{'poisson' if params.sampling not in EPOCH_SAMPLING else params.sampling}-dpsgd",
                       planned_epsilon=planned, compared=compared,
                       phase_epsilon=None, delta=delta, confidence=confidence, samples=r, absent=a, checks=checks,
                       t0=t0, **split)


def _execution(params, processes: int) -> str:
    """What one canary is, and how the run executed it, in words."""
    what = "unit of one row" if params.samples_units else "example"
    how = {"allocation": ", randomly allocated", "shuffle": ", in shuffled batches"}.get(params.sampling, "")
    return what + how + (f", over {processes} processes" if processes > 1 else "")
