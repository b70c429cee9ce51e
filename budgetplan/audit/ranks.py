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

A one-process run has none of this and gets no check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from budgetplan.audit.report import Check
from budgetplan.record.ledger import LedgerView
from budgetplan.record.records import DPSGDRun

__all__ = ["rank_checks"]

NAME = "Poisson batch sizes per rank"


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
        return [Check(NAME, False, "; ".join(problems))]
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
                  + f"; each rank two-sided binomial at {alpha:g}/ranks (Bonferroni)")]


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
