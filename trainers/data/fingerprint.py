"""A fingerprint of the data a run trained on: row count and sha256 of the used columns.

The run record carries it so an auditor can tell whether two runs saw the same data. The
digest covers the selected columns' names, Arrow types and every value (nulls included), in
the order given (the spec's order), serialised as an Arrow IPC stream: change one value, one
type, the column order or the row order and the digest changes.

It does not depend on how the table is laid out in memory: rows are re-batched into fixed
windows of :data:`WINDOW` rows with freshly built buffers (a slice would otherwise serialise
bytes of its parent), dictionary-encoded columns are hashed as their values, and schema and
field metadata (pandas metadata from Parquet, for instance) are dropped. Columns not selected
never enter the digest, so adding an unused column to a file leaves it unchanged.
"""

from __future__ import annotations

import hashlib

from budgetplan.errors import InvalidParameterError

__all__ = ["fingerprint", "WINDOW"]

WINDOW = 1 << 20  # rows per serialised batch; part of the digest's definition


class _HashSink:
    """A write-only file object that feeds every byte to a hash."""

    def __init__(self, digest):
        self.digest = digest
        self.closed = False

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True


def fingerprint(table, columns) -> dict:
    """``{"rows": N, "sha256": hex, "columns": [...]}`` over ``columns`` of ``table``.

    Args:
        table: a ``pyarrow.Table``.
        columns: the column names to cover, in order (e.g. ``FeatureSpec.columns``); repeats
            are dropped.

    Raises:
        InvalidParameterError: a named column is not in the table.
    """
    import pyarrow as pa

    names = list(dict.fromkeys([columns] if isinstance(columns, str) else columns))
    for name in names:
        if name not in table.column_names:
            raise InvalidParameterError(f"fingerprint: column {name!r} is not in the table")
    selected = table.select(names)
    # Dictionary encoding is a storage detail: hash the values, not the dictionary layout.
    selected = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                         for c in selected.columns], names=names)
    # A canonical schema: no metadata, every field nullable, so only names, types and
    # values count.
    schema = pa.schema([pa.field(f.name, f.type) for f in selected.schema])
    digest = hashlib.sha256()
    sink = pa.PythonFile(_HashSink(digest), mode="w")
    with pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, selected.num_rows, WINDOW):
            window = selected.slice(start, WINDOW)
            # concat_arrays rebuilds each column with offset 0 and trimmed buffers: a slice
            # would otherwise serialise its parent's bytes, so equal values could differ.
            batch = pa.record_batch([pa.concat_arrays(c.chunks) if c.num_chunks else pa.array([], c.type)
                                     for c in window.columns], schema=schema)
            writer.write_batch(batch)
    return {"rows": int(table.num_rows), "sha256": digest.hexdigest(), "columns": names}
