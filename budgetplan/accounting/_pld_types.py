"""The value types of the fast PLD engine: one direction (PLDPmf) and the worst case (PLD)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ADD_REMOVE", "REPLACE_ONE", "PLDPmf", "PLD"]

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


@dataclass(frozen=True, slots=True)
class PLDPmf:
    """One direction of a discretised, pessimistic privacy loss distribution.

    Attributes:
        discretization: grid step of the privacy losses.
        lower_index: the loss of ``probs[0]`` is ``lower_index * discretization``;
            ``probs[k]`` sits at ``(lower_index + k) * discretization``.
        probs: float64 masses, >= 0 up to FFT rounding (about 1e-17).
        infinity_mass: mass at +infinity (it adds to delta for every epsilon).
    """

    discretization: float
    lower_index: int
    probs: np.ndarray
    infinity_mass: float

    @property
    def losses(self) -> np.ndarray:
        """The privacy loss of every entry of ``probs``."""
        return (self.lower_index + np.arange(self.probs.size)) * self.discretization


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
