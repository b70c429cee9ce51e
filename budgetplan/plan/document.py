"""Plans: the frozen, versioned, hashed result a privacy engineer signs off and a trainer runs.

A plan file is JSON in one canonical form (sorted keys, two-space indent, shortest
round-trip floats) with a ``sha256`` over the canonical compact JSON of everything else.
Loading checks the schema version, the hash, and that the file is byte for byte the
canonical form of its content, so one flipped byte anywhere (whitespace included) is
detected. ``budgetplan.audit.verify`` goes further and recomputes every number.

Schema history (``schema_version``): 1, the first. A later version gets a new number and
a loader for this one in ``_LOADERS``; a field's meaning never changes within a version.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from budgetplan.accounting.guarantee import Guarantee, library_versions
from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.plan.parts import UnitAlternative, unit_alternatives, versions_table
from budgetplan.plan.phases import (
    CalibrationPhase,
    CountPhase,
    DPSGDPhase,
    Phase,
    RRPhase,
    WALRPhase,
    phase_from_dict,
    phase_to_dict,
)
from budgetplan.plan.schema import check_plan_types
from budgetplan.plan.tuning import TuningAccounting, read_tuning
from budgetplan.scenario.model import Scenario
from budgetplan.scenario.split_rules import SplitChoice
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util.fileio import write_atomic
from budgetplan.util.frozen import FrozenMap
from budgetplan.util.typed import from_json_object, to_json

__all__ = ["SCHEMA_VERSION", "Phase", "Plan", "load_plan", "write_atomic", "canonical_json", "parse_json"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A complete plan. Build one with ``budgetplan.planning.planner.build_plan``.

    Attributes:
        scenario: the validated scenario it was planned from.
        epsilon, delta: the total budget (delta resolved from its policy).
        adjacency, unit, dataset_size: what the guarantees protect, and N (a DP count of
            the rows when the plan has a ``count`` phase).
        run_epsilon, run_delta: the budget of one training run, the basic budget its phases'
            targets add up to (the total, unless tuning over several configurations is
            declared; under a PLD budget, the largest epsilon whose phases' PLD total is
            within the budget, above it).
        phases: the phases in order.
        total: basic composition of the phases (one run).
        total_pld: PLD composition of the phases where their adjacencies agree, else None.
        total_pld_note: why there is no PLD total, when there is none.
        tuning: the accounting of the declared hyperparameter selection
            (``tuning.TuningAccounting``), or None.
        unit_alternatives: for units capped at K > 1, what each way of bounding a unit costs
            (``parts.UnitAlternative``).
        warnings: doubtful but legal settings.
        versions: budgetplan and its back-ends, as planned (a read-only table by name).
        split: Hybrid under a table-driven split rule (``alpha-by-eps``): the rule, the
            epsilon it split, the alpha it resolved to and why (``split_rules.SplitChoice``);
            None otherwise (a fixed rule's alpha is in its spelling).
    """

    scenario: Scenario
    epsilon: float
    delta: float
    adjacency: Adjacency
    unit: PrivacyUnit
    dataset_size: int
    run_epsilon: float
    run_delta: float
    phases: tuple[Phase, ...]
    total: Guarantee
    total_pld: Guarantee | None
    total_pld_note: str | None
    tuning: TuningAccounting | None
    unit_alternatives: tuple[UnitAlternative, ...]
    warnings: tuple[str, ...]
    versions: FrozenMap[str]
    split: SplitChoice | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "versions", versions_table("versions", self.versions))
        object.__setattr__(self, "unit_alternatives", tuple(self.unit_alternatives))
        for a in self.unit_alternatives:
            if not isinstance(a, UnitAlternative):
                raise InvalidParameterError(f"unit_alternatives must hold UnitAlternative entries, got {a!r}")
        if self.tuning is not None and not isinstance(self.tuning, TuningAccounting):
            raise InvalidParameterError(f"tuning must be a TuningAccounting, got {self.tuning!r}")
        if self.split is not None and not isinstance(self.split, SplitChoice):
            raise InvalidParameterError(f"split must be a SplitChoice, got {self.split!r}")

    @property
    def guarantee(self) -> Guarantee:
        """The headline guarantee: with tuning included when tuning is declared; the PLD total when the
        budget is one (``[accounting].composition = "pld"``, or "auto" resolved to it); else the basic total."""
        if self.tuning is not None:
            return self.tuning.guarantee
        if self.pld_budget and self.total_pld is not None:
            return self.total_pld
        return self.total

    @property
    def pld_budget(self) -> bool:
        """Whether the phases' PLD composition, not their basic sum, is what meets the budget (a plan's
        scenario has "auto" resolved: ``budgetplan.planning.planner.build_plan``)."""
        return self.scenario.composition == "pld"

    @property
    def tuned(self) -> bool:
        """Whether the plan declares a grid of configurations and one selection among them."""
        return self.tuning is not None and self.tuning.is_grid

    @property
    def nonsensitive_fixed(self) -> bool:
        """Whether the adjacency holds the non-sensitive features fixed (so they may be used as public).

        Label DP (RR, WALR) and semi-sensitive DP (Hybrid) change only labels and sensitive
        features; plain DP-SGD protects whole examples, non-sensitive columns included.
        """
        return self.scenario.algorithm in ("rr", "walr", "hybrid") and self.adjacency is Adjacency.REPLACE_ONE

    @property
    def rr(self) -> RRPhase | None:
        """The randomized-response phase, if the plan has one."""
        return next((p for p in self.phases if isinstance(p, RRPhase)), None)

    @property
    def dpsgd(self) -> DPSGDPhase | None:
        """The DP-SGD phase, if the plan has one."""
        return next((p for p in self.phases if isinstance(p, DPSGDPhase)), None)

    @property
    def count(self) -> CountPhase | None:
        """The DP count of N the plan accounts, if its N is one (then N is not the exact row count)."""
        return next((p for p in self.phases if isinstance(p, CountPhase)), None)

    @property
    def calibration(self) -> CalibrationPhase | None:
        """The intercept calibration's release, if the plan has one (plans with a DP-SGD phase)."""
        return next((p for p in self.phases if isinstance(p, CalibrationPhase)), None)

    @property
    def free_calibration(self) -> bool:
        """Whether the trainer shifts the intercept at no cost: a calibrated run with RR and no DP-SGD phase."""
        return self.scenario.calibration is not None and self.rr is not None and self.dpsgd is None

    @property
    def walr(self) -> WALRPhase | None:
        """The WALR release, if the plan has one."""
        return next((p for p in self.phases if isinstance(p, WALRPhase)), None)

    def content(self) -> dict[str, Any]:
        """Everything the hash covers (``split`` only where there is one: other plans keep their bytes)."""
        out: dict[str, Any] = {
            "schema_version": self.schema_version,
            "versions": to_json(self.versions),
            "scenario": self.scenario.to_dict(),
            "budget": {"epsilon": self.epsilon, "delta": self.delta},
            "privacy": {"adjacency": self.adjacency.value, "unit": self.unit.to_dict(),
                        "dataset_size": self.dataset_size},
            "run_budget": {"epsilon": self.run_epsilon, "delta": self.run_delta},
            "phases": [phase_to_dict(p) for p in self.phases],
            "total": {"basic": self.total.to_dict(),
                      "pld": self.total_pld.to_dict() if self.total_pld else None,
                      "pld_note": self.total_pld_note},
            "tuning": to_json(self.tuning),
            "unit_alternatives": to_json(self.unit_alternatives),
            "warnings": list(self.warnings),
        }
        if self.split is not None:
            out["split"] = to_json(self.split)
        return out

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.content()).encode("ascii")).hexdigest()

    def to_json(self) -> str:
        """The canonical plan file text."""
        return _pretty({**self.content(), "sha256": self.sha256})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        version = data.get("schema_version")
        loader = _LOADERS.get(version) if isinstance(version, int) else None
        if loader is None:
            raise PlanMismatchError(
                f"schema_version {version!r} is not one this budgetplan reads ({', '.join(map(str, _LOADERS))})")
        return loader(data)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Parse and check integrity (schema, hash, canonical form); numbers are not recomputed."""
        data = parse_json(text, "plan")
        stored = data.get("sha256")
        try:
            plan = cls.from_dict(data)
        except PlanMismatchError:
            raise
        except InvalidParameterError as exc:
            raise PlanMismatchError(f"plan does not match schema {data.get('schema_version')!r}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanMismatchError(f"plan does not match schema {data.get('schema_version')!r}: {exc!r}") from None
        if stored != plan.sha256:
            raise PlanMismatchError(f"sha256 mismatch: the file says {stored!r}, its content hashes to {plan.sha256}")
        if plan.to_json() != text:
            raise PlanMismatchError("plan file is not in canonical form: it was edited after it was written")
        return plan


def _load_v1(d: dict[str, Any]) -> Plan:
    check_plan_types(d)
    total = d["total"]
    return Plan(
        scenario=Scenario.from_dict(d["scenario"]),
        epsilon=d["budget"]["epsilon"], delta=d["budget"]["delta"],
        adjacency=Adjacency.parse(d["privacy"]["adjacency"]), unit=PrivacyUnit.from_dict(d["privacy"]["unit"]),
        dataset_size=d["privacy"]["dataset_size"],
        run_epsilon=d["run_budget"]["epsilon"], run_delta=d["run_budget"]["delta"],
        phases=tuple(phase_from_dict(p, f"phases[{i}]") for i, p in enumerate(d["phases"])),
        total=Guarantee.from_dict(total["basic"]),
        total_pld=Guarantee.from_dict(total["pld"]) if total["pld"] else None,
        total_pld_note=total["pld_note"], tuning=read_tuning("tuning", d["tuning"]),
        unit_alternatives=unit_alternatives("unit_alternatives", d["unit_alternatives"]), warnings=tuple(d["warnings"]),
        versions=versions_table("versions", d["versions"]),
        split=None if d.get("split") is None else from_json_object(SplitChoice, d["split"], "split"), schema_version=1,
    )


_LOADERS = {1: _load_v1}


def current_versions() -> FrozenMap[str]:
    """budgetplan and its back-ends as installed, as a plan records them."""
    return versions_table("versions", dict(library_versions()))


def canonical_json(obj: object) -> str:
    """Compact, sorted, ASCII JSON; NaN and infinity are refused (they are not JSON)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def parse_json(text: str, what: str) -> dict[str, Any]:
    """``text`` as one JSON object, strictly: NaN and Infinity are not JSON and are refused, as
    are nesting deeper than the parser's stack and integers too long to read.

    Raises:
        PlanMismatchError: naming ``what`` ("plan", "run record") and the problem.
    """
    def refuse(constant: str) -> NoReturn:
        raise ValueError(f"{constant} is not a JSON number")

    try:
        data = json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise PlanMismatchError(f"{what} is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, NaN, integers past Python's digit limit
        raise PlanMismatchError(f"{what} is not valid JSON: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise PlanMismatchError(f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def _pretty(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


def load_plan(path: str | Path) -> Plan:
    """Read a plan file, checking its schema, hash and canonical form.

    The bytes are compared, not text read with universal newlines: a plan whose line ends
    were converted (CRLF) is not the file that was signed off.
    """
    path = Path(path)
    if not str(path).strip():
        raise InvalidParameterError("plan file path is empty")
    try:
        text = path.read_bytes().decode("ascii")
    except FileNotFoundError:
        raise InvalidParameterError(f"plan file not found: {path}") from None
    except UnicodeDecodeError:
        raise PlanMismatchError(f"{path.name}: plan file is not ASCII JSON: it was edited after it was written") \
            from None
    except OSError as exc:
        raise InvalidParameterError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    try:
        return Plan.from_json(text)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{path.name}: {exc}", exc.problems) from None


def finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None
