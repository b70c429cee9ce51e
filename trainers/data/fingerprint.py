"""A keyed fingerprint of the data a run trained on: row count and HMAC-SHA256 of the used columns.

The private run record carries it so that the data owner, or an auditor the owner gives
the key to, can tell whether a run saw given data. It is keyed because a plain hash of the
data would leak: anyone who knew every row but one could recover the missing label by
hashing the candidates. With a 256-bit secret key the digest says nothing to whoever does
not hold the key. The key's id (a hash of the key, not the key) names which key made it.

The digest covers the selected columns' names, Arrow types and every value (nulls included), in
the order given (the spec's order), serialised as an Arrow IPC stream: change one value, one
type, the column order or the row order and the digest changes.

It does not depend on how the table is laid out in memory: rows are re-batched into fixed
windows of :data:`WINDOW` rows with freshly built buffers (a slice would otherwise serialise
bytes of its parent), the bytes a null hides are zeroed and its validity bitmap rebuilt (a
reader leaves whatever it likes there), dictionary-encoded columns are hashed as their values,
and schema and field metadata (pandas metadata from Parquet, for instance) are dropped. Columns not selected
never enter the digest, so adding an unused column to a file leaves it unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from budgetplan.errors import InvalidParameterError
from budgetplan.util.fileio import atomic_output

__all__ = ["fingerprint", "WINDOW", "KEY_BYTES", "new_key", "read_key", "write_key", "key_id"]

WINDOW = 1 << 20  # rows per serialised batch; part of the digest's definition
KEY_BYTES = 32    # a fresh key; a key read from a file must have at least MIN_KEY_BYTES
MIN_KEY_BYTES = 16


def new_key() -> bytes:
    """A fresh random key from the operating system's CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def key_id(key: bytes) -> str:
    """A public name for ``key``: 16 hex digits of a domain-separated hash (reveals nothing of the key)."""
    return hashlib.sha256(b"budgetplan fingerprint key id\0" + key).hexdigest()[:16]


def read_key(path) -> bytes:
    """The key in file ``path`` (raw bytes, at least MIN_KEY_BYTES)."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidParameterError(f"cannot read the fingerprint key {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise InvalidParameterError(f"the fingerprint key {path} has {len(key)} bytes; at least {MIN_KEY_BYTES} "
                                    "random bytes are needed")
    return key


def write_key(path, key: bytes) -> None:
    """Write ``key`` to ``path``, readable by its owner only."""
    with atomic_output(path) as tmp:
        os.chmod(tmp, 0o600)  # before the key is in it
        with open(tmp, "wb") as fh:
            fh.write(key)


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


def _canonical(array):
    """``array`` with what its nulls hide made canonical: zero (or empty) values under them, and a
    validity bitmap built afresh (zero padding).

    The bytes under a null are whatever the producer left there: the same column read whole or
    in batches can carry different ones, and the digest would differ for equal data. Nested
    types are serialised as they are.
    """
    if array.null_count == 0:
        return array
    kind = array.type
    flat = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
        pa.types.is_large_binary(kind)
    if not (flat or pa.types.is_primitive(kind)):
        return array
    try:
        if flat:
            empty = pa.scalar("" if pa.types.is_string(kind) or pa.types.is_large_string(kind) else b"", type=kind)
        else:
            empty = pa.scalar(False) if pa.types.is_boolean(kind) else pa.scalar(0, type=pa.int64()).cast(kind)
        filled = pc.fill_null(array, empty)
    except (pa.ArrowException, TypeError):
        return array
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(kind, len(array), [bitmap, *filled.buffers()[1:]], null_count=array.null_count)


def fingerprint(table, columns, key: bytes) -> dict:
    """``{"rows": N, "hmac_sha256": hex, "key_id": id, "columns": [...]}`` over ``columns`` of ``table``.

    Args:
        table: a ``pyarrow.Table``, or a ``trainers.data.columns.ParquetColumns`` (digested a
            window at a time, never whole; the same digest as its table).
        columns: the column names to cover, in order (e.g. ``FeatureSpec.columns``); repeats
            are dropped.
        key: the data owner's secret key (``new_key()``, ``read_key(path)``).

    Raises:
        InvalidParameterError: a named column is not in the table.
    """
    names = list(dict.fromkeys([columns] if isinstance(columns, str) else columns))
    for name in names:
        if name not in table.column_names:
            raise InvalidParameterError(f"fingerprint: column {name!r} is not in the table")
    if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
        raise InvalidParameterError(f"fingerprint: the key must be at least {MIN_KEY_BYTES} bytes")

    def plain(selected):
        # Dictionary encoding is a storage detail: hash the values, not the dictionary layout.
        return pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                         for c in selected.columns], names=names)

    if hasattr(table, "windows"):  # trainers.data.columns.ParquetColumns: streamed, a window at a time
        stored = table.schema()
        fields = [stored.field(n) for n in names]
        fields = [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in fields]
        windows = (plain(w.select(names)) for w in table.windows(WINDOW))
    else:
        selected = plain(table.select(names))
        fields = list(selected.schema)
        windows = (selected.slice(start, WINDOW) for start in range(0, selected.num_rows, WINDOW))
    # A canonical schema: no metadata, every field nullable, so only names, types and
    # values count.
    schema = pa.schema([pa.field(f.name, f.type) for f in fields])
    digest = hmac.new(key, digestmod=hashlib.sha256)
    sink = pa.PythonFile(_HashSink(digest), mode="w")
    with pa.ipc.new_stream(sink, schema) as writer:
        for window in windows:
            # concat_arrays rebuilds each column with offset 0 and trimmed buffers: a slice
            # would otherwise serialise its parent's bytes, so equal values could differ.
            batch = pa.record_batch([_canonical(pa.concat_arrays(c.chunks)) if c.num_chunks else pa.array([], c.type)
                                     for c in window.columns], schema=schema)
            writer.write_batch(batch)
    return {"rows": int(table.num_rows), "hmac_sha256": digest.hexdigest(), "key_id": key_id(key), "columns": names}
