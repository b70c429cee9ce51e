"""Turn what ran into the run record: the public entries and the data owner's statistics.

Each phase executor returns what its session did (``RRResult``, ``DPSGDResult``,
``WALRResult``, a baseline's fit history); here each becomes a public record entry, which
holds only what the guarantee covers or what does not depend on the data, and a private
statistics entry. Step counts and batch sizes of the DP-SGD phase come from the run's
write-ahead ledger when there is one, so they cover every session of an interrupted and
resumed run, counted exactly as the auditor counts them (``budgetplan.record.ledger``).

When the plan's N is a DP count, the true row count is protected: the public record's
``rows_used`` is the plan's N, the DP-SGD entry withholds what grows with the true count
(``records.WITHHELD_WITH_N``, read from the private batch-size ledger), and the timings,
the true count and that ledger's head go to the private record.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from budgetplan.record.ledger import LedgerView
from budgetplan.record.parts import (
    CodeHashes,
    DataSummary,
    LedgerHead,
    ModelInfo,
    Seeds,
    json_table,
    number_table,
    text_table,
)
from budgetplan.record.records import (
    BaselineRun,
    BaselineStats,
    DPSGDRun,
    DPSGDStats,
    PhaseRun,
    PhaseStats,
    PrivateRecord,
    RRRun,
    RRStats,
    RunRecord,
    WALRRun,
    WALRStats,
    finite_or_none,
)
from budgetplan.util import typed
from budgetplan.util.codehash import code_fingerprint

if TYPE_CHECKING:  # the results of the torch code: only their types are needed here
    from budgetplan.plan import Plan
    from trainers.baseline import BaselineSettings
    from trainers.dpsgd import DPSGDResult
    from trainers.rr_phase import RRResult
    from trainers.walr import WALRResult

__all__ = ["rr_entry", "dpsgd_entry", "walr_entry", "baseline_entry", "build_record", "versions"]


def versions() -> dict[str, str]:
    out = {}
    for name in ("budgetplan", "dp-accounting", "torch", "numpy", "pyarrow"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def rr_entry(result: RRResult) -> tuple[RRRun, RRStats]:
    """The RR phase. With one flip probability for every row, the count of flips is a
    Binomial(N, rho) draw independent of the data and is public; under eps/K_i each row's
    probability depends on its unit's size, so the count and the mean probability are private."""
    uniform = result.flip_probability is not None
    public = RRRun(
        labels=result.labels, labels_flipped=result.labels_flipped if uniform else None,
        flip_probability=result.flip_probability, per_impression_rule=result.per_impression_rule,
        release_sha256=result.release_sha256, epochs=result.epochs, batch_size=result.batch_size,
        batches=result.batches, loss=result.loss, epoch_loss=tuple(finite_or_none(x) for x in result.epoch_loss),
        model="truncated", seconds=result.seconds, **_validation(result))
    stats = RRStats() if uniform else RRStats(labels_flipped=result.labels_flipped,
                                              flip_probability_mean=result.flip_probability_mean)
    return public, stats


def _finite(xs: Iterable[float | None]) -> tuple[float | None, ...]:
    return tuple(None if x is None else finite_or_none(x) for x in xs)


def _validation(result: RRResult) -> dict[str, Any]:
    """The RR phase's held-out scores as the public entry holds them (none without a held-out part)."""
    if result.validation_rows is None:
        return {}
    # a held-out part comes with its checks and their scores (trainers.rr_validation)
    assert result.validation_checks is not None and result.validation_log_loss is not None
    assert result.validation_auc is not None
    return {"validation_rows": result.validation_rows, "validation_checks": tuple(result.validation_checks),
            "validation_log_loss": _finite(result.validation_log_loss),
            "validation_auc": _finite(result.validation_auc), "validation_kept": result.validation_kept,
            "stopped": result.stopped, "validation_by": result.validation_by,
            "validation_averaged": result.validation_averaged, **_candidates(result)}


def _candidates(result: RRResult) -> dict[str, Any]:
    """The (learning rate, L2) pairs the RR phase chose among on its held-out units, if it chose."""
    if result.candidates is None:
        return {}
    assert result.candidate_log_loss is not None and result.chosen is not None
    return {"candidate_lr": tuple(r for r, _ in result.candidates),
            "candidate_weight_decay": tuple(d for _, d in result.candidates),
            "candidate_log_loss": _finite(result.candidate_log_loss),
            "candidate_auc": None if result.candidate_auc is None else _finite(result.candidate_auc),
            "candidate_chosen": result.chosen}


