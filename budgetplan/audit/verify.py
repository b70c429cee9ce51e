"""Verify a plan file: integrity, then every number recomputed from its parameters.

Checks, in order (each failure names what differs):
1. integrity: valid JSON, a schema version this budgetplan reads, the sha256 over the
   content, and the canonical form byte for byte (so whitespace edits are caught too);
2. parameters: derived values agree with the ones they derive from (flip probability
   from the per-impression epsilon, noise std = sigma C, q = B/N, steps from epochs, the
   mechanism's fields = the trainer parameters, N and the cap everywhere the same; a DP
   count of N is the scenario's, first, and the training phases share what it leaves; a
   calibration release is the scenario's share of the run, last, of sensitivity sqrt(m + 1)
   over the code's grid of shifts);
3. guarantees: each phase's guarantee recomputed from its mechanism and parameters, the
   basic and PLD totals and the tuning accounting recomputed, all within tolerance of
   what the plan states and within the plan's budget; for a grid of configurations
   (``budgetplan.planning.grid``) every configuration's phases likewise, each within the per-run
   budget, and the selection's cost and the total re-derived; a table-driven split's
   recorded alpha re-derived from its rule;
4. the scenario: re-planning the embedded scenario gives the same parameters (every
   configuration's, for a grid);
5. given the scenario the privacy engineer signed off (``signed``), the plan's embedded
   scenario is that one, field by field. A plan is its own authority on everything but
   this: a forger who re-hashes a plan after moving a sensitive column into the
   non-sensitive group, or after raising the budget, produces a plan that verifies
   internally; only a comparison with the signed-off scenario shows it.

Numbers are compared to a relative 1e-9 when the library versions match the plan's, and
1e-6 otherwise (a newer back-end may round differently; the version change is reported).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from budgetplan import intercept
from budgetplan.accounting import batch_selection
from budgetplan.accounting.guarantee import Guarantee
from budgetplan.accounting.rr import flip_probability
from budgetplan.dpcount import noise_std as count_noise_std
from budgetplan.errors import BudgetplanError, PlanMismatchError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    Mechanism,
    PoissonDPSGD,
    ShuffledDPSGD,
    TruncatedPoissonDPSGD,
    UnitPoissonDPSGD,
)
from budgetplan.plan import Plan, current_versions, load_plan
from budgetplan.plan.phases import (
    CalibrationPhase,
    CountPhase,
    DPSGDParams,
    DPSGDPhase,
    Phase,
    RRPhase,
    UnitPart,
    WALRPhase,
    phase_to_dict,
)
from budgetplan.plan.tuning import GridEntry, NoisyMax, TuningAccounting, read_tuning
from budgetplan.planning import grid
from budgetplan.planning.calibrate import steps_for_epochs
from budgetplan.planning.composition import (
    EPS_SLACK,
    basic_total,
    part_spent,
    phase_guarantee,
    pld_total,
    tuning_accounting,
)
from budgetplan.planning.planner import build_plan, check_within_budget, resolve_composition
from budgetplan.planning.shares import split_record
from budgetplan.scenario.model import Scenario
from budgetplan.scenario.split_rules import units_share
from budgetplan.units import Adjacency
from budgetplan.util.typed import to_json_object

__all__ = ["verify_plan", "verify_file", "VerifyReport", "checks_phase", "Close"]

# close(where, stored, recomputed): a problem named ``where`` unless the two agree (to the version's tolerance)
Close: TypeAlias = Callable[[str, object, object], None]  # (where, stored, recomputed)
_Close = Close


class VerifyReport:
    """Problems found (empty when the plan verifies) and notes that do not fail it."""

    def __init__(self, plan: Plan | None, problems: list[str], notes: list[str]):
        self.plan, self.problems, self.notes = plan, problems, notes

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "sha256": self.plan.sha256 if self.plan else None, "problems": self.problems,
                "notes": self.notes}


def verify_file(path: str | Path, *, replan: bool = True, signed: Scenario | None = None) -> VerifyReport:
    try:
        plan = load_plan(path)
    except PlanMismatchError as exc:
        return VerifyReport(None, exc.problems, [])
    return verify_plan(plan, replan=replan, signed=signed)


def verify_plan(plan: Plan, *, replan: bool = True, signed: Scenario | None = None) -> VerifyReport:
    """Check ``plan``; ``signed`` is the Scenario it must have been planned from, if given."""
    problems: list[str] = []
    notes: list[str] = []
    same_versions = plan.versions == current_versions()
    tol = 1e-9 if same_versions else 1e-6
    if not same_versions:
        diff = {k: (v, current_versions().get(k)) for k, v in plan.versions.items() if current_versions().get(k) != v}
        notes.append(f"library versions differ from the plan's {diff}: numbers compared to 1e-6")

    def close(where: str, stored: object, recomputed: object) -> None:
        if stored is None or recomputed is None:
            if stored != recomputed:
                problems.append(f"{where}: stored {stored!r}, recomputed {recomputed!r}")
            return
        if isinstance(stored, (int, float)) and isinstance(recomputed, (int, float)):
            if math.isinf(stored) or math.isinf(recomputed):
                ok = stored == recomputed
            else:
                ok = math.isclose(stored, recomputed, rel_tol=tol, abs_tol=1e-300)
        else:
            ok = stored == recomputed
        if not ok:
            problems.append(f"{where}: stored {stored!r}, recomputed {recomputed!r}")

    _check_parameters(plan, close, problems)
    try:
        _check_guarantees(plan, close, problems)
    except BudgetplanError as exc:
        problems.append(f"recomputing the guarantees failed: {exc}")
    problems += check_within_budget(plan)
    if replan and not problems:
        _check_replan(plan, close, problems)
    if signed is not None:
        problems += _check_signed(plan, signed)
    return VerifyReport(plan, problems, notes)


def _check_signed(plan: Plan, signed: Scenario) -> list[str]:
    """Every field of the embedded scenario that differs from the signed-off one, named."""
    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
        return out

    if signed.composition == "auto":  # the plan's scenario says what "auto" resolved to: resolve the signed one
        try:
            signed = resolve_composition(signed)
        except BudgetplanError as exc:
            return [f"the signed-off scenario cannot be planned: {exc}"]
    mine, theirs = flat(plan.scenario.to_dict()), flat(signed.to_dict())
    return [f"scenario.{key}: the plan has {mine.get(key)!r}, the signed-off scenario {theirs.get(key)!r}"
            for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def _check_parameters(plan: Plan, close: _Close, problems: list[str]) -> None:
    n = plan.dataset_size
    close("privacy.dataset_size vs scenario", n, plan.scenario.dataset_size)
    close("budget.delta vs scenario", plan.delta, plan.scenario.resolved_delta)
    close("budget.epsilon vs scenario", plan.epsilon, plan.scenario.epsilon)
    _check_count(plan, close, problems)
    _check_split(plan, problems)
    _check_calibration(plan, close, problems)
    for i, p in enumerate(plan.phases):
        _check_phase(plan, f"phases[{i}] ({p.name})", p, close, problems)


# phase class -> (plan, where, phase, close, problems): its derived parameters checked
PhaseCheck: TypeAlias = Callable[[Plan, str, Any, _Close, list[str]], None]
_PHASE_CHECKS: dict[type, PhaseCheck] = {}
C = TypeVar("C", bound=PhaseCheck)


def checks_phase(phase_type: type) -> Callable[[C], C]:
    """Register the decorated ``check(plan, where, phase, close, problems)`` for ``phase_type``'s parameters.

    ``close(where, stored, recomputed)`` records a problem when two values differ; a check
    appends what else it finds to ``problems``. A phase kind without a check fails
    verification (nothing is taken on trust).
    """
    def register(fn: C) -> C:
        _PHASE_CHECKS[phase_type] = fn
        return fn
    return register


def _rows(plan: Plan, params: Any) -> int:
    """The rows a phase trains on: N, or under a units split its part's expected rows."""
    part = getattr(params, "unit_part", None)
    return plan.dataset_size if part is None else part.rows


