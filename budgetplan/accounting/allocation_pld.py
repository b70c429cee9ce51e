"""The PLD of random allocation: one epoch's privacy loss law, bounded in convex order.

Random allocation puts every example in exactly one of the T steps of an epoch, uniformly
(Feldman and Shenfeld, arXiv:2502.08202; its PLD, arXiv:2602.17284). Under add-remove, in
units of the clipping norm, the adversary who knows every other contribution sees T noisy
sums, P = (1/T) sum_t N(e_t, sigma^2 I) with the example and Q = N(0, sigma^2 I) without.
The likelihood ratio is Z = (1/T) sum_t Y_t with Y_t = exp((x_t - 1/2) / sigma^2)
independent lognormals under Q (ln Y ~ N(-v/2, v), v = 1/sigma^2, E Y = 1). Both directions
are functions of Z's law under Q alone:

    remove:  H_a(P || Q) = E_Q[(Z - a)_+]        add:  H_a(Q || P) = E_Q[(1 - a Z)_+]

and both are convex in Z. So any Z' with E[Z' | Z] = Z (a mean-preserving spread, larger in
the convex order) gives a pair (Q', P' = Z' Q') whose hockey-stick divergences are at least
the true ones at every a > 0, in both directions: a dominating pair, which composes
(Zhu, Dong and Wang, arXiv:2106.08567). Here Z' is built exactly that way:

1. Y on a geometric grid g_k = e^(a0 + k h): the lognormal's mass in each cell [g_k, g_{k+1}]
   is split between the two ends so that the cell's mean E[Y; cell] is kept (normal CDF
   differences); the mass below g_0 is split between 0 and g_0 the same way. Above y_top
   (the event U that some Y_t exceeds it, of probability below e^-70 under P and Q) nothing
   is kept.
2. The sum of T copies by repeated doubling. A pair of grid values g_i >= g_j sums to
   g_i (1 + e^-(i-j)h), between grid points i + c and i + c + 1 with c and the upper share w
   depending on d = i - j alone and w affine in g_j / g_i; the pair's mass is split between
   the two so that its mean is kept. Pairs are taken band by band (all d of one c at once,
   from prefix sums), about ln 2 / h bands, so a doubling costs O(n / h) for n grid points.
   The sum of spreads is a spread of the sum, so every level is a spread of the exact sum.
3. Z' = S' / T (a shift of the grid). What was dropped is put where it can only raise
   divergences: the remove direction's missing P-mass (1 - E_Q[Z'; not U] = P(U) up to
   rounding) at loss +inf, the add direction's missing Q-mass (U and the atom Z' = 0) at
   +inf.

The spreads add variance of order h^2 per doubling: second order. A spread at doubling level
j moves the mean of T / 2^j independent copies, so its share of Z's variance falls like
2^j / T: the top level's step is FINENESS (3%) of ln Z's standard deviation, and it doubles
every two levels down (at most 0.05). Against a grid half as fine, epsilon moves by under
0.1% at the Criteo shapes; 0.5-4 s per (sigma, T) at T = 1,953, cached. The atoms then go
onto the PLD grid by connect-the-dots (exact at its points, ``_pmf``) and the epochs
compose in the fast engine like any other PLD, so allocation phases compose with the
others exactly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from budgetplan.accounting import fastpld
from budgetplan.accounting.ctd import check_grid, readonly
from budgetplan.accounting.pld_types import ADD_REMOVE, PLD, PLDPmf
from budgetplan.errors import UnsupportedError
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate

__all__ = ["REFERENCE", "FINENESS", "MIN_NOISE", "grid_step", "epoch_pld", "epoch_pair", "check_applies"]

REFERENCE = "the PLD of random allocation (arXiv:2502.08202, arXiv:2602.17284)"

# The grid step of Y's sums, as a fraction of ln Z's standard deviation, and its limits.
FINENESS = 0.03
MIN_GRID_STEP = 1e-4
MAX_GRID_STEP = 2e-3
# Below this noise multiplier an epoch is accounted as one Gaussian release (no amplification):
# ln Y spans 1/sigma^2 + 24/sigma, the grid grows with it (6.5 s at 0.1, T = 2,000).
MIN_NOISE = 0.1
# Lower levels' steps: doubled every _EVERY levels down, at most _COARSEST.
_EVERY = 2
_COARSEST = 0.05
# Standard deviations of ln Y kept below and above: what is left out is below e^-70.
_TAILS = 12.0
# Mass below which the low end of a level is spread onto (0, first kept point): it only
# feeds the atom at 0, the add direction's +inf.
_LOW_DROP = 1e-40
# (band, point) pairs a top-level doubling may take (about a second): sets the finest grid.
_MAX_WORK = 2e7
# Entries of one block of (bands x points) in a doubling (16 MiB per array).
_CHUNK = 1 << 21
# Added to each direction's +inf mass: covers the float rounding of the prefix sums and of
# the mass bookkeeping (sums of ~1e5 terms of size <= 1, relative rounding 1.1e-16).
_ROUNDING = 1e-12


def _ndtr_between(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """P(lo < N(0, 1) < hi), from whichever tail keeps the small differences accurate."""
    upper = lo > 0
    out: np.ndarray = np.where(upper, special.ndtr(-lo) - special.ndtr(-hi), special.ndtr(hi) - special.ndtr(lo))
    return out


class _Law:
    """A sub-probability law on {0} and the grid points lo .. lo + len(p) - 1 (g_k = e^(a0 + k h))."""

    __slots__ = ("zero", "lo", "p")

    def __init__(self, zero: float, lo: int, p: np.ndarray):
        self.zero, self.lo, self.p = zero, lo, p


def _single(v: float, h: float) -> tuple[_Law, float]:
    """Y's law spread onto the grid; a0 = ln of the lowest grid point."""
    sd = math.sqrt(v)
    # from _TAILS sd below Q's mean of ln Y to _TAILS sd above P's (N(v/2, v) for the one step
    # that holds the example): U is then below e^-70 under either
    a0 = -v / 2 - _TAILS * sd
    cells = math.ceil((2 * _TAILS * sd + v) / h)
    edges = a0 + np.arange(cells + 1) * h
    z = (edges + v / 2) / sd                      # standard units under Q
    mass = _ndtr_between(z[:-1], z[1:])
    first = _ndtr_between(z[:-1] - sd, z[1:] - sd)  # E[Y; cell]: the tilt N(v/2, v)
    g = np.exp(edges)
    up = np.clip((first - g[:-1] * mass) / (g[1:] - g[:-1]), 0.0, mass)
    p = np.zeros(cells + 1)
    p[:-1] += mass - up
    p[1:] += up
    below_mass = float(special.ndtr(z[0]))
    below_first = float(special.ndtr(z[0] - sd))
    to_first = min(below_first / g[0], below_mass)
    p[0] += to_first
    return _Law(below_mass - to_first, 0, p), a0


