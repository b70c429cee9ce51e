"""Composition and queries of fast-engine PLDs: real-FFT convolution and hockey-stick sums.

* Composition: convolution by real FFT (Koskela, Jalko, Honkela, "Computing Tight
  Differential Privacy Guarantees Using FFT", arXiv:1906.03049), the result cut to the
  window of dp_accounting's 40-order Chernoff bound (``tail_mass_truncation``).
* Queries: the hockey-stick divergence and its inverse from suffix sums.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft as _fft

from budgetplan import _validate
from budgetplan.accounting._pld_types import PLD, PLDPmf
from budgetplan.errors import InvalidParameterError

__all__ = ["self_compose", "compose", "epsilon_for_delta", "delta_for_epsilon"]

# Entries of the broadcast (epsilons x losses) matrix in delta_for_epsilon per chunk.
_DELTA_CHUNK = 1 << 20
# Below this many multiply-adds a direct convolution is faster than an FFT (and exact).
_DIRECT_CONVOLVE_MAX = 1 << 16
# First chunk of the top-down epsilon scan (it doubles after each chunk without a crossing).
_EPS_SCAN_CHUNK = 1 << 13


# ----------------------------------------------------------------------- composition


def _chernoff_window(probs: np.ndarray, count: int, tail_mass: float) -> tuple[int, int]:
    """Index window [lower, upper] of the count-fold convolution holding all but tail_mass.

    Chernoff bound on both tails at dp_accounting's orders t = +-k/n, k = 1..20 (n the
    pmf length, indices i = 0..n-1): the mass above u is at most MGF(t)^count e^{-t u},
    so u = (count ln MGF(t) + ln(2/tail))/t leaves at most tail/2 above u, and likewise
    below. All 40 MGFs come from one (20 x n) table of powers r_i^k, r_i = e^{i/n}, built
    by repeated multiplication (no per-entry exp), contracted with the pmf; the negative
    orders use the reversed pmf, MGF(-k/n) = e^{-k(n-1)/n} sum_j p_{n-1-j} r_j^k.
    Exponents stay within [-20, 20], so nothing overflows. The windows equal
    dp_accounting's compute_self_convolve_bounds (checked on DP-SGD grids).
    """
    n = probs.size
    upper, lower = (n - 1) * count, 0
    if tail_mass == 0:
        return lower, upper
    k = np.arange(1, 21)
    powers = np.empty((k.size, n))
    powers[0] = np.exp(np.arange(n) / n)
    for j in range(1, k.size):
        np.multiply(powers[j - 1], powers[0], out=powers[j])
    # einsum rather than a BLAS product: the latter spends milliseconds waking threads.
    mgf_up = np.einsum("kn,n->k", powers, probs)
    mgf_down = np.einsum("kn,n->k", powers, probs[::-1])
    log_2_over_tail = math.log(2 / tail_mass)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = k / n
        up = (count * np.log(mgf_up) + log_2_over_tail) / t
        down = (count * (np.log(mgf_down) - t * (n - 1)) + log_2_over_tail) / -t
    up, down = up[np.isfinite(up)], down[np.isfinite(down)]
    if up.size:
        upper = min(upper, math.ceil(up.min()))
    if down.size:
        lower = max(lower, math.floor(down.max()))
    return lower, upper


def _int_power(z: np.ndarray, n: int) -> np.ndarray:
    """z**n for an integer n >= 1 by repeated squaring.

    Several times faster than numpy's complex power (which goes through exp and log)
    and as accurate: either way the relative error grows like n times the rounding
    error of z, which is what limits FFT composition over 1e5 steps.
    """
    result = None
    base = z
    while True:
        if n & 1:
            result = base.copy() if result is None else np.multiply(result, base, out=result)
        n >>= 1
        if not n:
            return result
        base = base * base if base is z else np.multiply(base, base, out=base)


def _self_compose_pmf(pmf: PLDPmf, count: int, tail_mass: float) -> PLDPmf:
    """count-fold convolution of one direction, truncated to its Chernoff window.

    dp_accounting's conventions: the window may drop up to tail_mass, which is added
    to the infinity mass (pessimistic); infinity masses compose as 1 - (1 - m)^count.
    Whatever lies outside the window wraps around the circular FFT into it, which is
    at most tail_mass as well.
    """
    lower, upper = _chernoff_window(pmf.probs, count, tail_mass)
    out_len = upper - lower + 1
    size = _fft.next_fast_len(max(out_len, pmf.probs.size), real=True)
    spectrum = _int_power(_fft.rfft(pmf.probs, size), count)
    full = _fft.irfft(spectrum, size)
    start = lower % size  # the circular result, rotated so that index `lower` comes first
    if start + out_len <= size:
        probs = full[start : start + out_len].copy()
    else:
        probs = np.concatenate((full[start:], full[: start + out_len - size]))
    infinity = tail_mass - math.expm1(count * math.log1p(-pmf.infinity_mass))
    return PLDPmf(pmf.discretization, pmf.lower_index * count + lower, probs, infinity)


def _truncate_tails(probs: np.ndarray, tail_mass: float) -> tuple[int, np.ndarray, float]:
    """Drop the longest prefix and suffix each holding <= tail_mass/2 (pessimistically).

    The prefix mass moves onto the first kept entry, the suffix mass goes to +infinity.
    Returns (number dropped on the left, kept probs, mass for infinity).
    """
    if tail_mass == 0:
        return 0, probs, 0.0
    half = tail_mass / 2
    above = np.cumsum(probs) > half
    left = int(np.argmax(above)) if above.any() else probs.size
    above = np.cumsum(probs[::-1]) > half
    right = probs.size - (int(np.argmax(above)) if above.any() else probs.size)
    right = max(right, left + 1)
    kept = probs[left:right].copy()
    kept[0] += probs[:left].sum()
    return left, kept, float(probs[right:].sum())


def _compose_pmfs(a: PLDPmf, b: PLDPmf, tail_mass: float) -> PLDPmf:
    if a.probs.size * b.probs.size <= _DIRECT_CONVOLVE_MAX:
        probs = np.convolve(a.probs, b.probs)
    else:
        n = a.probs.size + b.probs.size - 1
        size = _fft.next_fast_len(n, real=True)
        probs = _fft.irfft(_fft.rfft(a.probs, size) * _fft.rfft(b.probs, size), size)[:n]
    infinity = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    left, probs, right_mass = _truncate_tails(probs, tail_mass)
    return PLDPmf(a.discretization, a.lower_index + b.lower_index + left, probs, infinity + right_mass)


def self_compose(pld: PLD, count: int, *, tail_mass_truncation: float = 1e-15) -> PLD:
    """PLD of ``count`` adaptive repetitions of the mechanism (each direction separately).

    Uses one real FFT per direction, raises the spectrum to the power ``count`` and keeps
    the Chernoff window; see dp_accounting's ``PrivacyLossDistribution.self_compose``.
    ``count == 1`` returns ``pld`` itself.

    Args:
        pld: the single-step PLD.
        count: number of compositions, an integer >= 1.
        tail_mass_truncation: mass the Chernoff window may drop; it is added to the
            infinity mass.

    Returns:
        The composed PLD, same relation and directions.

    Raises:
        InvalidParameterError (a ValueError): if count is not an integer >= 1.
    """
    count = _validate.positive_int("count", count)
    tail = _validate.probability("tail_mass_truncation", tail_mass_truncation, allow_zero=True)
    if count == 1:
        return pld
    return PLD(tuple(_self_compose_pmf(p, count, tail) for p in pld.pmfs), pld.relation)


def compose(a: PLD, b: PLD, *, tail_mass_truncation: float = 1e-15) -> PLD:
    """PLD of running ``a`` then ``b`` (directions paired: remove-remove, add-add).

    A single (symmetric) pmf pairs with both directions of the other. After the
    convolution the tails are truncated as in dp_accounting's ``DensePLDPmf.compose``:
    the longest prefix and suffix holding at most tail_mass_truncation/2 each are cut,
    the prefix mass moving onto the first kept loss and the suffix mass to infinity.

    Args:
        a: the first PLD.
        b: the second PLD, same relation and discretization.
        tail_mass_truncation: total tail mass that may be cut.

    Returns:
        The composed PLD.

    Raises:
        InvalidParameterError (a ValueError): if the relations or discretizations differ.
    """
    if a.relation != b.relation:
        raise InvalidParameterError(f"cannot compose a {a.relation} PLD with a {b.relation} PLD")
    if a.pmfs[0].discretization != b.pmfs[0].discretization:
        raise InvalidParameterError(
            f"discretizations differ: {a.pmfs[0].discretization} != {b.pmfs[0].discretization}"
        )
    tail = _validate.probability("tail_mass_truncation", tail_mass_truncation, allow_zero=True)
    n = max(len(a.pmfs), len(b.pmfs))
    pmfs = tuple(_compose_pmfs(a.pmfs[min(i, len(a.pmfs) - 1)], b.pmfs[min(i, len(b.pmfs) - 1)], tail) for i in range(n))
    return PLD(pmfs, a.relation)


# --------------------------------------------------------------------------- queries


def _epsilon_for_delta_pmf(pmf: PLDPmf, delta: float) -> float:
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
    d = _validate.probability("delta", delta, allow_zero=True, allow_one=True)
    return max(_epsilon_for_delta_pmf(p, d) for p in pld.pmfs)


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
    deltas = np.max([_delta_for_epsilons_pmf(p, flat) for p in pld.pmfs], axis=0)
    if eps.ndim == 0:
        return float(deltas[0])
    return deltas.reshape(eps.shape)
