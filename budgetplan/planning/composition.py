"""What a plan's phases add up to: each phase's guarantee, their basic and PLD totals, and tuning's.

The planner states these and ``verify`` recomputes them, from the same functions.

Phases on disjoint parts of the units (a units split: ``UnitPart``) compose in parallel: a
unit's data reaches the phases of its own part and those on every unit, so the total is
the worst part's composition (``unit_parts``). Parts that may overlap, or that a plan marks
with different keys, are composed in sequence, as if there were no parts.
"""

from __future__ import annotations

__all__ = ["EPS_SLACK", "unit_parts", "part_spent", "phase_guarantee", "basic_total", "pld_total",
           "tuning_accounting", "run_mechanism", "joint_mechanism", "part_mechanisms", "plan_tradeoff"]

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from budgetplan.accounting import account
from budgetplan.accounting.guarantee import Guarantee
from budgetplan.accounting.tradeoff import ALPHAS, alpha_array, mechanism_tradeoff, tpr_from_pair
from budgetplan.errors import BudgetplanError, UnsupportedError
from budgetplan.mechanisms import (
    Composition,
    DiscreteLaplaceCount,
    Mechanism,
    RandomizedResponse,
    TruncatedPoissonDPSGD,
)
from budgetplan.plan.document import Plan
from budgetplan.plan.phases import CountPhase, Phase, RRPhase, UnitPart
from budgetplan.planning.tuning import REPEAT_AND_SELECT_REFERENCE, repeat_and_select_epsilon
from budgetplan.scenario import Scenario
from budgetplan.units import Adjacency, PrivacyUnit

EPS_SLACK = 1e-9  # relative: a guarantee within this of its target meets it (float rounding)


def _part(phase: Phase) -> UnitPart | None:
    return getattr(phase.params, "unit_part", None)


def unit_parts(phases: Sequence[Phase]) -> list[list[Phase]]:
    """The phases that one unit's data may reach, one list per part of a units split, in order.

    Without parts, or when two parts may share a unit, one list: every phase (sequential
    composition). Each list holds its part's phases and every phase on all units.
    """
    parts: list[UnitPart] = []
    for p in phases:
        part = _part(p)
        if part is not None and part not in parts:
            parts.append(part)
    if len(parts) < 2 or any(a.overlaps(b) for i, a in enumerate(parts) for b in parts[i + 1:]):
        return [list(phases)]
    return [[p for p in phases if _part(p) in (None, part)] for part in parts]


def part_spent(phases: Sequence[Phase]) -> float:
    """The run's phases' planned epsilon as one unit sees it: the largest sum over a part (count phases aside)."""
    return max(math.fsum(p.target_epsilon for p in part if not isinstance(p, CountPhase))
               for part in unit_parts(phases))


def _part_names(part: Sequence[Phase]) -> str:
    return ", ".join(p.name + (f" on units [{q.low:g}, {q.high:g})" if (q := _part(p)) is not None else "")
                     for p in part)


def phase_guarantee(phase: Phase, *, adjacency: Adjacency, unit: PrivacyUnit, discretization: float) -> Guarantee:
    """A phase's guarantee, recomputed from its mechanism and parameters alone."""
    if isinstance(phase, RRPhase) and phase.params.per_impression_epsilon_by_count is not None:
        shares = phase.params.per_impression_epsilon_by_count
        worst = max((account(RandomizedResponse(epsilon=e), delta=phase.target_delta, adjacency=adjacency,
                             unit=PrivacyUnit(name=unit.name, cap=i, capping=unit.capping if i > 1 else None),
                             method="exact") for i, e in enumerate(shares, 1)), key=lambda g: g.epsilon)
        return replace(worst, unit=unit).with_notes(
            f"eps/K_i: a unit with K_i <= {unit.cap} examples spends {phase.target_epsilon:g}/K_i per example")
    return account(phase.mechanism, delta=phase.target_delta, adjacency=adjacency, unit=unit,
                   method=phase.method, unit_accounting=phase.unit_accounting, discretization=discretization)


def counted_per_example(phase: Phase) -> bool:
    """Whether a phase spends eps/K_i per example (its guarantee is a maximum over K_i)."""
    return isinstance(phase, RRPhase) and phase.params.per_impression_rule == "eps/K_i"


