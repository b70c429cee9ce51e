"""The audit checks that need the training data or the trainer's code, added to the core audit.

``budgetplan.audit.audit_run`` checks a run from its plan, record and ledger alone (no
torch, no data). ``audit_run`` here runs those checks and then, when asked:

- ``data fingerprint`` (``data_path``): the keyed fingerprint in the private record
  recomputes on the given data with the data owner's key;
- ``code that ran`` and the empirical lower bounds (``empirical``): the installed code is
  the code the record says ran, and every phase of the plan, run on neighbouring inputs by
  the installed trainer code (``trainers.empirical.audit_plan``), shows no more privacy
  loss than planned;
- ``units split`` (``data_path``, plans that split the units): the parts recomputed on the
  given data from the plan's key hold the rows the record says each phase trained on (RR's
  labels, DP-SGD's part): exactly, or at most as many when the plan caps units (capping
  keeps a unit's rows in its part);
- the one-run audit (``one_run``): each DP-SGD phase audited in one run with a million
  gradient canaries (``trainers.empirical.one_run``, arXiv:2410.22235).

A run that is interrupted or whose record does not read gets the core checks only: they
already fail or report it.
"""

from __future__ import annotations

from pathlib import Path

from budgetplan import audit as core
from budgetplan.audit.record import record_entry
from budgetplan.audit.report import ALPHA, AuditReport, Check
from budgetplan.audit.run import code_check, find_plan, run_dir_of
from budgetplan.plan import Plan
from budgetplan.record.records import PRIVATE_DIR, DPSGDRun, RRRun, RunRecord, load_record
from trainers.data.columns import parquet_source
from trainers.data.fingerprint import fingerprint, key_id, read_key
from trainers.data.loaders import read_table
from trainers.empirical import audit_plan

__all__ = ["audit_run", "fingerprint_check", "units_split_check", "run_empirical"]


def audit_run(record_path, plan_path=None, *, data_path=None, data_format: str = "auto", fingerprint_key=None,
              empirical: bool = False, alpha: float = ALPHA, signed=None, one_run: bool = False) -> AuditReport:
    """Every check of ``budgetplan.audit.audit_run``, then those that need the data or the trainer's code.

    Args:
        plan_path: the plan; default the ``plan.json`` the trainer copied into the run directory.
        data_path: the training data, to recompute the keyed fingerprint (needs the private
            record and the key: ``fingerprint_key`` bytes, default ``private/fingerprint.key``).
        empirical: also run the empirical lower bounds on the installed trainer code.
        signed: the signed-off Scenario the plan must embed exactly (``verify --scenario``).
        one_run: also audit each DP-SGD phase in one run with a million gradient canaries on
            the installed code (``trainers.empirical.one_run``, arXiv:2410.22235).
    """
    report = core.audit_run(record_path, plan_path, alpha=alpha, signed=signed)
    read = any(c.name == "record is well-formed" and c.passed for c in report.checks)
    if report.status == "interrupted" or not read or not (data_path is not None or empirical or one_run):
        return report
    record_path = Path(record_path)
    run_dir = run_dir_of(record_path)
    plan = find_plan(record_path, plan_path)
    record = load_record(record_path if record_path.suffix == ".json" and not record_path.is_dir()
                         else run_dir / "run.json")
    if data_path is not None:
        report.checks.append(fingerprint_check(record, plan, run_dir, data_path, data_format, fingerprint_key))
        if plan.rr is not None and plan.rr.params.unit_part is not None:
            report.checks.append(units_split_check(record, plan, data_path, data_format))
    processes = run_processes(record)
    if empirical:
        report.checks.append(code_check(record))
        report.empirical = run_empirical(plan, processes=processes)
    if one_run:
        from trainers.empirical.one_run import one_run_rows  # torch: audit_run's other checks run without it

        report.empirical += one_run_rows(plan, processes=processes)
    return report


