"""Execute a plan, or a non-private baseline, and return its run record.

``execute_plan`` refuses, before anything is written and before the first private draw:
a plan that does not verify; a plan without a feature spec; a device that does not exist;
a run directory that already holds a record or cannot be written; data (and the eval
data, which is read and encoded up front) that is missing, unreadable, without the
plan's columns, with labels outside {0, 1} (eval: without both classes), NaN features or
missing unit ids; data whose row count after capping differs from the plan's N (unless
that N is a DP count: refusing would reveal the true count). Every privacy-relevant
number (flip probabilities, cap, N) is read from the plan; ``TrainSettings`` holds only
what cannot change a guarantee.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.plan import Plan
from budgetplan.record.parts import ModelInfo, json_table
from budgetplan.record.records import PhaseRun, PhaseStats, RunRecord
from trainers.baseline import BaselineSettings, compare, convergence_note, train_baseline, validation_split
from trainers.distributed import Collective
from trainers.dpsgd import DPSGDSettings
from trainers.executors import (
    PhaseContext,
    check_executable,
    check_phases,
    data_needs,
    executes_torch_model,
    run_phases,
)
from trainers.fit import FitSettings
from trainers.inputs import (
    Prepared,
    device_name,
    new_model,
    prepare_data,
    prepare_eval,
    reproducible_kernels,
    resolve_device,
)
from trainers.outputs import INITIAL_MODEL, check_out, evaluate, fingerprint_keys, save_initial, write_run
from trainers.randomness import Randomness
from trainers.ranks import check_distributable, launch_plan, note_shard
from trainers.record import baseline_entry, build_record
from trainers.session import NullSession, Session
from trainers.settings import RunOptions, TrainSettings, WALRSettings
from trainers.threads import torch_threads
from trainers.tune import execute_grid

__all__ = ["TrainSettings", "WALRSettings", "RunOptions", "execute_plan", "run_baseline", "resolve_device",
           "INITIAL_MODEL"]

# The seed stream of the capping choice shared by the ranks of a run over several processes
# (ranks draw from streams 0, 1, ...: this one is far beyond any world size).
_CAPPING_STREAM = 2**32


@dataclass(frozen=True)
class _Checked:
    """What the refusals that need no data leave: the resolved settings, the run directory, the feature spec."""

    settings: TrainSettings
    out: Path | None
    spec: object
    lead: bool  # the process that keeps the ledger and writes the record


@dataclass
class _Prepared:
    """What the run prepared before its run directory exists and anything is spent."""

    checked: _Checked
    prep: Prepared
    randomness: Randomness
    device: torch.device
    dpsgd_settings: DPSGDSettings
    t0: float
    new_key: bytes | None
    eval_prep: Prepared | None = None  # read on rank 0 only, once the data passed the phases' checks


def execute_plan(plan: Plan, data_path: str | Path, options: RunOptions | None = None) -> RunRecord | None:
    """Train ``plan`` on ``data_path``; returns the run record (also written to ``options.out_dir``).

    Phases run in the plan's order, each by the executor registered for its type
    (``trainers.executors``): RR (labels randomised once, the truncated model trained on
    them), then DP-SGD on the full model warm-started from it (Hybrid), or either alone; a
    WALR plan releases its noisy aggregate once and fits on it; a calibration release after
    training. A plan with a tuning grid runs every configuration, then the selection
    (``trainers.tune``). The run reads as: verify (every refusal that needs no data) ->
    prepare (the data, the eval data, the refusals on them) -> run each phase -> write the
    record.

    ``options`` (``RunOptions``, default ``RunOptions()``) holds everything but the plan and
    the data; nothing in it can change a guarantee:

    - with ``out_dir`` the run keeps a write-ahead ledger and checkpoints there; ``resume``
      continues an interrupted run with the ledger's step count and fresh randomness;
    - ``fingerprint_key`` is the data owner's key for the data fingerprint in the private
      record; without one a fresh key is made and saved as ``private/fingerprint.key``;
    - ``baseline_auc`` (the non-private baseline's eval AUC) adds the relative AUC loss to
      the eval metrics; with ``baseline_tolerance`` (``trainers.baseline.reference``) also
      the flag ``beats_baseline``, set when this run's AUC exceeds the baseline's by more;
    - ``threads``: torch's CPU threads for the run (``trainers.threads``: ``"auto"`` does not
      oversubscribe a shared machine), restored afterwards; the count goes in the record's
      timings. With ``nproc`` processes they are shared out between them;
    - ``keep_initial``: also write the model as initialised, before any phase, to
      ``private/initial_model.pt`` (drawn independently of the data: a one-run audit scores
      a canary by how far training moved its logit from there, ``trainers.canary``);
    - ``nproc``: run the phases in that many local processes (``trainers.distributed``,
      gloo), each on its share of the rows (``trainers.ranks.rank_rows``: whole units when
      units are sampled), with the guarantee of one process: Poisson sampling at q on every
      rank's rows (or units), one all-reduce of the clipped sums, the noise drawn once by
      rank 0; each label randomised once by the rank holding it; the calibration's exact
      vectors summed before its one noise draw. Rank 0 keeps the ledger, evaluates and
      writes the record. ``collective``: this process's place in a group already formed
      (``torchrun``: ``trainers.distributed.from_environment``); ranks other than 0 return None.
    """
    options = options or RunOptions()
    record: RunRecord | None  # the trainers' untyped helpers return it
    if options.collective is None and options.nproc != 1:
        record = launch_plan(_rank, plan, data_path, options)
        return record
    with torch_threads(options.threads) as n_threads, contextlib.ExitStack() as scope:
        checked = _verify(plan, options)
        if plan.tuned:  # every configuration, then the selection
            record = execute_grid(plan, data_path, options, settings=checked.settings, out=checked.out)
            return record
        run = _prepare(plan, data_path, checked, options, scope, n_threads)
        context = _context(plan, run, options)
        check_phases(context)  # the phases' refusals on the data
        if checked.lead:  # read and checked before anything is spent
            run.eval_prep = prepare_eval(options.eval_path, checked.spec, checked.settings, run.device,
                                         run.prep.vocabulary)
        # Every refusal is behind us: only now does the run directory come into being.
        context.session = _open_session(plan, run, options)
        # This session's own streams (a resumed run never replays an earlier session's draws);
        # rank 0's session knows which session this is.
        index = context.session.index if context.collective is None else \
            context.collective.broadcast_object(context.session.index)
        context.randomness = run.randomness = run.randomness.for_session(index)
        try:
            _start_model(context, run, options)
            entries = run_phases(context)
            if not checked.lead:
                return None  # rank 0 evaluates and writes the record
            return _write_record(plan, run, context, entries, options)
        except Exception:
            if context.session.unspent():  # a clean failure before any spending: the run leaves nothing
                context.session.discard()
            raise
        finally:
            context.session.close()


def _rank(collective: Collective, plan: Plan, data_path: str | Path, options: RunOptions) -> RunRecord | None:
    """One process of a run over several (``trainers.ranks.launch_plan``)."""
    return execute_plan(plan, data_path, replace(options, collective=collective))


def _verify(plan: Plan, options: RunOptions) -> _Checked:
    """Every refusal that needs neither the data nor the device, before anything is read or written."""
    settings = (options.settings or TrainSettings()).for_plan(plan)
    out = check_out(options.out_dir, resume=options.resume)
    report = verify_plan(plan)
    if not report.ok:
        raise PlanMismatchError(f"the plan does not verify: {report.problems[0]}", report.problems)
    spec = plan.scenario.features
    if spec is None:
        raise InvalidParameterError("the plan's scenario has no [features] table: the trainer needs the label, "
                                    "unit id and feature columns")
    check_executable(plan.phases, "the phases")
    if options.resume and out is None:
        raise InvalidParameterError("resume needs the run directory (--out) of the interrupted run")
    if settings.nonsensitive_encoding == "vocab" and not plan.nonsensitive_fixed:
        raise UnsupportedError(
            f"--encoding vocab counts values in the training data; under this plan's {plan.adjacency.value} "
            f"{plan.scenario.algorithm} adjacency the non-sensitive columns are protected too, so a vocabulary "
            "built from them would be data-dependent preprocessing no plan accounts for: use --encoding hash")
    collective = options.collective
    return _Checked(settings, out, spec, lead=collective is None or collective.rank == 0)


def _prepare(plan: Plan, data_path: str | Path, checked: _Checked, options: RunOptions, scope: contextlib.ExitStack,
             n_threads: int) -> _Prepared:
    """The device, the randomness, the data (capped, this rank's share, encoded) and the eval data."""
    collective, settings, seed = options.collective, checked.settings, options.seed
    if collective is not None:
        check_distributable(plan)
    rnd = Randomness(seed, stream=0 if collective is None else collective.rank)
    device = resolve_device(settings.device)
    scope.enter_context(reproducible_kernels(device, seeded=seed is not None))
    dpsgd_settings = options.dpsgd_settings or DPSGDSettings.for_device(device)
    t0 = time.perf_counter()
    key, new_key = fingerprint_keys(options.fingerprint_key)
    # Capping must keep the same rows on every rank: one secret seed, drawn by rank 0.
    # (a stream of its own: rank 0's privacy draws stay those of one process from the same seed)
    capping_rnd = rnd if collective is None else Randomness(collective.broadcast_object(
        Randomness(seed, stream=_CAPPING_STREAM).torch_seed()))
    prep = prepare_data(data_path, checked.spec, settings, device, cap=plan.unit.cap, capping=plan.unit.capping,
                        expected_rows=None if plan.count is not None else plan.dataset_size, randomness=capping_rnd,
                        key=key if checked.lead else None, collective=collective,
                        **{"whole_units": False, "holdout": None, "units_split": None, **data_needs(plan.phases)})
    prep.timings["torch_threads"] = n_threads  # where it ran, beside the device
    if collective is not None:
        note_shard(prep, collective)
        prep.timings["processes"] = collective.world_size
    return _Prepared(checked, prep, rnd, device, dpsgd_settings, t0, new_key)


def _context(plan: Plan, run: _Prepared, options: RunOptions) -> PhaseContext:
    """What the phases share (their session is opened once every refusal is behind the run)."""
    checked, prep, size_private = run.checked, run.prep, plan.count is not None
    return PhaseContext(
        phases=plan.phases, prep=prep, data=prep.data, unit_counts=prep.unit_counts, randomness=run.randomness,
        session=None, settings=checked.settings, device=run.device, spec=checked.spec, rows=prep.rows,
        holdout=prep.holdout, part=prep.part, dpsgd_settings=run.dpsgd_settings, walr_settings=options.walr_settings,
        collective=options.collective, progress="" if options.progress and checked.lead else None,
        lead=checked.lead, checkpoints=bool(checked.out and checked.lead), size_private=size_private,
        withhold_sizes=size_private, free_calibration=plan.free_calibration, timings=dict(prep.timings))


def _open_session(plan: Plan, run: _Prepared, options: RunOptions) -> Session | NullSession:
    out = run.checked.out
    if out and run.checked.lead:
        return Session(out, plan, randomness=run.randomness, resume=options.resume,
                       checkpoint_every=options.checkpoint_every, rows=run.prep.data_info["rows_used"])
    return NullSession()


def _start_model(context: PhaseContext, run: _Prepared, options: RunOptions) -> None:
    """The torch model the phases train, if one does: initialised, kept as such on request, or resumed."""
    if not executes_torch_model(context.phases):
        return  # WALR fits its own
    model = new_model(run.prep, context.settings, run.randomness.torch_seed()).to(run.device)
    out = run.checked.out
    if options.keep_initial and out is not None and context.lead:
        save_initial(model, out)
    ckpt = context.session.load_checkpoint()
    if context.collective is not None:
        ckpt = context.collective.broadcast_object(ckpt)  # rank 0's run directory holds it
    if ckpt is not None:
        model.load_state_dict(ckpt.model)
    context.model, context.checkpoint = model, ckpt


def _write_record(plan: Plan, run: _Prepared, context: PhaseContext,
                  entries: list[tuple[PhaseRun | None, PhaseStats]], options: RunOptions) -> RunRecord:
    """Evaluate what the run keeps, build its record and write the run directory (the record last)."""
    final, timings, prep, session = context.final, context.timings, run.prep, context.session
    assert final is not None  # every executable sequence has a training phase, which sets it
    metrics = {}
    if run.eval_prep is not None:
        metrics["eval"], timings["eval_seconds"] = final.evaluate(run.eval_prep, options.eval_path)
        if final.compares_baseline and options.baseline_auc is not None:
            compare(metrics["eval"], options.baseline_auc, options.baseline_tolerance)
    timings["total_seconds"] = time.perf_counter() - run.t0
    record = build_record(
        plan=plan, entries=entries, data=prep.data_info, metrics=metrics, encoding=prep.encoding,
        seeds=run.randomness.record(), model=final.describe(), training=final.training(),
        ledger=session.ledger_view(), timings=timings, device=device_name(run.device),
        sizes_ledger=session.sizes_view() if context.withhold_sizes and final.reports_sizes else None)
    out = run.checked.out
    return write_run(record, final.state(), out, final.vocabulary, new_key=run.new_key if out else None)


def run_baseline(plan: Plan, data_path: str | Path, *, eval_path: str | Path | None = None,
                 out_dir: str | Path | None = None, settings: TrainSettings | None = None,
                 baseline: BaselineSettings | None = None, seed: int | None = None, truncated: bool = False,
                 progress: bool = False, fingerprint_key: bytes | None = None,
                 threads: int | str = "auto") -> RunRecord:
    """The non-private baseline on the plan's feature spec: clean labels, trained to convergence.

    The same model and encoding as the DP arms (``settings``), trained with early stopping
    on a validation split of the training data (``baseline``, a ``BaselineSettings``; see
    ``trainers.baseline``). With ``truncated=True`` it trains the truncated model
    (non-sensitive features only): the ceiling an RR-only model can reach, since RR may not
    use sensitive features. ``threads`` as for ``execute_plan``.
    """
    with torch_threads(threads) as n_threads, contextlib.ExitStack() as scope:
        settings = (settings or TrainSettings()).for_plan(plan)
        baseline = baseline or BaselineSettings()
        out = check_out(out_dir)
        spec = plan.scenario.features
        if spec is None:
            raise InvalidParameterError("the plan's scenario has no [features] table")
        rnd = Randomness(seed)
        device = resolve_device(settings.device)
        scope.enter_context(reproducible_kernels(device, seeded=seed is not None))
        t0 = time.perf_counter()
        key, new_key = fingerprint_keys(fingerprint_key)
        prep = prepare_data(data_path, spec, settings, device, cap=1, capping=None, expected_rows=None, randomness=rnd,
                        key=key)
        prep.timings["torch_threads"] = n_threads
        held, split, units = validation_split(prep.table, spec.unit_id, baseline.validation_fraction)
        eval_prep = prepare_eval(eval_path, spec, settings, device, prep.vocabulary)
        mask = torch.from_numpy(held).to(device)
        train, validation = prep.data.take(~mask), prep.data.take(mask)
        model = new_model(prep, settings, rnd.torch_seed()).to(device)
        gen = torch.Generator().manual_seed(rnd.torch_seed())
        fit_settings = FitSettings(epochs=baseline.max_epochs, batch_size=settings.batch_size, lr=settings.lr,
                                   optimizer=settings.optimizer, weight_decay=baseline.weight_decay)
        history = train_baseline(model, train, validation, fit_settings, baseline, truncated=truncated, generator=gen,
                                 progress="baseline" if progress else None)
        metrics, timings = {}, dict(prep.timings)
        if eval_prep is not None:
            metrics["eval"], timings["eval_seconds"] = evaluate(model, eval_prep, eval_path, truncated=truncated)
        timings["train_seconds"] = history["seconds"]
        timings["total_seconds"] = time.perf_counter() - t0
        final = "truncated" if truncated else "full"
        record = build_record(
            plan=None, algorithm="non-private",
            entries=[baseline_entry(history, baseline, batch_size=fit_settings.batch_size, model=final, split=split,
                                    train_rows=len(train), validation_rows=len(validation), validation_units=units)],
            data=prep.data_info, metrics=metrics, encoding=prep.encoding, seeds=rnd.record(),
            model=ModelInfo(kind=settings.model, config=json_table("model.config", model.config()), final=final),
            training={**settings.to_dict(), "fit": fit_settings.to_dict(), "baseline": baseline.to_dict()}, ledger=None,
            timings=timings, device=device_name(device),
            notes=("non-private: no privacy guarantee applies to this run",
                   *filter(None, [convergence_note(history, baseline)])))
        return write_run(record, model.state_dict(), out, prep.vocabulary, new_key=new_key if out else None)