def dpsgd_entry(result: DPSGDResult, ledger: LedgerView | None, *, nonsensitive_tower: str | None,
                sizes_ledger: LedgerView | None = None, withhold: bool = False,
                part_rows: int | None = None) -> tuple[DPSGDRun, DPSGDStats]:
    """The DP-SGD phase over all of the run's sessions (from the ledger), or this one (no ledger).

    Args:
        sizes_ledger: where the batch sizes are, if not in ``ledger`` (a private N).
        withhold: the plan's N is a DP count: the public entry withholds what grows with it.
        part_rows: the rows of the phase's part of the units (a units split), else None.
    """
    if ledger is not None:
        executed, sizes = ledger.count("dpsgd"), (sizes_ledger or ledger).batch_sizes("dpsgd")
        sessions, lost = ledger.sessions, ledger.steps_lost("dpsgd")
    else:
        executed, sizes = result.start_step + result.steps_taken, list(result.batch_sizes)
        sessions, lost = 1, 0
    public = DPSGDRun(
        steps_planned=result.steps_planned, steps_executed=executed, steps_this_session=result.steps_taken,
        sessions=sessions, steps_lost_to_interruptions=lost, batch_sizes_observed=len(sizes),
        batch_size_expected=result.expected_batch_size, batch_size_sum=sum(sizes),
        batch_size_sumsq=sum(s * s for s in sizes), batch_size_min=min(sizes) if sizes else None,
        batch_size_max=max(sizes) if sizes else None, batches_truncated=result.batches_truncated,
        truncated=result.truncated, noise_std=result.noise_std, noise_multiplier=result.noise_multiplier,
        clipping_norm=result.clipping_norm, sampling_rate=result.sampling_rate, noise_draws=result.noise_draws,
        trainable_parameters=result.trainable_parameters, model=result.model, nonsensitive_tower=nonsensitive_tower,
        chunks=result.chunks, padded_size=result.padded_size, settings=json_table("settings", result.settings),
        seconds=result.seconds,
        peak_memory=None if result.peak_memory is None else json_table("peak_memory", result.peak_memory),
        processes=result.world_size if result.rank_steps is not None else None,
        rank_steps=result.rank_steps, clipped_per="unit" if result.clipped_per == "unit" else None,
        part_rows=part_rows)
    evidence = getattr(result, "evidence", None)
    if not withhold:
        return public, DPSGDStats(clipped_fraction=result.clipped_fraction, evidence=evidence)
    public, held = public.withholding()
    return public, DPSGDStats(clipped_fraction=result.clipped_fraction, withheld=json_table("withheld", held),
                              evidence=evidence)


def walr_entry(result: WALRResult, *, release_sha256: str) -> tuple[WALRRun, WALRStats]:
    public = WALRRun(rows=result.rows, releases=1, release_sha256=release_sha256, noise_std=result.noise_std,
                     noise_draws=result.noise_draws, sensitivity=result.sensitivity,
                     release_seconds=result.release_seconds, fit_steps=result.fit_steps,
                     fit_seconds=result.fit_seconds)
    return public, WALRStats(rows_clipped=result.rows_clipped, weights_clipped=result.weights_clipped,
                             max_contribution=result.max_contribution)


def baseline_entry(history: Mapping[str, Any], settings: BaselineSettings, *, batch_size: int, model: str,
                   split: str, train_rows: int, validation_rows: int,
                   validation_units: int | None) -> tuple[BaselineRun, BaselineStats]:
    """The baseline: its early-stopping rule (public) and its curve on the data (private).

    Args:
        history: ``trainers.baseline.train_baseline``'s result.
        settings: the ``BaselineSettings`` it ran with.
    """
    public = BaselineRun(max_epochs=settings.max_epochs, patience=settings.patience,
                         validation_fraction=settings.validation_fraction, validation_split=split,
                         selection="lowest validation log loss", batch_size=batch_size, model=model)
    stats = BaselineStats(
        checked_at=tuple(history["checked_at"]),
        train_loss=tuple(finite_or_none(x) for x in history["train_loss"]),
        validation_log_loss=tuple(history["validation_log_loss"]), validation_auc=tuple(history["validation_auc"]),
        best=history["best"], stopped=history["stopped"], batches=history["batches"], train_rows=train_rows,
        validation_rows=validation_rows, validation_units=validation_units,
        validation_positives=history["validation_positives"])
    return public, stats


def build_record(*, plan: Plan | None, entries: Sequence[tuple[PhaseRun | None, PhaseStats]],
                 data: Mapping[str, Any], metrics: Mapping[str, Any], encoding: Mapping[str, Any], seeds: Seeds,
                 model: ModelInfo,
                 training: Mapping[str, Any], ledger: LedgerView | None, timings: Mapping[str, int | float],
                 device: str, algorithm: str | None = None,
                 notes: tuple[str, ...] = (), sizes_ledger: LedgerView | None = None) -> RunRecord:
    """The public record and its private part, linked by the private part's hash.

    Args:
        plan: the executed plan, or None for a non-private baseline.
        entries: (public entry, private statistics) per phase, in order; a public entry of
            None for what ran at no cost (an RR-only run's free intercept calibration).
        data: path, format, rows_in, rows_used, capping and the keyed fingerprint.
        sizes_ledger: the private batch-size ledger of a plan whose N is a DP count.
    """
    summary = typed.from_json_object(DataSummary, data, "data")
    rows_used = summary.rows_used
    if plan is not None and plan.count is not None:
        # The true count and everything timed against it stay with the data owner.
        rows_used = plan.dataset_size
        summary = replace(summary, timings=number_table("data.timings", timings), sizes_ledger=(
            LedgerHead(head=sizes_ledger.head, lines=len(sizes_ledger.entries)) if sizes_ledger is not None else None))
        timings = {}
        notes = notes + ("the plan's N is a DP count: rows_used is that count, and the true count, batch sizes, "
                         "chunks, memory and timings are in the private record",)
    if algorithm is None:
        if plan is None:
            raise ValueError("a record without a plan (a baseline) names its algorithm")
        algorithm = plan.scenario.algorithm
    private_part = PrivateRecord(plan_sha256=plan.sha256 if plan is not None else None, data=summary,
                                 phases=tuple(s for _, s in entries), metrics=json_table("metrics", metrics),
                                 encoding=json_table("encoding", encoding))
    return RunRecord(
        plan_sha256=plan.sha256 if plan is not None else None, private=plan is not None,
        algorithm=algorithm, rows_used=rows_used, seeds=seeds,
        phases=tuple(p for p, _ in entries if p is not None), model=model, training=json_table("training", training),
        ledger=LedgerHead(head=ledger.head, lines=len(ledger.entries)) if ledger is not None else None,
        code=CodeHashes(**code_fingerprint()), timings=number_table("timings", timings), device=device,
        versions=text_table("versions", versions()),
        private_sha256=private_part.sha256, notes=notes, private_part=private_part)
