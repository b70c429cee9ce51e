"""The write-ahead ledger: hash chain, one release per one-shot phase, DP-SGD steps within the plan."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from budgetplan.audit.record import entry_of, missing_check, record_entry
from budgetplan.audit.report import Check
from budgetplan.errors import BudgetplanError
from budgetplan.plan import Plan
from budgetplan.record.ledger import RELEASE_FILES, LedgerView, read_ledger
from budgetplan.record.records import (
    DPSGDRun,
    RunRecord,
)


def ledger_check(record: RunRecord, plan: Plan, run_dir: Path, add: Callable[[Check], None]) -> LedgerView | None:
    path = run_dir / "ledger.jsonl"
    if not path.exists():
        add(Check("ledger", False, f"no write-ahead ledger at {path}: the steps and releases of the run cannot be "
                                   "confirmed (runs trained without a run directory cannot be audited)"))
        return None
    try:
        view = read_ledger(path, plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        add(Check("ledger", False, str(exc)))
        return None
    problems: list[str] = []
    if record.ledger is None:
        problems.append("the record names no ledger")
    elif record.ledger.head != view.head or record.ledger.lines != len(view.entries):
        problems.append(f"the ledger ends at {view.head[:12]}... after {len(view.entries)} lines; the record says "
                        f"{record.ledger.head[:12]}... after {record.ledger.lines}: it was cut or "
                        "extended after the run")
    digests = {p.name: getattr(entry_of(record, p), "release_sha256", None)
               for p in plan.phases if p.name in RELEASE_FILES}
    problems += release_problems(view, run_dir, digests)
    detail = "; ".join(problems) or (f"{len(view.entries)} lines, hash chain intact, {view.sessions} session(s), "
                                     "releases match the record")
    add(Check("ledger", not problems, detail))
    return view



def release_problems(view: LedgerView, run_dir: Path, expected: dict[str, str | None]) -> list[str]:
    """Each one-shot phase released exactly once, with the digest the record (if given) and the file show."""
    problems = []
    for phase, digest in expected.items():
        notes, intents = view.events("released", phase), view.events("intent", phase)
        if len(notes) != 1 or len(intents) != 1:
            problems.append(f"the ledger shows {len(intents)} {phase} release intent(s) and {len(notes)} "
                            "release(s); exactly one of each is planned")
            continue
        if digest is not None and notes[0].get("sha256") != digest:
            problems.append(f"the {phase} release's digest in the ledger is not the record's")
        path = run_dir / RELEASE_FILES[phase]
        if not path.exists():
            problems.append(f"{path.name}, the {phase} release the ledger recorded, is not here: what was released "
                            "cannot be confirmed (and a resumed run could not reload it)")
        elif array_sha256(path) != notes[0].get("sha256"):
            problems.append(f"{path.name} does not match the digest the ledger recorded for it")
    return problems



def array_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(np.ascontiguousarray(np.load(path, allow_pickle=False)).tobytes()).hexdigest()
    except (OSError, ValueError):
        return None



def steps_check(record: RunRecord, plan: Plan, ledger: LedgerView | None) -> Check:
    name = "steps within plan"
    planned = plan.dpsgd
    ran = record_entry(record, DPSGDRun)
    if planned is None:
        ok = ran is None and (ledger is None or ledger.count("dpsgd") == 0)
        return Check(name, ok, "no DP-SGD phase planned" + ("" if ok else ", but noisy steps ran"))
    if ran is None:
        return missing_check(name, "a DP-SGD phase")
    steps, executed = planned.params.steps, ran.steps_executed
    problems = []
    if executed > steps:
        problems.append(f"{executed} noisy steps executed, more than the {steps} planned")
    if record.status == "completed" and executed != steps:
        problems.append(f"a completed run took {executed} steps, not the {steps} planned")
    if ran.steps_planned != steps:
        problems.append(f"the record says {ran.steps_planned} steps were planned; the plan has {steps}")
    if ledger is None:
        problems.append("no readable ledger to count the steps")
    else:
        counted = ledger.count("dpsgd")
        if counted != executed:
            problems.append(f"the ledger counts {counted} noisy steps, the record {executed}")
        if ledger.sessions != ran.sessions or ledger.steps_lost("dpsgd") != ran.steps_lost_to_interruptions:
            problems.append(f"the ledger shows {ledger.sessions} session(s) and {ledger.steps_lost('dpsgd')} steps "
                            f"lost to interruptions; the record {ran.sessions} and {ran.steps_lost_to_interruptions}")
    detail = "; ".join(problems) or (f"{executed} of {steps} noisy steps over {ran.sessions} session(s), "
                                     f"{ran.steps_lost_to_interruptions} lost to interruptions; the ledger agrees")
    return Check(name, not problems, detail)
