"""Scenarios: what a privacy engineer asks for, read strictly from TOML.

A scenario states the total budget (or a delta policy), the adjacency and privacy unit,
the dataset size, the algorithm and every part of its training shape that touches
privacy. Anything else is refused: an unknown key, a missing one, a value of the wrong
kind or out of range, or settings that contradict each other. Every error is one line
naming the key (``[dpsgd].epochs must be ...``) and is a usage error (exit 2).

    name = "criteo-pctr-hybrid"               # optional
    description = "..."                       # optional

    [budget]
    epsilon = 8.0
    delta = "1/N"                             # a number, or "<c>/N"
    delta_policy = "warn"                     # "warn" (default) or "strict": refuse delta >= 1/N

    [privacy]
    adjacency = "replace-one"                 # or "add-remove"
    unit = "impression"                       # or a unit name such as "user x time"
    cap = 1                                   # K examples per unit after capping
    capping = "random"                        # keep K random examples, or the "first" K
    unit_accounting = "tight"                 # or "group"

    [data]
    dataset_size = 32000000                   # N, rows after capping
    units = 4000000                           # M, units after capping (optional; needed to
                                              # sample units, [dpsgd].sample_by = "unit")
    size_release_epsilon = 0.1                # add-remove only, optional: dataset_size is a DP
                                              # count released at this epsilon (budgetplan data
                                              # count --dp-epsilon), accounted in the plan

    [algorithm]
    name = "hybrid"                           # rr | walr | dpsgd | hybrid
    split = "alpha-by-eps"                    # hybrid (default): "alpha-by-eps", "paper-v1", "alpha=<a>", "eps1=<e>",
                                              # or "units=<r>": RR on a share r of the units, DP-SGD on
                                              # the rest, each at the whole budget (replace-one, Poisson)
    split_evidence = "..."                    # hybrid, optional: where the split came from (written by
                                              # `budgetplan split --proxy`; the statement quotes it)
    tower = "frozen"                          # hybrid: non-sensitive tower in phase 2 ("fine-tune")

    [rr]                                      # rr, hybrid
    epochs = 10                               # the most: it stops early on its validation part
                                              # (default 5; 1 without a validation part)
    batch_size = 1024
    per_impression = "eps/K"                  # user level: "eps/K", "eps/K_i" or "tight"
    validation_fraction = 0.1                 # units held out, scored on their RR labels (free);
                                              # default min(0.1, 200000 / N); 0: none (then
                                              # exactly `epochs` are trained)

    [dpsgd]                                   # dpsgd, hybrid
    batch_size = 16384                        # expected batch size B; q = B / N; or "N/<c>":
                                              # B = N / c rounded (the plan holds the number)
    epochs = 3                                # or steps = ...
    clipping_norm = 10.0
    sampling = "poisson"                      # or "truncated-poisson" with max_batch_size; or
                                              # "allocation" (each example in one random step of
                                              # every epoch of N // B steps; add-remove) or
                                              # "shuffle" (fixed batches of B, no amplification
                                              # claimed); both run whole epochs
    sample_by = "example"                     # or "unit" (a unit capped at K > 1, Poisson
                                              # only): each unit joins a batch w.p. B / M and
                                              # its examples' summed gradient is clipped once;
                                              # batch_size then counts units
    noise_multiplier = 1.0                    # optional: fixed, else calibrated
    max_noise_multiplier = 5.0                # optional: refuse plans that need more noise

    [walr]                                    # walr
    features = 20                             # k, intercept column included
    row_norm_bound = 4.47                     # every row clipped to this L2 norm
    weights_bound = 1.0                       # per-example weights bounded by this

    [features]                                # needed to train: the columns and who may see them
    label = "conversion"
    unit_id = "uid"                           # required for a unit capped at K > 1
    weight = "w"                              # WALR only, optional: per-example weights
    nonsensitive_categorical = ["campaign"]   # known to an adversary
    nonsensitive_numeric = ["cost"]
    sensitive_categorical = ["cat1"]          # protected (semi-sensitive DP); hashed, never
    sensitive_numeric = []                    # given a data-dependent vocabulary

    [calibration]                             # rr, dpsgd, hybrid; optional (absent: on, at this
    share = 0.05                              # share; 0: off, the intercept stays as trained).
                                              # Shift the trained model's intercept so its mean
                                              # prediction is the base rate. With DP-SGD, from one
                                              # Gaussian release that takes this share of the run's
                                              # epsilon and delta (the training phases get the
                                              # rest); RR alone: free, and no share. Not planned
                                              # with a [tuning] grid

    [tuning]                                  # optional
    configurations = 8
    selection = "naive"                       # or "repeat-and-select"
    distribution = "poisson"                  # repeat-and-select: poisson | geometric | logarithmic
    # or a grid (naive only; configurations = the product of the lists, see budgetplan.planning.grid):
    split = ["alpha=0.25", "alpha=0.5"]       # hybrid: one rule per configuration
    clipping_norm = [5.0, 20.0]               # dpsgd, hybrid
    dpsgd_learning_rate = [0.003, 0.01]       # dpsgd, hybrid: the DP-SGD optimiser's step size
    selection_share = 0.05                    # epsilon share of the noisy-max selection
    validation_fraction = 0.1                 # share of units held out to score configurations
    prediction_clip = 0.001                   # scores clip predictions to [p, 1 - p]

    [accounting]                              # optional
    method = "pld"                            # pld | rdp | prv (DP-SGD and Gaussian phases)
    discretization = 1e-4
    composition = "auto"                      # how the run's phases must meet [budget]: "pld"
                                              # (their PLD composition meets it: each phase planned
                                              # to a larger share, less noise for the same budget),
                                              # "basic" (their epsilons add up to it), or "auto"
                                              # (the default: "pld" where the phases compose by
                                              # PLD here, else "basic")
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from budgetplan import limits
from budgetplan.accounting.batch_selection import EPOCH_SAMPLINGS, epoch_steps
from budgetplan.errors import InvalidParameterError
from budgetplan.intercept import SHARE
from budgetplan.limits import SIGMA_RANGE
from budgetplan.scenario.split_rules import DEFAULT_RULE, dpsgd_rows, parse_rule, split_budget, units_share
from budgetplan.units import CAPPING_RULES, SAMPLE_BY, Adjacency
from budgetplan.util import validate
from budgetplan.util.typed import from_json_object

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Scenario", "load_scenario", "parse_scenario", "ALGORITHMS", "register_algorithm", "algorithms"]

ALGORITHMS = ("rr", "walr", "dpsgd", "hybrid")
_REGISTERED: list[str] = []  # algorithms added by ``register_algorithm`` (a phase kind of its own)


def register_algorithm(name: str) -> None:
    """Accept ``[algorithm].name = name``: an algorithm whose phases a registered planner makes.

    The planner's ``budgetplan.planning.planner.register_algorithm`` calls this; such an
    algorithm takes none of the built-in algorithms' tables ([rr], [dpsgd], [walr]).
    """
    if not isinstance(name, str) or not name or name in algorithms():
        raise ValueError(f"algorithm {name!r} is empty or already known")
    _REGISTERED.append(name)


def algorithms() -> tuple[str, ...]:
    """Every algorithm a scenario may name: the built-in ones, then the registered ones."""
    return ALGORITHMS + tuple(_REGISTERED)
PER_IMPRESSION_RULES = ("eps/K", "eps/K_i", "tight")
SAMPLING = ("poisson", "truncated-poisson", "allocation", "shuffle")
SELECTIONS = ("naive", "repeat-and-select")
DISTRIBUTIONS = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}
TOWERS = ("frozen", "fine-tune")
MAX_SHARE = 0.5
CALIBRATED = ("rr", "dpsgd", "hybrid")
WALR_ENCODINGS = ("numeric", "one-hot")
# The RR phase's free validation: the share of units a scenario holds out unless it says otherwise
# (``validation_fraction = 0``: none), and the most it may hold out.
RR_VALIDATION = 0.1
RR_VALIDATION_ROWS = 200_000  # ... or at most about this many rows (a share of N) when N is large
MAX_VALIDATION = 0.5
# [rr].epochs when a scenario with a held-out part does not say: the held-out units stop the phase,
# so the cap costs time only where the phase is still improving. 5 bound on outside data (1M rows:
# every eps-8 seed still improving at epoch 5; with 10, they stopped themselves at 7.3 epochs and
# gained 0.7-1.7 points of relative AUC loss, one eps-3 seed 3.8: CHANGELOG).
RR_MAX_EPOCHS = 10
METHODS = ("pld", "rdp", "prv")
COMPOSITIONS = ("auto", "basic", "pld")
_T = TypeVar("_T")
_S = TypeVar("_S", bound="DataclassInstance")
_DELTA_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)?\s*/\s*N\s*$")


class _Table:
    """One TOML table read strictly: every key is consumed or reported as unknown."""

    def __init__(self, raw: object, name: str):
        if not isinstance(raw, dict):
            raise InvalidParameterError(f"[{name}] must be a table, got {type(raw).__name__}")
        self.raw, self.name = raw, name
        self.used: set[str] = set()

    def _key(self, key: str) -> str:
        return f"[{self.name}].{key}" if self.name else key

    def get(self, key: str, *, required: bool = False, default: object = None) -> Any:
        """The raw value of ``key`` (the dataclass it goes into validates it), or ``default``."""
        self.used.add(key)
        if key not in self.raw:
            if required:
                raise InvalidParameterError(f"missing required key {self._key(key)}")
            return default
        return self.raw[key]

    def table(self, key: str, *, required: bool = False) -> _Table:
        return _Table(self.get(key, required=required, default={}), f"{self._key(key).strip('[]')}")

    def has(self, key: str) -> bool:
        return key in self.raw

    def finish(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise InvalidParameterError(f"unknown key {self._key(unknown[0])}")


def _choice(name: str, value: object, choices: Collection[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidParameterError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def _string(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidParameterError(f"{name} must be a string, got {value!r}")
    if len(value) > limits.MAX_TEXT_CHARS:
        raise InvalidParameterError(f"{name} must be at most {limits.MAX_TEXT_CHARS:,} characters (budgetplan's "
                                    f"stated limit), got {len(value):,}: {value[:40]!r}...")
    return value


def _bounded_int(name: str, value: object, limit: int) -> int:
    return validate.at_most(name, validate.positive_int(name, value), limit)


def _optional(check: Callable[..., _T], name: str, value: object, *args: object) -> _T | None:
    return None if value is None else check(name, value, *args)


def _delta(name: str, value: object) -> float | str:
    """A number in [0, 1) (0: pure DP, randomized response only), or a policy string "<c>/N"."""
    if isinstance(value, str):
        m = _DELTA_RE.match(value)
        if not m:
            raise InvalidParameterError(f'{name} must be a number in [0, 1) or "<c>/N", got {value!r}')
        c = float(m.group(1)) if m.group(1) else 1.0
        if not (c > 0 and math.isfinite(c)):
            raise InvalidParameterError(f"{name} must have a positive constant, got {value!r}")
        return f"{c!r}/N"
    return validate.probability(name, value, allow_zero=True)


def _columns(name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidParameterError(f"{name} must be a list of column names, got {value!r}")
    if len(set(value)) != len(value):
        raise InvalidParameterError(f"{name} names a column twice: {list(value)!r}")
    return tuple(value)


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDShape:
    """The part of a DP-SGD phase that touches privacy (its own checks; N-dependent ones are the Scenario's)."""

    batch_size: int
    clipping_norm: float
    epochs: float | None = None
    steps: int | None = None
    sampling: str = "poisson"
    max_batch_size: int | None = None
    noise_multiplier: float | None = None
    max_noise_multiplier: float | None = None
    sample_by: str = "example"

    def __post_init__(self) -> None:
        _set(self, "batch_size", validate.positive_int("[dpsgd].batch_size", self.batch_size))
        _choice("[dpsgd].sample_by", self.sample_by, SAMPLE_BY)
        _set(self, "epochs", _optional(lambda n, v: validate.at_most(n, validate.positive(n, v), limits.MAX_EPOCHS),
                                       "[dpsgd].epochs", self.epochs))
        _set(self, "steps", _optional(_bounded_int, "[dpsgd].steps", self.steps, limits.MAX_STEPS))
        if (self.epochs is None) == (self.steps is None):
            raise InvalidParameterError("[dpsgd] needs exactly one of epochs or steps")
        _set(self, "clipping_norm", validate.positive("[dpsgd].clipping_norm", self.clipping_norm))
        _choice("[dpsgd].sampling", self.sampling, SAMPLING)
        _set(self, "max_batch_size", _optional(validate.positive_int, "[dpsgd].max_batch_size",
                                               self.max_batch_size))
        if self.sampling == "truncated-poisson" and self.max_batch_size is None:
            raise InvalidParameterError("missing required key [dpsgd].max_batch_size for truncated-poisson sampling")
        if self.sampling != "truncated-poisson" and self.max_batch_size is not None:
            raise InvalidParameterError('[dpsgd].max_batch_size needs sampling = "truncated-poisson"')
        for key in ("noise_multiplier", "max_noise_multiplier"):
            _set(self, key, _optional(validate.positive, f"[dpsgd].{key}", getattr(self, key)))
        if self.noise_multiplier is not None and self.max_noise_multiplier is not None \
                and self.noise_multiplier > self.max_noise_multiplier:
            raise InvalidParameterError(f"[dpsgd].noise_multiplier = {self.noise_multiplier!r} exceeds "
                                        f"[dpsgd].max_noise_multiplier = {self.max_noise_multiplier!r}: the plan "
                                        "would need more noise than the scenario allows")


@dataclass(frozen=True, slots=True, kw_only=True)
class RRShape:
    """The RR phase's training (post-processing of the one release).

    ``validation_fraction``: the share of the units held out of the RR phase's training and
    scored on their RR labels (debiased), to stop it early and keep its best state; None
    (and absent from the plan) when there is none: then ``epochs`` are trained exactly, as
    plans made before it existed did. A scenario's TOML gets ``RR_VALIDATION`` unless it
    says ``validation_fraction = 0``; with validation, ``epochs`` is the most it trains.
    """

    epochs: int = 1
    batch_size: int | None = None
    per_impression: str = "eps/K"
    validation_fraction: float | None = None

    def __post_init__(self) -> None:
        _set(self, "epochs", _bounded_int("[rr].epochs", self.epochs, limits.MAX_EPOCHS))
        _set(self, "batch_size", _optional(validate.positive_int, "[rr].batch_size", self.batch_size))
        _choice("[rr].per_impression", self.per_impression, PER_IMPRESSION_RULES)
        value = self.validation_fraction
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0 \
                and math.copysign(1.0, value) > 0:
            _set(self, "validation_fraction", None)  # 0: no held-out part
        elif value is not None:
            fraction = validate.open_unit("[rr].validation_fraction", value)
            if fraction > MAX_VALIDATION:
                raise InvalidParameterError(f"[rr].validation_fraction must be at most {MAX_VALIDATION:g} (the RR "
                                            f"phase trains on the rest), got {fraction!r}")
            _set(self, "validation_fraction", fraction)


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRShape:
    """WALR's release: one noisy sum of y_i w_i x_i.

    ``encoding = "numeric"`` (the default when ``features`` and ``row_norm_bound`` are given):
    the rows are the numeric columns as they are, plus an intercept, each clipped to
    ``row_norm_bound``; the plan states k = ``features``. ``encoding = "one-hot"`` (the default
    without them): every categorical column one-hot (a vocabulary, or hashed), every numeric
    column scaled into [0, 1] by a transform fitted on the features, plus an intercept, so a
    row's norm is at most sqrt(1 + columns) whatever the vocabularies: the plan derives that
    bound from ``[features]``, and k follows from the encoding (the noise does not depend on it).
    """

    features: int | None = None
    row_norm_bound: float | None = None
    weights_bound: float = 1.0
    encoding: str | None = None

    def __post_init__(self) -> None:
        legacy = self.features is not None or self.row_norm_bound is not None
        encoding = self.encoding or ("numeric" if legacy else "one-hot")
        _set(self, "encoding", _choice("[walr].encoding", encoding, WALR_ENCODINGS))
        if encoding == "numeric":
            if self.features is None or self.row_norm_bound is None:
                missing = "features" if self.features is None else "row_norm_bound"
                raise InvalidParameterError(f"missing required key [walr].{missing} for encoding = \"numeric\" (or "
                                            "drop both for the one-hot encoding, which derives them)")
            _set(self, "features", _bounded_int("[walr].features", self.features, limits.MAX_WALR_FEATURES))
            _set(self, "row_norm_bound", validate.positive("[walr].row_norm_bound", self.row_norm_bound))
        elif legacy:
            raise InvalidParameterError("[walr].features and [walr].row_norm_bound are derived from [features] for "
                                        "encoding = \"one-hot\"; drop them")
        _set(self, "weights_bound", validate.positive("[walr].weights_bound", self.weights_bound))


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureSpec:
    """Which columns are the label, the unit id, and the (non-)sensitive features.

    Non-sensitive features are known to an adversary; sensitive features and the label are
    protected. Randomized response protects only the label, so a model trained on RR
    labels may use non-sensitive features only.
    """

    label: str
    unit_id: str | None = None
    weight: str | None = None
    nonsensitive_categorical: tuple[str, ...] = ()
    nonsensitive_numeric: tuple[str, ...] = ()
    sensitive_categorical: tuple[str, ...] = ()
    sensitive_numeric: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _string("[features].label", self.label)
        for key in ("unit_id", "weight"):
            _optional(_string, f"[features].{key}", getattr(self, key))
        for key in ("nonsensitive_categorical", "nonsensitive_numeric", "sensitive_categorical", "sensitive_numeric"):
            _set(self, key, _columns(f"[features].{key}", getattr(self, key)))
        feats = self.nonsensitive + self.sensitive
        if not feats:
            raise InvalidParameterError("[features] lists no feature columns")
        seen: set[str] = set()
        for col in feats:
            if col in seen:
                raise InvalidParameterError(f"[features] lists column {col!r} in two groups")
            seen.add(col)
        if self.label in seen:
            raise InvalidParameterError(f"[features].label {self.label!r} is also listed as a feature")
        if self.unit_id is not None and (self.unit_id in seen or self.unit_id == self.label):
            # the unit id identifies the unit the plan protects: as a feature (or the label) it is no protection
            role = "the label" if self.unit_id == self.label else "a feature"
            raise InvalidParameterError(f"[features].unit_id {self.unit_id!r} is also listed as {role}")

    @property
    def nonsensitive(self) -> tuple[str, ...]:
        return self.nonsensitive_categorical + self.nonsensitive_numeric

    @property
    def sensitive(self) -> tuple[str, ...]:
        return self.sensitive_categorical + self.sensitive_numeric

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the trainer reads, label and unit id included, without repeats."""
        out = [self.label] + ([self.unit_id] if self.unit_id else []) + ([self.weight] if self.weight else []) \
            + list(self.nonsensitive + self.sensitive)
        return tuple(dict.fromkeys(out))

    def to_toml(self) -> str:
        """The scenario's ``[features]`` table that parses back to this spec."""
        def value(v: str | tuple[str, ...]) -> str:
            return json.dumps(v) if isinstance(v, str) else "[" + ", ".join(json.dumps(c) for c in v) + "]"

        lines = ["[features]", f"label = {value(self.label)}"]
        lines += [f"{k} = {value(getattr(self, k))}" for k in ("unit_id", "weight") if getattr(self, k) is not None]
        lines += [f"{k} = {value(getattr(self, k))}" for k in ("nonsensitive_categorical", "nonsensitive_numeric",
                                                              "sensitive_categorical", "sensitive_numeric")]
        return "\n".join(lines) + "\n"


GRID_KEYS = ("split", "clipping_norm", "dpsgd_learning_rate")
GRID_DEFAULTS = {"selection_share": 0.05, "validation_fraction": 0.1, "prediction_clip": 1e-3}


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationShape:
    """The intercept calibration after training (``budgetplan.intercept``).

    A scenario without one leaves the intercept as trained.

    Attributes:
        share: the fraction of the run's epsilon and of its delta spent on the one Gaussian
            release the shift is solved from, when the run has a DP-SGD phase; the training
            phases are planned to the rest. An RR-only run calibrates for free.
    """

    share: float = SHARE

    def __post_init__(self) -> None:
        share = validate.probability("[calibration].share", self.share)
        if share > MAX_SHARE:
            raise InvalidParameterError(f"[calibration].share must be at most {MAX_SHARE:g} (the training phases get "
                                        f"what it leaves), got {share!r}")
        _set(self, "share", share)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """Declared tuning: ``configurations`` runs, or a grid of them (``budgetplan.planning.grid``).

    A grid lists values of ``split`` (Hybrid), ``clipping_norm`` and ``dpsgd_learning_rate``
    (DP-SGD, Hybrid); its configurations are the product of the lists, ``configurations``
    (if given) must equal that count. The selection among them is a report-noisy-max on a
    validation part of ``validation_fraction`` of the units, costing ``selection_share`` of
    epsilon, each example's log loss bounded by clipping predictions to ``[prediction_clip,
    1 - prediction_clip]``. The grid keys are None (and absent from the plan) without a grid.
    """

    # An int once constructed: None (not given) becomes the grid's count.
    configurations: int = None  # type: ignore[assignment]
    selection: str = "naive"
    distribution: str = "poisson"
    split: tuple[str, ...] | None = None
    clipping_norm: tuple[float, ...] | None = None
    dpsgd_learning_rate: tuple[float, ...] | None = None
    selection_share: float | None = None
    validation_fraction: float | None = None
    prediction_clip: float | None = None

    def __post_init__(self) -> None:
        _choice("[tuning].selection", self.selection, SELECTIONS)
        _choice("[tuning].distribution", self.distribution, tuple(DISTRIBUTIONS))
        _set(self, "split", _optional(_grid_rules, "[tuning].split", self.split))
        for key in ("clipping_norm", "dpsgd_learning_rate"):
            _set(self, key, _optional(_grid_numbers, f"[tuning].{key}", getattr(self, key)))
        if self.dpsgd_learning_rate is not None:
            for v in self.dpsgd_learning_rate:
                validate.at_most("[tuning].dpsgd_learning_rate", v, limits.MAX_LEARNING_RATE)
        if not self.is_grid:
            for key in GRID_DEFAULTS:
                if getattr(self, key) is not None:
                    raise InvalidParameterError(f"[tuning].{key} applies to a grid of configurations only (list "
                                                f"{', '.join(GRID_KEYS)})")
            if self.configurations is None:
                raise InvalidParameterError("missing required key [tuning].configurations (or a grid: "
                                            f"{', '.join(GRID_KEYS)})")
        else:
            if self.selection != "naive":
                raise InvalidParameterError(
                    f"[tuning].selection = {self.selection!r} with a grid is not supported: a grid's selection is "
                    "accounted as naive composition plus a report-noisy-max; use selection = \"naive\"")
            n = self.grid_size
            if self.configurations is not None and self.configurations != n:
                raise InvalidParameterError(f"[tuning].configurations = {self.configurations!r} disagrees with the "
                                            f"grid, whose lists give {n} configurations")
            if n < 2:
                raise InvalidParameterError("[tuning] grid has 1 configuration: there is nothing to select; list "
                                            "at least two values or drop the grid")
            _set(self, "configurations", n)
            _set(self, "selection_share", validate.open_unit(
                "[tuning].selection_share", _default(self.selection_share, "selection_share")))
            _set(self, "validation_fraction", validate.open_unit(
                "[tuning].validation_fraction", _default(self.validation_fraction, "validation_fraction")))
            clip = validate.open_unit("[tuning].prediction_clip", _default(self.prediction_clip, "prediction_clip"))
            if not clip < 0.5:
                raise InvalidParameterError(f"[tuning].prediction_clip must be below 0.5, got {clip!r}")
            _set(self, "prediction_clip", clip)
        _set(self, "configurations", _bounded_int("[tuning].configurations", self.configurations,
                                                  limits.MAX_CONFIGURATIONS))

    @property
    def is_grid(self) -> bool:
        return any(getattr(self, key) is not None for key in GRID_KEYS)

    @property
    def grid_size(self) -> int:
        return math.prod(len(getattr(self, key)) for key in GRID_KEYS if getattr(self, key) is not None)

    def to_dict(self) -> dict[str, Any]:
        """Without the grid keys when there is no grid: plans of plain tuning keep their bytes."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()
                if v is not None or k not in GRID_KEYS + tuple(GRID_DEFAULTS)}


def _default(value: object, key: str) -> object:
    return GRID_DEFAULTS[key] if value is None else value


def _grid_list(name: str, value: object) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidParameterError(f"{name} must be a non-empty list, got {value!r}")
    if len(value) > limits.MAX_CONFIGURATIONS:
        raise InvalidParameterError(f"{name} lists {len(value)} values: at most {limits.MAX_CONFIGURATIONS}")
    return tuple(value)


def _grid_rules(name: str, value: object) -> tuple[str, ...]:
    rules = _grid_list(name, value)
    parsed = [parse_rule(_string(f"{name}[{i}]", r), f"{name}[{i}]") for i, r in enumerate(rules)]
    _no_repeats(name, rules, parsed)
    return rules


def _grid_numbers(name: str, value: object) -> tuple[float, ...]:
    numbers = tuple(validate.positive(f"{name}[{i}]", v) for i, v in enumerate(_grid_list(name, value)))
    _no_repeats(name, numbers, numbers)
    return numbers


def _no_repeats(name: str, given: tuple[object, ...], keys: Iterable[Hashable]) -> None:
    seen: dict[Hashable, object] = {}
    for g, k in zip(given, keys):
        if k in seen:
            raise InvalidParameterError(f"{name} lists the same value twice: {seen[k]!r} and {g!r}")
        seen[k] = g


_SHAPES: tuple[tuple[str, type, tuple[str, ...]], ...] = (
    ("rr", RRShape, ("rr", "hybrid")), ("dpsgd", DPSGDShape, ("dpsgd", "hybrid")), ("walr", WALRShape, ("walr",)))
_OPTIONAL_TABLES: tuple[tuple[str, type], ...] = (("tuning", Tuning), ("features", FeatureSpec))


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A scenario, validated at construction whatever built it (TOML, a plan file, Python).

    ``delta`` is a number or a ``"<c>/N"`` policy string. Every value is checked as the TOML
    key it comes from (errors name it: ``[dpsgd].batch_size must ...``), and so are the
    rules between values (a cap on an impression unit, the tables an algorithm needs, a
    batch larger than N, norms whose derived quantities overflow). Hybrid's ``split`` and
    ``tower`` default to ``budgetplan.scenario.split_rules.DEFAULT_RULE`` and ``"frozen"``.
    ``warnings`` are computed here: doubtful but legal settings.
    """

    name: str
    description: str
    epsilon: float
    delta: float | str
    delta_policy: str
    adjacency: Adjacency
    unit_name: str
    cap: int
    capping: str
    unit_accounting: str
    dataset_size: int
    algorithm: str
    split: str | None = None
    tower: str | None = None
    split_evidence: str | None = None
    rr: RRShape | None = None
    dpsgd: DPSGDShape | None = None
    walr: WALRShape | None = None
    tuning: Tuning | None = None
    features: FeatureSpec | None = None
    method: str = "pld"
    discretization: float = 1e-4
    composition: str = "auto"
    size_release_epsilon: float | None = None
    calibration: CalibrationShape | None = None
    units: int | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        _text("name", _string("name", self.name))
        _text("description", self.description)
        _set(self, "epsilon", validate.positive("[budget].epsilon", self.epsilon))
        _set(self, "delta", _delta("[budget].delta", self.delta))
        _choice("[budget].delta_policy", self.delta_policy, ("warn", "strict"))
        _set(self, "adjacency", Adjacency.parse(self.adjacency, "[privacy].adjacency"))
        _string("[privacy].unit", self.unit_name)
        _set(self, "cap", _bounded_int("[privacy].cap", self.cap, limits.MAX_UNIT_CAP))
        _choice("[privacy].capping", self.capping, CAPPING_RULES)
        _choice("[privacy].unit_accounting", self.unit_accounting, ("tight", "group"))
        _set(self, "dataset_size", _bounded_int("[data].dataset_size", self.dataset_size, limits.MAX_DATASET_SIZE))
        _choice("[algorithm].name", self.algorithm, algorithms())
        for key, kind, used_by in _SHAPES:
            shape = getattr(self, key)
            if self.algorithm in used_by and not isinstance(shape, kind):
                raise InvalidParameterError(f"algorithm {self.algorithm!r} needs its [{key}] table, got "
                                            f"{type(shape).__name__}")
            if self.algorithm not in used_by and shape is not None:
                raise InvalidParameterError(f"[{key}] does not apply to algorithm {self.algorithm!r}")
        for key, optional_kind in _OPTIONAL_TABLES + (("calibration", CalibrationShape),):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), optional_kind):
                raise InvalidParameterError(f"[{key}] must be a {optional_kind.__name__}, got "
                                            f"{type(getattr(self, key)).__name__}")
        _choice("[accounting].method", self.method, METHODS)
        _set(self, "discretization", validate.positive("[accounting].discretization", self.discretization))
        _choice("[accounting].composition", self.composition, COMPOSITIONS)
        _set(self, "size_release_epsilon", _optional(validate.positive, "[data].size_release_epsilon",
                                                     self.size_release_epsilon))
        _set(self, "units", _optional(_bounded_int, "[data].units", self.units, limits.MAX_DATASET_SIZE))
        grid_split = self.tuning is not None and self.tuning.split is not None
        if self.algorithm == "hybrid":
            if grid_split:  # each configuration has its own rule; there is no single one
                if self.split is not None:
                    raise InvalidParameterError(f"[algorithm].split = {self.split!r} and [tuning].split are both "
                                                "given: the grid's rules replace the single one; drop one")
                assert self.tuning is not None and self.tuning.split is not None
                for rule in self.tuning.split:
                    _check_split(rule, self.epsilon, "[tuning].split")
            else:
                split = _split_rule("[algorithm].split", DEFAULT_RULE if self.split is None else self.split)
                _set(self, "split", split)
                _check_split(split, self.epsilon)
                if units_share(split) is not None:
                    _check_units_split(self)
            _set(self, "tower", _choice("[algorithm].tower", "frozen" if self.tower is None else self.tower, TOWERS))
        if self.split_evidence is not None:
            _text("[algorithm].split_evidence", self.split_evidence)
            if self.algorithm != "hybrid" or self.split is None:
                raise InvalidParameterError("[algorithm].split_evidence says where a Hybrid plan's single split rule "
                                            "came from; this scenario has none")
        _set(self, "warnings", _check_consistency(self))

    @property
    def walr_row_norm_bound(self) -> float:
        """WALR's bound on a row's L2 norm, intercept included: stated (numeric encoding), or
        sqrt(1 + the feature columns) for the one-hot encoding (one 1 per categorical column,
        each numeric in [0, 1])."""
        assert self.walr is not None  # asked of WALR scenarios only
        if self.walr.encoding == "numeric":
            assert self.walr.row_norm_bound is not None  # a numeric shape states it
            return self.walr.row_norm_bound
        assert self.features is not None  # checked at construction
        return math.sqrt(1 + len(self.features.nonsensitive) + len(self.features.sensitive))

    @property
    def resolved_delta(self) -> float:
        """delta as a number: a "<c>/N" policy is c / N."""
        if isinstance(self.delta, str):
            return float(self.delta.split("/")[0]) / self.dataset_size
        return self.delta

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("warnings")
        for key in ("size_release_epsilon", "calibration", "units", "split_evidence"):
            if out[key] is None:
                out.pop(key)  # plans without a DP count, a calibration, a unit count or evidence keep their bytes
        if out["composition"] == "basic":
            out.pop("composition")  # plans made before the PLD budget keep their bytes
        if out["dpsgd"] is not None and out["dpsgd"]["sample_by"] == "example":
            out["dpsgd"].pop("sample_by")
        if out["walr"] is not None:
            if out["walr"]["encoding"] == "numeric":
                out["walr"].pop("encoding")  # plans made before the one-hot encoding keep their bytes
            else:
                out["walr"].pop("features")
                out["walr"].pop("row_norm_bound")
        if out["rr"] is not None and out["rr"]["validation_fraction"] is None:
            out["rr"].pop("validation_fraction")  # plans without the RR phase's validation keep their bytes
        out["adjacency"] = self.adjacency.value
        if self.tuning is not None:
            out["tuning"] = self.tuning.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: object) -> Scenario:
        """The scenario of a plan file, read strictly (unknown or missing keys are refused)."""
        if not isinstance(data, dict):
            raise InvalidParameterError(f"scenario must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        for key, kind in (("rr", RRShape), ("dpsgd", DPSGDShape), ("walr", WALRShape), ("tuning", Tuning),
                          ("features", FeatureSpec), ("calibration", CalibrationShape)):
            if data.get(key) is not None:
                data[key] = from_json_object(kind, data[key], f"scenario.{key}")
        if "warnings" in data:
            raise InvalidParameterError("scenario has an unknown field 'warnings'")
        data.setdefault("composition", "basic")  # a plan's scenario without the key was planned by basic composition
        return from_json_object(cls, data, "scenario")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidParameterError(f"scenario file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"cannot read scenario {path}: {exc}") from None
    try:
        return parse_scenario(text, default_name=path.stem)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{path.name}: {exc}") from None


def parse_scenario(text: str, *, default_name: str = "scenario") -> Scenario:
    """Validate a scenario given as TOML text: every key read strictly, then the Scenario checks itself."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidParameterError(f"malformed TOML: {exc}") from None
    except RecursionError:
        raise InvalidParameterError("malformed TOML: arrays or tables nested too deeply") from None
    top = _Table(raw, "")
    values: dict[str, Any] = {"name": top.get("name", default=default_name),
                              "description": top.get("description", default="")}

    budget = top.table("budget", required=True)
    values.update(epsilon=budget.get("epsilon", required=True), delta=budget.get("delta", required=True),
                  delta_policy=budget.get("delta_policy", default="warn"))
    budget.finish()

    priv = top.table("privacy", required=True)
    values.update(adjacency=priv.get("adjacency", required=True), unit_name=priv.get("unit", default="impression"),
                  capping=priv.get("capping", default="random"),
                  unit_accounting=priv.get("unit_accounting", default="tight"))
    cap = priv.get("cap", default=None)
    priv.finish()
    if cap is None and isinstance(values["unit_name"], str) and not is_example_unit(values["unit_name"]):
        raise InvalidParameterError(f"[privacy].unit {values['unit_name']!r} is a user-level unit: it needs "
                                    "[privacy].cap (K examples per unit)")
    values["cap"] = 1 if cap is None else cap

    data = top.table("data", required=True)
    values.update(dataset_size=data.get("dataset_size", required=True),
                  size_release_epsilon=data.get("size_release_epsilon", default=None),
                  units=data.get("units", default=None))
    data.finish()

    algo = top.table("algorithm", required=True)
    algorithm = algo.get("name", required=True)
    values.update(algorithm=algorithm, split=algo.get("split", default=None), tower=algo.get("tower", default=None),
                  split_evidence=algo.get("split_evidence", default=None))
    algo.finish()

    _batch_policy(raw, values["dataset_size"], values["split"])
    for key, kind, used_by in _SHAPES:
        if key in raw and algorithm not in used_by:
            raise InvalidParameterError(f"[{key}] does not apply to algorithm {algorithm!r}")
        if algorithm in used_by:
            values[key] = _shape(top, key, kind, required=key != "rr")
        top.used.add(key)
    if values.get("rr") is not None:
        values["rr"] = _rr_validation(values["rr"], raw.get("rr"), "tuning" in raw, values["dataset_size"])
    for key, optional_kind in _OPTIONAL_TABLES:
        values[key] = _shape(top, key, optional_kind) if key in raw else None
        top.used.add(key)
    values["calibration"] = _calibration(top, algorithm, raw)
    if "accounting" in raw:
        acc = top.table("accounting")
        values.update(method=acc.get("method", default="pld"), discretization=acc.get("discretization", default=1e-4),
                      composition=acc.get("composition", default="auto"))
        acc.finish()
    top.used.add("accounting")
    top.finish()
    return Scenario(**values)


def _shape(top: _Table, key: str, kind: type[_S], *, required: bool = False) -> _S:
    """The ``[key]`` table as ``kind``: unknown keys refused here, values by the dataclass."""
    t = top.table(key, required=required)
    names = [f.name for f in fields(kind)]
    values = {name: t.get(name) for name in names if t.has(name)}
    t.finish()
    for name, value in values.items():
        if isinstance(value, list):
            values[name] = tuple(value) if all(isinstance(v, str) for v in value) else value
    try:
        return kind(**values)
    except TypeError:  # a required key is missing
        missing = next(f.name for f in fields(kind) if f.name not in values
                       and f.default is MISSING and f.default_factory is MISSING)
        raise InvalidParameterError(f"missing required key [{key}].{missing}") from None


_BATCH_RE = re.compile(r"^N/((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)$")


def _batch_policy(raw: dict[str, Any], dataset_size: object, split: object = None) -> None:
    """``[dpsgd].batch_size = "N/<c>"``: the expected batch N / c, rounded (at least 1), written in place.

    The plan then holds the number, as if it had been written; q = B / N is about 1 / c. Under
    a units split N is the rows of the DP-SGD phase's part (its expected size), so q is still
    about 1 / c.
    """
    table = raw.get("dpsgd")
    if not isinstance(table, dict) or not isinstance(table.get("batch_size"), str):
        return
    value = table["batch_size"]
    m = _BATCH_RE.match(value)
    if not m:
        raise InvalidParameterError(f'[dpsgd].batch_size must be an integer >= 1 or "N/<c>", got {value!r}')
    c = float(m.group(1))
    if not (c >= 1 and math.isfinite(c)):
        raise InvalidParameterError(f'[dpsgd].batch_size "N/<c>" needs c >= 1, got {value!r}')
    if table.get("sample_by") == "unit":
        raise InvalidParameterError(f'[dpsgd].batch_size = {value!r}: with sample_by = "unit" the batch counts '
                                    "units; write the number")
    n = _bounded_int("[data].dataset_size", dataset_size, limits.MAX_DATASET_SIZE)
    n = dpsgd_rows(n, None if split is None else _split_rule("[algorithm].split", split))
    table["batch_size"] = max(1, round(n / c))


def rr_validation_default(dataset_size: object) -> float:
    """The held-out share of units a scenario gets unless it says: a tenth, or 200,000 rows' worth at large N.

    Held-out rows are rows the RR phase does not train on; beyond a few thousand positives
    more of them sharpen the score little. A function of N alone (public), never of the data.
    """
    n = _bounded_int("[data].dataset_size", dataset_size, limits.MAX_DATASET_SIZE)
    return min(RR_VALIDATION, RR_VALIDATION_ROWS / n)


def _rr_validation(shape: RRShape, given: object, tuned: bool, dataset_size: object) -> RRShape:
    """The TOML's ``[rr].validation_fraction``: ``RR_VALIDATION`` when absent, none when 0."""
    stated = isinstance(given, dict) and "validation_fraction" in given
    if stated:
        if tuned and shape.validation_fraction is not None:
            raise InvalidParameterError("[rr].validation_fraction with a [tuning] table is not supported: a tuned "
                                        "run's configurations are scored on a validation part of their own; drop one")
    elif not tuned:
        shape = replace(shape, validation_fraction=rr_validation_default(dataset_size))
    if shape.validation_fraction is not None and not (isinstance(given, dict) and "epochs" in given):
        shape = replace(shape, epochs=RR_MAX_EPOCHS)  # the held-out units decide when it stops
    return shape


def _calibration(top: _Table, algorithm: object, raw: dict[str, Any]) -> CalibrationShape | None:
    """``[calibration]``: on by default for the runs that train a model with an intercept (RR, DP-SGD, Hybrid).

    Absent, those runs calibrate with the default share (RR alone for free), except under a
    ``[tuning]`` grid, which does not plan the release (a warning says so); ``share = 0``
    opts out.
    """
    tuning = raw.get("tuning")
    grid = isinstance(tuning, dict) and any(key in tuning for key in GRID_KEYS)
    if not top.has("calibration"):
        top.used.add("calibration")
        return CalibrationShape() if algorithm in CALIBRATED and not grid else None
    t = top.table("calibration")
    share = t.get("share")
    t.finish()
    if algorithm not in CALIBRATED:
        raise InvalidParameterError(f"[calibration] does not apply to algorithm {algorithm!r}: it calibrates the "
                                    "intercept of a model trained by rr, dpsgd or hybrid")
    if isinstance(share, (int, float)) and not isinstance(share, bool) and share == 0 \
            and math.copysign(1.0, share) > 0:
        return None  # opted out: the intercept stays as trained
    if algorithm == "rr" and share is not None:
        raise InvalidParameterError("[calibration].share applies to plans with a DP-SGD phase: an RR-only plan "
                                    "calibrates its intercept for free (post-processing of the RR release); "
                                    "share = 0 turns it off")
    return CalibrationShape() if share is None else CalibrationShape(share=share)


def _split_rule(name: str, value: object) -> str:
    rule = _string(name, value)
    parse_rule(rule, name)
    return rule


def _check_split(split: str, epsilon: float, key: str = "[algorithm].split") -> None:
    """An explicit eps1 must leave the DP-SGD phase a share of the total (see ``budgetplan.scenario.split_rules``)."""
    if units_share(split) is not None:
        if key != "[algorithm].split":
            raise InvalidParameterError(f"{key} = {split!r}: a units split is not tuned by a grid (the grid's "
                                        "accounting composes whole runs over every unit); give it as "
                                        "[algorithm].split")
        return  # each phase gets the whole budget: nothing to split
    try:
        split_budget(epsilon, split)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{key} = {split!r}: {exc}") from None


def _check_units_split(s: Scenario) -> None:
    """What a units split (``[algorithm].split = "units=<r>"``) needs for its parallel composition to hold.

    Each phase is accounted on its own part of the units at the whole budget, which is sound
    when a neighbouring dataset changes one part only and the parts' sizes are the same in
    both: replace-one (the unit, its id and so its part stay; only its protected values
    change). DP-SGD's part is planned at its expected size (1 - r) N, which only Poisson
    sampling of examples leaves out of the accounting.
    """
    if s.adjacency is not Adjacency.REPLACE_ONE:
        raise InvalidParameterError(f"[algorithm].split = {s.split!r} needs [privacy].adjacency = \"replace-one\", "
                                    f"got {s.adjacency.value!r}: under add-remove the parts' sizes would tell a unit "
                                    "apart; use an alpha rule")
    if s.tuning is not None:
        raise InvalidParameterError(f"[algorithm].split = {s.split!r} with [tuning] is not supported: the tuning "
                                    "accounting composes whole runs over every unit; drop one of them")
    if s.size_release_epsilon is not None:
        raise InvalidParameterError(f"[algorithm].split = {s.split!r} with [data].size_release_epsilon is not "
                                    "supported: the parts are planned from the exact N")
    d = s.dpsgd
    if d is not None and (d.sampling != "poisson" or d.sample_by != "example"):
        raise InvalidParameterError(f"[algorithm].split = {s.split!r} needs [dpsgd].sampling = \"poisson\" over "
                                    f"examples, got sampling {d.sampling!r} by {d.sample_by!r}: the DP-SGD part's "
                                    "row count is known only in expectation")


def check_max_batch_size(batch_size: int, max_batch_size: int, dataset_size: int, *,
                         names: tuple[str, str, str] = ("[dpsgd].batch_size", "[dpsgd].max_batch_size",
                                                        "[data].dataset_size")) -> None:
    """Truncated Poisson cuts batches above ``max_batch_size``: it must lie between B and N.

    Below the expected batch size B most batches would be cut (a different mechanism from
    the one planned); above N it cuts nothing. ``names`` are the keys (or options) quoted.
    """
    if not batch_size <= max_batch_size <= dataset_size:
        b, m, n = names
        raise InvalidParameterError(f"{m} must lie between {b} ({batch_size}) and {n} ({dataset_size}), "
                                    f"got {max_batch_size}")


def _check_derived(s: Scenario) -> None:
    """Refuse norms whose derived quantities overflow: the plan states them, and inf is not a number.

    DP-SGD's sensitivity is C (add-remove) or 2C (replace-one), K times that for a unit of K
    examples, and its noise std is sigma times C for any noise multiplier the plan may use
    (the one given, else up to the calibration's ceiling); WALR's sensitivity is
    row_norm_bound x weights_bound, K times that per unit, and its noise std a multiple of
    that (up to the same ceiling, for any budget the planner meets).
    """

    if s.dpsgd is not None:
        _check_clipping_norm(s, s.dpsgd.clipping_norm, "[dpsgd].clipping_norm")
    if s.walr is not None and s.walr.encoding == "one-hot" and s.features is None:
        raise InvalidParameterError("[walr] encoding = \"one-hot\" derives its row bound from [features]: add the "
                                    "table (or give [walr].features and row_norm_bound for numeric columns)")
    if s.walr is not None and not math.isfinite(s.walr_row_norm_bound * s.walr.weights_bound * s.cap
                                                * SIGMA_RANGE[1]):
        raise InvalidParameterError(
            f"[walr].row_norm_bound = {s.walr_row_norm_bound!r} times [walr].weights_bound = "
            f"{s.walr.weights_bound!r} is too large: the release's sensitivity and noise std (up to "
            f"{s.cap * SIGMA_RANGE[1]:g} x their product) are not finite numbers")


def _check_clipping_norm(s: Scenario, clipping_norm: float, key: str) -> None:
    """A clipping norm whose sensitivity and noise std (see ``_check_derived``) are finite numbers."""

    assert s.dpsgd is not None  # only scenarios with a DP-SGD phase have a clipping norm
    d = s.dpsgd
    sigma = max(d.noise_multiplier or 0.0, d.max_noise_multiplier or 0.0, SIGMA_RANGE[1])
    factor = (2 if s.adjacency is Adjacency.REPLACE_ONE else 1) * s.cap * sigma
    if not math.isfinite(clipping_norm * factor):
        raise InvalidParameterError(
            f"{key} = {clipping_norm!r} is too large: the sensitivity and noise std derived from it (up to "
            f"{factor:g} x the clipping norm) are not finite numbers")


def _check_consistency(s: Scenario) -> tuple[str, ...]:
    """Contradictions between values are errors; doubtful but legal settings become warnings."""
    if is_example_unit(s.unit_name) and s.cap > 1:
        raise InvalidParameterError(
            f"[privacy].cap = {s.cap} contradicts [privacy].unit = {s.unit_name!r}: name the unit the cap applies to")
    warnings = _check_delta(s)
    _check_adjacency_for_algorithm(s)
    _check_hybrid_only_keys(s)
    _check_batch_sizes(s)
    _check_epoch_sampling(s)
    _check_units(s)
    _check_derived(s)
    _check_features(s)
    _check_size_release(s)
    _check_grid(s)
    _check_calibration(s)
    _check_composition(s)
    return tuple(warnings + _doubtful_settings(s))


def _check_composition(s: Scenario) -> None:
    """A PLD budget needs phases that compose by PLD here, planned together as one run.

    The rest (group privacy, eps/K_i, truncated Poisson) the planner refuses with the reason
    once it has the phases; these two the scenario alone shows.
    """
    if s.composition != "pld":
        return
    if s.tuning is not None:
        raise InvalidParameterError('[accounting].composition = "pld" does not combine with [tuning]: the tuning '
                                    'accounting composes whole runs itself; use composition = "basic"')
    if s.size_release_epsilon is not None:
        raise InvalidParameterError('[accounting].composition = "pld" does not combine with '
                                    '[data].size_release_epsilon: the DP count is released before the plan and '
                                    'composed by basic composition; use composition = "basic"')


def _check_delta(s: Scenario) -> list[str]:
    """Whether the resolved delta is usable for the algorithm: an error, or a warning when it is not below 1/N."""
    d, algorithm, n = s.resolved_delta, s.algorithm, s.dataset_size
    if not 0 <= d < 1:
        raise InvalidParameterError(f"[budget].delta resolves to {d!r}, which is not in [0, 1)")
    if d == 0 and algorithm in ("dpsgd", "walr"):
        raise InvalidParameterError(f"[budget].delta must be > 0 for algorithm {algorithm!r} (only randomized "
                                    "response is pure DP)")
    warning = validate.delta_warning(d, n)
    if warning is None:
        return []
    if s.delta_policy == "strict":
        raise InvalidParameterError(
            f"[budget].delta = {d:.6g} is not below 1/N = {1.0 / n:.6g}, which delta_policy = \"strict\" refuses")
    return [warning]


def _check_adjacency_for_algorithm(s: Scenario) -> None:
    """RR, Hybrid and WALR protect labels only, so they are accounted under replace-one only."""
    algorithm = s.algorithm
    if algorithm in ("rr", "hybrid") and s.adjacency is not Adjacency.REPLACE_ONE:
        raise InvalidParameterError(
            f"[privacy].adjacency must be replace-one for algorithm {algorithm!r}: randomized response protects "
            "labels, a replace-one relation")
    if algorithm == "walr" and s.adjacency is not Adjacency.REPLACE_ONE:
        raise InvalidParameterError(
            "[privacy].adjacency must be replace-one for algorithm 'walr': WALR's descent reads every row's "
            "features without noise, so only a change of labels (label DP) is protected, not a row's presence")


def _check_hybrid_only_keys(s: Scenario) -> None:
    """[algorithm].split and [algorithm].tower are Hybrid's keys."""
    if s.algorithm == "hybrid":
        return
    if s.split is not None:
        raise InvalidParameterError(f"[algorithm].split applies to hybrid only, not {s.algorithm!r}")
    if s.tower is not None:
        raise InvalidParameterError(f"[algorithm].tower applies to hybrid only, not {s.algorithm!r}")


def _check_batch_sizes(s: Scenario) -> None:
    """A DP-SGD or RR batch (and DP-SGD's truncation bound) fits in the dataset."""
    n = s.dataset_size
    if s.dpsgd is not None:
        if s.dpsgd.batch_size > n:
            raise InvalidParameterError(f"[dpsgd].batch_size ({s.dpsgd.batch_size}) must not exceed "
                                        f"[data].dataset_size ({n})")
        if s.dpsgd.max_batch_size is not None:
            check_max_batch_size(s.dpsgd.batch_size, s.dpsgd.max_batch_size, n)
    if s.rr is not None and s.rr.batch_size is not None and s.rr.batch_size > n:
        raise InvalidParameterError(f"[rr].batch_size ({s.rr.batch_size}) must not exceed [data].dataset_size ({n})")


def _check_features(s: Scenario) -> None:
    """Capping needs unit ids; a weight column is WALR's."""
    if s.features is None:
        return
    if s.cap > 1 and s.features.unit_id is None:
        raise InvalidParameterError("[features].unit_id is required: the unit is capped at "
                                    f"{s.cap} examples, and capping needs unit ids")
    if s.features.weight is not None and s.algorithm != "walr":
        raise InvalidParameterError(f"[features].weight applies to algorithm 'walr' only, not {s.algorithm!r}")


def _check_calibration(s: Scenario) -> None:
    """Intercept calibration: not with a [tuning] grid, and only for the algorithms that train a model it shifts."""
    if s.calibration is None:
        return
    if s.tuning is not None and s.tuning.is_grid:
        raise InvalidParameterError("[calibration] with a [tuning] grid is not supported yet: the grid plans its "
                                    "configurations without the calibration release; drop one of them")
    if s.algorithm not in CALIBRATED:
        raise InvalidParameterError(f"[calibration] does not apply to algorithm {s.algorithm!r}: it calibrates the "
                                    "intercept of a model trained by rr, dpsgd or hybrid")


def _doubtful_settings(s: Scenario) -> list[str]:
    """Legal settings that are probably not what was meant: the warnings after the delta's."""
    warnings = []
    if s.rr is not None and s.rr.per_impression != "eps/K" and s.cap == 1:
        warnings.append(f"[rr].per_impression = {s.rr.per_impression!r} only matters for a unit cap > 1")
    if s.calibration is None and s.algorithm in ("dpsgd", "hybrid") and s.tuning is not None and s.tuning.is_grid:
        warnings.append("no intercept calibration: a [tuning] grid does not plan its release, and after DP-SGD the "
                        "mean prediction can sit well below the base rate")
    return warnings


def _check_epoch_sampling(s: Scenario) -> None:
    """Allocation and shuffled batches run whole epochs; allocation is accounted under add-remove only."""
    d = s.dpsgd
    if d is None or d.sampling not in EPOCH_SAMPLINGS:
        return
    key = f'[dpsgd].sampling = "{d.sampling}"'
    epoch_steps(dataset_size=s.dataset_size, batch_size=d.batch_size, epochs=d.epochs, steps=d.steps,
                names=("[dpsgd].epochs", "[dpsgd].steps"))
    if d.sampling == "allocation" and s.adjacency is not Adjacency.ADD_REMOVE:
        raise InvalidParameterError(f"{key} is accounted under add-remove only; [privacy].adjacency is "
                                    f"{s.adjacency.value!r}: use sampling \"poisson\" or \"shuffle\"")
    if s.tuning is not None:
        raise InvalidParameterError(f"{key} with [tuning] is not supported: tuning is accounted for Poisson "
                                    "batches; use sampling \"poisson\"")
    if s.size_release_epsilon is not None:
        raise InvalidParameterError(f"{key} needs the exact N (its epochs are N // B steps); "
                                    "[data].size_release_epsilon releases a DP count instead: use sampling \"poisson\"")


def _check_units(s: Scenario) -> None:
    """M units hold the N rows, at most K each; sampling units needs M, Poisson batches and K > 1."""
    m, n, k = s.units, s.dataset_size, s.cap
    if m is not None and not m <= n <= k * m:
        raise InvalidParameterError(f"[data].units = {m} cannot hold [data].dataset_size = {n} rows at most "
                                    f"[privacy].cap = {k} per unit: need units <= dataset_size <= cap x units")
    d = s.dpsgd
    if d is None or d.sample_by != "unit":
        return
    key = '[dpsgd].sample_by = "unit"'
    if k == 1:
        raise InvalidParameterError(f"{key} needs a unit capped at K > 1 ([privacy].cap); with one example per "
                                    "unit it is example sampling: drop sample_by")
    if m is None:
        raise InvalidParameterError(f"{key} needs [data].units (M, the units after capping): each unit joins a "
                                    "batch with probability batch_size / M")
    if d.sampling != "poisson":
        raise InvalidParameterError(f'{key} is accounted for Poisson batches over units; [dpsgd].sampling is '
                                    f'{d.sampling!r}: use sampling = "poisson"')
    if d.batch_size > m:
        raise InvalidParameterError(f"[dpsgd].batch_size ({d.batch_size}) counts units under {key} and must not "
                                    f"exceed [data].units ({m})")
    if s.tuning is not None:
        raise InvalidParameterError(f"{key} with [tuning] is not supported yet: tuning is accounted for "
                                    "example-sampled runs; drop one of them")
    if s.size_release_epsilon is not None:
        raise InvalidParameterError(f"{key} needs the exact M; [data].size_release_epsilon releases a DP count "
                                    "of rows instead: drop one of them")


def _check_grid(s: Scenario) -> None:
    """A grid names only what its algorithm has, and only for runs it can train on a part of the data."""
    t = s.tuning
    if t is None or not t.is_grid:
        return
    if t.split is not None and s.algorithm != "hybrid":
        raise InvalidParameterError(f"[tuning].split applies to hybrid only, not {s.algorithm!r}")
    for key in ("clipping_norm", "dpsgd_learning_rate"):
        if getattr(t, key) is not None and s.dpsgd is None:
            raise InvalidParameterError(f"[tuning].{key} applies to algorithms with a DP-SGD phase (dpsgd, hybrid), "
                                        f"not {s.algorithm!r}")
    for i, c in enumerate(t.clipping_norm or ()):
        _check_clipping_norm(s, c, f"[tuning].clipping_norm[{i}]")
    if s.dpsgd is not None and s.dpsgd.sampling == "truncated-poisson":
        raise InvalidParameterError(
            '[tuning] grid needs [dpsgd].sampling = "poisson": each configuration trains on the training part of '
            "the data, whose size is not the planned N that truncated-Poisson accounting depends on")


def _check_size_release(s: Scenario) -> None:
    """A DP count of N protects N where neighbours differ in it: under add-remove only."""
    size_release = s.size_release_epsilon
    if size_release is None:
        return
    if s.adjacency is not Adjacency.ADD_REMOVE:
        raise InvalidParameterError(
            f"[data].size_release_epsilon = {size_release!r} applies under add-remove adjacency only: under "
            f"{s.adjacency.value}, neighbouring datasets have the same N, so N is public and needs no DP count")
    if not size_release < s.epsilon:
        raise InvalidParameterError(
            f"[data].size_release_epsilon = {size_release!r} must be below [budget].epsilon = {s.epsilon!r}: the "
            "training phases get what the count leaves")


def is_example_unit(unit_name: str) -> bool:
    """Whether a unit name means one example (no cap needed)."""
    return unit_name.strip().lower() in ("impression", "example", "row", "impression x time")
