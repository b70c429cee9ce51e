"""Argument checks shared by the fast PLD engine's builders (``fastpld``, ``mixture_pld``)."""

from __future__ import annotations

from budgetplan.accounting.limits import MAX_DISCRETIZATION
from budgetplan.accounting.pld_types import ADD_REMOVE, REPLACE_ONE
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["check_relation", "check_truncation_bound", "check_discretization", "check_noise"]

_RELATIONS = (ADD_REMOVE, REPLACE_ONE)




def check_relation(relation: str) -> str:
    if relation not in _RELATIONS:
        raise InvalidParameterError(f"relation must be one of {_RELATIONS}, got {relation!r}")
    return relation


# exp(bound) / 2 must stay a normal float64 for the normal quantile of the truncation point.
_MIN_TRUNCATION_BOUND = -700.0


def check_truncation_bound(value: object) -> float:
    bound = validate.finite("log_mass_truncation_bound", value)
    if not _MIN_TRUNCATION_BOUND <= bound <= 0:
        raise InvalidParameterError(
            f"log_mass_truncation_bound must be in [{_MIN_TRUNCATION_BOUND:g}, 0], got {bound!r}")
    return bound


def check_discretization(value: object) -> float:
    d = validate.positive("discretization", value)
    if d > MAX_DISCRETIZATION:
        raise InvalidParameterError(f"discretization must be at most {MAX_DISCRETIZATION:g}, got {d!r}")
    return d


# The Gaussian builders square the noise multiplier and divide by it.
_NOISE_RANGE = (1e-100, 1e100)


def check_noise(name: str, value: object) -> float:
    sigma = validate.positive(name, value)
    if not _NOISE_RANGE[0] <= sigma <= _NOISE_RANGE[1]:
        raise InvalidParameterError(
            f"{name} must be in [{_NOISE_RANGE[0]:g}, {_NOISE_RANGE[1]:g}] for PLD accounting, got {sigma!r}")
    return sigma
