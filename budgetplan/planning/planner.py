"""Scenario -> Plan: split the budget, calibrate each phase, account the whole.

A scenario whose N is a DP count (``[data].size_release_epsilon``) gets a first ``count``
phase accounting that release, and its training phases are planned to what is left. A run
with a DP-SGD phase and ``[calibration]`` ends with a ``calibration`` phase, the Gaussian
release the intercept shift is solved from (``budgetplan.intercept``): it takes its share
of the run's epsilon and delta, and the training phases are planned to the rest.

Each phase is planned to its share of the run budget at the plan's unit and adjacency;
the phases' guarantees are then composed (basic, and PLD where the adjacencies agree),
tuning is accounted if declared, and for units capped at K > 1 the alternatives to the
chosen way of bounding a unit are costed side by side. ``phase_guarantee`` recomputes a
phase's guarantee from its stored parameters alone; ``budgetplan.audit.verify`` uses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from budgetplan import dpcount, intercept, limits
from budgetplan.accounting import account, batch_selection
from budgetplan.accounting import gaussian as gauss
from budgetplan.accounting import rr as rr_math
from budgetplan.accounting.group import group_privacy
from budgetplan.accounting.guarantee import Guarantee
from budgetplan.errors import BudgetplanError, InfeasibleError, InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    DiscreteLaplaceCount,
    GaussianRelease,
    PoissonDPSGD,
    RandomizedResponse,
    ShuffledDPSGD,
    TruncatedPoissonDPSGD,
    UnitPoissonDPSGD,
)
from budgetplan.plan import Plan, current_versions
from budgetplan.plan.parts import unit_alternatives
from budgetplan.plan.phases import (
    CalibrationParams,
    CalibrationPhase,
    CountParams,
    CountPhase,
    DPSGDParams,
    DPSGDPhase,
    Phase,
    PhaseBase,
    RRParams,
    RRPhase,
    UnitPart,
    WALRParams,
    WALRPhase,
)
from budgetplan.plan.tuning import read_tuning
from budgetplan.planning import calibrate, grid
from budgetplan.planning.composition import (
    EPS_SLACK,
    basic_total,
    phase_guarantee,
    pld_total,
    run_mechanism,
    tuning_accounting,
)
from budgetplan.planning.shares import calibration_released, rest_of, split_of, split_record, training_epsilon
from budgetplan.planning.tuning import repeat_and_select_epsilon
from budgetplan.scenario.model import Scenario
from budgetplan.scenario.model import register_algorithm as register_scenario_algorithm
from budgetplan.scenario.split_rules import units_share
from budgetplan.units import PrivacyUnit

__all__ = ["build_plan", "resolve_composition", "unit_of", "register_algorithm", "pending_guarantee", "with_guarantee",
           "TrainingPlanner"]

_DPSGDMechanism: TypeAlias = PoissonDPSGD | UnitPoissonDPSGD | TruncatedPoissonDPSGD | AllocationDPSGD | ShuffledDPSGD


class _EpsOf(Protocol):
    """A DP-SGD phase's epsilon at noise ``sigma`` over ``t`` steps (its planned steps by default)."""

    def __call__(self, sigma: float, t: int = ...) -> float: ...


def unit_of(s: Scenario) -> PrivacyUnit:
    return PrivacyUnit(name=s.unit_name, cap=s.cap, capping=s.capping if s.cap > 1 else None)


def build_plan(scenario: Scenario) -> Plan:
    """Plan ``scenario``; raises InfeasibleError naming the knob when nothing meets the budget.

    The plan's scenario is ``scenario`` with ``[accounting].composition = "auto"`` resolved
    (as :func:`resolve_composition` does): a plan always says how its phases met the budget.
    """
    s = scenario
    if s.composition == "auto" and not _may_compose(s):
        s = replace(s, composition="basic")
    delta = s.resolved_delta
    unit = unit_of(s)
    if s.size_release_epsilon is not None:
        count = _count_phase(s, unit)
        run_eps, run_delta = rest_of(s.epsilon, count.guarantee.epsilon), delta
        phases = [count, *_plan_phases(s, unit, run_eps, run_delta, delta)]
    elif s.tuning is not None and s.tuning.is_grid:
        runs, run_eps, run_delta = _grid_runs(s, unit, delta)
        phases = list(runs[0][1])
    elif s.tuning is not None and s.tuning.selection == "naive":
        n = s.tuning.configurations
        run_eps, run_delta = s.epsilon / n, delta / n
        phases = _plan_phases(s, unit, run_eps, run_delta, delta)
    elif s.tuning is not None:
        phases = _repeat_and_select_run(s, unit, delta)
        run_eps = math.fsum(p.target_epsilon for p in phases)
        run_delta = math.fsum(p.target_delta for p in phases)
    elif s.composition != "basic":  # "pld", or "auto" resolved by whether the phases compose by PLD
        run_delta = delta
        run_eps, phases, composed = _pld_budget_run(s, unit, delta)
        if s.composition == "auto":
            s = replace(s, composition="pld" if composed else "basic")
    else:
        run_eps, run_delta = s.epsilon, delta
        phases = _plan_phases(s, unit, run_eps, run_delta, delta)
    total = basic_total(phases, s, unit)
    total_pld, pld_note = pld_total(phases, s, unit, total.delta)
    if s.tuning is not None and s.tuning.is_grid:
        tuning: dict[str, Any] | None = grid.accounting(s, unit, runs, delta)
    else:
        tuning = tuning_accounting(s, unit, phases, total, delta)
    alternatives = _unit_alternatives(s, unit, phases)
    return Plan(split=split_record(s, run_eps),
        scenario=s, epsilon=s.epsilon, delta=delta, adjacency=s.adjacency, unit=unit, dataset_size=s.dataset_size,
        run_epsilon=run_eps, run_delta=run_delta, phases=tuple(phases), total=total, total_pld=total_pld,
        total_pld_note=pld_note, tuning=read_tuning("tuning", tuning),
        unit_alternatives=unit_alternatives("unit_alternatives", alternatives),
        warnings=s.warnings, versions=current_versions(),
    )


