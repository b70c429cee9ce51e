"""A certified lower reference for the epsilon of Poisson-subsampled Gaussian DP-SGD.

Written apart from budgetplan's engine, sharing none of its code. The adversary is given
less than the mechanism's output: each step's output x is replaced by the index of the
privacy-loss bucket [k d, (k + 1) d) it falls in (the far tails of x joined to the end
buckets). That is a post-processing, so the hockey-stick divergence between the two laws
of the summed bucket indices is at most the mechanism's, at every epsilon. Those two laws
(under the upper and the lower distribution) are composed exactly, by an exponentially
tilted FFT in x87 extended precision (unit roundoff 5.4e-20), with a generous bound on its
rounding error subtracted from the upper law and added to the lower one. So

    delta_ref(eps) = sum_s (P_T(s) - e^eps Q_T(s))_+ <= delta(eps)   for every eps,

and the epsilon read from delta_ref is a certified lower bound on the true epsilon. The
bucketing loses little (the loss of a bucket is known to within d), so the bound is tight.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import fft, optimize, special

_U_LD = float(np.finfo(np.longdouble).eps) / 2


def _loss(x: np.ndarray, sigma: float, q: float, direction: str) -> np.ndarray:
    """ln(upper(x) / lower(x)), decreasing in x."""
    a = np.logaddexp(math.log1p(-q), math.log(q) + (-x - 0.5) / sigma**2)  # upper / N(0) for remove
    b = np.logaddexp(math.log1p(-q), math.log(q) + (x - 0.5) / sigma**2)   # lower / N(0) for add
    return {"remove": a, "add": -b, "replace": a - b}[direction]


def _cdf(x: np.ndarray, sigma: float, q: float, shift: float, survival: bool) -> np.ndarray:
    """CDF (or survival function) of (1 - q) N(0, s^2) + q N(-shift, s^2); shift 0 is N(0, s^2)."""
    s = -1.0 if survival else 1.0
    if shift == 0.0:
        return special.ndtr(s * x / sigma)
    return (1 - q) * special.ndtr(s * x / sigma) + q * special.ndtr(s * (x + shift) / sigma)


def _masses(edges_x: np.ndarray, sigma: float, q: float, shift: float) -> np.ndarray:
    """Mass of each x-interval (edges_x[k+1], edges_x[k]] (edges decreasing), with the tails."""
    cdf = _cdf(edges_x, sigma, q, shift, survival=False)
    sf = _cdf(edges_x, sigma, q, shift, survival=True)
    inner = np.where(edges_x[1:] < 0, cdf[:-1] - cdf[1:], sf[1:] - sf[:-1])
    inner = np.maximum(inner, 0.0)
    inner[0] += sf[0]     # x beyond the first edge (largest x, smallest loss)
    inner[-1] += cdf[-1]  # x below the last edge (smallest x, largest loss)
    return inner


def single_step(sigma: float, q: float, direction: str, d: float, tail: float):
    """(k0, P masses, Q masses) of the bucket index of one step, buckets k0, k0 + 1, ..."""
    x_lo = float(special.ndtri(tail)) * sigma - 1.0
    x_hi = -float(special.ndtri(tail)) * sigma + 1.0
    top = float(_loss(np.array(x_lo), sigma, q, direction))
    bottom = float(_loss(np.array(x_hi), sigma, q, direction))
    k = np.arange(math.floor(bottom / d), math.floor(top / d) + 1)
    edges = np.append(k, k[-1] + 1) * d
    lo, hi = np.full(edges.size, x_lo - 50 * sigma), np.full(edges.size, x_hi + 50 * sigma)
    for _ in range(200):  # inverse loss at every edge, by bisection
        mid = 0.5 * (lo + hi)
        above = _loss(mid, sigma, q, direction) > edges
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    x_edge = 0.5 * (lo + hi)  # decreasing in k
    up_shift = 0.0 if direction == "add" else 1.0    # upper: (1-q) N(0) + q N(-1), or N(0)
    low_shift = 0.0 if direction == "remove" else -1.0  # lower: N(0), or (1-q) N(0) + q N(+1)
    return int(k[0]), _masses(x_edge, sigma, q, up_shift), _masses(x_edge, sigma, q, low_shift)


def _log_mgf(lam: float, log_p: np.ndarray, k: np.ndarray):
    a = log_p + lam * k
    top = a.max()
    w = np.exp(a - top)
    s = w.sum()
    m = (w * k).sum() / s
    return top + math.log(s), m, (w * (k - m) ** 2).sum() / s


def _compose(masses: np.ndarray, count: int, lam: float, window: tuple[int, int], side: float):
    """count-fold law of the index sum on ``window`` (relative to count * k0), bounded on ``side``.

    side -1 gives a lower bound (errors subtracted), +1 an upper bound (errors added).
    """
    k = np.arange(masses.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_p = np.log(masses)
    k1, m1, v1 = _log_mgf(lam, log_p, k)
    lo_idx, hi_idx = window
    full = count * (masses.size - 1) + 1
    wrap = 0.0
    if lo_idx > 0 or hi_idx < full - 1:  # tilted mass outside the window may wrap anywhere
        sd = math.sqrt(count * v1)
        for sgn, edge in ((1, hi_idx), (-1, lo_idx)):
            best = 1.0
            for t in np.geomspace(1e-3, 1e2, 81) / max(sd, 1e-300):
                kt = _log_mgf(lam + sgn * t, log_p, k)[0]
                best = min(best, math.exp(min(0.0, count * (kt - k1) - sgn * t * edge)))
            wrap += best
    n_out = hi_idx - lo_idx + 1
    size = fft.next_fast_len(max(n_out, masses.size), real=True)
    w = np.exp((log_p + lam * k - k1).astype(np.longdouble))
    z = fft.rfft(w, size)
    result, base, n = None, z, count
    while True:
        if n & 1:
            result = base.copy() if result is None else result * base
        n >>= 1
        if not n:
            break
        base = base * base
    out = fft.irfft(result, size)[(lo_idx + np.arange(n_out)) % size].astype(np.float64)
    gamma = 2 * 8 * _U_LD * math.ceil(math.log2(size))
    absz = np.minimum(np.abs(z).astype(np.float64) + gamma, 1.0)
    with np.errstate(under="ignore", divide="ignore"):
        spread = float(np.exp(np.maximum((count - 1) * np.log(absz), -700.0)).sum()) * 2 / size
    err = 4 * (count + 2) * gamma * spread + wrap
    tilted = np.maximum(out + side * err, 0.0)
    s = lo_idx + np.arange(n_out, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        law = tilted * np.exp(np.minimum(np.maximum(count * k1 - lam * s, -745.0), 700.0))
    return law * (1 + side * 1e-9)


def dpsgd_epsilon(sigma: float, q: float, steps: int, delta: float, relation: str, d: float) -> float:
    """Certified lower bound on the epsilon of ``steps`` Poisson-subsampled Gaussian steps."""
    directions = ("replace",) if relation == "replace-one" else ("remove", "add")
    return max(_direction_epsilon(sigma, q, steps, delta, direction, d) for direction in directions)


def _direction_epsilon(sigma, q, steps, delta, direction, d) -> float:
    k0, p, qm = single_step(sigma, q, direction, d, tail=1e-30)
    kk = np.arange(p.size, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    # tilt: the Chernoff saddle point of the summed bucket loss (in units of buckets)
    res = optimize.minimize_scalar(
        lambda t: (steps * _log_mgf(math.exp(t), log_p, kk)[0] - math.log(delta)) / math.exp(t),
        bounds=(math.log(1e-6), math.log(50.0)), method="bounded")
    lam = math.exp(res.x)  # per bucket; the loss per bucket is d
    _, m1, v1 = _log_mgf(lam, log_p, kk)
    full = steps * (p.size - 1) + 1
    if full <= 1 << 22:
        window = (0, full - 1)
    else:
        mean, sd = steps * m1, math.sqrt(steps * v1)
        window = (max(0, math.floor(mean - 60 * sd)), min(full - 1, math.ceil(mean + 60 * sd)))
    law_p = _compose(p, steps, lam, window, -1.0)             # a lower bound on P_T
    law_q = _compose(qm, steps, lam + d, window, +1.0)  # an upper bound on Q_T; q ~ p e^{-k d}
    ratio_log = np.log(np.maximum(law_p, 1e-320)) - np.log(np.maximum(law_q, 1e-320))

    def delta_at(e: float) -> float:
        m = (law_p > 0) & (ratio_log > e)
        return float(np.sum(law_p[m] * -np.expm1(e - ratio_log[m])))

    if delta_at(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while delta_at(hi) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
        if hi - lo <= 1e-12 * hi:
            break
    return lo
