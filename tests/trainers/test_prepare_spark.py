"""The Spark engine (local[2]) against the local engine: the same rows kept, the same split, the same counts."""

import json

import pytest

pytest.importorskip("pyspark")

from budgetplan.cli import cli  # noqa: E402
from budgetplan.errors import UnsupportedError  # noqa: E402
from tests.trainers.prep_data import CAP, KEY, OTHER_KEY, kept_rids, reference_kept, write_shards  # noqa: E402
from trainers.data import prep_spark, prepare  # noqa: E402
from trainers.data.prepared import read_manifest  # noqa: E402

_SAME = ("rows", "rows_in", "units", "units_capped", "cap", "rule", "key_id", "unit_id", "source")


@pytest.fixture(scope="module")
def spark():
    session, owned = prep_spark.session("local[2]", {"spark.sql.shuffle.partitions": "4"})
    yield session
    if owned:
        session.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("spark")
    return root, write_shards(root / "int"), write_shards(root / "str", seed=1, string_ids=True)


@pytest.mark.parametrize("ids", ["int", "str"])
def test_spark_keeps_the_rows_the_local_engine_keeps(spark, data, tmp_path, ids):
    root, ints, strings = data
    paths = ints if ids == "int" else strings
    local = prepare.cap(root / ids, unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "local")
    remote = prepare.cap(root / ids, unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "spark", engine="spark")
    assert kept_rids(tmp_path / "spark") == kept_rids(tmp_path / "local") == reference_kept(paths, KEY, CAP)
    assert {k: remote[k] for k in _SAME} == {k: local[k] for k in _SAME} and remote["engine"] == "spark"
    assert read_manifest(tmp_path / "spark") == remote
    if ids == "int":
        other = prepare.cap(root / ids, unit_id="uid", cap=CAP, key=OTHER_KEY, out=tmp_path / "other", engine="spark")
        assert other["rows"] == remote["rows"] and kept_rids(tmp_path / "other") != kept_rids(tmp_path / "spark")


def test_spark_split_and_count_agree_with_local(spark, data, tmp_path):
    root, _, _ = data
    local = prepare.split(root / "str", unit_id="uid", held_out=0.25, key=KEY, out=tmp_path / "local")
    remote = prepare.split(root / "str", unit_id="uid", held_out=0.25, key=KEY, out=tmp_path / "spark", engine="spark")
    for side in ("train", "held_out"):
        assert kept_rids(tmp_path / "spark" / side) == kept_rids(tmp_path / "local" / side)
        assert {k: remote[side][k] for k in ("rows", "units")} == {k: local[side][k] for k in ("rows", "units")}
    caps = [1, CAP, 1000]
    assert prepare.count(root / "int", unit_id="uid", caps=caps, engine="spark") == \
        prepare.count(root / "int", unit_id="uid", caps=caps)


def test_spark_cli_stdout_is_the_json_alone_and_count_matches(spark, data, tmp_path, runner):
    root, _, _ = data
    (tmp_path / "k").write_bytes(KEY)
    capped = runner.invoke(cli, ["data", "cap", str(root / "int"), "--unit-id", "uid", "--unit-cap", str(CAP),
                                 "--key", str(tmp_path / "k"), "--out", str(tmp_path / "o"), "--engine", "spark",
                                 "--json"])
    assert capped.exit_code == 0, capped.output
    manifest = json.loads(capped.stdout)
    counted = runner.invoke(cli, ["data", "count", str(root / "int"), "--unit-id", "uid", "--unit-cap", str(CAP),
                                  "--engine", "spark", "--json"])
    plain = runner.invoke(cli, ["data", "count", str(root / "int"), "--unit-id", "uid", "--unit-cap", str(CAP),
                                "--json"])
    assert json.loads(counted.stdout) == json.loads(plain.stdout)
    assert json.loads(counted.stdout)["caps"][0]["rows"] == manifest["rows"]


def test_spark_refuses_csv_and_a_missing_column(spark, tmp_path):
    write_shards(tmp_path / "csv", fmt="csv")
    with pytest.raises(UnsupportedError, match="reads Parquet only"):
        prepare.cap(tmp_path / "csv", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "o", engine="spark")
    write_shards(tmp_path / "pq")
    with pytest.raises(Exception, match="no unit id column 'nope'"):
        prepare.cap(tmp_path / "pq", unit_id="nope", cap=CAP, key=KEY, out=tmp_path / "o", engine="spark")
    assert not (tmp_path / "o").exists()


def test_spark_caps_a_synthesized_pctr_directory_as_the_local_engine_does(spark, tmp_path):
    from trainers.data.loaders import read_table
    from trainers.data.synth import write_synthetic_shards

    write_synthetic_shards(tmp_path / "gen", 9_000, 1_800, seed=1, shape="pctr", shard_rows=4_000)
    local = prepare.cap(tmp_path / "gen", unit_id="user_id", cap=CAP, key=KEY, out=tmp_path / "local")
    remote = prepare.cap(tmp_path / "gen", unit_id="user_id", cap=CAP, key=KEY, out=tmp_path / "spark",
                         engine="spark")
    assert {k: remote[k] for k in _SAME} == {k: local[k] for k in _SAME} and local["rows"] < 9_000

    def rows(path):
        t = read_table(path)
        return sorted(zip(*(t.column(c).to_pylist() for c in ("user_id", "c3", "c12", "i1", "label"))),
                      key=repr)

    assert rows(tmp_path / "spark") == rows(tmp_path / "local")
