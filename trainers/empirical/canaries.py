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
from dataclasses import replace

import numpy as np
import torch
from scipy import stats
from torch import nn

from budgetplan.accounting import account
from budgetplan.errors import UnsupportedError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.util import validate
from trainers import dpsgd
from trainers.data.encoded import EncodedData
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
# 250 steps x 1.32M today): plans with more steps get fewer canaries, so the cost stays about the same.
WORK = 330_000_000
MAX_STEPS = 2_000           # longer plans are audited on their first steps (stated in the result)


def canary_counts(dataset_size: int, steps: int) -> tuple[int, int, int]:
    """(present, absent, steps audited) for a plan of N = ``dataset_size`` rows and T = ``steps``."""
    t = min(int(steps), MAX_STEPS)
    budget = WORK // t
    present = min(int(dataset_size), MAX_PRESENT, max(budget // 2, 1000))
    absent = min(MAX_ABSENT, max(budget - present, present))
    return present, absent, t


class CanaryModel(nn.Module):
    """logit_i = scale (e_i - e_i.detach()), e_i = table[id_i]: value 0, gradient scale / 2 on row id_i.

    At logit 0 with label 0 the BCE's derivative is 1/2, so every step, whatever the table
    holds, example i's gradient is scale / 2 = 4C on its own row: clipping cuts it to C.
    """

    def __init__(self, rows: int, scale: float):
        super().__init__()
        self.table = nn.Embedding(rows, 1)
        nn.init.zeros_(self.table.weight)
        self.scale = scale

    def forward(self, ns_cat, ns_num, s_cat, s_num):
        e = self.table(ns_cat[:, 0])[:, 0]
        return (e - e.detach()) * self.scale


def canary_data(rows: int, vocab: int, device):
    return EncodedData(
        ns_cat=torch.arange(rows, device=device)[:, None], ns_num=torch.zeros(rows, 0, device=device),
        s_cat=torch.zeros(rows, 0, dtype=torch.int64, device=device), s_num=torch.zeros(rows, 0, device=device),
        label=torch.zeros(rows, device=device), unit=None, ns_vocab=vocab, s_vocab=1)


class CanaryObserver:
    """Reads the table after each step; keeps each coordinate's statistic and the checks' sums."""

    def __init__(self, weight: torch.Tensor, present: int, *, q: float, c: float, sigma: float, expected: float):
        self.w, self.present = weight, present
        self.prev = weight.detach()[:, 0].clone()
        self.v_prev = torch.zeros_like(self.prev)
        self.to_x = expected / c  # gradient -> units of C per step
        self.sigma, self.q = sigma, q
        self.llr = torch.zeros_like(self.prev)
        # float32 sums of 147 N(0, sigma^2) terms: rounding ~1e-7 relative, far below the tests' resolution
        self.absent_sum = torch.zeros(self.prev.numel() - present, dtype=self.prev.dtype, device=self.prev.device)
        self.step_sumsq, self.present_total = [], 0.0
        self.momentum, self.lr = 0.0, None
        s2 = sigma * sigma
        self._scale, self._shift = 1.0 / s2, math.log(q) - 0.5 / s2
        self._stay = torch.tensor(math.log1p(-q), dtype=self.prev.dtype, device=self.prev.device)

    def checkpoint(self, step_done, optimizer_state) -> None:
        group = optimizer_state["optimizer"]["param_groups"][0]
        if group.get("nesterov") or group.get("dampening", 0) or group.get("weight_decay", 0):
            raise UnsupportedError("the canary audit undoes plain or heavy-ball SGD momentum only, got "
                                   f"{ {k: group.get(k) for k in ('nesterov', 'dampening', 'weight_decay')} }")
        self.momentum, self.lr = float(group["momentum"]), float(group["lr"])
        self.observe()

    def observe(self) -> None:
        """Recover the last step's noisy gradient from the weights, in units of C per step; add it."""
        cur = self.w.detach()[:, 0]
        v = torch.sub(self.prev, cur)
        if self.lr != 1.0:
            v.div_(self.lr)
        x = torch.sub(v, self.v_prev, alpha=self.momentum).mul_(self.to_x)
        self.prev.copy_(cur)
        self.v_prev = v
        self.add(x)

    def add(self, x: torch.Tensor) -> None:
        """Fold one step's x (consumed: overwritten in place) into the statistic and the checks' sums."""
        xa = x[self.present:]
        self.step_sumsq.append(float(torch.linalg.vector_norm(xa, dtype=torch.float64)) ** 2)
        self.present_total += float(x[:self.present].sum(dtype=torch.float64))
        self.absent_sum.add_(xa)
        a = x.mul_(self._scale).add_(self._shift)
        self.llr.add_(torch.logaddexp(a, self._stay, out=a))

    @property
    def absent_total(self) -> float:
        return float(self.absent_sum.sum(dtype=torch.float64))


def dpsgd_lower_bound(params, *, delta: float, epsilon: float | None = None, present: int | None = None,
                      absent: int | None = None, steps: int | None = None, randomness=None,
                      confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA, progress: str | None = None,
                      device="cpu") -> Result:
    """Audit the DP-SGD phase with canaries on the real ``run_dpsgd`` (see the module docstring).

    Args:
        params: the plan's ``DPSGDParams`` (its sampling is taken as Poisson: a truncated
            plan's batches are not audited as such).
        delta: the plan's delta.
        epsilon: the epsilon to compare with; default budgetplan's PLD add-remove epsilon of
            the audited steps.
        present, absent, steps: canaries present and absent, steps run; default
            ``canary_counts`` (the README plan: 200,000, 1,120,000 and all 250 steps).
        randomness: a ``Randomness`` (default: a fresh CSPRNG one); ``run_dpsgd`` seeds its
            sampler and noise from it as in a real run.
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of each mechanism check.
        progress: a progress-bar label, or None.
        device: where the canaries train.
    """
    t0 = time.perf_counter()
    sigma, q, c = params.noise_multiplier, params.sampling_rate, params.clipping_norm
    delta = validate.open_unit("delta", delta)
    r_def, a_def, t_def = canary_counts(params.dataset_size, params.steps)
    r = validate.positive_int("present", present if present is not None else r_def)
    a = validate.positive_int("absent", absent if absent is not None else a_def)
    t = validate.positive_int("steps", steps if steps is not None else t_def)
    planned = (account(PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=t), delta=delta,
                       adjacency="add-remove", method="pld").epsilon if epsilon is None
               else validate.non_negative("epsilon", epsilon))
    rnd = default_randomness(randomness)
    device = torch.device(device)

    model = CanaryModel(r + a, scale=8.0 * c).to(device)
    weight = model.table.weight
    obs = CanaryObserver(weight, r, q=q, c=c, sigma=sigma, expected=q * r)
    run_par = replace(params, dataset_size=r, steps=t, sampling="poisson", max_batch_size=None)
    ran = dpsgd.run_dpsgd(model, canary_data(r, r + a, device), run_par, trainable=[weight], randomness=rnd,
                          settings=dpsgd.DPSGDSettings(optimizer="sgd", lr=1.0), progress=progress,
                          checkpoint=obs.checkpoint, checkpoint_every=1)
    if obs.lr is None:  # one step: no checkpoint ran; the first step has no momentum to undo
        obs.lr = 1.0
    obs.observe()

    seen = len(obs.step_sumsq)
    executed = ran.start_step + ran.steps_taken
    checks = [check("every step observed", 1.0 if seen == t == executed else 0.0,
                    f"{seen} updates observed, {executed} executed, {t} run", alpha)]
    s2 = sigma ** 2
    per_step = np.asarray(obs.step_sumsq) / s2
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
        along = float(torch.linalg.vector_norm(obs.absent_sum, dtype=torch.float64)) ** 2 / seen
        across = float(np.sum(obs.step_sumsq)) - along
        f = (along / a) / (across / (a * (seen - 1))) if across > 0 else math.inf  # no noise at all: fails
        p_f = min(1.0, 2 * min(stats.f.cdf(f, a, a * (seen - 1)), stats.f.sf(f, a, a * (seen - 1))))
        checks.append(check("noise independent across steps", p_f,
                            f"variance of the noise summed over the {seen} steps {f:.5g} x the sum of its per-step "
                            "variances (1 when independent; F test)", alpha))
    m_p, m_a = obs.present_total / (seen * r), obs.absent_total / (seen * a)
    z_p = (m_p - q) / math.sqrt((q * (1 - q) + s2) / (seen * r))
    z_a = m_a / math.sqrt(s2 / (seen * a))
    checks.append(check("canary gradient is C at rate q", min(1.0, 4 * stats.norm.sf(max(abs(z_p), abs(z_a)))),
                        f"a present canary moves {m_p / q:.5g} C per inclusion on average (z = {z_p:.3g}), an absent "
                        f"one {m_a:.3g} C per step (z = {z_a:.3g})", alpha))

    llr = obs.llr.double().cpu().numpy()
    split = split_threshold_bound(llr[:r], llr[r:], delta=delta, alpha=alpha_of(confidence),
                                  unit="canary's log-likelihood ratio")
    split.pop("absent_evaluated")
    split["event"] += f"; {t} steps at q = {q:g}, sigma = {sigma:g}"
    steps_text = f"all {t} steps" if t == params.steps else f"the first {t} of {params.steps} steps"
    return make_result(mechanism="poisson-dpsgd", planned_epsilon=planned,
                       compared=f"add-remove epsilon of {steps_text}, PLD; one canary is one example",
                       phase_epsilon=None, delta=delta, confidence=confidence, samples=r, absent=a, checks=checks,
                       t0=t0, **split)
