"""Hockey-stick curve of a mixture-of-Gaussians (MoG) mechanism, vectorised.

A MoG mechanism adds N(0, sigma^2) noise to a sum whose sensitivity is random: it is
``sensitivities[i]`` with probability ``probabilities[i]``. For user-level DP-SGD, a user
with K examples each Poisson-sampled at rate q has sensitivity k ~ Binomial(K, q).
The scalar mechanism dominates the vector-valued one (Choquette-Choo, Ganesh, Steinke,
Thakurta, arXiv:2310.15526, Corollary 4.7).

With mu = N(0, sigma^2) and the add-remove relation:

* REMOVE: upper = sum_i p_i mu(x + s_i), lower = mu(x);
* ADD:    upper = mu(x),                 lower = sum_i p_i mu(x - s_i).

The privacy loss ln(upper/lower) is decreasing in x but, unlike the subsampled
Gaussian, has no closed-form inverse. ``split_terms`` solves it for every grid epsilon
at once with a monotone Newton iteration (``_solve_lse``) and returns the two terms of
the exact divergence delta(eps) = upper(X <= x*) - e^eps lower(X <= x*) at the root x*.
This module only serves ``fastpld.mixture_of_gaussians``, which owns the grid and the
discretisation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scipy import special

__all__ = ["Atoms", "Mixture", "binomial_window", "grid_loss_bounds", "lse_atoms", "split_terms"]

# dp_accounting's tail search for the REMOVE direction stops at this width (in x).
_TAIL_SEARCH_PRECISION = 1e-4


class Atoms:
    """Noise and (sensitivity, probability) atoms, validated by the caller; shared by ``Mixture``
    and ``double_mog.DoubleMixture``.

    Atoms with probability 0 are dropped; ``pos`` selects the positive sensitivities,
    ``p_zero`` is the mass of the sensitivity-0 atom, ``bottom`` the mass left out altogether
    (an infinite sensitivity, pessimistic). c_i = ln p_i - s_i^2 / (2 sigma^2): the log
    likelihood ratios are log-sum-exps of the lines c_i -/+ s_i x / sigma^2.
    """

    __slots__ = ("sigma", "sens", "probs", "pos", "p_zero", "bottom", "c")

    def __init__(self, sigma: float, sensitivities: npt.ArrayLike, probabilities: npt.ArrayLike,
                 bottom: float = 0.0) -> None:
        sens = np.asarray(sensitivities, dtype=np.float64)
        probs = np.asarray(probabilities, dtype=np.float64)
        keep = probs != 0.0
        self.sigma = float(sigma)
        self.sens, self.probs = sens[keep], probs[keep]
        self.pos = self.sens > 0.0
        self.p_zero = float(self.probs[~self.pos].sum())
        self.bottom = float(bottom)
        self.c = np.log(self.probs) - 0.5 * self.sens**2 / self.sigma**2


class Mixture(Atoms):
    """A MoG (validated by the caller): noise scale plus (sensitivity, probability) atoms.

    Atoms with probability 0 are dropped. ``pos`` selects the atoms with a positive
    sensitivity; their total mass ``q`` is the probability that the user contributes
    anything at all, and ``p_zero`` is the mass of the sensitivity-0 atom. ``bottom`` is
    the mass of atoms left out altogether (their sensitivities treated as infinite, which
    dominates any finite one): the probabilities then sum to 1 - bottom.
    """

    __slots__ = ("q",)

    def __init__(self, sigma: float, sensitivities: npt.ArrayLike, probabilities: npt.ArrayLike,
                 bottom: float = 0.0) -> None:
        super().__init__(sigma, sensitivities, probabilities, bottom)
        # 1 - p_zero = q + bottom: the left-out mass is an outcome the lower distribution never gives.
        self.q = float(np.clip(self.probs[self.pos].sum(), 0.0, 1.0))

    def privacy_loss(self, x: float, adjacency: str) -> float:
        """ln(upper(x) / lower(x)) at a scalar x, for 'remove' or 'add'."""
        slope = self.sens * x / self.sigma**2
        if adjacency == "remove":
            return float(np.logaddexp.reduce(self.c - slope))
        return float(-np.logaddexp.reduce(self.c + slope))

    def upper_cdf(self, x: float) -> float:
        """CDF at scalar x of the REMOVE upper distribution sum_i p_i mu(x + s_i)."""
        return float(np.sum(special.ndtr((x + self.sens) / self.sigma) * self.probs))


def _binomial_tail_bound(count: int, rate: float, a: float) -> float:
    """Chernoff: P[J >= a] (a above the mean) or P[J <= a] (below) <= exp(-n D(a/n || q))."""
    x = min(max(a / count, 0.0), 1.0)
    kl = float(special.rel_entr(x, rate) + special.rel_entr(1.0 - x, 1.0 - rate))
    return math.exp(-count * kl)


def binomial_window(count: int, rate: float, drop: float) -> tuple[int, int, float]:
    """The shortest k-window [lo, hi] of Binomial(count, rate) whose two tails hold <= drop.

    Found by bisection on Chernoff's bound of each tail, so nothing of length ``count`` is
    built. Returns (lo, hi, bound on the mass outside); the caller treats that mass as an
    infinite sensitivity (pessimistic, see ``Mixture``).
    """
    mean = count * rate
    half = drop / 2

    def first_ok(lo_k: int, hi_k: int, ok: Callable[[int], bool]) -> int:
        while lo_k < hi_k:
            mid = (lo_k + hi_k) // 2
            if ok(mid):
                hi_k = mid
            else:
                lo_k = mid + 1
        return lo_k

    # hi: the smallest k >= mean with P[J >= k + 1] <= drop / 2 (or count).
    hi = first_ok(min(count, math.ceil(mean)), count,
                  lambda k: k >= count or _binomial_tail_bound(count, rate, k + 1) <= half)
    # lo: the largest k <= mean with P[J <= k - 1] <= drop / 2 (or 0), as -(smallest of -k).
    top = max(0, math.floor(mean))
    lo = top - first_ok(0, top, lambda j: top - j <= 0 or _binomial_tail_bound(count, rate, top - j - 1) <= half)
    outside = (_binomial_tail_bound(count, rate, hi + 1) if hi < count else 0.0) + \
        (_binomial_tail_bound(count, rate, lo - 1) if lo > 0 else 0.0)
    return lo, hi, min(1.0, outside)


def grid_loss_bounds(mix: Mixture, adjacency: str, log_mass_truncation_bound: float) -> tuple[float, float]:
    """(eps_lower, eps_upper): the privacy losses at the truncated support's ends.

    Follows dp_accounting's MixtureGaussianPrivacyLoss.privacy_loss_tail so that the
    discretisation grids coincide: x is truncated where the noise tail mass is
    exp(bound)/2; in the REMOVE direction the lower end is found by bisection on the
    mixture CDF down to a width of 1e-4, keeping the left end.
    """
    tail_mass = 0.5 * math.exp(log_mass_truncation_bound)
    z = float(special.ndtri(tail_mass)) * mix.sigma
    upper_x = -z
    if adjacency == "add":
        lower_x = z
    else:
        lo, hi = z - float(mix.sens.max()), z
        while hi - lo > _TAIL_SEARCH_PRECISION:
            mid = (lo + hi) / 2
            if mix.upper_cdf(mid) <= tail_mass:
                lo = mid
            else:
                hi = mid
        lower_x = lo
    return mix.privacy_loss(upper_x, adjacency), mix.privacy_loss(lower_x, adjacency)


def _solve_lse(c: np.ndarray, s: np.ndarray, var: float, target: np.ndarray) -> np.ndarray:
    """Solve logsumexp_i(c_i - s_i y / var) = target for y, elementwise over target.

    The left side G(y) is convex and strictly decreasing (every s_i > 0). Newton's
    method started left of the root never overshoots on such a function (the tangent
    lies below G), so it climbs monotonically to the root; the start
    y0 = max_i (c_i - target) var / s_i is left of the root because G is above each of
    its lines. Convergence is quadratic (about four rounds on the DP-SGD grids); a
    point leaves the working set once its step is below 1e-9, after which the point
    it landed on is exact to rounding. Arrays are (atoms x points) so that every
    reduction runs over the short axis with long vectorised rows.
    """
    c, s = c[:, None], s[:, None]
    y: np.ndarray = np.max((c - target[None, :]) * var / s, axis=0)
    active = np.arange(y.size)
    for _ in range(100):
        if active.size == 0:
            break
        ya = y[active]
        terms = c - s * (ya / var)
        top = terms.max(axis=0)
        w = np.exp(terms - top)
        wsum = w.sum(axis=0)
        step = np.maximum(top + np.log(wsum) - target[active], 0.0) * var * wsum / (s * w).sum(axis=0)
        y[active] = ya + step
        active = active[step > 1e-9 * (1.0 + np.abs(ya))]
    return y


def lse_atoms(log_cdf: np.ndarray, log_w: np.ndarray) -> np.ndarray:
    """ln sum_i exp(log_w[i] + log_cdf[i, :]) per column, -inf where every term is."""
    a = log_cdf + log_w[:, None]
    top = a.max(axis=0)
    safe = np.where(np.isfinite(top), top, 0.0)
    out: np.ndarray = safe + np.log(np.exp(a - safe).sum(axis=0))
    return out


def _exp_minus(x: np.ndarray, mix: Mixture) -> np.ndarray:
    """e^x - p0 as expm1(x) + (q + bottom), accurate near x = 0; only its sign is read above 0."""
    out: np.ndarray = np.where(x > 0, 1.0, np.expm1(np.minimum(x, 0.0)) + (mix.q + mix.bottom))
    return out


def _log_exp_minus(x: np.ndarray, mix: Mixture) -> np.ndarray:
    """ln(e^x - p0) where e^x > p0, without overflow for large x."""
    out = np.empty_like(x)
    big = x > 0
    out[big] = x[big] + np.log1p(-mix.p_zero * np.exp(-x[big]))
    out[~big] = np.log(np.expm1(x[~big]) + (mix.q + mix.bottom))
    return out


def split_terms(mix: Mixture, adjacency: str, eps: np.ndarray,
                side: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The two terms of delta(eps) = P - Q at the root x* of the loss, in log space.

    P = upper(X <= x*) and Q = e^eps lower(X <= x*), the sensitivity-0 atom (present in
    both distributions) cancelled analytically via R = e^eps - p0 (REMOVE) or
    R = e^-eps - p0 (ADD), which is also what x* is solved for. Every normal CDF is
    taken at its argument times ``side`` (+1 or -1 per epsilon): with -1 the same
    expressions give the survival-side terms P', Q' of g = Q' - P' (see
    ``ctd.split_gap``).

    Returns:
        (inside, log_p, log_q): ``inside`` marks the epsilons with a finite root; the
        others have delta = 1 - e^eps (REMOVE, eps <= ln(1-q)) or delta = 0 (ADD,
        eps >= -ln(1-q)), i.e. g = 0 or delta = 0 respectively. log_p and log_q are
        given for the inside epsilons only.
    """
    var, sigma = mix.sigma**2, mix.sigma
    c, s = mix.c[mix.pos], mix.sens[mix.pos]
    log_w = np.log(mix.probs[mix.pos])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if adjacency == "remove":
            # e^eps = p0 + sum_pos p_i e^{c_i - s_i x/var}.
            r = _exp_minus(eps, mix) if mix.p_zero > 0.0 else np.exp(np.minimum(eps, 0.0))
            inside = r > 0.0
            e, sg = eps[inside], side[inside]
            log_r = _log_exp_minus(e, mix) if mix.p_zero > 0.0 else e
            x = _solve_lse(c, s, var, log_r)
            # P = sum_pos p_i Phi((x + s_i)/sigma), Q = R Phi(x/sigma).
            log_p = lse_atoms(special.log_ndtr(sg * (x + s[:, None]) / sigma), log_w)
            log_q = log_r + special.log_ndtr(sg * x / sigma)
        else:
            # e^-eps = p0 + sum_pos p_i e^{c_i + s_i x/var}.
            r = _exp_minus(-eps, mix) if mix.p_zero > 0.0 else np.exp(np.minimum(-eps, 0.0))
            inside = r > 0.0
            e, sg = eps[inside], side[inside]
            log_r = _log_exp_minus(-e, mix) if mix.p_zero > 0.0 else -e
            x = -_solve_lse(c, s, var, log_r)
            # P = e^eps R Phi(x/sigma), Q = e^eps sum_pos p_i Phi((x - s_i)/sigma).
            log_p = e + log_r + special.log_ndtr(sg * x / sigma)
            log_q = e + lse_atoms(special.log_ndtr(sg * (x - s[:, None]) / sigma), log_w)
    return inside, log_p, log_q
