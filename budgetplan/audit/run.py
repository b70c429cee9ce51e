"""Audit a run: is the guarantee the plan promised true of what actually ran?

The audit fails closed. Every planned phase must appear in the record with every statistic
its checks need, the write-ahead ledger must be there and intact, and anything missing,
unknown or malformed is a failing check that names it: a check never passes because its
evidence is absent. Each check is named and independent:

1. ``plan verifies``: hash, schema and every recomputed number (``verify``), and, given the
   signed-off scenario, that the plan embeds exactly it.
2. ``record is well-formed``: the public record (and the private one, when present) read
   strictly; the two name each other.
3. ``record names the plan``: the plan's hash, a private run, the plan's algorithm, its N,
   and exactly the plan's phases in the plan's order.
4. ``ledger``: the write-ahead ledger beside the record verifies its hash chain, names the
   plan, ends where the record says it ends, and holds exactly one release per one-shot
   phase whose digest is the record's (and the persisted file's).
5. ``steps within plan``: DP-SGD steps counted by the ledger (read exactly as the trainer
   reads it) equal the record's, never exceed the plan, and a completed run took them all.
6. ``DP-SGD noise``: the noise std, noise multiplier, C and q the run used are the plan's,
   and noise was drawn for every trainable parameter at every step of the session.
   ``DP-SGD noise evidence`` (``budgetplan.audit.step_evidence``, from the private record): each
   step's noise was drawn by rank 0 alone, one draw per parameter, and the draws' sums of
   squares are chi-square; ``Allocation participation`` / ``Shuffled participation``: every
   row took part exactly once (at most once) in each epoch; ``Units kept whole``: every
   sampled unit's rows were in one block, whole.
7. ``Poisson batch sizes``: every step's batch size, from the ledger across all sessions,
   is consistent with Poisson sampling at q (total and spread, two-sided, at ``alpha``).
   A plan that allocates or shuffles gets ``Allocation batch sizes`` (every whole epoch
   totals exactly N; multinomial spread) or ``Shuffled batch sizes`` (every batch exactly B).
   A run over several processes also gets ``Poisson batch sizes per rank``
   (``budgetplan.audit.ranks``): the ranks agree on the step count, their sizes add up to
   each step's, and each rank's batches are Poisson at q over its rows; and ``Rank samples
   independent``: no two ranks' batch sizes tie or correlate more than independent draws do.
   A units split's DP-SGD phase is tested against the rows its part held (the record's
   ``part_rows``; ``trainers.audit`` recomputes the parts from the data when given it).
8. ``RR flips``: the flip probability is the plan's and the count of flips is consistent
   with it (two-sided binomial test at ``alpha``); N labels, or under a units split N less
   the DP-SGD part's rows.
9. ``WALR release``: one release, with the plan's noise std, sensitivity and dimension.
   ``intercept calibration`` (plans or records with one): one release, with the plan's
   noise std, sensitivity and number of coordinates; the private record's released vector,
   when present, is the one whose digest the public record and the ledger hold.
   ``N kept private`` (plans whose N is a DP count): the public record and ledger show
   nothing that grows with the true row count; the private batch-size ledger is intact,
   names the plan, ends where the private record says and was written on that one count.
10. ``independent re-accounting``: every phase's guarantee recomputed by another path
    agrees with the plan, and the steps executed stay within the phase budget.
``one-run canary audit`` (runs trained with canaries, ``trainers.canary``): the private
    record's test recomputes from its guess counts and the plan, and its guesses do not
    refute the plan's trade-off curve (``budgetplan.audit.canary``).
The checks that need the training data or torch live with the trainers
(``trainers.audit.audit_run`` runs these and then them): ``data fingerprint`` (the keyed
fingerprint in the private record recomputes on the given data), ``code that ran`` and the
empirical lower bounds on the installed code, and the one-run audit with gradient canaries.

A plan whose N is a DP count has no record entry for its count phase (it was released
before planning; ``independent re-accounting`` re-derives its epsilon with dp_accounting),
and its batch sizes are tested against the true row count, both from the private side
(``private/record.json``, ``private/ledger.jsonl``): without them the test fails closed.

``model file``, ``vocabulary file`` and ``seed policy`` (``budgetplan.audit.evidence``):
``model.pt`` and ``vocabulary.json`` are the files the record names by their digests, and
every session of the ledger drew under the record's seed policy, each from streams of its own.
A seeded run is reported as ``seeded``: not certifiable as private, whatever its checks say.

An interrupted run (a run directory with a ledger but no record yet) is audited on what
its ledger shows (nothing beyond the plan so far, every session's seed policy recorded),
and fails ``run completed``: there is nothing to certify until it is resumed and completes
(the CLI exits 3 when that is all that fails). A ``model.pt`` without a record fails
``model file`` too: a model whose record was deleted cannot be certified.
"""

