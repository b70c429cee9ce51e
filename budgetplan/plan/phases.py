"""The phases of a plan: one frozen, validated type per kind, dispatched by type.

A plan is a sequence of phases. Each kind has its own parameter type, holding every value
a trainer needs that touches privacy, and its own phase type, holding the mechanism it
was accounted as, its share of the budget and the guarantee:

    RRPhase     randomized response on labels             RRParams
    DPSGDPhase  DP-SGD: (truncated) Poisson, allocation or shuffled batches  DPSGDParams
    WALRPhase   one Gaussian release of sum y_i w_i x_i   WALRParams
    CountPhase  the DP count of N, released before planning  CountParams
    CalibrationPhase  one Gaussian release of the trained model's mean prediction over a
                grid of intercept shifts, and of the count of positives  CalibrationParams

Code that treats kinds differently matches on the type (``match phase: case RRPhase():``);
the JSON tag ``"name"`` is read and written only here. The JSON form is the one plan files
have always had: ``{"name", "mechanism", "target_epsilon", "target_delta", "method",
"unit_accounting", "parameters", "guarantee"}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeAlias

from budgetplan.accounting.guarantee import Guarantee
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    DiscreteLaplaceCount,
    GaussianRelease,
    PoissonDPSGD,
    RandomizedResponse,
    ShuffledDPSGD,
    TruncatedPoissonDPSGD,
    UnitPoissonDPSGD,
    mechanism_from_dict,
    mechanism_to_dict,
)
from budgetplan.scenario.split_rules import part_rows
from budgetplan.units import CAPPING_RULES, SAMPLE_BY
from budgetplan.util import typed, validate

__all__ = [
    "UnitPart",
    "UNITS_SPLIT_KEY",
    "RRParams",
    "DPSGDParams",
    "WALRParams",
    "CountParams",
    "CalibrationParams",
    "RRPhase",
    "DPSGDPhase",
    "WALRPhase",
    "CountPhase",
    "CalibrationPhase",
    "Phase",
    "PhaseBase",
    "register_phase_kind",
    "phase_from_dict",
    "phase_to_dict",
    "PER_IMPRESSION_RULES",
    "SAMPLING",
    "TOWERS",
]

PER_IMPRESSION_RULES = ("eps/K", "eps/K_i", "tight")
SAMPLING = ("poisson", "truncated-poisson", "allocation", "shuffle")
TOWERS = ("frozen", "fine-tune", "trained")
METHODS = ("exact", "pld", "rdp", "prv")
UNIT_ACCOUNTING = ("tight", "group")


class _Capped(Protocol):
    @property
    def capping(self) -> str | None: ...


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _capping(obj: _Capped, cap: int) -> None:
    if cap > 1:
        typed.choice("capping", obj.capping, CAPPING_RULES)
    elif obj.capping is not None:
        raise InvalidParameterError(f"capping must be null for cap = 1, got {obj.capping!r}")


UNITS_SPLIT_KEY = "budgetplan units split v1"  # the blake2b key of a units split's hash (public, in the plan)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitPart:
    """The units a phase trains on under a units split: those whose position is in [low, high).

    A unit's position is the blake2b-64 hash of its id's string form keyed with ``key``, as a
    fraction of 2^64; without a unit id column each row is placed by a generator seeded from
    the key (a public draw, made before any data is read). The position depends on the unit's
    id alone, which a replace-one neighbour leaves unchanged, so a unit's data reaches the
    phases of one part only. ``rows`` is the part's expected size (its share of N).
    """

    low: float
    high: float
    rows: int
    key: str

    def __post_init__(self) -> None:
        for name in ("low", "high"):
            validate.probability(f"unit_part.{name}", getattr(self, name), allow_zero=True, allow_one=True)
        if not self.low < self.high or (self.low, self.high) == (0.0, 1.0):
            raise InvalidParameterError(f"unit_part must be a proper part [low, high) of [0, 1), got "
                                        f"[{self.low!r}, {self.high!r})")
        _set(self, "rows", validate.positive_int("unit_part.rows", self.rows))
        typed.text("unit_part.key", self.key)

    @classmethod
    def halves(cls, dataset_size: int, share: float) -> tuple[UnitPart, UnitPart]:
        """The two parts of ``split = "units=<share>"`` over N rows: RR's [0, share), DP-SGD's [share, 1)."""
        rr_rows, sgd_rows = part_rows(dataset_size, share)
        return (cls(low=0.0, high=share, rows=rr_rows, key=UNITS_SPLIT_KEY),
                cls(low=share, high=1.0, rows=sgd_rows, key=UNITS_SPLIT_KEY))

    def overlaps(self, other: UnitPart | None) -> bool:
        """Whether a unit may fall in both parts (None: every unit)."""
        return other is None or (self.key != other.key or (self.low < other.high and other.low < self.high))


@dataclass(frozen=True, slots=True, kw_only=True)
class RRParams:
    """What the RR phase executes.

    Attributes:
        per_impression_rule: how a unit's budget is spread over its examples: ``"eps/K"``,
            ``"eps/K_i"`` (per the unit's own count K_i) or ``"tight"``.
        unit_epsilon: the phase budget per unit.
        per_impression_epsilon, flip_probability: the budget of one label and its flip
            probability 1 / (1 + e^eps).
        cap, capping: K examples per unit after capping, and the rule (None for K = 1).
        epochs, batch_size: training on the noisy labels (post-processing).
        dataset_size: N.
        labels_randomised, model: plain-language descriptions for the statement.
        per_impression_epsilon_by_count, flip_probability_by_count: eps/K_i only, index
            K_i - 1.
        validation_fraction: the share of units held out of the RR phase's training and
            scored on their RR labels, debiased (post-processing of the release): the phase
            keeps its state with the lowest debiased validation log loss and stops when it
            no longer falls, training at most ``epochs``. None (absent): exactly ``epochs``.
        unit_part: under a units split, the units the phase trains on (its held-out units
            among them); None (absent): every unit.
    """

    per_impression_rule: str
    unit_epsilon: float
    per_impression_epsilon: float
    flip_probability: float
    cap: int
    capping: str | None
    epochs: int
    batch_size: int | None
    dataset_size: int
    labels_randomised: str
    model: str
    per_impression_epsilon_by_count: tuple[float, ...] | None = typed.omit_if_none()
    flip_probability_by_count: tuple[float, ...] | None = typed.omit_if_none()
    validation_fraction: float | None = typed.omit_if_none()
    unit_part: UnitPart | None = typed.nested(UnitPart, omit=True)

    def __post_init__(self) -> None:
        typed.choice("per_impression_rule", self.per_impression_rule, PER_IMPRESSION_RULES)
        _set(self, "validation_fraction", typed.optional(validate.open_unit, "validation_fraction",
                                                          self.validation_fraction))
        _set(self, "unit_epsilon", validate.positive("unit_epsilon", self.unit_epsilon))
        _set(self, "per_impression_epsilon", validate.positive("per_impression_epsilon",
                                                                self.per_impression_epsilon))
        rho = validate.probability("flip_probability", self.flip_probability)
        if not rho <= 0.5:  # 0.5 itself: a tiny epsilon rounds to pure noise
            raise InvalidParameterError(f"flip_probability must be at most 0.5, got {rho!r}")
        _set(self, "flip_probability", rho)
        _set(self, "cap", validate.positive_int("cap", self.cap))
        _capping(self, self.cap)
        _set(self, "epochs", validate.positive_int("epochs", self.epochs))
        _set(self, "batch_size", typed.optional(validate.positive_int, "batch_size", self.batch_size))
        _set(self, "dataset_size", validate.positive_int("dataset_size", self.dataset_size))
        typed.text("labels_randomised", self.labels_randomised)
        typed.text("model", self.model)
        by_count = (self.per_impression_epsilon_by_count, self.flip_probability_by_count)
        if self.per_impression_rule == "eps/K_i":
            if by_count[0] is None or by_count[1] is None:
                raise InvalidParameterError("the eps/K_i rule needs per_impression_epsilon_by_count and "
                                            "flip_probability_by_count")
            eps = typed.float_tuple("per_impression_epsilon_by_count", by_count[0], validate.positive)
            rhos = typed.float_tuple("flip_probability_by_count", by_count[1], validate.open_unit)
            if not len(eps) == len(rhos) == self.cap:
                raise InvalidParameterError(f"the eps/K_i tables must have cap = {self.cap} entries, got "
                                            f"{len(eps)} and {len(rhos)}")
            _set(self, "per_impression_epsilon_by_count", eps)
            _set(self, "flip_probability_by_count", rhos)
        elif by_count != (None, None):
            raise InvalidParameterError(f"per-count tables apply to the eps/K_i rule only, not "
                                        f"{self.per_impression_rule!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDParams:
    """What the DP-SGD phase executes.

    Attributes:
        noise_multiplier: sigma; ``noise_std`` = sigma C is the std added to the clipped sum.
        clipping_norm: C; ``sensitivity`` is C (add-remove) or 2C (replace-one).
        sampling_rate: q = batch_size / dataset_size, each example's inclusion probability
            (Poisson); for allocation and shuffled batches only what fixes the divisor q N = B.
        steps: T noisy updates; ``epochs`` = T B / N (Poisson), or T / (N // B) whole epochs.
        sampling: ``"poisson"``, ``"truncated-poisson"`` (then ``max_batch_size``),
            ``"allocation"`` (each example in one uniformly random step of every epoch of
            N // B steps) or ``"shuffle"`` (every epoch a random permutation cut into N // B
            batches of exactly B; the N mod B rows left over sit that epoch out).
        cap, capping: K examples per unit after capping, and the rule.
        normalise_by, model: plain-language descriptions for the statement.
        warm_start, nonsensitive_tower: Hybrid only: what phase 2 starts from and whether
            the non-sensitive tower is ``"frozen"``, ``"fine-tune"`` or ``"trained"``.
        sample_by, units: present only when units are sampled (``"unit"``): M units, each
            joining each batch w.p. q = batch_size / M with its examples' gradients summed and
            clipped once to C; ``batch_size`` then counts units and the noisy sum is divided
            by q M. Absent: examples are sampled (q = batch_size / dataset_size).
        unit_part: under a units split, the units the phase trains on; ``dataset_size`` is
            then the part's expected rows. None (absent): every unit.
    """

    noise_multiplier: float
    noise_std: float
    clipping_norm: float
    sensitivity: float
    sampling_rate: float
    steps: int
    batch_size: int
    epochs: float
    dataset_size: int
    sampling: str
    max_batch_size: int | None
    cap: int
    capping: str | None
    normalise_by: str
    model: str
    warm_start: str | None = typed.omit_if_none()
    nonsensitive_tower: str | None = typed.omit_if_none()
    sample_by: str | None = typed.omit_if_none()
    units: int | None = typed.omit_if_none()
    unit_part: UnitPart | None = typed.nested(UnitPart, omit=True)

    def __post_init__(self) -> None:
        if self.unit_part is not None and (self.sampling != "poisson" or self.units is not None):
            raise InvalidParameterError(f"a DP-SGD phase on a part of the units samples examples with Poisson "
                                        f"batches, got sampling {self.sampling!r}"
                                        + (" by unit" if self.units is not None else ""))
        if (self.sample_by is None) != (self.units is None) or self.sample_by not in (None, "unit"):
            raise InvalidParameterError(f"sample_by = \"unit\" and units go together (omit both to sample examples), "
                                        f"got sample_by={self.sample_by!r}, units={self.units!r}")
        if self.units is not None:
            typed.choice("sample_by", self.sample_by, SAMPLE_BY)
            _set(self, "units", validate.positive_int("units", self.units))
            if self.sampling != "poisson" or self.cap < 2:
                raise InvalidParameterError(f"units are sampled with Poisson batches of a unit capped at K > 1, got "
                                            f"sampling {self.sampling!r} and cap {self.cap!r}")
        for name in ("noise_multiplier", "noise_std", "clipping_norm", "sensitivity", "epochs"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        _set(self, "sampling_rate", validate.probability("sampling_rate", self.sampling_rate, allow_one=True))
        for name in ("steps", "batch_size", "dataset_size", "cap"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        typed.choice("sampling", self.sampling, SAMPLING)
        if self.sampling == "truncated-poisson":
            _set(self, "max_batch_size", validate.positive_int("max_batch_size", self.max_batch_size))
        elif self.max_batch_size is not None:
            raise InvalidParameterError(f"max_batch_size applies to truncated-poisson sampling only, got "
                                        f"{self.max_batch_size!r}")
        _capping(self, self.cap)
        typed.text("normalise_by", self.normalise_by)
        typed.text("model", self.model)
        if (self.warm_start is None) != (self.nonsensitive_tower is None):
            raise InvalidParameterError("warm_start and nonsensitive_tower go together (Hybrid plans)")
        if self.warm_start is not None:
            typed.text("warm_start", self.warm_start)
            typed.choice("nonsensitive_tower", self.nonsensitive_tower, TOWERS)

    @property
    def expected_batch_size(self) -> float:
        """q N = B, what every noisy sum is divided by (never the realised batch size).

        For Poisson batches it is the mean batch. For shuffled batches every batch is exactly
        B. For allocation the mean batch is N / (N // B), which is B when B divides N and
        otherwise a little larger; B is kept because the divisor must be a constant fixed by
        the plan (dividing by the realised size would leak it), and any constant leaves the
        privacy accounting unchanged (post-processing): it only scales the step.
        """
        return self.sampling_rate * (self.dataset_size if self.units is None else self.units)

    @property
    def samples_units(self) -> bool:
        """Whether units, not examples, are sampled and clipped (``sample_by = "unit"``)."""
        return self.units is not None

    @property
    def steps_per_epoch(self) -> int:
        """N // B (at least 1): the steps of one epoch of allocation or shuffled batches."""
        return max(1, self.dataset_size // self.batch_size)


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRParams:
    """What WALR's one Gaussian release executes.

    Attributes:
        noise_std: the std of the noise added once to sum_i y_i w_i x_i.
        sensitivity: weights_bound x row_norm_bound, what one label moves the sum by;
            ``unit_sensitivity`` is K times that.
        features: k, the intercept included; every row is clipped to ``row_norm_bound``
            and every weight to ``weights_bound``. None (absent) with the one-hot encoding,
            whose k follows from the data's encoding (the noise does not depend on k).
        encoding: "one-hot": categoricals one-hot, numerics scaled into [0, 1] by a transform
            fitted on the features (public under label DP), so every row's norm is at most
            ``row_norm_bound`` = sqrt(1 + columns); None (absent): numeric columns as they are.
        classical_noise_std, classical_valid: the classical formula's noise, for comparison.
    """

    noise_std: float
    sensitivity: float
    unit_sensitivity: float
    features: int | None = typed.omit_if_none()
    encoding: str | None = typed.omit_if_none()
    row_norm_bound: float
    weights_bound: float
    dataset_size: int
    cap: int
    capping: str | None
    release: str
    classical_noise_std: float
    classical_valid: bool

    def __post_init__(self) -> None:
        for name in ("noise_std", "sensitivity", "unit_sensitivity", "row_norm_bound", "weights_bound",
                     "classical_noise_std"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        for name in ("dataset_size", "cap"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        if (self.features is None) != (self.encoding == "one-hot") or self.encoding not in (None, "one-hot"):
            raise InvalidParameterError(f"a WALR phase states features (numeric columns) or encoding \"one-hot\", "
                                        f"got features={self.features!r}, encoding={self.encoding!r}")
        _set(self, "features", typed.optional(validate.positive_int, "features", self.features))
        _capping(self, self.cap)
        typed.text("release", self.release)
        typed.flag("classical_valid", self.classical_valid)


@dataclass(frozen=True, slots=True, kw_only=True)
class CountParams:
    """The DP count of the dataset size that the plan's N is (add-remove only).

    Attributes:
        epsilon: the release's budget, (epsilon, 0).
        sensitivity: K, the rows one unit adds or removes after capping.
        noise_std: the discrete Laplace noise's standard deviation, sqrt(2 e^-a) / (1 - e^-a)
            with a = epsilon / K.
        dataset_size: the released count N~, which every other phase uses as N.
        cap, capping: the unit's cap (= ``sensitivity``) and its rule.
        released: when and how, for the statement.
    """

    epsilon: float
    sensitivity: int
    noise_std: float
    dataset_size: int
    cap: int
    capping: str | None
    released: str

    def __post_init__(self) -> None:
        for name in ("epsilon", "noise_std"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        for name in ("sensitivity", "dataset_size", "cap"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        _capping(self, self.cap)
        if self.sensitivity != self.cap:
            raise InvalidParameterError(f"sensitivity must be the unit's cap {self.cap}, got {self.sensitivity}")
        typed.text("released", self.released)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationParams:
    """What the intercept calibration's one Gaussian release executes (``budgetplan.intercept``).

    Attributes:
        shifts: the grid of logit shifts d_1 < ... < d_m the sums of sigmoids are taken at.
        coordinates: m + 1, the sums and the count of positives.
        sensitivity: sqrt(coordinates), what one example moves the released vector by in L2
            under either adjacency (every coordinate of its contribution lies in [0, 1]);
            ``unit_sensitivity`` is K times that.
        noise_std: the std of the noise added once to every coordinate.
        share: the fraction of the run's epsilon and delta the release takes.
        target: what the shift is solved for: ``"positives"`` (the noisy count), or
            ``"positives and rr labels"`` (combined with the debiased count of the RR labels).
        model, release: plain-language descriptions for the statement.
    """

    shifts: tuple[float, ...]
    coordinates: int
    sensitivity: float
    unit_sensitivity: float
    noise_std: float
    share: float
    dataset_size: int
    cap: int
    capping: str | None
    target: str
    model: str
    release: str

    def __post_init__(self) -> None:
        shifts = typed.float_tuple("shifts", self.shifts)
        if len(shifts) < 2 or any(b <= a for a, b in zip(shifts, shifts[1:])) or 0.0 not in shifts:
            raise InvalidParameterError(f"shifts must be at least two increasing numbers, 0 among them, got "
                                        f"{list(shifts)!r}")
        _set(self, "shifts", shifts)
        for name in ("coordinates", "dataset_size", "cap"):
            _set(self, name, validate.positive_int(name, getattr(self, name)))
        for name in ("sensitivity", "unit_sensitivity", "noise_std"):
            _set(self, name, validate.positive(name, getattr(self, name)))
        _set(self, "share", validate.probability("share", self.share))
        _capping(self, self.cap)
        typed.choice("target", self.target, CALIBRATION_TARGETS)
        typed.text("model", self.model)
        typed.text("release", self.release)


CALIBRATION_TARGETS = ("positives", "positives and rr labels")


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseBase:
    """What every phase has: its share of the budget, how it was accounted, the guarantee."""

    target_epsilon: float
    target_delta: float
    method: str
    unit_accounting: str
    guarantee: Guarantee

    def _check_common(self) -> None:
        _set(self, "target_epsilon", validate.positive("target_epsilon", self.target_epsilon))
        _set(self, "target_delta", validate.probability("target_delta", self.target_delta, allow_zero=True))
        typed.choice("method", self.method, METHODS)
        typed.choice("unit_accounting", self.unit_accounting, UNIT_ACCOUNTING)
        if not isinstance(self.guarantee, Guarantee):
            raise InvalidParameterError(f"guarantee must be a Guarantee, got {type(self.guarantee).__name__}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RRPhase(PhaseBase):
    """Randomized response on the labels, once per example."""

    name: ClassVar[str] = "rr"
    mechanism: RandomizedResponse
    params: RRParams

    def __post_init__(self) -> None:
        self._check_common()
        _expect(self, RandomizedResponse, RRParams)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDPhase(PhaseBase):
    """DP-SGD over the plan's steps."""

    name: ClassVar[str] = "dpsgd"
    mechanism: PoissonDPSGD | UnitPoissonDPSGD | TruncatedPoissonDPSGD | AllocationDPSGD | ShuffledDPSGD
    params: DPSGDParams

    def __post_init__(self) -> None:
        self._check_common()
        _expect(self, (PoissonDPSGD, UnitPoissonDPSGD, TruncatedPoissonDPSGD, AllocationDPSGD, ShuffledDPSGD),
                DPSGDParams)
        if isinstance(self.mechanism, UnitPoissonDPSGD) != self.params.samples_units:
            raise InvalidParameterError("a DP-SGD phase that samples units is accounted as UnitPoissonDPSGD, and only "
                                        f"it; got {type(self.mechanism).__name__} with sample_by "
                                        f"{self.params.sample_by!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRPhase(PhaseBase):
    """WALR's one Gaussian release; the descent after it is post-processing."""

    name: ClassVar[str] = "walr"
    mechanism: GaussianRelease
    params: WALRParams

    def __post_init__(self) -> None:
        self._check_common()
        _expect(self, GaussianRelease, WALRParams)


@dataclass(frozen=True, slots=True, kw_only=True)
class CountPhase(PhaseBase):
    """The DP count of N, released once before planning: pure DP, no delta."""

    name: ClassVar[str] = "count"
    mechanism: DiscreteLaplaceCount
    params: CountParams

    def __post_init__(self) -> None:
        self._check_common()
        _expect(self, DiscreteLaplaceCount, CountParams)
        if self.target_delta != 0:
            raise InvalidParameterError(f"a count phase is pure DP: target_delta must be 0, got {self.target_delta!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationPhase(PhaseBase):
    """The intercept calibration's one Gaussian release after training; the shift solved from it is free."""

    name: ClassVar[str] = "calibration"
    mechanism: GaussianRelease
    params: CalibrationParams

    def __post_init__(self) -> None:
        self._check_common()
        _expect(self, GaussianRelease, CalibrationParams)


Phase: TypeAlias = RRPhase | DPSGDPhase | WALRPhase | CountPhase | CalibrationPhase
# name -> (phase class, its parameters' class): the built-in kinds, then the registered ones
_KINDS: dict[str, tuple[type[Any], type[Any]]] = {
    k.name: (k, p) for k, p in ((RRPhase, RRParams), (DPSGDPhase, DPSGDParams), (WALRPhase, WALRParams),
                                (CountPhase, CountParams), (CalibrationPhase, CalibrationParams))}


def register_phase_kind(kind: type[Any], params: type[Any]) -> None:
    """Make plan files read and write phases of ``kind`` (a frozen ``PhaseBase`` subclass).

    ``kind`` has a ``name`` class variable (the JSON ``name``), a ``mechanism`` and a
    ``params`` field of class ``params`` (a frozen dataclass that ``budgetplan.util.typed``
    converts). The other layers register the kind where they dispatch: the planner
    (``register_algorithm``), the records (``register_phase_entries``), the audit
    (``reaccounts``, ``register_run_entry``), the statement (``describes``) and the trainers
    (``register_executor``).
    """
    if not (isinstance(kind, type) and issubclass(kind, PhaseBase)):
        raise TypeError(f"a phase kind subclasses PhaseBase, got {kind!r}")
    name = getattr(kind, "name", None)
    if not isinstance(name, str) or not name or name in _KINDS:
        raise ValueError(f"phase kind name {name!r} is empty or already registered")
    _KINDS[name] = (kind, params)


def _expect(phase: Phase, mechanism_types: type[object] | tuple[type[object], ...], params_type: type[object]) -> None:
    if not isinstance(phase.mechanism, mechanism_types):
        raise InvalidParameterError(f"a {phase.name} phase cannot be accounted as "
                                    f"{type(phase.mechanism).__name__}")
    if not isinstance(phase.params, params_type):
        raise InvalidParameterError(f"a {phase.name} phase needs {params_type.__name__}, got "
                                    f"{type(phase.params).__name__}")


def phase_to_dict(phase: Phase) -> dict[str, Any]:
    """The phase's JSON object, as plan files hold it."""
    return {
        "name": phase.name, "mechanism": mechanism_to_dict(phase.mechanism),
        "target_epsilon": phase.target_epsilon, "target_delta": phase.target_delta, "method": phase.method,
        "unit_accounting": phase.unit_accounting, "parameters": typed.to_json_object(phase.params),
        "guarantee": phase.guarantee.to_dict(),
    }


_PHASE_KEYS = ("name", "mechanism", "target_epsilon", "target_delta", "method", "unit_accounting", "parameters",
               "guarantee")


def phase_from_dict(data: object, where: str = "phase") -> Phase:
    """Read a phase's JSON object strictly; errors name ``where`` and the field."""
    if not isinstance(data, dict):
        raise InvalidParameterError(f"{where} must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_PHASE_KEYS))
    if unknown:
        raise InvalidParameterError(f"{where} has an unknown field {unknown[0]!r}")
    missing = [k for k in _PHASE_KEYS if k not in data]
    if missing:
        raise InvalidParameterError(f"{where} is missing the field {missing[0]!r}")
    entry = _KINDS.get(data["name"]) if isinstance(data["name"], str) else None
    if entry is None:
        raise InvalidParameterError(f"{where}.name must be one of {', '.join(map(repr, _KINDS))}, got "
                                    f"{data['name']!r}")
    kind, params_type = entry
    params = typed.from_json_object(params_type, data["parameters"], f"{where}.parameters")
    try:
        mechanism = mechanism_from_dict(data["mechanism"])
        guarantee = Guarantee.from_dict(data["guarantee"])
        phase: Phase = kind(mechanism=mechanism, params=params, target_epsilon=data["target_epsilon"],
                    target_delta=data["target_delta"], method=data["method"],
                    unit_accounting=data["unit_accounting"], guarantee=guarantee)
        return phase
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidParameterError(f"{where}: malformed ({exc!r})") from None
