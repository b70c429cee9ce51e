"""trainers.data.loaders: every layout read back from small files written here."""

import gzip
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.csv as pacsv  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from budgetplan.errors import InvalidParameterError  # noqa: E402
from trainers.data.loaders import (  # noqa: E402
    CRITEO_ATTRIBUTION_COLUMNS,
    CRITEO_DISPLAY_COLUMNS,
    CRITEO_SEARCH_COLUMNS,
    read_table,
)


@pytest.fixture
def small():
    return pa.table({"uid": pa.array([3, 1, 3], pa.int64()), "y": pa.array([0, 1, 0], pa.int8()),
                     "pub": ["a", "b", None], "cost": [0.5, None, 2.0]})


def test_parquet_reads_requested_columns_in_order(tmp_path, small):
    path = tmp_path / "d.parquet"
    pq.write_table(small, path)
    t = read_table(path, columns=["cost", "uid", "cost"])
    assert t.column_names == ["cost", "uid"]
    assert t.column("uid").to_pylist() == [3, 1, 3]
    assert t.column("cost").to_pylist() == [0.5, None, 2.0]
    assert read_table(path).num_columns == 4


@pytest.mark.parametrize("name", ["d.csv", "d.csv.gz", "d.tsv", "d.tsv.gz"])
def test_delimited_text_round_trips(tmp_path, small, name):
    path = tmp_path / name
    delimiter = "\t" if ".tsv" in name else ","
    stream = pa.CompressedOutputStream(str(path), "gzip") if name.endswith(".gz") else str(path)
    pacsv.write_csv(small, stream, write_options=pacsv.WriteOptions(delimiter=delimiter))
    if not isinstance(stream, str):
        stream.close()
    t = read_table(path, columns=["uid", "pub", "cost", "y"])
    assert t.column_names == ["uid", "pub", "cost", "y"]
    assert t.column("uid").to_pylist() == [3, 1, 3]
    assert t.column("pub").to_pylist() == ["a", "b", None]  # an empty field is missing
    assert t.column("cost").to_pylist() == [0.5, None, 2.0]
    assert t.column("y").to_pylist() == [0, 1, 0]


def test_explicit_format_overrides_the_extension(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("a\tb\n1\tx\n2\ty\n")
    assert read_table(path, format="tsv", columns=["b"]).column("b").to_pylist() == ["x", "y"]


def _attribution_rows():
    header = list(CRITEO_ATTRIBUTION_COLUMNS) + ["extra"]
    rows = []
    for i in range(3):
        row = {c: str(i) for c in header}
        row.update(uid=str(100 + i % 2), campaign=str(7 + i), conversion=str(i % 2), cost="0.25",
                   cpo="-1", cat1=f"{5000 + i}", cat9="42")
        rows.append(row)
    return header, rows


def test_criteo_attribution_layout(tmp_path):
    header, rows = _attribution_rows()
    path = tmp_path / "criteo_attribution_dataset.tsv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\t".join(header) + "\n")
        for row in rows:
            fh.write("\t".join(row[c] for c in header) + "\n")
    t = read_table(path, format="criteo-attribution", columns=["conversion", "uid", "campaign", "cost", "cat1"])
    assert t.column_names == ["conversion", "uid", "campaign", "cost", "cat1"]
    assert t.column("uid").to_pylist() == [100, 101, 100]
    assert t.column("conversion").to_pylist() == [0, 1, 0]
    assert t.column("cost").to_pylist() == [0.25] * 3
    assert t.column("cat1").type == pa.string() and t.column("cat1").to_pylist() == ["5000", "5001", "5002"]
    # A plain tsv read of the same file sees the same header.
    assert read_table(path, columns=["uid"]).column("uid").to_pylist() == [100, 101, 100]


def test_criteo_attribution_refuses_a_foreign_header(tmp_path):
    path = tmp_path / "other.tsv"
    path.write_text("uid\tconversion\n1\t0\n")
    with pytest.raises(InvalidParameterError, match=r"other\.tsv.*criteo-attribution.*'timestamp'"):
        read_table(path, format="criteo-attribution")


