"""The RR phase's executor: the labels randomised once, the truncated model trained on them.

An RR-only plan's intercept calibration is free (no release: its shift is solved from the
truncated model's logits and the RR labels' debiased count), so it runs here, after the phase.
"""

from __future__ import annotations

from budgetplan.plan.phases import RRPhase
from trainers import rr_phase  # its run_rr_phase looked up at each call: tests swap it
from trainers.calibration import free_calibration
from trainers.phases.parts import check_part, needs_part, on_part
from trainers.phases.registry import PhaseContext, register_executor
from trainers.phases.trained import TrainedModel
from trainers.record import rr_entry
from trainers.session import Checkpoint

__all__ = ["execute_rr"]


def _needs(phase: RRPhase) -> dict:
    # the units held out to stop the phase early; under a units split, its part
    return {"holdout": phase.params.validation_fraction, **needs_part(phase)}


@register_executor(RRPhase, follows=((),), needs=_needs, check=check_part)
def execute_rr(phase: RRPhase, context: PhaseContext) -> list:
    c = context
    ckpt = c.checkpoint
    if ckpt is not None and ckpt.rr_result is not None:
        rr = ckpt.rr_result  # trained in an earlier session
    else:
        s = c.settings
        with on_part(phase, c):
            rr = _train(phase, c, s)
        if len(c.phases) > 1:
            c.session.save_checkpoint(Checkpoint(phase="rr-done", model=c.model.state_dict(), rr_result=rr))
    c.timings["rr_phase_seconds"] = rr.seconds
    c.rr_result = rr
    c.final = TrainedModel.of(c, truncated=True, dpsgd_settings=None)  # non-sensitive features only
    entries = [rr_entry(rr)]
    if c.free_calibration:
        entries.append((None, free_calibration(c.model, c.data, rr, c.collective)))
    return entries


def _train(phase: RRPhase, c: PhaseContext, s) -> rr_phase.RRResult:
    return rr_phase.run_rr_phase(
        c.model, c.data, phase, unit_counts=c.unit_counts, loss=s.loss, lr=s.lr, optimizer=s.optimizer,
        batch_size=s.batch_size, randomness=c.randomness, session=c.session, progress=c.label("RR phase"),
        collective=c.collective, rows=c.rows, holdout=c.holdout, patience=s.rr_patience,
        checks_per_epoch=s.rr_checks_per_epoch, weight_decay=s.rr_weight_decay,
        candidates=s.rr_candidates, average=s.rr_average, select=s.rr_select)
