"""The typed parts of run records: seeds, model, ledger head and code hashes of the public
record; the data summary and its keyed fingerprint of the private one.

Each is a frozen, validated value read strictly from its JSON object
(``budgetplan.util.typed``): a missing, unknown or malformed field is an error naming it.
Field names are the JSON keys, so ``record.seeds.policy`` reads what ``"seeds": {"policy":
...}`` says. The open tables of a record (seconds by stage, library versions by name, the
training settings, a model's configuration) are :class:`~budgetplan.util.frozen.FrozenMap`
values: read-only, with their values checked where their kind is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from budgetplan.errors import InvalidParameterError
from budgetplan.util import typed, validate
from budgetplan.util.frozen import FrozenMap, freeze, table

__all__ = [
    "VOCABULARY_FILE", "Seeds", "ModelInfo", "LedgerHead", "CodeHashes", "Fingerprint", "DataSummary",
    "sha256_hex", "number", "json_value", "json_table", "number_table", "text_table", "set_field",
]

_SHA256_HEX = frozenset("0123456789abcdef")
VOCABULARY_FILE = "vocabulary.json"  # beside model.pt: the non-sensitive values each model row stands for


def set_field(obj: object, name: str, value: object) -> None:
    """Store a validated (normalised) value on a frozen dataclass from its ``__post_init__``."""
    object.__setattr__(obj, name, value)


def sha256_hex(name: str, value: object) -> str:
    if not isinstance(value, str) or len(value) != 64 or not set(value) <= _SHA256_HEX:
        raise InvalidParameterError(f"{name} must be a sha256 hex digest, got {value!r}")
    return value


def number(name: str, value: object) -> int | float:
    """A finite non-negative number, kept as the int or float it is (so its JSON does not change)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}")
    validate.non_negative(name, value)
    return value


def json_value(name: str, value: object) -> Any:
    """Any JSON value, frozen (objects as FrozenMap, lists as tuples)."""
    del name
    return freeze(value)


def json_table(name: str, value: object) -> FrozenMap[Any]:
    """An open JSON object (settings, a configuration), frozen deeply."""
    return table(name, value, json_value)


def number_table(name: str, value: object) -> FrozenMap[int | float]:
    return table(name, value, number)


