"""Encode a table under a ``FeatureSpec`` into model-ready tensors (``EncodedData``).

Categorical features of one group (non-sensitive, sensitive) share one embedding table, as in
the Hybrid paper (Chua et al., arXiv:2401.15246, appendix A): every value is prefixed with its
column name, so ``"US"`` in ``country`` and ``"US"`` in ``ship_to`` are different rows. A value
is then either

- hashed into ``hash_bins`` rows with blake2b of ``column=value`` (stable across machines,
  processes and Python versions; never Python's salted ``hash()``), or
- for non-sensitive features only, looked up in a vocabulary of the values seen at least
  ``vocab_threshold`` times, with one out-of-vocabulary row per column.

Sensitive features are always hashed: a vocabulary would be built from their counts, which
are private (the paper computes them with a DP mechanism and a share of the budget; this
module has no budget to spend). Defaults follow the paper: 100k (non-sensitive) and 50k
(sensitive) hash bins as on Criteo Sponsored Search, vocabulary threshold 16 as on Criteo
Display.

A value is hashed by its Arrow string form (``5`` and ``"5"`` hash alike) and each distinct
value is hashed once: the column is dictionary-encoded, the dictionary hashed, and the row
indices mapped through it. A missing value is a category of its own.

Numeric features become ``sign(x) * log1p(|x|)``, missing (null) values 0; a NaN or an
infinity is not a missing value but a broken one, and is refused with the column and the
count of such values. No statistic of the data is used, so nothing about a sensitive column
leaks into the encoding or the record.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate
from trainers.data.capping import unit_ids
from trainers.data.encoded import EncodedData

__all__ = ["encode", "build_vocabulary", "ENCODINGS", "HASH_BINS_NONSENSITIVE", "HASH_BINS_SENSITIVE",
           "VOCAB_THRESHOLD", "hash_value"]

ENCODINGS = ("hash", "vocab")
HASH_BINS_NONSENSITIVE = 100_000
HASH_BINS_SENSITIVE = 50_000
VOCAB_THRESHOLD = 16


def hash_value(column: str, value: str | None, bins: int) -> int:
    """The hash row of ``value`` in ``column``: blake2b-64 of ``column=value`` modulo ``bins``.

    A missing value (``None``) hashes as its own token, distinct from every string.
    """
    key = b"m:" + column.encode() if value is None else b"v:" + column.encode() + b"=" + value.encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % bins


def _column(table, name: str, role: str):
    if name not in table.column_names:
        raise InvalidParameterError(f"{role} column {name!r} is not in the table")
    return table.column(name)


def _dictionary(column, name: str):
    """(distinct values as an Arrow array, int64 row indices with -1 for missing)."""
    if pa.types.is_dictionary(column.type):
        column = column.unify_dictionaries()
        dictionary = column.chunks[0].dictionary if column.num_chunks else pa.array([], column.type.value_type)
        if pc.count_distinct(dictionary).as_py() != len(dictionary):  # duplicates would split a value
            column = column.cast(column.type.value_type)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
        first = column.chunks[0].dictionary if column.num_chunks else None
        # Arrow encodes all chunks against one dictionary; unify only if that ever changes.
        if any(not c.dictionary.equals(first) for c in column.chunks[1:]):
            column = column.unify_dictionaries()
    if column.num_chunks == 0:
        return pa.array([], pa.string()), np.zeros(0, dtype=np.int64)
    parts = [c.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
             for c in column.chunks]
    return column.chunks[0].dictionary, (np.concatenate(parts) if len(parts) != 1 else parts[0])


def _strings(dictionary, name: str) -> list[str]:
    """The distinct values' Arrow string forms, the text that is hashed or sorted."""
    try:
        return dictionary.cast(pa.string()).to_pylist()
    except pa.ArrowException as exc:
        raise InvalidParameterError(f"categorical column {name!r} of type {dictionary.type} "
                                    f"has no string form: {' '.join(str(exc).split())[:200]}") from None


def _hashed(table, names, bins: int):
    """Hash ids [N, len(names)] into one shared table of ``bins`` rows."""
    out = np.empty((table.num_rows, len(names)), dtype=np.int64)
    columns = {}
    for j, name in enumerate(names):
        dictionary, index = _dictionary(_column(table, name, "categorical"), name)
        values = _strings(dictionary, name)
        # The last entry serves index -1: the missing-value token.
        lookup = np.fromiter((hash_value(name, v, bins) for v in values + [None]),
                             dtype=np.int64, count=len(values) + 1)
        out[:, j] = lookup[index]
        columns[name] = {"encoding": "hash"}
    return out, columns