from __future__ import annotations

from pathlib import Path

from budgetplan.audit.canary import check_one_run
from budgetplan.audit.evidence import (
    MODEL_FILE,
    ledger_view,
    model_check,
    recorded_seeds,
    seeds_check,
    session_problems,
    vocabulary_check,
)
from budgetplan.audit.ledger import ledger_check, release_problems, steps_check
from budgetplan.audit.private_n import n_private_check, sizes_evidence
from budgetplan.audit.reaccount import reaccount_check
from budgetplan.audit.record import names_plan_check, record_entry
from budgetplan.audit.releases import calibration_check, flips_check, noise_check, walr_check
from budgetplan.audit.report import ALPHA, INTERRUPTED, REACCOUNT_TOLERANCE, AuditReport, Check
from budgetplan.audit.sampling import (
    sampling_checks,
)
from budgetplan.audit.step_evidence import evidence_checks
from budgetplan.audit.tuned import audit_tuned, audit_tuned_interrupted
from budgetplan.audit.verify import verify_plan
from budgetplan.errors import BudgetplanError, InvalidParameterError
from budgetplan.plan import Plan, load_plan
from budgetplan.record.ledger import RELEASE_FILES, read_ledger
from budgetplan.record.records import (
    CalibrationRun,
    RunRecord,
    load_record,
)
from budgetplan.scenario.model import Scenario
from budgetplan.util.codehash import code_fingerprint

__all__ = ["Check", "AuditReport", "audit_run", "ALPHA", "REACCOUNT_TOLERANCE"]








def run_dir_of(record_path: Path) -> Path:
    return record_path if record_path.is_dir() or record_path.suffix != ".json" else record_path.parent


def find_plan(record_path: Path, plan_path: str | Path | None) -> Plan:
    if plan_path is not None:
        return load_plan(plan_path)
    beside = run_dir_of(Path(record_path)) / "plan.json"
    if not beside.exists():
        raise BudgetplanError(f"no plan given and none beside the record ({beside}); pass --plan")
    return load_plan(beside)


def audit_run(record_path: str | Path, plan_path: str | Path | None = None, *, alpha: float = ALPHA,
              signed: Scenario | None = None) -> AuditReport:
    """Run every check of the record and ledger on the run at ``record_path`` (a run directory or its run.json).

    The checks that need the training data or torch (the keyed data fingerprint, the
    empirical lower bounds, the one-run canary audit) are added by ``trainers.audit.audit_run``.

    Args:
        plan_path: the plan; default the ``plan.json`` the trainer copied into the run directory.
        signed: the signed-off Scenario the plan must embed exactly (``verify --scenario``).
    """
    record_path = Path(record_path)
    run_dir = run_dir_of(record_path)
    if not record_path.exists() and not run_dir.is_dir():
        raise InvalidParameterError(f"run {str(record_path)!r}: the run directory {str(run_dir)!r} does not exist")
    plan = find_plan(record_path, plan_path)
    g = plan.guarantee
    report = AuditReport(record=str(record_path), plan_sha256=plan.sha256, epsilon=g.epsilon, delta=g.delta,
                         adjacency=plan.adjacency.value)
    add = report.checks.append
    verified = verify_plan(plan, signed=signed)
    add(Check("plan verifies", verified.ok, "hash, schema and recomputed numbers hold" if verified.ok
              else "; ".join(verified.problems[:3])))
    record_file = record_path if record_path.suffix == ".json" and not record_path.is_dir() else run_dir / "run.json"
    if not record_file.exists() and (run_dir / "ledger.jsonl").exists():
        report.status = "interrupted"
        interrupted_checks(report, plan, run_dir)
        if plan.tuned:
            audit_tuned_interrupted(report, plan, run_dir)
        else:
            audit_interrupted(report, plan, run_dir, alpha)
        return report
    try:
        record = load_record(record_file)
    except BudgetplanError as exc:
        add(Check("record is well-formed", False, str(exc)))
        return report
    add(Check("record is well-formed", True, "public record" + (" and private record" if record.private_part
                                                                else "") + " read strictly; hashes hold"))
    add(names_plan_check(record, plan))
    add(model_check(record, run_dir))
    add(vocabulary_check(record, run_dir))
    add(seeds_check(record, ledger_view(run_dir, plan)))
    report.seeded = recorded_seeds(record)[0] != "csprng"
    if plan.tuned:  # n runs and a selection: checked configuration by configuration
        audit_tuned(report, record, plan, run_dir, alpha)
    else:
        audit_single(report, record, plan, run_dir, alpha)
    return report


