"""A declared grid of configurations, and the accounted selection of one of them.

``[tuning]`` may list values of ``split`` (Hybrid's rule), ``clipping_norm`` and
``dpsgd_learning_rate``; the configurations are the product of the lists, in the order
split, clipping norm, learning rate (the last varies fastest). Running them all and
keeping the best costs privacy, accounted here and stated in the plan:

- the units are divided once, at random and independently of the data, into a training
  part and a validation part of ``validation_fraction`` of the units (never the
  evaluation file). Every configuration trains on the training part with its own phases,
  planned to (eps_run, delta / n): each is a mechanism on the whole data set (its rows are
  sampled at the plan's q and divided by the plan's q N whatever the part's size, so the
  accounting, which never assumed N, holds);
- each trained model is scored on the validation part by u = - sum of the examples' log
  losses with predictions clipped to [p, 1 - p]: one example moves a score by at most
  log(1 / p), a unit of K examples by K log(1 / p) = Delta, whether it is replaced, added
  or removed, and whichever part it falls in;
- one configuration is selected by report-noisy-max with Gumbel noise of scale
  2 Delta / eps_sel: the exponential mechanism (McSherry and Talwar 2007), whose
  Gumbel-max form is exact (Durfee and Rogers 2019, arXiv:1905.04273), and eps_sel-DP
  given the models (pure, no delta);
- the total is basic composition: n runs at (eps_run, delta / n) plus eps_sel, with
  eps_sel = ``selection_share`` x eps and eps_run = (eps - eps_sel) / n. No parallel
  composition between the parts is claimed: under replace-one, a replaced unit may move
  from one part to the other.

The plan lists every configuration's phases; its ``phases`` are the first
configuration's. The trainer (``trainers.tune``) runs all of them and no more.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from budgetplan.accounting.guarantee import Guarantee
from budgetplan.plan.document import Plan
from budgetplan.plan.phases import Phase, phase_to_dict
from budgetplan.planning.composition import basic_total
from budgetplan.planning.shares import split_record
from budgetplan.scenario.model import Scenario, Tuning
from budgetplan.units import PrivacyUnit
from budgetplan.util.typed import to_json

__all__ = ["Configuration", "configurations", "configured", "budgets", "score_sensitivity", "accounting",
           "runs_of", "NOISY_MAX_REFERENCE"]

NOISY_MAX_REFERENCE = ("report-noisy-max with Gumbel noise = the exponential mechanism (McSherry and Talwar 2007; "
                       "Gumbel-max form: Durfee and Rogers 2019, arXiv:1905.04273)")
SCORE = "minus the sum over the validation part of each example's log loss, predictions clipped to [p, 1 - p]"


@dataclass(frozen=True, slots=True)
class Configuration:
    """One point of the grid; a value is None where the grid does not vary it (the scenario's holds)."""

    index: int
    split: str | None = None
    clipping_norm: float | None = None
    dpsgd_learning_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "split": self.split, "clipping_norm": self.clipping_norm,
                "dpsgd_learning_rate": self.dpsgd_learning_rate}

    @property
    def label(self) -> str:
        parts = [f"split {self.split}" if self.split is not None else None,
                 f"C = {self.clipping_norm:g}" if self.clipping_norm is not None else None,
                 f"lr = {self.dpsgd_learning_rate:g}" if self.dpsgd_learning_rate is not None else None]
        return f"#{self.index} (" + ", ".join(p for p in parts if p) + ")"


def configurations(tuning: Tuning) -> list[Configuration]:
    """The grid's configurations in product order (split, clipping norm, learning rate)."""
    splits: tuple[str | None, ...] = tuning.split or (None,)
    norms: tuple[float | None, ...] = tuning.clipping_norm or (None,)
    rates: tuple[float | None, ...] = tuning.dpsgd_learning_rate or (None,)
    return [Configuration(i, *values) for i, values in enumerate(itertools.product(splits, norms, rates))]