def _grid_runs(s: Scenario, unit: PrivacyUnit,
               delta: float) -> tuple[list[tuple[grid.Configuration, list[Phase]]], float, float]:
    """Every configuration of the declared grid planned to the per-run budget (``budgetplan.planning.grid``)."""
    t = s.tuning
    assert t is not None and t.selection_share is not None  # a grid Tuning has its defaults filled in
    _, run_eps, run_delta = grid.budgets(s.epsilon, delta, t.configurations, t.selection_share)
    runs: list[tuple[grid.Configuration, list[Phase]]] = []
    for c in grid.configurations(t):
        try:
            phases = _plan_phases(grid.configured(s, c), unit, run_eps, run_delta, delta)
        except BudgetplanError as exc:
            exc.args = (f"[tuning] configuration {c.label} at the run budget epsilon {run_eps:.6g}: {exc}",)
            raise
        runs.append((c, phases))
    return runs, run_eps, run_delta


# ----------------------------------------------------------------------- phases


def _plan_phases(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float) -> list[Phase]:
    """The run's phases: the training phases, then the calibration release when the run needs one."""
    if not calibration_released(s, run_eps):
        return _training_phases(s, unit, run_eps, run_delta, delta)
    assert s.calibration is not None  # released only when calibrated
    share = s.calibration.share
    cal_eps, cal_delta = share * run_eps, share * run_delta
    train_eps, train_delta = training_epsilon(s, run_eps), rest_of(run_delta, cal_delta)
    if s.algorithm == "hybrid" and s.split is not None and units_share(s.split) is None:
        try:
            split_of(s, train_eps)
        except InvalidParameterError:
            raise InvalidParameterError(
                f"[algorithm].split = {s.split!r} leaves the DP-SGD phase nothing once [calibration] takes its share "
                f"{share:g} of the run's epsilon {run_eps:g}: lower eps1 or [calibration].share") from None
    phases = _training_phases(s, unit, train_eps, train_delta, delta)
    # the RR labels' debiased count joins the target when they cover every unit (not a units split's part)
    return [*phases, _calibration_phase(s, unit, cal_eps, cal_delta,
                                        rr=any(isinstance(p, RRPhase) and p.params.unit_part is None
                                               for p in phases))]


# (scenario, unit, the training phases' epsilon and delta, the plan's delta) -> the training phases
TrainingPlanner: TypeAlias = Callable[[Scenario, PrivacyUnit, float, float, float], list[Phase]]
_PLANNERS: dict[str, TrainingPlanner] = {}


def register_algorithm(name: str, planner: TrainingPlanner) -> None:
    """Plan scenarios of ``[algorithm].name = name`` with ``planner``: a new algorithm and its phase kinds.

    ``planner(scenario, unit, eps, delta, plan_delta)`` returns the run's training phases,
    each within (eps, delta) together and each with its guarantee (``pending_guarantee``,
    then ``with_guarantee``). The DP count of N, tuning, the unit alternatives and the totals
    are the planner's, whatever the algorithm. The scenario accepts the name from here on.
    """
    register_scenario_algorithm(name)
    _PLANNERS[name] = planner


def _training_phases(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float,
                     delta: float) -> list[Phase]:
    return _PLANNERS[s.algorithm](s, unit, run_eps, run_delta, delta)


def _plan_rr(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float) -> list[Phase]:
    return [_rr_phase(s, unit, run_eps, run_delta,
                      model="non-sensitive features only (RR protects labels, not features)")]


def _plan_walr(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float) -> list[Phase]:
    return [_walr_phase(s, unit, run_eps, run_delta, delta)]


def _plan_dpsgd(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float) -> list[Phase]:
    return [_dpsgd_phase(s, unit, run_eps, run_delta, delta)]


def _plan_hybrid(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float) -> list[Phase]:
    assert s.split is not None  # a hybrid Scenario always has its split rule
    share = units_share(s.split)
    if share is not None:
        return _plan_units_split(s, unit, run_eps, run_delta, delta, share)
    choice = split_of(s, run_eps)
    eps1, eps2 = choice.epsilon1, choice.epsilon2
    if eps2 > 0 and run_delta == 0:
        raise InvalidParameterError(f"[budget].delta must be > 0: split {s.split!r} gives the DP-SGD phase "
                                    f"epsilon {eps2:g}, and DP-SGD is not pure DP")
    phases: list[Phase] = []
    if eps1 > 0:
        phases.append(_rr_phase(s, unit, eps1, 0.0,
                                model="the truncated model (non-sensitive tower, sensitive input zeroed)"))
    if eps2 > 0:
        phases.append(_dpsgd_phase(s, unit, eps2, run_delta, delta, warm_start=bool(phases)))
    return phases


def _plan_units_split(s: Scenario, unit: PrivacyUnit, run_eps: float, run_delta: float, delta: float,
                      share: float) -> list[Phase]:
    """RR on the units in [0, share) of the hash, DP-SGD (from the RR model) on the rest, each at the whole budget.

    A unit's data reaches one of the two phases, so they compose in parallel
    (``composition.unit_parts``); the DP-SGD phase's q and steps are those of its part's
    expected rows. Warm-starting DP-SGD from the RR model is post-processing for the units
    DP-SGD trains on, whose data the RR model never saw.
    """
    if run_delta == 0:
        raise InvalidParameterError(f"[budget].delta must be > 0: split {s.split!r} gives the DP-SGD phase "
                                    f"epsilon {run_eps:g}, and DP-SGD is not pure DP")
    rr_part, sgd_part = UnitPart.halves(s.dataset_size, share)
    rr = _rr_phase(s, unit, run_eps, 0.0, model="the truncated model (non-sensitive tower, sensitive input zeroed)",
                   part=rr_part)
    sgd = _dpsgd_phase(s, unit, run_eps, run_delta, delta, warm_start=True, part=sgd_part)
    return [rr, sgd]


