"""Strict conversion between frozen dataclasses and the JSON objects of plans and records.

Plans and run records are read by people who did not write them, so a reader must fail
closed: a missing field, an unknown one or a value of the wrong kind is an error that
names it, never something skipped. Each typed value validates its own fields in
``__post_init__``; this module only maps dict keys to dataclass fields and back.

A field declared with ``omit_if_none()`` is left out of the JSON when it is None (and may
be absent when reading), which keeps plan files byte-identical to the form they had when
those keys were written only for some plans.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["omit_if_none", "from_json_object", "to_json_object", "choice", "optional", "float_tuple"]

T = TypeVar("T")

_OMIT = "omit_if_none"


def omit_if_none() -> Any:
    """A field default of None that is left out of the JSON object when None."""
    return dataclasses.field(default=None, metadata={_OMIT: True})


def to_json_object(value: DataclassInstance) -> dict[str, Any]:
    """The dataclass as a JSON-ready dict (tuples become lists; omit-if-none fields dropped)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None and f.metadata.get(_OMIT):
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def from_json_object(cls: type[T], data: object, where: str) -> T:
    """Build ``cls`` from ``data``: every required field present, no unknown field.

    Raises:
        InvalidParameterError: naming ``where`` and the field that is missing, unknown or
            invalid (the dataclass's own validation supplies the last).
    """
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{where} must be a JSON object, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InvalidParameterError(f"{where} has an unknown field {unknown[0]!r}")
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if name in data:
            v = data[name]
            kwargs[name] = tuple(v) if isinstance(v, list) else v
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InvalidParameterError(f"{where} is missing the field {name!r}")
    try:
        return cls(**kwargs)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{where}: {exc}") from None
    except TypeError as exc:  # a value of a type the constructor cannot take at all
        raise InvalidParameterError(f"{where}: {exc}") from None


def choice(name: str, value: object, choices: tuple[str | None, ...]) -> str | None:
    """``value`` if it is one of ``choices``, else InvalidParameterError quoting both."""
    if not isinstance(value, (str, type(None))) or value not in choices:
        raise InvalidParameterError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def optional(check: Callable[[str, object], T], name: str, value: object) -> T | None:
    """None, or ``check(name, value)``."""
    return None if value is None else check(name, value)


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidParameterError(f"{name} must be a string, got {value!r}")
    return value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be true or false, got {value!r}")
    return value


def float_tuple(name: str, value: object,
                check: Callable[[str, object], float] = validate.finite) -> tuple[float, ...]:
    """A tuple of numbers, each passed through ``check``."""
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{name} must be a list of numbers, got {value!r}")
    return tuple(check(f"{name}[{i}]", v) for i, v in enumerate(value))
