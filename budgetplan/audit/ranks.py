"""The audit of a DP-SGD phase run by several processes: did the ranks sample as one process would?

A distributed run (``budgetplan train --nproc``, ``torchrun``) samples each rank's rows (or,
when the plan samples units, each rank's units) at the plan's q; its write-ahead ledger notes
each session's ranks and their rows or units (a ``ranks`` event, ``rank_rows`` or
``rank_units``) and, at every noisy step, each rank's part of the batch
(``rank_batch_sizes``). The record says how many steps each rank counted on its own. This
check fails when:

- the ranks counted different numbers of steps, or a number other than the session's;
- a step's per-rank sizes are missing, are not one per rank, or do not add up to the step's
  batch size;
- the ranks' rows (units) do not add up to the N (M) the batches were drawn from, or a session
  noted the other kind;
- a rank's batches are not Poisson at q over its rows (units): the sum of its sizes over the
  steps is tested against Binomial(rows_r T, q), two-sided, each rank at ``alpha / ranks``
  (Bonferroni) so that an honest run fails at most ``alpha`` of the time in all.

``Rank samples independent`` fails when two ranks' draws are not independent (ranks seeded
alike sample in lockstep; the per-rank check above cannot see it, each rank's own batches
being Poisson). For every pair of ranks and every session of T steps, two tests:

- ties: independent sizes X ~ Binomial(n_r, q) and Y ~ Binomial(n_s, q) are equal at a step
  with probability p = sum_k P(X = k) P(Y = k), so the number of tied steps is
  Binomial(T, p), and its upper tail is the exact p-value (ranks in lockstep tie at every
  step);
- correlation: Pearson's r of the two size sequences, two-sided, by Student's t with T - 2
  degrees of freedom (exact for normal sizes; Binomial sizes at the batch sizes trained are
  close to it), which catches ranks whose draws move together without being equal.

Every test is at ``alpha`` divided by the number of tests (Bonferroni), so an honest run fails
at most ``alpha`` of the time in all (the t approximation aside).

A one-process run has none of this and gets no check.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations
from typing import Any

import numpy as np
from scipy import stats

from budgetplan.audit.report import Check
from budgetplan.record.ledger import LedgerView
from budgetplan.record.records import DPSGDRun

__all__ = ["rank_checks", "independence_check", "tie_probability"]

NAME = "Poisson batch sizes per rank"
INDEPENDENT = "Rank samples independent"


def _sessions(view: LedgerView, what: str) -> list[dict[str, Any]]:
    """Each distributed session of the phase: its ranks' rows (or units, ``what``) and the per-rank sizes of its
    steps (``rows`` None: the session did not note them)."""
    sessions: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for entry in view.entries:
        event = entry.get("event")
        if event == "ranks":
            counts = entry.get(f"rank_{what}")
            current = {"rows": None if counts is None else list(counts), "steps": [], "sizes": []}
            sessions.append(current)
        elif event == "resume":
            current = None  # a resumed session notes its own ranks, or runs as one process
        elif event == "intent" and entry.get("phase") == "dpsgd" and "rank_batch_sizes" in entry:
            if current is None:
                current = {"rows": None, "steps": [], "sizes": []}
                sessions.append(current)
            current["steps"].append(entry.get("batch_size"))
            current["sizes"].append(entry.get("rank_batch_sizes"))
    return sessions


def rank_checks(sized_view: LedgerView, ran: DPSGDRun | None, *, rows: int, q: float, alpha: float,
                two_sided_binomial: Callable[[int, int, float], float], what: str = "rows") -> list[Check]:
    """The per-rank checks of one DP-SGD phase (``[]`` for a one-process run).

    Args:
        sized_view: the ledger that holds the batch sizes (the private one for a DP-count N).
        ran: the record's ``DPSGDRun`` entry, or None (an interrupted run: the ledger alone).
        rows: the N (or M, ``what="units"``) the batches were drawn from.
        q: the plan's sampling rate.
        two_sided_binomial: ``p(k, n, q)``, the audit's binomial test.
        what: ``"rows"``, or ``"units"`` when the plan samples units: each session must then
            note its ranks' units.
    """
    sessions = _sessions(sized_view, what)
    recorded = ran is not None and ran.processes is not None
    if not sessions and not recorded:
        return []
    problems = _record_problems(ran, sessions) + _session_problems(sessions, rows, what)
    if problems:
        return [Check(NAME, False, "; ".join(problems)),
                Check(INDEPENDENT, False, "the per-rank batch sizes do not hold together (above): the ranks' "
                                          "independence cannot be tested on them")]
    worst, details = 1.0, []
    for s in sessions:
        width, t = len(s["rows"]), len(s["sizes"])
        for r in range(width):
            k = sum(parts[r] for parts in s["sizes"])
            p = two_sided_binomial(k, s["rows"][r] * t, q)
            worst = min(worst, p * width)
            details.append(f"rank {r}: {k} {what} over {t} steps from {s['rows'][r]}, expected "
                           f"{s['rows'][r] * t * q:.1f}, p = {p:.3g}")
    passed = worst >= alpha
    return [Check(NAME, passed, f"{len(sessions)} distributed session(s); " + "; ".join(details)
                  + f"; each rank two-sided binomial at {alpha:g}/ranks (Bonferroni)"),
            independence_check(sessions, q=q, alpha=alpha, what=what)]


def tie_probability(n_r: int, n_s: int, q: float) -> float:
    """P(X = Y) for independent X ~ Binomial(n_r, q), Y ~ Binomial(n_s, q)."""
    lo, hi = 0, min(n_r, n_s)
    if hi > 1000:  # where either pmf is beyond 12 of the larger sd from its mean, the product is below 1e-30
        sd = math.sqrt(max(n_r, n_s) * q * (1 - q))
        mid = min(n_r, n_s) * q
        lo, hi = max(0, int(mid - 12 * sd - 12)), min(hi, int(max(n_r, n_s) * q + 12 * sd + 12))
    k = np.arange(lo, hi + 1)
    return float(min(1.0, np.sum(stats.binom.pmf(k, n_r, q) * stats.binom.pmf(k, n_s, q))))


def independence_check(sessions: list[dict[str, Any]], *, q: float, alpha: float, what: str = "rows") -> Check:
    """``Rank samples independent``: no pair of ranks ties or correlates more than independent draws do."""
    tests: list[tuple[float, str]] = []
    for i, s in enumerate(sessions, 1):
        sizes = np.array(s["sizes"], dtype=np.float64)  # steps x ranks (checked rectangular before)
        if sizes.ndim != 2 or sizes.shape[0] == 0:
            continue
        t = sizes.shape[0]
        for a, b in combinations(range(sizes.shape[1]), 2):
            x, y = sizes[:, a], sizes[:, b]
            ties = int(np.sum(x == y))
            p_tie = tie_probability(int(s["rows"][a]), int(s["rows"][b]), q)
            p = float(stats.binom.sf(ties - 1, t, p_tie)) if ties else 1.0
            tests.append((p, f"session {i}, ranks {a} and {b}: {ties} of {t} steps tied (independent: "
                             f"{t * p_tie:.1f} expected), p = {p:.3g}"))
            if t >= 3 and np.std(x) > 0 and np.std(y) > 0:
                r = float(np.corrcoef(x, y)[0, 1])
                stat = r * math.sqrt((t - 2) / max(1e-300, 1 - r * r))
                p = float(2 * stats.t.sf(abs(stat), t - 2))
                tests.append((p, f"session {i}, ranks {a} and {b}: correlation of their sizes {r:.3f}, p = {p:.3g}"))
    if not tests:
        return Check(INDEPENDENT, True, f"no two ranks drew {what} in the same step")
    m = len(tests)
    worst = min(tests)
    passed = worst[0] * m >= alpha
    shown = [d for p, d in tests if p * m < alpha][:3] or [min(kind)[1] for kind in (
        [x for x in tests if "tied" in x[1]], [x for x in tests if "correlation" in x[1]]) if kind]
    return Check(INDEPENDENT, passed, "; ".join(shown) + f"; {m} tests (ties: exact binomial upper tail; "
                 f"correlation: two-sided t), each at {alpha:g}/{m} (Bonferroni)"
                 + ("" if passed else ": the ranks' samples are not independent draws"))


def _record_problems(ran: DPSGDRun | None, sessions: list[dict[str, Any]]) -> list[str]:
    """Where the record's processes and per-rank step counts disagree with the ledger's sessions."""
    problems: list[str] = []
    if ran is None:
        return problems
    if ran.processes is None:
        problems.append("the ledger holds per-rank batch sizes but the record names no processes")
        return problems
    steps = set(ran.rank_steps or ())
    if steps != {ran.steps_this_session}:
        problems.append(f"the ranks disagree on the step count: {list(ran.rank_steps or ())} against the "
                        f"session's {ran.steps_this_session}")
    if not sessions:
        problems.append(f"the record names {ran.processes} processes but the ledger holds no per-rank batch sizes")
    elif sessions[-1]["rows"] is not None and len(sessions[-1]["rows"]) != ran.processes:
        problems.append(f"the record names {ran.processes} processes, the ledger's last session "
                        f"{len(sessions[-1]['rows'])}")
    return problems


def _session_problems(sessions: list[dict[str, Any]], rows: int, what: str) -> list[str]:
    """Sessions that did not note their ranks, whose ranks do not add up, or whose steps lack per-rank sizes."""
    problems: list[str] = []
    for i, s in enumerate(sessions, 1):
        if s["rows"] is None:
            problems.append(f"session {i} took per-rank steps without noting its ranks and their {what}")
            continue
        if sum(s["rows"]) != rows:
            problems.append(f"session {i}'s ranks hold {sum(s['rows'])} {what} in all, the batches were drawn from "
                            f"{rows}")
        width = len(s["rows"])
        for total, parts in zip(s["steps"], s["sizes"]):
            if not isinstance(parts, list) or len(parts) != width:
                problems.append(f"session {i} has a step with {len(parts) if isinstance(parts, list) else 'no'} "
                                f"per-rank sizes for {width} ranks")
                break
            if sum(parts) != total:
                problems.append(f"session {i} has a step of {total} {what} whose ranks add up to {sum(parts)}")
                break
    return problems