_PLANNERS.update(rr=_plan_rr, walr=_plan_walr, dpsgd=_plan_dpsgd, hybrid=_plan_hybrid)


def _count_phase(s: Scenario, unit: PrivacyUnit) -> CountPhase:
    """The DP count of N that the scenario's dataset_size is; refuses what would need the exact N."""
    if s.tuning is not None:
        raise UnsupportedError("[tuning] with [data].size_release_epsilon is not supported: the count is released "
                               "once while the tuning accounting composes whole runs; drop one of them")
    if s.dpsgd is not None and s.dpsgd.sampling == "truncated-poisson":
        raise UnsupportedError("[data].size_release_epsilon needs sampling = \"poisson\": the truncated-Poisson "
                               "accounting depends on the exact N, which a DP count does not give")
    eps, k = s.size_release_epsilon, unit.cap
    assert eps is not None  # the planner makes a count phase only for such scenarios
    params = CountParams(
        epsilon=eps, sensitivity=k, noise_std=dpcount.noise_std(epsilon=eps, sensitivity=k),
        dataset_size=s.dataset_size, cap=k, capping=unit.capping,
        released="once, before planning (budgetplan data count --dp-epsilon): the row count after capping plus "
                 "discrete Laplace noise, drawn from the operating system's CSPRNG")
    phase = CountPhase(mechanism=DiscreteLaplaceCount(epsilon=eps, sensitivity=k), target_epsilon=eps,
                       target_delta=0.0, method="exact", unit_accounting="tight", params=params,
                       guarantee=pending_guarantee(s, unit))
    return with_guarantee(phase, s, unit)


def _repeat_and_select_run(s: Scenario, unit: PrivacyUnit, delta: float) -> list[Phase]:
    """The run, planned to the largest budget whose repeat-and-select total meets the budget."""
    if s.algorithm == "hybrid":
        raise UnsupportedError("repeat-and-select accounting covers single-phase runs; use [tuning].selection = "
                               "\"naive\" for hybrid")
    if s.dpsgd is not None and s.algorithm == "dpsgd" and s.dpsgd.noise_multiplier is not None:
        raise UnsupportedError("repeat-and-select tuning calibrates the noise: drop [dpsgd].noise_multiplier")
    t = s.tuning
    assert t is not None  # only called for declared tuning
    runs: dict[float, list[Phase]] = {}

    def total_at(inverse_budget: float) -> float:
        budget = 1.0 / inverse_budget
        runs[inverse_budget] = phases = _plan_phases(s, unit, budget, delta, delta)
        return repeat_and_select_epsilon(run_mechanism(phases), adjacency=s.adjacency, unit=unit, delta=delta,
                                         mean=t.configurations, distribution=t.distribution)

    # the tuned total grows with the run budget: search 1/budget, smallest that meets it
    try:
        best, _, _ = calibrate.solve_decreasing(total_at, s.epsilon, t.configurations / s.epsilon, step=0.5,
                                                 lo_limit=1.0 / s.epsilon, hi_limit=1e6 / s.epsilon, rel_tol=1e-3)
    except InfeasibleError:
        raise InfeasibleError(
            f"no run budget down to epsilon {s.epsilon * 1e-6:g} keeps {t.configurations} repeat-and-select "
            f"runs within epsilon {s.epsilon:g}: lower [tuning].configurations", knob="configurations") from None
    return runs[best] if best in runs else _plan_phases(s, unit, 1.0 / best, delta, delta)


def resolve_composition(s: Scenario) -> Scenario:
    """``s`` with ``[accounting].composition = "auto"`` made "pld" or "basic", as :func:`build_plan`
    resolves it; any other as it is.

    "pld" where the run's phases at the budget compose by PLD here: more than one phase, none
    of them group privacy at K > 1, ``eps/K_i`` or truncated Poisson (``pld_total``), no
    ``[tuning]`` (which composes whole runs itself) and no DP count of N (released before the
    plan). Else "basic": one phase has nothing to compose, and the rest compose by basic
    composition only. The phases at epsilon are planned to find out.
    """
    if s.composition != "auto":
        return s
    if not _may_compose(s):
        return replace(s, composition="basic")
    delta, unit = s.resolved_delta, unit_of(s)
    total, _ = _pld_of(_plan_phases(s, unit, s.epsilon, delta, delta), s, unit)
    return replace(s, composition="basic" if total is None else "pld")


def _may_compose(s: Scenario) -> bool:
    """Whether a PLD budget can apply at all: not under [tuning] or a DP count of N (``_check_composition``)."""
    return s.tuning is None and s.size_release_epsilon is None


def _pld_of(phases: list[Phase], s: Scenario, unit: PrivacyUnit) -> tuple[Guarantee | None, str | None]:
    """The phases' PLD total at their summed delta (as build_plan states it), or None and why; None for one phase."""
    if len(phases) < 2:
        return None, "one phase: nothing to compose"
    return pld_total(phases, s, unit, basic_total(phases, s, unit).delta)


