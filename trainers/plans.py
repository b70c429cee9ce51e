"""What the trainers read of a plan beyond its typed accessors (``budgetplan.plan.Plan``)."""

from __future__ import annotations

__all__ = ["has_grid"]


def has_grid(plan) -> bool:
    """Whether the plan selects among a grid of configurations (``budgetplan.grid``), run by ``trainers.tune``.

    The plan's ``tuning`` is its accounting as a dict, with no typed accessor for the grid:
    this is the one place the trainers probe it.
    """
    return plan.tuning is not None and "grid" in plan.tuning
