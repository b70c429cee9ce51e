"""The local preparation engine: keyed capping, splitting and counting, streamed in Arrow record batches.

Memory stays far below the data: no pass holds more than one record batch of the data's
columns. Pass 1 reads the unit id column alone and keeps per-unit counts (Arrow's hash
aggregation, merged every few batches) and, for the rows of units over the cap only, three
numbers each (unit, keyed priority, global position); pass 2 streams every column again
and writes the kept rows, one Parquet shard per input shard (``part-<shard>.parquet``), in
input order. The unit id's text (Arrow's cast to string: decimal for integers) is the key
everywhere, which is also what the keyed priorities hash (``trainers.data.keyed``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError
from trainers.data.capping import cap_units
from trainers.data.keyed import cap_priorities, check_unit_type, held_out_threshold, split_scores
from trainers.data.loaders import detect_format, iter_batches
from trainers.data.prepared import shard_name
from trainers.progress import bar

__all__ = ["unit_counts", "cap_into", "split_into", "refuse_empty_side"]

_BATCH_ROWS = 1 << 16
_MERGE_EVERY = 8  # partial per-unit counts merged after this many batches: bounded memory, few merges


def _text(column, name: str, shard):
    """The unit id column as int64 or string, refusing a type whose text is ambiguous and missing ids."""
    check_unit_type(name, column.type)
    if column.null_count:
        raise InvalidParameterError(f"unit id column {name!r} has missing values in {shard.name}: every row needs "
                                    "its unit to be capped or split")
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    # Integers are counted as int64 (8 bytes, cheap to hash); their text is made only for the rows hashed.
    return pc.cast(column, pa.int64() if pa.types.is_integer(column.type) else pa.string())


def _rows_total(shards) -> int | None:
    """The rows of all shards from Parquet footers; None when a shard is delimited text (unknown until read)."""
    if any(detect_format(s) != "parquet" for s in shards):
        return None
    return sum(pq.ParquetFile(s).metadata.num_rows for s in shards)


class _Progress:
    """A rich bar over the rows of ``passes`` passes (or over shards when rows are unknown), on stderr."""

    def __init__(self, label: str | None, shards, passes: int):
        rows = _rows_total(shards) if label is not None else None
        self.by_rows = rows is not None
        self._bar = bar(label, passes * (rows if self.by_rows else len(shards))) if label is not None else None

    def rows(self, n: int) -> None:
        if self._bar is not None and self.by_rows:
            self._bar[0].advance(self._bar[1], n)

    def shard(self) -> None:
        if self._bar is not None and not self.by_rows:
            self._bar[0].advance(self._bar[1], 1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar[0].stop()


def _unit_batches(shards, unit_id, progress):
    """(shard index, shard, first row of the batch within the shard, unit text) over every batch."""
    for i, shard in enumerate(shards):
        start = 0
        for batch in iter_batches(shard, columns=[unit_id], batch_rows=_BATCH_ROWS):
            yield i, shard, start, _text(batch.column(0), unit_id, shard)
            start += batch.num_rows
            progress.rows(batch.num_rows)
        progress.shard()


def _merge(parts):
    try:
        table = pa.concat_tables(parts).group_by("unit").aggregate([("n", "sum")])
    except pa.ArrowInvalid:
        raise InvalidParameterError("the unit id column is integer in some shards and text in others: give it "
                                    "one type") from None
    return table.rename_columns(["unit", "n"])


def unit_counts(shards, unit_id: str, progress=None):
    """(the units as an Arrow array, their row counts as int64 numpy, rows of each shard) in one pass."""
    progress = progress or _Progress(None, shards, 1)
    parts, per_shard = [], [0] * len(shards)
    for i, _shard, _start, text in _unit_batches(shards, unit_id, progress):
        per_shard[i] += len(text)
        counts = text.value_counts()
        parts.append(pa.table({"unit": counts.field("values"), "n": counts.field("counts")}))
        if len(parts) >= _MERGE_EVERY:
            parts = [_merge(parts)]
    if not parts:
        return pa.array([], pa.int64()), np.zeros(0, dtype=np.int64), per_shard
    merged = _merge(parts)
    return merged.column("unit").combine_chunks(), merged.column("n").to_numpy().astype(np.int64), per_shard


def _write_filtered(shards, keep, outs, progress) -> None:
    """Stream every column of every shard; ``keep(shard, start, batch)`` gives one boolean mask per output.

    ``outs[j]`` is the directory of output ``j``; a shard's rows for output j go to
    ``outs[j]/part-<shard>.parquet``, written only when it receives a row.
    """
    for i, shard in enumerate(shards):
        writers: list = [None] * len(outs)
        try:
            start = 0
            for batch in iter_batches(shard, batch_rows=_BATCH_ROWS):
                for j, mask in enumerate(keep(i, start, batch)):
                    part = batch.filter(pa.array(mask))
                    if part.num_rows:
                        if writers[j] is None:
                            writers[j] = pq.ParquetWriter(str(outs[j] / shard_name(i)), part.schema)
                        writers[j].write_batch(part)
                start += batch.num_rows
                progress.rows(batch.num_rows)
        finally:
            for w in writers:
                if w is not None:
                    w.close()
        progress.shard()


def cap_into(shards, unit_id: str, cap: int, key: bytes, out, *, progress_label: str | None = None) -> dict:
    """Keep each unit's ``cap`` rows of smallest keyed priority; write them under ``out``.

    Returns ``{"rows_in", "rows", "units", "units_capped"}``.
    """
    progress = _Progress(progress_label, shards, 3)
    try:
        values, counts, per_shard = unit_counts(shards, unit_id, progress)
        offsets = np.concatenate(([0], np.cumsum(per_shard, dtype=np.int64)))
        over = values.filter(counts > cap)
        codes, prios, where = [], [], []
        for i, _shard, start, text in _unit_batches(shards, unit_id, progress):
            index = pc.index_in(text, value_set=over)
            rows = np.flatnonzero(index.is_valid().to_numpy(zero_copy_only=False))
            if rows.size == 0:
                continue
            codes.append(index.take(rows).to_numpy().astype(np.int32))
            units = text.take(rows).cast("string").cast("binary").to_pylist()
            prios.append(cap_priorities(key, units, np.full(rows.size, i), start + rows))
            where.append(offsets[i] + start + rows)
        dropped = np.zeros(0, dtype=np.int64)
        if codes:
            code, prio, position = np.concatenate(codes), np.concatenate(prios), np.concatenate(where)
            kept, _ = cap_units(code, cap, rule="keyed", priorities=prio)  # rows are in data order: ties by position
            mask = np.ones(code.size, dtype=bool)
            mask[kept] = False
            dropped = position[mask]  # ascending, as the positions were gathered
            del code, prio, kept, mask

        def keep(i, start, batch):
            g0 = offsets[i] + start
            lo, hi = np.searchsorted(dropped, [g0, g0 + batch.num_rows])
            mask = np.ones(batch.num_rows, dtype=bool)
            mask[dropped[lo:hi] - g0] = False
            return [mask]

        _write_filtered(shards, keep, [out], progress)
    finally:
        progress.close()
    rows_in = int(offsets[-1])
    return {"rows_in": rows_in, "rows": rows_in - int(dropped.size), "units": int(counts.size),
            "units_capped": int((counts > cap).sum())}


def split_into(shards, unit_id: str, fraction: float, key: bytes, train, held_out, *,
               progress_label: str | None = None) -> dict:
    """Put each unit, all its rows, on the held-out side when its keyed score is below ``fraction``.

    Refuses, before writing, a split that leaves a side empty. Returns ``{"rows_in", "units",
    "train": {"rows", "units"}, "held_out": {"rows", "units"}}``.
    """
    threshold = np.uint64(held_out_threshold(fraction))
    progress = _Progress(progress_label, shards, 2)
    try:
        values, counts, per_shard = unit_counts(shards, unit_id, progress)
        held = split_scores(key, values.cast("string").cast("binary").to_pylist()) < threshold
        stats = {"rows_in": int(sum(per_shard)), "units": int(counts.size),
                 "train": {"rows": int(counts[~held].sum()), "units": int((~held).sum())},
                 "held_out": {"rows": int(counts[held].sum()), "units": int(held.sum())}}
        refuse_empty_side(fraction, stats)
        held_units = values.filter(held)

        def keep(i, start, batch):
            text = _text(batch.column(unit_id), unit_id, shards[i])
            mask = pc.is_in(text, value_set=held_units).to_numpy(zero_copy_only=False)
            return [~mask, mask]

        _write_filtered(shards, keep, [train, held_out], progress)
    finally:
        progress.close()
    return stats


def refuse_empty_side(fraction: float, stats: dict) -> None:
    """Refuse a split with a side of no unit (both engines, before they write)."""
    for side in ("train", "held_out"):
        if stats[side]["units"] == 0:
            raise InvalidParameterError(f"--held-out {fraction!r} puts no unit on the {side} side "
                                        f"({stats['units']} units): choose a fraction nearer the middle")
