"""Cap every privacy unit at K examples: the bound that user-level accounting relies on.

A user-level plan accounts for at most K examples per unit (group privacy, per-impression
eps/K, a mixture of Gaussians for Poisson DP-SGD); the trainer makes that true by dropping the
rest before training. Two rules, as in ``budgetplan.units.CAPPING_RULES``, and a third for
data prepared ahead of training (``budgetplan data cap``):

- ``first``: the first K rows of the unit in data order (e.g. the earliest impressions of a
  time-sorted log);
- ``random``: K of the unit's rows chosen uniformly at random without replacement;
- ``keyed``: the K rows of smallest keyed priority (``trainers.data.keyed``: HMAC-SHA256 of
  the row's unit and position under a secret key), ties broken by data order. Pseudo-random
  to whoever lacks the key, and reproducible by whoever holds it: the local and the Spark
  engine keep the same rows.

Which rows are kept depends on the data only through the unit ids and row order, never on
labels or features, so capping costs no privacy; under ``random`` the choice must still be
unpredictable to an adversary who knows the data, so callers pass a generator seeded from the
operating system's CSPRNG (:func:`secure_rng`, the default when ``rng`` is None). A seeded
generator is for tests and reproductions only.

Vectorised: one stable argsort groups the rows of each unit, a rank within the group is the
position minus the group's start, and rows of rank < K are kept. No Python loop over units.
"""

from __future__ import annotations

import secrets

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["cap_units", "capped_rows", "rows_per_cap", "unit_ids", "secure_rng", "RULES"]

RULES = ("first", "random", "keyed")


def secure_rng() -> np.random.Generator:
    """A numpy Generator seeded with 128 bits from the OS CSPRNG (``secrets``)."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


def unit_ids(table, name: str, why: str = "to be capped") -> np.ndarray:
    """The unit id column of a ``pyarrow.Table`` as numpy, refusing missing ids.

    A row without a unit cannot be capped (it would be a unit of its own, or all such rows
    one unit), and numpy cannot sort None among strings; so a null, or a NaN in a float
    column, is refused with the count of such rows.
    """
    if name not in table.column_names:
        raise InvalidParameterError(f"the data has no unit id column {name!r}")

    column = table.column(name)
    missing = column.null_count
    if pa.types.is_floating(column.type):
        missing += int(pc.sum(pc.is_nan(column)).as_py() or 0)  # nulls are counted once, above
    if missing:
        raise InvalidParameterError(f"unit id column {name!r} has {missing} missing values (null or NaN): every "
                                    f"row needs its unit {why}")
    return column.to_numpy(zero_copy_only=False)


def capped_rows(unit_ids, caps) -> dict:
    """Rows left after capping each unit at each K in ``caps``: sum over units of min(n_u, K).

    The same count under both rules (they differ in which rows, not how many), so a plan's N
    for a user-level scenario can be read off before training. Returns ``{"rows", "units",
    "max_per_unit", "caps": [{"cap", "rows", "rows_dropped", "units_capped"}]}``.
    """
    ids = np.asarray(unit_ids)
    if ids.ndim != 1:
        raise InvalidParameterError(f"unit ids must be one-dimensional, got shape {ids.shape}")
    return rows_per_cap(np.unique(ids, return_counts=True)[1] if ids.size else np.zeros(0, dtype=np.int64), caps)


def rows_per_cap(counts, caps) -> dict:
    """:func:`capped_rows` from the rows of each unit (``counts``), however they were counted."""
    counts = np.asarray(counts, dtype=np.int64)
    ks = [validate.positive_int("cap", k) for k in caps]
    total = int(counts.sum())
    out = []
    for k in ks:
        kept = int(np.minimum(counts, min(k, total)).sum())  # K above the rows is no cap (and fits int64)
        out.append({"cap": k, "rows": kept, "rows_dropped": total - kept, "units_capped": int((counts > k).sum())})
    return {"rows": total, "units": int(counts.size), "max_per_unit": int(counts.max()) if counts.size else 0,
            "caps": out}


def cap_units(unit_ids, cap: int, *, rule: str = "random", rng: np.random.Generator | None = None,
              priorities=None):
    """Rows to keep so that no unit has more than ``cap`` of them.

    Args:
        unit_ids: 1-D array of unit ids, one per row (e.g. ``EncodedData.unit`` as numpy).
            Any sortable dtype; dense int64 ids are fastest.
        cap: K, the most rows a unit may keep (an integer >= 1).
        rule: ``"first"`` keeps each unit's first K rows in data order; ``"random"`` keeps K
            uniformly random rows of each unit with more than K.
        rng: the generator for ``"random"``. None draws a fresh one from the OS CSPRNG
            (:func:`secure_rng`), which is what production runs should do. Ignored by
            ``"first"`` and ``"keyed"``.
        priorities: for ``"keyed"`` (and only there), one uint64 per row from
            ``trainers.data.keyed.cap_priorities``; the rows must be in data order, which
            breaks ties. Priorities computed from labels or features would void the
            privacy argument: they must come from unit ids, positions and the key alone.

    Returns:
        ``(kept_rows, info)``: ``kept_rows`` is a sorted int64 array of row numbers (data
        order preserved), ``info`` a dict with ``rows_in``, ``rows_kept``, ``rows_dropped``,
        ``units``, ``units_capped`` (units that had more than ``cap`` rows), ``cap``, ``rule``.

    Raises:
        InvalidParameterError: a bad cap or rule, unit ids that are not one-dimensional, or
            priorities missing for ``"keyed"``, given for another rule, or of another length.
    """
    cap = validate.positive_int("cap", cap)
    if rule not in RULES:
        raise InvalidParameterError(f"capping rule must be one of {', '.join(RULES)}, got {rule!r}")
    ids = np.asarray(unit_ids)
    if ids.ndim != 1:
        raise InvalidParameterError(f"unit ids must be one-dimensional, got shape {ids.shape}")
    n = ids.shape[0]
    if (rule == "keyed") != (priorities is not None):
        raise InvalidParameterError("priorities go with the keyed capping rule, and only with it")
    if priorities is not None:
        priorities = np.asarray(priorities, dtype=np.uint64)
        if priorities.shape != ids.shape:
            raise InvalidParameterError(f"priorities must have one value per row ({n}), got shape "
                                        f"{priorities.shape}")
    if n == 0:
        return np.zeros(0, dtype=np.int64), {"rows_in": 0, "rows_kept": 0, "rows_dropped": 0, "units": 0,
                                             "units_capped": 0, "cap": cap, "rule": rule}
    if rule == "random":
        rng = secure_rng() if rng is None else rng
        # Shuffle first, then a stable sort by unit: within a unit the shuffled order survives,
        # so its first K rows are a uniformly random K-subset.
        order = rng.permutation(n)
        order = order[np.argsort(ids[order], kind="stable")]
    elif rule == "keyed":
        order = np.lexsort((np.arange(n), priorities, ids))  # by unit, then priority, then position
    else:
        order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    sizes = np.diff(np.append(starts, n))
    group_start = np.repeat(starts, sizes)
    rank = np.arange(n) - group_start
    kept = np.sort(order[rank < cap]).astype(np.int64, copy=False)
    info = {
        "rows_in": int(n),
        "rows_kept": int(kept.shape[0]),
        "rows_dropped": int(n - kept.shape[0]),
        "units": int(starts.shape[0]),
        "units_capped": int(np.count_nonzero(sizes > cap)),
        "cap": cap,
        "rule": rule,
    }
    return kept, info
