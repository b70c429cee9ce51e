"""The value types of the fast PLD engine: one direction (PLDPmf) and the worst case (PLD)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["ADD_REMOVE", "REPLACE_ONE", "PLDPmf", "PLD"]

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


@dataclass(frozen=True, slots=True)
class PLDPmf:
    """One direction of a discretised, pessimistic privacy loss distribution.

    Every mass is an upper bound: at or above the exact mass of the pessimistic
    discretisation, after any mass below the grid has been moved up onto its first loss.
    Both only raise delta(eps) = m_inf + sum_{loss > eps} p (1 - e^{eps - loss}) at every
    eps, and both survive composition, so the epsilons read from a PLDPmf are upper bounds.

    Attributes:
        discretization: grid step of the privacy losses.
        lower_index: the loss of ``probs[0]`` is ``lower_index * discretization``;
            ``probs[k]`` sits at ``(lower_index + k) * discretization``.
        probs: float64 masses, >= 0.
        infinity_mass: mass at +infinity (it adds to delta for every epsilon).
        tilt, log_scale, rounding: the floating-point allowance included in ``probs`` by
            the composition that made this pmf: at most
            ``rounding * exp(log_scale - tilt * loss)`` per entry (0 for a single step).
    """

    discretization: float
    lower_index: int
    probs: np.ndarray
    infinity_mass: float
    tilt: float = 0.0
    log_scale: float = 0.0
    rounding: float = 0.0

    @property
    def losses(self) -> np.ndarray:
        """The privacy loss of every entry of ``probs``."""
        return (self.lower_index + np.arange(self.probs.size)) * self.discretization

    def allowance(self, epsilon: float) -> float:
        """How much of delta(epsilon) is rounding allowance: rounding x sum over the losses L
        above epsilon of exp(log_scale - tilt L) (1 - e^(epsilon - L)), two geometric series."""
        if self.rounding == 0.0:
            return 0.0
        d, n = self.discretization, self.probs.size
        first = max(0, min(n, math.floor(epsilon / d) + 1 - self.lower_index)) if math.isfinite(epsilon) else 0
        m = n - first
        if m <= 0:
            return 0.0
        top = (self.lower_index + first) * d  # the first loss above epsilon

        def series(rate: float) -> float:  # sum_{k < m} e^{-rate k d}
            return float(m) if rate == 0.0 else math.expm1(-rate * m * d) / math.expm1(-rate * d)

        try:
            plain = math.exp(self.log_scale - self.tilt * top) * series(self.tilt)
            if epsilon == -math.inf:
                return self.rounding * plain
            return self.rounding * (plain - math.exp(self.log_scale - (self.tilt + 1.0) * top + epsilon)
                                    * series(self.tilt + 1.0))
        except OverflowError:
            return math.inf


@dataclass(frozen=True, slots=True)
class PLD:
    """Worst case over directions: epsilon_for_delta / delta_for_epsilon take the max over pmfs.

    Attributes:
        pmfs: ``(remove, add)`` for add-remove with sampling; a single pmf when the
            two directions coincide (no sampling, replace-one, randomized response).
        relation: ``"add-remove"`` or ``"replace-one"``.
    """

    pmfs: tuple[PLDPmf, ...]
    relation: str