def configured(scenario: Scenario, c: Configuration) -> Scenario:
    """The scenario one configuration plans: its split and clipping norm, no tuning."""
    s = scenario
    if c.clipping_norm is None:
        dpsgd = s.dpsgd
    else:
        assert s.dpsgd is not None  # a grid of clipping norms needs a DP-SGD phase (the Scenario checks)
        dpsgd = replace(s.dpsgd, clipping_norm=c.clipping_norm)
    return replace(s, split=c.split if c.split is not None else s.split, dpsgd=dpsgd, tuning=None)


def budgets(epsilon: float, delta: float, n: int, share: float) -> tuple[float, float, float]:
    """(eps_sel, eps_run, delta_run): n eps_run + eps_sel <= epsilon and n delta_run <= delta in floating point."""
    eps_sel = share * epsilon
    eps_run = (epsilon - eps_sel) / n
    while math.fsum([eps_run] * n + [eps_sel]) > epsilon:
        eps_run = math.nextafter(eps_run, 0.0)
    delta_run = delta / n
    while math.fsum([delta_run] * n) > delta:
        delta_run = math.nextafter(delta_run, 0.0)
    return eps_sel, eps_run, delta_run


def score_sensitivity(cap: int, prediction_clip: float) -> float:
    """Delta = K log(1 / p): what one unit of K examples moves a score by (each loss lies in (0, log(1/p)])."""
    return cap * math.log(1.0 / prediction_clip)


def accounting(scenario: Scenario, unit: PrivacyUnit, runs: Sequence[tuple[Configuration, Sequence[Phase]]],
               delta: float) -> dict[str, Any]:
    """The plan's ``tuning`` object for a grid, from each configuration's planned phases.

    Args:
        runs: (Configuration, phases) per configuration, in grid order.
        delta: the plan's total delta.
    """
    t = scenario.tuning
    # a grid plan's scenario declares its tuning, whose grid defaults the Tuning has filled in
    assert t is not None and t.selection_share is not None and t.prediction_clip is not None
    n = len(runs)
    eps_sel, eps_run, delta_run = budgets(scenario.epsilon, delta, n, t.selection_share)
    sensitivity = score_sensitivity(unit.cap, t.prediction_clip)
    grid: list[dict[str, Any]] = []
    totals: list[Guarantee] = []
    for c, phases in runs:
        total = basic_total(phases, scenario, unit)
        totals.append(total)
        grid.append({**c.to_dict(), "split_choice": to_json(split_record(configured(scenario, c), eps_run)),
                     "phases": [phase_to_dict(p) for p in phases], "total": total.to_dict()})
    g = Guarantee(
        epsilon=math.fsum([x.epsilon for x in totals] + [eps_sel]), delta=math.fsum(x.delta for x in totals),
        method="naive-composition", adjacency=scenario.adjacency, unit=unit,
        notes=(f"{n} configurations, each run within ({eps_run:.6g}, {delta_run:.3g}), plus the report-noisy-max "
               f"selection's ({eps_sel:.6g}, 0), composed by basic composition",
               "no parallel composition between the training and validation parts is claimed"))
    return {
        "configurations": n, "selection": "naive", "distribution": None, "guarantee": g.to_dict(),
        "pld_guarantee": None, "grid": grid,
        "noisy_max": {"mechanism": "report-noisy-max", "noise": "gumbel", "epsilon": eps_sel,
                      "share": t.selection_share, "run_epsilon": eps_run, "run_delta": delta_run,
                      "score": SCORE, "prediction_clip": t.prediction_clip, "sensitivity": sensitivity,
                      "gumbel_scale": 2.0 * sensitivity / eps_sel, "validation_fraction": t.validation_fraction,
                      "reference": NOISY_MAX_REFERENCE},
    }


def runs_of(plan: Plan) -> list[tuple[Configuration, tuple[Phase, ...]]]:
    """A grid plan's configurations with their phases, read strictly from the plan; [] without a grid.

    Raises:
        PlanMismatchError: the plan's grid does not read as configurations with phases.
    """
    t = plan.tuning
    if t is None or t.grid is None:
        return []
    # the plan read its grid strictly (budgetplan.plan.tuning): each entry has its phases
    return [(Configuration(e.index, e.split, e.clipping_norm, e.dpsgd_learning_rate), e.phases) for e in t.grid]