@functools.lru_cache(maxsize=64)
def _bands(h: float, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first d, last d, c) of the runs of d in [0, n) with equal c(d) = floor(ln(1 + e^-dh) / h)."""
    d = np.arange(n, dtype=float)
    r = np.log1p(np.exp(-d * h))
    c = np.floor(r / h)
    # keep g_i e^(ch) <= g_i + g_j < g_i e^((c+1)h) exact where floor rounds across a boundary
    c = np.where(np.exp(c * h) > 1 + np.exp(-d * h), c - 1, c)
    c = np.where(np.exp((c + 1) * h) <= 1 + np.exp(-d * h), c + 1, c).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    ends = np.r_[starts[1:] - 1, n - 1]
    return starts, ends, c[starts]


def _pairs(x: _Law, y: _Law, h: float, dmin: int, base: int, size: int) -> np.ndarray:
    """The spread sums of x's points with y's points d >= dmin below them, on grid points base + k."""
    nx, ny = x.p.size, y.p.size
    shift = x.lo - y.lo  # y's index of the point at x's index 0
    dmax = shift + nx - 1
    out = np.zeros(size + 1)
    if dmax < dmin or nx == 0 or ny == 0:
        return out[:size]
    starts, ends, cs = _bands(h, dmax + 1)
    keep = ends >= dmin
    starts, ends, cs = np.maximum(starts[keep], dmin), ends[keep], cs[keep]
    ymass = np.r_[0.0, np.cumsum(y.p)]
    # sum_j y_j g_j / g_i, with g_j / g_i = e^((j - y.lo) h) e^((y.lo - x.lo - i) h): prefix sums
    # of y_j e^((j - y.lo) h), which span e^(ny h): in log space where that passes float range
    # (small sigma), plainly otherwise (faster)
    in_range = ny * h < 600.0
    if in_range:
        val = np.r_[0.0, np.cumsum(y.p * np.exp(np.arange(ny) * h))]
    else:
        with np.errstate(divide="ignore"):
            log_val = np.r_[-np.inf, np.logaddexp.accumulate(np.log(y.p) + np.arange(ny) * h)]
    i = np.arange(nx)[None, :]
    rows = max(1, _CHUNK // nx)
    for b in range(0, starts.size, rows):
        d0, d1, c = starts[b:b + rows, None], ends[b:b + rows, None], cs[b:b + rows, None]
        # band pairs x's i with y's j in [i + shift - d1, i + shift - d0] (clipped to y)
        jhi = np.clip(i + shift - d0, -1, ny - 1)
        jlo = np.clip(i + shift - d1, 0, ny)
        live = jhi >= jlo
        wq = np.where(live, ymass[jhi + 1] - ymass[jlo], 0.0)
        if in_range:
            wr = np.where(live, val[jhi + 1] - val[jlo], 0.0) * np.exp(-(shift + i) * h)
        else:
            top, bottom = log_val[jhi + 1], log_val[jlo]
            with np.errstate(invalid="ignore"):  # empty windows: -inf - -inf
                wr = np.exp(top - (shift + i) * h) * -np.expm1(bottom - top)
            wr = np.where(live & (top > -np.inf), wr, 0.0)
        upper = np.clip((np.exp(-c * h) * (wq + wr) - wq) / math.expm1(h), 0.0, wq)
        k = (x.lo - base + i + c).ravel()
        out += np.bincount(k, weights=(x.p * (wq - upper)).ravel(), minlength=size + 1)
        out += np.bincount(k + 1, weights=(x.p * upper).ravel(), minlength=size + 1)
    return out[:size]


def _add(x: _Law, y: _Law, h: float) -> _Law:
    """The law of the sum of independent x and y, spread onto the grid."""
    reach = math.ceil(math.log(2) / h) + 2
    base = min(x.lo, y.lo)
    top = max(x.lo + x.p.size, y.lo + y.p.size) + reach
    out = np.zeros(top - base)
    out[x.lo - base : x.lo - base + x.p.size] += y.zero * x.p
    out[y.lo - base : y.lo - base + y.p.size] += x.zero * y.p
    out += _pairs(x, y, h, 0, base, out.size)
    out += _pairs(y, x, h, 1, base, out.size)
    return _trim(_Law(x.zero * y.zero, base, out), h)


def _trim(law: _Law, h: float) -> _Law:
    """Drop the empty top; spread a low end of mass below _LOW_DROP (empty entries included)
    onto (0, its first kept point), keeping its mean."""
    nz = np.flatnonzero(law.p > 0)
    if nz.size == 0:
        return _Law(law.zero, law.lo, law.p[:0])
    p = law.p[: nz[-1] + 1]
    cut = int(np.searchsorted(np.cumsum(p), _LOW_DROP))  # the first index where the mass below reaches it
    if cut == 0:
        return _Law(law.zero, law.lo, p)
    low = p[:cut]
    mean_ratio = float(np.sum(low * np.exp((np.arange(cut) - cut) * h)))  # E[value] / g_cut
    kept = p[cut:].copy()
    kept[0] += mean_ratio
    return _Law(law.zero + float(low.sum()) - mean_ratio, law.lo + cut, kept)


def _refine(law: _Law, m: int) -> _Law:
    """The same law on the grid of step h / m (every old point is a new one: no spread)."""
    if m == 1:
        return law
    p = np.zeros((law.p.size - 1) * m + 1)
    p[::m] = law.p
    return _Law(law.zero, law.lo * m, p)


def _steps(t: int, h: float, coarsest: float, every: int) -> list[float]:
    """The grid step of each doubling level 0 .. floor(log2 t): h at the top, doubled every
    ``every`` levels down, at most ``coarsest`` (a spread at level j moves the mean of t / 2^j
    independent copies: its share of Z's variance falls like 2^j / t)."""
    top = t.bit_length() - 1
    out = []
    for j in range(top + 1):
        k = (top - j) // every
        while k > 0 and h * 2**k > coarsest:
            k -= 1
        out.append(h * 2**k)
    return out


def grid_step(noise_multiplier: float, steps_per_epoch: int, fineness: float = FINENESS) -> float:
    """The top level's grid step: ``fineness`` times the standard deviation of ln Z (the spreads'
    cost is relative to Z's own spread), within [MIN_GRID_STEP, MAX_GRID_STEP], and no finer
    than a doubling of about _MAX_WORK (band, point) pairs allows: ln 2 / h bands over the
    span of ln Z, from 12 sd below 1 to one Y at its top over T. Only very long epochs reach
    that floor (T = 1e5 at sigma 1): coarser is looser, never invalid."""
    v = 1.0 / noise_multiplier**2
    t = steps_per_epoch
    sd = math.sqrt(math.log1p(math.expm1(min(v, 700.0)) / t))
    span = math.log1p(math.exp(min(v / 2 + _TAILS * math.sqrt(v), 700.0)) / t) + _TAILS * sd
    work = math.sqrt(math.log(2) * span / _MAX_WORK)
    return min(MAX_GRID_STEP, max(MIN_GRID_STEP, fineness * sd, work))


@functools.lru_cache(maxsize=128)
def epoch_pair(noise_multiplier: float, steps_per_epoch: int, grid_step: float
               ) -> tuple[np.ndarray, np.ndarray, float]:
    """Z' of one epoch on a top grid step ``grid_step``: (ln z ascending, Q-mass, mass at z = 0).

    Sub-probability: what is missing (the event U) goes to +inf in both directions.
    """
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    h = validate.positive("grid_step", grid_step)
    steps = _steps(t, h, max(_COARSEST, h), _EVERY)
    power, a0 = _single(1.0 / sigma**2, steps[0])
    total: _Law | None = None
    total_h = steps[0]
    for j, hj in enumerate(steps):
        if j:
            power = _refine(power, round(steps[j - 1] / hj))
            power = _add(power, power, hj)
        if t >> j & 1:
            if total is None:
                total = power
            else:
                total = _add(_refine(total, round(total_h / hj)), power, hj)
            total_h = hj
    assert total is not None
    log_z = a0 + (total.lo + np.arange(total.p.size)) * total_h - math.log(t)
    q = np.maximum(total.p, 0.0)
    log_z.setflags(write=False)
    q.setflags(write=False)
    return log_z, q, total.zero


def _pmf(losses: np.ndarray, masses: np.ndarray, infinity: float, d: float) -> PLDPmf:
    """Connect-the-dots of a discrete pair onto the grid k d (arXiv:2207.04380).

    For atoms, connect-the-dots is exact and needs no curve: an atom of mass m at loss l in
    [k d, (k + 1) d] goes to both ends, keeping its mass and its mass times e^-l (the other
    distribution's), so the hockey-stick divergence is the pair's own at every grid point
    and its chord (above the pair's convex curve) in between. Both shares are >= 0: there
    is no difference of curves to round into spurious mass.
    """
    check_grid(d, float(losses.min()) - d, float(losses.max()) + d, "one epoch of random allocation")
    k = np.floor(losses / d)
    frac = losses - k * d
    up = np.clip(-np.expm1(-frac) / -math.expm1(-d), 0.0, 1.0)
    k = k.astype(np.int64)
    lo = int(k.min())
    probs = np.bincount(k - lo, weights=masses * (1.0 - up), minlength=int(k.max()) - lo + 2)
    probs += np.bincount(k - lo + 1, weights=masses * up, minlength=probs.size)
    return readonly(PLDPmf(d, lo, probs, infinity))


def check_applies(adjacency: Adjacency, unit: PrivacyUnit) -> None:
    """Refuse, for either accounting of random allocation, what neither bounds here."""
    if adjacency is not Adjacency.ADD_REMOVE:
        raise UnsupportedError("random allocation is accounted under add-remove only; use adjacency "
                               "'add-remove', or Poisson sampling for replace-one")
    if unit.cap > 1:
        raise UnsupportedError(f"no tight accounting of random allocation for K={unit.cap} examples per unit; "
                               "use unit_accounting 'group'")


def epoch_pld(*, noise_multiplier: float, steps_per_epoch: int, discretization: float = 1e-4,
              fineness: float = FINENESS) -> PLD:
    """The PLD of one epoch of random allocation (add-remove, sensitivity 1): (remove, add).

    Compose it over the epochs with ``fastpld.self_compose`` (the epochs' allocations are
    independent). ``fineness`` sets the grid of Z (``grid_step``); smaller is tighter and slower.
    """
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    d = validate.positive("discretization", discretization)
    f = validate.positive("fineness", fineness)
    if sigma < MIN_NOISE:
        # no amplification claimed: an epoch places one Gaussian release at a random step, a
        # post-processing of it (valid, and the epsilon is in the hundreds down here anyway)
        return fastpld.gaussian(noise_multiplier=sigma, relation=ADD_REMOVE, discretization=d)
    log_z, q, _zero = epoch_pair(sigma, t, grid_step(sigma, t, f))
    keep = q > 0
    log_z, q = log_z[keep], q[keep]
    p = np.exp(np.log(q) + log_z)  # P-masses: z alone can be large where q is tiny
    beta = max(0.0, 1.0 - float(np.sum(p))) + _ROUNDING
    missing = max(0.0, 1.0 - float(np.sum(q))) + _ROUNDING  # the event U and the atom at 0
    return PLD((_pmf(log_z, p, beta, d), _pmf(-log_z, q, missing, d)), ADD_REMOVE)