def _vocabulary(table, names, threshold: int, given: dict | None = None, *, rows: bool = True):
    """Vocabulary ids [N, len(names)]: per column an OOV row, then its frequent values.

    With ``given`` (a vocabulary returned by an earlier call, e.g. on the training data) the
    same ids are applied and nothing is counted: held-out data must encode as training did.
    Returns (ids, per-column info, table size, the vocabulary); with ``rows=False`` only the
    vocabulary is built (ids None, no per-row array).
    """
    out = np.empty((table.num_rows, len(names)), dtype=np.int64) if rows else None
    columns, offset, vocab = {}, 0, {}
    for j, name in enumerate(names):
        dictionary, index = _dictionary(_column(table, name, "categorical"), name)
        tokens = [None] + _strings(dictionary, name)
        if given is None:
            counts = np.bincount(index + 1, minlength=len(tokens))  # slot 0: missing
            kept = [k for k in range(len(tokens)) if counts[k] >= threshold]
            # Ids ordered by value, not by first appearance, so shuffled data encodes alike.
            kept.sort(key=lambda k: (tokens[k] is not None, tokens[k] or ""))
            mapping = {tokens[k]: offset + 1 + i for i, k in enumerate(kept)}
            vocab[name] = {"oov": offset, "values": [[tokens[k], mapping[tokens[k]]] for k in kept]}
            distinct = int(np.count_nonzero(counts))
        else:
            if name not in given:
                raise InvalidParameterError(f"the given vocabulary has no column {name!r}")
            offset = given[name]["oov"]
            mapping = {v: i for v, i in given[name]["values"]}
            vocab[name] = given[name]
            distinct = None
        oov_rows = None
        if out is not None:
            lookup = np.array([mapping.get(t, offset) for t in tokens], dtype=np.int64)
            ids = lookup[index + 1]
            out[:, j] = ids
            oov_rows = int(np.count_nonzero(ids == offset))
        columns[name] = {"encoding": "vocab", "distinct": distinct, "kept": len(mapping), "oov_id": offset,
                         "oov_rows": oov_rows}
        offset = max(offset + 1 + len(mapping), max(mapping.values(), default=offset) + 1)
    size = max([offset] + [v["oov"] + 1 + len(v["values"]) for v in vocab.values()] + [1])
    return out, columns, size, vocab


def build_vocabulary(table, spec, threshold: int = VOCAB_THRESHOLD) -> dict:
    """The vocabulary ``encode(..., nonsensitive_encoding="vocab")`` builds from ``table``, without
    encoding a row: what every rank of a run over several processes encodes its block with."""
    return _vocabulary(table, list(spec.nonsensitive_categorical), validate.positive_int("vocab_threshold", threshold),
                       rows=False)[3]