def _pld_budget_run(s: Scenario, unit: PrivacyUnit, delta: float) -> tuple[float, list[Phase], bool]:
    """``[accounting].composition = "pld"`` (or "auto"): the run planned to the largest basic budget
    whose PLD total meets it; and whether it was (False: the basic plan at epsilon).

    The phases share the run's epsilon as under basic composition (split rule, calibration
    share), but of a larger run epsilon E' >= epsilon: the largest (to a relative 1e-4) whose
    phases, composed by PLD at the budget's delta, are within the budget's epsilon. Every
    phase gets its share of E', so each draws less noise than at a basic total of epsilon,
    and the headline guarantee is the PLD total. One phase has nothing to compose: E' =
    epsilon. Phases without a PLD composition here are refused with the reason under "pld",
    and planned by basic composition under "auto".
    """
    phases = _plan_phases(s, unit, s.epsilon, delta, delta)
    first, note = _pld_of(phases, s, unit)
    if first is None:
        if len(phases) < 2 or s.composition == "auto":
            return s.epsilon, phases, False
        raise UnsupportedError(f'[accounting].composition = "pld" needs phases that compose by PLD: {note}; '
                               'use composition = "basic"')
    # 1/E' -> (its phases, their PLD total)
    runs: dict[float, tuple[list[Phase], float]] = {}

    def pld_at(inverse_budget: float) -> float:
        if inverse_budget not in runs:
            run = _plan_phases(s, unit, 1.0 / inverse_budget, delta, delta)
            g, _ = _pld_of(run, s, unit)
            assert g is not None  # the same phase kinds as at epsilon, which had one
            runs[inverse_budget] = run, g.epsilon
        return runs[inverse_budget][1]

    start = math.exp(math.log(1.0 / s.epsilon))  # the solver's first point, exactly as it will evaluate it
    runs[start] = phases, first.epsilon
    # the PLD total grows with the run budget: search 1/E', the smallest that meets epsilon; the
    # PLD total of phases at E' is at least their largest epsilon, E' / len(phases) or more
    try:
        best, _, _ = calibrate.solve_decreasing(pld_at, s.epsilon, 1.0 / s.epsilon, step=0.05,
                                                 lo_limit=1.0 / (len(phases) * s.epsilon), hi_limit=4.0 / s.epsilon,
                                                 rel_tol=1e-4)
    except InfeasibleError:
        raise InfeasibleError(f"no run budget down to epsilon {s.epsilon / 4:g} has a PLD total within epsilon "
                              f"{s.epsilon:g}", knob="epsilon") from None
    return 1.0 / best, runs[best][0], True


def _round_down_share(total: float, k: int) -> float:
    """total / k, stepped down until k copies never exceed total in floating point."""
    e = total / k
    while k * e > total:
        e = math.nextafter(e, 0.0)
    return e


def _rr_phase(s: Scenario, unit: PrivacyUnit, eps: float, delta: float, *, model: str,
              part: UnitPart | None = None) -> Phase:
    shape = s.rr
    assert shape is not None  # a Scenario of an RR algorithm always has its [rr] shape
    k, rule = unit.cap, shape.per_impression
    if rule == "tight" and delta == 0:
        rule_used = "eps/K"  # a pure phase has no delta to trade: tight is the even split
    else:
        rule_used = rule
    if rule_used == "tight":
        per = calibrate.rr_per_example_epsilon(epsilon=eps, cap=k, delta=delta)["tight"]
    else:
        per = _round_down_share(eps, k)
    shares = tuple(_round_down_share(eps, i) for i in range(1, k + 1)) if rule_used == "eps/K_i" else None
    params = RRParams(
        per_impression_rule=rule_used, unit_epsilon=eps, per_impression_epsilon=per,
        flip_probability=rr_math.flip_probability(per), cap=k, capping=unit.capping,
        epochs=shape.epochs, batch_size=shape.batch_size, dataset_size=s.dataset_size if part is None else part.rows,
        labels_randomised="once per example, before training; all epochs reuse them", model=model, unit_part=part,
        per_impression_epsilon_by_count=shares,
        flip_probability_by_count=tuple(rr_math.flip_probability(e) for e in shares) if shares else None,
        validation_fraction=shape.validation_fraction)
    phase = RRPhase(mechanism=RandomizedResponse(epsilon=per), target_epsilon=eps, target_delta=delta,
                    method="exact", unit_accounting="tight", params=params, guarantee=pending_guarantee(s, unit))
    return with_guarantee(phase, s, unit)


def _gaussian_noise(s: Scenario, unit: PrivacyUnit, sens: float, eps: float, delta: float) -> float:
    """The noise std of one Gaussian release of per-example sensitivity ``sens`` at (eps, delta) for the unit."""
    exact = gauss.analytic_sigma(epsilon=eps, delta=delta, sensitivity=sens * unit.cap)
    if s.unit_accounting == "group" and unit.cap > 1:
        return _solve_noise(lambda x: account(GaussianRelease(noise_std=x, sensitivity=sens), delta=delta,
                                              adjacency=s.adjacency, unit=unit, method="exact",
                                              unit_accounting="group").epsilon, eps, exact)
    return exact


def _calibration_phase(s: Scenario, unit: PrivacyUnit, eps: float, delta: float, *, rr: bool) -> Phase:
    """The intercept calibration's release: m + 1 coordinates, each moved at most 1 by an example."""
    assert s.calibration is not None  # planned only for calibrated scenarios
    sens = intercept.sensitivity()
    sigma = _gaussian_noise(s, unit, sens, eps, delta)
    params = CalibrationParams(
        shifts=intercept.SHIFTS, coordinates=intercept.coordinates(), sensitivity=sens,
        unit_sensitivity=sens * unit.cap, noise_std=sigma, share=s.calibration.share, dataset_size=s.dataset_size,
        cap=unit.cap, capping=unit.capping, target="positives and rr labels" if rr else "positives",
        model="the trained full model: every logit is shifted by the same d (its intercept), the ranking kept",
        release="once, after training, over every training row: sum_i sigmoid(z_i + d) for each shift d of the "
                "grid and the count of positives sum_i y_i; one row moves each coordinate by at most 1 (a non-finite "
                "logit counts as 1/2)")
    phase = CalibrationPhase(mechanism=GaussianRelease(noise_std=sigma, sensitivity=sens), target_epsilon=eps,
                             target_delta=delta, method="exact",
                             unit_accounting=s.unit_accounting if unit.cap > 1 else "tight", params=params,
                             guarantee=pending_guarantee(s, unit))
    return with_guarantee(phase, s, unit)


