"""The one-shot releases audited through the real training loops: RR's labels and WALR's sum.

Each release is drawn by the phase's own loop (``rr_phase.run_rr_phase``,
``walr.run_walr``, looked up on their modules at call time) through a session that keeps
the release and stops the loop right after it: training on a release is post-processing,
so nothing after it can change the epsilon, and no model is trained on millions of rows.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
from scipy import stats

from budgetplan.accounting.gaussian import analytic_epsilon
from budgetplan.accounting.rr import flip_probability
from budgetplan.errors import BudgetplanError, InvalidParameterError
from budgetplan.plan.phases import RRParams
from budgetplan.util import validate
from trainers.empirical.stats import (
    ALPHA,
    DEFAULT_CONFIDENCE,
    Result,
    alpha_of,
    check,
    cp_lower,
    cp_upper,
    default_randomness,
    log_ratio,
    make_result,
    split_threshold_bound,
    two_sided_chi2,
)
from trainers.progress import bar

__all__ = ["RR_SAMPLES", "TIGHT_RR_MARGIN", "WALR_SAMPLES", "rr_lower_bound", "walr_lower_bound",
           "walr_inputs"]

# RR's optimal event is known, so at the default sample size its bound must come this close.
TIGHT_RR_MARGIN = 0.05
RR_SAMPLES = 5_000_000
WALR_SAMPLES = 10_000


class _Released(Exception):  # noqa: N818 - a control-flow sentinel, not an error
    """Raised by the capturing session: the release is recorded, the rest of the phase is skipped."""

    def __init__(self, data, info):
        super().__init__("released")
        self.data, self.info = data, info


class _CaptureSession:
    """A run session that keeps the phase's one release and stops the phase right after it.

    Training on the release is post-processing, so nothing after it can change the epsilon;
    stopping there means no model is trained on millions of rows.
    """

    resumed = False
    checkpoint_every = 0

    def release(self, phase: str, make):
        raise _Released(*make())

    def released(self, phase: str) -> bool:
        return False


# ---- randomized response ------------------------------------------------------------------


def _rr_phase_at(epsilon: float):
    """A one-row-per-unit RR phase at ``epsilon``, as the plan's would hold it."""
    params = RRParams(per_impression_rule="eps/K", unit_epsilon=epsilon, per_impression_epsilon=epsilon,
                      flip_probability=flip_probability(epsilon), cap=1, capping=None, epochs=1, batch_size=None,
                      dataset_size=1, labels_randomised="once per example", model="truncated")
    return SimpleNamespace(name="rr", params=params, guarantee=None)


def rr_lower_bound(*, epsilon: float | None = None, phase=None, samples: int = RR_SAMPLES, randomness=None,
                   flip=None, confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA) -> Result:
    """Audit the RR phase's label randomisation, at delta = 0.

    The labels are released by the real ``trainers.rr_phase.run_rr_phase`` (looked up at call
    time) through a session that keeps the released labels and stops the phase there: one
    call randomises ``samples`` labels 1 and ``samples`` labels 0, each an independent trial.
    The event is fixed by the mechanism and optimal: the released label is 1. For correct RR
    the bound comes within ``TIGHT_RR_MARGIN`` of epsilon (about 0.01 at eps = 3 and 5M labels).
    Mechanism check: the flip rate equals the plan's flip probability (two-sided binomial).

    Args:
        epsilon: a per-example budget to audit (RR at that epsilon), or
        phase: the plan's ``RRPhase`` (under eps/K_i, rows of units with K_i = 1, whose
            per-impression budget is the largest).
        samples: labels per neighbour.
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        flip: optional ``flip(labels, rho, randomness) -> (noisy, flipped)`` to audit instead of
            the RR phase (``randomize_labels``'s signature).
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of the flip-rate check.
    """
    t0 = time.perf_counter()
    if (epsilon is None) == (phase is None):
        raise InvalidParameterError("give exactly one of epsilon and phase")
    if phase is None:
        phase = _rr_phase_at(validate.positive("epsilon", epsilon))
    par = phase.params
    n = validate.positive_int("samples", samples)
    rnd = default_randomness(randomness)
    by_count = par.flip_probability_by_count is not None
    planned = float(par.per_impression_epsilon_by_count[0] if by_count else par.per_impression_epsilon)
    rho = flip_probability(planned)
    labels = np.concatenate([np.ones(n, np.int8), np.zeros(n, np.int8)])
    if flip is not None:
        out = flip(labels.copy(), np.full(2 * n, rho), rnd)
        noisy = np.asarray(out[0] if isinstance(out, tuple) else out)
    else:
        noisy = _release_rr(phase, labels, rnd, unit_counts=np.ones(2 * n, np.int64) if by_count else None)
    if noisy.shape != labels.shape:
        raise InvalidParameterError(f"the RR release must hold {labels.size} labels, got shape {noisy.shape}")
    k1, k0 = int(np.count_nonzero(noisy[:n] == 1)), int(np.count_nonzero(noisy[n:] == 1))
    a = alpha_of(confidence)
    lo, hi = float(cp_lower(k1, n, a)), float(cp_upper(k0, n, a))
    lb = float(log_ratio(lo, hi, 0.0))
    flipped = (n - k1) + k0
    p = float(stats.binomtest(flipped, 2 * n, rho).pvalue)
    checks = [check("flip rate", p, f"{flipped} of {2 * n} labels flipped, expected {2 * n * rho:.1f} at the planned "
                                    f"flip probability {rho:.6g}", alpha)]
    return make_result(mechanism="randomized-response", planned_epsilon=planned, compared="per-example epsilon",
                       phase_epsilon=getattr(getattr(phase, "guarantee", None), "epsilon", None), delta=0.0,
                       epsilon_lower_bound=lb, confidence=confidence, samples=n, evaluated=n, hits=(k1, k0),
                       event="released label = 1: P[true label 1] / P[true label 0] (fixed by the mechanism)",
                       probability_lower=lo, probability_upper=hi, checks=checks, t0=t0,
                       tight=bool(0.0 <= planned - lb <= TIGHT_RR_MARGIN))


