"""Frozen descriptions of the releases budgetplan accounts. No math lives here.

A mechanism says what is released and with which noise; how much privacy that costs is a
question for ``budgetplan.accounting``, asked together with an adjacency and a privacy
unit. Constructors validate every number (finite, in range, integer where it must be), so
no back-end ever sees NaN or infinity.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, TypeAlias

from budgetplan.errors import InvalidParameterError
from budgetplan.limits import MAX_STEPS
from budgetplan.util import validate

__all__ = [
    "RandomizedResponse",
    "GaussianRelease",
    "PoissonDPSGD",
    "UnitPoissonDPSGD",
    "TruncatedPoissonDPSGD",
    "AllocationDPSGD",
    "ShuffledDPSGD",
    "DiscreteLaplaceCount",
    "Composition",
    "Mechanism",
    "mechanism_to_dict",
    "mechanism_from_dict",
]


def _steps(value: object) -> int:
    steps = validate.positive_int("steps", value)
    if steps > MAX_STEPS:
        raise InvalidParameterError(f"steps must be at most {MAX_STEPS:.0e} (budgetplan's stated limit), got "
                                    f"{float(steps):.4g}")
    return steps


# The largest per-example RR budget: its flip probability 1 / (1 + e^700) = 1e-304 is still a
# positive float64; at 745 it rounds to 0.
MAX_RR_EPSILON = 700.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RandomizedResponse:
    """Binary randomized response applied once to each example's label.

    The label is kept with probability e^eps / (1 + e^eps) and flipped otherwise (Warner
    1965). Training any number of epochs on the same noisy labels is post-processing;
    drawing fresh noisy labels is a new release and composes.

    Attributes:
        epsilon: the per-example budget (per impression).
    """

    epsilon: float

    def __post_init__(self) -> None:
        eps = validate.positive("epsilon", self.epsilon)
        if eps > MAX_RR_EPSILON:
            raise InvalidParameterError(
                f"epsilon must be at most {MAX_RR_EPSILON:g} for randomized response (beyond it the flip probability "
                f"1 / (1 + e^eps) is not a positive float64, and labels would be released as they are), got {eps!r}")
        object.__setattr__(self, "epsilon", eps)


@dataclass(frozen=True, slots=True, kw_only=True)
class GaussianRelease:
    """One release of a vector sum plus N(0, noise_std^2 I), e.g. WALR's noisy dot product.

    Attributes:
        noise_std: standard deviation of the noise on each coordinate.
        sensitivity: the L2 distance by which one example can move the released sum under
            the adjacency it is accounted with. For a WALR label change that is
            max_i ||w_i x_i|| (not twice that): state it for the relation you mean.
    """

    noise_std: float
    sensitivity: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_std", validate.positive("noise_std", self.noise_std))
        object.__setattr__(self, "sensitivity", validate.positive("sensitivity", self.sensitivity))


@dataclass(frozen=True, slots=True, kw_only=True)
class _PoissonFields:
    """The fields and validation every Poisson-sampled DP-SGD mechanism shares.

    Attributes:
        noise_multiplier: sigma, the noise std in units of the clipping norm C.
        sampling_rate: q, each sampled element's inclusion probability per step.
        steps: the number of noisy updates T.
    """

    noise_multiplier: float
    sampling_rate: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", validate.positive("noise_multiplier", self.noise_multiplier))
        object.__setattr__(self, "sampling_rate",
                           validate.probability("sampling_rate", self.sampling_rate, allow_one=True))
        object.__setattr__(self, "steps", _steps(self.steps))


@dataclass(frozen=True, slots=True, kw_only=True)
class PoissonDPSGD(_PoissonFields):
    """DP-SGD with Poisson sampling: each example joins each batch independently w.p. q.

    Per-example gradients are clipped to norm C, summed, and N(0, (noise_multiplier C)^2 I)
    is added; the guarantee holds only if batches really are Poisson samples (shuffled or
    fixed-size batches void it). Fields: ``_PoissonFields``'s (q = expected batch size /
    dataset size).
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class UnitPoissonDPSGD(_PoissonFields):
    """DP-SGD over units: each unit joins each batch independently w.p. q, clipped as a whole.

    A sampled unit's examples' gradients are summed and the sum is clipped once to C, then
    N(0, (noise_multiplier C)^2 I) is added to the sum over units (user-level sampling,
    Charles et al., arXiv:2407.07737). The unit, not the example, is the element sampled
    and clipped, so it is accounted as ordinary Poisson DP-SGD at q whatever the cap K.

    Fields: ``_PoissonFields``'s (q = expected units per batch / number of units M).
    """

    def as_poisson(self) -> PoissonDPSGD:
        """The example-level mechanism with the same numbers: what one unit's change costs."""
        return PoissonDPSGD(noise_multiplier=self.noise_multiplier, sampling_rate=self.sampling_rate,
                            steps=self.steps)


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncatedPoissonDPSGD(_PoissonFields):
    """DP-SGD whose Poisson batches are cut to a fixed maximum size by a random subset.

    Accounted as dp_accounting's TruncatedSubsampledGaussianDpEvent (arXiv:2508.15089).

    Attributes (beside ``_PoissonFields``'s; q is the inclusion probability before truncation):
        dataset_size: N.
        max_batch_size: batches larger than this are truncated to it.
    """

    dataset_size: int
    max_batch_size: int

    def __post_init__(self) -> None:
        _PoissonFields.__post_init__(self)  # explicit: slots dataclasses break zero-argument super()
        object.__setattr__(self, "dataset_size", validate.positive_int("dataset_size", self.dataset_size))
        object.__setattr__(
            self, "max_batch_size", validate.positive_int("max_batch_size", self.max_batch_size)
        )
        if self.max_batch_size > self.dataset_size:
            raise InvalidParameterError(
                f"max_batch_size must be <= dataset_size ({self.dataset_size}), got {self.max_batch_size}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class _EpochDPSGD:
    """The fields and validation of the epoch-structured DP-SGD mechanisms (whole epochs of T steps).

    Attributes:
        noise_multiplier: sigma in units of the clipping norm.
        steps_per_epoch: T.
        epochs: E whole epochs.
    """

    noise_multiplier: float
    steps_per_epoch: int
    epochs: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", validate.positive("noise_multiplier", self.noise_multiplier)
        )
        object.__setattr__(self, "steps_per_epoch", validate.positive_int("steps_per_epoch", self.steps_per_epoch))
        object.__setattr__(self, "epochs", validate.positive_int("epochs", self.epochs))
        _steps(self.steps_per_epoch * self.epochs)

    @property
    def steps(self) -> int:
        """The noisy updates: T per epoch."""
        return self.steps_per_epoch * self.epochs


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationDPSGD(_EpochDPSGD):
    """DP-SGD with random allocation ("balls in bins"): in every epoch each example joins
    exactly one of the epoch's T steps, chosen uniformly and independently of the others.

    Batch sizes vary (multinomial); accounted by ``budgetplan.accounting.allocation``
    (Feldman and Shenfeld, arXiv:2502.08202). The guarantee holds only if the trainer
    allocates so, from an unpredictable generator. Fields: ``_EpochDPSGD``'s.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class ShuffledDPSGD(_EpochDPSGD):
    """DP-SGD over shuffled fixed-size batches: each epoch a random permutation cut into T batches.

    No amplification is claimed: accounted as one Gaussian release per epoch (each example
    is in at most one batch of an epoch), with Chua et al.'s lower bound beside it
    (``budgetplan.accounting.shuffle``). Fields: ``_EpochDPSGD``'s.
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscreteLaplaceCount:
    """A count released once plus discrete Laplace (two-sided geometric) noise.

    The noise Z has P(Z = z) proportional to exp(-epsilon |z| / sensitivity) on the
    integers (Ghosh, Roughgarden and Sundararajan 2009, arXiv:0811.2841; dp_accounting's
    DiscreteLaplaceDpEvent with noise parameter epsilon / sensitivity), so neighbours whose
    counts differ by at most ``sensitivity`` are (epsilon, 0)-indistinguishable.

    Attributes:
        epsilon: the budget the noise was drawn for.
        sensitivity: how far the count may move between neighbouring datasets: 1 for a
            count of rows, K for the rows of a unit capped at K.
    """

    epsilon: float
    sensitivity: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", validate.positive("epsilon", self.epsilon))
        object.__setattr__(self, "sensitivity", validate.positive_int("sensitivity", self.sensitivity))

    @property
    def noise_parameter(self) -> float:
        """a = epsilon / sensitivity: P(Z = z) = tanh(a / 2) exp(-a |z|)."""
        return self.epsilon / self.sensitivity


