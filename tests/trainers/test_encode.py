"""trainers.data.encode: shared tables, hashing, vocabularies, numeric transform, labels, units."""

import math

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
torch = pytest.importorskip("torch")

from budgetplan.errors import InvalidParameterError  # noqa: E402
from budgetplan.scenario.model import FeatureSpec  # noqa: E402
from trainers.data.encode import encode, hash_value  # noqa: E402

SPEC = FeatureSpec(label="y", unit_id="uid", nonsensitive_categorical=("a", "b"), nonsensitive_numeric=("n",),
                   sensitive_categorical=("s",), sensitive_numeric=("m",))


def table(**over):
    cols = {"y": pa.array([0, 1, 1, 0, 1, 0], pa.int8()),
            "uid": pa.array([10, 7, 10, 3, 7, 10], pa.int64()),
            "a": ["x", "x", "y", None, "x", "z"],
            "b": ["x", "w", "w", "w", None, "x"],
            "n": [-3.0, 0.0, 2.5, None, None, 1e6],
            "s": ["p", "q", "p", "p", None, "r"],
            "m": pa.array([0, 1, 5, None, 2, 100], pa.int64())}
    cols.update(over)
    return pa.table(cols)


def test_shapes_dtypes_and_hash_ranges():
    data, info = encode(table(), SPEC, hash_bins_nonsensitive=1000, hash_bins_sensitive=300)
    assert len(data) == 6
    assert data.ns_cat.shape == (6, 2) and data.ns_cat.dtype == torch.int64
    assert data.s_cat.shape == (6, 1) and data.s_cat.dtype == torch.int64
    assert data.ns_num.shape == (6, 1) and data.ns_num.dtype == torch.float32
    assert data.s_num.shape == (6, 1) and data.label.dtype == torch.float32
    assert data.ns_vocab == 1000 and data.s_vocab == 300
    assert 0 <= int(data.ns_cat.min()) and int(data.ns_cat.max()) < 1000
    assert 0 <= int(data.s_cat.min()) and int(data.s_cat.max()) < 300
    assert data.names == {"ns_cat": ["a", "b"], "ns_num": ["n"], "s_cat": ["s"], "s_num": ["m"]}
    assert info["rows"] == 6 and info["units"] == 3
    assert info["nonsensitive"]["table_size"] == 1000 and info["sensitive"]["table_size"] == 300


def test_hash_is_stable_and_column_prefixed():
    # Pinned values: blake2b-64("v:column=value") mod bins, the same on every platform.
    assert hash_value("publisher", "pub0001", 100_000) == 78913
    assert hash_value("campaign", "pub0001", 100_000) == 34362
    assert hash_value("publisher", None, 100_000) == 33529
    assert hash_value("x", "1", 2**62) == 3775296307013732631
    data, _ = encode(table(), SPEC, hash_bins_nonsensitive=2**40)
    ids = data.ns_cat.numpy()
    # "x" in column a and "x" in column b are different rows of the shared table.
    assert ids[0, 0] == hash_value("a", "x", 2**40) and ids[0, 1] == hash_value("b", "x", 2**40)
    assert ids[0, 0] != ids[0, 1]
    assert ids[0, 0] == ids[1, 0] == ids[4, 0]
    # Missing is a category of its own.
    assert ids[3, 0] == hash_value("a", None, 2**40) and ids[3, 0] not in set(ids[[0, 2, 5], 0])


def test_hash_uses_the_value_text_not_the_arrow_type_or_chunking():
    ints = table(a=pa.array([1, 1, 2, 3, 1, 2], pa.int64()))
    strs = table(a=["1", "1", "2", "3", "1", "2"])
    dicts = table(a=pa.array(["1", "1", "2", "3", "1", "2"]).dictionary_encode())
    first = encode(ints, SPEC)[0].ns_cat
    assert torch.equal(first, encode(strs, SPEC)[0].ns_cat)
    assert torch.equal(first, encode(dicts, SPEC)[0].ns_cat)
    t = strs
    chunked = pa.concat_tables([t.slice(0, 2), t.slice(2, 3), t.slice(5)])
    assert chunked.column("a").num_chunks == 3
    a, b = encode(t, SPEC)[0], encode(chunked, SPEC)[0]
    for name in ("ns_cat", "s_cat", "ns_num", "s_num", "label", "unit"):
        assert torch.equal(getattr(a, name), getattr(b, name))