def _check_unit_part(plan: Plan, where: str, p: Phase, problems: list[str]) -> None:
    """A phase's part of the units is the one the scenario's units split gives its kind (none otherwise)."""
    s = plan.scenario
    share = units_share(s.split) if s.algorithm == "hybrid" and s.split is not None else None
    part = getattr(p.params, "unit_part", None)
    wanted: UnitPart | None = None
    if share is not None and isinstance(p, (RRPhase, DPSGDPhase)):
        wanted = UnitPart.halves(plan.dataset_size, share)[0 if isinstance(p, RRPhase) else 1]
    if part != wanted:
        stored = None if part is None else to_json_object(part)
        given = None if wanted is None else to_json_object(wanted)
        problems.append(f"{where}.parameters.unit_part: stored {stored!r}, the scenario's split {s.split!r} gives "
                        f"{given!r}")


def _check_phase(plan: Plan, where: str, p: Phase, close: _Close, problems: list[str]) -> None:
    """One phase's derived parameters agree with the ones they derive from and with the plan."""
    _check_unit_part(plan, where, p, problems)
    close(f"{where}.parameters.dataset_size", p.params.dataset_size, _rows(plan, p.params))
    close(f"{where}.parameters.cap", p.params.cap, plan.unit.cap)
    check = _PHASE_CHECKS.get(type(p))
    if check is None:
        problems.append(f"{where}: no parameter check is registered for the phase kind {type(p).__name__}")
        return
    check(plan, where, p, close, problems)