def _walr_phase(s: Scenario, unit: PrivacyUnit, eps: float, delta: float, total_delta: float) -> Phase:
    w = s.walr
    assert w is not None  # a WALR Scenario always has its [walr] shape
    bound = s.walr_row_norm_bound
    sens = w.weights_bound * bound
    one_hot = w.encoding == "one-hot"
    sigma = _gaussian_noise(s, unit, sens, eps, delta)
    classical = gauss.classical_sigma(epsilon=eps, delta=delta, sensitivity=sens * unit.cap)
    params = WALRParams(
        noise_std=sigma, sensitivity=sens, unit_sensitivity=sens * unit.cap,
        features=None if one_hot else w.features, encoding="one-hot" if one_hot else None,
        row_norm_bound=bound, weights_bound=w.weights_bound, dataset_size=s.dataset_size,
        cap=unit.cap, capping=unit.capping,
        release=("sum_i y_i w_i x_i once, x_i the row's categoricals one-hot and numerics scaled into [0, 1] by a "
                 "transform fitted on the features, with an intercept, each column weighted from the features' "
                 "counts (the weights' squares summing to row_norm_bound squared), every row (norm at most "
                 "row_norm_bound) "
                 "clipped to it all the same, weights clipped to weights_bound; gradient steps after it are free "
                 "(post-processing)" if one_hot else
                 "sum_i y_i w_i x_i once, every row (intercept included) clipped to row_norm_bound, "
                 "weights clipped to weights_bound; gradient steps after it are free (post-processing)"),
        classical_noise_std=classical, classical_valid=eps < gauss.CLASSICAL_VALID_BELOW)
    phase = WALRPhase(mechanism=GaussianRelease(noise_std=sigma, sensitivity=sens), target_epsilon=eps,
                      target_delta=delta, method="exact",
                      unit_accounting=s.unit_accounting if unit.cap > 1 else "tight",
                      params=params, guarantee=pending_guarantee(s, unit))
    return with_guarantee(phase, s, unit)


def _dpsgd_phase(s: Scenario, unit: PrivacyUnit, eps: float, delta: float, total_delta: float, *,
                 warm_start: bool = False, part: UnitPart | None = None) -> Phase:
    d = s.dpsgd
    assert d is not None  # a DP-SGD or Hybrid Scenario always has its [dpsgd] shape
    by_unit = d.sample_by == "unit"
    # Sampling units: the M units are the population each batch is drawn from (Scenario checks M);
    # on a part of the units, that part's expected rows (Scenario allows Poisson over examples only).
    n = s.units if by_unit else s.dataset_size if part is None else part.rows
    assert n is not None
    q = d.batch_size / n
    epochs: float
    if d.sampling in batch_selection.EPOCH_SAMPLINGS:
        steps, whole = batch_selection.epoch_steps(dataset_size=n, batch_size=d.batch_size, epochs=d.epochs,
                                                   steps=d.steps, names=("[dpsgd].epochs", "[dpsgd].steps"))
        epochs = float(whole)
    elif d.steps is not None:
        steps = d.steps
        epochs = steps * d.batch_size / n
    else:
        assert d.epochs is not None  # a DPSGDShape has exactly one of steps and epochs
        steps = calibrate.steps_for_epochs(epochs=d.epochs, dataset_size=n, batch_size=d.batch_size)
        epochs = d.epochs
    # a unit-sampled run clips whole units: nothing for group privacy to add
    unit_accounting = s.unit_accounting if unit.cap > 1 and not by_unit else "tight"
    method = batch_selection.method_for(d.sampling, s.method)

    def mech(sigma: float, t: int = steps) -> _DPSGDMechanism:
        return batch_selection.mechanism(d.sampling, sigma, dataset_size=n if part else s.dataset_size,
                                         batch_size=d.batch_size,
                                         steps=t, max_batch_size=d.max_batch_size, units=s.units if by_unit else None)

    def eps_of(sigma: float, t: int = steps) -> float:
        return account(mech(sigma, t), delta=delta, adjacency=s.adjacency, unit=unit, method=method,
                       unit_accounting=unit_accounting, discretization=s.discretization).epsilon

    epoch_eps = eps_of if d.sampling in batch_selection.EPOCH_SAMPLINGS else None
    # a unit-sampled run is searched as example-level DP-SGD over units: the same numbers
    acc_unit = PrivacyUnit.example(unit.name) if by_unit else unit
    if d.noise_multiplier is not None:
        sigma = d.noise_multiplier
        have = eps_of(sigma)
        if have > eps * (1 + EPS_SLACK):
            raise _too_little_noise(s, eps, delta, q, steps, sigma, have, acc_unit, unit_accounting, method, epoch_eps)
    else:
        sigma = _calibrate_sigma(s, eps_of, eps, delta, q, steps, acc_unit, unit_accounting, method)
        if d.max_noise_multiplier is not None and sigma > d.max_noise_multiplier:
            raise _too_much_noise(s, eps, delta, q, steps, sigma, acc_unit, unit_accounting, method, epoch_eps)
    sens = d.clipping_norm * (2 if s.adjacency.value == "replace-one" else 1)
    hybrid = s.algorithm == "hybrid"
    params = DPSGDParams(
        noise_multiplier=sigma, noise_std=sigma * d.clipping_norm, clipping_norm=d.clipping_norm,
        sensitivity=sens, sampling_rate=q, steps=steps, batch_size=d.batch_size,
        epochs=epochs, dataset_size=n if part else s.dataset_size, sampling=d.sampling,
        max_batch_size=d.max_batch_size, unit_part=part,
        cap=unit.cap, capping=unit.capping,
        normalise_by="expected units per batch q*M, never the realised count" if by_unit else
        "expected batch size q*N, never the realised one", model="full (all features)",
        sample_by="unit" if by_unit else None, units=s.units if by_unit else None,
        warm_start=("rr phase (truncated model)" if warm_start else "none") if hybrid else None,
        # without an RR phase there is nothing to freeze the tower at: DP-SGD trains it
        nonsensitive_tower=(s.tower if warm_start else "trained") if hybrid else None)
    phase = DPSGDPhase(mechanism=mech(sigma), target_epsilon=eps, target_delta=delta, method=method,
                       unit_accounting=unit_accounting, params=params, guarantee=pending_guarantee(s, unit))
    return with_guarantee(phase, s, unit)