def test_vocabulary_threshold_and_oov_ids():
    t = table(a=["x", "x", "y", None, "x", "z"], b=["k", "k", "k", "j", "j", "i"])
    data, info = encode(t, SPEC, nonsensitive_encoding="vocab", vocab_threshold=2)
    ids = data.ns_cat.numpy()
    cols = info["nonsensitive"]["columns"]
    # Column a: only "x" (3 times) is kept -> ids {OOV 0, x 1}; column b: "k" (3), "j" (2) kept.
    assert cols["a"] == {"encoding": "vocab", "distinct": 4, "kept": 1, "oov_id": 0, "oov_rows": 3}
    assert cols["b"]["kept"] == 2 and cols["b"]["oov_id"] == 2 and cols["b"]["oov_rows"] == 1
    assert list(ids[:, 0]) == [1, 1, 0, 0, 1, 0]
    assert ids[5, 1] == 2  # "i" (once) is column b's OOV id, not column a's
    assert ids[0, 1] != ids[3, 1] and {ids[0, 1], ids[3, 1]} == {3, 4}
    assert data.ns_vocab == 5 == info["nonsensitive"]["table_size"]
    assert info["nonsensitive"]["oov_rows"] == 4
    # Sensitive columns are still hashed, and their record carries no count.
    assert info["sensitive"]["encoding"] == "hash" and info["sensitive"]["columns"]["s"] == {"encoding": "hash"}


def test_vocabulary_ids_do_not_depend_on_row_order():
    t = table()
    rev = t.take(pa.array(list(reversed(range(t.num_rows)))))
    a = encode(t, SPEC, nonsensitive_encoding="vocab", vocab_threshold=1)[0].ns_cat.numpy()
    b = encode(rev, SPEC, nonsensitive_encoding="vocab", vocab_threshold=1)[0].ns_cat.numpy()
    assert (a[::-1] == b).all()


def test_sensitive_features_refuse_a_vocabulary():
    with pytest.raises(InvalidParameterError, match="sensitive_encoding must be 'hash'.*private"):
        encode(table(), SPEC, sensitive_encoding="vocab")
    with pytest.raises(InvalidParameterError, match="nonsensitive_encoding must be one of hash, vocab"):
        encode(table(), SPEC, nonsensitive_encoding="embedding")
    with pytest.raises(InvalidParameterError, match="hash_bins_sensitive"):
        encode(table(), SPEC, hash_bins_sensitive=0)


def test_numeric_transform_and_missing_values():
    data, _ = encode(table(), SPEC)
    expected = [-math.log1p(3.0), 0.0, math.log1p(2.5), 0.0, 0.0, math.log1p(1e6)]
    assert np.allclose(data.ns_num.numpy()[:, 0], expected, rtol=1e-6)
    assert np.allclose(data.s_num.numpy()[:, 0], [0, math.log1p(1), math.log1p(5), 0, math.log1p(2),
                                                  math.log1p(100)], rtol=1e-6)
    with pytest.raises(InvalidParameterError, match=r"column 'n' has 1 NaN or infinite values \(first inf at row 1"):
        encode(table(n=[1.0, float("inf"), 0, 0, 0, 0]), SPEC)
    # NaN is a broken value, not a missing one (that is a null): refused, counted, never silently 0
    with pytest.raises(InvalidParameterError, match=r"column 'm' has 2 NaN or infinite values \(first nan at row 2"):
        encode(table(m=[0.0, 1.0, float("nan"), None, float("nan"), 3.0]), SPEC)
    with pytest.raises(InvalidParameterError, match="numeric column 'm'.*not numeric"):
        encode(table(m=["a", "b", "c", "d", "e", "f"]), SPEC)