@checks_phase(RRPhase)
def _check_rr(plan: Plan, where: str, p: RRPhase, close: _Close, problems: list[str]) -> None:
    m, par = p.mechanism, p.params
    close(f"{where}.mechanism.epsilon", m.epsilon, par.per_impression_epsilon)
    close(f"{where}.parameters.flip_probability", par.flip_probability, flip_probability(m.epsilon))
    if par.per_impression_epsilon_by_count is not None and par.flip_probability_by_count is not None:
        for k, (e, rho) in enumerate(zip(par.per_impression_epsilon_by_count, par.flip_probability_by_count), 1):
            close(f"{where}.parameters.flip_probability_by_count[{k - 1}]", rho, flip_probability(e))
            if k * e > par.unit_epsilon * (1 + 1e-12):
                problems.append(f"{where}: {k} x {e!r} exceeds the unit epsilon {par.unit_epsilon!r}")


@checks_phase(DPSGDPhase)
def _check_dpsgd(plan: Plan, where: str, p: DPSGDPhase, close: _Close, problems: list[str]) -> None:
    m, par, n = p.mechanism, p.params, _rows(plan, p.params)
    close(f"{where}.mechanism.noise_multiplier", m.noise_multiplier, par.noise_multiplier)
    close(f"{where}.parameters.noise_std", par.noise_std, par.noise_multiplier * par.clipping_norm)
    close(f"{where}.parameters.sampling_rate", par.sampling_rate,
          par.batch_size / (n if par.units is None else par.units))
    if par.units is not None:
        close(f"{where}.parameters.units vs scenario", par.units, plan.scenario.units)
    close(f"{where}.mechanism.steps", m.steps, par.steps)
    close(f"{where}.parameters.sensitivity", par.sensitivity,
          par.clipping_norm * (2 if plan.adjacency is Adjacency.REPLACE_ONE else 1))
    _check_dpsgd_shape(plan, where, m, par, close, problems)


@checks_phase(CountPhase)
def _check_count_phase(plan: Plan, where: str, p: CountPhase, close: _Close, problems: list[str]) -> None:
    m, par = p.mechanism, p.params
    close(f"{where}.mechanism.epsilon", m.epsilon, par.epsilon)
    close(f"{where}.mechanism.sensitivity", m.sensitivity, par.sensitivity)
    close(f"{where}.target_epsilon", p.target_epsilon, par.epsilon)
    close(f"{where}.parameters.noise_std", par.noise_std,
          count_noise_std(epsilon=par.epsilon, sensitivity=par.sensitivity))