def _calibrate_sigma(s: Scenario, eps_of: Callable[[float], float], eps: float, delta: float,
                     q: float, steps: int, unit: PrivacyUnit, unit_accounting: str, method: str) -> float:
    """The phase's noise multiplier; refuses, naming the budget, what no noise within the search range meets."""
    try:
        return _calibrated_sigma(s, eps_of, eps, delta, q, steps, unit, unit_accounting, method)
    except InfeasibleError as exc:
        if exc.knob is not None:
            raise
        raise InfeasibleError(
            f"the DP-SGD phase's epsilon {eps:g} (delta {delta:.3g}, {steps} steps at sampling rate {q:.4g}) needs "
            f"more noise than the search reaches (noise multiplier {limits.SIGMA_RANGE[1]:g}): raise "
            f"[budget].epsilon (it is {s.epsilon:g}) or take fewer steps", knob="epsilon") from None


def _calibrated_sigma(s: Scenario, eps_of: Callable[[float], float], eps: float, delta: float, q: float, steps: int,
                      unit: PrivacyUnit, unit_accounting: str, method: str) -> float:
    assert s.dpsgd is not None  # DP-SGD phases only
    if s.dpsgd.sampling in batch_selection.EPOCH_SAMPLINGS:
        # their own accounting from the start: a Poisson answer is not a bound for them
        return _solve_noise(eps_of, eps, 1.0)
    cal = calibrate.dpsgd_noise_multiplier(epsilon=eps, delta=delta, sampling_rate=q, steps=steps,
                                           adjacency=s.adjacency, unit=unit, method=method,
                                           unit_accounting=unit_accounting, discretization=s.discretization)
    if s.dpsgd.sampling == "poisson":
        return cal.value
    # truncated batches: start from the Poisson answer, refine on the truncated accounting
    return _solve_noise(eps_of, eps, cal.value, step=0.02)


def _solve_noise(eps_of: Callable[[float], float], target: float, guess: float, step: float = 0.25) -> float:
    return calibrate.solve_noise_multiplier(eps_of, epsilon=target, guess=guess, step=step)


def _most_epochs(s: Scenario, sigma: float, eps: float, delta: float, q: float, unit: PrivacyUnit,
                 unit_accounting: str, method: str, eps_of: _EpsOf | None = None) -> tuple[int, float]:
    assert s.dpsgd is not None  # DP-SGD phases only
    if s.dpsgd.sampling in batch_selection.EPOCH_SAMPLINGS:
        assert eps_of is not None  # the epoch samplings pass their accounting
        t = batch_selection.steps_per_epoch(dataset_size=s.dataset_size, batch_size=s.dpsgd.batch_size)
        lo, hi = 0, max(1, round(s.dpsgd.epochs or (s.dpsgd.steps or t) / t))
        while lo < hi:  # the most whole epochs that fit: epsilon grows with the epochs
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if eps_of(sigma, mid * t) <= eps * (1 + EPS_SLACK) else (lo, mid - 1)
        return lo * t, float(lo)
    try:
        cal = calibrate.dpsgd_max_steps(noise_multiplier=sigma, sampling_rate=q, epsilon=eps, delta=delta,
                                        adjacency=s.adjacency, unit=unit, method=method,
                                        unit_accounting=unit_accounting, discretization=s.discretization)
    except InfeasibleError:
        return 0, 0.0
    t = int(cal.value)
    n = s.units if s.dpsgd.sample_by == "unit" else s.dataset_size
    assert n is not None  # unit sampling states M (the Scenario checks)
    return t, t * s.dpsgd.batch_size / n


def _too_little_noise(s: Scenario, eps: float, delta: float, q: float, steps: int, sigma: float, have: float,
                      unit: PrivacyUnit, unit_accounting: str, method: str,
                      eps_of: _EpsOf | None = None) -> InfeasibleError:
    assert s.dpsgd is not None  # DP-SGD phases only
    if s.dpsgd.sampling in batch_selection.EPOCH_SAMPLINGS:
        assert eps_of is not None  # the epoch samplings pass their accounting
        need = calibrate.solve_noise_multiplier(eps_of, epsilon=eps, guess=sigma)
    else:
        need = calibrate.dpsgd_noise_multiplier(epsilon=eps, delta=delta, sampling_rate=q, steps=steps,
                                                adjacency=s.adjacency, unit=unit, method=method,
                                                unit_accounting=unit_accounting,
                                                discretization=s.discretization, verify=False).value
    t, epochs = _most_epochs(s, sigma, eps, delta, q, unit, unit_accounting, method, eps_of)
    fix = f"at most {epochs:.4g} epochs ({t} steps) fit at that noise" if t else "no single step fits at that noise"
    return InfeasibleError(
        f"[dpsgd].noise_multiplier = {sigma:g} gives epsilon {have:.4g} > the phase budget {eps:.4g}: "
        f"use noise_multiplier >= {need:.4g}, or {fix}", knob="noise_multiplier", suggestion=need)


