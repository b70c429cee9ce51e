"""Run records: what actually ran, written by a trainer, read by the auditor.

A record is canonical JSON with a ``sha256`` over the rest, like a plan: it names the
plan it executed (by hash), the data it ran on (a fingerprint), the seed policy, what each
phase did (labels flipped, noise drawn, steps taken), the metrics, timings, device and
library versions. Trainers write it last, atomically, so a run directory either has a
complete record or none.

Schema history (``schema_version``): 1, the first.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.plan import canonical_json, parse_json, write_atomic

__all__ = ["RunRecord", "load_record", "RECORD_SCHEMA_VERSION"]

RECORD_SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One training run.

    Attributes:
        plan_sha256: the executed plan's hash (None for a non-private baseline).
        private: False for a non-private baseline run (no guarantee applies).
        algorithm: the plan's algorithm, or "non-private".
        data: the data fingerprint (path, format, rows in, rows used, sha256, capping).
        seeds: {"policy": "csprng" | "seeded", "seed": int | None}.
        phases: per phase what ran (name, counts of flipped labels, steps, noise draws, ...).
        metrics: evaluation metrics by split name (e.g. {"eval": {...}}), possibly empty.
        model: {"kind": ..., "config": {...}}; training: non-privacy settings (lr, loss, ...).
        timings: seconds by stage; device: where it ran; versions: library versions.
        status: "completed".
    """

    plan_sha256: str | None
    private: bool
    algorithm: str
    data: dict
    seeds: dict
    phases: list
    metrics: dict
    model: dict
    training: dict
    timings: dict
    device: str
    versions: dict
    status: str = "completed"
    notes: list = field(default_factory=list)
    schema_version: int = RECORD_SCHEMA_VERSION

    def content(self) -> dict:
        return {
            "schema_version": self.schema_version, "plan_sha256": self.plan_sha256, "private": self.private,
            "algorithm": self.algorithm, "data": self.data, "seeds": self.seeds, "phases": self.phases,
            "metrics": self.metrics, "model": self.model, "training": self.training, "timings": self.timings,
            "device": self.device, "versions": self.versions, "status": self.status, "notes": self.notes,
        }

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.content()).encode("ascii")).hexdigest()

    def to_json(self) -> str:
        return json.dumps({**self.content(), "sha256": self.sha256}, sort_keys=True, indent=2,
                          ensure_ascii=True, allow_nan=False) + "\n"

    def write(self, path: str | Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str) -> "RunRecord":
        data = parse_json(text, "run record")
        if data.get("schema_version") != RECORD_SCHEMA_VERSION:
            raise PlanMismatchError(f"run record schema_version {data.get('schema_version')!r} is not one this "
                                    f"budgetplan reads ({RECORD_SCHEMA_VERSION})")
        stored = data.pop("sha256", None)
        try:
            record = cls(**data)
        except TypeError as exc:
            raise PlanMismatchError(f"run record does not match its schema: {exc}") from None
        if stored != record.sha256:
            raise PlanMismatchError(f"run record sha256 mismatch: the file says {stored!r}, its content hashes to "
                                    f"{record.sha256}")
        return record


def load_record(path: str | Path) -> RunRecord:
    path = Path(path)
    if path.is_dir():
        path = path / "run.json"
    try:
        text = path.read_bytes().decode("ascii")
    except FileNotFoundError:
        raise InvalidParameterError(f"run record not found: {path}") from None
    except UnicodeDecodeError:
        raise PlanMismatchError(f"{path}: run record is not ASCII JSON") from None
    except OSError as exc:
        raise InvalidParameterError(f"cannot read run record {path}: {exc.strerror or exc}") from None
    try:
        return RunRecord.from_json(text)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{path.name}: {exc}") from None
