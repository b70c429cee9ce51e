"""Connect-the-dots: a single step's hockey-stick curve on a loss grid, as a pessimistic pmf.

Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, "Connect the Dots: Tighter Discrete
Approximations of Privacy Loss Distributions", arXiv:2207.04380, Algorithm 1. The
mechanism builders in ``fastpld`` supply the curve on the grid (``loss_grid``); this module
turns it into masses, and refuses grids past ``limits.MAX_SINGLE_GRID_POINTS`` before
anything is allocated.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from budgetplan.accounting.limits import MAX_SINGLE_GRID_POINTS
from budgetplan.accounting.pld_ops import GridLimitError
from budgetplan.accounting.pld_types import PLDPmf
from budgetplan.errors import InvalidParameterError

__all__ = ["readonly", "connect_the_dots", "split_gap", "cdf_side", "check_grid", "loss_grid"]


def readonly(pmf: PLDPmf) -> PLDPmf:
    """Freeze ``probs`` so that cached pmfs cannot be altered through a result."""
    pmf.probs.flags.writeable = False
    return pmf


def connect_the_dots(discretization: float, lower_index: int, eps: np.ndarray, h: np.ndarray) -> PLDPmf:
    """Pessimistic connect-the-dots pmf on consecutive grid points (arXiv:2207.04380, Alg. 1).

    The mechanism's hockey-stick curve delta(eps) is given at the grid epsilons
    ``eps = (lower_index + k) * discretization`` in split form: ``h = delta`` where
    eps >= 0 and ``h = g = delta - (1 - e^eps)`` where eps < 0. With gap d the mass at
    an interior point is ((delta_{k+1} - delta_k) - e^d (delta_k - delta_{k-1})) / (e^d - 1),
    the first point also takes the mass 1 - delta_0 below the grid, and delta at the
    last point goes to +infinity (the fixed-gap form dp_accounting uses).

    Why the split: that second difference vanishes on 1 and e^eps, so it may be taken
    of g instead of delta. For eps < 0, delta is close to 1 - e^eps and its second
    differences are pure rounding noise, which clipping at 0 turns into spurious mass
    (about 2e-8 per step in dp_accounting's ADD direction); g is small there and known
    to full relative accuracy, so the masses come out exact to rounding.
    """
    neg = eps < 0
    # g is read at most one point past eps = 0, so the clip (against overflow) never shows.
    one_minus_exp = -np.expm1(np.minimum(eps, 700.0))
    delta = np.where(neg, h + one_minus_exp, h)
    g = np.where(neg, h, h - one_minus_exp)
    if eps.size == 1:
        return readonly(PLDPmf(discretization, int(lower_index), np.array([1.0 - delta[0]]), float(delta[0])))
    if discretization <= 1.0:
        em1, ed = math.expm1(discretization), math.exp(discretization)

        def second_difference(v: NDArray[np.float64]) -> NDArray[np.float64]:
            return ((v[2:] - v[1:-1]) - ed * (v[1:-1] - v[:-2])) / em1
    else:  # the same divided by e^d, which would overflow on a coarse grid
        em1, ed = -math.expm1(-discretization), math.exp(-discretization)

        def second_difference(v: NDArray[np.float64]) -> NDArray[np.float64]:
            return (ed * (v[2:] - v[1:-1]) - (v[1:-1] - v[:-2])) / em1

    probs = np.empty_like(eps)
    probs[1:-1] = np.where(neg[1:-1], second_difference(g), second_difference(delta))
    first_gap = math.expm1(discretization) if discretization < 700.0 else math.inf
    if neg[0]:
        probs[0] = -g[0] + (g[1] - g[0]) / first_gap
    else:
        probs[0] = 1.0 - delta[0] + (delta[1] - delta[0]) / first_gap
    probs[-1] = (delta[-1] - delta[-2]) / math.expm1(-discretization)
    np.maximum(probs, 0.0, out=probs)
    return readonly(PLDPmf(discretization, int(lower_index), probs, float(delta[-1])))


def split_gap(eps: np.ndarray, log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """``h`` of ``connect_the_dots`` from the two terms of the divergence, in log space.

    For a loss decreasing in x, with root x* at eps:
    delta = P - Q with P = upper(X <= x*), Q = e^eps lower(X <= x*), and
    g = delta - (1 - e^eps) = Q' - P' with P' = upper(X > x*), Q' = e^eps lower(X > x*).
    Callers evaluate every normal CDF at its argument times ``cdf_side(eps)``, so the same
    formulas give ln P, ln Q where eps >= 0 and ln P', ln Q' where eps < 0. The
    difference is formed as e^big (1 - e^(small - big)), accurate relative to itself
    however small it is.
    """
    up = eps >= 0
    big = np.where(up, log_p, log_q)
    small = np.where(up, log_q, log_p)
    with np.errstate(invalid="ignore"):
        h = np.exp(big) * -np.expm1(small - big)
    return np.clip(np.where(np.isfinite(big), h, 0.0), 0.0, 1.0)


def cdf_side(eps: np.ndarray) -> np.ndarray:
    """+1 where delta itself is wanted (eps >= 0), -1 where g is (survival side)."""
    return np.where(eps >= 0, 1.0, -1.0)


def check_grid(discretization: float, eps_lower: float, eps_upper: float, what: str) -> None:
    """Refuse, before allocating anything, a grid longer than MAX_SINGLE_GRID_POINTS.

    The message names the smallest discretization that fits (the length scales as 1/d).
    """
    width = eps_upper - eps_lower
    if not math.isfinite(width):
        raise InvalidParameterError(
            f"{what} has privacy losses beyond floating point: the noise is too small for PLD accounting")
    span = width / discretization
    if not span < MAX_SINGLE_GRID_POINTS - 2:
        raise GridLimitError(
            f"discretization {discretization:g} needs {span:.3g} grid points for one step of {what} "
            f"(limit {MAX_SINGLE_GRID_POINTS:,}); use discretization >= "
            f"{width / (MAX_SINGLE_GRID_POINTS - 2) * 1.01:.3g}",
            points=math.ceil(span), limit=MAX_SINGLE_GRID_POINTS)


def loss_grid(discretization: float, eps_lower: float, eps_upper: float, what: str) -> tuple[int, np.ndarray]:
    """Grid indices floor(eps_lower/d) .. ceil(eps_upper/d) and their epsilons."""
    check_grid(discretization, eps_lower, eps_upper, what)
    lo = math.floor(eps_lower / discretization)
    hi = math.ceil(eps_upper / discretization)
    return lo, np.arange(lo, hi + 1) * discretization
