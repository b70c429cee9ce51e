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
7. ``Poisson batch sizes``: every step's batch size, from the ledger across all sessions,
   is consistent with Poisson sampling at q (total and spread, two-sided, at ``alpha``).
   A plan that allocates or shuffles gets ``Allocation batch sizes`` (every whole epoch
   totals exactly N; multinomial spread) or ``Shuffled batch sizes`` (every batch exactly B).
   A run over several processes also gets ``Poisson batch sizes per rank``
   (``budgetplan.audit_ranks``): the ranks agree on the step count, their sizes add up to
   each step's, and each rank's batches are Poisson at q over its rows.
8. ``RR flips``: the flip probability is the plan's and the count of flips is consistent
   with it (two-sided binomial test at ``alpha``).
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
    refute the plan's trade-off curve (``budgetplan.audit_canary``).
11. ``data fingerprint`` (with ``data_path``): the keyed fingerprint in the private record
    recomputes on the given data with the data owner's key.
12. ``code that ran`` (with ``empirical``): the installed code, which the empirical tests
    measure, is the code the record says ran. With ``one_run``, each DP-SGD phase is also
    audited in one run with a million gradient canaries (``trainers.empirical.one_run``).

A plan whose N is a DP count has no record entry for its count phase (it was released
before planning; ``independent re-accounting`` re-derives its epsilon with dp_accounting),
and its batch sizes are tested against the true row count, both from the private side
(``private/record.json``, ``private/ledger.jsonl``): without them the test fails closed.

An interrupted run (a run directory with a ledger but no record yet) is audited on what
its ledger shows: nothing beyond the plan so far. The empirical lower bounds on epsilon
(``empirical=True``) run the trainer's code and are imported lazily: they need torch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scipy import stats

from budgetplan.audit_canary import check_one_run
from budgetplan.audit_ranks import rank_checks
from budgetplan.audit_tuned import audit_tuned, audit_tuned_interrupted, is_tuned
from budgetplan.errors import BudgetplanError
from budgetplan.ledger import LedgerView, read_ledger
from budgetplan.mechanisms import PoissonDPSGD, RandomizedResponse, UnitPoissonDPSGD
from budgetplan.phases import CalibrationPhase, CountPhase, DPSGDPhase, RRPhase, WALRPhase
from budgetplan.plan import Plan, load_plan
from budgetplan.records import (
    PRIVATE_DIR,
    WITHHELD_WITH_N,
    CalibrationRun,
    CalibrationStats,
    DPSGDRun,
    DPSGDStats,
    RRRun,
    RRStats,
    RunRecord,
    WALRRun,
    load_record,
)

__all__ = ["Check", "AuditReport", "audit_run", "ALPHA", "REACCOUNT_TOLERANCE"]

ALPHA = 1e-6                 # false-alarm rate of each statistical test
REACCOUNT_TOLERANCE = 1e-3   # relative agreement required between independent accountings

# The one-shot releases a run directory persists, by the ledger's phase name.
_RELEASE_FILES = {"rr": "rr_labels.npy", "walr": "walr_sum.npy", "calibration": "calibration_release.npy"}
_SIZES_LEDGER = Path(PRIVATE_DIR) / "ledger.jsonl"  # batch sizes, when the plan's N is a DP count
_RUN_OF: dict[type, Any] = {RRPhase: RRRun, DPSGDPhase: DPSGDRun, WALRPhase: WALRRun,
                            CalibrationPhase: CalibrationRun}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def __post_init__(self):
        object.__setattr__(self, "passed", bool(self.passed))  # numpy booleans are not JSON


@dataclass
class AuditReport:
    record: str
    plan_sha256: str | None
    status: str = "completed"
    checks: list = field(default_factory=list)
    empirical: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks) and all(e["passed"] for e in self.empirical)

    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed] + [e["name"] for e in self.empirical if not e["passed"]]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "status": self.status, "record": self.record, "plan_sha256": self.plan_sha256,
                "alpha": ALPHA, "tolerance": REACCOUNT_TOLERANCE,
                "checks": [c.__dict__ for c in self.checks], "empirical": self.empirical,
                "failing": self.failing()}


def _run_dir(record_path: Path) -> Path:
    return record_path if record_path.is_dir() or record_path.suffix != ".json" else record_path.parent


def _find_plan(record_path: Path, plan_path) -> Plan:
    if plan_path is not None:
        return load_plan(plan_path)
    beside = _run_dir(Path(record_path)) / "plan.json"
    if not beside.exists():
        raise BudgetplanError(f"no plan given and none beside the record ({beside}); pass --plan")
    return load_plan(beside)


