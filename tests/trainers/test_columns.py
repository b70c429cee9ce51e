"""Parquet read a column at a time gives exactly what the whole table gives: encoding, fingerprint, capping."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from budgetplan.errors import InvalidParameterError
from trainers.data import fingerprint as fp
from trainers.data.columns import ParquetColumns, parquet_source
from trainers.data.encode import encode
from trainers.data.loaders import read_table
from trainers.data.synth import SYNTH_FEATURES, synthesize

KEY = b"k" * 32


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("columns")
    table = synthesize(7000, 1500, 3)
    # uneven shards, several row groups each: windows must cross both
    for i, (start, length) in enumerate([(0, 2500), (2500, 1700), (4200, 2800)]):
        pq.write_table(table.slice(start, length), root / f"part-{i}.parquet", row_group_size=600)
    return root


def _same(a, b):
    for name in ("ns_cat", "ns_num", "s_cat", "s_num", "label", "unit"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and bool((x == y).all()), name


@pytest.mark.parametrize("encoding", ["hash", "vocab"])
def test_encoding_a_column_at_a_time_is_the_whole_table_encoding(shards, encoding):
    cols = list(SYNTH_FEATURES.columns)
    whole, info_whole = encode(read_table(shards, columns=cols), SYNTH_FEATURES, nonsensitive_encoding=encoding,
                               vocab_threshold=3)
    lean, info_lean = encode(ParquetColumns(sorted(shards.glob("*.parquet")), cols), SYNTH_FEATURES,
                             nonsensitive_encoding=encoding, vocab_threshold=3)
    _same(whole, lean)
    assert info_whole == info_lean


def test_take_is_the_table_take(shards):
    cols = list(SYNTH_FEATURES.columns)
    rows = np.sort(np.random.default_rng(0).choice(7000, 3000, replace=False))
    whole, _ = encode(read_table(shards, columns=cols).take(rows), SYNTH_FEATURES)
    lean_view = parquet_source(shards, "auto", cols).take(rows)
    lean, _ = encode(lean_view, SYNTH_FEATURES)
    _same(whole, lean)
    again = lean_view.take(np.arange(0, 3000, 7))  # a take of a take
    assert again.column("label").to_pylist() == read_table(shards, columns=cols).take(rows[::7]).column(
        "label").to_pylist()


def test_the_streamed_fingerprint_is_the_table_fingerprint(shards, monkeypatch):
    cols = list(SYNTH_FEATURES.columns)
    table = read_table(shards, columns=cols)
    lean = parquet_source(shards, "auto", cols)
    assert fp.fingerprint(lean, cols, KEY) == fp.fingerprint(table, cols, KEY)
    monkeypatch.setattr(fp, "WINDOW", 997)  # windows that cross shards and row groups
    assert fp.fingerprint(lean, cols, KEY) == fp.fingerprint(table, cols, KEY)
    assert fp.fingerprint(lean, cols[::-1], KEY) == fp.fingerprint(table, cols[::-1], KEY)
    assert fp.fingerprint(lean, cols, KEY) != fp.fingerprint(table.slice(1), cols, KEY)


def test_an_empty_file_digests_like_its_table(tmp_path):
    table = synthesize(50, 10, 1).slice(0, 0)
    pq.write_table(table, tmp_path / "empty.parquet")
    cols = list(SYNTH_FEATURES.columns)
    lean = parquet_source(tmp_path / "empty.parquet", "auto", cols)
    assert lean.num_rows == 0
    assert fp.fingerprint(lean, cols, KEY) == fp.fingerprint(read_table(tmp_path / "empty.parquet", columns=cols),
                                                             cols, KEY)


def test_other_formats_are_read_whole(tmp_path, shards):
    assert parquet_source(tmp_path / "missing.parquet", "auto", ["label"]) is None
    import pyarrow.csv as pacsv

    pacsv.write_csv(pa.table({"label": [0, 1]}), tmp_path / "d.csv")
    assert parquet_source(tmp_path / "d.csv", "auto", ["label"]) is None
    assert parquet_source(shards, "csv", ["label"]) is None


def test_a_missing_column_or_shards_that_disagree_are_refused(tmp_path):
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int64())}), tmp_path / "part-0.parquet")
    pq.write_table(pa.table({"a": pa.array(["x"], pa.string())}), tmp_path / "part-1.parquet")
    with pytest.raises(InvalidParameterError, match="'b' is not in the data"):
        parquet_source(tmp_path, "auto", ["a", "b"])
    with pytest.raises(InvalidParameterError, match="different types in the shards"):
        parquet_source(tmp_path, "auto", ["a"]).column("a")


def _with_garbage_under_nulls(values, valid, garbage):
    data = np.where(valid, values, garbage).astype(np.float32)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.float32(), len(values), [bitmap, pa.py_buffer(data.tobytes())],
                                 null_count=int((~valid).sum()))


def test_what_a_null_hides_does_not_reach_the_digest():
    values = np.arange(10, dtype=np.float32)
    valid = np.array([True, False] * 5)
    a = _with_garbage_under_nulls(values, valid, 0.0)
    b = _with_garbage_under_nulls(values, valid, 123.5)
    assert a.equals(b)  # equal data, different bytes under the nulls
    digest = [fp.fingerprint(pa.table({"x": arr}), ["x"], KEY)["hmac_sha256"] for arr in (a, b)]
    assert digest[0] == digest[1]
    shifted = _with_garbage_under_nulls(values + 1, valid, 0.0)  # a visible value changed: another digest
    assert fp.fingerprint(pa.table({"x": shifted}), ["x"], KEY)["hmac_sha256"] != digest[0]
    no_nulls = pa.array(np.where(valid, values, 0.0).astype(np.float32))  # 0 is not a null
    assert fp.fingerprint(pa.table({"x": no_nulls}), ["x"], KEY)["hmac_sha256"] != digest[0]


def test_strings_with_nulls_digest_alike_streamed_and_whole(tmp_path, monkeypatch):
    table = pa.table({"s": pa.array(["a", None, "ccc", None, "e"] * 400), "v": pa.array([1.0, None] * 1000)})
    pq.write_table(table.slice(0, 1300), tmp_path / "part-0.parquet", row_group_size=250)
    pq.write_table(table.slice(1300), tmp_path / "part-1.parquet", row_group_size=250)
    monkeypatch.setattr(fp, "WINDOW", 333)
    lean = parquet_source(tmp_path, "auto", ["s", "v"])
    assert fp.fingerprint(lean, ["s", "v"], KEY) == fp.fingerprint(table, ["s", "v"], KEY)


def test_a_run_on_shards_audits_its_fingerprint_from_the_directory(shards, tmp_path, runner):
    from budgetplan.cli import cli
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.demo import demo_scenario
    from trainers.run import RunOptions, TrainSettings, execute_plan

    plan = build_plan(parse_scenario(demo_scenario(epsilon=2.0, dataset_size=7000, spec=SYNTH_FEATURES, epochs=1)))
    (tmp_path / "plan.json").write_text(plan.to_json())
    execute_plan(plan, shards, RunOptions(out_dir=tmp_path / "run",
                                          settings=TrainSettings(embedding_dim=4, tower_hidden=8,
                                                                                  common_hidden=(8,))))
    result = runner.invoke(cli, ["audit", str(tmp_path / "run"), "--data", str(shards)])
    assert result.exit_code == 0, result.output
    assert "7000 rows" in result.output and "match the keyed fingerprint" in result.output