def _numeric(table, names, role: str):
    """float32 [N, len(names)] of sign(x) * log1p(|x|), null as 0; NaN and infinities refused."""
    out = np.zeros((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        column = _column(table, name, f"{role} numeric")
        try:
            x = column.cast(pa.float64()).fill_null(0.0).to_numpy()
        except pa.ArrowException as exc:
            raise InvalidParameterError(f"numeric column {name!r} of type {column.type} is not numeric: "
                                        f"{' '.join(str(exc).split())[:200]}") from None
        bad = ~np.isfinite(x)
        if bad.any():
            raise InvalidParameterError(
                f"{role} numeric column {name!r} has {int(bad.sum())} NaN or infinite values (first "
                f"{float(x[bad][0])!r} at row {int(np.flatnonzero(bad)[0])}): fix or drop those rows; a missing "
                "value is a null, which encodes as 0")
        out[:, j] = np.sign(x) * np.log1p(np.abs(x))
    return out


def _labels(table, name: str) -> np.ndarray:
    """float32 [N] labels, refusing anything but 0 and 1 (bool, integer or float)."""
    column = _column(table, name, "label")
    kind = column.type
    if not (pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise InvalidParameterError(f"label column {name!r} must be boolean, integer or float, got {kind}")
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise InvalidParameterError(f"label column {name!r} must hold only 0 or 1, got null at row {row}")
    y = column.cast(pa.float64()).to_numpy()
    bad = (y != 0.0) & (y != 1.0)  # NaN is bad too
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = column[row].as_py()
        raise InvalidParameterError(f"label column {name!r} must hold only 0 or 1, got {value!r} at row {row}")
    return y.astype(np.float32)


def _units(table, name: str):
    """Dense int64 unit ids 0..U-1 (in order of first appearance unless the column is
    dictionary-typed, then in dictionary order), and U."""
    column = _column(table, name, "unit id")
    unit_ids(table, name)  # refuses null and NaN ids, as capping does
    dictionary, index = _dictionary(column, name)
    counts = np.bincount(index, minlength=len(dictionary))
    if (counts == 0).any():  # a stored dictionary may hold values no row uses
        index = (np.cumsum(counts > 0) - 1)[index]
        return index, int(np.count_nonzero(counts))
    return index, len(dictionary)


def encode(table, spec, *, nonsensitive_encoding: str = "hash", sensitive_encoding: str = "hash",
           hash_bins_nonsensitive: int = HASH_BINS_NONSENSITIVE, hash_bins_sensitive: int = HASH_BINS_SENSITIVE,
           vocab_threshold: int = VOCAB_THRESHOLD, vocabulary: dict | None = None, device="cpu"):
    """Encode ``table`` as ``spec`` says into tensors on ``device``.

    Args:
        table: a ``pyarrow.Table`` holding every column of ``spec`` (others are ignored).
        spec: a ``budgetplan.scenario.model.FeatureSpec``.
        nonsensitive_encoding: ``"hash"`` or ``"vocab"`` for the non-sensitive categoricals.
        sensitive_encoding: must be ``"hash"``; present so that asking for a vocabulary over
            private counts fails loudly instead of being ignored.
        hash_bins_nonsensitive, hash_bins_sensitive: sizes of the hashed tables.
        vocab_threshold: a non-sensitive value seen fewer times goes to its column's OOV row.
        vocabulary: the ``info["vocabulary"]`` of an earlier call, to encode held-out data with
            the training data's ids (only with ``nonsensitive_encoding="vocab"``).
        device: where the tensors go.

    Returns:
        ``(EncodedData, info)``; ``info`` describes the encoding for the run record: rows,
        units, table sizes and per-column encodings; for vocabularies, how many rows fell out
        of vocabulary. It holds no statistic of a sensitive column or of the label.

    Raises:
        InvalidParameterError: a missing column, a non-binary label, a non-numeric numeric
            column, a vocabulary asked for sensitive features, or a bad size.
    """
    import torch  # torch: trainers.data imports no torch (trainers/__init__.py)

    if nonsensitive_encoding not in ENCODINGS:
        raise InvalidParameterError(f"nonsensitive_encoding must be one of {', '.join(ENCODINGS)}, "
                                    f"got {nonsensitive_encoding!r}")
    if sensitive_encoding != "hash":
        raise InvalidParameterError(f"sensitive_encoding must be 'hash', got {sensitive_encoding!r}: a vocabulary "
                                    "of sensitive values is built from their counts, which are private")
    bins_ns = validate.positive_int("hash_bins_nonsensitive", hash_bins_nonsensitive)
    bins_s = validate.positive_int("hash_bins_sensitive", hash_bins_sensitive)
    threshold = validate.positive_int("vocab_threshold", vocab_threshold)

    y = _labels(table, spec.label)
    units, n_units = _units(table, spec.unit_id) if spec.unit_id else (None, None)
    ns_names, s_names = list(spec.nonsensitive_categorical), list(spec.sensitive_categorical)
    if nonsensitive_encoding == "hash":
        ns_cat, ns_columns = _hashed(table, ns_names, bins_ns)
        ns_vocab = bins_ns
    else:
        ns_cat, ns_columns, ns_vocab, built = _vocabulary(table, ns_names, threshold, vocabulary)
    s_cat, s_columns = _hashed(table, s_names, bins_s)
    ns_num = _numeric(table, spec.nonsensitive_numeric, "non-sensitive")
    s_num = _numeric(table, spec.sensitive_numeric, "sensitive")

    def tensor(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)

    data = EncodedData(
        ns_cat=tensor(ns_cat), ns_num=tensor(ns_num), s_cat=tensor(s_cat), s_num=tensor(s_num),
        label=tensor(y), unit=tensor(units), ns_vocab=int(ns_vocab) if ns_names else 1,
        s_vocab=bins_s if s_names else 1,
        names={"ns_cat": ns_names, "ns_num": list(spec.nonsensitive_numeric), "s_cat": s_names,
               "s_num": list(spec.sensitive_numeric)})
    info = {
        "rows": int(table.num_rows),
        "units": n_units,
        "nonsensitive": {"encoding": nonsensitive_encoding, "table_size": data.ns_vocab,
                         "vocab_threshold": threshold if nonsensitive_encoding == "vocab" else None,
                         "oov_rows": sum(c.get("oov_rows", 0) for c in ns_columns.values()),
                         "columns": ns_columns},
        "sensitive": {"encoding": "hash", "table_size": data.s_vocab, "columns": s_columns},
        "numeric": {"transform": "sign(x)*log1p(|x|)", "missing": 0.0,
                    "nonsensitive": list(spec.nonsensitive_numeric), "sensitive": list(spec.sensitive_numeric)},
        "hash": "blake2b-64 of 'column=value' mod table size",
    }
    if nonsensitive_encoding == "vocab":
        info["vocabulary"] = built  # non-sensitive values only; needed to encode held-out data alike
    return data, info
