"""Run records: what actually ran, split by who may see it.

A run writes two records:

* ``run.json``, the *public* record, which may travel with the model: the executed plan's
  hash, what each phase did in terms the guarantee covers (steps, Poisson batch sizes,
  noise std and draws, flip probability, RR flips when their count is independent of the
  data), the seed policy, the model and training settings, the code, device and library
  versions, the write-ahead ledger's head, and the hash of the private record. Nothing in
  it is a statistic of the private data that the guarantee does not cover.
* ``private/record.json``, the *data owner's* record, which stays with the data: the data
  path and row counts, capping statistics, the keyed data fingerprint (HMAC-SHA256 with a
  key that never leaves the data owner), data-dependent phase statistics (the fraction of
  clipped examples, WALR's clipped rows, a baseline's validation curve), the encoding and
  metrics on private labels.

When the plan's N is a DP count (a ``count`` phase), the true row count is what is
protected, so everything that grows with it moves to the private record: the public
``rows_used`` is the plan's N, the DP-SGD entry lists the fields it ``withheld`` (the
batch sizes, the chunks they filled, peak memory), which the private statistics hold,
and timings are kept privately.

Both are canonical JSON with a ``sha256`` over the rest; the public record names the
private one by its hash, so neither can be swapped. Every phase entry is a frozen,
validated type, read strictly: a missing, unknown or malformed field is an error naming it
(an auditor must never pass on evidence that is not there).

Schema history (``schema_version``): 1, one record with data statistics in it (no longer
written; refused with a message); 2, the public and private split; 3, the model part names
the ``vocabulary.json`` the run wrote by its digest (``model.vocabulary_sha256``): in a
record of schema 3 its absence says the run wrote none, in one of schema 2 only that it was
not recorded. Records of schema 2 are still read and keep their bytes. Other fields added
since 2 are optional and absent where they do not apply (``tuning``, ``one_run``,
``processes``, the private DP-SGD ``evidence``), so records without them keep their bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeAlias, TypeVar

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.plan import canonical_json, parse_json, write_atomic
from budgetplan.record.evidence import read_evidence
from budgetplan.record.parts import (
    CodeHashes,
    DataSummary,
    LedgerHead,
    ModelInfo,
    Seeds,
    json_table,
    number_table,
    set_field,
    sha256_hex,
    text_table,
)
from budgetplan.util import typed, validate
from budgetplan.util.frozen import FrozenMap

__all__ = [
    "RECORD_SCHEMA_VERSION",
    "READ_SCHEMA_VERSIONS",
    "PRIVATE_SCHEMA_VERSION",
    "RRRun",
    "DPSGDRun",
    "WALRRun",
    "CalibrationRun",
    "BaselineRun",
    "PhaseRun",
    "RRStats",
    "DPSGDStats",
    "WALRStats",
    "CalibrationStats",
    "BaselineStats",
    "PhaseStats",
    "PrivateRecord",
    "RunRecord",
    "TunedRun",
    "Selection",
    "TuningRecord",
    "load_record",
    "phase_runs",
    "phase_run_dict",
    "register_phase_entries",
    "records_phase",
    "PRIVATE_DIR",
    "WITHHELD_WITH_N",
]

RECORD_SCHEMA_VERSION = 3
# the public record schemas read: 2 (no vocabulary digest) and 3 (RECORD_SCHEMA_VERSION), which is written
READ_SCHEMA_VERSIONS = (2, RECORD_SCHEMA_VERSION)
PRIVATE_SCHEMA_VERSION = 1
PRIVATE_DIR = "private"

_E = TypeVar("_E")
_R = TypeVar("_R")

# The DP-SGD facts that grow with the true row count: withheld from the public record, all
# of them, when the plan's N is a DP count (batch sizes are Binomial(N, q) draws).
WITHHELD_WITH_N = ("batch_sizes_observed", "batch_size_sum", "batch_size_sumsq", "batch_size_min",
                   "batch_size_max", "chunks", "peak_memory")


_set = set_field
_hex = sha256_hex


def _count(name: str, value: object) -> int:
    return validate.non_negative_int(name, value)


def _seconds(name: str, value: object) -> float:
    return validate.non_negative(name, value)


def _losses(name: str, value: object) -> tuple[float | None, ...]:
    """Per-epoch losses; null where an epoch's loss was not finite (JSON has no NaN)."""
    if not isinstance(value, (list, tuple)):
        raise InvalidParameterError(f"{name} must be a list of numbers, got {value!r}")
    return tuple(None if v is None else validate.finite(f"{name}[{i}]", v) for i, v in enumerate(value))


def finite_or_none(x: float) -> float | None:
    """A loss value as a record holds it: None where it is not finite."""
    return float(x) if math.isfinite(x) else None


# ------------------------------------------------------------------ public phase entries