def test_criteo_display_layout(tmp_path):
    assert len(CRITEO_DISPLAY_COLUMNS) == 40
    lines = [
        ["1", "5", "", "-3"] + ["0"] * 10 + ["68fd1e64", "", "a8cd5504"] + ["e5ba7672"] * 23,
        ["0", "", "7", "2"] + ["1"] * 10 + ["05db9164", "38a947a1", ""] + [""] * 23,
    ]
    path = tmp_path / "train.txt"
    path.write_text("".join("\t".join(line) + "\n" for line in lines))
    t = read_table(path, format="criteo-display")
    assert t.column_names == list(CRITEO_DISPLAY_COLUMNS)
    assert t.column("label").to_pylist() == [1, 0]
    assert t.column("I1").to_pylist() == [5, None]
    assert t.column("I3").to_pylist() == [-3, 2]  # -1 and other negatives are values here
    assert t.column("C1").to_pylist() == ["68fd1e64", "05db9164"]
    assert t.column("C2").to_pylist() == [None, "38a947a1"]
    assert t.column("C26").to_pylist() == ["e5ba7672", None]
    sub = read_table(path, format="criteo-display", columns=["C3", "label"])
    assert sub.column_names == ["C3", "label"] and sub.column("C3").to_pylist() == ["a8cd5504", None]


def test_criteo_search_layout(tmp_path):
    assert len(CRITEO_SEARCH_COLUMNS) == 23
    first = ["1", "14.5", "3600", "1598891820", "3", "12.99", "-1", "7E56C27BFF0305E788DA55A029EC4988",
             "-1", "-1", "B6A2C9F6D2E3F9DB1B2D9B4BD0C1AE8E"] + ["-1"] * 7 + \
        ["57A6DB3EC5E3EA4E8BF52F2BCA2F3E4B", "F1A7C2B3", "DE53E2E4", "C0F7E1A6", "U1"]
    second = ["0", "-1", "-1", "1598891900", "-1", "-1", "A", "B", "C", "D", "E"] + [f"c{i}" for i in range(7)] + \
        ["F", "G", "H", "I", "U2"]
    path = tmp_path / "CriteoSearchData"
    path.write_text("\t".join(first) + "\n" + "\t".join(second) + "\n")
    wanted = ["Sale", "nb_clicks_1week", "product_price", "product_brand", "product_category7", "user_id"]
    t = read_table(path, format="criteo-search", columns=wanted)
    assert t.column("Sale").to_pylist() == [1, 0]
    assert t.column("nb_clicks_1week").to_pylist() == [3, None]  # -1 is missing
    assert t.column("product_price").to_pylist() == [12.99, None]
    assert t.column("product_brand").to_pylist() == ["B6A2C9F6D2E3F9DB1B2D9B4BD0C1AE8E", "E"]
    assert t.column("product_category7").to_pylist() == [None, "c6"]
    assert t.column("user_id").to_pylist() == ["U1", "U2"]


def test_errors_name_the_path_and_the_problem(tmp_path, small):
    missing = tmp_path / "nope.parquet"
    with pytest.raises(InvalidParameterError, match=r"nope\.parquet: no such file"):
        read_table(missing)
    path = tmp_path / "d.parquet"
    pq.write_table(small, path)
    with pytest.raises(InvalidParameterError, match=r"d\.parquet: no column 'absent'"):
        read_table(path, columns=["uid", "absent"])
    with pytest.raises(InvalidParameterError, match=r"unknown format 'xlsx'"):
        read_table(path, format="xlsx")
    odd = tmp_path / "d.bin"
    odd.write_bytes(b"\x00\x01")
    with pytest.raises(InvalidParameterError, match=r"d\.bin: cannot tell the format"):
        read_table(odd)
    garbage = tmp_path / "broken.parquet"
    garbage.write_bytes(b"not a parquet file at all")
    with pytest.raises(InvalidParameterError, match=r"broken\.parquet: cannot read as parquet"):
        read_table(garbage)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(InvalidParameterError, match=r"d\.csv: no column 'c'"):
        read_table(csv, columns=["c"])
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b\n1,2,3\n")
    with pytest.raises(InvalidParameterError, match=r"ragged\.csv: cannot read as csv"):
        read_table(ragged)
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InvalidParameterError, match=r"empty\.csv"):
        read_table(empty)
    (tmp_path / "no_shards").mkdir()
    with pytest.raises(InvalidParameterError, match="no_shards: the directory holds no .parquet"):
        read_table(tmp_path / "no_shards", format="parquet")


def test_errors_are_one_line(tmp_path):
    with pytest.raises(InvalidParameterError) as info:
        read_table(tmp_path / "x.csv")
    assert "\n" not in str(info.value)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1garbagePAR1")
    with pytest.raises(InvalidParameterError) as info:
        read_table(bad)
    assert "\n" not in str(info.value)


def test_data_modules_do_not_import_torch():
    code = ("import sys, trainers.data.loaders, trainers.data.synth, trainers.data.capping, "
            "trainers.data.fingerprint, trainers.data.encoded; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