@checks_phase(CalibrationPhase)
def _check_calibration_phase(plan: Plan, where: str, p: CalibrationPhase, close: _Close,
                             problems: list[str]) -> None:
    m, par = p.mechanism, p.params
    close(f"{where}.mechanism.noise_std", m.noise_std, par.noise_std)
    close(f"{where}.mechanism.sensitivity", m.sensitivity, par.sensitivity)
    close(f"{where}.parameters.shifts", list(par.shifts), list(intercept.SHIFTS))
    close(f"{where}.parameters.coordinates", par.coordinates, intercept.coordinates(par.shifts))
    close(f"{where}.parameters.sensitivity", par.sensitivity, intercept.sensitivity(par.shifts))
    close(f"{where}.parameters.unit_sensitivity", par.unit_sensitivity, par.sensitivity * plan.unit.cap)


@checks_phase(WALRPhase)
def _check_walr(plan: Plan, where: str, p: WALRPhase, close: _Close, problems: list[str]) -> None:
    m, par = p.mechanism, p.params
    close(f"{where}.mechanism.noise_std", m.noise_std, par.noise_std)
    close(f"{where}.mechanism.sensitivity", m.sensitivity, par.sensitivity)
    close(f"{where}.parameters.sensitivity", par.sensitivity, par.weights_bound * par.row_norm_bound)
    if plan.scenario.walr is not None:
        close(f"{where}.parameters.row_norm_bound vs scenario", par.row_norm_bound,
              plan.scenario.walr_row_norm_bound)
    close(f"{where}.parameters.unit_sensitivity", par.unit_sensitivity, par.sensitivity * plan.unit.cap)


def _check_dpsgd_shape(plan: Plan, where: str, m: Mechanism, par: DPSGDParams, close: _Close,
                       problems: list[str]) -> None:
    """The DP-SGD phase's steps and mechanism are those its scenario and sampling choice give."""
    n = _rows(plan, par)
    shape = plan.scenario.dpsgd
    if shape is None:
        problems.append(f"{where}: the scenario has no [dpsgd] table")
        return
    close(f"{where}.parameters.sampling vs scenario", par.sampling, shape.sampling)
    close(f"{where}.parameters.sample_by vs scenario", par.sample_by or "example", shape.sample_by)
    expected = batch_selection.mechanism(par.sampling, par.noise_multiplier, dataset_size=n, batch_size=par.batch_size,
                                         steps=par.steps, max_batch_size=par.max_batch_size, units=par.units)
    close(f"{where}.mechanism.type", type(m).__name__, type(expected).__name__)
    if type(m) is not type(expected):
        return
    if isinstance(m, (AllocationDPSGD, ShuffledDPSGD)):
        steps, whole = batch_selection.epoch_steps(dataset_size=n, batch_size=par.batch_size, epochs=shape.epochs,
                                                   steps=shape.steps)
        close(f"{where}.parameters.steps vs scenario", par.steps, steps)
        close(f"{where}.parameters.epochs", par.epochs, float(whole))
        close(f"{where}.mechanism.steps_per_epoch", m.steps_per_epoch, par.steps_per_epoch)
        close(f"{where}.mechanism.epochs", m.epochs, whole)
        return
    assert isinstance(m, (PoissonDPSGD, UnitPoissonDPSGD, TruncatedPoissonDPSGD))  # the type matched batch_selection's
    close(f"{where}.mechanism.sampling_rate", m.sampling_rate, par.sampling_rate)
    if shape.steps is not None:
        close(f"{where}.parameters.steps vs scenario", par.steps, shape.steps)
    else:
        assert shape.epochs is not None  # a DPSGDShape has exactly one of steps and epochs
        close(f"{where}.parameters.steps vs epochs", par.steps,
              steps_for_epochs(epochs=shape.epochs, dataset_size=n if par.units is None else par.units,
                               batch_size=par.batch_size))
    if isinstance(m, TruncatedPoissonDPSGD):
        close(f"{where}.mechanism.max_batch_size", m.max_batch_size, par.max_batch_size)
        close(f"{where}.mechanism.dataset_size", m.dataset_size, n)


