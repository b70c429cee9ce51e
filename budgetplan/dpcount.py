"""A differentially private count of the dataset size, for plans whose N must stay private.

Under add-remove adjacency the number of rows is itself a statistic of the data: a plan
that states the exact N reveals whether a unit is present. Instead the data owner releases
N~ = N + Z once, before planning, with Z drawn from the discrete Laplace (two-sided
geometric) distribution P(Z = z) = tanh(a / 2) exp(-a |z|), a = epsilon / K, where K is
how many rows one unit adds or removes after capping. That release is (epsilon, 0)-DP
(``mechanisms.DiscreteLaplaceCount``), the scenario states it (``[data].dataset_size =
N~``, ``[data].size_release_epsilon = epsilon``), and the plan accounts it as its
``count`` phase; the trainer then uses only N~.

Z is the difference of two independent geometric variables with success probability
1 - e^{-a} (the standard construction), drawn with numpy's geometric sampler from a
Generator seeded with 128 bits of the operating system's CSPRNG. Floating point: numpy
inverts a uniform double, so the pmf it realises equals the ideal one only up to double
rounding (relative error ~1e-16 per value, and tails cut where the uniform's resolution
ends, far beyond any count that matters); the guarantee is for the ideal distribution.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from budgetplan import limits
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["discrete_laplace", "discrete_laplace_pmf", "discrete_laplace_variance", "release_count",
           "noise_std", "min_epsilon"]


def _parameter(epsilon: float, sensitivity: int, name: str = "epsilon") -> float:
    epsilon = validate.positive(name, epsilon)
    sensitivity = validate.positive_int("sensitivity", sensitivity)
    smallest = min_epsilon(sensitivity)
    if epsilon < smallest:
        raise InvalidParameterError(
            f"{name} must be at least K / {limits.MAX_DATASET_SIZE:g} = {smallest:.3g} (K = {sensitivity}), got "
            f"{epsilon!r}: noise of scale K / {name} beyond the largest dataset size a scenario accepts leaves a "
            "count that is all noise")
    return epsilon / sensitivity


def min_epsilon(sensitivity: int) -> float:
    """The smallest release epsilon: noise scale K / epsilon at most ``limits.MAX_DATASET_SIZE`` rows.

    Below it the count is all noise (no scenario can state it), and the sampler's and the
    variance's arithmetic leave float64 (1 - e^-a rounds to 0 below a ~ 1e-300).
    """
    return sensitivity / limits.MAX_DATASET_SIZE


def discrete_laplace(rng: np.random.Generator, *, epsilon: float, sensitivity: int,
                     size: int | tuple[int, ...] | None = None) -> int | NDArray[np.int64]:
    """Draws of Z with P(Z = z) = tanh(a / 2) exp(-a |z|), a = epsilon / sensitivity."""
    a = _parameter(epsilon, sensitivity)
    p = -math.expm1(-a)  # 1 - e^{-a}, exact for small a
    return rng.geometric(p, size=size) - rng.geometric(p, size=size)


def discrete_laplace_pmf(z: ArrayLike, *, epsilon: float, sensitivity: int) -> NDArray[np.float64]:
    """The exact pmf tanh(a / 2) exp(-a |z|) at the integers ``z``."""
    a = _parameter(epsilon, sensitivity)
    return math.tanh(a / 2) * np.exp(-a * np.abs(np.asarray(z, dtype=np.float64)))


def discrete_laplace_variance(*, epsilon: float, sensitivity: int) -> float:
    """2 e^{-a} / (1 - e^{-a})^2 with a = epsilon / sensitivity."""
    a = _parameter(epsilon, sensitivity)
    return 2.0 * math.exp(-a) / math.expm1(-a) ** 2


def noise_std(*, epsilon: float, sensitivity: int) -> float:
    return math.sqrt(discrete_laplace_variance(epsilon=epsilon, sensitivity=sensitivity))


def release_count(true_count: int, *, epsilon: float, sensitivity: int, seed: int | None = None) -> dict[str, Any]:
    """N~ = ``true_count`` + Z, once. The result never holds ``true_count``.

    Args:
        true_count: the row count after capping (the value being protected).
        epsilon: the release's budget; the plan must account (epsilon, 0) for it.
        sensitivity: rows one unit adds or removes (its cap K).
        seed: None for the CSPRNG (the only private choice); an integer for a reproducible
            debugging draw, which anyone who knows the seed can undo.

    Returns:
        ``{"noisy_count", "dataset_size", "epsilon", "sensitivity", "noise_std",
        "randomness": {"policy", "seed"}}``; ``dataset_size`` is ``max(noisy_count, 1)``,
        what a scenario can state (clamping is post-processing).
    """
    n = validate.non_negative_int("true_count", true_count)
    if seed is None:
        rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    else:
        rng = np.random.Generator(np.random.PCG64(validate.non_negative_int("seed", seed)))
    noisy = n + int(discrete_laplace(rng, epsilon=epsilon, sensitivity=sensitivity))
    return {"noisy_count": noisy, "dataset_size": max(noisy, 1), "epsilon": float(epsilon),
            "sensitivity": int(sensitivity), "noise_std": noise_std(epsilon=epsilon, sensitivity=sensitivity),
            "randomness": {"policy": "csprng" if seed is None else "seeded", "seed": seed}}
