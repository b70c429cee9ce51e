"""How a run's epsilon is shared out: the calibration release's share, then the split between training phases.

The planner plans the phases to these shares and ``verify`` recomputes them from here.
"""

from __future__ import annotations

import math

from budgetplan.scenario import Scenario
from budgetplan.scenario.split_rules import SplitChoice, choose_split, parse_rule, split_budget

__all__ = ["split_record", "split_of", "training_epsilon", "calibration_released", "rest_of"]


def split_record(s: Scenario, run_eps: float) -> SplitChoice | None:
    """What a table-driven split rule resolved to at the epsilon it splits; None for fixed rules.

    That epsilon is the run's, less the intercept calibration's share when the run releases one
    (the training phases are planned to the rest; see :func:`_plan_phases`).
    """
    if s.algorithm != "hybrid" or s.split is None or parse_rule(s.split).kind != "alpha-by-eps":
        return None
    return split_of(s, training_epsilon(s, run_eps))


def split_of(s: Scenario, train_eps: float) -> SplitChoice:
    """The Hybrid split of the training phases' epsilon ``train_eps`` by the scenario's rule.

    Under ``[accounting].composition = "pld"`` (or "auto", which may resolve to it) the run is
    planned to a basic epsilon above the budget's, and a table-driven rule reads its alpha at
    the budget's own training epsilon, so the alpha is the one the budget asks for (not a table
    step that the larger epsilon crosses). Under "basic" that is the run's own training epsilon.
    """
    assert s.split is not None  # a hybrid Scenario always has its split rule
    at = training_epsilon(s, s.epsilon) if s.composition != "basic" else None
    return choose_split(train_eps, s.split, table_epsilon=at)


def training_epsilon(s: Scenario, run_eps: float) -> float:
    """The run's epsilon left to its training phases (all of it unless a calibration release takes a share)."""
    if not calibration_released(s, run_eps):
        return run_eps
    assert s.calibration is not None  # released only when calibrated
    return rest_of(run_eps, s.calibration.share * run_eps)


def calibration_released(s: Scenario, run_eps: float) -> bool:
    """Whether the run's intercept calibration needs a release: it does after DP-SGD (RR alone is free)."""
    if s.calibration is None or s.algorithm not in ("dpsgd", "hybrid"):
        return False
    if s.algorithm == "dpsgd":
        return True
    assert s.split is not None  # a hybrid Scenario always has its split rule
    return parse_rule(s.split).kind != "alpha" or split_budget(run_eps, s.split)[1] > 0


def rest_of(total: float, spent: float) -> float:
    """total - spent, stepped down until spent + rest never exceeds total in floating point."""
    rest = total - spent
    while spent + rest > total:
        rest = math.nextafter(rest, 0.0)
    return rest
