"""Parquet data read one column at a time: the trainer's input without the whole table in memory.

A Criteo-shaped row costs about 1 KB on its way to tensors when the whole Arrow table is
read first (its 26 string columns alone are about 300 bytes a row): 37 GiB at 40M rows. Read
column by column, the encoder holds one column's Arrow data beside the tensors it fills,
and Parquet, a columnar format, reads just that column. :class:`ParquetColumns` offers what
the encoder, capping and the fingerprint use of a ``pyarrow.Table`` (``column_names``,
``num_rows``, ``column(name)``, ``take(rows)``), over a Parquet file or a directory of
Parquet shards (in :func:`trainers.data.loaders.list_shards` order, so rows are numbered as
``read_table`` numbers them), and :meth:`ParquetColumns.windows`, the rows in fixed-size
windows of every column, which is what the keyed fingerprint digests.

Everything it returns equals what ``read_table`` would have given: the same values, types
and row order (tests check the encoding and the fingerprint against the whole-table path).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError
from trainers.data.loaders import detect_format, iter_batches, list_shards

__all__ = ["ParquetColumns", "parquet_source"]


def parquet_source(path: str | os.PathLike, data_format: str, columns) -> ParquetColumns | None:
    """A column-at-a-time view of ``path`` when it is Parquet (a file, or a directory of Parquet
    shards) and ``data_format`` allows it; None for other formats (read whole, as before)."""
    if data_format not in ("auto", "parquet"):
        return None
    p = Path(path)
    if not p.exists():
        return None  # read_table says so, in its words
    shards = list_shards(p) if p.is_dir() else [p]
    try:
        if data_format == "auto" and any(detect_format(s) != "parquet" for s in shards):
            return None
    except InvalidParameterError:
        return None
    return ParquetColumns(shards, columns)


class ParquetColumns:
    """The ``columns`` of Parquet ``shards`` as one table, read a column at a time.

    Args:
        shards: Parquet files in row order.
        columns: the columns wanted, in order (repeats dropped); each must be in every shard.
        rows: the row numbers to keep, in order (``take``); None keeps every row.

    Raises:
        InvalidParameterError: a shard is unreadable, or lacks a column.
    """

    def __init__(self, shards, columns, rows: np.ndarray | None = None):
        self.shards = [Path(s) for s in shards]
        self.column_names = list(dict.fromkeys(columns))
        self._rows = rows
        counts = []
        for shard in self.shards:
            try:
                meta = pq.read_metadata(str(shard))
                names = pq.read_schema(str(shard)).names
            except (pa.ArrowException, OSError) as exc:
                raise InvalidParameterError(f"{shard}: cannot read as parquet: "
                                            f"{' '.join(str(exc).split())[:300]}") from None
            twice = [c for c, n in Counter(names).items() if n > 1]
            if twice:  # as read_table refuses: which of the two a reader takes is an accident of the reader
                raise InvalidParameterError(f"{shard}: the file names column {twice[0]!r} twice; column names "
                                            "must be unique")
            missing = [c for c in self.column_names if c not in names]
            if missing:
                raise InvalidParameterError(f"{shard}: column {missing[0]!r} is not in the data (it has "
                                            f"{', '.join(names[:20])})")
            counts.append(meta.num_rows)
        self._all_rows = int(sum(counts))

    @property
    def num_rows(self) -> int:
        return self._all_rows if self._rows is None else int(self._rows.shape[0])

    def take(self, rows) -> ParquetColumns:
        """The rows at ``rows`` (row numbers of this view, in order), as another view."""
        rows = np.asarray(rows, dtype=np.int64)
        view = ParquetColumns.__new__(ParquetColumns)
        view.shards, view.column_names, view._all_rows = self.shards, self.column_names, self._all_rows
        view._rows = rows if self._rows is None else self._rows[rows]
        return view

    def slice(self, start: int, length: int) -> ParquetColumns:
        """Rows ``start`` to ``start + length`` of this view (a rank's block)."""
        return self.take(np.arange(start, min(start + length, self.num_rows), dtype=np.int64))

    def column(self, name: str):
        """One column over every shard (a ``pyarrow.ChunkedArray``), restricted to the kept rows."""
        if name not in self.column_names:
            raise KeyError(name)
        chunks = []
        for shard in self.shards:
            try:
                chunks += pq.read_table(str(shard), columns=[name]).column(0).chunks
            except (pa.ArrowException, OSError) as exc:
                raise InvalidParameterError(f"{shard}: cannot read column {name!r}: "
                                            f"{' '.join(str(exc).split())[:300]}") from None
        types = {c.type for c in chunks}
        if len(types) > 1:
            raise InvalidParameterError(f"column {name!r} has different types in the shards: "
                                        f"{', '.join(sorted(map(str, types)))}")
        column = pa.chunked_array(chunks, type=chunks[0].type if chunks else pa.null())
        return column if self._rows is None else column.take(pa.array(self._rows))

    def windows(self, rows: int):
        """Every column, in tables of exactly ``rows`` rows (the last one shorter), in row order.

        Only for the view of every row (before ``take``): it is the data as given.
        """
        if self._rows is not None:
            raise ValueError("windows() reads the data as given, not a subset of its rows")
        pending: list = []
        held = 0
        for shard in self.shards:
            for batch in iter_batches(shard, format="parquet", columns=self.column_names, batch_rows=1 << 16):
                pending.append(batch)
                held += batch.num_rows
                while held >= rows:
                    table = pa.Table.from_batches(pending)
                    yield table.slice(0, rows)
                    rest = table.slice(rows)
                    pending, held = rest.to_batches(), rest.num_rows
        if held:
            yield pa.Table.from_batches(pending)

    def schema(self):
        """The Arrow schema of the wanted columns, in order (as the first shard stores them)."""
        stored = pq.read_schema(str(self.shards[0]))
        return pa.schema([stored.field(n) for n in self.column_names])
