"""Finite / range / integer checks shared by every constructor and entry point.

All checks run before any accounting: several back-ends return silently wrong answers on
bad input (dp_accounting's RdpAccountant reports eps = 0 for a NaN noise multiplier or a
NaN delta), so nothing reaches them unchecked. Messages name the parameter and quote the
value: ``epsilon must be a finite number > 0, got nan``.
"""

from __future__ import annotations

import math
import numbers
from typing import TypeVar

from budgetplan.errors import InvalidParameterError

__all__ = [
    "delta_warning",
    "finite",
    "positive",
    "non_negative",
    "probability",
    "open_unit",
    "positive_int",
    "non_negative_int",
    "at_least",
    "at_most",
]

_N = TypeVar("_N", int, float)


def _real(name: str, value: object, requirement: str) -> float:
    """``value`` as a float, or InvalidParameterError quoting ``requirement``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidParameterError(f"{name} must be {requirement}, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InvalidParameterError(f"{name} must be {requirement}, got {x!r}")
    return x


def finite(name: str, value: object) -> float:
    """Return ``value`` as a float; raise unless it is a finite real number."""
    return _real(name, value, "a finite number")


def positive(name: str, value: object) -> float:
    """A finite number > 0."""
    x = _real(name, value, "a finite number > 0")
    if not x > 0:
        raise InvalidParameterError(f"{name} must be a finite number > 0, got {x!r}")
    return x


def non_negative(name: str, value: object) -> float:
    """A finite number >= 0."""
    x = _real(name, value, "a finite number >= 0")
    if not x >= 0:
        raise InvalidParameterError(f"{name} must be a finite number >= 0, got {x!r}")
    return x


def at_least(name: str, value: object, low: float) -> float:
    """A finite number >= ``low``."""
    x = _real(name, value, f"a finite number >= {low:g}")
    if not x >= low:
        raise InvalidParameterError(f"{name} must be a finite number >= {low:g}, got {x!r}")
    return x


def probability(name: str, value: object, *, allow_zero: bool = False, allow_one: bool = False) -> float:
    """A number in (0, 1), with either end optionally allowed."""
    interval = ("[" if allow_zero else "(") + "0, 1" + ("]" if allow_one else ")")
    x = _real(name, value, f"in {interval}")
    ok_lo = x >= 0 if allow_zero else x > 0
    ok_hi = x <= 1 if allow_one else x < 1
    if not (ok_lo and ok_hi):
        raise InvalidParameterError(f"{name} must be in {interval}, got {x!r}")
    return x


def open_unit(name: str, value: object) -> float:
    """A number strictly between 0 and 1 (a delta, a sampling rate below one)."""
    return probability(name, value)


def _integer(name: str, value: object, kind: str) -> int:
    if isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be {kind}, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isfinite(x) and x.is_integer():
            return int(x)
        raise InvalidParameterError(f"{name} must be {kind}, got {x!r}")
    raise InvalidParameterError(f"{name} must be {kind}, got {value!r}")


def positive_int(name: str, value: object) -> int:
    """An integer >= 1 (floats that are whole numbers are accepted)."""
    n = _integer(name, value, "an integer >= 1")
    if n < 1:
        raise InvalidParameterError(f"{name} must be an integer >= 1, got {n}")
    return n


def non_negative_int(name: str, value: object) -> int:
    """An integer >= 0."""
    n = _integer(name, value, "an integer >= 0")
    if n < 0:
        raise InvalidParameterError(f"{name} must be an integer >= 0, got {n}")
    return n


def at_most(name: str, value: _N, limit: int | float) -> _N:
    """``value`` (already checked) unless it exceeds a stated limit (``budgetplan.limits``)."""
    if value > limit:
        shown = f"{limit:,}" if isinstance(limit, int) else f"{limit:g}"
        given = repr(value) if len(repr(value)) <= 24 else f"{value:.6g}"
        raise InvalidParameterError(f"{name} must be at most {shown} (budgetplan's stated limit), got {given}")
    return value


def delta_warning(delta: float, dataset_size: int, name: str = "delta") -> str | None:
    """Doubtful but legal: a delta not below 1/N (the one wording the scenario, the planner and the CLI use)."""
    if delta < 1.0 / dataset_size:
        return None
    return (f"{name}={delta:g} is not below 1/N={1.0 / dataset_size:.6g}: even a mechanism that publishes one random "
            "row in full meets such a delta; prefer delta << 1/N")
