"""The typed parts of a plan besides its phases: the unit alternatives and the library versions.

Each is frozen and read strictly from its JSON object (``budgetplan.util.typed``); field names
are the JSON keys. Keys that only some entries have are ``omit_if_none`` fields, so a plan's
bytes are those it had when they were dicts.
"""

from __future__ import annotations

from dataclasses import dataclass

from budgetplan.errors import InvalidParameterError
from budgetplan.util import typed, validate
from budgetplan.util.frozen import FrozenMap, table

__all__ = ["UnitAlternative", "unit_alternatives", "versions_table"]

_KNOBS = ("per_impression_epsilon", "noise_multiplier", "noise_std")


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitAlternative:
    """One way of bounding a unit of K examples in one phase, and what it costs (``planning.planner``).

    An alternative that ``applies`` names its knob (``per_impression_epsilon`` for RR,
    ``noise_multiplier`` for DP-SGD, ``noise_std`` for a Gaussian release) and the unit
    guarantee it gives; one that does not says why in ``note``. DP-SGD's alternatives also
    say which ``execution`` they run (example or unit sampling), the clipped contributions per
    step and the noise per contribution; the one with the least noise is ``recommended``.
    """

    phase: str
    bounding: str
    applies: bool
    note: str
    per_impression_epsilon: float | None = typed.omit_if_none()
    flip_probability: float | None = typed.omit_if_none()
    noise_multiplier: float | None = typed.omit_if_none()
    noise_std: float | None = typed.omit_if_none()
    unit_epsilon: float | None = typed.omit_if_none()
    unit_delta: float | None = typed.omit_if_none()
    execution: str | None = typed.omit_if_none()
    expected_contributions: float | None = typed.omit_if_none()
    noise_per_contribution: float | None = typed.omit_if_none()
    recommended: bool | None = typed.omit_if_none()
    recommendation: str | None = typed.omit_if_none()

    def __post_init__(self) -> None:
        typed.text("phase", self.phase)
        typed.text("bounding", self.bounding)
        typed.flag("applies", self.applies)
        typed.text("note", self.note)
        for name in (*_KNOBS, "flip_probability", "unit_epsilon", "unit_delta", "expected_contributions",
                     "noise_per_contribution"):
            typed.optional(validate.non_negative, name, getattr(self, name))
        typed.optional(typed.text, "execution", self.execution)
        typed.optional(typed.flag, "recommended", self.recommended)
        typed.optional(typed.text, "recommendation", self.recommendation)
        knobs = [k for k in _KNOBS if getattr(self, k) is not None]
        if self.applies and (len(knobs) != 1 or self.unit_epsilon is None or self.unit_delta is None):
            raise InvalidParameterError(f"an alternative that applies names one knob of {list(_KNOBS)} and its "
                                        f"unit_epsilon and unit_delta; {self.bounding!r} has {knobs}")
        if not self.applies and knobs:
            raise InvalidParameterError(f"an alternative that does not apply names no knob; {self.bounding!r} has "
                                        f"{knobs}")

    @property
    def knob(self) -> tuple[str, float] | None:
        """(the knob's name, its value) of an alternative that applies; None otherwise."""
        return next(((k, v) for k in _KNOBS if (v := getattr(self, k)) is not None), None)


def unit_alternatives(where: str, value: object) -> tuple[UnitAlternative, ...]:
    """The plan's ``unit_alternatives`` list, each entry read strictly."""
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{where} must be a list, got {type(value).__name__}")
    return tuple(typed.from_json_object(UnitAlternative, v, f"{where}[{i}]") for i, v in enumerate(value))


def versions_table(where: str, value: object) -> FrozenMap[str]:
    """Library versions by name: a read-only table of strings."""
    return table(where, value, typed.text)