@dataclass(frozen=True, slots=True, kw_only=True)
class Composition:
    """Phases run one after another on the same data, e.g. Hybrid's RR phase then DP-SGD.

    Later phases may depend on the outputs of earlier ones (adaptive composition).
    """

    phases: tuple[Mechanism, ...]

    def __post_init__(self) -> None:
        phases = tuple(self.phases)
        if not phases:
            raise InvalidParameterError("phases must contain at least one mechanism, got ()")
        for i, phase in enumerate(phases):
            if not isinstance(phase, _LEAVES + (Composition,)):
                raise InvalidParameterError(f"phases[{i}] must be a mechanism, got {phase!r}")
        object.__setattr__(self, "phases", phases)

    def leaves(self) -> tuple[Leaf, ...]:
        """The phases with nested compositions flattened, in order."""
        out: list[Leaf] = []
        for phase in self.phases:
            out.extend(phase.leaves() if isinstance(phase, Composition) else (phase,))
        return tuple(out)


_LEAVES = (RandomizedResponse, GaussianRelease, PoissonDPSGD, UnitPoissonDPSGD, TruncatedPoissonDPSGD, AllocationDPSGD,
           ShuffledDPSGD, DiscreteLaplaceCount)
Leaf: TypeAlias = (RandomizedResponse | GaussianRelease | PoissonDPSGD | UnitPoissonDPSGD | TruncatedPoissonDPSGD
                   | AllocationDPSGD | ShuffledDPSGD | DiscreteLaplaceCount)
