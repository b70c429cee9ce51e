"""The types of a schema-1 plan file's totals, budgets and tables, checked before anything reads them.

The sha256 in a plan file proves that its content is whole, not who wrote it: someone who
edits a plan and recomputes the hash gets a file that passes the integrity check. Every
reader (``show``, ``statement``, ``verify``, the trainers) then meets the values; so a plan
is first checked to have, at every place, the type its writer puts there, and a plan that
does not is refused naming the place (``phases[0].target_epsilon must be a number, got
'x'``), never half-read. The meaning of the values is ``budgetplan.audit.verify``'s to check.

The description mirrors ``Plan.content`` (schema 1): a field's meaning and type never change
within a version, so neither does this. The scenario and each phase's parameters are typed
values that read themselves strictly (``Scenario.from_dict``, ``budgetplan.plan.phases``); only
their outer shape is checked here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from budgetplan.errors import PlanMismatchError

__all__ = ["check_plan_types"]


class _Check(Protocol):
    def check(self, value: object, where: str) -> None: ...


# A check, or an object with exactly these keys, each value checked by its own spec.
_Spec: TypeAlias = "_Check | dict[str, _Spec]"


class _T:
    """A type check: ``ok(value)`` and a description for the message."""

    def __init__(self, what: str, ok: Callable[[object], bool]):
        self.what, self.ok = what, ok

    def check(self, value: object, where: str) -> None:
        if not self.ok(value):
            shown = repr(value)
            raise PlanMismatchError(f"plan field {where} must be {self.what}, got "
                                    f"{shown if len(shown) <= 40 else shown[:40] + '...'}")


def _is_num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


NUM = _T("a number", _is_num)
INT = _T("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
STR = _T("a string", lambda v: isinstance(v, str))
BOOL = _T("true or false", lambda v: isinstance(v, bool))
SCALAR = _T("a number, string, boolean or null", lambda v: v is None or isinstance(v, (int, float, str, bool)))


class _Optional:
    def __init__(self, inner: _Spec):
        self.inner = inner

    def check(self, value: object, where: str) -> None:
        if value is not None:
            _check(self.inner, value, where)


class _List:
    def __init__(self, inner: _Spec, nonempty: bool = False):
        self.inner, self.nonempty = inner, nonempty

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, list) or (self.nonempty and not value):
            raise PlanMismatchError(f"plan field {where} must be a {'non-empty ' if self.nonempty else ''}list")
        for i, item in enumerate(value):
            _check(self.inner, item, f"{where}[{i}]")


class _Map:
    """An object with any string keys, every value of one type (``known`` keys: their own)."""

    def __init__(self, values: _Spec, known: dict[str, _Spec] | None = None, required: tuple[str, ...] = ()):
        self.values, self.known, self.required = values, known or {}, required

    def check(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise PlanMismatchError(f"plan field {where} must be an object")
        for key in self.required:
            if key not in value:
                raise PlanMismatchError(f"plan field {where} lacks {key!r}")
        for key, item in value.items():
            _check(self.known.get(key, self.values), item, f"{where}.{key}")


class _MayLack:
    """A key of an exact object that may be absent (added in a way that keeps older files' bytes)."""

    def __init__(self, inner: _Spec):
        self.inner = inner

    def check(self, value: object, where: str) -> None:
        _check(self.inner, value, where)


def _check(spec: _Spec, value: object, where: str) -> None:
    if isinstance(spec, dict):  # an object with exactly these keys
        if not isinstance(value, dict):
            raise PlanMismatchError(f"plan field {where} must be an object")
        required = {k for k, v in spec.items() if not isinstance(v, _MayLack)}
        missing, extra = sorted(required - set(value)), sorted(set(value) - set(spec))
        if missing or extra:
            raise PlanMismatchError(f"plan field {where} " + (f"lacks {missing[0]!r}" if missing
                                                             else f"has an unknown key {extra[0]!r}"))
        for key, inner in spec.items():
            if key in value:
                _check(inner, value[key], f"{where}.{key}" if where else key)
    else:
        spec.check(value, where)


_UNIT: dict[str, _Spec] = {"name": STR, "cap": INT, "capping": _Optional(STR)}
_GUARANTEE: dict[str, _Spec] = {
    "epsilon": _Optional(NUM), "delta": NUM, "method": STR, "adjacency": STR, "unit": _UNIT,
    "bound": STR, "epsilon_range": _Optional(_List(NUM)), "discretization": _Optional(NUM),
    "conversion": _Optional(STR), "notes": _List(STR), "versions": _Map(STR)}
# A phase's parameters are typed by its kind (``budgetplan.plan.phases``), which reads them strictly.
_PHASE: dict[str, _Spec] = {
    "name": STR, "mechanism": _Map(SCALAR, known={"phases": _List(_Map(SCALAR))}), "target_epsilon": NUM,
    "target_delta": NUM, "method": STR, "unit_accounting": STR,
    "parameters": _Map(_T("a number, string, boolean, null or list", lambda v: v is None or isinstance(
        v, (int, float, str, bool, list))), known={"unit_part": {"low": NUM, "high": NUM, "rows": INT, "key": STR}}),
    "guarantee": _GUARANTEE}
_TUNING = _Map(SCALAR, known={"configurations": INT, "guarantee": _GUARANTEE, "pld_guarantee": _Optional(_GUARANTEE),
                              # a grid's configurations (phases read strictly by budgetplan.planning.grid) and selection
                              "grid": _List(_Map(_T("any JSON value", lambda v: True))),
                              "noisy_max": _Map(SCALAR)},
               required=("configurations", "selection", "guarantee"))
_PLAN: dict[str, _Spec] = {
    "schema_version": INT, "versions": _Map(STR),
    "scenario": _Map(_T("any JSON value", lambda v: True)),  # read strictly by Scenario.from_dict
    "budget": {"epsilon": NUM, "delta": NUM},
    "privacy": {"adjacency": STR, "unit": _UNIT, "dataset_size": INT},
    "run_budget": {"epsilon": NUM, "delta": NUM},
    "phases": _List(_PHASE, nonempty=True),
    "total": {"basic": _GUARANTEE, "pld": _Optional(_GUARANTEE), "pld_note": _Optional(STR)},
    "tuning": _Optional(_TUNING),
    "unit_alternatives": _List(_Map(SCALAR, required=("phase", "bounding"))),
    "warnings": _List(STR),
    "split": _MayLack({"rule": STR, "epsilon": NUM, "alpha": NUM, "epsilon1": NUM, "epsilon2": NUM, "reason": STR}),
    "sha256": STR,
}


def check_plan_types(data: dict[str, Any]) -> None:
    """Raise PlanMismatchError naming the first field of ``data`` whose type is not schema 1's."""
    _check(_PLAN, data, "")
