"""The one-run audit of a trained model: a lower bound on epsilon from canaries' guesses, and its check.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023,
arXiv:2305.08846): m canaries each take one of two neighbouring values by an independent
fair coin S_i, the model is trained once, and an auditor who sees only the model guesses
S_i for the r canaries it scores most extremely (abstaining on the rest). If training is
(eps, delta)-DP with respect to each canary's two values, the number of correct guesses W
satisfies (their Theorem 3.1)

    P[W >= v] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v]
                 + 2 m delta max_{i = 1..v} P[v - i <= Binomial(r, e^eps / (1 + e^eps)) < v] / i,

so an observed v whose right-hand side falls below 1 - confidence proves, at that
confidence, that training is not (eps, delta)-DP: the largest such eps is the lower bound.
The theorem needs only that flipping one S_i moves the input to a neighbouring dataset, so
it holds for replace-one canaries (a row whose label differs between the two worlds) as well
as for the paper's add-remove ones.

How many to guess is fixed before the model is seen: the bound is the best over the
fractions ``GUESS_FRACTIONS`` of the canaries guessed on each side, each evaluated at the
Bonferroni-corrected level, so the choice costs confidence rather than validity.

This module is the arithmetic and the check ``budgetplan audit`` runs on a record's
``one_run`` entry (no torch): ``trainers.canary`` builds the canaries, trains and scores.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from budgetplan import _validate
from budgetplan.errors import InvalidParameterError

__all__ = ["DEFAULT_CONFIDENCE", "GUESS_FRACTIONS", "EPSILON_SEARCH_LIMIT", "p_value", "epsilon_lower_bound",
           "guesses", "bound_from_scores", "check_one_run"]

DEFAULT_CONFIDENCE = 0.95   # the paper's
# Fractions of the m canaries guessed on each side (top k+ guessed 1, bottom k- guessed 0,
# k+ = k- = fraction x m), fixed in advance: few guesses are precise, many are numerous.
GUESS_FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
EPSILON_SEARCH_LIMIT = 60.0  # beyond this e^eps / (1 + e^eps) is 1 in double precision
_BISECTIONS = 60
RELATIVE_TOLERANCE = 1e-6   # a stored bound must recompute to this (bisection resolution: 60 / 2^60)


def _counts(m: int, r: int, v: int) -> tuple[int, int, int]:
    m = _validate.positive_int("canaries", m)
    r = _validate.non_negative_int("guesses", r)
    v = _validate.non_negative_int("correct", v)
    if not v <= r <= m:
        raise InvalidParameterError(f"need 0 <= correct <= guesses <= canaries, got correct={v!r}, guesses={r!r}, "
                                    f"canaries={m!r}")
    return m, r, v


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least v of r guesses correct] allowed by (epsilon, delta)-DP (arXiv:2305.08846, Theorem 3.1).

    Args:
        m: canaries (each took one of its two values by a fair coin).
        r: guesses made (abstentions excluded).
        v: correct guesses.
        epsilon, delta: the hypothesis: training is (epsilon, delta)-DP per canary.
    """
    m, r, v = _counts(m, r, v)
    eps = _validate.non_negative("epsilon", epsilon)
    delta = _validate.probability("delta", delta, allow_zero=True)
    q = 1.0 / (1.0 + math.exp(-eps))  # the accuracy of eps-DP randomized response on one bit
    tail = float(stats.binom.sf(v - 1, r, q))  # P[Binomial(r, q) >= v]
    if delta == 0 or v == 0:
        return min(1.0, tail)
    # max over i of P[v - i <= B < v] / i: the pmf summed downwards from v - 1 over a window
    # holding all but e^-800 of it (40 sd below the mean); beyond the window every term is at
    # most P[B < v] / (window + 1), which is added as a bound: the p-value can only grow
    lo = min(v, max(0, math.floor(r * q - 40.0 * math.sqrt(r * q * (1.0 - q))) - 1))
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, lo - 1, -1), r, q))
    spread = float(stats.binom.cdf(v - 1, r, q)) / (v - lo + 1)
    if below.size:
        spread = max(spread, float(np.max(below / np.arange(1, below.size + 1))))
    return min(1.0, tail + 2.0 * m * delta * spread)


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The largest epsilon that ``v`` correct of ``r`` guesses refutes at ``confidence``; 0.0 if none.

    Training that were (epsilon, delta)-DP for any smaller epsilon would give ``v`` or more
    correct guesses with probability below 1 - confidence (``p_value``, found by bisection:
    it grows with epsilon).
    """
    m, r, v = _counts(m, r, v)
    level = 1.0 - _validate.open_unit("confidence", confidence)
    if p_value(m, r, v, 0.0, delta) > level:
        return 0.0
    lo, hi = 0.0, EPSILON_SEARCH_LIMIT
    if p_value(m, r, v, hi, delta) <= level:
        return hi
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def guesses(scores, secrets, k_pos: int, k_neg: int) -> tuple[int, int]:
    """(guesses, correct): the k_pos highest scores guessed 1, the k_neg lowest guessed 0.

    Ties are broken by position, which is independent of the secrets (canaries are placed
    in an order drawn before the coins).
    """
    s = np.asarray(scores, dtype=np.float64)
    b = np.asarray(secrets)
    if s.ndim != 1 or s.shape != b.shape or not np.all(np.isfinite(s)):
        raise InvalidParameterError(f"scores must be {b.size} finite numbers, one per canary")
    if not np.all((b == 0) | (b == 1)):
        raise InvalidParameterError("secrets must be 0 or 1")
    k_pos, k_neg = int(k_pos), int(k_neg)
    if k_pos < 0 or k_neg < 0 or k_pos + k_neg > s.size:
        raise InvalidParameterError(f"k+ + k- must be at most the {s.size} canaries, got {k_pos} + {k_neg}")
    order = np.argsort(s, kind="stable")
    correct = int(np.sum(b[order[s.size - k_pos:]] == 1)) if k_pos else 0
    correct += int(np.sum(b[order[:k_neg]] == 0))
    return k_pos + k_neg, correct


def bound_from_scores(scores, secrets, *, delta: float, confidence: float = DEFAULT_CONFIDENCE,
                      fractions: tuple[float, ...] = GUESS_FRACTIONS) -> dict:
    """The one-run bound from canary scores (higher: more likely S_i = 1), best of ``fractions``.

    Each fraction f guesses k = max(1, round(f m)) canaries on each side; each is bounded at
    confidence 1 - (1 - confidence) / len(fractions) (Bonferroni), so the best of them holds
    at ``confidence``. Returns the ``one_run`` fields: canaries, guesses, correct, k_pos,
    k_neg, epsilon_lower_bound, confidence, level (the per-fraction confidence), delta,
    fractions.
    """
    m = int(np.asarray(secrets).size)
    conf = _validate.open_unit("confidence", confidence)
    if not fractions or any(not 0 < f <= 0.5 for f in fractions):
        raise InvalidParameterError(f"fractions must lie in (0, 0.5], got {fractions!r}")
    level = 1.0 - (1.0 - conf) / len(fractions)
    best: dict | None = None
    for f in fractions:
        k = max(1, min(m // 2, round(f * m)))
        r, v = guesses(scores, secrets, k, k)
        eps = epsilon_lower_bound(m, r, v, delta=delta, confidence=level)
        if best is None or eps > best["epsilon_lower_bound"]:
            best = {"k_pos": k, "k_neg": k, "guesses": r, "correct": v, "epsilon_lower_bound": eps}
    assert best is not None
    return {"canaries": m, **best, "confidence": conf, "level": level, "delta": float(delta),
            "fractions": list(fractions)}


def check_one_run(one_run: dict, planned_epsilon: float, planned_delta: float) -> tuple[bool, str]:
    """(passed, detail) for ``budgetplan audit``: the recorded bound recomputes and stays within the plan.

    The bound is recomputed from the recorded counts (m, r, v) at the recorded level and the
    plan's delta; a bound above the plan's epsilon is evidence, at the recorded confidence,
    that the trained model leaks more than the plan allows.
    """
    try:
        m, r, v = (one_run.get(k) for k in ("canaries", "guesses", "correct"))
        level = float(one_run["level"])
        stated = float(one_run["epsilon_lower_bound"])
        recomputed = epsilon_lower_bound(m, r, v, delta=planned_delta, confidence=level)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        return False, f"the record's one-run audit is malformed: {exc}"
    if not math.isclose(recomputed, stated, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9):
        return False, (f"the recorded lower bound {stated:.6g} does not recompute from {v} correct of {r} guesses "
                       f"on {m} canaries at delta {planned_delta:.3g} ({recomputed:.6g})")
    words = (f"{v} of {r} guesses correct on {m} canaries: epsilon >= {recomputed:.4g} at confidence "
             f"{float(one_run.get('confidence', level)):g}, against the plan's {planned_epsilon:.6g}")
    if recomputed > planned_epsilon:
        return False, words + ": the trained model leaks more than the plan allows"
    return True, words
