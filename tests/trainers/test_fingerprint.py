"""trainers.data.fingerprint: keyed, stable under layout, sensitive to every value."""

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from budgetplan.errors import InvalidParameterError  # noqa: E402
from trainers.data.fingerprint import fingerprint, key_id, new_key, read_key, write_key  # noqa: E402

COLUMNS = ["y", "uid", "pub", "cost"]
KEY = b"k" * 32


@pytest.fixture
def t():
    return pa.table({"y": pa.array([0, 1, 0, 1], pa.int8()), "uid": pa.array([1, 2, 1, 3], pa.int64()),
                     "pub": ["a", "bb", None, "ccc"], "cost": [0.5, None, 2.0, 3.0], "unused": [1, 2, 3, 4]})


def test_same_content_same_digest(t, tmp_path):
    fp = fingerprint(t, COLUMNS, KEY)
    assert fp["rows"] == 4 and len(fp["hmac_sha256"]) == 64 and fp["columns"] == COLUMNS
    assert fingerprint(t, COLUMNS, KEY) == fp
    rechunked = pa.concat_tables([t.slice(0, 1), t.slice(1, 2), t.slice(3)])
    assert rechunked.column("pub").num_chunks == 3
    assert fingerprint(rechunked, COLUMNS, KEY) == fp
    dictionary = t.set_column(2, "pub", t.column("pub").dictionary_encode())
    assert fingerprint(dictionary, COLUMNS, KEY) == fp
    assert fingerprint(t.drop_columns(["unused"]), COLUMNS, KEY) == fp
    path = tmp_path / "t.parquet"
    pq.write_table(t, path)
    assert fingerprint(pq.read_table(path), COLUMNS, KEY) == fp
    assert fingerprint(t, COLUMNS + ["y"], KEY) == fp  # repeats dropped


def test_any_change_changes_the_digest(t):
    fp = fingerprint(t, COLUMNS, KEY)["hmac_sha256"]
    changed = [
        t.set_column(0, "y", pa.array([0, 1, 0, 0], pa.int8())),
        t.set_column(2, "pub", pa.array(["a", "bb", "", "ccc"])),  # null -> empty string
        t.set_column(3, "cost", pa.array([0.5, None, 2.0, 3.0000001])),
        t.set_column(1, "uid", pa.array([1, 2, 1, 3], pa.int32())),  # type
        t.slice(0, 3),
        t.take(pa.array([1, 0, 2, 3])),
    ]
    for other in changed:
        assert fingerprint(other, COLUMNS, KEY)["hmac_sha256"] != fp
    assert fingerprint(t, ["uid", "y", "pub", "cost"], KEY)["hmac_sha256"] != fp
    assert fingerprint(t, COLUMNS + ["unused"], KEY)["hmac_sha256"] != fp


def test_missing_column_is_named(t):
    with pytest.raises(InvalidParameterError, match="fingerprint: column 'nope' is not in the table"):
        fingerprint(t, ["y", "nope"], KEY)


def test_windows_do_not_follow_chunk_boundaries(t, monkeypatch):
    import trainers.data.fingerprint as module

    monkeypatch.setattr(module, "WINDOW", 3)
    big = pa.concat_tables([t] * 5)  # 20 rows, 5 chunks of 4; windows of 3 straddle them
    assert fingerprint(big, COLUMNS, KEY) == fingerprint(big.combine_chunks(), COLUMNS, KEY)
    changed = big.set_column(3, "cost", pa.array([0.5, None, 2.0, 3.0] * 4 + [0.5, None, 2.0, 4.0]))
    assert fingerprint(changed, COLUMNS, KEY) != fingerprint(big, COLUMNS, KEY)


def test_the_digest_is_keyed_so_a_missing_label_cannot_be_recovered_by_hashing(t):
    """Who knows every row but one and the digest can try both labels; without the key no try matches."""
    secret = new_key()
    published = fingerprint(t, COLUMNS, secret)
    labels = t.column("y").to_pylist()
    guesses = []
    for label in (0, 1):
        candidate = t.set_column(0, "y", pa.array(labels[:-1] + [label], pa.int8()))
        guesses.append(fingerprint(candidate, COLUMNS, KEY)["hmac_sha256"])  # the attacker's own key
    assert published["hmac_sha256"] not in guesses
    assert fingerprint(t, COLUMNS, secret) == published  # the key holder recomputes it
    assert published["key_id"] == key_id(secret) != key_id(KEY) and secret.hex() not in str(published)


def test_keys_are_long_enough_and_kept_private(tmp_path):
    with pytest.raises(InvalidParameterError, match="at least 16 bytes"):
        fingerprint(pa.table({"y": [0]}), ["y"], b"short")
    (tmp_path / "short.key").write_bytes(b"abc")
    with pytest.raises(InvalidParameterError, match="has 3 bytes"):
        read_key(tmp_path / "short.key")
    key = new_key()
    write_key(tmp_path / "k.key", key)
    assert read_key(tmp_path / "k.key") == key and len(key) == 32
    assert (tmp_path / "k.key").stat().st_mode & 0o077 == 0
