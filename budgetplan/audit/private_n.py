"""A plan whose N is a DP count: nothing public grows with the true row count."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from budgetplan.audit.record import record_entry
from budgetplan.audit.report import Check
from budgetplan.errors import BudgetplanError
from budgetplan.plan import Plan
from budgetplan.record.ledger import LedgerView, read_ledger
from budgetplan.record.parts import LedgerHead
from budgetplan.record.records import (
    PRIVATE_DIR,
    WITHHELD_WITH_N,
    DPSGDRun,
    DPSGDStats,
    RunRecord,
)

SIZES_LEDGER = Path(PRIVATE_DIR) / "ledger.jsonl"  # batch sizes, when the plan's N is a DP count



@dataclass(frozen=True)
class SizesEvidence:
    """Where a run's batch sizes are and what N they were drawn from; ``problem`` if unreadable."""

    view: LedgerView | None = None
    rows: int | None = None
    problem: str | None = None



def sizes_evidence(plan: Plan, run_dir: Path, record: RunRecord | None) -> SizesEvidence:
    """For a plan whose N is a DP count: the private batch-size ledger and the true row count."""
    if plan.count is None:
        return SizesEvidence()
    path = run_dir / SIZES_LEDGER
    if not path.exists():
        return SizesEvidence(problem=f"the plan's N is a DP count: its batch sizes are in {path}, which is not here")
    try:
        view = read_ledger(path, plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        return SizesEvidence(problem=str(exc))
    noted = {e.get("rows") for e in view.events("rows")}
    if len(noted) != 1 or not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in noted):
        return SizesEvidence(view, problem=f"{path.name} names the row count {len(noted)} ways; one count, once per "
                                    "session, is what the batch sizes were drawn from")
    rows = noted.pop()
    if record is None:
        return SizesEvidence(view, rows)
    if record.private_part is None:
        return SizesEvidence(view, problem="the plan's N is a DP count: the true row count is in the private "
                                           "record, which is not here")
    data = record.private_part.data
    if data.rows_used != rows:
        return SizesEvidence(view, problem=f"the private record's row count is not the one {path.name} was written on")
    if data.sizes_ledger != LedgerHead(head=view.head, lines=len(view.entries)):
        return SizesEvidence(view, problem=f"{path.name} ends at {view.head[:12]}... after {len(view.entries)} "
                                           "lines; the private record says otherwise: it was cut or extended after "
                                           "the run")
    return SizesEvidence(view, rows)



def n_private_check(record: RunRecord, plan: Plan, ledger: LedgerView | None, sizes: SizesEvidence) -> Check:
    """Nothing public grows with the true row count of a plan whose N is a DP count."""
    problems = []
    ran = record_entry(record, DPSGDRun)
    if ran is not None and ran.withheld != WITHHELD_WITH_N:
        problems.append(f"the public DP-SGD entry shows {', '.join(WITHHELD_WITH_N)}, which grow with the true row "
                        "count")
    if record.timings:
        problems.append("the public record shows timings, which grow with the true row count")
    if ledger is not None and any("batch_size" in e for e in ledger.events("intent")):
        problems.append("the public ledger shows batch sizes, which are draws from the true row count")
    if sizes.problem is not None:
        problems.append(sizes.problem)
    detail = "; ".join(problems) or (f"public: N = {plan.dataset_size} (the DP count); batch sizes, chunks, memory "
                                     "and timings are private, their ledger intact. This report reads them: it "
                                     "stays with the data owner")
    return Check("N kept private", not problems, detail)



def full_dpsgd(record: RunRecord, plan: Plan, ran: DPSGDRun) -> tuple[DPSGDRun | None, str | None]:
    """The DP-SGD entry with any withheld statistics restored from the private record."""
    if plan.count is None:
        if ran.withheld is not None:
            return None, "the record withholds the batch statistics, but the plan's N is public"
        return ran, None
    if ran.withheld is None:
        return ran, None  # shown publicly: the "N kept private" check fails it
    stats = next((s for s in record.private_part.phases if isinstance(s, DPSGDStats)), None) \
        if record.private_part is not None else None
    try:
        return ran.restored(stats), None
    except BudgetplanError as exc:
        return None, f"the withheld batch statistics cannot be read: {exc}"
