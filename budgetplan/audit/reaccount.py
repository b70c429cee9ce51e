"""Independent re-accounting: every phase's guarantee recomputed by another path agrees with the plan.

One re-accounting per phase kind, registered for its phase type (``reaccounts``): a new kind
registers its own here, and a kind without one fails the check (nothing is taken on trust).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from budgetplan.accounting import account, backends
from budgetplan.accounting.gaussian import analytic_epsilon
from budgetplan.audit.record import record_entry
from budgetplan.audit.report import REACCOUNT_TOLERANCE, Check
from budgetplan.errors import BudgetplanError
from budgetplan.mechanisms import Composition, Mechanism, PoissonDPSGD, RandomizedResponse, UnitPoissonDPSGD
from budgetplan.plan import Plan
from budgetplan.plan.phases import CalibrationPhase, CountPhase, DPSGDPhase, RRPhase, WALRPhase
from budgetplan.planning.composition import unit_parts
from budgetplan.record.records import DPSGDRun, RunRecord

__all__ = ["reaccount_check", "reaccounts"]

# (phase, record, plan) -> (the note shown when it agrees, the problems found)
Reaccount = Callable[[Any, RunRecord, Plan], tuple[str, list[str]]]
_REACCOUNT: dict[type, Reaccount] = {}
F = TypeVar("F", bound=Reaccount)


def reaccounts(phase_type: type) -> Callable[[F], F]:
    """Register the independent re-accounting of ``phase_type``'s phases."""
    def register(fn: F) -> F:
        _REACCOUNT[phase_type] = fn
        return fn
    return register


def reaccount_check(record: RunRecord, plan: Plan) -> Check:
    """Each phase by an independent path; the executed steps within budget."""
    notes, problems = [], []
    for phase in plan.phases:
        how = _REACCOUNT.get(type(phase))
        if how is None:
            problems.append(f"{phase.name}: no independent re-accounting is registered for {type(phase).__name__}")
            continue
        try:
            note, found = how(phase, record, plan)
        except BudgetplanError as exc:
            problems.append(f"{phase.name}: re-accounting failed: {exc}")
            continue
        notes.append(note)
        problems += found
    if plan.pld_budget and plan.total_pld is not None:
        try:
            note, found = _pld_total(record, plan)
        except BudgetplanError as exc:
            note, found = "", [f"PLD total: re-accounting failed: {exc}"]
        notes.append(note)
        problems += found
    detail = "; ".join(problems) or "; ".join(notes)
    return Check("independent re-accounting", not problems, detail)


