"""A units split's parts: a phase planned on a part of the units (``UnitPart``) sees that part's rows only.

The rows, their unit counts, their row numbers and the RR phase's held-out mask are cut to
the part for the length of the phase and put back after it, so the phases after it (the
intercept calibration, over every row) see all of them again. A DP-SGD phase on a part
draws its Poisson batches from the part's rows and divides by the plan's q N_part, a
constant: the part's true size never enters the update (``size_private``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError
from trainers.phases.registry import PhaseContext

__all__ = ["on_part", "part_mask", "needs_part", "check_part"]


def _share(part) -> float:
    """The share r of a two-part split that ``part`` is one side of (its first part's end)."""
    return part.high if part.low == 0.0 else part.low


def needs_part(phase) -> dict:
    """What a phase on a part asks of the data's preparation: the split's share (its first part's end)."""
    part = getattr(phase.params, "unit_part", None)
    return {} if part is None else {"units_split": _share(part)}


def part_mask(phase, context: PhaseContext) -> np.ndarray | None:
    """The mask of ``context.data``'s rows in ``phase``'s part, or None for a phase on every unit.

    ``context.part`` is (the share r the data was split at, the mask of the first part's rows).

    Raises:
        InvalidParameterError: the data was split elsewhere than the phase's part, or not at all.
    """
    part = getattr(phase.params, "unit_part", None)
    if part is None:
        return None
    if part.low != 0.0 and part.high != 1.0:
        raise InvalidParameterError(f"the {phase.name} phase's part [{part.low:g}, {part.high:g}) is neither the "
                                    "first nor the last of a two-part units split")
    share, first = context.part if context.part is not None else (None, None)
    if first is None or len(first) != len(context.data) or share != _share(part):
        raise InvalidParameterError(f"the plan trains its {phase.name} phase on the units in [{part.low:g}, "
                                    f"{part.high:g}), but the data was split at {share}")
    return np.asarray(first, dtype=bool) if part.low == 0.0 else ~np.asarray(first, dtype=bool)


def check_part(phase, context: PhaseContext) -> None:
    """Refuse, before anything is spent, a phase whose part the prepared data was not split for."""
    part_mask(phase, context)


@contextlib.contextmanager
def on_part(phase, context: PhaseContext) -> Iterator[int | None]:
    """Within the block, ``context`` holds ``phase``'s part of the rows only; yields the part's rows (or None)."""
    mask = part_mask(phase, context)
    if mask is None:
        yield None
        return
    c = context
    saved = (c.data, c.rows, c.holdout, c.unit_counts, c.size_private, c.part)
    c.data = saved[0].take(torch.as_tensor(mask, device=saved[0].label.device))
    c.rows = None if saved[1] is None else saved[1][mask]
    c.holdout = None if saved[2] is None else saved[2][mask]
    c.unit_counts = None if saved[3] is None else saved[3][mask]
    c.size_private = True  # q and q N stay the plan's, whatever the part's true size
    c.part = None
    try:
        yield int(mask.sum())
    finally:
        c.data, c.rows, c.holdout, c.unit_counts, c.size_private, c.part = saved