def _check_split(plan: Plan, problems: list[str]) -> None:
    """A table-driven split's record is what the rule gives at the run's epsilon, and the phases follow it."""
    try:
        wanted = split_record(plan.scenario, plan.run_epsilon)
    except BudgetplanError as exc:
        problems.append(f"split: re-deriving the split failed: {exc}")
        return
    if plan.split != wanted:
        problems.append(f"split: stored {plan.split!r}, the rule gives {wanted!r}")
        return
    if wanted is None:
        return
    targets = {p.name: p.target_epsilon for p in plan.phases}
    for name, key, value in (("rr", "epsilon1", wanted.epsilon1), ("dpsgd", "epsilon2", wanted.epsilon2)):
        if targets.get(name, 0.0) != value:
            problems.append(f"split: the {name} phase is planned to {targets.get(name, 0.0)!r}, the rule's {key} "
                            f"is {value!r}")


def _check_count(plan: Plan, close: _Close, problems: list[str]) -> None:
    """The scenario's DP count of N, if any, is the plan's first phase and the run gets the rest."""
    counts = [i for i, p in enumerate(plan.phases) if isinstance(p, CountPhase)]
    wanted = plan.scenario.size_release_epsilon
    if wanted is None:
        if counts:
            problems.append(f"phases[{counts[0]}]: a count phase, but the scenario states no "
                            "[data].size_release_epsilon")
        return
    if counts != [0]:
        problems.append(f"the scenario's N is a DP count at epsilon {wanted!r}: the plan must account it as its "
                        f"first phase and only there, found count phases at {counts}")
        return
    count = plan.phases[0]
    assert isinstance(count, CountPhase)  # counts == [0]
    close("phases[0] (count).parameters.epsilon vs scenario", count.params.epsilon, wanted)
    spent = count.guarantee.epsilon
    if plan.run_epsilon + spent > plan.epsilon * (1 + 1e-12):
        problems.append(f"run_budget.epsilon {plan.run_epsilon!r} plus the count's {spent!r} exceeds the budget "
                        f"{plan.epsilon!r}")


def _check_calibration(plan: Plan, close: _Close, problems: list[str]) -> None:
    """A calibrated scenario's release, when its run has DP-SGD, is the last phase and takes its share of the run."""
    at = [i for i, p in enumerate(plan.phases) if isinstance(p, CalibrationPhase)]
    cal = plan.scenario.calibration
    wanted = cal is not None and plan.dpsgd is not None
    if not wanted:
        if at:
            problems.append(f"phases[{at[0]}]: a calibration phase, but " + (
                "the scenario's intercept is not calibrated" if cal is None else "the run has no DP-SGD phase"))
        return
    assert cal is not None  # wanted
    last = len(plan.phases) - 1
    if at != [last]:
        problems.append(f"the scenario calibrates the intercept after DP-SGD: the plan must end with its calibration "
                        f"phase, and have only that one, found calibration phases at {at}")
        return
    phase = plan.phases[last]
    assert isinstance(phase, CalibrationPhase)  # found above
    close(f"phases[{last}] (calibration).parameters.share vs scenario", phase.params.share, cal.share)
    close(f"phases[{last}] (calibration).target_epsilon", phase.target_epsilon, cal.share * plan.run_epsilon)
    close(f"phases[{last}] (calibration).target_delta", phase.target_delta, cal.share * plan.run_delta)
    spent = part_spent(plan.phases)
    if spent > plan.run_epsilon * (1 + 1e-12):
        problems.append(f"the run's phases are planned to epsilon {spent!r} in all, more than the run budget "
                        f"{plan.run_epsilon!r}")


