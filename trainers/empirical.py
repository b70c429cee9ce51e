"""Empirical lower bounds on epsilon, measured on the trainer's own mechanism code.

An accountant proves an upper bound on epsilon for the mechanism as planned; these checks
run the code that actually executes it (``rr_phase.randomize_labels``, ``walr.release``,
``dpsgd.noisy_gradient`` with a real ``PoissonSampler``) on a pair of neighbouring inputs
many times and turn a distinguishing event S into a lower bound that holds with stated
confidence. If the code is (eps, delta)-DP then P1[S] <= e^eps P0[S] + delta, so

    eps >= ln((P1_low - delta) / P0_high)

where P1_low and P0_high are one-sided Clopper-Pearson bounds (Clopper and Pearson 1934)
on the event's probability under the two neighbours, each at level (1 - confidence) / 2
(Bonferroni over the two bounds). A lower bound above the planned epsilon is a proof, at
that confidence, that the implementation leaks more than the plan says (Jagielski, Ullman
and Oprea, arXiv:2006.07709; Nasr et al., arXiv:2101.04535).

Where a threshold has to be chosen it is chosen on the first half of the observations and
the bound is computed on the second half only, so the choice cannot bias the bound. The
DP-SGD check uses many canaries in one run, each an independent trial by construction:
each canary's gradient lives on a coordinate of its own, its Poisson inclusion and its
noise are independent of the others' (compare the one-run audits of Andrew et al.,
arXiv:2302.03098, and Steinke, Nasr and Jagielski, arXiv:2305.08846, which need weaker
statistics because their trials are not independent).

A bound below the planned epsilon does not show the code is private: only that this
event, at this sample size, finds no violation. RR is the exception worth stating: its
optimal event is known, so the bound comes within a few hundredths of the plan.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import nn

from budgetplan import _validate
from budgetplan.errors import InvalidParameterError
from trainers.dpsgd import noisy_gradient
from trainers.rr_phase import randomize_labels
from trainers.walr import release

__all__ = [
    "DEFAULT_CONFIDENCE",
    "TIGHT_RR_MARGIN",
    "Result",
    "dpsgd_lower_bound",
    "epsilon_from_counts",
    "gaussian_lower_bound",
    "rr_lower_bound",
]

DEFAULT_CONFIDENCE = 1.0 - 1e-6
# RR's optimal event is known, so at the default sample size the bound must come this close.
TIGHT_RR_MARGIN = 0.05
# Thresholds tried on the selection half: tail fractions spaced geometrically down to one sample.
_CANDIDATES_PER_TAIL = 160
# The selection half scores each threshold by the bound it would give at a level this much
# stricter than the final one: among ~300 candidates the best-looking one on few counts is
# mostly luck (winner's curse) and does not replicate on the held-out half. Measured on
# simulated Gaussian releases (eps 2, 2 x 20,000): mean bound 0.567 -> 0.576, sd 0.086 ->
# 0.052, worst of 300 runs 0.157 -> 0.440.
_SELECTION_STRICTNESS = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One empirical check: the planned epsilon against the lower bound measured on the code.

    Attributes:
        mechanism: "randomized-response", "gaussian-release" or "poisson-dpsgd".
        planned_epsilon: what the plan (budgetplan's accounting) promises at ``delta``.
        delta: the delta both bounds are read at.
        epsilon_lower_bound: ln((P1_low - delta) / P0_high), or 0.0 when that is not positive.
        confidence: the probability that the bound is valid (both Clopper-Pearson bounds hold).
        samples: observations per neighbour, selection half included (RR: labels; Gaussian:
            releases; DP-SGD: canaries, i.e. trials with the canary present and as many absent).
        evaluated: observations per neighbour the bound was computed on.
        event: the distinguishing event, and which neighbour is in the numerator.
        hits: (event count under the numerator's neighbour, under the denominator's).
        probability_lower: P1_low, the lower bound on the event's probability in the numerator.
        probability_upper: P0_high, the upper bound in the denominator.
        seconds: wall time of the whole check (sampling, mechanism calls, statistics).
        passed: epsilon_lower_bound <= planned_epsilon.
        tight: RR only: 0 <= planned_epsilon - epsilon_lower_bound <= 0.05 (passed, and close to
            the plan); None otherwise.
    """

    mechanism: str
    planned_epsilon: float
    delta: float
    epsilon_lower_bound: float
    confidence: float
    samples: int
    evaluated: int
    event: str
    hits: tuple[int, int]
    probability_lower: float
    probability_upper: float
    seconds: float
    passed: bool
    tight: bool | None = None


