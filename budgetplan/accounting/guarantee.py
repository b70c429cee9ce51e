"""The Guarantee value: what a mechanism costs, and how that number was obtained.

A bare epsilon is not a guarantee. Every result here carries the delta it holds at, the
adjacency and privacy unit it protects, the method that produced it and whether that
method's answer is exact, a pessimistic (upper) bound, or an estimate with an error band,
plus the versions of the back-end libraries, so a number can be reproduced and audited.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.version import __version__

__all__ = ["Guarantee", "library_versions"]

_LIBRARIES = ("budgetplan", "dp-accounting", "prv-accountant", "numpy", "scipy")


# Libraries loaded by every accounting, whose own __version__ is read instead of their installed
# metadata (each metadata look-up scans the path: milliseconds in a command that takes a few hundred).
_LOADED = ("numpy", "scipy")


@functools.lru_cache(maxsize=1)
def library_versions() -> tuple[tuple[str, str], ...]:
    """Installed versions of budgetplan and the libraries its numbers depend on."""
    out = []
    for name in _LIBRARIES:
        loaded = getattr(sys.modules.get(name), "__version__", None) if name in _LOADED else None
        if isinstance(loaded, str):
            out.append((name, loaded))
            continue
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            if name == "budgetplan":
                out.append((name, __version__))
            else:
                out.append((name, "not installed"))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True, kw_only=True)
class Guarantee:
    """An (epsilon, delta)-DP guarantee with its provenance.

    Attributes:
        epsilon: the privacy loss bound (``math.inf`` when no finite bound exists).
        delta: the failure probability it holds at.
        method: how it was computed: ``"exact"`` (closed form), ``"pld"``, ``"rdp"``,
            ``"prv"``, ``"classical"``, or a compound such as ``"group(pld)"``,
            ``"mixture-of-gaussians(pld)"``, ``"double-mixture-of-gaussians(pld)"``,
            ``"basic-composition"``.
        adjacency: the neighbouring relation it protects.
        unit: the privacy unit it protects.
        bound: ``"exact"``, ``"upper"`` (pessimistic: the true epsilon is at most this), or
            ``"estimate"`` (an estimate inside ``epsilon_range``).
        epsilon_range: (lower, upper) error band where the method has one (PRV), else None.
        discretization: the PLD / PRV grid spacing, where one was used.
        conversion: how an RDP curve was turned into (epsilon, delta), where one was.
        notes: caveats a reader must see (validity of a formula, a peer library's gap).
        versions: (library, version) pairs of budgetplan and its back-ends.
    """

    epsilon: float
    delta: float
    method: str
    adjacency: Adjacency
    unit: PrivacyUnit
    bound: str = "upper"
    epsilon_range: tuple[float, float] | None = None
    discretization: float | None = None
    conversion: str | None = None
    notes: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = field(default_factory=library_versions)

    def with_notes(self, *notes: str) -> Guarantee:
        return replace(self, notes=self.notes + tuple(n for n in notes if n not in self.notes))

    @property
    def is_finite(self) -> bool:
        return math.isfinite(self.epsilon)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``epsilon`` is ``None`` when no finite bound exists."""
        return {
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta,
            "method": self.method,
            "adjacency": self.adjacency.value,
            "unit": self.unit.to_dict(),
            "bound": self.bound,
            "epsilon_range": list(self.epsilon_range) if self.epsilon_range else None,
            "discretization": self.discretization,
            "conversion": self.conversion,
            "notes": list(self.notes),
            "versions": dict(self.versions),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Guarantee:
        eps = data["epsilon"]
        rng = data.get("epsilon_range")
        return cls(
            epsilon=math.inf if eps is None else float(eps),
            delta=float(data["delta"]),
            method=data["method"],
            adjacency=Adjacency.parse(data["adjacency"]),
            unit=PrivacyUnit.from_dict(data["unit"]),
            bound=data.get("bound", "upper"),
            epsilon_range=tuple(rng) if rng else None,
            discretization=data.get("discretization"),
            conversion=data.get("conversion"),
            notes=tuple(data.get("notes", ())),
            versions=tuple(sorted(data.get("versions", {}).items())),
        )
