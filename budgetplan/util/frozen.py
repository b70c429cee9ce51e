"""An immutable, hashable mapping for the open tables of plans and records.

Some parts of a record are by nature tables keyed by name: library versions by package,
seconds by stage, metrics by split, a model's configuration. They are held as a
:class:`FrozenMap`, which nothing downstream can mutate; :func:`freeze` turns a JSON value
into its frozen form (objects into ``FrozenMap``, lists into tuples) and
``budgetplan.util.typed.to_json_object`` turns it back, so the JSON is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from budgetplan.errors import InvalidParameterError

__all__ = ["FrozenMap", "freeze", "table"]

V = TypeVar("V")


class FrozenMap(Mapping[str, V]):
    """A read-only ``str -> V`` mapping: equal to a dict with the same items, hashable when its values are."""

    __slots__ = ("_items",)
    _items: dict[str, V]

    def __init__(self, items: Mapping[str, V] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("FrozenMap is immutable")

    def __getitem__(self, key: str) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items())))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def __reduce__(self) -> tuple[type[FrozenMap[V]], tuple[dict[str, V]]]:
        return (type(self), (self._items,))  # pickled to other processes as its items


def freeze(value: object) -> Any:
    """A JSON value with every object a :class:`FrozenMap` and every list a tuple (deeply)."""
    if isinstance(value, Mapping):
        return FrozenMap({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def table(name: str, value: object, check: Callable[[str, object], V]) -> FrozenMap[V]:
    """``value`` (a JSON object) as a FrozenMap whose every value passed ``check(f"{name}.{key}", v)``.

    Raises:
        InvalidParameterError: ``value`` is not an object, or ``check`` refused a value.
    """
    if not isinstance(value, Mapping):
        raise InvalidParameterError(f"{name} must be a JSON object, got {value!r}")
    out: dict[str, V] = {}
    for key, v in value.items():
        if not isinstance(key, str):
            raise InvalidParameterError(f"{name} keys must be strings, got {key!r}")
        out[key] = check(f"{name}.{key}", v)
    return FrozenMap(out)