def _check_guarantees(plan: Plan, close: _Close, problems: list[str]) -> None:
    for i, p in enumerate(plan.phases):
        g = phase_guarantee(p, adjacency=plan.adjacency, unit=plan.unit, discretization=plan.scenario.discretization)
        if g.epsilon > p.target_epsilon * (1 + EPS_SLACK) or g.delta > p.target_delta * (1 + EPS_SLACK):
            problems.append(f"phases[{i}] ({p.name}): the recomputed guarantee ({g.epsilon:.6g}, {g.delta:.3g}) "
                            f"exceeds its target ({p.target_epsilon:.6g}, {p.target_delta:.3g})")
        close(f"phases[{i}] ({p.name}).guarantee.epsilon", p.guarantee.epsilon, g.epsilon)
        close(f"phases[{i}] ({p.name}).guarantee.delta", p.guarantee.delta, g.delta)
        close(f"phases[{i}] ({p.name}).guarantee.method", p.guarantee.method, g.method)
    basic = basic_total(plan.phases, plan.scenario, plan.unit)
    close("total.basic.epsilon", plan.total.epsilon, basic.epsilon)
    close("total.basic.delta", plan.total.delta, basic.delta)
    pld, _ = pld_total(plan.phases, plan.scenario, plan.unit, basic.delta)
    close("total.pld.epsilon", plan.total_pld.epsilon if plan.total_pld else None, pld.epsilon if pld else None)
    if _check_grid(plan, close, problems):
        return
    tuning = tuning_accounting(plan.scenario, plan.unit, plan.phases, basic, plan.delta)
    if (tuning is None) != (plan.tuning is None):
        close("tuning", plan.tuning, tuning)
    elif tuning is not None and plan.tuning is not None:
        close("tuning.guarantee.epsilon", plan.tuning.guarantee.epsilon,
              Guarantee.from_dict(tuning["guarantee"]).epsilon)


def _check_grid(plan: Plan, close: _Close, problems: list[str]) -> bool:
    """A declared grid: its configurations, each one's phases and guarantees, the selection, the total.

    Returns whether the plan's scenario declares a grid (then this was its tuning check).
    """
    t = plan.scenario.tuning
    stored = plan.tuning
    if t is None or not t.is_grid:
        if stored is not None and stored.is_grid:
            problems.append("tuning: the plan lists a grid of configurations that its scenario does not declare")
        return False
    if stored is None or stored.grid is None or stored.noisy_max is None:
        problems.append("tuning: the scenario declares a grid; the plan lists no configurations or no selection")
        return True
    runs = grid.runs_of(plan)  # read strictly when the plan was
    wanted = grid.configurations(t)
    if [c for c, _ in runs] != wanted:
        problems.append(f"tuning.grid: the plan lists {[c.label for c, _ in runs]}, the scenario's grid is "
                        f"{[c.label for c in wanted]}")
        return True
    assert t.selection_share is not None  # a grid Tuning has its defaults filled in
    eps_sel, eps_run, delta_run = grid.budgets(plan.epsilon, plan.delta, len(wanted), t.selection_share)
    close("run_budget.epsilon", plan.run_epsilon, eps_run)
    close("run_budget.delta", plan.run_delta, delta_run)
    if [phase_to_dict(p) for p in plan.phases] != [phase_to_dict(p) for p in stored.grid[0].phases]:
        problems.append("phases: a grid plan's phases must be its first configuration's")
    for c, phases in runs:
        _check_grid_configuration(plan, c, phases, eps_run, delta_run, close, problems)
    _check_grid_accounting(plan, stored, runs, close)
    return True


def _check_grid_configuration(plan: Plan, c: grid.Configuration, phases: tuple[Phase, ...], eps_run: float,
                              delta_run: float, close: _Close, problems: list[str]) -> None:
    """One configuration of a grid: each phase's parameters and guarantee, and all of them within the run budget."""
    for j, p in enumerate(phases):
        where = f"tuning.grid[{c.index}].phases[{j}] ({p.name})"
        _check_phase(plan, where, p, close, problems)
        g = phase_guarantee(p, adjacency=plan.adjacency, unit=plan.unit,
                            discretization=plan.scenario.discretization)
        if g.epsilon > p.target_epsilon * (1 + EPS_SLACK) or g.delta > p.target_delta * (1 + EPS_SLACK):
            problems.append(f"{where}: the recomputed guarantee ({g.epsilon:.6g}, {g.delta:.3g}) exceeds its "
                            f"target ({p.target_epsilon:.6g}, {p.target_delta:.3g})")
        close(f"{where}.guarantee.epsilon", p.guarantee.epsilon, g.epsilon)
        close(f"{where}.guarantee.delta", p.guarantee.delta, g.delta)
        if isinstance(p, DPSGDPhase) and plan.scenario.dpsgd is not None:
            close(f"{where}.parameters.clipping_norm vs the grid", p.params.clipping_norm,
                  c.clipping_norm if c.clipping_norm is not None else plan.scenario.dpsgd.clipping_norm)
    spent = (math.fsum(p.target_epsilon for p in phases), math.fsum(p.target_delta for p in phases))
    if spent[0] > eps_run * (1 + EPS_SLACK) or spent[1] > delta_run * (1 + EPS_SLACK):
        problems.append(f"tuning.grid[{c.index}]: its phases are planned to ({spent[0]:.6g}, {spent[1]:.3g}), "
                        f"above the run budget ({eps_run:.6g}, {delta_run:.3g})")