def text_table(name: str, value: object) -> FrozenMap[str]:
    return table(name, value, typed.text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Seeds:
    """Where the run's randomness came from: ``policy`` "csprng" (os.urandom, ``seed`` None) or
    "seeded" (a debugging run whose noise derives from ``seed``), and a ``note`` saying which."""

    policy: str
    seed: int | None
    note: str

    def __post_init__(self) -> None:
        typed.choice("seeds.policy", self.policy, ("csprng", "seeded"))
        set_field(self, "seed", typed.optional(validate.non_negative_int, "seeds.seed", self.seed))
        if (self.policy == "seeded") != (self.seed is not None):
            raise InvalidParameterError(f"seeds.seed is {self.seed!r} under the {self.policy!r} policy: a seeded "
                                        "run names its seed, a csprng run none")
        typed.text("seeds.note", self.note)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelInfo:
    """The final model: its ``kind`` (the model builder's name), its ``config`` (the builder's
    arguments, an open table), which model was kept (``final``: "full", "truncated", "walr"),
    ``sha256``, the digest of the ``model.pt`` the run wrote (None, and absent, for a run
    without a run directory), and ``vocabulary_sha256``, the digest of the ``vocabulary.json``
    written beside it (the non-sensitive values the model's rows stand for; None, and absent,
    when the run wrote none, and in records of schema 2, written before it was recorded)."""

    kind: str
    config: FrozenMap[Any] = typed.loaded(json_table)
    final: str
    sha256: str | None = typed.omit_if_none()
    vocabulary_sha256: str | None = typed.omit_if_none()

    def __post_init__(self) -> None:
        typed.text("model.kind", self.kind)
        set_field(self, "config", json_table("model.config", self.config))
        typed.text("model.final", self.final)
        typed.optional(sha256_hex, "model.sha256", self.sha256)
        typed.optional(sha256_hex, "model.vocabulary_sha256", self.vocabulary_sha256)


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerHead:
    """Where a write-ahead ledger ended: its last line's hash and its count of lines."""

    head: str
    lines: int

    def __post_init__(self) -> None:
        sha256_hex("ledger.head", self.head)
        set_field(self, "lines", validate.non_negative_int("ledger.lines", self.lines))


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeHashes:
    """sha256 of the installed sources that ran (``budgetplan.util.codehash``), one per package."""

    budgetplan: str
    trainers: str

    def __post_init__(self) -> None:
        sha256_hex("code.budgetplan", self.budgetplan)
        sha256_hex("code.trainers", self.trainers)

    def by_package(self) -> dict[str, str]:
        """{package: hash}, the form ``budgetplan.util.codehash.code_fingerprint`` returns."""
        return {"budgetplan": self.budgetplan, "trainers": self.trainers}


def _count(name: str, value: object) -> int:
    return validate.non_negative_int(name, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fingerprint:
    """The keyed fingerprint of the training data (``trainers.data.fingerprint``): HMAC-SHA256
    over ``columns`` of ``rows`` rows, with the key named by ``key_id`` (the key stays with the
    data owner)."""

    hmac_sha256: str
    key_id: str
    columns: tuple[str, ...]
    rows: int

    def __post_init__(self) -> None:
        sha256_hex("data.fingerprint.hmac_sha256", self.hmac_sha256)
        typed.text("data.fingerprint.key_id", self.key_id)
        if not isinstance(self.columns, (list, tuple)):
            raise InvalidParameterError(f"data.fingerprint.columns must be a list of names, got {self.columns!r}")
        set_field(self, "columns", tuple(typed.text("data.fingerprint.columns[]", c) for c in self.columns))
        set_field(self, "rows", _count("data.fingerprint.rows", self.rows))


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSummary:
    """What a run read, as the data owner's record holds it.

    Attributes:
        path, format: where the training data was read and how (``path`` None for tensors
            handed to ``trainers.private``).
        rows_in, rows_used: rows read, and rows trained on after capping.
        capping: the capping statistics (an open table), None without a cap.
        fingerprint: the keyed fingerprint of the rows.
        prepared: a prepared data set's manifest facts (an open table); absent otherwise.
        rank_rows: the rows each process held (several processes); absent otherwise.
        timings: when the plan's N is a DP count, the run's seconds by stage (kept privately);
            ``sizes_ledger`` where its private batch-size ledger ended. Both absent otherwise.
    """

    path: str | None
    format: str
    rows_in: int
    rows_used: int
    capping: FrozenMap[Any] | None = typed.loaded(json_table, optional=True)
    fingerprint: Fingerprint = typed.nested(Fingerprint)
    prepared: FrozenMap[Any] | None = typed.loaded(json_table, omit=True)
    rank_rows: tuple[int, ...] | None = typed.omit_if_none()
    timings: FrozenMap[int | float] | None = typed.loaded(number_table, omit=True)
    sizes_ledger: LedgerHead | None = typed.nested(LedgerHead, omit=True)

    def __post_init__(self) -> None:
        typed.optional(typed.text, "data.path", self.path)
        typed.text("data.format", self.format)
        for name in ("rows_in", "rows_used"):
            set_field(self, name, _count(f"data.{name}", getattr(self, name)))
        set_field(self, "capping", typed.optional(json_table, "data.capping", self.capping))
        if not isinstance(self.fingerprint, Fingerprint):
            raise InvalidParameterError(f"data.fingerprint must be a keyed fingerprint, got {self.fingerprint!r}")
        set_field(self, "prepared", typed.optional(json_table, "data.prepared", self.prepared))
        if self.rank_rows is not None:
            set_field(self, "rank_rows", tuple(_count("data.rank_rows[]", r) for r in self.rank_rows))
        set_field(self, "timings", typed.optional(number_table, "data.timings", self.timings))
        if self.sizes_ledger is not None and not isinstance(self.sizes_ledger, LedgerHead):
            raise InvalidParameterError(f"data.sizes_ledger must be a ledger head, got {self.sizes_ledger!r}")