def _release_rr(phase, labels: np.ndarray, randomness, unit_counts) -> np.ndarray:
    import torch  # torch: trainers.empirical imports no torch (RR/WALR audits)

    from trainers import rr_phase  # torch: as above

    data = SimpleNamespace(label=torch.as_tensor(labels, dtype=torch.float32))
    try:
        rr_phase.run_rr_phase(None, data, phase, unit_counts=unit_counts, loss="unbiased", lr=1e-3,
                              optimizer="adam", batch_size=1024, randomness=randomness, session=_CaptureSession())
    except _Released as released:
        return np.asarray(released.data)
    raise BudgetplanError("run_rr_phase returned without releasing its labels through the run session")


# ---- Gaussian release (WALR) --------------------------------------------------------------


def walr_inputs(params):
    """(X, weights, y with row 0 labelled 1, y with it labelled 0, expected sum for each, shift).

    Three rows, k = the plan's features. Row 0 is far outside the row bound R, with weight
    2W: ``prepare_rows`` must clip it to norm R and weight W, so its contribution W R is
    what a label change moves the sum by, the most the clipping allows. The expected sums are
    computed here, independently of the trainer's code.
    """
    import torch  # torch: trainers.empirical imports no torch (RR/WALR audits)

    k, R, W = params.features, params.row_norm_bound, params.weights_bound
    X = np.zeros((3, k - 1))
    X[0], X[1, :1], X[2, -1:] = 10.0 * R, 0.3, 0.5
    w = np.array([2 * W, W / 2, W])
    rows = np.hstack([X, np.ones((3, 1))])
    norms = np.linalg.norm(rows, axis=1)
    rows = rows * np.minimum(1.0, R / norms)[:, None]
    contrib = rows * np.minimum(w, W)[:, None]
    y1, y0 = np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0])
    return (torch.as_tensor(X), torch.as_tensor(w), torch.as_tensor(y1), torch.as_tensor(y0),
            y1 @ contrib, y0 @ contrib, float(np.linalg.norm(contrib[0])))