def _too_much_noise(s: Scenario, eps: float, delta: float, q: float, steps: int, sigma: float, unit: PrivacyUnit,
                    unit_accounting: str, method: str, eps_of: _EpsOf | None = None) -> InfeasibleError:
    assert s.dpsgd is not None  # DP-SGD phases only
    cap = s.dpsgd.max_noise_multiplier
    assert cap is not None  # raised only when the noise needed exceeds a stated cap
    t, epochs = _most_epochs(s, cap, eps, delta, q, unit, unit_accounting, method, eps_of)
    if eps_of is not None:
        at_cap = eps_of(cap)
    else:
        at_cap = account(PoissonDPSGD(noise_multiplier=cap, sampling_rate=q, steps=steps), delta=delta,
                         adjacency=s.adjacency, unit=unit, method=method, unit_accounting=unit_accounting,
                         discretization=s.discretization).epsilon
    fix = f"at most {epochs:.4g} epochs ({t} steps) fit" if t else "not one step fits"
    return InfeasibleError(
        f"the DP-SGD phase needs noise_multiplier {sigma:.4g} > [dpsgd].max_noise_multiplier = {cap:g}: at "
        f"{cap:g}, {fix}; or raise the phase budget to epsilon >= {at_cap:.4g}", knob="epochs", suggestion=epochs)


# -------------------------------------------------------------- guarantees


def pending_guarantee(s: Scenario, unit: PrivacyUnit) -> Guarantee:
    """The guarantee a phase is built with before ``with_guarantee`` computes its own."""
    return Guarantee(epsilon=math.inf, delta=0.0, method="pending", adjacency=s.adjacency, unit=unit)


P = TypeVar("P", bound=PhaseBase)


def with_guarantee(phase: P, s: Scenario, unit: PrivacyUnit) -> P:
    """``phase`` with its guarantee, computed from its mechanism for the scenario's adjacency and unit."""
    # a registered kind is a PhaseBase with a mechanism, as the built-in kinds of Phase are
    g = phase_guarantee(cast(Phase, phase), adjacency=s.adjacency, unit=unit, discretization=s.discretization)
    return replace(phase, guarantee=g)


# ------------------------------------------------------- unit alternatives


def _unit_alternatives(s: Scenario, unit: PrivacyUnit, phases: Sequence[Phase]) -> list[dict[str, Any]]:
    """What each way of bounding a unit of K examples costs, per phase, at the phase's target."""
    if unit.cap == 1:
        return []
    rows: list[dict[str, Any]] = []
    k = unit.cap
    for p in phases:
        eps, delta = p.target_epsilon, p.target_delta
        if isinstance(p, RRPhase):
            tight = rr_math.max_per_example_epsilon(eps, k, delta) if delta > 0 else eps / k
            rows += [
                _alt(p, "eps/K", "per_impression_epsilon", eps / k, eps, 0.0,
                     "every impression spends eps/K: exactly eps per unit (pure composition)"),
                _alt(p, "eps/K_i", "per_impression_epsilon", eps, eps, 0.0,
                     "a unit with K_i impressions spends eps/K_i each (shown: K_i = 1); still eps per unit"),
                _alt(p, "tight composition", "per_impression_epsilon", tight,
                     rr_math.composed_epsilon(tight, k, delta), delta,
                     "largest per-impression eps whose exact K-fold composition meets (eps, delta)"
                     if delta > 0 else "with delta = 0 the tight composition is the even split"),
                _alt(p, "group privacy", "per_impression_epsilon", eps / k,
                     *group_privacy(epsilon=eps / k, delta=0.0, group_size=k),
                     "(K eps_i, delta_i (e^{K eps_i}-1)/(e^{eps_i}-1)); for pure RR it equals eps/K"),
            ]
        elif isinstance(p, DPSGDPhase) and isinstance(p.mechanism, (PoissonDPSGD, UnitPoissonDPSGD)):
            rows += _dpsgd_executions(s, unit, p)
        elif isinstance(p, (WALRPhase, CalibrationPhase)):
            sens = p.params.sensitivity
            exact = gauss.analytic_sigma(epsilon=eps, delta=delta, sensitivity=sens * k)
            def group_eps(x: float, sens: float = sens, delta: float = delta) -> float:
                return account(GaussianRelease(noise_std=x, sensitivity=sens), delta=delta, adjacency=s.adjacency,
                               unit=unit, method="exact", unit_accounting="group").epsilon

            rows.append(_alt(p, "sensitivity K x Delta", "noise_std", exact, eps, delta, "exact for one release"))
            try:
                rows.append(_alt(p, "group privacy", "noise_std", _solve_noise(group_eps, eps, exact), eps, delta,
                                 "generic formula"))
            except BudgetplanError as exc:  # the looser bound may need more noise than the search allows
                rows.append({"phase": p.name, "bounding": "group privacy", "applies": False, "note": str(exc)})
    return rows


_UNIT_SAMPLING = "unit sampling (clip per unit)"


def _calibrated_here(s: Scenario, p: DPSGDPhase) -> bool:
    """Whether the phase's noise multiplier is the PLD calibration of Poisson DP-SGD at its target."""
    return (s.dpsgd is not None and s.dpsgd.noise_multiplier is None and s.dpsgd.sampling == "poisson"
            and isinstance(p.mechanism, PoissonDPSGD) and p.method == "pld")


def _example_sampled_rows(s: Scenario, unit: PrivacyUnit, p: DPSGDPhase, q: float,
                          steps: int) -> list[dict[str, Any]]:
    """The noise each bound on a unit of K independently sampled examples needs, at q and T."""
    add_remove = s.adjacency.value == "add-remove"
    rows: list[dict[str, Any]] = []
    for label, adj_ok, kwargs in (
        ("mixture of Gaussians" if add_remove else "double mixture of Gaussians", True,
         dict(unit_accounting="tight")),
        ("group privacy (pld)", True, dict(unit_accounting="group")),
        ("group privacy (rdp)", add_remove, dict(unit_accounting="group", method="rdp")),
    ):
        if not adj_ok:
            rows.append({"phase": p.name, "bounding": label, "applies": False,
                         "note": "defined under add-remove only; this plan is replace-one"})
            continue
        if kwargs.get("unit_accounting") == p.unit_accounting and "method" not in kwargs and _calibrated_here(s, p):
            # the phase's own calibration answered this row's question (verified, so at or above its answer)
            rows.append(_alt(p, label, "noise_multiplier", p.mechanism.noise_multiplier, p.guarantee.epsilon,
                             p.guarantee.delta, p.guarantee.method))
            continue
        try:
            cal = calibrate.dpsgd_noise_multiplier(epsilon=p.target_epsilon, delta=p.target_delta, sampling_rate=q,
                                                   steps=steps, adjacency=s.adjacency, unit=unit,
                                                   discretization=s.discretization, verify=False, **kwargs)
            rows.append(_alt(p, label, "noise_multiplier", cal.value, cal.guarantee.epsilon, cal.guarantee.delta,
                             cal.guarantee.method))
        except BudgetplanError as exc:
            rows.append({"phase": p.name, "bounding": label, "applies": False, "note": str(exc)})
    return rows