Mechanism: TypeAlias = (RandomizedResponse | GaussianRelease | PoissonDPSGD | UnitPoissonDPSGD | TruncatedPoissonDPSGD
                        | AllocationDPSGD | ShuffledDPSGD | DiscreteLaplaceCount | Composition)
_BY_NAME = {cls.__name__: cls for cls in _LEAVES}


def mechanism_to_dict(mechanism: Mechanism) -> dict[str, Any]:
    """A JSON-ready dict with a ``type`` tag; the inverse of :func:`mechanism_from_dict`."""
    if isinstance(mechanism, Composition):
        return {"type": "Composition", "phases": [mechanism_to_dict(p) for p in mechanism.phases]}
    out: dict[str, Any] = {"type": type(mechanism).__name__}
    out.update({f.name: getattr(mechanism, f.name) for f in fields(mechanism)})
    return out


def mechanism_from_dict(data: dict[str, Any]) -> Mechanism:
    """Rebuild a mechanism from :func:`mechanism_to_dict` output, validating every field."""
    kind = data.get("type")
    if kind == "Composition":
        return Composition(phases=tuple(mechanism_from_dict(p) for p in data["phases"]))
    if kind not in _BY_NAME:
        raise InvalidParameterError(f"mechanism type must be one of {', '.join(_BY_NAME)}, got {kind!r}")
    cls = _BY_NAME[kind]
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names - {"type"}
    if unknown:
        raise InvalidParameterError(f"unknown field for {kind}: {sorted(unknown)[0]!r}")
    return cls(**{k: v for k, v in data.items() if k != "type"})

