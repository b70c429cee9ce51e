"""The intercept calibration's executor: one Gaussian release after the training phases, then the shift."""

from __future__ import annotations

from budgetplan.plan.phases import CalibrationPhase
from trainers import calibration  # its run_calibration looked up at each call: tests swap it
from trainers.phases.registry import PhaseContext, register_executor

__all__ = ["execute_calibration"]


@register_executor(CalibrationPhase, follows=None)
def execute_calibration(phase: CalibrationPhase, context: PhaseContext) -> list:
    c = context
    result = calibration.run_calibration(c.model, c.data, phase, randomness=c.randomness, session=c.session,
                                         rr_result=c.rr_result, collective=c.collective)
    return [calibration.calibration_entry(result)]