def basic_total(phases: Sequence[Phase], s: Scenario, unit: PrivacyUnit) -> Guarantee:
    parts = unit_parts(phases)
    if len(parts) > 1:  # parallel: (the largest part's epsilon, the largest part's delta)
        sums = [(math.fsum(p.guarantee.epsilon for p in part), math.fsum(p.guarantee.delta for p in part))
                for part in parts]
        return Guarantee(
            epsilon=max(e for e, _ in sums), delta=max(d for _, d in sums), method="parallel-composition",
            adjacency=s.adjacency, unit=unit,
            notes=("a unit's data reaches one part of the units split: the largest of the parts' sums of phase "
                   "guarantees: " + "; ".join(f"{_part_names(part)} ({e:.6g}, {d:.3g})"
                                               for part, (e, d) in zip(parts, sums)),))
    if len(phases) == 1:
        return phases[0].guarantee
    return Guarantee(
        epsilon=math.fsum(p.guarantee.epsilon for p in phases),
        delta=math.fsum(p.guarantee.delta for p in phases), method="basic-composition",
        adjacency=s.adjacency, unit=unit,
        notes=(f"sum of {len(phases)} phase guarantee(s): " + ", ".join(
            f"{p.name} ({p.guarantee.epsilon:.6g}, {p.guarantee.delta:.3g})" for p in phases),))


def pld_total(phases: Sequence[Phase], s: Scenario, unit: PrivacyUnit,
              delta: float) -> tuple[Guarantee | None, str | None]:
    parts = unit_parts(phases)
    if len(parts) > 1:  # parallel: the PLD composition of each part at delta, the largest epsilon
        totals = []
        for part in parts:
            g, note = (_pld_composed(part, s, unit, delta) if len(part) > 1
                       else (_pld_one(part[0], s, unit, delta), None))
            if g is None:
                return None, f"{_part_names(part)}: {note or 'no PLD for this mechanism'}"
            totals.append((g, part))
        g, part = max(totals, key=lambda gp: gp[0].epsilon)
        return g.with_notes(f"parallel composition over the units split: its largest part, {_part_names(part)}, "
                            "composed by PLD"), None
    return _pld_composed(phases, s, unit, delta)


def _pld_one(phase: Phase, s: Scenario, unit: PrivacyUnit, delta: float) -> Guarantee | None:
    try:
        return account(phase.mechanism, delta=delta, adjacency=s.adjacency, unit=unit, method="pld",
                       discretization=s.discretization)
    except UnsupportedError:
        return None


def _pld_composed(phases: Sequence[Phase], s: Scenario, unit: PrivacyUnit,
                  delta: float) -> tuple[Guarantee | None, str | None]:
    if len(phases) < 2:
        return None, "one phase: the total is that phase's guarantee"
    if any(isinstance(p.mechanism, TruncatedPoissonDPSGD) for p in phases):
        return None, "truncated-Poisson phases are composed by basic composition only"
    if any(p.unit_accounting == "group" for p in phases):
        return None, "group-privacy phases are composed by basic composition only"
    if any(counted_per_example(p) for p in phases):
        return None, "eps/K_i phases are composed by basic composition only"
    try:
        g = account(Composition(phases=tuple(p.mechanism for p in phases)), delta=delta, adjacency=s.adjacency,
                    unit=unit, method="pld", discretization=s.discretization)
    except UnsupportedError as exc:
        return None, f"no PLD composition: {exc}"
    return g, None


def tuning_accounting(s: Scenario, unit: PrivacyUnit, phases: Sequence[Phase], total: Guarantee,
                      delta: float) -> dict[str, Any] | None:
    t = s.tuning
    if t is None:
        return None
    n = t.configurations
    if t.selection == "naive":
        g = Guarantee(epsilon=n * total.epsilon, delta=min(1.0, n * total.delta), method="naive-composition",
                      adjacency=s.adjacency, unit=unit,
                      notes=(f"{n} runs of ({total.epsilon:.6g}, {total.delta:.3g}) composed by basic composition",))
        out: dict[str, Any] = {"configurations": n, "selection": "naive", "distribution": None,
                               "guarantee": g.to_dict(), "pld_guarantee": None}
        if all(p.unit_accounting == "tight" and not isinstance(p.mechanism, TruncatedPoissonDPSGD) for p in phases) \
                and not any(counted_per_example(p) for p in phases):
            run = Composition(phases=tuple(p.mechanism for p in phases) * n)
            try:
                pld = account(run, delta=delta, adjacency=s.adjacency, unit=unit, method="pld",
                              discretization=s.discretization)
                out["pld_guarantee"] = pld.with_notes(f"{n}-fold PLD composition of the run").to_dict()
            except BudgetplanError:
                pass
        return out
    if any(isinstance(p, (RRPhase, CountPhase)) for p in phases) and len(phases) > 1:
        raise UnsupportedError("repeat-and-select accounting covers runs of DP-SGD and Gaussian releases, or RR "
                               "alone; use [tuning].selection = \"naive\" for hybrid")
    eps = repeat_and_select_epsilon(run_mechanism(phases), adjacency=s.adjacency, unit=unit, delta=delta, mean=n,
                                    distribution=t.distribution)
    g = Guarantee(epsilon=eps, delta=delta, method="repeat-and-select(rdp)", adjacency=s.adjacency, unit=unit,
                  notes=(f"the number of runs is drawn from a {t.distribution} distribution with mean {n}; only "
                         "the best run's output is released", REPEAT_AND_SELECT_REFERENCE))
    return {"configurations": n, "selection": "repeat-and-select", "distribution": t.distribution,
            "guarantee": g.to_dict(), "pld_guarantee": None}