def audit_run(record_path, plan_path=None, *, data_path=None, data_format: str = "auto", fingerprint_key=None,
              empirical: bool = False, alpha: float = ALPHA, signed=None, one_run: bool = False) -> AuditReport:
    """Run every check on the run at ``record_path`` (a run directory or its run.json).

    Args:
        plan_path: the plan; default the ``plan.json`` the trainer copied into the run directory.
        data_path: the training data, to recompute the keyed fingerprint (needs the private
            record and the key: ``fingerprint_key`` bytes, default ``private/fingerprint.key``).
        empirical: also run the empirical lower bounds on the installed trainer code.
        signed: the signed-off Scenario the plan must embed exactly (``verify --scenario``).
        one_run: also audit each DP-SGD phase in one run with a million gradient canaries on
            the installed code (``trainers.empirical.one_run``, arXiv:2410.22235).
    """
    from budgetplan.verify import verify_plan

    record_path = Path(record_path)
    run_dir = _run_dir(record_path)
    plan = _find_plan(record_path, plan_path)
    report = AuditReport(record=str(record_path), plan_sha256=plan.sha256)
    add = report.checks.append
    verified = verify_plan(plan, signed=signed)
    add(Check("plan verifies", verified.ok, "hash, schema and recomputed numbers hold" if verified.ok
              else "; ".join(verified.problems[:3])))
    record_file = record_path if record_path.suffix == ".json" and not record_path.is_dir() else run_dir / "run.json"
    if not record_file.exists() and (run_dir / "ledger.jsonl").exists():
        report.status = "interrupted"
        if is_tuned(plan):
            audit_tuned_interrupted(report, plan, run_dir)
        else:
            _audit_interrupted(report, plan, run_dir, alpha)
        return report
    try:
        record = load_record(record_file)
    except BudgetplanError as exc:
        add(Check("record is well-formed", False, str(exc)))
        return report
    add(Check("record is well-formed", True, "public record" + (" and private record" if record.private_part
                                                                else "") + " read strictly; hashes hold"))
    add(_names_plan(record, plan))
    if is_tuned(plan):  # n runs and a selection: checked configuration by configuration
        audit_tuned(report, record, plan, run_dir, alpha)
    else:
        _audit_single(report, record, plan, run_dir, alpha)
    if data_path is not None:
        add(_fingerprint(record, plan, run_dir, data_path, data_format, fingerprint_key))
    if empirical:
        add(_code(record))
        report.empirical = run_empirical(plan)
    if one_run:
        from trainers.empirical.one_run import one_run_rows

        report.empirical += one_run_rows(plan)
    return report


def _audit_single(report: AuditReport, record: RunRecord, plan: Plan, run_dir: Path, alpha: float) -> None:
    """The checks of one run of the plan's phases."""
    add = report.checks.append
    ledger = _ledger_check(record, plan, run_dir, add)
    add(_steps(record, plan, ledger))
    add(_dpsgd_noise(record, plan))
    sizes = _sizes_evidence(plan, run_dir, record)
    if plan.count is not None:
        add(_n_private(record, plan, ledger, sizes))
    report.checks.extend(_sampling(plan, ledger, record, alpha, sizes))
    add(_flips(record, plan, alpha))
    add(_walr(record, plan))
    if plan.calibration is not None or _entry(record, CalibrationRun) is not None:
        add(_calibration(record, plan))
    add(_reaccount(record, plan))
    one_run = record.private_part.one_run if record.private_part is not None else None
    if one_run is not None:  # a run trained with canaries (trainers.canary)
        add(Check("one-run canary audit", *check_one_run(one_run, plan)))


# --------------------------------------------------------------------------- the record


def _names_plan(record: RunRecord, plan: Plan) -> Check:
    problems = []
    if record.plan_sha256 != plan.sha256:
        problems.append(f"the record names plan {record.plan_sha256}, not {plan.sha256}")
    if not record.private:
        problems.append("the record is of a non-private run: no guarantee applies to it")
    if record.algorithm != plan.scenario.algorithm:
        problems.append(f"the record's algorithm is {record.algorithm!r}, the plan's {plan.scenario.algorithm!r}")
    if record.rows_used != plan.dataset_size:
        problems.append(f"the run used {record.rows_used} rows; the plan accounts N = {plan.dataset_size}")
    expected = [_RUN_OF[type(p)].name for p in plan.phases if not isinstance(p, CountPhase)]
    shown = [p.name for p in record.phases]
    if record.tuning is not None and not is_tuned(plan):
        problems.append("the record shows a tuned run; the plan declares no grid of configurations")
    if is_tuned(plan):
        expected = shown  # the selected configuration's: checked by "tuned runs within plan"
    elif shown != expected:
        problems.append(f"the record shows the phases {shown}; the plan has {expected}")
    detail = "; ".join(problems) or (f"plan {plan.sha256[:12]}..., phases {expected}, N = {plan.dataset_size}")
    return Check("record names the plan", not problems, detail)


# ------------------------------------------------------------- a private N (DP count)


@dataclass(frozen=True)
class _Sizes:
    """Where a run's batch sizes are and what N they were drawn from; ``problem`` if unreadable."""

    view: LedgerView | None = None
    rows: int | None = None
    problem: str | None = None


