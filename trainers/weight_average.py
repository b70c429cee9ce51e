"""A moving average of a model's weights, for the RR phase's held-out checks to score.

Training on randomized-response labels is noisy: the last weights wander around the optimum
by an amount that grows with the flip probability. An exponential moving average of the
weights over about ``horizon`` steps smooths that wander (Polyak averaging). It is computed
from the trained weights alone, so it costs nothing, and the RR phase's held-out units decide
at each check whether the average or the last weights are kept (``trainers.rr_validation``).

The average starts at the weights training starts from, so early in training it lags behind
them; that is why the checks score both, never the average alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["WeightAverage"]


class WeightAverage:
    """An exponential moving average of ``model``'s trainable parameters.

    Args:
        model: the model being trained; ``update()`` after each optimiser step.
        horizon: the average's time constant, in steps (at least 1): each step moves the
            average ``1 / horizon`` of the way to the current weights.
    """

    def __init__(self, model: torch.nn.Module, horizon: float):
        if not horizon >= 1:
            raise ValueError(f"horizon must be at least 1 step, got {horizon!r}")
        self.model = model
        self.weight = 1.0 / float(horizon)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.average = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights (after an optimiser step)."""
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], self.weight)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block, its own weights again after it."""
        with torch.no_grad():
            own = [p.detach().clone() for p in self.params]
            for p, a in zip(self.params, self.average, strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self.params, own, strict=True):
                    p.copy_(w)