def run_mechanism(phases: Sequence[Phase]) -> Mechanism:
    """What one run releases: its one phase's mechanism, or their composition (DP-SGD and its calibration)."""
    return phases[0].mechanism if len(phases) == 1 else Composition(phases=tuple(p.mechanism for p in phases))


def joint_mechanism(plan: Plan) -> Mechanism | None:
    """The mechanism of all of ``plan``'s phases composed, where their composition has a PLD here; else None.

    None where the phases compose only by basic composition: group privacy, eps/K_i, a
    truncated Poisson phase, a DP count, a tuning grid; and for a units split, whose parts
    each have their own (``part_mechanisms``).
    """
    if len(unit_parts(plan.phases)) > 1:
        return None
    return _composed(plan, plan.phases)


def part_mechanisms(plan: Plan) -> list[Mechanism] | None:
    """Each part's phases composed, for a units split whose parts all have a PLD here; else None."""
    parts = unit_parts(plan.phases)
    if len(parts) < 2:
        return None
    mechs = [_composed(plan, part) for part in parts]
    return None if any(m is None for m in mechs) else [m for m in mechs if m is not None]


def _composed(plan: Plan, phases: Sequence[Phase]) -> Mechanism | None:
    if (plan.tuning is not None or not all(p.unit_accounting == "tight" for p in phases)
            or any(isinstance(p.mechanism, (TruncatedPoissonDPSGD, DiscreteLaplaceCount)) for p in phases)
            or any(getattr(p.params, "per_impression_rule", None) == "eps/K_i" for p in phases)):
        return None
    return phases[0].mechanism if len(phases) == 1 else Composition(phases=tuple(p.mechanism for p in phases))


def plan_tradeoff(plan: Plan, alphas: Sequence[float] = ALPHAS) -> dict[str, Any]:
    """The attacker's best TPR at each false-positive rate in ``alphas`` under ``plan``'s guarantee.

    Returns:
        {"alphas": [...], "tpr": [...], "from": "pld" | "epsilon-delta", "note": ...}.
    """
    a = [float(x) for x in alpha_array(alphas)]
    g = plan.guarantee
    parts = part_mechanisms(plan)
    if parts is not None:  # a unit is in one part: the attacker's best is the worst part's, at each FPR
        try:
            curves = [mechanism_tradeoff(m, adjacency=plan.adjacency, unit=plan.unit,
                                         discretization=plan.scenario.discretization, alphas=a) for m in parts]
            return {"alphas": a, "tpr": [max(c[i] for c in curves) for i in range(len(a))], "from": "pld",
                    "note": "from the PLD of each part of the units split's phases composed, the largest TPR "
                            "over the parts at each FPR: delta(eps) for every eps"}
        except UnsupportedError:
            pass
    mech = joint_mechanism(plan)
    if mech is not None:
        try:
            tpr = mechanism_tradeoff(mech, adjacency=plan.adjacency, unit=plan.unit,
                                     discretization=plan.scenario.discretization, alphas=a)
            return {"alphas": a, "tpr": tpr, "from": "pld",
                    "note": "from the PLD of all phases composed: delta(eps) for every eps"}
        except UnsupportedError:
            pass
    return {"alphas": a, "tpr": tpr_from_pair(g.epsilon, g.delta, a), "from": "epsilon-delta",
            "note": f"from the one guarantee ({g.epsilon:.6g}, {g.delta:.3g}): the phases have no joint PLD here"}