def _pld_total(record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    """A PLD budget's headline: the phases' composition by dp_accounting's own PLDs, within the budget.

    Each part of a units split is composed on its own and the largest taken. At K = 1 with
    Poisson DP-SGD every phase has a dp_accounting PLD (RR, sampled Gaussian, Gaussian) at the
    executed steps; otherwise the composition is recomputed here at half the plan's grid.
    """
    total = plan.total_pld
    assert total is not None  # only called for plans that have one
    d = plan.scenario.discretization
    ran = record_entry(record, DPSGDRun)
    worst, how = 0.0, "dp_accounting PLD"
    for part in unit_parts(plan.phases):
        refs = [_reference_pld(p, plan, ran, d) for p in part]
        if any(r is None for r in refs):
            executed = Composition(phases=tuple(_executed(p.mechanism, ran) for p in part))
            eps = account(executed, delta=total.delta, adjacency=plan.adjacency, unit=plan.unit, method="pld",
                          discretization=d / 2).epsilon
            how = "PLD at half the grid"
        else:
            composed = refs[0]
            for r in refs[1:]:
                composed = composed.compose(r)
            eps = float(composed.get_epsilon_for_delta(total.delta))
        worst = max(worst, eps)
    problems = []
    if worst > plan.epsilon * (1 + REACCOUNT_TOLERANCE):
        problems.append(f"PLD total: {how} composes the phases to {worst:.6g} > the budget {plan.epsilon:.6g}")
    return f"the phases composed {worst:.6g} by {how} (plan {total.epsilon:.6g}, the budget)", problems


def _executed(m: Mechanism, ran: DPSGDRun | None) -> Mechanism:
    """A Poisson DP-SGD mechanism at the steps the run executed (an early stop executes fewer); others as planned."""
    if ran is not None and isinstance(m, (PoissonDPSGD, UnitPoissonDPSGD)):
        return replace(m, steps=ran.steps_executed)
    return m


def _reference_pld(phase: Any, plan: Plan, ran: DPSGDRun | None, d: float) -> Any:
    """dp_accounting's own PLD of one phase as executed, or None where it has none (K > 1, other samplings)."""
    if plan.unit.cap != 1:
        return None
    m = phase.mechanism
    if isinstance(phase, RRPhase):
        return backends.reference_pld_rr(epsilon=m.epsilon, discretization=d)
    if isinstance(phase, (CalibrationPhase, WALRPhase)):
        return backends.reference_pld_gaussian(noise_std=m.noise_std, sensitivity=m.sensitivity, discretization=d)
    if isinstance(phase, DPSGDPhase) and isinstance(m, PoissonDPSGD):
        return backends.reference_pld_dpsgd(
            noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate,
            steps=ran.steps_executed if ran is not None else m.steps, adjacency=plan.adjacency, discretization=d)
    return None


@reaccounts(DPSGDPhase)
def _dpsgd(phase: DPSGDPhase, record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    m, g = phase.mechanism, phase.guarantee
    if not isinstance(m, (PoissonDPSGD, UnitPoissonDPSGD)):
        return (f"dpsgd ({phase.params.sampling}): no second accountant exists; the plan's figure stands"), []
    ran = record_entry(record, DPSGDRun)
    executed = ran.steps_executed if ran is not None else m.steps
    # a unit-sampled phase is example-level DP-SGD over units: dp_accounting's own PLD
    if plan.unit.cap == 1 or isinstance(m, UnitPoissonDPSGD):
        ref = backends.reference_pld_dpsgd(
            noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate, steps=executed,
            adjacency=plan.adjacency, discretization=g.discretization or 1e-4)
        other, how = float(ref.get_epsilon_for_delta(g.delta)), "dp_accounting PLD"
    else:
        other = account(PoissonDPSGD(noise_multiplier=m.noise_multiplier, sampling_rate=m.sampling_rate,
                                     steps=executed),
                        delta=g.delta, adjacency=plan.adjacency, unit=plan.unit, method=phase.method,
                        unit_accounting=phase.unit_accounting, discretization=(g.discretization or 1e-4) / 2).epsilon
        how = "PLD at half the grid"
    problems = []
    if executed == m.steps and abs(other - g.epsilon) > REACCOUNT_TOLERANCE * max(g.epsilon, 1e-9):
        problems.append(f"dpsgd: {how} gives {other:.6g}, the plan {g.epsilon:.6g}")
    if other > phase.target_epsilon * (1 + REACCOUNT_TOLERANCE):
        problems.append(f"dpsgd: the {executed} executed steps cost {other:.6g} > the phase budget "
                        f"{phase.target_epsilon:.6g}")
    return f"dpsgd {other:.6g} by {how} (plan {g.epsilon:.6g})", problems


@reaccounts(CountPhase)
def _count(phase: CountPhase, record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    m, g = phase.mechanism, phase.guarantee
    # dp_accounting's event for the K the plan's unit has (its own sensitivity check aside)
    other = backends.reference_discrete_laplace_epsilon(
        epsilon=m.epsilon * plan.unit.cap / m.sensitivity, sensitivity=plan.unit.cap, delta=g.delta)
    problems = []
    if abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
        problems.append(f"count: dp_accounting's discrete Laplace PLD gives {other:.6g}, the plan {g.epsilon:.6g}")
    return (f"count {other:.6g} by dp_accounting's discrete Laplace PLD (plan {g.epsilon:.6g}, released before "
            "the run)"), problems


@reaccounts(RRPhase)
def _rr(phase: RRPhase, record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    par, g = phase.params, phase.guarantee
    other = account(RandomizedResponse(epsilon=par.per_impression_epsilon), delta=g.delta,
                    adjacency="replace-one", unit=plan.unit, method="pld").epsilon
    tol = plan.unit.cap * 1e-4 * 1.01 + 1e-9  # PLD rounds each of K losses up by <= one grid step
    problems = []
    if par.per_impression_rule != "eps/K_i" and not g.epsilon <= other <= g.epsilon + tol:
        problems.append(f"rr: PLD gives {other:.6g}, the exact closed form {g.epsilon:.6g}")
    return f"rr {other:.6g} by PLD (exact {g.epsilon:.6g})", problems


@reaccounts(CalibrationPhase)
def _calibration(phase: CalibrationPhase, record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    m, g = phase.mechanism, phase.guarantee
    other = analytic_epsilon(sigma=m.noise_std, delta=g.delta, sensitivity=m.sensitivity * plan.unit.cap)
    problems = []
    if plan.unit.cap > 1 and phase.unit_accounting == "group":
        # group privacy is looser than the exact Gaussian at K times the sensitivity
        if other > g.epsilon * (1 + REACCOUNT_TOLERANCE):
            problems.append(f"calibration: the analytic Gaussian gives {other:.6g}, more than the plan's group "
                            f"bound {g.epsilon:.6g}")
    elif abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
        problems.append(f"calibration: the analytic Gaussian gives {other:.6g}, the plan {g.epsilon:.6g}")
    return f"calibration {other:.6g} by the analytic Gaussian (plan {g.epsilon:.6g})", problems


@reaccounts(WALRPhase)
def _walr(phase: WALRPhase, record: RunRecord, plan: Plan) -> tuple[str, list[str]]:
    m, g = phase.mechanism, phase.guarantee
    other = analytic_epsilon(sigma=m.noise_std, delta=g.delta, sensitivity=m.sensitivity * plan.unit.cap)
    problems = []
    if abs(other - g.epsilon) > REACCOUNT_TOLERANCE * g.epsilon:
        problems.append(f"walr: the analytic Gaussian gives {other:.6g}, the plan {g.epsilon:.6g}")
    return f"walr {other:.6g} by the analytic Gaussian (plan {g.epsilon:.6g})", problems
