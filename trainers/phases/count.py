"""The DP count of N: released before the plan was made (``budgetplan data count``), nothing to run here.

The run only treats the plan's N as that count (``PhaseContext.size_private`` and
``withhold_sizes``), which ``trainers.run`` reads from ``plan.count``.
"""

from __future__ import annotations

from budgetplan.plan.phases import CountPhase
from trainers.phases.registry import PhaseContext, register_executor

__all__ = ["execute_count"]


@register_executor(CountPhase, follows=None, torch_model=False)
def execute_count(phase: CountPhase, context: PhaseContext) -> list:
    return []  # released before planning: its record is the count's own, not the run's
