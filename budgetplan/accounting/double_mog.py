"""Hockey-stick curve of the double mixture of Gaussians (replace-one, K examples per unit).

Under replace-one a unit's K examples keep their places (the same Poisson indicators in
both datasets) and each sampled example's clipped gradient may change from g to g'. In
units of the clipping norm, with mu = N(0, sigma^2) and sensitivities s_k taken with
probabilities p_k (k sampled examples of K: s_k = k, p_k = Binomial(k; K, q)), the pair

    upper(x) = sum_k p_k mu(x + s_k),   lower(x) = sum_k p_k mu(x - s_k)

dominates one step (Schuchardt, Stoian, Kosmala, Guennemann, "Unified Mechanism-Specific
Amplification by Subsampling and Group Privacy Amplification", NeurIPS 2024,
arXiv:2403.04867, Theorem 3.8 with K insertions and K deletions). For K = 1 it is the
subsampled Gaussian's REPLACE pair; for q = 1 a Gaussian of sensitivity 2K.

With c_k = ln p_k - s_k^2 / (2 sigma^2) and F(y) = logsumexp_k(c_k + s_k y / sigma^2),
the privacy loss is L(x) = F(-x) - F(x): odd and strictly decreasing (every positive
atom pushes both terms the same way). Being odd, the curve is symmetric:
delta(-a) = 1 - e^-a + e^-a delta(a), so only a >= 0 is solved (``solve``) and the
divergence at a is returned as two log-space terms (``split_terms``). This module only
serves ``fastpld.double_mixture_of_gaussians``, which owns the grid and the
discretisation.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import special

from budgetplan.accounting.mog import Atoms, lse_atoms

__all__ = ["DoubleMixture", "grid_loss_bounds", "solve", "split_terms"]

# A point leaves the Newton working set once its step is below this (relative to 1 + u);
# the iteration is quadratic there, so the point it landed on is exact to rounding.
_STEP_TOL = 1e-10
_MAX_ROUNDS = 200


class DoubleMixture(Atoms):
    """The pair's atoms (validated by the caller): noise, sensitivities, probabilities.

    Atoms with probability 0 are dropped. ``pos`` selects the positive sensitivities;
    ``p_zero`` is the mass of the sensitivity-0 atom (the same in both distributions).
    ``bottom`` is the mass of atoms left out altogether, taken as an infinite sensitivity:
    the upper distribution puts it at x = -inf (loss +inf), the lower at x = +inf. That
    pair dominates any finite sensitivity's (a kernel sending -inf and +inf to the left-out
    atoms' mixtures maps the one onto the other), so delta grows by exactly ``bottom``.
    """

    __slots__ = ()

    def _f(self, y: np.ndarray) -> np.ndarray:
        """F(y) = logsumexp_k(c_k + s_k y / sigma^2), elementwise over y."""
        terms = self.c[:, None] + self.sens[:, None] * (np.asarray(y, dtype=np.float64)[None, :] / self.sigma**2)
        top = terms.max(axis=0)
        out: np.ndarray = top + np.log(np.exp(terms - top).sum(axis=0))
        return out

    def privacy_loss(self, x: npt.ArrayLike) -> np.ndarray:
        """L(x) = ln(upper(x) / lower(x)) = F(-x) - F(x), elementwise."""
        xs = np.atleast_1d(np.asarray(x, dtype=np.float64))
        out: np.ndarray = self._f(-xs) - self._f(xs)
        return out


def grid_loss_bounds(mix: DoubleMixture, log_mass_truncation_bound: float) -> tuple[float, float]:
    """(eps_lower, eps_upper): the losses at the truncated support's ends.

    The same points as the subsampled Gaussian's REPLACE grid (``fastpld._gaussian_range``),
    with the shift 1 replaced by the largest sensitivity: the upper distribution's mass
    left of z - s_max is at most the noise tail exp(bound)/2 (it goes to +infinity); the
    lower end is L(-z), below which the mass moves up onto the first grid point.
    """
    z = float(special.ndtri(0.5 * math.exp(log_mass_truncation_bound))) * mix.sigma
    lower_eps, upper_eps = mix.privacy_loss([-z, z - float(mix.sens.max())])
    return float(lower_eps), float(upper_eps)


def _gap_and_slope(mix: DoubleMixture, u: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """H(u) = F(u) - F(-u) - a and H'(u) = (E_u[s] + E_-u[s]) / sigma^2 (softmax means)."""
    var = mix.sigma**2
    c, s = mix.c[:, None], mix.sens[:, None]
    up, down = c + s * (u / var), c - s * (u / var)
    top_up, top_down = up.max(axis=0), down.max(axis=0)
    w_up, w_down = np.exp(up - top_up), np.exp(down - top_down)
    sum_up, sum_down = w_up.sum(axis=0), w_down.sum(axis=0)
    gap = (top_up + np.log(sum_up)) - (top_down + np.log(sum_down)) - a
    slope = ((s * w_up).sum(axis=0) / sum_up + (s * w_down).sum(axis=0) / sum_down) / var
    return gap, slope


