"""Fast, vectorised pessimistic privacy-loss-distribution (PLD) accounting.

One idea: dp_accounting's PLD accountant (pessimistic estimate, connect-the-dots), with
every per-grid-point step done as a numpy array operation, and composition made rigorous
at any delta it accepts.

* Discretisation: pessimistic connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar,
  Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss
  Distributions", arXiv:2207.04380, Algorithm 1) on the grid ``k * discretization``
  between the losses at dp_accounting's truncation points (``log_mass_truncation_bound``).
  The mass beyond the top point is not lost: connect-the-dots puts delta there at +inf.
* Composition (``pld_ops``): convolution by real FFT (Koskela, Jalko, Honkela,
  "Computing Tight Differential Privacy Guarantees Using FFT", arXiv:1906.03049) of the
  exponentially tilted pmfs, the tilt chosen for the delta the result is read at, with a
  bound on the FFT's rounding error added to every mass and the window cut by Chernoff
  bounds whose dropped mass goes to +infinity (above) or onto the first loss (below).
* Queries (``pld_query``): the hockey-stick divergence and its inverse from suffix sums.

The grids coincide with dp_accounting's, and the pmfs differ from its only in the
direction of exactness: the hockey-stick values are formed in log space with the
subsampling cancellation done analytically, and connect-the-dots is applied to
delta - (1 - e^eps) for negative epsilons (dp_accounting's pmfs gain up to ~2e-8 of
spurious mass per step there, see ``ctd.connect_the_dots``); and the mixture-of-Gaussians
inverse loss is solved to rounding accuracy rather than on a 1e-6 grid in x. Composition
differs in rigour: dp_accounting's plain float64 FFT leaves ~1e-16 of absolute noise per
mass (1e-11 in all after 1e5 steps), which decides epsilon at deltas below ~1e-10, in
either direction; here that noise is relative to the masses read and bounded.

The mixture-of-Gaussians builders live in ``mixture_pld`` and are re-exported here; the
argument checks all builders share, in ``pld_args``. Every builder refuses, before
allocating, a grid longer than ``limits.MAX_SINGLE_GRID_POINTS`` (a ``GridLimitError``
naming the discretization that fits).

Conventions (dp_accounting's): ``relation="add-remove"`` has a REMOVE direction (upper
distribution with the element, lower without it) and an ADD direction (the reverse);
without subsampling they coincide and one pmf is kept. ``relation="replace-one"`` is
the REPLACE adjacency, which is symmetric. Every query takes the worst case over the
directions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from budgetplan.accounting.ctd import cdf_side, check_grid, connect_the_dots, loss_grid, readonly, split_gap
from budgetplan.accounting.mixture_pld import double_mixture_of_gaussians, mixture_of_gaussians
from budgetplan.accounting.pld_args import check_discretization, check_noise, check_relation, check_truncation_bound
from budgetplan.accounting.pld_ops import GridLimitError, compose, compose_all, self_compose, window_size
from budgetplan.accounting.pld_query import delta_for_epsilon, epsilon_for_delta
from budgetplan.accounting.pld_types import ADD_REMOVE, PLD, REPLACE_ONE, PLDPmf
from budgetplan.util import validate

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "PLDPmf",
    "PLD",
    "gaussian",
    "mixture_of_gaussians",
    "double_mixture_of_gaussians",
    "randomized_response",
    "self_compose",
    "compose",
    "compose_all",
    "window_size",
    "GridLimitError",
    "gaussian_loss_range",
    "epsilon_for_delta",
    "delta_for_epsilon",
]

# ------------------------------------------------------------------ Gaussian family


def _gaussian_loss(x: float, sigma: float, q: float, adjacency: str) -> float:
    """Privacy loss ln(upper(x)/lower(x)) of the (subsampled) Gaussian at a scalar x.

    Only used for the two ends of the grid, so it follows dp_accounting's formulas
    operation by operation: REMOVE is ln(1 - q + q e^{L0(x)}) with the unsampled loss
    L0(x) = (-1/2 - x)/sigma^2; ADD is -REMOVE(-x); REPLACE is their sum.
    """
    if adjacency == "add":
        return -_gaussian_loss(-x, sigma, q, "remove")
    if adjacency == "replace":
        return _gaussian_loss(x, sigma, q, "remove") + _gaussian_loss(x, sigma, q, "add")
    l0 = (-0.5 - x) / sigma**2
    if q == 1.0:
        return l0
    return float(np.logaddexp(l0 + math.log(q), math.log(1 - q)))


def _log1p_expm1_over(e: np.ndarray, q: float) -> np.ndarray:
    """ln(1 + (e^e - 1) / q); where (e^e - 1) / q overflows, as e - ln q + ln(1 - (1 - q) e^-e)."""
    with np.errstate(over="ignore"):
        out: np.ndarray = np.log1p(np.expm1(e) / q)
    big = ~np.isfinite(out)
    if big.any():
        eb = e[big]
        out[big] = eb - math.log(q) + np.log1p(-(1.0 - q) * np.exp(-eb))
    return out


def _gaussian_split_curve(eps: np.ndarray, sigma: float, q: float, adjacency: str) -> np.ndarray:
    """Split hockey-stick values h (see ``ctd.connect_the_dots``) of the subsampled Gaussian.

    With mu = N(0, sigma^2) and sensitivity 1 the pairs are (dp_accounting's
    AdditiveNoisePrivacyLoss): REMOVE upper (1-q) mu(x) + q mu(x+1) vs lower mu(x);
    ADD upper mu(x) vs lower (1-q) mu(x) + q mu(x-1); REPLACE upper
    (1-q) mu(x) + q mu(x+1) vs lower (1-q) mu(x) + q mu(x-1). The loss is decreasing
    in x, and its root x* at eps has a closed form in each case. For REMOVE and ADD the
    (1-q) mu(x) part shared by both distributions is cancelled analytically (q times an
    unsampled Gaussian divergence at the unsampled loss L0 remains), which is where a
    plain difference of the two CDFs loses its digits when q is small.
    """
    s2 = sigma**2
    h = np.zeros_like(eps)
    lq = math.log(q)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if adjacency == "remove":
            # At or below ln(1-q) every outcome has a larger loss: delta = 1 - e^eps, g = 0.
            inside = eps > math.log1p(-q) if q < 1.0 else np.ones(eps.shape, dtype=bool)
            e = eps[inside]
            sg = cdf_side(e)
            l0 = _log1p_expm1_over(e, q) if q < 1.0 else e
            x = -0.5 - l0 * s2
            # P = q Phi((x+1)/sigma), Q = e^eps Phi(x/sigma) - (1-q) Phi(x/sigma) = q e^L0 Phi(x/sigma).
            log_p = lq + special.log_ndtr(sg * (x + 1.0) / sigma)
            log_q = lq + l0 + special.log_ndtr(sg * x / sigma)
            h[inside] = split_gap(e, log_p, log_q)
        elif adjacency == "add":
            # At or above -ln(1-q) no outcome has a larger loss: delta = 0.
            inside = eps < -math.log1p(-q) if q < 1.0 else np.ones(eps.shape, dtype=bool)
            e = eps[inside]
            sg = cdf_side(e)
            l0 = -_log1p_expm1_over(-e, q) if q < 1.0 else e
            x = 0.5 - l0 * s2
            # P = (1 - (1-q) e^eps) Phi(x/sigma) = q e^{eps - L0} Phi(x/sigma), Q = q e^eps Phi((x-1)/sigma).
            log_p = lq + e - l0 + special.log_ndtr(sg * x / sigma)
            log_q = lq + e + special.log_ndtr(sg * (x - 1.0) / sigma)
            h[inside] = split_gap(e, log_p, log_q)
        else:  # replace
            e = eps
            sg = cdf_side(e)
            if q == 1.0:
                x = -e * s2 / 2.0
                log_p = special.log_ndtr(sg * (x + 1.0) / sigma)
                log_q = e + special.log_ndtr(sg * (x - 1.0) / sigma)
            else:
                # dp_accounting's _inverse_privacy_loss_replace in closed form:
                # x = sigma^2 (asinh(-sinh(eps/2) alpha) - eps/2) with
                # alpha = e^{1/(2 sigma^2)} (1-q)/q, through logs for large |eps|.
                log_alpha = 0.5 / s2 + math.log1p(-q) - lq
                a = np.abs(e) / 2.0
                t = log_alpha + a + np.log1p(-np.exp(-2.0 * a)) - math.log(2.0)
                asinh = -np.sign(e) * np.logaddexp(0.5 * np.logaddexp(0.0, 2.0 * t), t)
                x = np.where(e == 0.0, 0.0, s2 * (asinh - e / 2.0))
                shared = math.log1p(-q) + special.log_ndtr(sg * x / sigma)
                log_p = np.logaddexp(shared, lq + special.log_ndtr(sg * (x + 1.0) / sigma))
                log_q = e + np.logaddexp(shared, lq + special.log_ndtr(sg * (x - 1.0) / sigma))
            h = split_gap(e, log_p, log_q)
    return h


def _gaussian_range(sigma: float, q: float, adjacency: str, log_bound: float) -> tuple[float, float]:
    """(eps_lower, eps_upper): the losses at dp_accounting's truncation points.

    The truncation leaves tail mass exp(bound)/2 of each shifted Gaussian outside; that mass
    is not lost: connect-the-dots puts delta(eps_upper) at +infinity.
    """
    z = float(special.ndtri(0.5 * math.exp(log_bound))) * sigma
    lower_x, upper_x = z, -z
    if adjacency == "add":
        upper_x += 1.0
    else:
        lower_x -= 1.0
    return _gaussian_loss(upper_x, sigma, q, adjacency), _gaussian_loss(lower_x, sigma, q, adjacency)


def gaussian_loss_range(
    *, noise_multiplier: float, sampling_rate: float = 1.0, relation: str = ADD_REMOVE,
    log_mass_truncation_bound: float = -50.0,
) -> float:
    """Width of the loss grid of one ``gaussian`` step (max over directions), before building it.

    ``width / discretization`` is the number of grid points, so a caller can choose a
    discretization within ``MAX_SINGLE_GRID_POINTS`` without allocating anything.
    """
    sigma = check_noise("noise_multiplier", noise_multiplier)
    q = validate.probability("sampling_rate", sampling_rate, allow_one=True)
    bound = check_truncation_bound(log_mass_truncation_bound)
    kinds = ("replace",) if check_relation(relation) == REPLACE_ONE else ("remove", "add")
    return max(hi - lo for lo, hi in (_gaussian_range(sigma, q, k, bound) for k in kinds))


# A pmf is up to a few MB; the calibration reuses one while it searches the step count.
@functools.lru_cache(maxsize=32)
def _gaussian_pmf(sigma: float, q: float, adjacency: str, discretization: float, log_bound: float) -> PLDPmf:
    """The connect-the-dots pmf of one direction; cached, arguments are plain floats."""
    eps_lower, eps_upper = _gaussian_range(sigma, q, adjacency, log_bound)
    lo, eps = loss_grid(discretization, eps_lower, eps_upper, f"the Gaussian with noise_multiplier={sigma:g}")
    return connect_the_dots(discretization, lo, eps, _gaussian_split_curve(eps, sigma, q, adjacency))


def gaussian(
    *,
    noise_multiplier: float,
    sampling_rate: float = 1.0,
    relation: str = ADD_REMOVE,
    discretization: float = 1e-4,
    log_mass_truncation_bound: float = -50.0,
) -> PLD:
    """PLD of one step of the Poisson-subsampled Gaussian mechanism, sensitivity 1.

    Matches dp_accounting's ``from_gaussian_mechanism(noise_multiplier,
    sampling_prob=sampling_rate, value_discretization_interval=discretization,
    log_mass_truncation_bound=...)`` with connect-the-dots and pessimistic rounding.

    Args:
        noise_multiplier: standard deviation of the noise (sensitivity is 1).
        sampling_rate: Poisson sampling probability q in (0, 1].
        relation: ``"add-remove"`` (REMOVE and ADD directions; one pmf when q = 1) or
            ``"replace-one"`` (dp_accounting's REPLACE adjacency: the upper mixture is
            shifted by +1 and the lower by -1; for q = 1 a Gaussian of sensitivity 2).
        discretization: grid step of the privacy losses.
        log_mass_truncation_bound: ln of the noise mass left out of the grid (it is
            accounted for pessimistically, at +infinity).

    Returns:
        The PLD; its pmfs are cached and read-only.

    Raises:
        InvalidParameterError (a ValueError): on a non-positive sigma, q outside (0, 1],
            an unknown relation, a non-positive discretization.
    """
    sigma = check_noise("noise_multiplier", noise_multiplier)
    q = validate.probability("sampling_rate", sampling_rate, allow_one=True)
    d = check_discretization(discretization)
    bound = check_truncation_bound(log_mass_truncation_bound)
    if check_relation(relation) == REPLACE_ONE:
        return PLD((_gaussian_pmf(sigma, q, "replace", d, bound),), relation)
    remove = _gaussian_pmf(sigma, q, "remove", d, bound)
    if q == 1.0:
        return PLD((remove,), relation)
    return PLD((remove, _gaussian_pmf(sigma, q, "add", d, bound)), relation)


@functools.lru_cache(maxsize=16)
def _rr_pmf(epsilon: float, discretization: float) -> PLDPmf:
    # The same floating-point path as dp_accounting's from_randomized_response
    # (noise_parameter = 2/(e^eps + 1), two buckets), so the losses round to the same
    # grid points even when eps/d is (nearly) an integer.
    if epsilon < 700.0:
        noise = 2.0 / (math.exp(epsilon) + 1.0)
        log_keep, log_flip = math.log(1 - noise * 1 / 2), math.log(noise / 2)
    else:  # e^eps overflows: the same quantities in log space
        log_keep, log_flip = -float(np.logaddexp(0.0, -epsilon)), -float(np.logaddexp(0.0, epsilon))
    check_grid(discretization, log_flip - log_keep, log_keep - log_flip,
                f"randomized response with epsilon={epsilon:g}")
    k_keep = math.ceil((log_keep - log_flip) / discretization)
    k_flip = math.ceil((log_flip - log_keep) / discretization)
    probs = np.zeros(k_keep - k_flip + 1)
    probs[-1] += math.exp(log_keep)
    probs[0] += math.exp(log_flip)
    return readonly(PLDPmf(discretization, k_flip, probs, 0.0))


def randomized_response(*, epsilon: float, discretization: float = 1e-4) -> PLD:
    """PLD of binary randomized response with parameter epsilon (replace-one).

    The loss is +epsilon with probability e^eps/(1+e^eps) and -epsilon otherwise, each
    rounded up to the grid (pessimistic). Composing copies matches dp_accounting's
    PLDAccountant(REPLACE_ONE) on RandomizedResponseDpEvent(2/(e^eps+1), 2) events.

    Args:
        epsilon: the randomized-response parameter, > 0.
        discretization: grid step of the privacy losses.

    Returns:
        A replace-one PLD with a single (symmetric) pmf; cached and read-only.
    """
    eps = validate.positive("epsilon", epsilon)
    d = check_discretization(discretization)
    return PLD((_rr_pmf(eps, d),), REPLACE_ONE)
