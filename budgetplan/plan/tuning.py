"""A plan's tuning accounting as typed values: what declaring hyperparameter tuning costs.

``Plan.tuning`` is a :class:`TuningAccounting`: how many configurations, the selection rule
("naive" or "repeat-and-select"), the composed guarantee and, for a declared grid
(``budgetplan.planning.grid``), each configuration's planned phases (:class:`GridEntry`) and
the report-noisy-max selection (:class:`NoisyMax`). Each is frozen and read strictly from the
plan's JSON (``budgetplan.util.typed``), with field names those of the JSON keys; the plan's
bytes are those it had when this was a dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from budgetplan.accounting.guarantee import Guarantee
from budgetplan.errors import InvalidParameterError
from budgetplan.plan.phases import Phase, phase_from_dict, phase_to_dict
from budgetplan.scenario.split_rules import SplitChoice
from budgetplan.util import typed, validate

__all__ = ["NoisyMax", "GridEntry", "TuningAccounting", "read_tuning"]


def _guarantee(where: str, value: object) -> Guarantee:
    if not isinstance(value, dict):
        raise InvalidParameterError(f"{where} must be a JSON object, got {type(value).__name__}")
    try:
        return Guarantee.from_dict(value)
    except KeyError as exc:
        raise InvalidParameterError(f"{where} is missing the field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(f"{where}: {exc}") from None


def _dump_guarantee(g: Guarantee) -> dict[str, Any]:
    return g.to_dict()


def _phases(where: str, value: object) -> tuple[Phase, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidParameterError(f"{where} must be a non-empty list of phases")
    return tuple(phase_from_dict(p, f"{where}[{j}]") for j, p in enumerate(value))


def _dump_phases(phases: tuple[Phase, ...]) -> list[dict[str, Any]]:
    return [phase_to_dict(p) for p in phases]


@dataclass(frozen=True, slots=True, kw_only=True)
class NoisyMax:
    """The report-noisy-max selection of a grid: its mechanism and noise, its epsilon (a ``share`` of the
    budget), the per-run budget left, the score and its sensitivity, the Gumbel scale, the validation
    fraction and the reference the mechanism is taken from."""

    mechanism: str
    noise: str
    epsilon: float
    share: float
    run_epsilon: float
    run_delta: float
    score: str
    prediction_clip: float
    sensitivity: float
    gumbel_scale: float
    validation_fraction: float
    reference: str

    def __post_init__(self) -> None:
        for name in ("mechanism", "noise", "score", "reference"):
            typed.text(name, getattr(self, name))
        for name in ("epsilon", "run_epsilon", "prediction_clip", "sensitivity", "gumbel_scale"):
            validate.positive(name, getattr(self, name))
        validate.non_negative("run_delta", self.run_delta)
        validate.open_unit("share", self.share)
        validate.open_unit("validation_fraction", self.validation_fraction)


@dataclass(frozen=True, slots=True, kw_only=True)
class GridEntry:
    """One configuration of a declared grid: its ``index`` and the values it sets (None where the grid
    does not vary one), the split its rule chose (``split_choice``, a table-driven rule's), its planned
    phases and their basic ``total``."""

    index: int
    split: str | None
    clipping_norm: float | None
    dpsgd_learning_rate: float | None
    split_choice: SplitChoice | None = typed.nested(SplitChoice, optional=True)
    phases: tuple[Phase, ...] = typed.loaded(_phases, dump=_dump_phases)
    total: Guarantee = typed.loaded(_guarantee, dump=_dump_guarantee)

    def __post_init__(self) -> None:
        validate.non_negative_int("index", self.index)
        typed.optional(typed.text, "split", self.split)
        typed.optional(validate.positive, "clipping_norm", self.clipping_norm)
        typed.optional(validate.positive, "dpsgd_learning_rate", self.dpsgd_learning_rate)
        if not self.phases:
            raise InvalidParameterError(f"tuning.grid[{self.index}] has no phases")


@dataclass(frozen=True, slots=True, kw_only=True)
class TuningAccounting:
    """What the declared tuning costs: ``configurations`` runs selected by ``selection`` ("naive" or
    "repeat-and-select", whose runs are drawn from ``distribution``), composed to ``guarantee`` (and
    ``pld_guarantee`` where the runs' PLDs compose). A declared grid also lists its configurations
    (``grid``) and the selection among them (``noisy_max``); both are absent otherwise."""

    configurations: int
    selection: str
    distribution: str | None
    guarantee: Guarantee = typed.loaded(_guarantee, dump=_dump_guarantee)
    pld_guarantee: Guarantee | None = typed.loaded(_guarantee, optional=True, dump=_dump_guarantee)
    grid: tuple[GridEntry, ...] | None = typed.loaded(lambda where, value: _grid(where, value), omit=True)
    noisy_max: NoisyMax | None = typed.nested(NoisyMax, omit=True)

    def __post_init__(self) -> None:
        validate.positive_int("configurations", self.configurations)
        typed.choice("selection", self.selection, ("naive", "repeat-and-select"))
        typed.optional(typed.text, "distribution", self.distribution)
        if (self.grid is None) != (self.noisy_max is None):
            raise InvalidParameterError("a grid's tuning lists its configurations and its selection together")

    @property
    def is_grid(self) -> bool:
        """Whether a grid of configurations and one selection among them are declared."""
        return self.grid is not None


def _grid(where: str, value: object) -> tuple[GridEntry, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{where} must be a list, got {type(value).__name__}")
    return tuple(typed.from_json_object(GridEntry, v, f"{where}[{i}]") for i, v in enumerate(value))


def read_tuning(where: str, value: object) -> TuningAccounting | None:
    """The plan's ``tuning`` object read strictly (None for a plan without tuning)."""
    return None if value is None else typed.from_json_object(TuningAccounting, value, where)