@dataclass(frozen=True, slots=True, kw_only=True)
class RRRun:
    """What the RR phase did, as the public record shows it.

    ``labels_flipped`` and ``flip_probability`` are public under a uniform flip
    probability: the flips are Bernoulli(rho) draws independent of the labels, so their
    count says nothing about the data. Under eps/K_i the probability depends on each unit's
    size, so both move to the private record and are None here.
    ``epoch_loss`` is the loss on the noisy labels and non-sensitive features: computed from
    the release, so covered by the guarantee (post-processing).

    With a held-out part (the plan's ``validation_fraction``): ``validation_rows`` held out,
    the epochs done at each check (``validation_checks``), the debiased log loss and AUC of
    the truncated model on their RR labels there, the index of the check whose state was
    kept (``validation_kept``; None when no check scored) and why the phase ``stopped``
    ("patience" or "epochs"); the score the checks compared (``validation_by``: "log_loss"
    or "auc"; absent in records made before it was a choice, which compared the log loss)
    and, where a moving average of the weights was scored too, whether each check's better
    state was the average (``validation_averaged``). With several (learning rate, L2) pairs,
    each pair's kept log loss and AUC (``candidate_log_loss``, ``candidate_auc``) and the
    pair kept. All of it is computed from the release and non-sensitive features:
    post-processing, covered by the guarantee. Absent without a held-out part.
    """

    name: ClassVar[str] = "rr"
    labels: int
    labels_flipped: int | None
    flip_probability: float | None
    per_impression_rule: str
    release_sha256: str
    epochs: int
    batch_size: int
    batches: int
    loss: str
    epoch_loss: tuple[float | None, ...]
    model: str
    seconds: float
    validation_rows: int | None = typed.omit_if_none()
    validation_checks: tuple[float, ...] | None = typed.omit_if_none()
    validation_log_loss: tuple[float | None, ...] | None = typed.omit_if_none()
    validation_auc: tuple[float | None, ...] | None = typed.omit_if_none()
    validation_kept: int | None = typed.omit_if_none()
    stopped: str | None = typed.omit_if_none()
    validation_by: str | None = typed.omit_if_none()
    validation_averaged: tuple[bool, ...] | None = typed.omit_if_none()
    candidate_lr: tuple[float, ...] | None = typed.omit_if_none()
    candidate_weight_decay: tuple[float, ...] | None = typed.omit_if_none()
    candidate_log_loss: tuple[float | None, ...] | None = typed.omit_if_none()
    candidate_auc: tuple[float | None, ...] | None = typed.omit_if_none()
    candidate_chosen: int | None = typed.omit_if_none()

    def __post_init__(self) -> None:
        _set(self, "labels", validate.positive_int("labels", self.labels))
        self._check_validation()
        self._check_candidates()
        if (self.labels_flipped is None) != (self.flip_probability is None):
            raise InvalidParameterError("labels_flipped and flip_probability are public together or not at all")
        if self.labels_flipped is not None:
            flipped = _count("labels_flipped", self.labels_flipped)
            if flipped > self.labels:
                raise InvalidParameterError(f"labels_flipped ({flipped}) exceeds labels ({self.labels})")
            _set(self, "labels_flipped", flipped)
            _set(self, "flip_probability", validate.open_unit("flip_probability", self.flip_probability))
        typed.text("per_impression_rule", self.per_impression_rule)
        _hex("release_sha256", self.release_sha256)
        for name in ("epochs", "batch_size"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _set(self, "batches", _count("batches", self.batches))
        typed.text("loss", self.loss)
        _set(self, "epoch_loss", _losses("epoch_loss", self.epoch_loss))
        typed.text("model", self.model)
        _set(self, "seconds", _seconds("seconds", self.seconds))

    def _check_candidates(self) -> None:
        fields = (self.candidate_lr, self.candidate_weight_decay, self.candidate_log_loss, self.candidate_chosen)
        if all(v is None for v in fields):
            return
        if any(v is None for v in fields) or self.validation_rows is None:
            raise InvalidParameterError("an RR entry's candidate_* fields come together, with validation_rows")
        rates = typed.float_tuple("candidate_lr", self.candidate_lr or (), validate.positive)
        decays = typed.float_tuple("candidate_weight_decay", self.candidate_weight_decay or (), validate.non_negative)
        losses = _losses("candidate_log_loss", self.candidate_log_loss or ())
        if not len(rates) == len(decays) == len(losses) >= 2:
            raise InvalidParameterError("candidate_lr, candidate_weight_decay and candidate_log_loss must have one "
                                        "entry per candidate, at least two")
        if self.candidate_auc is not None:
            areas = _losses("candidate_auc", self.candidate_auc)
            if len(areas) != len(rates):
                raise InvalidParameterError(f"candidate_auc must have one entry per candidate ({len(rates)}), "
                                            f"got {len(areas)}")
            _set(self, "candidate_auc", areas)
        chosen = _count("candidate_chosen", self.candidate_chosen)
        if chosen >= len(rates):
            raise InvalidParameterError(f"candidate_chosen ({chosen}) names no candidate (there are {len(rates)})")
        for name, value in (("candidate_lr", rates), ("candidate_weight_decay", decays),
                            ("candidate_log_loss", losses), ("candidate_chosen", chosen)):
            _set(self, name, value)

    def _check_validation(self) -> None:
        if self.validation_rows is None:
            rest = (self.validation_checks, self.validation_log_loss, self.validation_auc, self.validation_kept,
                    self.stopped, self.validation_by, self.validation_averaged, self.candidate_auc)
            if any(v is not None for v in rest):
                raise InvalidParameterError("an RR entry's validation fields come with validation_rows")
            return
        rows = validate.positive_int("validation_rows", self.validation_rows)
        if rows >= self.labels:
            raise InvalidParameterError(f"validation_rows ({rows}) must be below labels ({self.labels})")
        _set(self, "validation_rows", rows)
        checks = typed.float_tuple("validation_checks", self.validation_checks or (), validate.positive)
        _set(self, "validation_checks", checks)
        losses = _losses("validation_log_loss", self.validation_log_loss or ())
        areas = _losses("validation_auc", self.validation_auc or ())
        _set(self, "validation_log_loss", losses)
        _set(self, "validation_auc", areas)
        if not len(checks) == len(losses) == len(areas):
            raise InvalidParameterError("validation_checks, validation_log_loss and validation_auc must have one "
                                        "entry per check")
        kept = typed.optional(_count, "validation_kept", self.validation_kept)
        if kept is not None and kept >= len(checks):
            raise InvalidParameterError(f"validation_kept ({kept}) names no check (there are {len(checks)})")
        _set(self, "validation_kept", kept)
        typed.choice("stopped", self.stopped, ("patience", "epochs"))
        if self.validation_by is not None:
            typed.choice("validation_by", self.validation_by, ("auc", "log_loss"))
        if self.validation_averaged is not None:
            if not isinstance(self.validation_averaged, (list, tuple)):
                raise InvalidParameterError(f"validation_averaged must be a list of booleans, "
                                            f"got {self.validation_averaged!r}")
            flags = tuple(typed.flag(f"validation_averaged[{i}]", v) for i, v in enumerate(self.validation_averaged))
            if len(flags) != len(checks):
                raise InvalidParameterError(f"validation_averaged must have one entry per check ({len(checks)}), "
                                            f"got {len(flags)}")
            _set(self, "validation_averaged", flags)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDRun:
    """What the DP-SGD phase did, as the public record shows it.

    Step counts and batch sizes come from the write-ahead ledger and cover every session
    of the run: ``steps_executed`` is the ledger's count of noisy steps (an interrupted
    step counts), ``steps_lost_to_interruptions`` the counted steps no later session built
    on, summed over every interruption, and the batch-size statistics cover the
    ``batch_sizes_observed`` steps whose size the ledger holds. Poisson batches are drawn
    before any data is read, so their sizes reveal nothing beyond N. When N is private (a
    DP count), ``withheld`` names :data:`WITHHELD_WITH_N`, those fields are null here and
    the private statistics hold them (:meth:`restored` puts them back).

    A phase run by several processes says how many (``processes``) and how many noisy
    steps each of them counted on its own this session (``rank_steps``, in rank order);
    the ledger holds each step's per-rank batch sizes. Both are absent for one process.
    A phase that sampled units and clipped each unit's summed gradient once says
    ``clipped_per = "unit"`` (its batch sizes count units); absent when examples were.
    A phase on a part of the units (a units split) says how many rows its part held
    (``part_rows``: the population its batches were drawn from, the same in every
    replace-one neighbour); absent when it trained on every row.
    """

    name: ClassVar[str] = "dpsgd"
    steps_planned: int
    steps_executed: int
    steps_this_session: int
    sessions: int
    steps_lost_to_interruptions: int
    batch_sizes_observed: int | None
    batch_size_expected: float
    batch_size_sum: int | None
    batch_size_sumsq: int | None
    batch_size_min: int | None
    batch_size_max: int | None
    batches_truncated: int
    truncated: bool
    noise_std: float
    noise_multiplier: float
    clipping_norm: float
    sampling_rate: float
    noise_draws: int
    trainable_parameters: int
    model: str
    nonsensitive_tower: str | None
    chunks: int | None
    padded_size: int
    settings: FrozenMap[Any] = typed.loaded(json_table)
    seconds: float
    peak_memory: FrozenMap[Any] | None = typed.loaded(json_table, optional=True)
    withheld: tuple[str, ...] | None = typed.omit_if_none()
    processes: int | None = typed.omit_if_none()
    rank_steps: tuple[int, ...] | None = typed.omit_if_none()
    clipped_per: str | None = typed.omit_if_none()
    part_rows: int | None = typed.omit_if_none()

    def __post_init__(self) -> None:
        _set(self, "part_rows", typed.optional(validate.positive_int, "part_rows", self.part_rows))
        if self.clipped_per not in (None, "unit"):
            raise InvalidParameterError(f"clipped_per must be \"unit\" or absent, got {self.clipped_per!r}")
        if (self.processes is None) != (self.rank_steps is None):
            raise InvalidParameterError("processes and rank_steps go together (a phase run by several processes)")
        if self.processes is not None:
            _set(self, "processes", validate.positive_int("processes", self.processes))
            steps = tuple(_count("rank_steps", s) for s in self.rank_steps or ())
            if len(steps) != self.processes:
                raise InvalidParameterError(f"rank_steps has {len(steps)} entries for {self.processes} processes")
            _set(self, "rank_steps", steps)
        for name in ("steps_planned", "sessions", "trainable_parameters", "padded_size"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        for name in ("steps_executed", "steps_this_session", "steps_lost_to_interruptions", "batches_truncated",
                     "noise_draws"):
            _set(self, name, _count(name, getattr(self, name)))
        if self.withheld is not None:
            if tuple(self.withheld) != WITHHELD_WITH_N:
                raise InvalidParameterError(f"withheld must name {list(WITHHELD_WITH_N)}, got {self.withheld!r}")
            _set(self, "withheld", WITHHELD_WITH_N)
            shown = [name for name in WITHHELD_WITH_N if getattr(self, name) is not None]
            if shown:
                raise InvalidParameterError(f"{shown[0]} is withheld but shown")
        else:
            self._check_withholdable()
        for name in ("batch_size_expected", "noise_std", "noise_multiplier", "clipping_norm"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        _set(self, "sampling_rate", validate.probability("sampling_rate", self.sampling_rate, allow_one=True))
        typed.flag("truncated", self.truncated)
        typed.text("model", self.model)
        typed.optional(typed.text, "nonsensitive_tower", self.nonsensitive_tower)
        _set(self, "settings", json_table("settings", self.settings))
        _set(self, "seconds", _seconds("seconds", self.seconds))

    def _check_withholdable(self) -> None:
        for name in ("batch_sizes_observed", "batch_size_sum", "batch_size_sumsq", "chunks"):
            _set(self, name, _count(name, getattr(self, name)))
        for name in ("batch_size_min", "batch_size_max"):
            _set(self, name, typed.optional(_count, name, getattr(self, name)))
        if (self.batch_size_min is None) != (self.batch_sizes_observed == 0):
            raise InvalidParameterError("batch_size_min/max are null exactly when no batch size was observed")
        _set(self, "peak_memory", json_table("peak_memory", self.peak_memory))

    def withholding(self) -> tuple[DPSGDRun, dict[str, Any]]:
        """(this entry with :data:`WITHHELD_WITH_N` nulled, the withheld values) for a private N."""
        values = {name: getattr(self, name) for name in WITHHELD_WITH_N}
        nulled: dict[str, Any] = dict.fromkeys(WITHHELD_WITH_N)
        return replace(self, withheld=WITHHELD_WITH_N, **nulled), values

    def restored(self, stats: DPSGDStats | None) -> DPSGDRun:
        """The entry with its withheld fields back from the private statistics, validated.

        Raises:
            InvalidParameterError: nothing is withheld, or the statistics do not hold it.
        """
        if self.withheld is None:
            raise InvalidParameterError("the DP-SGD entry withholds nothing")
        if stats is None or stats.withheld is None:
            raise InvalidParameterError("the private record holds no withheld DP-SGD statistics")
        return replace(self, withheld=None, **stats.withheld)


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRRun:
    """WALR's one release, as the public record shows it (clipping counts are private)."""

    name: ClassVar[str] = "walr"
    rows: int
    releases: int
    release_sha256: str
    noise_std: float
    noise_draws: int
    sensitivity: float
    release_seconds: float
    fit_steps: int
    fit_seconds: float

    def __post_init__(self) -> None:
        for name in ("rows", "releases", "noise_draws"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _hex("release_sha256", self.release_sha256)
        for name in ("noise_std", "sensitivity"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        _set(self, "fit_steps", _count("fit_steps", self.fit_steps))
        for name in ("release_seconds", "fit_seconds"):
            _set(self, name, _seconds(name, getattr(self, name)))


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationRun:
    """The intercept calibration's one release, as the public record shows it.

    The released sums, the shift solved from them and the target it met are in the private
    record (:class:`CalibrationStats`).
    """

    name: ClassVar[str] = "calibration"
    rows: int
    releases: int
    release_sha256: str
    coordinates: int
    noise_std: float
    noise_draws: int
    sensitivity: float
    seconds: float

    def __post_init__(self) -> None:
        for name in ("rows", "releases", "coordinates", "noise_draws"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _hex("release_sha256", self.release_sha256)
        for name in ("noise_std", "sensitivity"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        _set(self, "seconds", _seconds("seconds", self.seconds))


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineRun:
    """A non-private baseline's training rule: no guarantee applies.

    Only the rule is here (early stopping on a validation split of the training data, by
    ``validation_split`` "unit" or "row"); how long it trained and its validation curve are
    statistics of the data, in :class:`BaselineStats`.
    """

    name: ClassVar[str] = "non-private"
    max_epochs: int
    patience: int
    validation_fraction: float
    validation_split: str
    selection: str
    batch_size: int
    model: str

    def __post_init__(self) -> None:
        for name in ("max_epochs", "patience", "batch_size"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _set(self, "validation_fraction", validate.open_unit("validation_fraction", self.validation_fraction))
        typed.choice("validation_split", self.validation_split, ("unit", "row"))
        typed.text("selection", self.selection)
        typed.choice("model", self.model, ("full", "truncated"))


PhaseRun: TypeAlias = RRRun | DPSGDRun | WALRRun | CalibrationRun | BaselineRun
_RUN_KINDS: dict[str, type[PhaseRun]] = {k.name: k for k in (RRRun, DPSGDRun, WALRRun, CalibrationRun, BaselineRun)}


# ----------------------------------------------------------------- private phase statistics


@dataclass(frozen=True, slots=True, kw_only=True)
class RRStats:
    """RR statistics that depend on the data: the flips under eps/K_i (per-unit probabilities)."""

    name: ClassVar[str] = "rr"
    labels_flipped: int | None = None
    flip_probability_mean: float | None = None

    def __post_init__(self) -> None:
        _set(self, "labels_flipped", typed.optional(_count, "labels_flipped", self.labels_flipped))
        _set(self, "flip_probability_mean", typed.optional(validate.open_unit, "flip_probability_mean",
                                                            self.flip_probability_mean))


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDStats:
    """The fraction of sampled examples whose gradient was clipped: it moves with one row's data.

    ``withheld``: when the plan's N is a DP count, the public entry's
    :data:`WITHHELD_WITH_N` values (they grow with the true row count).
    ``evidence``: what each noisy step of the session did, measured by the trainer (the noise
    each rank drew, allocation and shuffle participation, units kept whole;
    ``budgetplan.record.evidence``). Private: it describes the secret noise. Absent in records
    written before it was kept, which the audit then fails for want of it.
    """

    name: ClassVar[str] = "dpsgd"
    clipped_fraction: float
    withheld: FrozenMap[Any] | None = typed.loaded(json_table, omit=True)
    evidence: FrozenMap[Any] | None = typed.loaded(json_table, omit=True)

    def __post_init__(self) -> None:
        if self.evidence is not None:
            read_evidence(typed.to_json(self.evidence))  # its structure checked on the JSON form
            _set(self, "evidence", json_table("evidence", self.evidence))
        _set(self, "clipped_fraction", validate.probability("clipped_fraction", self.clipped_fraction,
                                                             allow_zero=True, allow_one=True))
        if self.withheld is not None:
            _set(self, "withheld", json_table("withheld", self.withheld))
            keys = tuple(self.withheld)
            if sorted(keys) != sorted(WITHHELD_WITH_N):
                raise InvalidParameterError(f"withheld must hold {list(WITHHELD_WITH_N)}, got {sorted(keys)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRStats:
    """How many rows and weights WALR clipped, and the largest contribution left."""

    name: ClassVar[str] = "walr"
    rows_clipped: int
    weights_clipped: int
    max_contribution: float

    def __post_init__(self) -> None:
        for name in ("rows_clipped", "weights_clipped"):
            _set(self, name, _count(name, getattr(self, name)))
        _set(self, "max_contribution", validate.non_negative("max_contribution", self.max_contribution))


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationStats:
    """The intercept calibration's release and what was solved from it (``budgetplan.intercept``).

    An RR-only run's free calibration has no release and no public entry: only this.

    Attributes:
        release: the noisy sums of sigmoids, one per shift, then the noisy count of positives
            (empty for the free calibration).
        target_positives: the count of positives the shift met (noisy, or combined with the
            debiased count of the RR labels), and ``target_variance`` its (public) variance.
        mean_prediction_before: the (noisy) mean prediction of the model as trained (shift 0).
        shift: what was added to the model's output bias; ``clamped`` when the target lay
            beyond the grid and the shift is the grid's end.
    """

    name: ClassVar[str] = "calibration"
    release: tuple[float, ...]
    target_positives: float
    target_variance: float
    mean_prediction_before: float
    shift: float
    clamped: bool

    def __post_init__(self) -> None:
        _set(self, "release", typed.float_tuple("release", self.release))
        for name in ("target_positives", "mean_prediction_before", "shift"):
            _set(self, name, validate.finite(name, getattr(self, name)))
        _set(self, "target_variance", validate.positive("target_variance", self.target_variance))
        if not isinstance(self.clamped, bool):
            raise InvalidParameterError(f"clamped must be true or false, got {self.clamped!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BaselineStats:
    """The baseline's training curve on clean labels, and the split it was validated on.

    The validation split was scored ``len(checked_at)`` times, at ``checked_at`` epochs
    (fractional when it was scored within epochs), with ``train_loss`` the training loss
    since the previous check; ``best`` indexes the kept state (None if no check was finite:
    the model diverged).
    """

    name: ClassVar[str] = "non-private"
    checked_at: tuple[float, ...]
    train_loss: tuple[float | None, ...]
    validation_log_loss: tuple[float | None, ...]
    validation_auc: tuple[float | None, ...]
    best: int | None
    stopped: str
    batches: int
    train_rows: int
    validation_rows: int
    validation_units: int | None
    validation_positives: int

    def __post_init__(self) -> None:
        _set(self, "checked_at", typed.float_tuple("checked_at", self.checked_at, validate.positive))
        checks = len(self.checked_at)
        for name in ("train_loss", "validation_log_loss", "validation_auc"):
            _set(self, name, _losses(name, getattr(self, name)))
            if len(getattr(self, name)) != checks:
                raise InvalidParameterError(f"{name} has {len(getattr(self, name))} entries, checked_at {checks}")
        if self.best is not None:
            best = _count("best", self.best)
            if best >= checks or self.validation_log_loss[best] is None:
                raise InvalidParameterError(f"best must index a check with a finite validation loss, got {best}")
            _set(self, "best", best)
        typed.choice("stopped", self.stopped, ("patience", "max_epochs"))
        for name in ("batches", "train_rows", "validation_rows"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _set(self, "validation_units", typed.optional(validate.positive_int, "validation_units",
                                                       self.validation_units))
        positives = _count("validation_positives", self.validation_positives)
        if positives > self.validation_rows:
            raise InvalidParameterError(f"validation_positives ({positives}) exceeds validation_rows "
                                        f"({self.validation_rows})")
        _set(self, "validation_positives", positives)


PhaseStats: TypeAlias = RRStats | DPSGDStats | WALRStats | CalibrationStats | BaselineStats
_STATS_KINDS: dict[str, type[PhaseStats]] = {k.name: k for k in (RRStats, DPSGDStats, WALRStats, CalibrationStats,
                                                     BaselineStats)}


def register_phase_entries(run: type[Any], stats: type[Any]) -> None:
    """Make records read and write a new phase kind's entries: ``run`` in the public record, ``stats`` in the private.

    Each is a frozen dataclass with a ``name`` class variable (the JSON ``name``, the phase
    kind's) that validates its fields and converts with ``budgetplan.util.typed``; what
    depends on the data belongs in ``stats``, which never travels with the model.
    """
    for kinds, entry in ((_RUN_KINDS, run), (_STATS_KINDS, stats)):
        name = getattr(entry, "name", None)
        if not isinstance(name, str) or not name or name in kinds:
            raise ValueError(f"record entry name {name!r} is empty or already registered")
    _RUN_KINDS[run.name] = run
    _STATS_KINDS[stats.name] = stats


def records_phase(name: str) -> bool:
    """Whether a phase of kind ``name`` leaves an entry in the run record (the DP count of N, released
    before planning, leaves none)."""
    return name in _RUN_KINDS and name != BaselineRun.name


def _entries(kinds: dict[str, type[_E]], items: object, where: str) -> tuple[_E, ...]:
    if not isinstance(items, list):
        raise InvalidParameterError(f"{where} must be a list, got {type(items).__name__}")
    out: list[_E] = []
    for i, item in enumerate(items):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise InvalidParameterError(f"{here} must be a JSON object, got {type(item).__name__}")
        name = item.get("name")
        kind = kinds.get(name) if isinstance(name, str) else None
        if kind is None:
            raise InvalidParameterError(f"{here}.name must be one of {', '.join(map(repr, kinds))}, got "
                                        f"{item.get('name')!r}")
        out.append(typed.from_json_object(kind, {k: v for k, v in item.items() if k != "name"}, here))
    return tuple(out)


def _entry_dict(entry: PhaseRun | PhaseStats) -> dict[str, Any]:
    return {"name": entry.name, **typed.to_json_object(entry)}


def phase_runs(items: object, where: str) -> tuple[PhaseRun, ...]:
    """Public phase entries read strictly from their JSON objects (a tuned run lists each configuration's)."""
    return _entries(_RUN_KINDS, items, where)


def phase_run_dict(entry: PhaseRun) -> dict[str, Any]:
    """A public phase entry's JSON object, as records hold it."""
    return _entry_dict(entry)


def _typed(name: str, value: object, kind: type[Any]) -> None:
    if not isinstance(value, kind):
        raise InvalidParameterError(f"{name} must be a {kind.__name__}, got {value!r}")


def _object(name: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParameterError(f"{name} must be a JSON object, got {value!r}")
    return value


def _hashed_json(content: dict[str, Any]) -> str:
    sha = hashlib.sha256(canonical_json(content).encode("ascii")).hexdigest()
    return json.dumps({**content, "sha256": sha}, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n"


def _read_hashed(text: str, what: str) -> tuple[dict[str, Any], str | None]:
    data = parse_json(text, what)
    stored = data.pop("sha256", None)
    return data, stored


# ------------------------------------------------------------------------- tuned runs


@dataclass(frozen=True, slots=True, kw_only=True)
class TunedRun:
    """One configuration of a tuned run: its grid ``index``, the public entries of its phases and
    the DP-SGD learning rate it trained with (None without a DP-SGD phase)."""

    index: int
    phases: tuple[PhaseRun, ...] = typed.loaded(lambda where, value: phase_runs(value, where),
                                                dump=lambda entries: [phase_run_dict(p) for p in entries])
    dpsgd_learning_rate: float | None

    def __post_init__(self) -> None:
        _set(self, "index", validate.non_negative_int("index", self.index))
        _set(self, "phases", tuple(self.phases))
        typed.optional(validate.positive, "dpsgd_learning_rate", self.dpsgd_learning_rate)


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    """The one report-noisy-max release that picked the configuration (``budgetplan.planning.grid``)."""

    phase: str
    mechanism: str
    noise: str
    epsilon: float
    gumbel_scale: float
    candidates: int
    selected: int

    def __post_init__(self) -> None:
        typed.choice("phase", self.phase, ("selection",))
        typed.text("mechanism", self.mechanism)
        typed.text("noise", self.noise)
        for name in ("epsilon", "gumbel_scale"):
            validate.positive(name, getattr(self, name))
        _set(self, "candidates", validate.positive_int("candidates", self.candidates))
        _set(self, "selected", validate.non_negative_int("selected", self.selected))


@dataclass(frozen=True, slots=True, kw_only=True)
class TuningRecord:
    """A tuned run: the ``configurations`` declared, one :class:`TunedRun` per configuration trained,
    the rows of the training part (``training_rows``) and the :class:`Selection`. The record's
    ``phases`` are the selected configuration's; the audit checks each claim against the plan
    and the ledger, so nothing here is checked against the plan."""

    configurations: int
    runs: tuple[TunedRun, ...] = typed.nested_tuple(TunedRun)
    training_rows: int
    selection: Selection = typed.nested(Selection)

    def __post_init__(self) -> None:
        _set(self, "configurations", validate.positive_int("configurations", self.configurations))
        _set(self, "runs", tuple(self.runs))
        _set(self, "training_rows", validate.positive_int("training_rows", self.training_rows))


# ----------------------------------------------------------------------- private record


@dataclass(frozen=True, slots=True, kw_only=True)
class PrivateRecord:
    """The data owner's part of a run record; never travels with the model.

    Attributes:
        plan_sha256: the executed plan (None for a baseline).
        data: what was read (:class:`~budgetplan.record.parts.DataSummary`): path, format,
            rows_in, rows_used, capping statistics and the keyed fingerprint; when the plan's
            N is a DP count also the run's ``timings`` and ``sizes_ledger``, where the private
            batch-size ledger ended.
        phases: data-dependent statistics, one entry per phase of the public record.
        metrics: evaluation metrics by split (computed on private labels): a read-only table.
        encoding: how features were encoded (hash bins, vocabulary sizes, OOV counts, by
            column): a read-only table.
        one_run: a run trained with canaries (``trainers.canary``): the one-run audit's
            guess counts, its verdict on the plan's trade-off curve and its bound
            (``budgetplan.audit.canary.bound_from_scores``, with ``planned_epsilon``,
            ``score`` and ``canary``), a read-only table that ``budgetplan.audit.canary``
            checks field by field (older records hold another form of it). None (and absent)
            otherwise.
    """

    plan_sha256: str | None
    data: DataSummary
    phases: tuple[PhaseStats, ...]
    metrics: FrozenMap[Any]
    encoding: FrozenMap[Any]
    schema_version: int = PRIVATE_SCHEMA_VERSION
    one_run: FrozenMap[Any] | None = None

    def __post_init__(self) -> None:
        typed.optional(_hex, "plan_sha256", self.plan_sha256)
        _typed("data", self.data, DataSummary)
        _set(self, "phases", tuple(self.phases))
        _set(self, "metrics", json_table("metrics", self.metrics))
        _set(self, "encoding", json_table("encoding", self.encoding))
        _set(self, "one_run", typed.optional(json_table, "one_run", self.one_run))

    def content(self) -> dict[str, Any]:
        out = {"schema_version": self.schema_version, "plan_sha256": self.plan_sha256,
               "data": typed.to_json(self.data), "phases": [_entry_dict(p) for p in self.phases],
               "metrics": typed.to_json(self.metrics), "encoding": typed.to_json(self.encoding)}
        if self.one_run is not None:  # only runs with canaries: other records keep their bytes
            out["one_run"] = typed.to_json(self.one_run)
        return out

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.content()).encode("ascii")).hexdigest()

    def to_json(self) -> str:
        return _hashed_json(self.content())

    @classmethod
    def from_json(cls, text: str) -> PrivateRecord:
        data, stored = _read_hashed(text, "the private record")
        if data.get("schema_version") != PRIVATE_SCHEMA_VERSION:
            raise PlanMismatchError(f"private record schema_version {data.get('schema_version')!r} is not one this "
                                    f"budgetplan reads ({PRIVATE_SCHEMA_VERSION})")
        try:
            unknown = sorted(set(data) - {"schema_version", "plan_sha256", "data", "phases", "metrics", "encoding",
                                          "one_run"})
            if unknown:
                raise InvalidParameterError(f"unknown field {unknown[0]!r}")
            record = cls(plan_sha256=data.get("plan_sha256"),
                         data=typed.from_json_object(DataSummary, data.get("data"), "data"),
                         phases=_entries(_STATS_KINDS, data.get("phases"), "phases"),
                         metrics=json_table("metrics", data.get("metrics")),
                         encoding=json_table("encoding", data.get("encoding")),
                         one_run=typed.optional(json_table, "one_run", data.get("one_run")))
        except InvalidParameterError as exc:
            raise PlanMismatchError(f"the private record does not match its schema: {exc}") from None
        if stored != record.sha256:
            raise PlanMismatchError(f"private record sha256 mismatch: the file says {stored!r}, its content hashes to "
                                    f"{record.sha256}")
        return record


# ------------------------------------------------------------------------ public record


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One training run, as it may travel with the model.

    Attributes:
        plan_sha256: the executed plan's hash (None for a non-private baseline).
        private: False for a non-private baseline run (no guarantee applies).
        algorithm: the plan's algorithm, or "non-private".
        rows_used: the rows trained on (the plan's N; public because the plan states it).
            When the plan's N is a DP count, that count: the true one is in the private
            record's ``data.rows_used``.
        seeds: where the randomness came from (:class:`~budgetplan.record.parts.Seeds`).
        phases: what each phase did (typed entries, in the plan's order).
        model: the final model (:class:`~budgetplan.record.parts.ModelInfo`); training: the
            non-privacy settings (lr, loss, ...), an open table of the trainer's settings.
        ledger: where the write-ahead ledger ended (:class:`~budgetplan.record.parts.LedgerHead`),
            or None for a run without a run directory.
        code: sha256 of the installed budgetplan and trainers sources that ran.
        timings, device, versions: seconds (and thread counts) by stage, where it ran, library
            versions by name; the two tables are read-only mappings.
        private_sha256: the hash of the data owner's private record.
        status: "completed".
        tuning: a run of a plan with a grid of configurations (``budgetplan.planning.grid``):
            a :class:`TuningRecord`; ``phases`` are then the selected configuration's. None
            (and absent) otherwise.
        private_part: the private record, when this process holds it (not part of the
            public JSON; written to ``private/record.json``).
    """

    plan_sha256: str | None
    private: bool
    algorithm: str
    rows_used: int
    seeds: Seeds = typed.nested(Seeds)
    phases: tuple[PhaseRun, ...]
    model: ModelInfo = typed.nested(ModelInfo)
    training: FrozenMap[Any] = typed.loaded(json_table)
    ledger: LedgerHead | None = typed.nested(LedgerHead, optional=True)
    code: CodeHashes = typed.nested(CodeHashes)
    timings: FrozenMap[int | float] = typed.loaded(number_table)
    device: str
    versions: FrozenMap[str] = typed.loaded(text_table)
    private_sha256: str
    status: str = "completed"
    notes: tuple[str, ...] = ()
    tuning: TuningRecord | None = typed.nested(TuningRecord, omit=True)
    schema_version: int = RECORD_SCHEMA_VERSION
    private_part: PrivateRecord | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        typed.optional(_hex, "plan_sha256", self.plan_sha256)
        typed.flag("private", self.private)
        if self.private != (self.plan_sha256 is not None):
            raise InvalidParameterError("a private run names its plan, a non-private one none")
        typed.text("algorithm", self.algorithm)
        _set(self, "rows_used", validate.positive_int("rows_used", self.rows_used))
        _typed("seeds", self.seeds, Seeds)
        _set(self, "phases", tuple(self.phases))
        _typed("model", self.model, ModelInfo)
        if type(self.schema_version) is not int or self.schema_version not in READ_SCHEMA_VERSIONS:
            raise InvalidParameterError(f"schema_version must be one of {list(READ_SCHEMA_VERSIONS)}, got "
                                        f"{self.schema_version!r}")
        if self.schema_version < 3 and self.model.vocabulary_sha256 is not None:
            raise InvalidParameterError("model.vocabulary_sha256 is a field of schema 3, not of this record's schema "
                                        f"{self.schema_version}")
        _set(self, "training", json_table("training", self.training))
        _typed("code", self.code, CodeHashes)
        _set(self, "timings", number_table("timings", self.timings))
        _set(self, "versions", text_table("versions", self.versions))
        if self.ledger is not None:
            _typed("ledger", self.ledger, LedgerHead)
        typed.text("device", self.device)
        _hex("private_sha256", self.private_sha256)
        typed.choice("status", self.status, ("completed",))
        _set(self, "notes", tuple(typed.text("notes[]", n) for n in self.notes))
        if self.private_part is not None and self.private_part.sha256 != self.private_sha256:
            raise InvalidParameterError("the private record is not the one this record names")
        if self.tuning is not None:
            _typed("tuning", self.tuning, TuningRecord)

    @property
    def metrics(self) -> FrozenMap[Any]:
        """Evaluation metrics by split (from the private record; empty without it)."""
        return self.private_part.metrics if self.private_part is not None else FrozenMap()

    def phase_of(self, kind: type[_R]) -> _R | None:
        return next((p for p in self.phases if isinstance(p, kind)), None)

    def content(self) -> dict[str, Any]:
        out = {
            "schema_version": self.schema_version, "plan_sha256": self.plan_sha256, "private": self.private,
            "algorithm": self.algorithm, "rows_used": self.rows_used, "seeds": typed.to_json(self.seeds),
            "phases": [_entry_dict(p) for p in self.phases], "model": typed.to_json(self.model),
            "training": typed.to_json(self.training), "ledger": typed.to_json(self.ledger),
            "code": typed.to_json(self.code), "timings": typed.to_json(self.timings), "device": self.device,
            "versions": typed.to_json(self.versions), "private_sha256": self.private_sha256, "status": self.status,
            "notes": list(self.notes),
        }
        if self.tuning is not None:  # only tuned runs have it: other records keep their bytes
            out["tuning"] = typed.to_json(self.tuning)
        return out

    @property
    def sha256(self) -> str:
        return hashlib.sha256(canonical_json(self.content()).encode("ascii")).hexdigest()

    def to_json(self) -> str:
        return _hashed_json(self.content())

    def write(self, directory: str | Path) -> None:
        """Write ``private/record.json`` (when held), then ``run.json`` last: a directory with run.json is complete."""
        directory = Path(directory)
        if self.private_part is not None:
            (directory / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
            write_atomic(directory / PRIVATE_DIR / "record.json", self.private_part.to_json())
        write_atomic(directory / "run.json", self.to_json())

    @classmethod
    def from_json(cls, text: str, private_part: PrivateRecord | None = None) -> RunRecord:
        data, stored = _read_hashed(text, "run record")
        version = data.get("schema_version")
        if type(version) is not int or version not in READ_SCHEMA_VERSIONS:
            hint = (": schema 1 records mixed data statistics into the public record; re-run with this budgetplan"
                    if version == 1 else "")
            raise PlanMismatchError(f"run record schema_version {version!r} is not one this budgetplan reads "
                                    f"({', '.join(map(str, READ_SCHEMA_VERSIONS))}){hint}")
        try:
            if "private_part" in data:
                raise InvalidParameterError("run record has an unknown field 'private_part'")
            record = typed.from_json_object(cls, {**data, "phases": _entries(_RUN_KINDS, data.get("phases"),
                                                                                "phases")}, "run record")
        except InvalidParameterError as exc:
            raise PlanMismatchError(f"run record does not match its schema: {exc}") from None
        if stored != record.sha256:
            raise PlanMismatchError(f"run record sha256 mismatch: the file says {stored!r}, its content hashes to "
                                    f"{record.sha256}")
        if private_part is not None:
            if private_part.sha256 != record.private_sha256:
                raise PlanMismatchError(f"the private record hashes to {private_part.sha256}, the run record names "
                                        f"{record.private_sha256}: they are not of the same run")
            _set(record, "private_part", private_part)
        return record


def _read_ascii(path: Path, what: str) -> str:
    try:
        return path.read_bytes().decode("ascii")
    except FileNotFoundError:
        raise InvalidParameterError(f"{what} not found: {path}") from None
    except UnicodeDecodeError:
        raise PlanMismatchError(f"{path}: {what} is not ASCII JSON") from None
    except OSError as exc:
        raise InvalidParameterError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def load_record(path: str | Path, *, private: bool | None = None) -> RunRecord:
    """Read a run record (a run.json or its directory), with its private part when beside it.

    Args:
        path: ``runs/NAME`` or ``runs/NAME/run.json``.
        private: True to require ``private/record.json``; False to ignore it; None (default)
            to read it when present. When read, it must be the one the record names.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "run.json"
    text = _read_ascii(path, "run record")
    private_path = path.parent / PRIVATE_DIR / "record.json"
    part = None
    if private is True or (private is None and private_path.exists()):
        try:
            part = PrivateRecord.from_json(_read_ascii(private_path, "private record"))
        except PlanMismatchError as exc:
            raise PlanMismatchError(f"{private_path}: {exc}") from None
    try:
        return RunRecord.from_json(text, part)
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"{path.name}: {exc}") from None