def _dpsgd_executions(s: Scenario, unit: PrivacyUnit, p: DPSGDPhase) -> list[dict[str, Any]]:
    """Both executions of user-level DP-SGD at the phase's q and T, and which one to run.

    Example sampling (each example joins a step w.p. q and is clipped alone; a unit is bounded
    by a mixture or group privacy) against unit sampling (each unit joins w.p. q and its
    examples' summed gradient is clipped once: example-level accounting over units, Charles
    et al., arXiv:2407.07737). The same q keeps each row's chance per step, the steps and the
    rows per step. While clipping rarely binds, the signal of the mean update is the same
    either way and the noise on it is sigma C / (q N) against sigma C / (q M) per q M units
    of K-bar rows: the smaller sigma wins, and the recommendation follows it (measured so at
    the product's default C = 5 on 1M synthetic rows: units won at K = 2, 5 and 10,
    ``benchmarks/results/user_level.md``). When clipping binds for most units, a unit's C
    covers all its examples and the noise per clipped contribution, sigma / (q N) against
    sigma / (q M), is the fairer measure; each row carries it, and the recommendation says
    whether it agrees.
    """
    mech = p.mechanism
    assert isinstance(mech, (PoissonDPSGD, UnitPoissonDPSGD))  # the caller's match
    q, steps, n = mech.sampling_rate, mech.steps, s.dataset_size
    m_units, m_note = (s.units, f"M = {s.units:,} units") if s.units is not None else \
        (n / unit.cap, f"M = N/K = {n / unit.cap:,.0f} assumed (every unit full); give [data].units for yours")
    examples = _example_sampled_rows(s, unit, p, q, steps)
    if isinstance(mech, UnitPoissonDPSGD):
        own = _alt(p, _UNIT_SAMPLING, "noise_multiplier", mech.noise_multiplier, p.guarantee.epsilon,
                   p.guarantee.delta, p.guarantee.method)
    else:
        try:
            cal = calibrate.dpsgd_noise_multiplier(epsilon=p.target_epsilon, delta=p.target_delta, sampling_rate=q,
                                                   steps=steps, adjacency=s.adjacency,
                                                   discretization=s.discretization, verify=False)
            own = _alt(p, _UNIT_SAMPLING, "noise_multiplier", cal.value, cal.guarantee.epsilon, cal.guarantee.delta,
                       "pld over units (Charles et al., arXiv:2407.07737)")
        except BudgetplanError as exc:
            own = {"phase": p.name, "bounding": _UNIT_SAMPLING, "applies": False, "note": str(exc)}
    candidates = [r for r in examples if r.get("applies")]
    for r in candidates:
        r.update(execution="example sampling", expected_contributions=q * n,
                 noise_per_contribution=r["noise_multiplier"] / (q * n))
    if own.get("applies"):
        own.update(execution="unit sampling", expected_contributions=q * m_units,
                   noise_per_contribution=own["noise_multiplier"] / (q * m_units),
                   note=f"{own['note']}; each unit joins a step w.p. q = {q:.4g} and its summed gradient is "
                        f"clipped once to C; {m_note}")
        candidates.append(own)
    if candidates:
        best = min(candidates, key=lambda r: r["noise_multiplier"])
        best["recommended"] = True
        per = min(candidates, key=lambda r: r["noise_per_contribution"])
        best["recommendation"] = (
            "the least noise, also per clipped contribution" if per is best else
            f"the least noise while clipping rarely binds; if most contributions are clipped, "
            f"{per['execution']} ({per['bounding']}) has less noise per clipped contribution")
    return [own, *examples] if isinstance(mech, UnitPoissonDPSGD) else [*examples, own]


def _alt(phase: Phase, bounding: str, knob: str, value: float, epsilon: float, delta: float,
         note: str) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase.name, "bounding": bounding, "applies": True, knob: value,
                           "unit_epsilon": epsilon, "unit_delta": delta, "note": note}
    if knob == "per_impression_epsilon":
        out["flip_probability"] = rr_math.flip_probability(value)
    return out


def check_within_budget(plan: Plan) -> list[str]:
    """Problems if any phase or the headline guarantee exceeds what it was planned to."""
    problems: list[str] = []
    for p in plan.phases:
        if p.guarantee.epsilon > p.target_epsilon * (1 + EPS_SLACK) or p.guarantee.delta > p.target_delta * (
                1 + EPS_SLACK):
            problems.append(f"phase {p.name}: guarantee ({p.guarantee.epsilon:.6g}, {p.guarantee.delta:.3g}) "
                            f"exceeds its target ({p.target_epsilon:.6g}, {p.target_delta:.3g})")
    g = plan.guarantee
    if g.epsilon > plan.epsilon * (1 + EPS_SLACK) or g.delta > plan.delta * (1 + EPS_SLACK):
        problems.append(f"total guarantee ({g.epsilon:.6g}, {g.delta:.3g}) exceeds the budget "
                        f"({plan.epsilon:.6g}, {plan.delta:.3g})")
    return problems