# ---- statistics ---------------------------------------------------------------------------


def _cp_lower(k, n, alpha):
    """One-sided Clopper-Pearson lower bound: P[p < bound] <= alpha. Vectorised."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(alpha, k, n - k + 1)
    return np.where(k > 0, out, 0.0)


def _cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound: P[p > bound] <= alpha. Vectorised."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.isf(alpha, k + 1, n - k)  # not ppf(1 - alpha): 1 - alpha rounds to 1 below 1e-16
    return np.where(k < n, out, 1.0)


def _log_ratio(p_low, p_high, delta):
    """ln((p_low - delta) / p_high), 0 where the numerator is not positive; never negative."""
    p_low, p_high = np.asarray(p_low, dtype=np.float64), np.asarray(p_high, dtype=np.float64)
    num = p_low - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.where(num > 0, num, 1.0)) - np.log(p_high)
    return np.where(num > 0, np.maximum(out, 0.0), 0.0)


def epsilon_from_counts(*, hits_numerator: int, n_numerator: int, hits_denominator: int, n_denominator: int,
                        delta: float, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float]:
    """(eps lower bound, P1_low, P0_high) from event counts under the two neighbours.

    Valid with probability >= ``confidence``: each Clopper-Pearson bound fails with
    probability at most (1 - confidence) / 2.
    """
    alpha = _alpha(confidence)
    for name, k, n in (("hits_numerator", hits_numerator, n_numerator),
                       ("hits_denominator", hits_denominator, n_denominator)):
        if not 0 <= k <= n or n < 1:
            raise InvalidParameterError(f"{name} must be a count in [0, {n}] of n >= 1 trials, got {k}")
    lo = float(_cp_lower(hits_numerator, n_numerator, alpha))
    hi = float(_cp_upper(hits_denominator, n_denominator, alpha))
    return float(_log_ratio(lo, hi, delta)), lo, hi


def _alpha(confidence: float) -> float:
    return (1.0 - _validate.open_unit("confidence", confidence)) / 2.0


def _split_threshold_bound(present: np.ndarray, absent: np.ndarray, *, delta: float, alpha: float, unit: str,
                           names: tuple[str, str] = ("present", "absent")):
    """Choose the best threshold event on the first half of each sample; bound it on the second half.

    ``present`` holds observations of the neighbour expected to be larger, ``absent`` of the
    other. Two families of events are tried: {x > t} with ``present`` in the numerator, and
    {x <= t} with ``absent`` in the numerator (both directions of the DP inequality). Only
    the second halves enter the bound, so it is valid whatever the first halves chose.
    Returns (eps, P1_low, P0_high, hits, evaluated, event text).
    """
    half = min(present.size, absent.size) // 2
    if half < 1:
        raise InvalidParameterError(f"need at least 2 observations per neighbour, got {min(present.size, absent.size)}")
    sel_p, sel_a = np.sort(present[:half]), np.sort(absent[:half])
    ev_p, ev_a = present[half:2 * half], absent[half:2 * half]
    n_sel, n_ev = half, ev_p.size
    pooled = np.sort(np.concatenate([sel_p, sel_a]))
    tail = np.unique(np.geomspace(1, pooled.size / 2, _CANDIDATES_PER_TAIL).astype(np.int64))
    thresholds = np.unique(np.concatenate([pooled[pooled.size - tail], pooled[tail - 1]]))

    def counts(sorted_p, sorted_a, t):
        above_p = sorted_p.size - np.searchsorted(sorted_p, t, side="right")
        above_a = sorted_a.size - np.searchsorted(sorted_a, t, side="right")
        return above_p, above_a

    above_p, above_a = counts(sel_p, sel_a, thresholds)
    sa = alpha * _SELECTION_STRICTNESS
    high = _log_ratio(_cp_lower(above_p, n_sel, sa), _cp_upper(above_a, n_sel, sa), delta)
    low = _log_ratio(_cp_lower(n_sel - above_a, n_sel, sa), _cp_upper(n_sel - above_p, n_sel, sa), delta)
    use_low = low.max() > high.max()
    t = float(thresholds[np.argmax(low if use_low else high)])
    k_p, k_a = int(np.count_nonzero(ev_p > t)), int(np.count_nonzero(ev_a > t))
    if use_low:
        hits = (n_ev - k_a, n_ev - k_p)
        text = f"{unit} <= {t:.6g}: P[{names[1]}] / P[{names[0]}]"
    else:
        hits = (k_p, k_a)
        text = f"{unit} > {t:.6g}: P[{names[0]}] / P[{names[1]}]"
    lo, hi = float(_cp_lower(hits[0], n_ev, alpha)), float(_cp_upper(hits[1], n_ev, alpha))
    text += f" (threshold chosen on a disjoint half of {n_sel} per neighbour)"
    return float(_log_ratio(lo, hi, delta)), lo, hi, hits, n_ev, text


def _result(*, mechanism, planned, delta, eps, lo, hi, hits, confidence, samples, evaluated, event, t0,
            tight=None) -> Result:
    return Result(mechanism=mechanism, planned_epsilon=float(planned), delta=float(delta),
                  epsilon_lower_bound=float(eps), confidence=float(confidence), samples=int(samples),
                  evaluated=int(evaluated), event=event, hits=(int(hits[0]), int(hits[1])),
                  probability_lower=float(lo), probability_upper=float(hi), seconds=time.perf_counter() - t0,
                  passed=bool(eps <= planned), tight=tight)


def _randomness(randomness):
    if randomness is None:
        from trainers.randomness import Randomness

        return Randomness()
    return randomness


# ---- randomized response ------------------------------------------------------------------


def rr_lower_bound(*, epsilon: float, samples: int = 5_000_000, randomness=None,
                   flip: Callable = randomize_labels, confidence: float = DEFAULT_CONFIDENCE) -> Result:
    """Lower bound on the epsilon of the RR phase's label flipping, at delta = 0.

    Neighbours: one label 1 against 0, each passed ``samples`` times through ``flip`` (as
    ``flip(labels, rho, randomness)``, returning ``(noisy labels, ...)`` like
    ``randomize_labels``) with rho = budgetplan's ``flip_probability(epsilon)``. The event
    is fixed by the planned mechanism: the released label is 1. For correct RR the bound
    comes within ``TIGHT_RR_MARGIN`` of epsilon (about 0.007 at eps = 2 and 5M samples).

    Args:
        epsilon: the planned per-example budget.
        samples: labels per neighbour.
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        flip: the label-randomising function under test.
        confidence: probability that the bound is valid.
    """
    from budgetplan.accounting.rr import flip_probability

    t0 = time.perf_counter()
    eps = _validate.positive("epsilon", epsilon)
    n = _validate.positive_int("samples", samples)
    alpha = _alpha(confidence)
    rnd = _randomness(randomness)
    rho = flip_probability(eps)

    def ones_out(label: int) -> int:
        out = flip(np.full(n, label, dtype=np.int8), np.full(n, rho), rnd)
        noisy = np.asarray(out[0] if isinstance(out, tuple) else out)
        if noisy.shape != (n,):
            raise InvalidParameterError(f"flip must return {n} labels, got shape {noisy.shape}")
        return int(np.count_nonzero(noisy == 1))

    k1, k0 = ones_out(1), ones_out(0)
    lo, hi = float(_cp_lower(k1, n, alpha)), float(_cp_upper(k0, n, alpha))
    lb = float(_log_ratio(lo, hi, 0.0))
    return _result(mechanism="randomized-response", planned=eps, delta=0.0, eps=lb, lo=lo, hi=hi, hits=(k1, k0),
                   confidence=confidence, samples=n, evaluated=n, t0=t0, tight=bool(0.0 <= eps - lb <= TIGHT_RR_MARGIN),
                   event="released label = 1: P[true label 1] / P[true label 0] (fixed by the mechanism)")


# ---- Gaussian release (WALR) --------------------------------------------------------------


def _walr_neighbours(sensitivity: float):
    """(Xc, wc, y with row 0 labelled 1, y with row 0 labelled 0, unit difference direction, ||difference||).

    Three rows, k = 2 (one feature and the intercept). Row 0 is clipped by the real
    ``prepare_rows`` to the row bound R = max(1, sensitivity) with weight sensitivity / R,
    so its contribution w_0 x_0 sits at the planned sensitivity: the label change that
    moves the released sum the most.
    """
    from trainers.walr import prepare_rows

    R = max(1.0, sensitivity)
    W = sensitivity / R
    X = torch.tensor([[1e6], [0.3], [0.5]], dtype=torch.float64)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=R, weights=torch.full((3,), W, dtype=torch.float64), weights_bound=W)
    while float(torch.linalg.vector_norm(Xc[0]) * wc[0]) > sensitivity:  # rounding: at, never above, the plan
        wc[0] = math.nextafter(float(wc[0]), 0.0)
    d = (Xc[0] * wc[0]).numpy()
    y1, y0 = torch.tensor([1, 0, 1], dtype=torch.uint8), torch.tensor([0, 0, 1], dtype=torch.uint8)
    return Xc, wc, y1, y0, d / np.linalg.norm(d), float(np.linalg.norm(d))


def gaussian_lower_bound(*, noise_std: float, sensitivity: float, delta: float, epsilon: float | None = None,
                         samples: int = 50_000, randomness=None, release_fn: Callable = release,
                         confidence: float = DEFAULT_CONFIDENCE) -> Result:
    """Lower bound on the epsilon of WALR's Gaussian release, from ``samples`` releases per neighbour.

    Neighbours: a three-row dataset whose row 0 contributes exactly the planned sensitivity,
    with that row's label 1 against 0. Each release is one real call
    ``release_fn(Xc, y, wc, noise_std=..., randomness=..., sensitivity=...)`` (fresh noise
    per call; no batching), projected onto the direction of the difference. The threshold
    is chosen on half of the releases and bounded on the other half. One release of this
    tiny dataset costs about 60-100 us on CPU (validation, the float64 pass, a fresh
    generator per call), so the default 2 x 50,000 releases take about 10 s.

    Args:
        noise_std: the plan's noise standard deviation.
        sensitivity: the plan's L2 sensitivity (weights_bound * row_norm_bound).
        delta: the plan's delta.
        epsilon: the planned epsilon; default budgetplan's exact analytic Gaussian epsilon
            (Balle and Wang, arXiv:1805.06530) at ``delta``.
        samples: releases per neighbour (half select the threshold, half bound it).
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        release_fn: the release under test, with ``walr.release``'s signature.
        confidence: probability that the bound is valid.
    """
    from budgetplan.accounting.gaussian import analytic_epsilon

    t0 = time.perf_counter()
    sigma = _validate.positive("noise_std", noise_std)
    sens = _validate.positive("sensitivity", sensitivity)
    delta = _validate.open_unit("delta", delta)
    n = _validate.positive_int("samples", samples)
    planned = (analytic_epsilon(sigma=sigma, delta=delta, sensitivity=sens) if epsilon is None
               else _validate.non_negative("epsilon", epsilon))
    alpha = _alpha(confidence)
    rnd = _randomness(randomness)
    Xc, wc, y1, y0, u, shift = _walr_neighbours(sens)
    present, absent = np.empty(n), np.empty(n)
    for i in range(n):  # interleaved, so any drift in the randomness source hits both neighbours alike
        present[i] = release_fn(Xc, y1, wc, noise_std=sigma, randomness=rnd, sensitivity=sens)[0].numpy() @ u
        absent[i] = release_fn(Xc, y0, wc, noise_std=sigma, randomness=rnd, sensitivity=sens)[0].numpy() @ u
    lb, lo, hi, hits, n_ev, text = _split_threshold_bound(present, absent, delta=delta, alpha=alpha,
                                                          unit="release projected on the difference",
                                                          names=("label 1", "label 0"))
    return _result(mechanism="gaussian-release", planned=planned, delta=delta, eps=lb, lo=lo, hi=hi, hits=hits,
                   confidence=confidence, samples=n, evaluated=n_ev, t0=t0,
                   event=f"{text}; label 1 vs 0 of a row contributing {shift:.6g}")


# ---- DP-SGD canaries ----------------------------------------------------------------------


class _CanaryModel(nn.Module):
    """logit_i = scale * table[id_i]: example r reads row r only, so its gradient is scale/2 e_r at 0.

    The table starts at zero and is never updated, so every step sees BCE at logit 0 with
    label 0, whose gradient in the logit is sigmoid(0) = 1/2: the per-example norm is
    scale / 2 >= 2 C, and clipping makes it exactly C e_r.
    """

    def __init__(self, rows: int, scale: float):
        super().__init__()
        self.table = nn.Embedding(rows, 1)
        nn.init.zeros_(self.table.weight)
        self.scale = scale

    def forward(self, ns_cat, ns_num, s_cat, s_num):
        return self.table(ns_cat[:, 0])[:, 0] * self.scale


def _canary_data(canaries: int, device):
    from trainers.data.encoded import EncodedData

    return EncodedData(
        ns_cat=torch.arange(canaries, device=device)[:, None], ns_num=torch.zeros(canaries, 0, device=device),
        s_cat=torch.zeros(canaries, 0, dtype=torch.int64, device=device),
        s_num=torch.zeros(canaries, 0, device=device), label=torch.zeros(canaries, device=device), unit=None,
        ns_vocab=2 * canaries, s_vocab=1)


def dpsgd_lower_bound(*, noise_multiplier: float, sampling_rate: float, steps: int, clipping_norm: float,
                      delta: float, epsilon: float | None = None, trials: int = 1_000_000, randomness=None,
                      step_fn: Callable = noisy_gradient, confidence: float = DEFAULT_CONFIDENCE,
                      device="cpu") -> Result:
    """Lower bound on the epsilon of the DP-SGD step, from ``trials`` canaries present and as many absent.

    The dataset is ``trials`` = R canary examples; example r looks up row r of an
    ``nn.Embedding(2R, 1)``, so its clipped gradient is exactly C e_r and rows R..2R-1 are
    read by no example. Each of ``steps`` steps draws a real ``PoissonSampler`` batch at the
    planned q over the R examples and calls ``step_fn`` (``noisy_gradient``'s signature) with
    noise std sigma C and expected batch q R; the gradient times q R is summed over steps.
    No optimiser step is taken: the table stays at 0, so every step sees the same gradient.
    Coordinate r then holds sum_t (C [r sampled at t] + noise_t,r): an independent trial
    of the canary present for r < R, absent for r >= R (add-remove adjacency). A threshold on
    these sums, chosen on half of the trials, gives the bound on the other half.

    Args:
        noise_multiplier, sampling_rate, steps, clipping_norm: the plan's sigma, q, T, C.
        delta: the plan's delta.
        epsilon: the planned epsilon; default ``account(PoissonDPSGD(...), delta=delta,
            adjacency="add-remove")``.
        trials: R, the canaries (and the absent coordinates).
        randomness: a ``Randomness`` (default: a fresh CSPRNG one); seeds the sampler and the
            noise generator as ``run_dpsgd`` does.
        step_fn: the noisy step under test.
        confidence: probability that the bound is valid.
        device: where the canary model runs.
    """
    from budgetplan.accounting import account
    from budgetplan.mechanisms import PoissonDPSGD
    from trainers.losses import bce
    from trainers.sampling import PoissonSampler

    t0 = time.perf_counter()
    mech = PoissonDPSGD(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps)
    c = _validate.positive("clipping_norm", clipping_norm)
    delta = _validate.open_unit("delta", delta)
    r = _validate.positive_int("trials", trials)
    planned = (account(mech, delta=delta, adjacency="add-remove").epsilon if epsilon is None
               else _validate.non_negative("epsilon", epsilon))
    alpha = _alpha(confidence)
    rnd = _randomness(randomness)
    device = torch.device(device)
    q, sigma = mech.sampling_rate, mech.noise_multiplier
    model = _CanaryModel(2 * r, scale=max(1.0, 4.0 * c)).to(device)
    data = _canary_data(r, device)
    trainable = [model.table.weight]
    sampler = PoissonSampler(r, q, seed=rnd.torch_seed(), device=device)
    noise_gen = torch.Generator(device=device).manual_seed(rnd.torch_seed())
    loss_fn = functools.partial(bce, reduction="none")
    expected = q * r
    total = torch.zeros(2 * r, dtype=torch.float64, device=device)
    for _ in range(mech.steps):
        step_fn(model, data, sampler.sample(), trainable, clipping_norm=c, noise_std=sigma * c,
                expected_batch=expected, noise_generator=noise_gen, loss_fn=loss_fn)
        total += model.table.weight.grad[:, 0].to(torch.float64) * expected
        model.table.weight.grad = None
    sums = (total / c).cpu().numpy()
    lb, lo, hi, hits, n_ev, text = _split_threshold_bound(sums[:r], sums[r:], delta=delta, alpha=alpha,
                                                          unit="coordinate's summed gradient / C")
    return _result(mechanism="poisson-dpsgd", planned=planned, delta=delta, eps=lb, lo=lo, hi=hi, hits=hits,
                   confidence=confidence, samples=r, evaluated=n_ev, t0=t0,
                   event=f"{text}; canary present vs absent, {mech.steps} steps at q={q:g}, sigma={sigma:g}")
