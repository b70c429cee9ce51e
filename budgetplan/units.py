"""Adjacency relations and privacy units: the first two inputs of every guarantee.

A guarantee means nothing until it says which pairs of datasets it protects (adjacency)
and whose data one such change is (the privacy unit). Both are explicit values here and
travel with every result; composition requires them to agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["Adjacency", "PrivacyUnit", "CAPPING_RULES", "SAMPLE_BY"]


class Adjacency(enum.StrEnum):
    """Which datasets are neighbours.

    ``ADD_REMOVE``: D' is D with one unit's data added or removed (full DP, the usual DP-SGD
    setting; per-example sensitivity C).
    ``REPLACE_ONE``: D' is D with one unit's data replaced. Label DP (change a label) and
    semi-sensitive DP (change the sensitive features and/or label, non-sensitive features
    fixed) are replace-one relations. DP-SGD under replace-one has sensitivity 2C.
    """

    ADD_REMOVE = "add-remove"
    REPLACE_ONE = "replace-one"

    @classmethod
    def parse(cls, value: Adjacency | str, name: str = "adjacency") -> Adjacency:
        """Accept an Adjacency or its string form; anything else is an InvalidParameterError."""
        if isinstance(value, cls):
            return value
        for member in cls:
            if value == member.value:
                return member
        choices = ", ".join(m.value for m in cls)
        raise InvalidParameterError(f"{name} must be one of {choices}, got {value!r}")


CAPPING_RULES = ("random", "first")
# What DP-SGD samples and clips: each example on its own, or a whole capped unit (its
# examples' gradients summed and clipped once; Charles et al., arXiv:2407.07737).
SAMPLE_BY = ("example", "unit")


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivacyUnit:
    """Whose data one adjacent change covers.

    Attributes:
        name: what a unit is, in the user's words: ``"example"``, ``"impression"``,
            ``"user x time"``, ``"user x advertiser x time"``.
        cap: the most examples one unit may contribute after capping (K). ``cap == 1`` is
            example-level privacy.
        capping: how a unit with more than ``cap`` examples is cut down: keep ``"random"``
            examples or the ``"first"`` ones. Irrelevant (``None``) when ``cap == 1``.
    """

    name: str = "example"
    cap: int = 1
    capping: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidParameterError(f"unit name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "cap", validate.positive_int("unit cap", self.cap))
        if self.cap > 1:
            capping = "random" if self.capping is None else self.capping
            if capping not in CAPPING_RULES:
                raise InvalidParameterError(
                    f"capping must be one of {', '.join(CAPPING_RULES)}, got {self.capping!r}"
                )
            object.__setattr__(self, "capping", capping)
        elif self.capping is not None and self.capping not in CAPPING_RULES:
            raise InvalidParameterError(
                f"capping must be one of {', '.join(CAPPING_RULES)}, got {self.capping!r}"
            )

    @classmethod
    def example(cls, name: str = "example") -> PrivacyUnit:
        """Example-level privacy (one impression, one row)."""
        return cls(name=name, cap=1)

    @classmethod
    def capped(cls, cap: int, *, name: str = "user", capping: str = "random") -> PrivacyUnit:
        """A unit (user, user x time, ...) contributing at most ``cap`` examples."""
        return cls(name=name, cap=cap, capping=capping)

    @property
    def is_example_level(self) -> bool:
        return self.cap == 1

    def describe(self) -> str:
        if self.cap == 1:
            return self.name
        return f"{self.name} (at most {self.cap} examples, {self.capping} kept)"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cap": self.cap, "capping": self.capping}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyUnit:
        return cls(name=data["name"], cap=data["cap"], capping=data.get("capping"))
