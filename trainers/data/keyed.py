"""Keyed pseudo-random priorities for capping and splitting: HMAC-SHA256 of a row's identity.

The ``keyed`` capping rule keeps, in each privacy unit, the K rows of smallest priority,
ties broken by position; ``data split`` holds out a unit when its score falls below the
held-out fraction. Both are functions of public identities and a secret key only:

- a row's priority is ``HMAC-SHA256(key, CAP_DOMAIN || shard || row || unit)``, ``shard``
  the index of its input file in sorted shard order and ``row`` its index within that file
  (each 8 bytes, big-endian), ``unit`` the UTF-8 bytes of the unit id's text (an integer id
  in decimal, as both Python's ``str`` and Spark's ``CAST(... AS STRING)`` write it);
- a unit's split score is ``HMAC-SHA256(key, SPLIT_DOMAIN || unit)``.

The first 8 bytes of the digest, read big-endian, are the 64-bit value compared; Spark
compares the first 16 hex digits of ``sha2``, which orders the same way. The fixed-width
position comes before the variable-length unit, so no two identities share a message; the
domains keep a capping priority from ever equalling a split score.

Why unpredictable: HMAC with a secret key of at least 128 bits is a pseudo-random function
as long as SHA-256's compression function is (Bellare, "New Proofs for NMAC and HMAC",
CRYPTO 2006). An adversary who knows every row of the data, labels and features included,
but not the key, can therefore tell the kept rows from a uniformly random choice of K rows
per unit with no better than negligible advantage; and since no label or feature value
enters the message, which rows are kept cannot depend on them at all.

Why HMAC-SHA256 and not a faster keyed hash: Spark has ``sha2`` built in and none of
blake2b, SipHash or HMAC, and HMAC is two nested hashes that its built-ins compute exactly
(:func:`hmac_pads` gives the two padded keys), so the Spark engine runs in the JVM with no
Python worker and agrees bit for bit with this module. xxhash64 or murmur3 with the key
mixed in are not pseudo-random functions: their outputs can be predicted from a few others.
"""

from __future__ import annotations

import hashlib
from fractions import Fraction

import numpy as np
import pyarrow as pa

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["CAP_DOMAIN", "SPLIT_DOMAIN", "hmac_pads", "cap_priorities", "split_scores", "held_out_threshold",
           "unit_text", "check_unit_type"]

CAP_DOMAIN = b"budgetplan keyed cap v1\0"
SPLIT_DOMAIN = b"budgetplan keyed split v1\0"
_BLOCK = 64  # SHA-256's block size: HMAC pads the key to it (RFC 2104)


def hmac_pads(key: bytes) -> tuple[bytes, bytes]:
    """(key XOR ipad, key XOR opad), each 64 bytes: HMAC-SHA256(k, m) = H(opad || H(ipad || m)) (RFC 2104)."""
    if not isinstance(key, bytes) or len(key) < 16:
        raise InvalidParameterError("the key must be at least 16 bytes")
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


def _prfs(key: bytes, messages) -> np.ndarray:
    """The first 8 bytes of HMAC-SHA256(key, m), big-endian, as uint64, for each message.

    The two padded keys are hashed once and their states copied per message, which is
    three times faster than ``hmac.digest`` per message and gives the same digest.
    """
    ipad, opad = hmac_pads(key)
    inner0, outer0 = hashlib.sha256(ipad), hashlib.sha256(opad)
    out = []
    for m in messages:
        inner = inner0.copy()
        inner.update(m)
        outer = outer0.copy()
        outer.update(inner.digest())
        out.append(outer.digest()[:8])
    return np.frombuffer(b"".join(out), dtype=">u8").astype(np.uint64)


def unit_text(values) -> list[bytes]:
    """The UTF-8 bytes of each unit id's text: decimal for integers, the string itself for strings.

    Bytes pass through unchanged (Arrow's ``cast(..., binary)`` of the text, say).
    """
    return [v if isinstance(v, bytes) else (v if isinstance(v, str) else str(int(v))).encode("utf-8")
            for v in values]


def check_unit_type(name: str, arrow_type) -> None:
    """Refuse a unit id column whose text two engines could write differently (floats, dates, ...)."""
    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    integer = pa.types.is_integer(t) and not pa.types.is_uint64(t)  # Spark has no unsigned 64-bit type
    if integer or pa.types.is_string(t) or pa.types.is_large_string(t):
        return
    raise InvalidParameterError(f"unit id column {name!r} has type {t}; keyed capping and splitting need integer "
                                "(at most int64) or string ids: cast the column first")


def cap_priorities(key: bytes, units, shards, rows) -> np.ndarray:
    """The keyed capping priority (uint64) of each row.

    Args:
        key: the secret key (at least 16 bytes).
        units: each row's unit id (ints or strings; see :func:`unit_text`).
        shards: each row's input shard index (sorted shard order), non-negative ints.
        rows: each row's index within its shard, non-negative ints.
    """
    shards = np.asarray(shards, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.int64)
    if shards.shape != rows.shape or shards.ndim != 1 or len(units) != shards.size:
        raise InvalidParameterError("cap_priorities: units, shards and rows must be 1-D and of one length")
    if shards.size and (shards.min() < 0 or rows.min() < 0):
        raise InvalidParameterError("cap_priorities: positions must be non-negative")
    positions = np.empty((shards.size, 2), dtype=">u8")
    positions[:, 0], positions[:, 1] = shards, rows
    flat = positions.tobytes()
    return _prfs(key, (CAP_DOMAIN + flat[16 * i:16 * i + 16] + u for i, u in enumerate(unit_text(units))))


def split_scores(key: bytes, units) -> np.ndarray:
    """The keyed split score (uint64) of each unit id."""
    return _prfs(key, (SPLIT_DOMAIN + u for u in unit_text(units)))


def held_out_threshold(fraction: float) -> int:
    """floor(fraction * 2^64), exactly: a unit is held out when its score is below it."""
    fraction = validate.open_unit("held-out fraction", fraction)
    return int(Fraction(fraction) * (1 << 64))
