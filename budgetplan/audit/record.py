"""Does the record name the plan: its hash, its algorithm, its N and exactly its phases?"""

from __future__ import annotations

from typing import TypeVar

from budgetplan.audit.report import Check
from budgetplan.plan import Plan
from budgetplan.plan.phases import Phase
from budgetplan.record.records import PhaseRun, RunRecord, records_phase

_R = TypeVar("_R")


def names_plan_check(record: RunRecord, plan: Plan) -> Check:
    problems = []
    if record.plan_sha256 != plan.sha256:
        problems.append(f"the record names plan {record.plan_sha256}, not {plan.sha256}")
    if not record.private:
        problems.append("the record is of a non-private run: no guarantee applies to it")
    if record.algorithm != plan.scenario.algorithm:
        problems.append(f"the record's algorithm is {record.algorithm!r}, the plan's {plan.scenario.algorithm!r}")
    if record.rows_used != plan.dataset_size:
        problems.append(f"the run used {record.rows_used} rows; the plan accounts N = {plan.dataset_size}")
    problems += private_problems(record, plan)
    expected = [p.name for p in plan.phases if records_phase(p.name)]
    shown = [p.name for p in record.phases]
    if record.tuning is not None and not plan.tuned:
        problems.append("the record shows a tuned run; the plan declares no grid of configurations")
    if plan.tuned:
        expected = shown  # the selected configuration's: checked by "tuned runs within plan"
    elif shown != expected:
        problems.append(f"the record shows the phases {shown}; the plan has {expected}")
    detail = "; ".join(problems) or (f"plan {plan.sha256[:12]}..., phases {expected}, N = {plan.dataset_size}")
    return Check("record names the plan", not problems, detail)



def entry_of(record: RunRecord, phase: Phase) -> PhaseRun | None:
    """The record's entry for the plan's ``phase`` (entries carry their phase kind's name)."""
    return next((p for p in record.phases if p.name == phase.name), None)


def private_problems(record: RunRecord, plan: Plan) -> list[str]:
    """The private record (when here) names the plan and the rows the plan accounts: the one place its data is read.

    ``rows_in`` rows were read (and fingerprinted), ``rows_used`` kept after capping: without
    capping the same, with it no more; and, unless the plan's N is a DP count (then the true
    count is what it protects), ``rows_used`` is the plan's N.
    """
    part = record.private_part
    if part is None:
        return []
    problems = []
    if part.plan_sha256 != plan.sha256:
        problems.append(f"the private record names plan {part.plan_sha256}, not {plan.sha256}")
    data = part.data
    rows_in, rows_used, fingerprinted = data.rows_in, data.rows_used, data.fingerprint.rows
    if plan.count is None and rows_used != plan.dataset_size:
        problems.append(f"the private record says {rows_used!r} rows were used; the plan accounts N = "
                        f"{plan.dataset_size}")
    if rows_used > rows_in or (plan.unit.cap == 1 and rows_used != rows_in):
        problems.append(f"the private record's rows_in ({rows_in!r}) and rows_used ({rows_used!r}) do not fit "
                        f"{'capping' if plan.unit.cap > 1 else 'a run without capping (they are equal)'}")
    if fingerprinted != rows_in:
        problems.append(f"the private record's fingerprint covers {fingerprinted!r} rows, its rows_in is {rows_in!r}")
    return problems


def record_entry(record: RunRecord, kind: type[_R]) -> _R | None:
    """The record's entry of ``kind`` (the plan has that phase; ``names_plan_check`` fails if the record lacks it)."""
    return next((p for p in record.phases if isinstance(p, kind)), None)



def missing_check(name: str, what: str) -> Check:
    return Check(name, False, f"the plan has {what} but the record shows none: nothing to check it against")



def settled_check(name: str, planned: object, ran: object, what: str) -> Check | None:
    """The check's verdict when the plan lacks the phase or the record does; None when both have it."""
    if planned is None:
        return Check(name, ran is None, f"no {what} planned" + ("" if ran is None else ", but one ran"))
    if ran is None:
        return missing_check(name, f"a {what}")
    return None
