"""The phase executors: one per typed phase class of ``budgetplan.plan.phases``, looked up by type.

Each kind registers its executor in its own module of ``trainers.phases`` (as Opacus
registers a grad sampler per layer type)::

    @register_executor(DPSGDPhase, follows=((), (RRPhase,)))
    def execute_dpsgd(phase: DPSGDPhase, context: PhaseContext) -> list[Entry]:
        ...

Every executor has the one call shape ``executor(phase, context) -> entries``: ``context``
(``PhaseContext``) carries what the run prepared (the model, the data, the randomness, the
session, the settings, the collective) and takes what the phase leaves for the next one
(its result, its timings, what the run keeps as its model); ``entries`` are the phase's
``(public entry, private statistics)`` pairs for the record, in order.

Which sequences of phases a trainer runs is declared here too: a training phase's executor
names the training phases that may precede it (``follows``); a phase released outside the
training sequence (the DP count of N, before planning; the intercept calibration, after
training) declares ``follows=None``. Adding a kind is one module here and none of the
dispatch sites (``trainers.run``, ``trainers.tune``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from budgetplan.errors import UnsupportedError
from budgetplan.record.parts import ModelInfo
from trainers.session import Checkpoint

__all__ = ["Entry", "Executor", "PhaseContext", "FinalModel", "register_executor", "executor_for",
           "check_executable", "executes_torch_model", "data_needs", "check_phases", "run_phases", "REGISTRY"]

Entry = tuple[Any, Any]  # (the public record entry, or None for what releases nothing; the private statistics)


class FinalModel(Protocol):
    """What a run keeps as its model: written to ``model.pt``, described in the record, evaluated."""

    vocabulary: dict | None
    compares_baseline: bool  # whether the eval metrics are compared with the baseline's AUC
    reports_sizes: bool  # whether the record points at the private batch-size ledger (a DP count of N)

    def state(self) -> dict: ...

    def describe(self) -> ModelInfo: ...

    def training(self) -> dict: ...

    def evaluate(self, eval_prep, eval_path) -> tuple[dict, float]: ...


@dataclass
class PhaseContext:
    """What the phases of one run (or one configuration of a tuned run) share.

    Attributes:
        phases: the phases being executed, in order (the plan's, or a configuration's).
        index: the place in ``phases`` of the phase being executed.
        prep: the prepared data (``trainers.inputs.Prepared``); ``data``, ``unit_counts``,
            ``rows`` and ``holdout`` are what the phases train on (a tuned run's training part).
        model: the run's torch model (None when no phase trains one: WALR fits its own).
        randomness: the run's ``Randomness``.
        session: the run's ``Session`` (or a stand-in: ``NullSession``, a tuned configuration's).
        settings, dpsgd_settings, walr_settings: what cannot change a guarantee.
        collective: this process's ``Collective`` with several processes, else None.
        device: the torch device.
        spec: the plan's feature spec.
        progress: the prefix of the progress bars' labels, or None for no progress.
        checkpoint: the checkpoint a resumed run starts from, or None.
        lead: whether this process keeps the ledger and writes the record (rank 0).
        checkpoints: whether the DP-SGD phase writes checkpoints (a run directory, rank 0).
        size_private: the data need not have the plan's N rows (a DP count of N, a tuned
            run's training part): q and q N stay the plan's.
        withhold_sizes: the plan's N is a DP count: the public entries withhold what grows
            with the true count.
        free_calibration: an RR-only plan calibrates its intercept at no cost after its RR phase.
        part: a units split: (its share r, the mask of the rows of ``data`` in its first
            part); a phase on a part trains on that part's rows only (``trainers.phases.parts``).
        timings: the run's timings, which each phase adds its own to.
        rr_result: the RR phase's result, once it has run (a Hybrid's DP-SGD phase and the
            calibration read it).
        final: what the run keeps as its model, set by the phase that trains it last.
    """

    phases: Sequence
    prep: Any
    data: Any
    unit_counts: Any
    randomness: Any
    session: Any
    settings: Any
    device: Any
    spec: Any = None
    index: int = 0
    model: Any = None
    rows: Any = None
    holdout: Any = None
    dpsgd_settings: Any = None
    walr_settings: Any = None
    collective: Any = None
    progress: str | None = None
    checkpoint: Checkpoint | None = None
    lead: bool = True
    checkpoints: bool = False
    size_private: bool = False
    withhold_sizes: bool = False
    free_calibration: bool = False
    part: Any = None
    timings: dict = field(default_factory=dict)
    rr_result: Any = None
    final: FinalModel | None = None

    def label(self, what: str) -> str | None:
        """A progress bar's label (``what``, after the context's prefix), or None without progress."""
        return None if self.progress is None else self.progress + what


@dataclass(frozen=True)
class Executor:
    """A phase kind's executor and what the registry knows of it.

    Attributes:
        kind: the phase class.
        run: ``run(phase, context) -> entries``.
        follows: the sequences of training phase classes that may precede this one; None for
            a phase outside the training sequence (run where the plan places it).
        torch_model: whether it trains the run's torch model (a tuned run's configurations
            consist of such phases only).
        needs: ``needs(phase) -> dict``: what the phase asks of the data's preparation
            (``trainers.inputs.prepare_data``'s keywords: ``holdout``, ``whole_units``), or None.
        check: ``check(phase, context)``: a refusal once the data is prepared, before the
            run directory exists and anything is spent (no session yet), or None.
    """

    kind: type
    run: Callable[[Any, PhaseContext], list]
    follows: frozenset[tuple[type, ...]] | None
    torch_model: bool
    needs: Callable[[Any], dict] | None = None
    check: Callable[[Any, PhaseContext], None] | None = None

    @property
    def training(self) -> bool:
        return self.follows is not None


REGISTRY: dict[type, Executor] = {}


def register_executor(kind: type, *, follows: Sequence[tuple[type, ...]] | None = ((),), torch_model: bool = True,
                      needs: Callable[[Any], dict] | None = None,
                      check: Callable[[Any, PhaseContext], None] | None = None):
    """Register the decorated ``run(phase, context) -> entries`` as the executor of phases of class ``kind``.

    ``follows``, ``torch_model``, ``needs`` and ``check`` as ``Executor``'s attributes.
    """

    def register(run: Callable[[Any, PhaseContext], list]) -> Callable[[Any, PhaseContext], list]:
        if kind in REGISTRY:
            raise ValueError(f"{kind.__name__} already has an executor ({REGISTRY[kind].run.__qualname__})")
        REGISTRY[kind] = Executor(kind, run, None if follows is None else frozenset(tuple(f) for f in follows),
                                  torch_model, needs, check)
        return run

    return register


def executor_for(phase) -> Executor:
    """The executor registered for ``type(phase)``."""
    try:
        return REGISTRY[type(phase)]
    except KeyError:
        raise UnsupportedError(f"no executor for a {type(phase).__name__}") from None


def check_executable(phases: Sequence, what: str, *, torch_model_only: bool = False) -> None:
    """Refuse, before anything is spent, phases that no sequence of registered executors runs.

    The training phases (``follows`` not None), in order, must each follow what its executor
    allows, and there must be at least one; with ``torch_model_only`` (a tuned run's
    configuration) every phase must train the torch model.

    Raises:
        UnsupportedError: ``"no executor for {what} [names]"``.
    """
    done: tuple[type, ...] = ()
    ok = True
    for phase in phases:
        ex = REGISTRY.get(type(phase))
        if ex is None or (torch_model_only and not (ex.training and ex.torch_model)):
            ok = False
            break
        if ex.follows is None:
            continue
        if done not in ex.follows:
            ok = False
            break
        done += (ex.kind,)
    if not ok or not done:
        raise UnsupportedError(f"no executor for {what} {[p.name for p in phases]}")


def executes_torch_model(phases: Sequence) -> bool:
    """Whether a training phase of ``phases`` trains the run's torch model (else none is built)."""
    return any(ex.training and ex.torch_model for ex in map(executor_for, phases))


def data_needs(phases: Sequence) -> dict:
    """What ``phases`` ask of the data's preparation, merged (``Executor.needs``)."""
    out: dict = {}
    for phase in phases:
        ex = executor_for(phase)
        if ex.needs is not None:
            out.update(ex.needs(phase))
    return out


def check_phases(context: PhaseContext) -> None:
    """Every phase's refusals on the prepared data (``Executor.check``), in the phases' order."""
    for phase in context.phases:
        ex = executor_for(phase)
        if ex.check is not None:
            ex.check(phase, context)


def run_phases(context: PhaseContext) -> list[Entry]:
    """Run ``context.phases`` in order, each by its executor; their record entries, in order."""
    entries: list[Entry] = []
    for i, phase in enumerate(context.phases):
        context.index = i
        entries += executor_for(phase).run(phase, context)
    return entries
