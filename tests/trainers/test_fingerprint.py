"""trainers.data.fingerprint: stable under layout, sensitive to every value."""

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from budgetplan.errors import InvalidParameterError  # noqa: E402
from trainers.data.fingerprint import fingerprint  # noqa: E402

COLUMNS = ["y", "uid", "pub", "cost"]


@pytest.fixture
def t():
    return pa.table({"y": pa.array([0, 1, 0, 1], pa.int8()), "uid": pa.array([1, 2, 1, 3], pa.int64()),
                     "pub": ["a", "bb", None, "ccc"], "cost": [0.5, None, 2.0, 3.0], "unused": [1, 2, 3, 4]})


def test_same_content_same_digest(t, tmp_path):
    fp = fingerprint(t, COLUMNS)
    assert fp["rows"] == 4 and len(fp["sha256"]) == 64 and fp["columns"] == COLUMNS
    assert fingerprint(t, COLUMNS) == fp
    rechunked = pa.concat_tables([t.slice(0, 1), t.slice(1, 2), t.slice(3)])
    assert rechunked.column("pub").num_chunks == 3
    assert fingerprint(rechunked, COLUMNS) == fp
    dictionary = t.set_column(2, "pub", t.column("pub").dictionary_encode())
    assert fingerprint(dictionary, COLUMNS) == fp
    assert fingerprint(t.drop_columns(["unused"]), COLUMNS) == fp
    path = tmp_path / "t.parquet"
    pq.write_table(t, path)
    assert fingerprint(pq.read_table(path), COLUMNS) == fp
    assert fingerprint(t, COLUMNS + ["y"]) == fp  # repeats dropped


def test_any_change_changes_the_digest(t):
    fp = fingerprint(t, COLUMNS)["sha256"]
    changed = [
        t.set_column(0, "y", pa.array([0, 1, 0, 0], pa.int8())),
        t.set_column(2, "pub", pa.array(["a", "bb", "", "ccc"])),  # null -> empty string
        t.set_column(3, "cost", pa.array([0.5, None, 2.0, 3.0000001])),
        t.set_column(1, "uid", pa.array([1, 2, 1, 3], pa.int32())),  # type
        t.slice(0, 3),
        t.take(pa.array([1, 0, 2, 3])),
    ]
    for other in changed:
        assert fingerprint(other, COLUMNS)["sha256"] != fp
    assert fingerprint(t, ["uid", "y", "pub", "cost"])["sha256"] != fp
    assert fingerprint(t, COLUMNS + ["unused"])["sha256"] != fp


def test_missing_column_is_named(t):
    with pytest.raises(InvalidParameterError, match="fingerprint: column 'nope' is not in the table"):
        fingerprint(t, ["y", "nope"])


def test_windows_do_not_follow_chunk_boundaries(t, monkeypatch):
    import trainers.data.fingerprint as module

    monkeypatch.setattr(module, "WINDOW", 3)
    big = pa.concat_tables([t] * 5)  # 20 rows, 5 chunks of 4; windows of 3 straddle them
    assert fingerprint(big, COLUMNS) == fingerprint(big.combine_chunks(), COLUMNS)
    changed = big.set_column(3, "cost", pa.array([0.5, None, 2.0, 3.0] * 4 + [0.5, None, 2.0, 4.0]))
    assert fingerprint(changed, COLUMNS) != fingerprint(big, COLUMNS)
