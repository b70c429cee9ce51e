"""The one-run audit from canary scores: the guesses, the f-DP test of the plan, and the record's check.

m canaries each take one of two neighbouring values by an independent fair coin S_i, the
run is made once, and each canary gets a score (higher: S_i = 1 more likely). The k
highest are guessed 1, the k lowest 0, the rest abstained on, for each of the fractions
``GUESS_FRACTIONS`` of m fixed in advance (few guesses are precise, many are numerous).
Each fraction's counts test the hypotheses of ``budgetplan.audit.fdp`` at significance
(1 - confidence) / len(fractions) (Bonferroni, so that the best of them holds at the
confidence):

* the verdict: do the guesses refute the plan's own trade-off curve? If they do, the run
  leaks more than the plan allows, at that confidence;
* the bound: the largest noise divisor s such that the plan with its noise divided by s is
  refuted, stated as that mechanism's epsilon at the plan's delta (``epsilon_lower_bound``).

Canaries whose two values are neighbours under the plan's adjacency are all the test
needs: replace-one canaries (a row whose label differs between the worlds) for the plans
here, independent of each other or not.

``trainers.canary`` (a trained model queried on label canaries) and
``trainers.empirical.one_run`` (the DP-SGD step with gradient canaries) make the scores;
``budgetplan audit`` runs ``check_one_run`` on a record's ``one_run`` entry (no torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from budgetplan.audit.fdp import (
    DIVISOR_TOLERANCE,
    METHOD,
    NOISE_DIVISOR_RANGE,
    Family,
    check_counts,
    noise_divisor_bound,
    plan_family,
    refuted_by,
)
from budgetplan.audit.steinke import check_legacy
from budgetplan.errors import BudgetplanError, InvalidParameterError
from budgetplan.plan import Plan
from budgetplan.util import validate

__all__ = ["DEFAULT_CONFIDENCE", "GUESS_FRACTIONS", "guesses", "bound_from_scores", "check_one_run"]

DEFAULT_CONFIDENCE = 0.95   # the papers'
GUESS_FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
RELATIVE_TOLERANCE = 1e-6   # a recorded epsilon must recompute to this


def guesses(scores: ArrayLike, secrets: ArrayLike, k_pos: int, k_neg: int) -> tuple[int, int]:
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


def _per_side(m: int, fraction: float) -> int:
    return max(1, min(m // 2, round(fraction * m)))


def _fractions(fractions: Iterable[float]) -> tuple[float, ...]:
    out = tuple(float(f) for f in fractions)
    if not out or any(not (math.isfinite(f) and 0 < f <= 0.5) for f in out):
        raise InvalidParameterError(f"fractions must lie in (0, 0.5], got {fractions!r}")
    return out


def bound_from_scores(scores: ArrayLike, secrets: ArrayLike, *, family: Family, confidence: float = DEFAULT_CONFIDENCE,
                      fractions: tuple[float, ...] = GUESS_FRACTIONS) -> dict[str, Any]:
    """The one-run audit of canary ``scores`` (higher: S_i = 1 more likely) against ``family``.

    Returns the ``one_run`` fields: method, hypotheses (the family's description), canaries,
    fractions, counts (per fraction: k, guesses, correct), k_pos, k_neg, guesses, correct
    (the fraction that decides the bound; where none refutes anything, the most accurate),
    noise_divisor, epsilon_lower_bound (the family's epsilon at it; 0 where nothing is
    refuted), refutes_plan (the verdict at s = 1), confidence, level (the per-fraction
    confidence), delta.
    """
    b = np.asarray(secrets)
    m = int(b.size)
    conf = validate.open_unit("confidence", confidence)
    fracs = _fractions(fractions)
    if m < 2:
        raise InvalidParameterError(f"canaries must be at least 2, got {m}")
    level = 1.0 - (1.0 - conf) / len(fracs)
    counts: list[dict[str, int]] = []
    for f in fracs:
        k = _per_side(m, f)
        r, v = guesses(scores, b, k, k)
        counts.append({"k": k, "guesses": r, "correct": v})
    s, hit = noise_divisor_bound(family, [(m, c["guesses"], c["correct"]) for c in counts], 1.0 - level)
    if hit is None:
        hit = max(range(len(counts)), key=lambda i: counts[i]["correct"] / counts[i]["guesses"])
    best = counts[hit]
    return {"method": METHOD, "hypotheses": family.description, "canaries": m, "fractions": list(fracs),
            "counts": counts, "k_pos": best["k"], "k_neg": best["k"], "guesses": best["guesses"],
            "correct": best["correct"], "noise_divisor": s, "epsilon_lower_bound": family.epsilon(s) if s > 0 else 0.0,
            "refutes_plan": s >= 1.0, "confidence": conf, "level": level, "delta": float(family.delta)}


def _recorded(one_run: Mapping[str, Any]) -> tuple[int, list[tuple[int, int, int]], float, float, float]:
    """(m, [(m, guesses, correct)], significance, noise divisor, epsilon) from a record, checked for shape."""
    m = validate.positive_int("canaries", one_run["canaries"])
    fracs = _fractions(one_run["fractions"])
    rows = one_run["counts"]
    if not isinstance(rows, (list, tuple)) or len(rows) != len(fracs):
        raise InvalidParameterError(f"counts must hold one entry per fraction ({len(fracs)})")
    counts: list[tuple[int, int, int]] = []
    for f, row in zip(fracs, rows):
        k = _per_side(m, f)
        if row.get("k") != k or row.get("guesses") != 2 * k:
            raise InvalidParameterError(f"fraction {f:g} of {m} canaries guesses {k} on each side, the record says "
                                        f"{row.get('k')!r} ({row.get('guesses')!r} in all)")
        counts.append(check_counts(m, 2 * k, row["correct"]))
    level = validate.open_unit("level", one_run["level"])
    if not math.isclose(level, 1.0 - (1.0 - float(one_run["confidence"])) / len(fracs), rel_tol=1e-12):
        raise InvalidParameterError(f"level {level!r} is not the confidence split over {len(fracs)} fractions")
    s = validate.non_negative("noise_divisor", one_run["noise_divisor"])
    eps = validate.non_negative("epsilon_lower_bound", one_run["epsilon_lower_bound"])
    return m, counts, 1.0 - level, s, eps


def check_one_run(one_run: Mapping[str, Any], plan: Plan) -> tuple[bool, str]:
    """(passed, detail) for ``budgetplan audit``: the recorded audit recomputes, and the plan's curve stands.

    Every number is recomputed from the recorded guess counts and ``plan`` (never from the
    record's own hypotheses): the recorded noise divisor must be refuted and 1 + its
    tolerance above it not, its epsilon must be the plan family's, and the verdict is
    whether the counts refute the plan's own trade-off curve. A record written with
    Steinke et al.'s (eps, delta) bound (no ``method``) is checked by that bound.
    """
    g = plan.guarantee
    if "method" not in one_run:
        return check_legacy(one_run, g.epsilon, g.delta)
    try:
        if one_run["method"] != METHOD:
            raise InvalidParameterError(f"method {one_run['method']!r} is not {METHOD!r}")
        m, counts, significance, s, stated = _recorded(one_run)
        family = plan_family(plan)

        def refuted(x: float) -> bool:  # as the search saw it: a member the family cannot build is not refuted
            return refuted_by(family, counts, x, significance) is not None

        low, top = NOISE_DIVISOR_RANGE
        if s == 0.0:
            consistent = not refuted(low)
        else:
            above = s * (1.0 + DIVISOR_TOLERANCE) * (1.0 + 1e-9)
            consistent = low <= s <= top and refuted(s) and (s >= top or not refuted(above))
        recomputed = family.epsilon(s) if s > 0 else 0.0
        verdict = refuted(1.0)
        if (m, one_run["guesses"], one_run["correct"]) not in counts:
            raise InvalidParameterError("the stated guesses and correct are not one fraction's counts")
    except (KeyError, TypeError, AttributeError, BudgetplanError, ValueError) as exc:
        return False, f"the record's one-run audit is malformed: {exc}"
    if not consistent:
        return False, (f"the recorded noise divisor {s:.6g} is not where the recorded guesses stop refuting "
                       f"{family.description}")
    if not math.isclose(recomputed, stated, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9):
        return False, f"the recorded epsilon {stated:.6g} is not the plan family's at noise divisor {s:.6g} " \
                      f"({recomputed:.6g})"
    conf = float(one_run["confidence"])
    words = (f"{one_run['correct']:,} of {one_run['guesses']:,} guesses right on {m:,} canaries: epsilon >= "
             f"{recomputed:.4g} at confidence {conf:g} (the plan with its noise divided by {s:.3g}), against the "
             f"plan's {g.epsilon:.6g}")
    if verdict:
        return False, words + ": the guesses refute the plan's trade-off curve, the run leaks more than it allows"
    return True, words
