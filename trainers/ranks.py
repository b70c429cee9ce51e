"""``execute_plan`` over several local processes: launch the ranks, give each its block of rows.

``execute_plan(..., nproc=N)`` comes here: N fresh processes join one gloo group
(``trainers.distributed.launch``) and each runs ``execute_plan`` with its ``Collective``.
What keeps the guarantee that of one process is in the phases (``trainers.dpsgd``,
``trainers.rr_phase``, ``trainers.calibration``, ``trainers.fit``); here are only the
launch, the split of the rows and what is not run over several processes yet.

Every rank reads the unit ids and caps the whole file with the same secret capping seed (so
every rank keeps the same rows and the plan's N is checked on all of them), then encodes only
its contiguous block (``Collective.shard``): Parquet is read a column at a time
(``trainers.data.columns``), so a rank holds its block's tensors and one column at a time. A
vocabulary is counted over every rank's rows first, so that all ranks encode alike.
"""

from __future__ import annotations

from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.limits import MAX_PROCESSES

__all__ = ["check_nproc", "launch_plan", "check_distributable", "note_shard"]


def check_nproc(nproc) -> int:
    """``nproc`` as an integer in [1, MAX_PROCESSES], or a one-line refusal naming it."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or not 1 <= nproc <= MAX_PROCESSES:
        raise InvalidParameterError(f"nproc must be an integer in [1, {MAX_PROCESSES}], got {nproc!r}")
    return nproc


def check_distributable(plan) -> None:
    """Refuse, before anything is spent, what is not run over several processes yet."""
    if plan.tuning is not None and "grid" in plan.tuning:
        raise UnsupportedError("a tuning grid is not run over several processes yet: train it with one process "
                               "(--nproc 1)")
    if plan.dpsgd is not None and plan.dpsgd.params.samples_units:
        from trainers.dpsgd import UNITS_ONE_PROCESS

        raise UnsupportedError(UNITS_ONE_PROCESS + " (train with --nproc 1)")
    if plan.dpsgd is not None and plan.dpsgd.params.sampling != "poisson":
        from trainers.dpsgd import GLOBAL_SAMPLING

        raise UnsupportedError(f"{GLOBAL_SAMPLING[plan.dpsgd.params.sampling]}: it is not run over several processes "
                               "(plan Poisson sampling, or train with --nproc 1)")


def note_shard(prep, collective) -> None:
    """Note every rank's rows (``_prepare`` encoded only this rank's block)."""
    prep.data_info["rank_rows"] = [r[0] for r in collective.gather([len(prep.data)])]
    prep.encoding["rows"] = prep.data_info["rows_used"]  # every rank's; the per-column counts are rank 0's


def _rank(collective, plan, data_path, threads: int, kwargs: dict):
    from trainers.run import execute_plan

    return execute_plan(plan, data_path, threads=threads, collective=collective, **kwargs)


def launch_plan(plan, data_path, nproc, threads, kwargs: dict):
    """Run ``execute_plan`` in ``nproc`` processes; rank 0's run record.

    ``threads`` is per process; ``"auto"`` shares the free CPUs between the processes (at
    least one each).
    """
    from trainers.distributed import launch
    from trainers.threads import resolve_threads

    nproc = check_nproc(nproc)
    per_rank = max(1, resolve_threads(threads) // nproc) if threads in (None, "auto") else resolve_threads(threads)
    check_distributable(plan)
    return launch(_rank, nproc, plan, data_path, per_rank, kwargs, threads=per_rank)[0]
