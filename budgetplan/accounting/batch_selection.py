"""Batch selection as a plan decision: which mechanism a DP-SGD sampling choice is accounted as.

==================  =======================================  ===================================
sampling            what the trainer does                    accounted as
==================  =======================================  ===================================
poisson             each row joins each step w.p. q = B/N    PoissonDPSGD (PLD, RDP or PRV)
truncated-poisson   Poisson, cut to max_batch_size           TruncatedPoissonDPSGD (PLD)
allocation          each epoch of N // B steps: every row    AllocationDPSGD (its PLD, or RDP;
                    in one uniformly random step             add-remove; arXiv:2502.08202)
shuffle             each epoch: a random permutation cut     ShuffledDPSGD: no amplification
                    into N // B batches of exactly B         (Gaussian per epoch); Chua et al.'s
                                                             lower bound beside it
==================  =======================================  ===================================

Allocation and shuffled batches run whole epochs of ``N // B`` steps (at least 1): a plan
states ``epochs`` (a whole number) or ``steps`` that are a whole number of epochs. Every
noisy sum is divided by B = q N, a constant of the plan (``DPSGDParams.expected_batch_size``).
For a shuffled run the Poisson figure at q is only "what Poisson sampling would give", never
the guarantee.
"""

from __future__ import annotations

import math

from budgetplan.accounting import shuffle
from budgetplan.accounting.account import account, default_method, supports
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import AllocationDPSGD, PoissonDPSGD, ShuffledDPSGD, TruncatedPoissonDPSGD, UnitPoissonDPSGD
from budgetplan.units import Adjacency
from budgetplan.util import validate

__all__ = ["SAMPLINGS", "EPOCH_SAMPLINGS", "steps_per_epoch", "epoch_steps", "mechanism", "method_for", "compare",
           "MECHANISM_TYPES"]

SAMPLINGS = ("poisson", "truncated-poisson", "allocation", "shuffle")
EPOCH_SAMPLINGS = ("allocation", "shuffle")
# The mechanism each batch selection is accounted as (``mechanism`` builds it).
MECHANISM_TYPES: dict[str, type] = {"poisson": PoissonDPSGD, "truncated-poisson": TruncatedPoissonDPSGD,
                                    "allocation": AllocationDPSGD, "shuffle": ShuffledDPSGD}


def steps_per_epoch(*, dataset_size: int, batch_size: int) -> int:
    """N // B, at least 1: the steps of one epoch of allocation or shuffled batches."""
    n = validate.positive_int("dataset_size", dataset_size)
    b = validate.positive_int("batch_size", batch_size)
    return max(1, n // b)


def epoch_steps(*, dataset_size: int, batch_size: int, epochs: float | None = None, steps: int | None = None,
                names: tuple[str, str] = ("epochs", "steps")) -> tuple[int, int]:
    """(steps, whole epochs) of an allocation or shuffled run from ``epochs`` or ``steps``.

    Raises:
        InvalidParameterError: epochs that are not a whole number, or steps that are not a
            whole number of epochs (naming the parameter and the value).
    """
    t = steps_per_epoch(dataset_size=dataset_size, batch_size=batch_size)
    if (epochs is None) == (steps is None):
        raise InvalidParameterError(f"give exactly one of {names[0]} and {names[1]}")
    if epochs is not None:
        e = validate.positive(names[0], epochs)
        if e != math.floor(e):
            raise InvalidParameterError(f"{names[0]} must be a whole number for allocation or shuffled batches "
                                        f"(every epoch is {t} steps), got {epochs!r}")
        return int(e) * t, int(e)
    s = validate.positive_int(names[1], steps)
    if s % t:
        raise InvalidParameterError(f"{names[1]} must be a multiple of the {t} steps of an epoch for allocation or "
                                    f"shuffled batches, got {steps!r}")
    return s, s // t


def method_for(sampling: str, requested: str) -> str:
    """The accounting method a DP-SGD phase with ``sampling`` uses, from ``account``'s one table of what applies.

    A mechanism with an exact closed form uses it (shuffled batches: nothing is tighter); otherwise
    ``requested`` where it applies, else the mechanism's default (allocation under ``prv``: pld).
    """
    kind = MECHANISM_TYPES.get(sampling)
    if kind is None:
        raise InvalidParameterError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
    if supports(kind, "exact"):
        return "exact"
    return requested if supports(kind, requested) else default_method(kind)


def mechanism(sampling: str, sigma: float, *, dataset_size: int, batch_size: int, steps: int,
              max_batch_size: int | None = None, units: int | None = None
              ) -> PoissonDPSGD | UnitPoissonDPSGD | TruncatedPoissonDPSGD | AllocationDPSGD | ShuffledDPSGD:
    """The mechanism DP-SGD with ``sampling`` is accounted as, at noise ``sigma``.

    With ``units`` (M), units are sampled (``sample_by = "unit"``, Poisson only): each joins a
    batch with probability ``batch_size / units``.
    """
    if units is not None:
        if sampling != "poisson":
            raise InvalidParameterError(f"units are sampled with Poisson batches only, got sampling {sampling!r}")
        return UnitPoissonDPSGD(noise_multiplier=sigma, sampling_rate=batch_size / units, steps=steps)
    q = batch_size / dataset_size
    if sampling == "poisson":
        return PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps)
    if sampling == "truncated-poisson":
        if max_batch_size is None:
            raise InvalidParameterError("max_batch_size is required for truncated-poisson sampling, got None")
        return TruncatedPoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps, dataset_size=dataset_size,
                                     max_batch_size=max_batch_size)
    t = steps_per_epoch(dataset_size=dataset_size, batch_size=batch_size)
    if sampling == "allocation":
        return AllocationDPSGD(noise_multiplier=sigma, steps_per_epoch=t, epochs=steps // t)
    if sampling == "shuffle":
        return ShuffledDPSGD(noise_multiplier=sigma, steps_per_epoch=t, epochs=steps // t)
    raise InvalidParameterError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")


def compare(*, sigma: float, dataset_size: int, batch_size: int, epochs: int, delta: float,
            adjacency: Adjacency | str, discretization: float = 1e-4) -> dict[str, float | None]:
    """The epsilons of one run shape under each batch selection, at noise ``sigma`` (for tables and the CLI).

    Keys: ``poisson`` (PLD), ``allocation`` (add-remove only, else None), ``shuffle_upper``
    (the guarantee of a shuffled run) and ``shuffle_lower`` (Chua et al.: no analysis gives less).
    """
    adjacency = Adjacency.parse(adjacency)
    steps, whole = epoch_steps(dataset_size=dataset_size, batch_size=batch_size, epochs=epochs)
    t = steps // whole

    def eps(sampling: str) -> float:
        mech = mechanism(sampling, sigma, dataset_size=dataset_size, batch_size=batch_size, steps=steps)
        return account(mech, delta=delta, adjacency=adjacency, method=method_for(sampling, "pld"),
                       discretization=discretization).epsilon

    return {
        "poisson": eps("poisson"),
        "allocation": eps("allocation") if adjacency is Adjacency.ADD_REMOVE else None,
        "shuffle_upper": eps("shuffle"),
        "shuffle_lower": shuffle.lower_epsilon(noise_multiplier=sigma, steps_per_epoch=t, epochs=whole, delta=delta),
    }