def _check_grid_accounting(plan: Plan, stored: TuningAccounting,
                           runs: list[tuple[grid.Configuration, tuple[Phase, ...]]], close: _Close) -> None:
    """The grid's tuning object re-accounted from its configurations: guarantee, selection, each one's total."""
    fresh = read_tuning("recomputed tuning", grid.accounting(plan.scenario, plan.unit,
                                                             [(c, list(ph)) for c, ph in runs], plan.delta))
    # both list their configurations and selection (the caller checked the stored one; the fresh one is a grid's)
    assert fresh is not None and fresh.grid is not None and fresh.noisy_max is not None
    assert stored.grid is not None and stored.noisy_max is not None
    for key in ("epsilon", "delta"):
        close(f"tuning.guarantee.{key}", getattr(stored.guarantee, key), getattr(fresh.guarantee, key))
    close("tuning.configurations", stored.configurations, fresh.configurations)
    for f in dataclasses.fields(NoisyMax):
        close(f"tuning.noisy_max.{f.name}", getattr(stored.noisy_max, f.name), getattr(fresh.noisy_max, f.name))
    for entry, again in zip(stored.grid, fresh.grid):
        for f in dataclasses.fields(GridEntry):
            if f.name not in ("phases", "total"):
                close(f"tuning.grid[{again.index}].{f.name}", getattr(entry, f.name), getattr(again, f.name))
        close(f"tuning.grid[{again.index}].total.epsilon", entry.total.epsilon, again.total.epsilon)


def _check_replan(plan: Plan, close: _Close, problems: list[str]) -> None:
    try:
        fresh = build_plan(plan.scenario)
    except BudgetplanError as exc:
        problems.append(f"re-planning the scenario failed: {exc}")
        return
    if len(fresh.phases) != len(plan.phases):
        problems.append(f"phases: the plan has {len(plan.phases)}, its scenario plans {len(fresh.phases)}")
        return
    for i, (a, b) in enumerate(zip(plan.phases, fresh.phases)):
        if type(a) is not type(b):
            problems.append(f"phases[{i}]: the plan has a {a.name} phase, its scenario plans {b.name}")
            continue
        mine, theirs = to_json_object(a.params), to_json_object(b.params)
        for key in sorted(set(mine) | set(theirs)):
            close(f"phases[{i}] ({a.name}).parameters.{key} vs its scenario", mine.get(key), theirs.get(key))
    _check_replan_grid(plan, fresh, close, problems)


def _check_replan_grid(plan: Plan, fresh: Plan, close: _Close, problems: list[str]) -> None:
    """Every configuration of a grid plans, from the scenario, to the parameters the plan lists."""
    mine, theirs = grid.runs_of(plan), grid.runs_of(fresh)
    if len(mine) != len(theirs):
        problems.append(f"tuning.grid: the plan has {len(mine)} configurations, its scenario plans {len(theirs)}")
        return
    for (c, a_phases), (_, b_phases) in zip(mine, theirs):
        if [type(p) for p in a_phases] != [type(p) for p in b_phases]:
            problems.append(f"tuning.grid[{c.index}]: the plan has phases {[p.name for p in a_phases]}, its "
                            f"scenario plans {[p.name for p in b_phases]}")
            continue
        for j, (a, b) in enumerate(zip(a_phases, b_phases)):
            pa, pb = to_json_object(a.params), to_json_object(b.params)
            for key in sorted(set(pa) | set(pb)):
                close(f"tuning.grid[{c.index}].phases[{j}] ({a.name}).parameters.{key} vs its scenario",
                      pa.get(key), pb.get(key))

