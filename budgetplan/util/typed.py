"""Strict conversion between frozen dataclasses and the JSON objects of plans and records.

Plans and run records are read by people who did not write them, so a reader must fail
closed: a missing field, an unknown one or a value of the wrong kind is an error that
names it, never something skipped. Each typed value validates its own fields in
``__post_init__``; this module only maps dict keys to dataclass fields and back.

A field declared with ``omit_if_none()`` is left out of the JSON when it is None (and may
be absent when reading), which keeps plan files byte-identical to the form they had when
those keys were written only for some plans. A field declared with ``loaded(load)`` holds a
typed sub-object (or a tuple of them, or a frozen table): reading passes its JSON value
through ``load(where, value)``, and writing turns nested dataclasses, mappings and tuples
back into JSON objects and lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["omit_if_none", "loaded", "nested", "nested_tuple", "from_json_object", "to_json_object", "to_json",
           "choice", "optional", "float_tuple"]

T = TypeVar("T")

_OMIT = "omit_if_none"
_LOAD = "load"
_DUMP = "dump"

Loader = Callable[[str, object], Any]


def omit_if_none() -> Any:
    """A field default of None that is left out of the JSON object when None."""
    return dataclasses.field(default=None, metadata={_OMIT: True})


def loaded(load: Loader, *, omit: bool = False, optional: bool = False,
           dump: Callable[[Any], Any] | None = None) -> Any:
    """A field whose JSON value is read with ``load(where, value)`` (None passes through when ``optional``).

    ``omit=True``: the field defaults to None and is left out of the JSON when None.
    ``dump``: how the field's (not None) value is written, where :func:`to_json` would not do.
    """
    def read(where: str, value: object) -> Any:
        return None if value is None and (optional or omit) else load(where, value)

    meta: dict[str, Any] = {_LOAD: read, _OMIT: omit}
    if dump is not None:
        meta[_DUMP] = dump
    return dataclasses.field(default=None, metadata=meta) if omit else dataclasses.field(metadata=meta)


def nested(cls: type[Any], *, omit: bool = False, optional: bool = False) -> Any:
    """A field holding one ``cls`` sub-object, read strictly from its JSON object."""
    return loaded(lambda where, value: from_json_object(cls, value, where), omit=omit, optional=optional)


def nested_tuple(cls: type[Any]) -> Any:
    """A field holding a tuple of ``cls`` sub-objects, read from a JSON list of objects."""
    def load(where: str, value: object) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise InvalidParameterError(f"{where} must be a list, got {type(value).__name__}")
        return tuple(from_json_object(cls, v, f"{where}[{i}]") for i, v in enumerate(value))
    return loaded(load)


def to_json(value: object) -> Any:
    """A JSON-ready value: dataclasses as their objects, mappings as dicts, tuples as lists (deeply)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json_object(value)
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    return value


def to_json_object(value: DataclassInstance) -> dict[str, Any]:
    """The dataclass as a JSON-ready dict (see :func:`to_json`; omit-if-none fields dropped)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if v is None and f.metadata.get(_OMIT):
            continue
        dump = f.metadata.get(_DUMP)
        out[f.name] = dump(v) if dump is not None and v is not None else to_json(v)
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
            load = f.metadata.get(_LOAD)
            if load is not None:
                kwargs[name] = load(f"{where}.{name}", v)
            else:
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
