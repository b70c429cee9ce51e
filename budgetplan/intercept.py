"""Intercept calibration: shift a trained model's logit so that its mean prediction is the base rate.

Why. DP-SGD clips every per-example gradient to norm C. Positives, the rare class, carry
the larger gradients and are clipped more, so the model under-predicts: on the built-in
synthetic example (C = 5) mean(p) / mean(y) is about 0.7, with or without noise. A shift d
of every logit fixes the mean and keeps the ranking (the AUC does not move); finding d needs
the model's mean prediction over the training rows and the base rate, both statistics of
the private data unless they come from something already released.

The release (plans with a DP-SGD phase, the plan's ``calibration`` phase). With the trained
model's logits z_i over the N training rows, the fixed grid of shifts d_1 < ... < d_m
(:data:`SHIFTS`, stated in the plan) and the labels y_i, the trainer releases once

    v = (sum_i s(z_i + d_1), ..., sum_i s(z_i + d_m), sum_i y_i) + N(0, sigma^2 I_{m+1})

with s the logistic sigmoid (:func:`coordinates`). Sensitivity, in L2: one example's
contribution to every coordinate lies in [0, 1] (a sigmoid value, or a 0/1 label; the
trainer counts a non-finite logit as 1/2, so this holds for every model), hence

- add-remove: adding or removing a row moves each coordinate by a value in [0, 1], so v
  moves by at most sqrt(m + 1);
- replace-one: changing a row moves each coordinate by a difference of two values in
  [0, 1], a value in [-1, 1], so again at most sqrt(m + 1);
- a unit of at most K rows: K sqrt(m + 1), by the triangle inequality (the accounting
  multiplies the stated sensitivity by the plan's cap).

Each bound is a supremum (a logit tending to +inf with label 1, against one tending to
-inf with label 0, or an absent row), so sqrt(m + 1) is the sensitivity, not a loose bound
(:func:`sensitivity`). The model is the output of the earlier phases: given it, v is a
Gaussian mechanism, and the phases compose adaptively. It is accounted as a
``GaussianRelease`` (analytic Gaussian, Balle and Wang 2018, arXiv:1805.06530).

Everything after the release is post-processing (:func:`solve_shift`): the noisy sums are
turned into mean predictions, made non-decreasing in d, and the shift that brings the mean
prediction to the target rate is read off by linear interpolation of their logits (the
logit of a mean of sigmoids is close to linear in d: without noise, 13 points 0.5 apart
bring the mean prediction within 0.15% of the target on normal logits of sd 0.3 to 3),
clamped to the grid. The target is the
noisy count of positives, combined, when the plan has a randomized-response phase, with
the debiased count from the RR labels (:func:`rr_estimate`) by inverse-variance weights
(:func:`combine`); both variances are public (the release's sigma, and the flip
probabilities).

RR-only plans (label DP, replace-one) need no release (:func:`solve_free`): their truncated
model reads the non-sensitive features alone, which label DP holds fixed between
neighbours, so its logits over the training rows are a function of the released model and
public data; the debiased count of the RR labels is post-processing of the RR release. The
shift is then free and exact. (The gradient of the RR trainer's unbiased loss in the
intercept is sum_i (s(z_i) - t_i), so a settled intercept would already meet the debiased
rate; training does not settle it: on the built-in synthetic data, N = 200,000, the mean
prediction ends at 0.975 (eps 3) and 0.90 (eps 8) of the debiased rate.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["SHIFTS", "SHARE", "coordinates", "sensitivity", "rr_estimate", "combine", "solve_shift",
           "solve_free", "mean_prediction_at_zero"]

# The grid of logit shifts d_1..d_m: 13 points 0.5 apart, a factor of up to e^3 ~ 20 either way.
SHIFTS: tuple[float, ...] = tuple(-3.0 + 0.5 * i for i in range(13))
# The share of the run's epsilon and delta the release takes when [calibration] names none
# (on the built-in synthetic data, N = 200,000 at epsilon 3: noise std 112 against about 14,000
# positives, so the mean prediction lands within about 1% of the base rate).
SHARE = 0.05
# Mean predictions are clipped into [_EDGE, 1 - _EDGE] before their logit: a noisy sum may be <= 0.
_EDGE = 1e-12


def coordinates(shifts: Sequence[float] = SHIFTS) -> int:
    """m + 1: one noisy sum of sigmoids per shift, and the count of positives."""
    return len(shifts) + 1


def sensitivity(shifts: Sequence[float] = SHIFTS) -> float:
    """sqrt(m + 1), the L2 sensitivity of the release per example under either adjacency (see the module)."""
    return math.sqrt(coordinates(shifts))


def rr_estimate(noisy_labels: ArrayLike, flip_probability: ArrayLike) -> tuple[float, float]:
    """(sum_i t_i, its variance): the debiased count of positives from randomized-response labels.

    t_i = (y^_i - rho_i) / (1 - 2 rho_i) has expectation y_i, and variance
    rho_i (1 - rho_i) / (1 - 2 rho_i)^2 whatever y_i is, so the variance is public.

    Args:
        noisy_labels: [N] labels after randomized response, each 0 or 1.
        flip_probability: rho, one number or [N] per-row values, each in [0, 1/2).
    """
    y = np.asarray(noisy_labels, dtype=np.float64).ravel()
    rho = np.broadcast_to(np.asarray(flip_probability, dtype=np.float64), y.shape)
    if y.size == 0 or not np.all((y == 0) | (y == 1)):
        raise InvalidParameterError("noisy_labels must be a non-empty array of 0/1 labels")
    if not np.all((rho >= 0) & (rho < 0.5)):
        raise InvalidParameterError("flip_probability must lie in [0, 0.5): at 0.5 the labels carry nothing")
    keep = 1.0 - 2.0 * rho
    return float(np.sum((y - rho) / keep)), float(np.sum(rho * (1.0 - rho) / keep**2))


def combine(*estimates: tuple[float, float]) -> tuple[float, float]:
    """The inverse-variance weighted mean of unbiased estimates ``(value, variance)``, and its variance."""
    if not estimates:
        raise InvalidParameterError("combine needs at least one estimate")
    exact = [v for v, var in estimates if var == 0]
    if exact:
        return float(exact[0]), 0.0
    weights = [1.0 / validate.positive("variance", var) for _, var in estimates]
    total = math.fsum(weights)
    return math.fsum(w * validate.finite("estimate", v) for w, (v, _) in zip(weights, estimates)) / total, 1.0 / total


def _logit(mean: ArrayLike) -> NDArray[np.float64]:
    m = np.clip(np.asarray(mean, dtype=np.float64), _EDGE, 1.0 - _EDGE)
    return np.log(m) - np.log1p(-m)


def solve_shift(sums: ArrayLike, *, rows: int, target: float,
                shifts: Sequence[float] = SHIFTS) -> tuple[float, bool]:
    """The shift d whose interpolated mean prediction is ``target / rows``; post-processing of the release.

    Args:
        sums: the m released sums of sigmoids (noisy), one per shift (the positives excluded).
        rows: N, the plan's dataset size (the means are the sums over N).
        target: the number of positives to match (noisy, debiased or combined).
        shifts: the grid the sums were taken at, increasing.

    Returns:
        (d, clamped): clamped is True when the target lies beyond the grid's range of mean
        predictions and d is the grid's end.
    """
    grid = np.asarray(shifts, dtype=np.float64)
    values = np.asarray(sums, dtype=np.float64).ravel()
    if values.shape != grid.shape or grid.size < 2 or not np.all(np.diff(grid) > 0):
        raise InvalidParameterError(f"sums must hold one value per shift ({grid.size}), and the shifts increase")
    if not np.all(np.isfinite(values)) or not math.isfinite(target):
        raise InvalidParameterError("the released sums and the target must be finite")
    n = validate.positive_int("rows", rows)
    # The exact means increase with d; noise may break that, and a running maximum restores it.
    v = np.maximum.accumulate(_logit(values / n))
    t = float(_logit(target / n))
    if t <= v[0]:
        return float(grid[0]), True
    if t > v[-1]:
        return float(grid[-1]), True
    j = int(np.searchsorted(v, t, side="left"))  # v[j-1] < t <= v[j], so the gap is positive
    frac = (t - v[j - 1]) / (v[j] - v[j - 1])
    return float(grid[j - 1] + frac * (grid[j] - grid[j - 1])), False


def mean_prediction_at_zero(sums: ArrayLike, *, rows: int, shifts: Sequence[float] = SHIFTS) -> float:
    """The (noisy) mean prediction of the model as trained: the sum at shift 0 over N."""
    if 0.0 not in shifts:
        raise InvalidParameterError("the grid has no shift 0")
    return float(np.asarray(sums, dtype=np.float64)[list(shifts).index(0.0)]) / validate.positive_int("rows", rows)


def solve_free(logits: ArrayLike, *, target: float, shifts: Sequence[float] = SHIFTS) -> tuple[float, bool]:
    """The exact shift d with sum_i s(z_i + d) = ``target``, clamped to the grid's range.

    For RR-only plans, whose logits are a function of public features and the released
    model. Bisection on the increasing function of d, to 1e-12.
    """
    z = np.asarray(logits, dtype=np.float64).ravel()
    if z.size == 0:
        raise InvalidParameterError("logits is empty")
    if not math.isfinite(target):
        raise InvalidParameterError(f"target must be finite, got {target!r}")
    undefined = np.isnan(z)
    halves, z = 0.5 * int(undefined.sum()), z[~undefined]  # a NaN logit counts as 1/2, as in the release
    lo, hi = float(shifts[0]), float(shifts[-1])

    def total(d: float) -> float:
        return halves + float(np.sum(0.5 * (1.0 + np.tanh(0.5 * (z + d)))))  # the sigmoid, without overflow

    if target <= total(lo):
        return lo, True
    if target >= total(hi):
        return hi, True
    while hi - lo > 1e-12:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < target else (lo, mid)
    return 0.5 * (lo + hi), False
