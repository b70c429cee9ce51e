"""Queries on a discretised PLD: the hockey-stick divergence and its inverse.

delta(eps) = m_inf + sum_{loss > eps} p (1 - e^{eps - loss}) read from suffix sums (epsilon
for a delta) or summed term by term (delta for epsilons). Every pmf of the engine is an
entrywise upper bound (see ``PLDPmf``), and delta(eps) is increasing in every mass, so both
answers are upper bounds, max over the PLD's directions.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from budgetplan.accounting.pld_types import PLD, PLDPmf
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["epsilon_for_delta", "delta_for_epsilon", "epsilon_for_delta_pmf"]

# Entries of the broadcast (epsilons x losses) matrix in delta_for_epsilon per chunk.
_DELTA_CHUNK = 1 << 20
# First chunk of the top-down epsilon scan (it doubles after each chunk without a crossing).
_EPS_SCAN_CHUNK = 1 << 13
# The composition reads epsilon at its own delta to check its rounding allowance, and the
# caller then reads it again: the last few answers are kept (with their pmfs, so that an id
# is never reused while its entry lives).
_RECENT: OrderedDict[tuple[int, float], tuple[PLDPmf, float]] = OrderedDict()
_RECENT_SIZE = 8


# --------------------------------------------------------------------------- queries


def epsilon_for_delta_pmf(pmf: PLDPmf, delta: float) -> float:
    key = (id(pmf), delta)
    hit = _RECENT.get(key)
    if hit is not None and hit[0] is pmf:
        return hit[1]
    eps = _scan_epsilon(pmf, delta)
    _RECENT[key] = (pmf, eps)
    while len(_RECENT) > _RECENT_SIZE:
        _RECENT.popitem(last=False)
    return eps


def _scan_epsilon(pmf: PLDPmf, delta: float) -> float:
    """Smallest eps >= 0 with delta(eps) <= delta for one direction.

    delta(eps) = m_inf + sum_{loss > eps} p (1 - e^{eps - loss}). Scanning the grid
    losses downwards, let U and W be the plain and the e^{-loss}-weighted mass strictly
    above the current loss l; on [l, next loss up) delta(eps) = U - e^eps W. The answer
    is ln((U - delta)/W) at the first l (from the top) where that is >= l, i.e. where
    (U - delta) e^{-l} >= W. Suffix sums give U and W for every l at once. The
    tie-breaking follows dp_accounting's _get_epsilon_for_delta loop.
    """
    if pmf.infinity_mass > delta:
        return math.inf
    p = pmf.probs[::-1]
    n = p.size
    top = pmf.lower_index + n - 1
    # The crossing is almost always in the upper tail: scan from the top in chunks that
    # double in size, carrying the suffix sums, instead of touching the whole grid.
    carry_u, carry_w = pmf.infinity_mass, 0.0
    start, size = 0, _EPS_SCAN_CHUNK
    while start < n:
        end = min(n, start + size)
        losses = (top - np.arange(start, min(n, end + 1))) * pmf.discretization  # one look-ahead loss
        with np.errstate(over="ignore", invalid="ignore"):
            weight = np.exp(-losses)
            chunk = p[start:end]
            # upper[m], lower[m]: masses at losses[0..m] (plain, e^{-loss}-weighted).
            upper = carry_u + np.cumsum(chunk)
            lower = carry_w + np.cumsum(weight[: end - start] * chunk)
            # Stop before adding entry m + 1 (masses strictly above it are upper[m], lower[m]);
            # the last grid entry is never a stop.
            m = end - start if end < n else end - start - 1
            slack = upper[:m] - delta
            stop = (slack > 0) & (lower[:m] > 0) & (slack * weight[1 : m + 1] >= lower[:m])
            # e^{-loss} underflowing to 0 (losses above ~745) ends the scan at that loss.
            underflow = (upper >= delta) & (lower == 0)
        first_stop = int(np.argmax(stop)) + 1 if stop.any() else None
        first_underflow = int(np.argmax(underflow)) if underflow.any() else None
        if first_underflow is not None and (first_stop is None or first_underflow < first_stop):
            return max(0.0, float(losses[first_underflow]))
        if first_stop is not None:
            u, w = upper[first_stop - 1], lower[first_stop - 1]
            break
        carry_u, carry_w = upper[-1], lower[-1]
        start, size = end, size * 2
    else:
        u, w = carry_u, carry_w
    if u <= w + delta:
        return 0.0
    return math.log((u - delta) / w)


def epsilon_for_delta(pld: PLD, delta: float) -> float:
    """Smallest epsilon >= 0 such that the PLD is (epsilon, delta)-DP; inf if none.

    Args:
        pld: the PLD; the answer is the maximum over its directions.
        delta: target delta in [0, 1].

    Returns:
        epsilon, or ``math.inf`` when the infinity mass already exceeds delta.

    Raises:
        InvalidParameterError (a ValueError): if delta is not in [0, 1].
    """
    d = validate.probability("delta", delta, allow_zero=True, allow_one=True)
    return max(epsilon_for_delta_pmf(p, d) for p in pld.pmfs)


def _delta_for_epsilons_pmf(pmf: PLDPmf, eps: np.ndarray) -> np.ndarray:
    """m_inf + sum_{loss > eps} p (1 - e^{eps - loss}) for each eps, term by term.

    Summing the non-negative terms directly (rather than U - e^eps W from suffix sums)
    keeps full relative accuracy for small deltas. Epsilons are processed in chunks
    of a broadcast matrix, losses at or below the chunk's smallest epsilon skipped.
    """
    losses = pmf.losses
    out = np.empty(eps.size)
    chunk = max(1, _DELTA_CHUNK // max(1, losses.size))
    for start in range(0, eps.size, chunk):
        e = eps[start : start + chunk]
        first = np.searchsorted(losses, e.min(), side="right") if np.isfinite(e.min()) else 0
        gap = np.minimum(e[:, None] - losses[None, first:], 0.0)
        out[start : start + chunk] = pmf.infinity_mass + np.einsum("en,n->e", -np.expm1(gap), pmf.probs[first:])
    return out


def delta_for_epsilon(pld: PLD, epsilon: float | np.ndarray) -> float | np.ndarray:
    """Hockey-stick divergence delta(epsilon), max over directions.

    Args:
        pld: the PLD.
        epsilon: a float or an array of floats (any shape; +-inf allowed).

    Returns:
        A float for a scalar epsilon, else an array of the same shape.

    Raises:
        InvalidParameterError (a ValueError): if an epsilon is NaN.
    """
    eps = np.asarray(epsilon, dtype=np.float64)
    if np.isnan(eps).any():
        raise InvalidParameterError(f"epsilon must not be NaN, got {epsilon!r}")
    flat = eps.reshape(-1)
    deltas: np.ndarray = np.max([_delta_for_epsilons_pmf(p, flat) for p in pld.pmfs], axis=0)
    if eps.ndim == 0:
        return float(deltas[0])
    return deltas.reshape(eps.shape)
