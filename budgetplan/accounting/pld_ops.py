"""Composition of discretised PLDs: an exponentially tilted FFT with a rounding allowance.

Why tilted. A float64 FFT leaves absolute rounding noise on every composed mass (about
1e-16 per entry, some 1e-11 in all after 1e5 steps). Read at delta <= 1e-10 that noise is
the answer, in either direction: dp_accounting's PLD and the plain FFT used here before both
moved epsilon by percents there. So the composition is done on the tilted pmf
p_j e^{lambda L_j} / M(lambda) (the Esscher transform; convolution commutes with it), with
lambda at most the Chernoff saddle point of the delta asked for (where the tilted law's
mean is about the epsilon read): the smallest tilt that brings the rounding allowance at
that delta to about 1e-5 of it (``pld_tilt``), since larger tilts widen the law. The FFT
noise is then relative to the masses that decide delta, and the masses are untilted after.

Why an allowance. Every composed mass is raised by a bound on its floating-point error, so
that the stored pmf is an entrywise upper bound of the exact composition and every epsilon
read from it an upper bound (delta(eps) is increasing in every mass, and entrywise bounds
survive further composition). The bound is componentwise: a length-N FFT of x has
|error_k| <= gamma_N sum|x| (Higham 2002, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., section 24.1, gamma_N = (1 + eta)^{log2 N} - 1 with eta = mu +
gamma_4 (sqrt 2 + mu) for radix 2; taken here as eta = 8u, doubled for pocketfft's higher
radices), propagated through the powers of the spectrum and the inverse FFT; the tilting
and untilting exp() add a relative error, counted too. At the delta asked for it costs about
1e-5 of delta, i.e. ~1e-6 of epsilon. The single-step masses themselves are computed to
rounding accuracy (see fastpld) and are not inflated further.

Windows. Only the losses between Chernoff bounds of the (tilted) composition are kept: the
mass above the window is added to the infinity mass and the mass below it is moved up onto
the window's first loss, both bounded by Chernoff's inequality on the exact cumulant
generating function of the pmfs (pessimistic). With a tilt, the window is centred on the
delta asked for: epsilons read far below it (much larger deltas) stay upper bounds but are
loose; account() builds one PLD per delta it reads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import fft as _fft

from budgetplan.accounting.limits import MAX_COMPOSITIONS, MAX_GRID_POINTS, MIN_PLD_DELTA
from budgetplan.accounting.pld_query import epsilon_for_delta_pmf
from budgetplan.accounting.pld_tilt import Term, Terms, chernoff_window, choose_tilt, tilt_with_mean, tilted_mean
from budgetplan.accounting.pld_types import PLD, PLDPmf
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["self_compose", "compose", "compose_all", "window_size", "GridLimitError"]

_U = 2.0**-53
# Per-stage componentwise FFT error (Higham's eta for radix 2, rounded up) and a factor for
# the radix-3/4/5 butterflies of pocketfft.
_FFT_STAGE_ERROR = 8 * _U
_FFT_SAFETY = 2.0
# Relative error of one complex multiplication (sqrt(5) u), rounded up.
_MULTIPLY_ERROR = 4 * _U
# Tilted mass the window may leave out on each side when composing for a delta. Its
# untilted share above the window is at most this times ~delta, and moves to infinity.
_TILTED_TAIL = 1e-12
# If a composition shows a rounding allowance above this share of delta at the epsilon read,
# it is redone at the tilt that centres the law on that epsilon.
_ALLOWANCE_LIMIT = 1e-3
# The untilted mass the window may move to infinity, as a share of delta.
_INFINITY_SHARE = 1e-4
# Compositions tried at most for one delta when the first tilt proves off.
_RETILTS = 6
# Below this many multiply-adds a direct convolution is faster than an FFT (and its error
# is relative, so no noise floor).
_DIRECT_CONVOLVE_MAX = 1 << 16


class GridLimitError(InvalidParameterError):
    """A composition needs more grid points than ``MAX_GRID_POINTS``.

    ``points`` is how many it needs; the grid length scales like 1/discretization, so
    ``discretization * points / limit`` (a little more) fits.
    """

    def __init__(self, message: str, *, points: int, limit: int):
        super().__init__(message)
        self.points = points
        self.limit = limit


# ----------------------------------------------------------------------- composition


def _fft_gamma(size: int) -> float:
    return _FFT_SAFETY * math.expm1(math.ceil(math.log2(max(size, 2))) * math.log1p(_FFT_STAGE_ERROR))


def _int_power(z: np.ndarray, n: int) -> np.ndarray:
    """z**n for an integer n >= 1 by repeated squaring.

    Several times faster than numpy's complex power (which goes through exp and log); its
    relative error is at most n times that of one multiplication, which the allowance
    counts.
    """
    result: np.ndarray | None = None
    base = z
    while True:
        if n & 1:
            result = base.copy() if result is None else np.multiply(result, base, out=result)
        n >>= 1
        if not n:
            assert result is not None  # n >= 1 sets it on the first pass
            return result
        base = base * base if base is z else np.multiply(base, base, out=base)


def _tilted(term: Term, lam: float) -> tuple[np.ndarray, float, float]:
    """(p e^{lam L} / M, ln M, relative error bound of the tilted masses)."""
    a = term.log_p + lam * term.losses
    top = float(a.max())
    w = np.exp(a - top)
    s = float(w.sum())
    finite = term.log_p[np.isfinite(term.log_p)]
    # ln p, lam L and the shift each carry relative rounding, which exp turns into a
    # relative error of the mass of |argument| * u; then the division.
    scale = float(np.max(np.abs(finite))) + 3.0 * abs(lam) * float(np.max(np.abs(term.losses))) + abs(top)
    return w / s, top + math.log(s), (scale + 4.0) * _U


def _compose_fft(terms: Sequence[Term], lam: float, tail_up: float, tail_down: float,
                 infinity_budget: float = 1.0) -> PLDPmf:
    d = terms[0].pmf.discretization
    low, high, mass_above, mass_below = chernoff_window(terms, lam, tail_up, tail_down, infinity_budget)
    out_len = high - low + 1
    if out_len > MAX_GRID_POINTS:
        raise GridLimitError(
            f"discretization {d:g} needs {out_len:,} grid points for this composition (limit "
            f"{MAX_GRID_POINTS:,}); use discretization >= {d * out_len / MAX_GRID_POINTS * 1.05:.3g}",
            points=out_len, limit=MAX_GRID_POINTS)
    size = _fft.next_fast_len(max(out_len, max(t.pmf.probs.size for t in terms)), real=True)
    gamma = _fft_gamma(size)
    spectrum, log_scale, rel = None, 0.0, 0.0
    log_bounds = []  # ln of an upper bound on |exact spectrum| and |computed spectrum|, per term
    for t in terms:
        p, log_m, rel_t = _tilted(t, lam)
        z = _fft.rfft(p, size)
        mass = float(p.sum()) * (1.0 + (math.log2(p.size) + 2.0) * _U)
        bound = np.abs(z)
        bound += gamma * mass
        np.minimum(bound, mass, out=bound)
        log_bounds.append(np.log(bound, out=bound))
        power = _int_power(z, t.count)
        spectrum = power if spectrum is None else np.multiply(spectrum, power, out=spectrum)
        log_scale += t.count * log_m
        rel += t.count * math.log1p(rel_t)
    # Componentwise error of the spectrum: each term's FFT error times the derivative of
    # prod z_i^{T_i} (mean value theorem, every factor bounded), plus the rounding of the
    # powers and products and of the inverse FFT; irfft weighs the interior bins twice.
    pow_err = math.expm1((sum(t.count for t in terms) + len(terms)) * math.log1p(_MULTIPLY_ERROR))
    # Exponents are clipped at -700 (rounding the bound up): subnormals are slow.
    if len(terms) == 1:  # a^{T-1} (T gamma + (pow_err + gamma) a)
        (t,), (lb,) = terms, log_bounds
        err = np.maximum((t.count - 1) * lb, -700.0)
        np.exp(err, out=err)
        err *= t.count * gamma + (pow_err + gamma) * np.exp(np.maximum(lb, -700.0))
    else:
        total = sum(t.count * lb for t, lb in zip(terms, log_bounds))
        err = sum(t.count * gamma * np.exp(np.maximum(total - lb, -700.0)) for t, lb in zip(terms, log_bounds))
        err += (pow_err + gamma) * np.exp(np.maximum(total, -700.0))
    weight = np.full(err.size, 2.0)
    weight[0] = 1.0
    if size % 2 == 0:
        weight[-1] = 1.0
    rounding = float(np.einsum("i,i->", weight, err)) / size * (1.0 + 1e-6)
    full = _fft.irfft(spectrum, size)
    start = low % size  # the circular result, rotated so that index `low` comes first
    if start + out_len <= size:
        tilted = full[start : start + out_len]
    else:
        tilted = np.concatenate((full[start:], full[: start + out_len - size]))
    base = sum(t.count * t.pmf.lower_index for t in terms) + low
    # Untilting rounds like tilting: relative error |argument| * u per mass.
    extreme = max(abs(base), abs(base + out_len - 1)) * d
    rel += math.log1p((abs(log_scale) + 3.0 * abs(lam) * extreme + 4.0) * _U)
    # ln of the untilting factor, clipped at -700 from below (rounding up; no subnormals).
    factor = np.arange(base, base + out_len, dtype=np.float64)
    factor *= -lam * d
    factor += log_scale + rel
    np.maximum(factor, -700.0, out=factor)
    with np.errstate(over="ignore"):
        np.exp(factor, out=factor)
    probs = tilted + rounding
    np.maximum(probs, 0.0, out=probs)
    probs *= factor
    np.minimum(probs, 1.0, out=probs)  # far below the window's centre the allowance is vacuous
    probs[0] = min(1.0, probs[0] + mass_below)
    finite = -math.expm1(sum(t.count * math.log1p(-t.pmf.infinity_mass) for t in terms))
    return PLDPmf(d, base, probs, min(1.0, finite + mass_above), lam, log_scale, rounding)


def _compose_direct(a: PLDPmf, b: PLDPmf) -> PLDPmf:
    """Two pmfs convolved directly; the sums of products carry relative error only."""
    probs = np.convolve(a.probs, b.probs) * (1.0 + 2.0 * (min(a.probs.size, b.probs.size) + 2) * _U)
    infinity = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    return PLDPmf(a.discretization, a.lower_index + b.lower_index, probs, infinity)


def _compose_direction(pairs: Sequence[tuple[PLDPmf, int]], delta: float | None, tail: float) -> PLDPmf:
    if len(pairs) == 1 and pairs[0][1] == 1:
        return pairs[0][0]
    if len(pairs) == 2 and pairs[0][1] == pairs[1][1] == 1 and \
            pairs[0][0].probs.size * pairs[1][0].probs.size <= _DIRECT_CONVOLVE_MAX:
        return _compose_direct(pairs[0][0], pairs[1][0])
    terms = Terms(Term.of(p, c) for p, c in pairs)
    if delta is None:
        half = max(tail / 2, 1e-300)  # no truncation at all would keep the full linear length
        return _compose_fft(terms, 0.0, half, half)
    size_guess = sum(t.count * t.pmf.probs.size for t in terms)
    return _compose_for_delta(terms, delta, choose_tilt(terms, delta, _fft_gamma(min(size_guess, MAX_GRID_POINTS))))


def _compose_for_delta(terms: Sequence[Term], delta: float, lam: float) -> PLDPmf:
    """The tilted composition at ``lam``, re-tilted while the epsilon at delta shows a bad tilt.

    Too small a tilt shows as an allowance above _ALLOWANCE_LIMIT x delta at the epsilon
    read; too large a one (the tilted law jumps past that epsilon, as the heavy remove
    tail of a subsampled Gaussian does at deltas like 1e-40) as that epsilon sitting on
    the window's first loss, where the mass below the window was moved, or as an allowance
    above the limit with the tilted mean already above that epsilon. Every attempt is
    a valid upper bound, so the one with the smallest epsilon is returned.
    """
    budget = _INFINITY_SHARE * delta
    best, best_eps = None, math.inf
    lo, hi = 0.0, math.inf  # tilts known to be too small / too large
    for _ in range(_RETILTS):
        try:
            pmf = _compose_fft(terms, lam, _TILTED_TAIL, _TILTED_TAIL, budget)
        except GridLimitError:
            if best is None:
                raise
            break  # a re-tilt whose window does not fit: keep the best bound so far
        eps = epsilon_for_delta_pmf(pmf, delta)
        if best is None or eps < best_eps:
            best, best_eps = pmf, eps
        if not math.isfinite(eps):
            break
        if lam > 0 and (eps <= (pmf.lower_index + 1) * pmf.discretization or (
                pmf.allowance(eps) > _ALLOWANCE_LIMIT * delta and tilted_mean(terms, lam) > eps)):
            hi = lam  # on the first loss, or centred above eps with the masses at eps in the noise
        elif pmf.allowance(eps) > _ALLOWANCE_LIMIT * delta:
            lo = lam
        else:
            break
        # The next tilt: centred on the epsilon found if that lies in (lo, hi), else halfway.
        target = tilt_with_mean(terms, eps) if hi == math.inf else 0.0
        lam = target if lo < target < hi else (0.5 * (lo + hi) if hi < math.inf else 2.0 * lam + 1.0)
    assert best is not None  # the first composition either fits or raised
    return best


# ------------------------------------------------------------------------ public API


def compose_all(
    parts: Sequence[tuple[PLD, int]], *, delta: float | None = None, tail_mass_truncation: float = 1e-15
) -> PLD:
    """PLD of running every ``(pld, count)`` part ``count`` times, in one FFT per direction.

    Directions are paired (remove with remove, add with add); a single (symmetric) pmf
    pairs with both directions of the others.

    Args:
        parts: (PLD, count) pairs, same relation and discretization, count >= 1.
        delta: the delta the result will be read at. Given, the composition is tilted
            for it (tight there, a valid but loose upper bound far from it); None composes
            untilted (every delta read to the same absolute accuracy, as dp_accounting).
        tail_mass_truncation: untilted composition only: the mass the window may drop, half
            on each side (added to infinity above, moved onto the first loss below).

    Returns:
        The composed PLD; its masses are entrywise upper bounds (see ``PLDPmf``).

    Raises:
        InvalidParameterError (a ValueError): on mismatched relations or grids, a count
            that is not an integer in [1, MAX_COMPOSITIONS], a delta outside
            [MIN_PLD_DELTA, 1), or a composition that needs more than MAX_GRID_POINTS
            losses (a ``GridLimitError`` naming the discretization that fits).
    """
    parts = list(parts)
    if not parts:
        raise InvalidParameterError("parts must name at least one (PLD, count) pair")
    first = parts[0][0]
    counts = []
    for pld, count in parts:
        if pld.relation != first.relation:
            raise InvalidParameterError(f"cannot compose a {first.relation} PLD with a {pld.relation} PLD")
        if pld.pmfs[0].discretization != first.pmfs[0].discretization:
            raise InvalidParameterError(
                f"discretizations differ: {first.pmfs[0].discretization} != {pld.pmfs[0].discretization}")
        count = validate.positive_int("count", count)
        if count > MAX_COMPOSITIONS:
            raise InvalidParameterError(
                f"count must be at most {MAX_COMPOSITIONS:.0e} for PLD composition, got {count:.4g}")
        counts.append(count)
    if delta is not None:
        delta = validate.probability("delta", delta)
        if delta < MIN_PLD_DELTA:
            raise InvalidParameterError(
                f"delta must be >= {MIN_PLD_DELTA:g} for PLD accounting, got {delta:g}")
    tail = validate.probability("tail_mass_truncation", tail_mass_truncation, allow_zero=True)
    if len(parts) == 1 and counts[0] == 1:
        return first
    n = max(len(p.pmfs) for p, _ in parts)
    pmfs = tuple(
        _compose_direction([(p.pmfs[min(i, len(p.pmfs) - 1)], c) for (p, _), c in zip(parts, counts)], delta, tail)
        for i in range(n))
    return PLD(pmfs, first.relation)


def window_size(parts: Sequence[tuple[PLD, int]], delta: float) -> int:
    """The longest grid ``compose_all(parts, delta=delta)`` would need, without composing.

    Runs the tilt choice and the Chernoff window of each direction (no FFT), so a caller can
    tell whether a composition fits MAX_GRID_POINTS before paying for it.
    """
    n = max(len(p.pmfs) for p, _ in parts)
    longest = 0
    for i in range(n):
        pairs = [(p.pmfs[min(i, len(p.pmfs) - 1)], c) for p, c in parts]
        if len(pairs) == 1 and pairs[0][1] == 1:
            longest = max(longest, pairs[0][0].probs.size)
            continue
        terms = Terms(Term.of(p, c) for p, c in pairs)
        size_guess = sum(t.count * t.pmf.probs.size for t in terms)
        lam = choose_tilt(terms, delta, _fft_gamma(min(size_guess, MAX_GRID_POINTS)))
        low, high, _, _ = chernoff_window(terms, lam, _TILTED_TAIL, _TILTED_TAIL, _INFINITY_SHARE * delta)
        longest = max(longest, high - low + 1)
    return longest


def self_compose(pld: PLD, count: int, *, delta: float | None = None, tail_mass_truncation: float = 1e-15) -> PLD:
    """PLD of ``count`` adaptive repetitions of the mechanism (each direction separately).

    One real FFT per direction, the spectrum raised to the power ``count``; see
    ``compose_all`` for ``delta`` and ``tail_mass_truncation``. ``count == 1`` returns
    ``pld`` itself.

    Raises:
        InvalidParameterError (a ValueError): if count is not an integer in [1, 1e9].
    """
    return compose_all([(pld, count)], delta=delta, tail_mass_truncation=tail_mass_truncation)


def compose(a: PLD, b: PLD, *, delta: float | None = None, tail_mass_truncation: float = 1e-15) -> PLD:
    """PLD of running ``a`` then ``b`` (directions paired: remove-remove, add-add).

    Small pmfs are convolved directly; larger ones by FFT as in ``compose_all``.

    Raises:
        InvalidParameterError (a ValueError): if the relations or discretizations differ.
    """
    return compose_all([(a, 1), (b, 1)], delta=delta, tail_mass_truncation=tail_mass_truncation)
