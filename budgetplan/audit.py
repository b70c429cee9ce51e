"""Audit a run: is the guarantee the plan promised true of what actually ran?

``audit_run`` re-checks a run record against its plan, each check named and independent:

1. ``plan verifies``: the plan's hash, schema and every recomputed number (``verify``).
2. ``record names the plan``: the record's plan hash is the plan's, it carries a data
   fingerprint, and its row count is the plan's N (and, given the data, the fingerprint
   recomputes).
3. ``steps within plan``: DP-SGD steps executed never exceed the planned steps; a completed
   run took exactly them; the run directory's ledger (when present) counts the same.
4. ``Poisson batch sizes``: the realised batch sizes are consistent with Poisson sampling
   at q: their total is Binomial(N T, q) and their spread is Poisson's (each a two-sided
   test at false-alarm rate ``alpha``; fixed-size or shuffled batches fail the spread).
5. ``RR flips``: the count of flipped labels is consistent with the plan's flip
   probability (two-sided binomial test at ``alpha``; labels flipped too rarely fail).
6. ``independent re-accounting``: every phase's guarantee recomputed by a different path
   (dp_accounting's own PLD for DP-SGD, the exact binomial or analytic Gaussian against a
   PLD for RR and WALR) agrees with the plan within the stated tolerance, and the
   guarantee of the steps actually executed is within the plan's budget.

The report is what a human reads (``budgetplan audit``) or JSON; it passes when every
check passes. The empirical lower bounds on epsilon (``empirical=True``) run the
trainer's real mechanisms and are imported lazily: they need torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from scipy import stats

from budgetplan.errors import BudgetplanError
from budgetplan.mechanisms import PoissonDPSGD, RandomizedResponse
from budgetplan.phases import DPSGDPhase, RRPhase, WALRPhase
from budgetplan.plan import Plan, load_plan
from budgetplan.records import RunRecord, load_record

__all__ = ["Check", "AuditReport", "audit_run", "ALPHA", "REACCOUNT_TOLERANCE"]

ALPHA = 1e-6                 # false-alarm rate of each statistical test
REACCOUNT_TOLERANCE = 1e-3   # relative agreement required between independent accountings


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
    checks: list = field(default_factory=list)
    empirical: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks) and all(e["passed"] for e in self.empirical)

    def failing(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed] + [e["name"] for e in self.empirical if not e["passed"]]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "record": self.record, "plan_sha256": self.plan_sha256,
                "alpha": ALPHA, "tolerance": REACCOUNT_TOLERANCE,
                "checks": [c.__dict__ for c in self.checks], "empirical": self.empirical,
                "failing": self.failing()}


def _find_plan(record_path: Path, plan_path) -> Plan:
    if plan_path is not None:
        return load_plan(plan_path)
    beside = (record_path if record_path.is_dir() else record_path.parent) / "plan.json"
    if not beside.exists():
        raise BudgetplanError(f"no plan given and none beside the record ({beside}); pass --plan")
    return load_plan(beside)


def audit_run(record_path, plan_path=None, *, data_path=None, data_format: str = "auto",
              empirical: bool = False, alpha: float = ALPHA) -> AuditReport:
    """Run every check on the run record at ``record_path`` (a run.json or its directory)."""
    from budgetplan.verify import verify_plan

    record_path = Path(record_path)
    record = load_record(record_path)
    plan = _find_plan(record_path, plan_path)
    report = AuditReport(record=str(record_path), plan_sha256=plan.sha256)
    add = report.checks.append

    verified = verify_plan(plan)
    add(Check("plan verifies", verified.ok, "hash, schema and recomputed numbers hold" if verified.ok
              else "; ".join(verified.problems[:3])))
    add(_names_plan(record, plan, data_path, data_format))
    add(_steps(record, plan, record_path))
    for check in _sampling(record, plan, alpha):
        add(check)
    for check in _flips(record, plan, alpha):
        add(check)
    add(_reaccount(record, plan))
    if empirical:
        report.empirical = run_empirical(plan)
    return report


def _names_plan(record: RunRecord, plan: Plan, data_path, data_format) -> Check:
    problems = []
    if record.plan_sha256 != plan.sha256:
        problems.append(f"the record names plan {record.plan_sha256}, not {plan.sha256}")
    if not record.private:
        problems.append("the record is of a non-private run")
    fp = record.data.get("sha256")
    if not fp:
        problems.append("the record has no data fingerprint")
    if record.data.get("rows_used") != plan.dataset_size:
        problems.append(f"the run used {record.data.get('rows_used')} rows; the plan accounts N = {plan.dataset_size}")
    if data_path is not None and fp:
        from trainers.data.fingerprint import fingerprint
        from trainers.data.loaders import read_table

        spec = plan.scenario.features
        table = read_table(data_path, format=data_format, columns=list(spec.columns))
        if plan.unit.cap == 1:
            again = fingerprint(table, list(spec.columns))["sha256"]
            if again != fp:
                problems.append(f"the data at {data_path} does not match the record's fingerprint")
        elif fingerprint(table, list(spec.columns))["rows"] != record.data.get("rows_in"):
            problems.append(f"the data at {data_path} has another row count than the run read")
    detail = "; ".join(problems) or f"plan {plan.sha256[:12]}..., data {fp[:12]}... with N = {plan.dataset_size} rows"
    return Check("record names the plan and its data", not problems, detail)


def _dpsgd_phase(plan: Plan):
    return plan.dpsgd


def _record_phase(record: RunRecord, name: str):
    return next((p for p in record.phases if p.get("name") == name), None)


def _steps(record: RunRecord, plan: Plan, record_path: Path) -> Check:
    planned = _dpsgd_phase(plan)
    ran = _record_phase(record, "dpsgd")
    if planned is None:
        ok = ran is None
        return Check("steps within plan", ok, "no DP-SGD phase planned" + ("" if ok else ", but one ran"))
    if ran is None:
        return Check("steps within plan", False, "the plan has a DP-SGD phase the record does not show")
    executed, steps = ran["steps_executed"], planned.params.steps
    problems = []
    if executed > steps:
        problems.append(f"{executed} noisy steps executed, more than the {steps} planned")
    if record.status == "completed" and executed != steps:
        problems.append(f"a completed run took {executed} steps, not the {steps} planned")
    ledger_path = (record_path if record_path.is_dir() else record_path.parent) / "ledger.jsonl"
    counted = None
    if ledger_path.exists():
        counted = sum('"event":"intent"' in line and '"phase":"dpsgd"' in line
                      for line in ledger_path.read_text(encoding="ascii", errors="replace").splitlines())
        if counted != executed:
            problems.append(f"the ledger counts {counted} noisy steps, the record {executed}")
    detail = "; ".join(problems) or (f"{executed} of {steps} noisy steps" +
                                     (", the ledger agrees" if counted is not None else ""))
    return Check("steps within plan", not problems, detail)


def _two_sided_binomial(k: int, n: int, p: float) -> float:
    if n == 0:
        return 1.0
    return float(stats.binomtest(int(k), int(n), p).pvalue) if n < 10**7 else float(
        2 * min(stats.norm.cdf((k - n * p) / math.sqrt(n * p * (1 - p))),
                stats.norm.sf((k - n * p) / math.sqrt(n * p * (1 - p)))))


def _sampling(record: RunRecord, plan: Plan, alpha: float) -> list[Check]:
    planned, ran = _dpsgd_phase(plan), _record_phase(record, "dpsgd")
    if planned is None or ran is None or not ran.get("steps_this_session"):
        return []
    n, q = planned.params.dataset_size, planned.params.sampling_rate
    t = ran["steps_this_session"]
    total, sumsq = ran["batch_size_sum"], ran["batch_size_sumsq"]
    if ran.get("batches_truncated"):
        return [Check("Poisson batch sizes", True,
                      f"{ran['batches_truncated']} batches truncated at the plan's maximum, as accounted; the "
                      "binomial tests assume untruncated batches and are skipped")]
    p_mean = _two_sided_binomial(total, n * t, q)
    checks = [Check("Poisson batch sizes: total", p_mean >= alpha,
                    f"{total} rows over {t} steps, expected {n * t * q:.1f} (N T q); two-sided binomial p = "
                    f"{p_mean:.3g} (fails below {alpha:g})")]
    if t >= 2:
        mean = total / t
        var = (sumsq - t * mean * mean) / (t - 1)
        expected = n * q * (1 - q)
        stat = (t - 1) * var / expected
        p_var = 2 * min(stats.chi2.cdf(stat, t - 1), stats.chi2.sf(stat, t - 1))
        checks.append(Check("Poisson batch sizes: spread", p_var >= alpha,
                            f"variance {var:.2f} against N q (1-q) = {expected:.2f}; two-sided chi-square p = "
                            f"{p_var:.3g} (fixed-size or shuffled batches have no spread)"))
    return checks


def _flips(record: RunRecord, plan: Plan, alpha: float) -> list[Check]:
    planned = plan.rr
    ran = _record_phase(record, "rr")
    if planned is None or ran is None:
        return []
    n, flipped = ran["labels"], ran["labels_flipped"]
    if ran.get("flip_probability") is not None:
        rho = planned.params.flip_probability
        if abs(ran["flip_probability"] - rho) > 1e-15:
            return [Check("RR flips", False, f"the run flipped with probability {ran['flip_probability']!r}, the "
                                             f"plan says {rho!r}")]
        p = _two_sided_binomial(flipped, n, rho)
        detail = f"{flipped} of {n} labels flipped, expected {n * rho:.1f}; two-sided binomial p = {p:.3g}"
    else:
        rho = ran["flip_probability_mean"]  # eps/K_i: a Poisson-binomial, variance at most n rho (1 - rho)
        z = (flipped - n * rho) / math.sqrt(max(n * rho * (1 - rho), 1e-12))
        p = float(2 * stats.norm.sf(abs(z)))
        detail = f"{flipped} of {n} labels flipped, expected {n * rho:.1f} (eps/K_i); two-sided normal p = {p:.3g}"
    return [Check("RR flips", p >= alpha, detail + f" (fails below {alpha:g})")]


def _reaccount(record: RunRecord, plan: Plan) -> Check:
    """Each phase by an independent path; the executed steps within budget."""
    from budgetplan.accounting import account
    from budgetplan.accounting import backends
    from budgetplan.accounting.gaussian import analytic_epsilon

    notes, problems = [], []
    for phase in plan.phases:
        g = phase.guarantee
        try:
            if isinstance(phase, DPSGDPhase) and isinstance(phase.mechanism, PoissonDPSGD):
                m = phase.mechanism
                ran = _record_phase(record, "dpsgd")
                executed = ran["steps_executed"] if ran else m.steps
                if plan.unit.cap == 1:
                    ref = backends.reference_pld_dpsgd(
                        noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate, steps=executed,
                        adjacency=plan.adjacency, discretization=g.discretization or 1e-4)
                    other, how = float(ref.get_epsilon_for_delta(g.delta)), "dp_accounting PLD"
                else:
                    other = account(PoissonDPSGD(noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate,
                                                 steps=executed), delta=g.delta, adjacency=plan.adjacency,
                                    unit=plan.unit, method=phase.method, unit_accounting=phase.unit_accounting,
                                    discretization=(g.discretization or 1e-4) / 2).epsilon
                    how = "PLD at half the grid"
                if executed == m.steps and abs(other - g.epsilon) > REACCOUNT_TOLERANCE * max(g.epsilon, 1e-9):
                    problems.append(f"dpsgd: {how} gives {other:.6g}, the plan {g.epsilon:.6g}")
                if other > phase.target_epsilon * (1 + REACCOUNT_TOLERANCE):
                    problems.append(f"dpsgd: the {executed} executed steps cost {other:.6g} > the phase budget "
                                    f"{phase.target_epsilon:.6g}")
                notes.append(f"dpsgd {other:.6g} by {how} (plan {g.epsilon:.6g})")
            elif isinstance(phase, DPSGDPhase):
                notes.append("dpsgd (truncated Poisson): no second accountant exists; the plan's dp_accounting "
                             "figure stands")
            elif isinstance(phase, RRPhase):
                per, k = phase.params.per_impression_epsilon, plan.unit.cap
                other = account(RandomizedResponse(epsilon=per), delta=g.delta, adjacency="replace-one",
                                unit=plan.unit, method="pld").epsilon
                tol = k * 1e-4 * 1.01 + 1e-9  # the PLD rounds each of K losses up by at most one grid step
                if phase.params.per_impression_rule != "eps/K_i" and not g.epsilon <= other <= g.epsilon + tol:
                    problems.append(f"rr: PLD gives {other:.6g}, the exact closed form {g.epsilon:.6g}")
                notes.append(f"rr {other:.6g} by PLD (exact {g.epsilon:.6g})")
            elif isinstance(phase, WALRPhase):
                m = phase.mechanism
                other = analytic_epsilon(sigma=m.noise_std, delta=g.delta, sensitivity=m.sensitivity * plan.unit.cap)
                if abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
                    problems.append(f"walr: the analytic Gaussian gives {other:.6g}, the plan {g.epsilon:.6g}")
                notes.append(f"walr {other:.6g} by the analytic Gaussian (plan {g.epsilon:.6g})")
        except BudgetplanError as exc:
            problems.append(f"{phase.name}: re-accounting failed: {exc}")
    detail = "; ".join(problems) or "; ".join(notes)
    return Check("independent re-accounting", not problems, detail)


EMPIRICAL_DPSGD_STEPS = 20


def run_empirical(plan: Plan) -> list[dict]:
    """Lower bounds on epsilon from the trainer's real mechanisms, one per phase (needs torch).

    RR and the Gaussian release are tested at their planned parameters. DP-SGD is tested on
    its first ``EMPIRICAL_DPSGD_STEPS`` steps (the plan's sigma and q; C at most 0.5 for the
    canary) against the add-remove epsilon of exactly those steps, which is at most the
    plan's: the canary test of all T steps would take hours on a CPU.
    """
    from dataclasses import asdict

    from trainers import empirical

    out = []
    for phase in plan.phases:
        if isinstance(phase, RRPhase):
            res = empirical.rr_lower_bound(epsilon=phase.params.per_impression_epsilon)
        elif isinstance(phase, WALRPhase):
            res = empirical.gaussian_lower_bound(noise_std=phase.params.noise_std,
                                                 sensitivity=phase.params.sensitivity, delta=phase.target_delta)
        elif isinstance(phase, DPSGDPhase) and phase.params.sampling == "poisson":
            par = phase.params
            res = empirical.dpsgd_lower_bound(noise_multiplier=par.noise_multiplier, sampling_rate=par.sampling_rate,
                                              steps=min(par.steps, EMPIRICAL_DPSGD_STEPS),
                                              clipping_norm=min(par.clipping_norm, 0.5), delta=phase.target_delta)
        else:
            continue
        row = asdict(res)
        row["hits"] = list(row["hits"])
        out.append({"name": f"empirical {phase.name}", **row})
    return out
