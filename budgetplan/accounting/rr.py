"""Randomized response on a binary label: exact privacy in closed form.

Binary RR with budget e keeps the label with probability e^e / (1 + e^e) and flips it with
rho = 1 / (1 + e^e) (Warner 1965). Under replace-one (label change) adjacency its privacy
loss is +e with probability 1 - rho and -e with probability rho, so it is exactly
(e, 0)-DP, and K independent applications to one unit's K labels have privacy loss
(K - 2J) e with J ~ Binomial(K, rho). That distribution is finite, so the hockey-stick
divergence of the composition is a finite sum, computed here exactly (no discretisation):

    delta(eps) = sum_j P[J = j] * (1 - exp(eps - (K - 2j) e))_+

At delta = 0 this gives K e (pure composition, tight); with delta > 0 it allows a larger
per-impression budget than eps/K (K=50, total (1, 1e-7): 0.0311 instead of 0.02).

dp_accounting gap this module goes around: its PLDAccountant ignores the count of a
``SelfComposedDpEvent`` wrapping a ``RandomizedResponseDpEvent`` (10 x RR(0.1) reports 0.1,
not 1.0). Nothing here builds that event.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

__all__ = [
    "flip_probability",
    "epsilon_from_flip_probability",
    "composed_delta",
    "composed_epsilon",
    "max_per_example_epsilon",
]


def flip_probability(epsilon: float) -> float:
    """rho = 1 / (1 + e^eps): the probability that binary RR flips a label."""
    return float(special.expit(-epsilon))


def epsilon_from_flip_probability(rho: float) -> float:
    """The inverse of :func:`flip_probability`: eps = log((1 - rho) / rho), rho in (0, 1/2)."""
    return math.log1p(-rho) - math.log(rho)


def _loss_log_probs(epsilon: float, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Losses (K - 2j) eps in descending order and log P[J = j] for j = 0..K."""
    j = np.arange(count + 1)
    log_rho = -np.logaddexp(0.0, epsilon)  # log(1 / (1 + e^eps))
    log_keep = -np.logaddexp(0.0, -epsilon)
    log_binom = special.gammaln(count + 1) - special.gammaln(j + 1) - special.gammaln(count - j + 1)
    return (count - 2 * j) * epsilon, log_binom + j * log_rho + (count - j) * log_keep


def composed_delta(epsilon: float, count: int, at_epsilon: float) -> float:
    """delta at ``at_epsilon`` of ``count`` applications of RR with budget ``epsilon``."""
    losses, log_p = _loss_log_probs(epsilon, count)
    above = losses > at_epsilon
    if not np.any(above):
        return 0.0
    terms = np.exp(log_p[above]) * -np.expm1(at_epsilon - losses[above])
    return float(min(1.0, terms.sum()))


def composed_epsilon(epsilon: float, count: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``count`` compositions of RR with budget ``epsilon``.

    Solved segment by segment: between consecutive losses L_{k+1} <= eps < L_k the
    divergence is A_k - e^eps B_k with A_k = P[L >= L_k] and B_k = E[e^-L; L >= L_k].
    """
    if delta <= 0:
        return float(count * epsilon)
    delta *= 1.0 - 1e-10  # aim a hair inside the target: re-accounting rounds differently
    losses, log_p = _loss_log_probs(epsilon, count)  # losses descending
    log_a = np.logaddexp.accumulate(log_p)
    log_b = np.logaddexp.accumulate(log_p - losses)
    a = np.exp(log_a)
    for k in range(count + 1):
        lower = losses[k + 1] if k + 1 <= count else -math.inf
        if a[k] <= delta:
            continue  # even eps = L_{k+1} leaves at most delta: the answer lies further down
        eps = math.log(a[k] - delta) - log_b[k]
        if eps >= lower:
            return float(max(0.0, min(eps, losses[k])))
    return 0.0


def max_per_example_epsilon(total_epsilon: float, count: int, delta: float) -> float:
    """The largest per-example RR budget whose ``count``-fold composition is (total, delta)-DP.

    With delta = 0 this is total / count exactly. With delta > 0 it is found by bisection on
    the exact composed epsilon and rounded down, so the composition never exceeds the total.
    """
    if count == 1 or delta <= 0:
        return total_epsilon / count
    lo, hi = total_epsilon / count, total_epsilon
    if composed_epsilon(hi, count, delta) <= total_epsilon:
        return hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if composed_epsilon(mid, count, delta) <= total_epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return lo
