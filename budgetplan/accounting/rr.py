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

from budgetplan.accounting import mog
from budgetplan.accounting.limits import MAX_RR_COUNT
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = [
    "flip_probability",
    "epsilon_from_flip_probability",
    "composed_delta",
    "composed_epsilon",
    "max_per_example_epsilon",
]


def flip_probability(epsilon: float) -> float:
    """rho = 1 / (1 + e^eps): the probability that binary RR flips a label."""
    return float(special.expit(-validate.non_negative("epsilon", epsilon)))


def epsilon_from_flip_probability(rho: float) -> float:
    """The inverse of :func:`flip_probability`: eps = log((1 - rho) / rho), rho in (0, 1/2)."""
    return math.log1p(-rho) - math.log(rho)


# Mass of Binomial(K, rho) left outside the window of flip counts the tables cover: the
# upper side is moved onto the largest loss K e, the lower onto the window's smallest loss,
# both pessimistic, so the results stay upper bounds within this share of delta.
_DROP = 1e-12
# Flip counts per table: 4M (32 MiB per array). A unit cap needs about 75 sqrt(K rho (1 - rho)).
_MAX_TABLE = 1 << 22


def _check(epsilon: object, count: object) -> tuple[float, int]:
    epsilon = validate.positive("epsilon", epsilon)
    count = validate.positive_int("unit cap", count)
    if count > MAX_RR_COUNT:
        raise InvalidParameterError(f"unit cap must be at most {MAX_RR_COUNT:.0e}, got {count:.4g}")
    return epsilon, count


def _loss_log_probs(epsilon: float, count: int, drop: float) -> tuple[np.ndarray, np.ndarray]:
    """Losses (K - 2j) eps in descending order and log-masses, on a window of flip counts j.

    J ~ Binomial(K, rho); the window [lo, hi] leaves at most ``drop`` outside (Chernoff),
    and that mass is moved up, never dropped: below lo onto the top loss K eps, above hi
    onto the window's last loss. A window longer than _MAX_TABLE is refused, naming the
    largest unit cap that fits.
    """
    rho = flip_probability(epsilon)
    if rho == 0.0:  # e^-eps underflows: every label is kept, the loss is K eps
        return np.array([count * epsilon]), np.zeros(1)
    lo, hi, _ = mog.binomial_window(count, rho, drop)
    if hi - lo + 1 > _MAX_TABLE:
        spread = rho * (1.0 - rho)
        largest = int((_MAX_TABLE / (hi - lo + 1)) ** 2 * count) if spread > 0 else count
        raise InvalidParameterError(
            f"unit cap {count:,} needs {hi - lo + 1:,} binomial terms at per-example epsilon {epsilon:.3g} "
            f"(limit {_MAX_TABLE:,}); the exact accounting works up to a unit cap of about {largest:,}")
    j = np.arange(lo, hi + 1, dtype=np.float64)
    log_rho = -np.logaddexp(0.0, epsilon)  # log(1 / (1 + e^eps))
    log_keep = -np.logaddexp(0.0, -epsilon)
    log_binom = special.gammaln(count + 1.0) - special.gammaln(j + 1.0) - special.gammaln(count - j + 1.0)
    losses = (count - 2.0 * j) * epsilon
    log_p = log_binom + j * log_rho + (count - j) * log_keep
    with np.errstate(divide="ignore"):
        if hi < count:  # the tail above hi (smaller losses), moved onto the window's last loss
            log_p[-1] = np.logaddexp(log_p[-1], np.log(special.bdtrc(hi, count, rho)))
        if lo > 0:  # the tail below lo (larger losses), moved onto the top loss K eps
            losses = np.concatenate(([count * epsilon], losses))
            log_p = np.concatenate(([np.log(special.bdtr(lo - 1, count, rho))], log_p))
    return losses, log_p


def composed_delta(epsilon: float, count: int, at_epsilon: float) -> float:
    """delta at ``at_epsilon`` of ``count`` applications of RR with budget ``epsilon``.

    Exact up to the binomial tails beyond 1e-300, which are counted pessimistically.
    """
    epsilon, count = _check(epsilon, count)
    at_epsilon = validate.finite("at_epsilon", at_epsilon)
    losses, log_p = _loss_log_probs(epsilon, count, 1e-300)
    above = losses > at_epsilon
    if not np.any(above):
        return 0.0
    terms = np.exp(log_p[above]) * -np.expm1(at_epsilon - losses[above])
    return float(min(1.0, terms.sum()))


def composed_epsilon(epsilon: float, count: int, delta: float) -> float:
    """The exact epsilon at ``delta`` of ``count`` compositions of RR with budget ``epsilon``.

    Solved segment by segment, all at once: between consecutive losses L_{k+1} <= eps < L_k
    the divergence is A_k - e^eps B_k with A_k = P[L >= L_k] and B_k = E[e^-L; L >= L_k],
    so the answer is ln((A_k - delta) / B_k) on the first segment (from the top) where that
    is at least L_{k+1}. The binomial tails beyond 1e-12 delta are moved up (see
    ``_loss_log_probs``), so the answer is exact to that, on the safe side.
    """
    epsilon, count = _check(epsilon, count)
    delta = validate.probability("delta", delta, allow_zero=True)
    if delta <= 0:
        return float(count * epsilon)
    delta *= 1.0 - 1e-10  # aim a hair inside the target: re-accounting rounds differently
    losses, log_p = _loss_log_probs(epsilon, count, _DROP * delta)  # losses descending
    log_a = np.logaddexp.accumulate(log_p)
    log_b = np.logaddexp.accumulate(log_p - losses)
    a = np.exp(log_a)
    lower = np.append(losses[1:], -math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(a - delta) - log_b
    ok = (a > delta) & (eps >= lower)
    if not ok.any():
        return 0.0
    k = int(np.argmax(ok))
    return float(max(0.0, min(eps[k], losses[k])))


def max_per_example_epsilon(total_epsilon: float, count: int, delta: float) -> float:
    """The largest per-example RR budget whose ``count``-fold composition is (total, delta)-DP.

    With delta = 0 this is total / count exactly. With delta > 0 it is found by bisection on
    the exact composed epsilon and rounded down, so the composition never exceeds the total.
    """
    total_epsilon, count = _check(total_epsilon, count)
    delta = validate.probability("delta", delta, allow_zero=True)
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