def walr_lower_bound(params, *, delta: float, epsilon: float | None = None, samples: int = WALR_SAMPLES,
                     randomness=None, confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA,
                     progress: str | None = None) -> Result:
    """Audit WALR's one Gaussian release through the real ``trainers.walr.run_walr``.

    Each of ``samples`` releases per neighbour is one call of ``run_walr`` (looked up at call
    time) on a three-row dataset whose row 0 contributes the most the plan's clipping allows,
    labelled 1 against 0, with the plan's noise_std, bounds and features (N set to 3: it
    only scales the fit); the release is captured through ``run_walr``'s ``persist`` hook,
    which then stops the call before the fit. Evidence:

    - the bound: releases projected on the difference of the two sums, a threshold chosen on
      half of them. Far from tight: a Gaussian's epsilon at small delta lies in tails no
      affordable sample reaches.
    - "release centred on the planned sum": n ||mean residual||^2 / noise_std^2 ~ chi2(k) per
      neighbour, the residual being the release minus the sum computed here independently.
    - "noise std": the summed squared residuals / noise_std^2 ~ chi2(2 n k), two-sided.
    - "noise is Gaussian": Kolmogorov-Smirnov of the residuals, centred and divided by their
      own std, against N(0, 1): the shape alone.

    Args:
        params: the plan's ``WALRParams``.
        delta: the plan's delta.
        epsilon: the epsilon to compare with; default the exact analytic Gaussian epsilon
            (Balle and Wang, arXiv:1805.06530) at the planned sensitivity.
        samples: releases per neighbour.
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of each check.
        progress: a progress-bar label, or None.
    """
    from trainers import walr  # torch: as above

    t0 = time.perf_counter()
    sigma, sens = params.noise_std, params.sensitivity
    delta = validate.open_unit("delta", delta)
    n = validate.positive_int("samples", samples)
    planned = (analytic_epsilon(sigma=sigma, delta=delta, sensitivity=sens) if epsilon is None
               else validate.non_negative("epsilon", epsilon))
    rnd = default_randomness(randomness)
    X, w, y1, y0, s1, s0, shift = walr_inputs(params)
    par = replace(params, dataset_size=3)
    session = _CaptureSession()

    def one(y) -> np.ndarray:
        try:
            walr.run_walr(X, y, w, par, rnd, steps=0, minibatch=1, lr=1.0,
                          persist=lambda draw: session.release("walr", draw))
        except _Released as released:
            return np.asarray(released.data.cpu() if hasattr(released.data, "cpu") else released.data, np.float64)
        raise BudgetplanError("run_walr returned without releasing its sum through the persist hook")

    k = s1.size
    r1, r0 = np.empty((n, k)), np.empty((n, k))
    pbar = bar(progress, n)
    try:
        for i in range(n):  # interleaved, so any drift in the randomness source hits both neighbours alike
            r1[i], r0[i] = one(y1) - s1, one(y0) - s0
            if pbar is not None:
                pbar[0].advance(pbar[1])
    finally:
        if pbar is not None:
            pbar[0].stop()
    u = (s1 - s0) / np.linalg.norm(s1 - s0)
    split = split_threshold_bound((r1 + s1) @ u, (r0 + s0) @ u, delta=delta, alpha=alpha_of(confidence),
                                  unit="release projected on the difference", names=("label 1", "label 0"))
    centred = n * (np.square(r1.mean(0)).sum() + np.square(r0.mean(0)).sum()) / sigma**2
    sq = (np.square(r1).sum() + np.square(r0).sum()) / sigma**2
    # centred and scaled by their own means and std, so that this check tests the shape alone (the
    # other two test location and scale; estimating them only makes Kolmogorov-Smirnov conservative)
    centred_residuals = np.concatenate([(r1 - r1.mean(0)).ravel(), (r0 - r0.mean(0)).ravel()])
    ks = stats.kstest(centred_residuals / centred_residuals.std(), "norm")
    checks = [
        check("release centred on the planned sum", stats.chi2.sf(centred, 2 * k),
              f"n |mean residual|^2 / noise_std^2 = {centred:.4g} against chi2({2 * k})", alpha),
        check("noise std", two_sided_chi2(sq, 2 * n * k),
              f"measured {sigma * math.sqrt(sq / (2 * n * k)):.6g} against the planned {sigma:.6g}", alpha),
        check("noise is Gaussian", ks.pvalue, f"Kolmogorov-Smirnov distance {ks.statistic:.3g} over {2 * n * k} "
                                              "standardised residuals", alpha),
    ]
    split["event"] += f"; label 1 vs 0 of a row contributing {shift:.6g}"
    split.pop("absent_evaluated")
    return make_result(mechanism="gaussian-release", planned_epsilon=planned,
                       compared="analytic Gaussian epsilon at the planned sensitivity", phase_epsilon=None,
                       delta=delta, confidence=confidence, samples=n, checks=checks, t0=t0, **split)