@pytest.mark.parametrize("labels", [
    pa.array([False, True, True, False, True, False]),
    pa.array([0, 1, 1, 0, 1, 0], pa.int64()),
    pa.array([0.0, 1.0, 1.0, 0.0, 1.0, 0.0]),
])
def test_binary_labels_of_any_numeric_type(labels):
    data, _ = encode(table(y=labels), SPEC)
    assert data.label.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("labels, shown", [
    ([0, 1, 2, 0, 1, 0], "2 at row 2"),
    ([0, -1, 1, 0, 1, 0], "-1 at row 1"),
    ([0.0, 1.0, 0.5, 0.0, 1.0, 0.0], "0.5 at row 2"),
    ([0.0, 1.0, 1.0, float("nan"), 1.0, 0.0], "nan at row 3"),
    ([0, 1, None, 0, 1, 0], "null at row 2"),
])
def test_bad_labels_name_the_column_and_the_first_bad_value(labels, shown):
    with pytest.raises(InvalidParameterError) as info:
        encode(table(y=labels), SPEC)
    message = str(info.value)
    assert "label column 'y' must hold only 0 or 1" in message and shown in message and "\n" not in message


def test_string_labels_are_refused():
    with pytest.raises(InvalidParameterError, match="label column 'y' must be boolean, integer or float, got string"):
        encode(table(y=["0", "1", "1", "0", "1", "0"]), SPEC)


def test_unit_ids_are_dense():
    data, info = encode(table(), SPEC)
    assert data.unit.tolist() == [0, 1, 0, 2, 1, 0] and data.unit.dtype == torch.int64
    # A stored dictionary may list values no row uses: ids stay dense.
    dict_units = pa.DictionaryArray.from_arrays(pa.array([3, 0, 3, 1, 0, 3], pa.int32()),
                                                pa.array(["u0", "u1", "u2", "u3"]))
    data, info = encode(table(uid=dict_units), SPEC)
    assert sorted(set(data.unit.tolist())) == [0, 1, 2] and info["units"] == 3
    u = data.unit.tolist()
    assert u[0] == u[2] == u[5] and u[1] == u[4] and len({u[0], u[1], u[3]}) == 3
    with pytest.raises(InvalidParameterError, match="unit id column 'uid' has 1 missing values"):
        encode(table(uid=pa.array([1, None, 1, 2, 3, 4], pa.int64())), SPEC)
    with pytest.raises(InvalidParameterError, match="unit id column 'uid' has 2 missing values"):
        encode(table(uid=pa.array([1.0, None, 1.0, float("nan"), 3.0, 4.0])), SPEC)
    no_unit = FeatureSpec(label="y", nonsensitive_categorical=("a",))
    data, info = encode(table(), no_unit)
    assert data.unit is None and info["units"] is None
    assert data.s_cat.shape == (6, 0) and data.s_vocab == 1 and data.ns_num.shape == (6, 0)


def test_missing_columns_are_named():
    with pytest.raises(InvalidParameterError, match="categorical column 's' is not in the table"):
        encode(table().drop_columns(["s"]), SPEC)
    with pytest.raises(InvalidParameterError, match="label column 'y' is not in the table"):
        encode(table().drop_columns(["y"]), SPEC)


def test_encoded_data_moves_and_takes():
    data, _ = encode(table(), SPEC)
    sub = data.take(torch.tensor([0, 2]))
    assert len(sub) == 2 and sub.unit.tolist() == [0, 0]
    assert data.to("cpu").ns_cat.device.type == "cpu"


def test_vocabulary_is_reused_on_held_out_data():
    import pyarrow as pa

    from budgetplan.scenario.model import FeatureSpec
    from trainers.data.encode import encode

    spec = FeatureSpec(label="y", nonsensitive_categorical=("c",))
    train = pa.table({"y": [0, 1] * 6, "c": ["a"] * 5 + ["b"] * 5 + ["rare", None]})
    held = pa.table({"y": [0, 1, 0, 1], "c": ["b", "a", "unseen", "rare"]})
    data, info = encode(train, spec, nonsensitive_encoding="vocab", vocab_threshold=2)
    vocab = info["vocabulary"]
    again, info2 = encode(held, spec, nonsensitive_encoding="vocab", vocab_threshold=2, vocabulary=vocab)
    ids = {v: int(data.ns_cat[i, 0]) for i, v in enumerate(train.column("c").to_pylist())}
    held_ids = again.ns_cat[:, 0].tolist()
    assert held_ids[0] == ids["b"] and held_ids[1] == ids["a"]
    assert held_ids[2] == held_ids[3] == vocab["c"]["oov"] == ids["rare"]  # unseen and rare share the OOV row
    assert again.ns_vocab == data.ns_vocab