def run_processes(record: RunRecord) -> int:
    """The processes the run's DP-SGD phase trained with (1 when one did, or the record shows no DP-SGD phase)."""
    ran = next((p for p in record.phases if isinstance(p, DPSGDRun)), None)
    return 1 if ran is None or ran.processes is None else ran.processes


def run_empirical(plan: Plan, *, progress: bool = True, processes: int = 1) -> list[dict]:
    """Audit every phase of ``plan`` on the installed trainer code (needs torch); one row per phase.

    ``trainers.empirical.audit_plan`` runs the real training loops (RR phase, WALR, DP-SGD)
    on neighbouring inputs: each row holds a lower bound on epsilon against the planned one
    and the mechanism checks, and passes when the bound is at most the plan and every check
    holds. It measures the code installed now, not necessarily the code that trained the run.
    ``processes``: the run's processes, over which the DP-SGD canaries are run.
    """
    return audit_plan(plan, progress=progress, processes=processes)


def fingerprint_check(record: RunRecord, plan: Plan, run_dir: Path, data_path, data_format, key) -> Check:
    """The keyed fingerprint in the private record recomputes on ``data_path`` with the data owner's key."""
    name = "data fingerprint"
    if record.private_part is None:
        return Check(name, False, f"the private record ({run_dir / PRIVATE_DIR / 'record.json'}) is not here: the "
                                  "data owner holds the fingerprint")
    fp = record.private_part.data.fingerprint
    if key is None:
        key_path = run_dir / PRIVATE_DIR / "fingerprint.key"
        if not key_path.exists():
            return Check(name, False, f"no fingerprint key given and none at {key_path}")
        key = read_key(key_path)
    if key_id(key) != fp.key_id:
        return Check(name, False, f"the key given is {key_id(key)}, the fingerprint was made with {fp.key_id}")
    spec = plan.scenario.features
    if spec is None:
        return Check(name, False, "the plan's scenario has no [features] table naming the columns")
    # Parquet is digested a window at a time (as the trainer does): a 40M-row file is never read whole.
    table = parquet_source(data_path, data_format, list(spec.columns))
    if table is None:
        table = read_table(data_path, format=data_format, columns=list(spec.columns))
    again = fingerprint(table, list(fp.columns or spec.columns), key)
    if again["hmac_sha256"] != fp.hmac_sha256:
        return Check(name, False, f"the data at {data_path} is not the data the run read")
    return Check(name, True, f"{again['rows']} rows of {data_path} match the keyed fingerprint (key {fp.key_id})")


def units_split_check(record: RunRecord, plan: Plan, data_path, data_format) -> Check:
    """The rows each phase of a units split trained on are those its part of ``data_path`` holds."""
    from trainers.inputs import units_part  # the trainer's own partition

    name = "units split"
    rr, sgd = plan.rr, plan.dpsgd
    spec = plan.scenario.features
    assert rr is not None and rr.params.unit_part is not None  # asked of units splits only
    if spec is None or sgd is None or sgd.params.unit_part is None:
        return Check(name, False, "the plan splits the units but lacks [features] or DP-SGD's part")
    rr_ran, sgd_ran = record_entry(record, RRRun), record_entry(record, DPSGDRun)
    if rr_ran is None or sgd_ran is None or sgd_ran.part_rows is None:
        return Check(name, False, "the record lacks the RR labels' count or the rows of DP-SGD's part")
    table = read_table(data_path, format=data_format, columns=[c for c in (spec.unit_id,) if c] or [spec.label])
    first = units_part(table, spec.unit_id, rr.params.unit_part.high)
    want = (int(first.sum()), int(first.size - first.sum()))
    have = (rr_ran.labels, sgd_ran.part_rows)
    capped = plan.unit.cap > 1
    ok = have == want or (capped and have[0] <= want[0] and have[1] <= want[1])
    how = "at most" if capped else "exactly"
    detail = (f"RR trained on {have[0]} rows and DP-SGD on {have[1]}; the parts of {data_path} hold {want[0]} and "
              f"{want[1]} (key {rr.params.unit_part.key!r}; {how} that many)")
    return Check(name, ok, detail)
