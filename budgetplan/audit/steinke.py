"""Steinke, Nasr and Jagielski's one-run bound on (eps, delta): how one-run records written before f-DP are checked.

"Privacy Auditing with One (1) Training Run" (NeurIPS 2023, arXiv:2305.08846): m canaries
each take one of two neighbouring values by an independent fair coin S_i, the run is made
once, and an auditor guesses S_i for r canaries (abstaining on the rest). If the run is
(eps, delta)-DP with respect to each canary's two values, the number of correct guesses W
satisfies (their Theorem 3.1)

    P[W >= v] <= P[Binomial(r, e^eps / (1 + e^eps)) >= v]
                 + 2 m delta max_{i = 1..v} P[v - i <= B < v] / i,

so an observed v whose right-hand side falls below 1 - confidence proves, at that
confidence, that the run is not (eps, delta)-DP: the largest such eps is the lower bound.

One-run audits now test the plan's whole trade-off curve (``budgetplan.audit.fdp``), which
at a few thousand canaries can catch what this bound cannot (it tests one (eps, delta)
point, and at delta = 1e-8 little more than pure DP). ``budgetplan audit`` still checks a
record that carries this bound (a ``one_run`` entry without ``method``) by it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import stats

from budgetplan.audit.fdp import check_counts
from budgetplan.util import validate

__all__ = ["EPSILON_SEARCH_LIMIT", "RELATIVE_TOLERANCE", "p_value", "epsilon_lower_bound", "check_legacy"]

EPSILON_SEARCH_LIMIT = 60.0  # beyond this e^eps / (1 + e^eps) is 1 in double precision
_BISECTIONS = 60
RELATIVE_TOLERANCE = 1e-6   # a stored bound must recompute to this (bisection resolution: 60 / 2^60)


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[at least v of r guesses correct] allowed by (epsilon, delta)-DP (arXiv:2305.08846, Theorem 3.1).

    Args:
        m: canaries (each took one of its two values by a fair coin).
        r: guesses made (abstentions excluded).
        v: correct guesses.
        epsilon, delta: the hypothesis: training is (epsilon, delta)-DP per canary.
    """
    m, r, v = check_counts(m, r, v)
    eps = validate.non_negative("epsilon", epsilon)
    delta = validate.probability("delta", delta, allow_zero=True)
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


def epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, confidence: float = 0.95) -> float:
    """The largest epsilon that ``v`` correct of ``r`` guesses refutes at ``confidence``; 0.0 if none.

    Training that were (epsilon, delta)-DP for any smaller epsilon would give ``v`` or more
    correct guesses with probability below 1 - confidence (``p_value``, found by bisection:
    it grows with epsilon).
    """
    m, r, v = check_counts(m, r, v)
    level = 1.0 - validate.open_unit("confidence", confidence)
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


def check_legacy(one_run: Mapping[str, Any], planned_epsilon: float, planned_delta: float) -> tuple[bool, str]:
    """(passed, detail) for a record's Steinke bound: it recomputes from its counts and stays within the plan.

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
             f"{float(one_run.get('confidence', level)):g} (Steinke et al.'s bound), against the plan's "
             f"{planned_epsilon:.6g}")
    if recomputed > planned_epsilon:
        return False, words + ": the trained model leaks more than the plan allows"
    return True, words
