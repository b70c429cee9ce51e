"""The DP-SGD phase's executor: alone, or after RR (Hybrid), from a checkpoint when resumed."""

from __future__ import annotations

from budgetplan.plan.phases import DPSGDPhase, RRPhase
from trainers import dpsgd  # its run_dpsgd looked up at each call: tests swap it
from trainers.phases.parts import check_part, needs_part, on_part
from trainers.phases.registry import PhaseContext, register_executor
from trainers.phases.trained import TrainedModel
from trainers.record import dpsgd_entry
from trainers.session import Checkpoint

__all__ = ["execute_dpsgd", "trainable"]


def trainable(model, phases, phase_index: int) -> list:
    """What DP-SGD updates: everything, or (Hybrid, tower frozen) all but the non-sensitive tower."""
    phase = phases[phase_index]
    frozen = isinstance(phase, DPSGDPhase) and phase.params.nonsensitive_tower == "frozen" and phase_index > 0
    out = []
    for name, p in model.named_parameters():
        keep = not (frozen and model.tower_of(name) == "nonsensitive")
        p.requires_grad_(keep)
        if keep:
            out.append(p)
    return out


def _steps_taken(context: PhaseContext) -> int:
    taken = context.session.dpsgd_steps_taken()
    if context.collective is not None:
        taken = context.collective.broadcast_object(taken)  # rank 0's ledger counts
    return taken


def _needs(phase: DPSGDPhase) -> dict:
    # a sampled unit's rows all on one rank; under a units split, its part
    return {"whole_units": phase.params.samples_units, **needs_part(phase)}


def _check(phase: DPSGDPhase, context: PhaseContext) -> None:
    check_part(phase, context)  # under a units split, the data was split where the plan says
    if phase.params.samples_units:
        # another M is refused here, before a Hybrid's RR phase spends anything
        dpsgd.check_unit_count(phase.params, dpsgd.count_units(phase.params, context.data, context.collective)[0])


@register_executor(DPSGDPhase, follows=((), (RRPhase,)), needs=_needs, check=_check)
def execute_dpsgd(phase: DPSGDPhase, context: PhaseContext) -> list:
    c = context
    taken = _steps_taken(c)
    ckpt = c.checkpoint
    resumed_from = ckpt.dpsgd_step if ckpt is not None else 0
    rr_result = c.rr_result  # the RR phase's, this session's or the checkpoint's (Hybrid), else None
    if rr_result is not None and not resumed_from and c.settings.hybrid_start == "rr-model":
        c.model.match_truncated()  # a fresh DP-SGD phase (a resumed one has its checkpoint)
    model, session = c.model, c.session

    def save(step_done, opt_state):
        session.save_checkpoint(Checkpoint(phase="dpsgd", step=step_done, model=model.state_dict(),
                                           optimizer=opt_state, rr_result=rr_result))

    with on_part(phase, c) as part_rows:
        sgd = dpsgd.run_dpsgd(model, c.data, phase.params, trainable=trainable(model, c.phases, c.index),
                              randomness=c.randomness, settings=c.dpsgd_settings, progress=c.label("DP-SGD phase"),
                              ledger=session, start_step=taken, checkpoint=save if c.checkpoints else None,
                              checkpoint_every=session.checkpoint_every if c.lead else 0,
                              optimizer_state=ckpt.optimizer if ckpt is not None and resumed_from else None,
                              size_private=c.size_private, collective=c.collective)
    c.timings["dpsgd_phase_seconds"] = sgd.seconds
    c.final = TrainedModel.of(c, truncated=False, dpsgd_settings=c.dpsgd_settings)
    return [dpsgd_entry(sgd, session.ledger_view(), nonsensitive_tower=phase.params.nonsensitive_tower,
                        sizes_ledger=session.sizes_view() if c.withhold_sizes else None, withhold=c.withhold_sizes,
                        part_rows=part_rows)]