def audit_single(report: AuditReport, record: RunRecord, plan: Plan, run_dir: Path, alpha: float) -> None:
    """The checks of one run of the plan's phases."""
    add = report.checks.append
    ledger = ledger_check(record, plan, run_dir, add)
    add(steps_check(record, plan, ledger))
    add(noise_check(record, plan))
    report.checks.extend(evidence_checks(record, plan, alpha))
    sizes = sizes_evidence(plan, run_dir, record)
    if plan.count is not None:
        add(n_private_check(record, plan, ledger, sizes))
    report.checks.extend(sampling_checks(plan, ledger, record, alpha, sizes))
    add(flips_check(record, plan, alpha))
    add(walr_check(record, plan))
    if plan.calibration is not None or record_entry(record, CalibrationRun) is not None:
        add(calibration_check(record, plan))
    add(reaccount_check(record, plan))
    one_run = record.private_part.one_run if record.private_part is not None else None
    if one_run is not None:  # a run trained with canaries (trainers.canary)
        add(Check("one-run canary audit", *check_one_run(one_run, plan)))


# --------------------------------------------------------------------------- the record




# ------------------------------------------------------------- a private N (DP count)
















# --------------------------------------------------------------------------- the ledger








# ----------------------------------------------------------------------------- DP-SGD


















# -------------------------------------------------------------------------- RR and WALR










# ----------------------------------------------------------------------- re-accounting




# --------------------------------------------------------------- data and code evidence


def code_check(record: RunRecord) -> Check:
    here, ran = code_fingerprint(), record.code.by_package()
    differ = sorted(k for k in set(here) | set(ran) if here.get(k) != ran.get(k))
    if differ:
        return Check("code that ran", False, f"the installed {', '.join(differ)} differ from the code that ran: the "
                                            "empirical tests below measure other code than this run's")
    return Check("code that ran", True, "the installed budgetplan and trainers are the code that ran")


# ----------------------------------------------------------------------- interrupted runs


def interrupted_checks(report: AuditReport, plan: Plan, run_dir: Path) -> None:
    """What every interrupted run fails or shows: no record to certify, a model without one, the seed notes."""
    add = report.checks.append
    view = ledger_view(run_dir, plan)
    spent = len(view.events("intent")) if view is not None else 0
    add(Check(INTERRUPTED, False, f"no run.json: the run was interrupted (its ledger logs {spent} spending intents) "
                                  "or its record was deleted; nothing to certify until it is resumed and completes"))
    if (run_dir / MODEL_FILE).exists():
        add(Check("model file", False, f"{MODEL_FILE} is here but no record is: the record was deleted or never "
                                       "written, so this model cannot be certified"))
    if view is not None:
        problems, policies = session_problems(view)
        report.seeded = "seeded" in policies
        shown = ", ".join(sorted(map(str, policies))) or "none recorded, nothing spent"
        add(Check("seed policy", not problems, "; ".join(problems) or
                  f"{view.sessions} session(s); every one that spent recorded its seed policy first ({shown})"))


def audit_interrupted(report: AuditReport, plan: Plan, run_dir: Path, alpha: float) -> None:
    """What the ledger of a run without a record shows: nothing beyond the plan so far."""
    add = report.checks.append
    try:
        view = read_ledger(run_dir / "ledger.jsonl", plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        add(Check("ledger", False, str(exc)))
        return
    problems = []
    for phase in plan.phases:
        if phase.name in RELEASE_FILES and view.events("intent", phase.name):
            problems += release_problems(view, run_dir, {phase.name: None})
    add(Check("ledger", not problems, "; ".join(problems) or f"{len(view.entries)} lines, hash chain intact, "
                                                            f"{view.sessions} session(s)"))
    planned = plan.dpsgd.params.steps if plan.dpsgd is not None else 0
    counted = view.count("dpsgd")
    add(Check("steps within plan", counted <= planned,
              f"interrupted: {counted} of {planned} noisy steps counted so far" +
              ("" if counted <= planned else ": more than planned")))
    report.checks.extend(sampling_checks(plan, view, None, alpha, sizes_evidence(plan, run_dir, None)))