def solve(mix: DoubleMixture, a: np.ndarray) -> np.ndarray:
    """The u >= 0 with L(-u) = a, for every a >= 0 at once (so x* = -u at eps = a).

    H(u) = F(u) - F(-u) - a is increasing with H(0) = -a <= 0, and
    u_hi = min_k (a + F(0) - c_k) sigma^2 / s_k has H(u_hi) >= 0 (F(u_hi) is above each of
    its lines, F(-u_hi) <= F(0)). H is neither convex nor concave, so Newton runs inside the
    bracket [lo, hi], kept per point, and bisects whenever its step would leave it: it
    converges always and quadratically near the root (a handful of rounds on DP-SGD grids).
    Arrays are (atoms x points) so that reductions run over the short axis.
    """
    a = np.asarray(a, dtype=np.float64)
    var = mix.sigma**2
    f0 = float(mix._f(np.zeros(1))[0])
    pos_c, pos_s = mix.c[mix.pos], mix.sens[mix.pos]
    hi: np.ndarray = np.min((a[None, :] + f0 - pos_c[:, None]) * var / pos_s[:, None], axis=0)
    lo = np.zeros_like(a)
    weights = np.exp(mix.c - f0)
    m0 = float(np.dot(weights, mix.sens))  # E_0[s]: H'(0) = 2 m0 / sigma^2
    u: np.ndarray = np.minimum(hi, a * var / (2.0 * m0))
    active = np.flatnonzero(a > 0)
    u[a == 0] = 0.0
    for _ in range(_MAX_ROUNDS):
        if active.size == 0:
            break
        ua = u[active]
        gap, slope = _gap_and_slope(mix, ua, a[active])
        below = gap < 0
        lo[active] = np.where(below, ua, lo[active])
        hi[active] = np.where(below, hi[active], ua)
        with np.errstate(divide="ignore", invalid="ignore"):
            nxt = ua - gap / slope
        la, ha = lo[active], hi[active]
        outside = ~((nxt >= la) & (nxt <= ha))  # also NaN
        nxt = np.where(outside, 0.5 * (la + ha), nxt)
        u[active] = nxt
        done = (np.abs(nxt - ua) <= _STEP_TOL * (1.0 + ua)) | (gap == 0)
        active = active[~done]
    return u


def _log_expm1(a: np.ndarray) -> np.ndarray:
    """ln(e^a - 1) for a >= 0 (-inf at 0), without overflow for large a."""
    with np.errstate(divide="ignore"):
        out: np.ndarray = np.where(a > 1.0, a + np.log1p(-np.exp(-np.maximum(a, 1.0))),
                                   np.log(np.expm1(np.minimum(a, 1.0))))
    return out


def split_terms(mix: DoubleMixture, a: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ln P, ln Q with delta(a) = P - Q at eps = a >= 0 and root x* = -u, the window's part.

    delta = upper(X <= x*) - e^a lower(X <= x*). The sensitivity-0 atom is in both and is
    cancelled analytically: P = sum_pos p_k Phi((x* + s_k)/sigma) and
    Q = e^a sum_pos p_k Phi((x* - s_k)/sigma) + p_0 (e^a - 1) Phi(x*/sigma), every term
    positive, so ``ctd.split_gap`` forms P - Q accurately relative to itself (for small q
    the shared atom is nearly all the mass). ``bottom`` is not included.
    """
    sigma = mix.sigma
    x = -np.asarray(u, dtype=np.float64)
    s = mix.sens[mix.pos][:, None]
    log_w = np.log(mix.probs[mix.pos])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = lse_atoms(special.log_ndtr((x + s) / sigma), log_w)
        log_q = a + lse_atoms(special.log_ndtr((x - s) / sigma), log_w)
        if mix.p_zero > 0.0:
            log_q = np.logaddexp(log_q, math.log(mix.p_zero) + _log_expm1(a) + special.log_ndtr(x / sigma))
    return log_p, log_q
