"""``execute_plan`` over several local processes: launch the ranks, give each its block of rows.

``execute_plan(..., nproc=N)`` comes here: N fresh processes join one gloo group
(``trainers.distributed.launch``) and each runs ``execute_plan`` with its ``Collective``.
What keeps the guarantee that of one process is in the phases (``trainers.dpsgd``,
``trainers.rr_phase``, ``trainers.calibration``, ``trainers.fit``); here are only the
launch, the split of the rows and what is not run over several processes yet.

Every rank reads the unit ids and caps the whole file with the same secret capping seed (so
every rank keeps the same rows and the plan's N is checked on all of them), then encodes only
its share of the rows (``rank_rows``): Parquet is read a column at a time
(``trainers.data.columns``), so a rank holds its share's tensors and one column at a time. A
vocabulary is counted over every rank's rows first, so that all ranks encode alike.

A rank's share is a contiguous block of rows, except when the DP-SGD phase samples units: then
it is every row of a contiguous block of units, so that no unit is split between ranks. Poisson
sampling of units includes each unit independently at q, so each rank sampling its own units is
the accounted sample of the M units exactly as for rows; what it needs is that a sampled unit's
rows are all on the rank that clips their summed gradient, once.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.limits import MAX_PROCESSES
from trainers.distributed import block, launch
from trainers.dpsgd import GLOBAL_SAMPLING
from trainers.threads import resolve_threads

__all__ = ["block", "check_nproc", "launch_plan", "check_distributable", "note_shard", "rank_rows"]


def rank_rows(ranks: int, rank: int, *, rows: int | None = None, units=None) -> np.ndarray:
    """This rank's share of the (capped) rows, as row numbers in data order.

    Identical on every rank and computed from the row count or the unit ids alone (never from
    labels or features), as capping is.

    Args:
        ranks, rank: the world size and this rank.
        rows: the rows in all: the share is the rank's contiguous block (``block``).
        units: instead of ``rows``, each row's dense unit 0..M-1: the share is every row of
            the rank's contiguous block of units, so that every unit is whole on one rank.
            The M units are split evenly by count, not by rows: the unit sampler lays every
            sampled unit out in a block of K rows, so a rank's work per step is its sampled
            units times K whatever their rows; and each rank's unit count (which the ledger
            notes for the audit) is then a function of the plan's M alone, where a split
            balanced by rows would publish partial sums of the units' row counts.
    """
    if units is None:
        if rows is None:
            raise ValueError("rank_rows needs rows or units")
        share = block(rows, ranks, rank)
        return np.arange(share.start, share.stop, dtype=np.int64)
    units = np.asarray(units)
    share = block(int(units.max()) + 1 if units.size else 0, ranks, rank)
    return np.flatnonzero((units >= share.start) & (units < share.stop)).astype(np.int64)


def check_nproc(nproc) -> int:
    """``nproc`` as an integer in [1, MAX_PROCESSES], or a one-line refusal naming it."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= MAX_PROCESSES:
        raise InvalidParameterError(f"nproc must be an integer in [1, {MAX_PROCESSES}], got {nproc!r}")
    return nproc


def check_distributable(plan) -> None:
    """Refuse, before anything is spent, what is not run over several processes yet."""
    if plan.tuned:
        raise UnsupportedError("a tuning grid is not run over several processes yet: train it with one process "
                               "(--nproc 1)")
    if any(getattr(p.params, "unit_part", None) is not None for p in plan.phases):
        raise UnsupportedError("a units split is not run over several processes yet: train it with one process "
                               "(--nproc 1)")
    if plan.dpsgd is not None and plan.dpsgd.params.sampling != "poisson":
        raise UnsupportedError(f"{GLOBAL_SAMPLING[plan.dpsgd.params.sampling]}: it is not run over several processes "
                               "(plan Poisson sampling, or train with --nproc 1)")


def note_shard(prep, collective) -> None:
    """Note every rank's rows (``_prepare`` encoded only this rank's share)."""
    prep.data_info["rank_rows"] = [r[0] for r in collective.gather([len(prep.data)])]
    prep.encoding["rows"] = prep.data_info["rows_used"]  # every rank's; the per-column counts are rank 0's


def launch_plan(run_rank, plan, data_path, options):
    """Run ``run_rank(collective, plan, data_path, options)`` in ``options.nproc`` processes; rank 0's result.

    ``run_rank`` is a module-level function (it is pickled to each process): ``trainers.run``'s,
    which runs ``execute_plan`` with the rank's ``Collective``. ``options.threads`` is per
    process; ``"auto"`` shares the free CPUs between the processes (at least one each). Each
    rank's options are ``options`` with its thread count, one process and no initial model kept.
    """
    threads = options.threads
    nproc = check_nproc(options.nproc)
    per_rank = max(1, resolve_threads(threads) // nproc) if threads in (None, "auto") else resolve_threads(threads)
    check_distributable(plan)
    ranked = replace(options, threads=per_rank, nproc=1, collective=None, keep_initial=False)
    return launch(run_rank, nproc, plan, data_path, ranked, threads=per_rank)[0]
