"""The Gaussian mechanism in closed form: exact (analytic) and classical.

Releasing f(D) + N(0, sigma^2 I) with L2 sensitivity Delta is exactly (eps, delta)-DP for

    delta(eps) = Phi(Delta / (2 sigma) - eps sigma / Delta) - e^eps Phi(-Delta / (2 sigma) - eps sigma / Delta)

(Balle and Wang 2018, "Improving the Gaussian Mechanism for Differential Privacy",
arXiv:1805.06530, Theorem 8). Both directions of the inverse (sigma for a target, epsilon
for a sigma) are solved numerically on that identity, in log space so that tiny deltas keep
their relative precision, and rounded to the safe side.

The classical calibration sigma = Delta sqrt(2 ln(1.25 / delta)) / eps (Dwork and Roth 2014,
Theorem A.1) is provided for comparison only: it is proved for eps < 1, over-noises there,
and is not a guarantee above it (it under-noises around eps >= 10).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from budgetplan.accounting.limits import MAX_GAUSSIAN_RATIO
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = [
    "analytic_delta",
    "analytic_epsilon",
    "analytic_sigma",
    "classical_sigma",
    "classical_epsilon",
    "CLASSICAL_VALID_BELOW",
]

CLASSICAL_VALID_BELOW = 1.0

# Largest epsilon target: its sigma keeps sensitivity / sigma far below MAX_GAUSSIAN_RATIO.
_MAX_EPSILON = 1e150

# Solves aim a hair inside the target (relative 1e-10 in delta) so that re-accounting the
# answer by any other route, with its own last-bit rounding, still lands within the target.
_SAFETY = math.log1p(-1e-10)


def _mu(sigma: object, sensitivity: object) -> float:
    """sensitivity / sigma, both validated; refused past MAX_GAUSSIAN_RATIO (epsilon ~ mu^2 / 2)."""
    sigma = validate.positive("sigma", sigma)
    sensitivity = validate.positive("sensitivity", sensitivity)
    mu = sensitivity / sigma
    if not mu <= MAX_GAUSSIAN_RATIO:
        raise InvalidParameterError(
            f"noise std sigma must be at least sensitivity / {MAX_GAUSSIAN_RATIO:g} = "
            f"{sensitivity / MAX_GAUSSIAN_RATIO:.3g} "
            f"(epsilon beyond 1e199), got {sigma!r}")
    return mu


def _log_delta(epsilon: float, mu: float) -> float:
    """log delta(eps) for the Gaussian mechanism with mu = Delta / sigma."""
    if mu == 0.0:  # Delta / sigma underflowed (below 5e-324): delta(0) ~ 0.4 mu is below every float delta
        return -math.inf
    log_a = special.log_ndtr(mu / 2 - epsilon / mu)
    log_b = epsilon + special.log_ndtr(-mu / 2 - epsilon / mu)
    if log_b >= log_a:  # only rounding can get here; the true value is > 0 but below precision
        return -math.inf
    return float(log_a + np.log(-np.expm1(log_b - log_a)))


def analytic_delta(*, epsilon: float, sigma: float, sensitivity: float = 1.0) -> float:
    """delta at ``epsilon`` of the Gaussian mechanism with noise std ``sigma``."""
    mu = _mu(sigma, sensitivity)
    return math.exp(_log_delta(validate.non_negative("epsilon", epsilon), mu))


def analytic_epsilon(*, sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest epsilon >= 0 with delta(epsilon) <= ``delta`` (rounded up)."""
    mu = _mu(sigma, sensitivity)
    delta = validate.open_unit("delta", delta)
    target = math.log(delta) + _SAFETY
    if _log_delta(0.0, mu) <= target:
        return 0.0
    hi = max(1.0, mu * mu)
    while _log_delta(hi, mu) > target:
        hi *= 2.0
    from scipy import optimize  # heavy (~0.3 s: linalg, sparse): only when a root is solved for

    eps: float = optimize.brentq(lambda e: _log_delta(e, mu) - target, 0.0, hi, xtol=1e-14, rtol=1e-15)
    while _log_delta(eps, mu) > target:  # land on the safe side of the root
        eps = math.nextafter(eps, math.inf)
    return eps


def analytic_sigma(*, epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The smallest noise std for which the Gaussian mechanism is (epsilon, delta)-DP (rounded up)."""
    epsilon = validate.positive("epsilon", epsilon)
    if epsilon > _MAX_EPSILON:
        raise InvalidParameterError(f"epsilon must be at most {_MAX_EPSILON:g}, got {epsilon!r}")
    delta = validate.open_unit("delta", delta)
    sensitivity = validate.positive("sensitivity", sensitivity)
    target = math.log(delta) + 2 * _SAFETY

    # The mechanism depends on sigma / sensitivity only: solve at sensitivity 1, so that a huge
    # or tiny sensitivity never reaches the root-finder.
    def gap(log_sigma: float) -> float:
        return _log_delta(epsilon, 1.0 / math.exp(log_sigma)) - target

    guess = math.log(classical_sigma(epsilon=epsilon, delta=delta))
    lo, hi = guess - 1.0, guess + 1.0
    while gap(lo) <= 0:
        lo -= 1.0
    while gap(hi) > 0:
        hi += 1.0
    from scipy import optimize  # heavy (~0.3 s: linalg, sparse): only when a root is solved for

    unit = math.exp(optimize.brentq(gap, lo, hi, xtol=1e-14, rtol=1e-15))
    sigma = sensitivity * unit
    if not math.isfinite(sigma):
        raise InvalidParameterError(f"sensitivity {sensitivity!r} is too large: the noise std it needs "
                                    f"({sensitivity:g} x {unit:g}) is not a finite number")
    while _log_delta(epsilon, sensitivity / sigma) - target > 0:  # rounding of the product: safe side
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def classical_sigma(*, epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Dwork-Roth's sigma = Delta sqrt(2 ln(1.25/delta)) / eps; proved only for eps < 1."""
    epsilon = validate.positive("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    sensitivity = validate.positive("sensitivity", sensitivity)
    return sensitivity * math.sqrt(2.0 * _log_125_over(delta)) / epsilon


def classical_epsilon(*, sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """The epsilon the classical formula assigns to ``sigma``; meaningful only below 1."""
    sigma = validate.positive("sigma", sigma)
    delta = validate.open_unit("delta", delta)
    sensitivity = validate.positive("sensitivity", sensitivity)
    return sensitivity * math.sqrt(2.0 * _log_125_over(delta)) / sigma


def _log_125_over(delta: float) -> float:
    # ln(1.25 / delta) as a difference: 1.25 / delta overflows for a subnormal delta (5e-324).
    return math.log(1.25) - math.log(delta)