def _sizes_evidence(plan: Plan, run_dir: Path, record: RunRecord | None) -> _Sizes:
    """For a plan whose N is a DP count: the private batch-size ledger and the true row count."""
    if plan.count is None:
        return _Sizes()
    path = run_dir / _SIZES_LEDGER
    if not path.exists():
        return _Sizes(problem=f"the plan's N is a DP count: its batch sizes are in {path}, which is not here")
    try:
        view = read_ledger(path, plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        return _Sizes(problem=str(exc))
    noted = {e.get("rows") for e in view.events("rows")}
    if len(noted) != 1 or not all(isinstance(r, int) and not isinstance(r, bool) and r > 0 for r in noted):
        return _Sizes(view, problem=f"{path.name} names the row count {len(noted)} ways; one count, once per "
                                    "session, is what the batch sizes were drawn from")
    rows = noted.pop()
    if record is None:
        return _Sizes(view, rows)
    if record.private_part is None:
        return _Sizes(view, problem="the plan's N is a DP count: the true row count is in the private record, which "
                                    "is not here")
    data = record.private_part.data
    if data.get("rows_used") != rows:
        return _Sizes(view, problem=f"the private record's row count is not the one {path.name} was written on")
    if data.get("sizes_ledger") != {"head": view.head, "lines": len(view.entries)}:
        return _Sizes(view, problem=f"{path.name} ends at {view.head[:12]}... after {len(view.entries)} lines; the "
                                    "private record says otherwise: it was cut or extended after the run")
    return _Sizes(view, rows)


def _n_private(record: RunRecord, plan: Plan, ledger: LedgerView | None, sizes: _Sizes) -> Check:
    """Nothing public grows with the true row count of a plan whose N is a DP count."""
    problems = []
    ran = _entry(record, DPSGDRun)
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


def _full_dpsgd(record: RunRecord, plan: Plan, ran: DPSGDRun) -> tuple[DPSGDRun | None, str | None]:
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


def _entry(record: RunRecord, kind: type):
    """The record's entry of ``kind`` (the plan has that phase; ``_names_plan`` fails if the record lacks it)."""
    return next((p for p in record.phases if isinstance(p, kind)), None)


def _missing(name: str, what: str) -> Check:
    return Check(name, False, f"the plan has {what} but the record shows none: nothing to check it against")


def _settled(name: str, planned, ran, what: str) -> Check | None:
    """The check's verdict when the plan lacks the phase or the record does; None when both have it."""
    if planned is None:
        return Check(name, ran is None, f"no {what} planned" + ("" if ran is None else ", but one ran"))
    if ran is None:
        return _missing(name, f"a {what}")
    return None


# --------------------------------------------------------------------------- the ledger


def _ledger_check(record: RunRecord, plan: Plan, run_dir: Path, add) -> LedgerView | None:
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
    problems = []
    if record.ledger is None:
        problems.append("the record names no ledger")
    elif record.ledger.get("head") != view.head or record.ledger.get("lines") != len(view.entries):
        problems.append(f"the ledger ends at {view.head[:12]}... after {len(view.entries)} lines; the record says "
                        f"{str(record.ledger.get('head'))[:12]}... after {record.ledger.get('lines')}: it was cut or "
                        "extended after the run")
    problems += _release_problems(view, run_dir, {p.name: getattr(_entry(record, _RUN_OF[type(p)]), "release_sha256",
                                                                  None)
                                                  for p in plan.phases if p.name in _RELEASE_FILES})
    detail = "; ".join(problems) or (f"{len(view.entries)} lines, hash chain intact, {view.sessions} session(s), "
                                     "releases match the record")
    add(Check("ledger", not problems, detail))
    return view


def _release_problems(view: LedgerView, run_dir: Path, expected: dict) -> list[str]:
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
        path = run_dir / _RELEASE_FILES[phase]
        if path.exists() and _array_sha256(path) != notes[0].get("sha256"):
            problems.append(f"{path.name} does not match the digest the ledger recorded for it")
    return problems


def _array_sha256(path: Path) -> str | None:
    import numpy as np

    try:
        return hashlib.sha256(np.ascontiguousarray(np.load(path, allow_pickle=False)).tobytes()).hexdigest()
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- DP-SGD


def _steps(record: RunRecord, plan: Plan, ledger: LedgerView | None) -> Check:
    name = "steps within plan"
    planned = plan.dpsgd
    ran = _entry(record, DPSGDRun)
    if planned is None:
        ok = ran is None and (ledger is None or ledger.count("dpsgd") == 0)
        return Check(name, ok, "no DP-SGD phase planned" + ("" if ok else ", but noisy steps ran"))
    if ran is None:
        return _missing(name, "a DP-SGD phase")
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


def _dpsgd_noise(record: RunRecord, plan: Plan) -> Check:
    name = "DP-SGD noise"
    planned, ran = plan.dpsgd, _entry(record, DPSGDRun)
    if (verdict := _settled(name, planned, ran, "DP-SGD phase")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, []
    for label, have, want in (("noise std", ran.noise_std, par.noise_std),
                              ("noise multiplier", ran.noise_multiplier, par.noise_multiplier),
                              ("clipping norm", ran.clipping_norm, par.clipping_norm),
                              ("sampling rate", ran.sampling_rate, par.sampling_rate),
                              ("expected batch size", ran.batch_size_expected, par.expected_batch_size)):
        if not math.isclose(have, want, rel_tol=1e-12):
            problems.append(f"the run's {label} is {have!r}, the plan's {want!r}")
    if (ran.clipped_per == "unit") != par.samples_units:
        problems.append(f"the run clipped per {ran.clipped_per or 'example'}; the plan samples and clips per "
                        f"{'unit' if par.samples_units else 'example'}")
    if ran.truncated != (par.sampling == "truncated-poisson"):
        problems.append(f"the run {'truncated' if ran.truncated else 'did not truncate'} its batches; the plan "
                        f"samples {par.sampling!r}")
    want_draws = ran.steps_this_session * ran.trainable_parameters
    if ran.noise_draws != want_draws:
        problems.append(f"{ran.noise_draws} noise draws in this session; {ran.steps_this_session} steps of "
                        f"{ran.trainable_parameters} trainable parameters need {want_draws}")
    detail = "; ".join(problems) or (f"std {par.noise_std:.6g} = sigma {par.noise_multiplier:.6g} x C "
                                     f"{par.clipping_norm:g} on all {ran.trainable_parameters} trainable parameters "
                                     "at every step")
    return Check(name, not problems, detail)


def _two_sided_binomial(k: int, n: int, p: float) -> float:
    if n == 0:
        return 1.0
    if n < 10**7:
        return float(stats.binomtest(int(k), int(n), p).pvalue)
    z = (k - n * p) / math.sqrt(n * p * (1 - p))
    return float(2 * min(stats.norm.cdf(z), stats.norm.sf(z)))


def _batch_moments(n: int, q: float, cap: int | None) -> tuple[float, float]:
    """Mean and variance of one step's batch size: Binomial(N, q), truncated at ``cap`` if given."""
    if cap is None or cap >= n:
        return n * q, n * q * (1 - q)
    dist = stats.binom(n, q)
    k = _support(n, q, cap)
    m = [min(int(x), cap) for x in k]
    pmf = dist.pmf(k)
    tail = float(dist.sf(k[-1]))  # mass above the evaluated support, all truncated to cap
    mean = float(sum(a * b for a, b in zip(m, pmf))) + cap * tail
    second = float(sum(a * a * b for a, b in zip(m, pmf))) + cap * cap * tail
    return mean, second - mean * mean


def _support(n: int, q: float, cap: int) -> list[int]:
    mu, sd = n * q, math.sqrt(n * q * (1 - q))
    lo, hi = max(0, int(mu - 12 * sd) - 1), min(n, max(cap, int(mu + 12 * sd) + 1))
    return list(range(lo, hi + 1))


_EPOCH_NAMES = {"allocation": "Allocation batch sizes", "shuffle": "Shuffled batch sizes"}


def _epoch_sizes(name: str, sizes: list[int], counted: int, par, alpha: float) -> list[Check]:
    """The batch sizes of an allocation or shuffled run against the plan's epochs of T = N // B steps.

    Shuffle: every batch is exactly B, so an epoch totals T B. Allocation: every row is in
    exactly one step of an epoch, so each whole epoch totals exactly N, and its sizes are
    multinomial(N; 1/T, ..., 1/T): Pearson's X^2 = sum_t (s_t - N/T)^2 / (N/T) has mean
    exactly T - 1 and variance 2 (T - 1)(1 - 1/N), so the sum over E whole epochs is tested,
    two-sided, against chi-square with E (T - 1) degrees of freedom (fixed-size batches have
    none of that spread, Poisson batches miss the exact totals).
    """
    n, t = par.dataset_size, par.steps_per_epoch
    if len(sizes) != counted:
        return [Check(name, False, f"{len(sizes)} batch sizes for {counted} counted steps: the sizes cannot be "
                                   f"cut into the plan's epochs of {t} steps")]
    whole = [sizes[i:i + t] for i in range(0, len(sizes) - len(sizes) % t, t)]
    part = sizes[len(whole) * t:]
    if par.sampling == "shuffle":
        wrong = [(i, x) for i, x in enumerate(sizes) if x != par.batch_size]
        detail = (f"{len(sizes)} batches, every one of exactly B = {par.batch_size}" if not wrong else
                  f"{len(wrong)} of {len(sizes)} batches are not of exactly B = {par.batch_size} (step {wrong[0][0]}: "
                  f"{wrong[0][1]}); shuffled batches have no spread")
        return [Check(f"{name}: fixed size", not wrong, detail)]
    bad = [i for i, epoch in enumerate(whole) if sum(epoch) != n]
    over = sum(part) > n
    detail = (f"{len(whole)} whole epoch(s) of {t} steps, each totals exactly N = {n}" if not bad else
              f"{len(bad)} of {len(whole)} whole epochs do not total N = {n} (epoch {bad[0]}: {sum(whole[bad[0]])}): "
              "every row is used exactly once per epoch under allocation")
    if over:
        detail += f"; the unfinished epoch already uses {sum(part)} > N rows"
    checks = [Check(f"{name}: epoch totals", not bad and not over, detail)]
    if whole and t >= 2:
        expected = n / t
        stat = math.fsum((x - expected) ** 2 / expected for epoch in whole for x in epoch)
        df = len(whole) * (t - 1)
        p_var = float(2 * min(stats.chi2.cdf(stat, df), stats.chi2.sf(stat, df)))
        checks.append(Check(f"{name}: spread", p_var >= alpha,
                            f"Pearson X^2 = {stat:.1f} over {len(whole)} epoch(s) against chi-square({df}) "
                            f"(multinomial sizes, mean N/T = {expected:.2f}); two-sided p = {p_var:.3g} "
                            f"(fails below {alpha:g})"))
    return checks


def _sampling(plan: Plan, ledger: LedgerView | None, record: RunRecord | None, alpha: float,
              evidence: _Sizes | None = None) -> list[Check]:
    planned = plan.dpsgd
    if planned is None:
        return []
    name = _EPOCH_NAMES.get(planned.params.sampling, "Poisson batch sizes")
    ran = _entry(record, DPSGDRun) if record is not None else None
    if record is not None and ran is None:
        return [_missing(name, "a DP-SGD phase")]
    if ledger is None:
        return [Check(name, False, "no readable ledger: the batch sizes of the run cannot be read")]
    if ran is not None and record is not None:
        ran, problem = _full_dpsgd(record, plan, ran)
        if problem is not None:
            return [Check(name, False, problem)]
    # a unit-sampled phase draws its batches from the M units: its sizes count units
    n = planned.params.dataset_size if planned.params.units is None else planned.params.units
    what = "rows" if planned.params.units is None else "units"
    sized = ledger
    if plan.count is not None:
        evidence = evidence or _Sizes(problem="no private batch-size ledger was read")
        if evidence.problem is not None or evidence.view is None or evidence.rows is None:
            return [Check(name, False, evidence.problem or "the private batch sizes cannot be read")]
        sized, n = evidence.view, evidence.rows  # drawn at q from every row there was
    sizes = sized.batch_sizes("dpsgd")
    counted = ledger.count("dpsgd")
    problems = []
    if ran is not None and (len(sizes), sum(sizes), sum(s * s for s in sizes)) != (
            ran.batch_sizes_observed, ran.batch_size_sum, ran.batch_size_sumsq):
        problems.append("the record's batch-size statistics are not those of the ledger")
    if counted and not sizes:
        problems.append(f"the ledger counts {counted} noisy steps but records no batch size")
    if len(sizes) < counted - ledger.sessions:  # at most one torn intent per session lacks its size
        problems.append(f"only {len(sizes)} of {counted} counted steps have a batch size in the ledger")
    if len(sizes) > counted:
        problems.append(f"{len(sizes)} batch sizes for {counted} counted steps")
    par = planned.params
    if par.sampling in _EPOCH_NAMES and not problems:
        return _epoch_sizes(name, sizes, counted, par, alpha) if sizes else [Check(name, True,
                                                                                  "no noisy step taken yet")]
    cap = par.max_batch_size if par.sampling == "truncated-poisson" else None
    if cap is not None and sizes and max(sizes) > cap:
        problems.append(f"a batch of {max(sizes)} exceeds the plan's maximum {cap}")
    if problems:
        return [Check(name, False, "; ".join(problems))]
    if not sizes:
        return [Check(name, True, "no noisy step taken yet")]
    q, t = par.sampling_rate, len(sizes)
    total = sum(sizes)
    mu, var1 = _batch_moments(n, q, cap)
    if cap is None:
        p_total = _two_sided_binomial(total, n * t, q)
        how = "two-sided binomial"
    else:
        z = (total - t * mu) / math.sqrt(t * var1) if var1 > 0 else 0.0
        p_total = float(2 * stats.norm.sf(abs(z)))
        how = f"two-sided normal (Poisson truncated at {cap})"
    checks = [Check(f"{name}: total", p_total >= alpha,
                    f"{total} {what} over {t} steps (all sessions, from the ledger), expected {t * mu:.1f}; {how} "
                    f"p = {p_total:.3g} (fails below {alpha:g})")]
    if t >= 2 and var1 > 0:
        mean = total / t
        var = (sum(s * s for s in sizes) - t * mean * mean) / (t - 1)
        stat = (t - 1) * var / var1
        p_var = float(2 * min(stats.chi2.cdf(stat, t - 1), stats.chi2.sf(stat, t - 1)))
        checks.append(Check(f"{name}: spread", p_var >= alpha,
                            f"variance {var:.2f} against {var1:.2f}; two-sided chi-square p = {p_var:.3g} "
                            "(fixed-size or shuffled batches have no spread)"))
    return checks + rank_checks(sized, ran, rows=n, q=q, alpha=alpha, two_sided_binomial=_two_sided_binomial,
                                what=what)


# -------------------------------------------------------------------------- RR and WALR


def _flips(record: RunRecord, plan: Plan, alpha: float) -> Check:
    name = "RR flips"
    planned, ran = plan.rr, _entry(record, RRRun)
    if (verdict := _settled(name, planned, ran, "RR phase")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par = planned.params
    if ran.labels != plan.dataset_size:
        return Check(name, False, f"{ran.labels} labels randomised; the plan accounts N = {plan.dataset_size}")
    if ran.per_impression_rule != par.per_impression_rule:
        return Check(name, False, f"the run used the rule {ran.per_impression_rule!r}, the plan "
                                  f"{par.per_impression_rule!r}")
    if par.flip_probability_by_count is None:
        if ran.flip_probability is None or ran.labels_flipped is None:
            return Check(name, False, "the record shows no flip count for a uniform flip probability")
        rho = par.flip_probability
        if ran.flip_probability != rho:
            return Check(name, False, f"the run flipped with probability {ran.flip_probability!r}, the plan says "
                                      f"{rho!r}")
        p = _two_sided_binomial(ran.labels_flipped, ran.labels, rho)
        detail = (f"{ran.labels_flipped} of {ran.labels} labels flipped, expected {ran.labels * rho:.1f}; two-sided "
                  f"binomial p = {p:.3g}")
        return Check(name, p >= alpha, detail + f" (fails below {alpha:g})")
    # eps/K_i: per-unit probabilities; the counts are in the data owner's private record.
    stats_ = next((s for s in record.private_part.phases if isinstance(s, RRStats)), None) \
        if record.private_part is not None else None
    if stats_ is None or stats_.labels_flipped is None or stats_.flip_probability_mean is None:
        return Check(name, False, "under eps/K_i the flips are in the private record, which is not here")
    rho_min, rho_max = min(par.flip_probability_by_count), max(par.flip_probability_by_count)
    if not rho_min <= stats_.flip_probability_mean <= rho_max:
        return Check(name, False, f"mean flip probability {stats_.flip_probability_mean!r} lies outside the plan's "
                                  f"[{rho_min!r}, {rho_max!r}]")
    n, flipped, rho = ran.labels, stats_.labels_flipped, stats_.flip_probability_mean
    z = (flipped - n * rho) / math.sqrt(max(n * rho * (1 - rho), 1e-12))  # Poisson-binomial: variance <= n rho (1-rho)
    p = float(2 * stats.norm.sf(abs(z)))
    return Check(name, p >= alpha, f"{flipped} of {n} labels flipped, expected {n * rho:.1f} (eps/K_i); two-sided "
                                   f"normal p = {p:.3g} (fails below {alpha:g})")


def _gaussian_release_problems(ran, par) -> list[str]:
    """What every one-shot Gaussian release (WALR's, the calibration's) must match: one release at
    the plan's noise std and sensitivity."""
    problems = []
    if ran.releases != 1:
        problems.append(f"{ran.releases} releases; the plan accounts one")
    if ran.noise_std != par.noise_std:
        problems.append(f"noise std {ran.noise_std!r}, the plan's {par.noise_std!r}")
    if ran.sensitivity != par.sensitivity:
        problems.append(f"sensitivity {ran.sensitivity!r}, the plan's {par.sensitivity!r}")
    return problems


def _walr(record: RunRecord, plan: Plan) -> Check:
    name = "WALR release"
    planned, ran = plan.walr, _entry(record, WALRRun)
    if (verdict := _settled(name, planned, ran, "WALR release")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, _gaussian_release_problems(ran, planned.params)
    # one-hot rows: the dimension follows from the features' encoding, which the record's model states
    dimension = par.features if par.features is not None else record.model.get("config", {}).get("features")
    if not isinstance(dimension, int) or isinstance(dimension, bool):
        problems.append(f"the record states no dimension of the released sum (model config features: {dimension!r})")
    elif ran.noise_draws != dimension:
        problems.append(f"{ran.noise_draws} noise draws for a {dimension}-dimensional sum")
    if ran.rows != plan.dataset_size:
        problems.append(f"{ran.rows} rows summed; the plan accounts N = {plan.dataset_size}")
    detail = "; ".join(problems) or (f"one release of a {dimension}-dimensional sum with noise std "
                                     f"{par.noise_std:.6g} (sensitivity {par.sensitivity:.6g})")
    return Check(name, not problems, detail)


def _calibration(record: RunRecord, plan: Plan) -> Check:
    name = "intercept calibration"
    planned, ran = plan.calibration, _entry(record, CalibrationRun)
    if (verdict := _settled(name, planned, ran, "calibration release")) is not None:
        return verdict
    assert planned is not None and ran is not None  # settled otherwise
    par, problems = planned.params, _gaussian_release_problems(ran, planned.params)
    if not ran.coordinates == ran.noise_draws == par.coordinates:
        problems.append(f"{ran.noise_draws} noise draws for {ran.coordinates} coordinates; the plan releases "
                        f"{par.coordinates}")
    if ran.rows != plan.dataset_size:
        problems.append(f"{ran.rows} rows summed; the plan accounts N = {plan.dataset_size}")
    stats_ = next((s for s in record.private_part.phases if isinstance(s, CalibrationStats)), None) \
        if record.private_part is not None else None
    if record.private_part is not None:
        import numpy as np

        if stats_ is None:
            problems.append("the private record holds no calibration statistics")
        elif hashlib.sha256(np.asarray(stats_.release, dtype=np.float64).tobytes()).hexdigest() != \
                ran.release_sha256:
            problems.append("the private record's released vector is not the one whose digest the run recorded")
        elif len(stats_.release) != par.coordinates:
            problems.append(f"the private record's release has {len(stats_.release)} coordinates, the plan "
                            f"{par.coordinates}")
    detail = "; ".join(problems) or (
        f"one release of {par.coordinates} coordinates with noise std {par.noise_std:.6g} (sensitivity "
        f"{par.sensitivity:.6g})" + (f"; intercept shifted by {stats_.shift:+.4g}" if stats_ is not None else ""))
    return Check(name, not problems, detail)


# ----------------------------------------------------------------------- re-accounting


def _reaccount(record: RunRecord, plan: Plan) -> Check:
    """Each phase by an independent path; the executed steps within budget."""
    from budgetplan.accounting import account, backends
    from budgetplan.accounting.gaussian import analytic_epsilon

    notes, problems = [], []
    for phase in plan.phases:
        g = phase.guarantee
        try:
            match phase:
                case DPSGDPhase(mechanism=PoissonDPSGD() | UnitPoissonDPSGD() as m):
                    ran = _entry(record, DPSGDRun)
                    executed = ran.steps_executed if ran is not None else m.steps
                    # a unit-sampled phase is example-level DP-SGD over units: dp_accounting's own PLD
                    if plan.unit.cap == 1 or isinstance(m, UnitPoissonDPSGD):
                        ref = backends.reference_pld_dpsgd(
                            noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate, steps=executed,
                            adjacency=plan.adjacency, discretization=g.discretization or 1e-4)
                        other, how = float(ref.get_epsilon_for_delta(g.delta)), "dp_accounting PLD"
                    else:
                        other = account(PoissonDPSGD(noise_multiplier=m.noise_multiplier,
                                                     sampling_rate=m.sampling_rate, steps=executed),
                                        delta=g.delta, adjacency=plan.adjacency, unit=plan.unit, method=phase.method,
                                        unit_accounting=phase.unit_accounting,
                                        discretization=(g.discretization or 1e-4) / 2).epsilon
                        how = "PLD at half the grid"
                    if executed == m.steps and abs(other - g.epsilon) > REACCOUNT_TOLERANCE * max(g.epsilon, 1e-9):
                        problems.append(f"dpsgd: {how} gives {other:.6g}, the plan {g.epsilon:.6g}")
                    if other > phase.target_epsilon * (1 + REACCOUNT_TOLERANCE):
                        problems.append(f"dpsgd: the {executed} executed steps cost {other:.6g} > the phase budget "
                                        f"{phase.target_epsilon:.6g}")
                    notes.append(f"dpsgd {other:.6g} by {how} (plan {g.epsilon:.6g})")
                case DPSGDPhase():
                    notes.append(f"dpsgd ({phase.params.sampling}): no second accountant exists; the plan's "
                                 "figure stands")
                case CountPhase(mechanism=m):
                    # dp_accounting's event for the K the plan's unit has (its own sensitivity check aside)
                    other = backends.reference_discrete_laplace_epsilon(
                        epsilon=m.epsilon * plan.unit.cap / m.sensitivity, sensitivity=plan.unit.cap, delta=g.delta)
                    if abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
                        problems.append(f"count: dp_accounting's discrete Laplace PLD gives {other:.6g}, the plan "
                                        f"{g.epsilon:.6g}")
                    notes.append(f"count {other:.6g} by dp_accounting's discrete Laplace PLD (plan {g.epsilon:.6g}, "
                                 "released before the run)")
                case RRPhase(params=par):
                    other = account(RandomizedResponse(epsilon=par.per_impression_epsilon), delta=g.delta,
                                    adjacency="replace-one", unit=plan.unit, method="pld").epsilon
                    tol = plan.unit.cap * 1e-4 * 1.01 + 1e-9  # PLD rounds each of K losses up by <= one grid step
                    if par.per_impression_rule != "eps/K_i" and not g.epsilon <= other <= g.epsilon + tol:
                        problems.append(f"rr: PLD gives {other:.6g}, the exact closed form {g.epsilon:.6g}")
                    notes.append(f"rr {other:.6g} by PLD (exact {g.epsilon:.6g})")
                case CalibrationPhase(mechanism=m):
                    other = analytic_epsilon(sigma=m.noise_std, delta=g.delta,
                                             sensitivity=m.sensitivity * plan.unit.cap)
                    if plan.unit.cap > 1 and phase.unit_accounting == "group":
                        # group privacy is looser than the exact Gaussian at K times the sensitivity
                        if other > g.epsilon * (1 + REACCOUNT_TOLERANCE):
                            problems.append(f"calibration: the analytic Gaussian gives {other:.6g}, more than the "
                                            f"plan's group bound {g.epsilon:.6g}")
                    elif abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
                        problems.append(f"calibration: the analytic Gaussian gives {other:.6g}, the plan "
                                        f"{g.epsilon:.6g}")
                    notes.append(f"calibration {other:.6g} by the analytic Gaussian (plan {g.epsilon:.6g})")
                case WALRPhase(mechanism=m):
                    other = analytic_epsilon(sigma=m.noise_std, delta=g.delta,
                                             sensitivity=m.sensitivity * plan.unit.cap)
                    if abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
                        problems.append(f"walr: the analytic Gaussian gives {other:.6g}, the plan {g.epsilon:.6g}")
                    notes.append(f"walr {other:.6g} by the analytic Gaussian (plan {g.epsilon:.6g})")
        except BudgetplanError as exc:
            problems.append(f"{phase.name}: re-accounting failed: {exc}")
    detail = "; ".join(problems) or "; ".join(notes)
    return Check("independent re-accounting", not problems, detail)


# --------------------------------------------------------------- data and code evidence


def _fingerprint(record: RunRecord, plan: Plan, run_dir: Path, data_path, data_format, key) -> Check:
    name = "data fingerprint"
    if record.private_part is None:
        return Check(name, False, f"the private record ({run_dir / PRIVATE_DIR / 'record.json'}) is not here: the "
                                  "data owner holds the fingerprint")
    fp = record.private_part.data.get("fingerprint") or {}
    from trainers.data.fingerprint import fingerprint, key_id, read_key
    from trainers.data.loaders import read_table

    if key is None:
        key_path = run_dir / PRIVATE_DIR / "fingerprint.key"
        if not key_path.exists():
            return Check(name, False, f"no fingerprint key given and none at {key_path}")
        key = read_key(key_path)
    if key_id(key) != fp.get("key_id"):
        return Check(name, False, f"the key given is {key_id(key)}, the fingerprint was made with {fp.get('key_id')}")
    spec = plan.scenario.features
    if spec is None:
        return Check(name, False, "the plan's scenario has no [features] table naming the columns")
    from trainers.data.columns import parquet_source

    # Parquet is digested a window at a time (as the trainer does): a 40M-row file is never read whole.
    table = parquet_source(data_path, data_format, list(spec.columns))
    if table is None:
        table = read_table(data_path, format=data_format, columns=list(spec.columns))
    again = fingerprint(table, list(fp.get("columns") or spec.columns), key)
    if again["hmac_sha256"] != fp.get("hmac_sha256"):
        return Check(name, False, f"the data at {data_path} is not the data the run read")
    return Check(name, True, f"{again['rows']} rows of {data_path} match the keyed fingerprint (key {fp['key_id']})")


def _code(record: RunRecord) -> Check:
    from budgetplan._code import code_fingerprint

    here = code_fingerprint()
    differ = sorted(k for k in set(here) | set(record.code) if here.get(k) != record.code.get(k))
    if differ:
        return Check("code that ran", False, f"the installed {', '.join(differ)} differ from the code that ran: the "
                                            "empirical tests below measure other code than this run's")
    return Check("code that ran", True, "the installed budgetplan and trainers are the code that ran")


# ----------------------------------------------------------------------- interrupted runs


def _audit_interrupted(report: AuditReport, plan: Plan, run_dir: Path, alpha: float) -> None:
    """What the ledger of a run without a record shows: nothing beyond the plan so far."""
    add = report.checks.append
    try:
        view = read_ledger(run_dir / "ledger.jsonl", plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        add(Check("ledger", False, str(exc)))
        return
    problems = []
    for phase in plan.phases:
        if phase.name in _RELEASE_FILES and view.events("intent", phase.name):
            problems += _release_problems(view, run_dir, {phase.name: None})
    add(Check("ledger", not problems, "; ".join(problems) or f"{len(view.entries)} lines, hash chain intact, "
                                                            f"{view.sessions} session(s)"))
    planned = plan.dpsgd.params.steps if plan.dpsgd is not None else 0
    counted = view.count("dpsgd")
    add(Check("steps within plan", counted <= planned,
              f"interrupted: {counted} of {planned} noisy steps counted so far" +
              ("" if counted <= planned else ": more than planned")))
    report.checks.extend(_sampling(plan, view, None, alpha, _sizes_evidence(plan, run_dir, None)))


# ---------------------------------------------------------------------------- empirical


def run_empirical(plan: Plan, *, progress: bool = True) -> list[dict]:
    """Audit every phase of ``plan`` on the installed trainer code (needs torch); one row per phase.

    ``trainers.empirical.audit_plan`` runs the real training loops (RR phase, WALR, DP-SGD)
    on neighbouring inputs: each row holds a lower bound on epsilon against the planned one
    and the mechanism checks, and passes when the bound is at most the plan and every check
    holds. It measures the code installed now, not necessarily the code that trained the run.
    """
    from trainers.empirical import audit_plan

    return audit_plan(plan, progress=progress)
