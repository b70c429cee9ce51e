"""trainers.data.layouts: the paper's layouts, their model, and generation that is the same however it is chunked."""

import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from budgetplan.cli import cli  # noqa: E402
from budgetplan.errors import InvalidParameterError  # noqa: E402
from trainers.data import layouts, prepare, synth  # noqa: E402
from trainers.data.loaders import list_shards, read_table  # noqa: E402
from trainers.data.synth import SHAPES, oracle_aucs, synthesize, true_probability  # noqa: E402

LAYOUT = {"pctr": (13, 7, 13, 6), "attribution": (6, 2, 4, 2)}  # ns cat, ns num, s cat, s num (the paper's)
KEY = bytes(range(32))


@pytest.fixture(scope="module", params=list(LAYOUT))
def sample(request):
    return request.param, synthesize(50_000, 10_000, seed=3, shape=request.param)


def test_layout_column_counts_and_types(sample):
    name, t = sample
    spec = SHAPES[name].features
    groups = (spec.nonsensitive_categorical, spec.nonsensitive_numeric, spec.sensitive_categorical,
              spec.sensitive_numeric)
    assert tuple(map(len, groups)) == LAYOUT[name]
    assert t.column_names == [spec.unit_id, spec.label, *spec.nonsensitive, *spec.sensitive]
    assert t.schema.field("user_id").type == pa.int64() and t.schema.field("label").type == pa.int8()
    for c in spec.nonsensitive_categorical + spec.sensitive_categorical:
        assert t.schema.field(c).type == pa.int32() and t.column(c).null_count == 0
    for c in spec.nonsensitive_numeric + spec.sensitive_numeric:
        assert t.schema.field(c).type == pa.float32()
    assert np.unique(t.column("user_id").to_numpy()).size == 10_000  # every user has a row


def test_pctr_cardinalities_reach_hashed_criteo_scale():
    sizes = {c.name: c.size for c in layouts.PCTR.columns if c.kind == "cat"}
    assert max(sizes.values()) == layouts.PCTR_HASH_BINS == 10**6
    assert sum(n >= 10**5 for n in sizes.values()) >= 7
    t = synthesize(60_000, 12_000, seed=1, shape="pctr")
    codes = t.column("c3").to_numpy()
    # Zipf(1.05) over 10^6 values: the top code's share is 1 / H(n, s), within 5 binomial standard deviations
    top = 1.0 / np.sum(np.arange(1, 10**6 + 1, dtype=np.float64) ** -1.05)
    assert abs(np.mean(codes == 0) - top) < 5 * np.sqrt(top * (1 - top) / codes.size)
    assert codes.max() > 10**5  # the long tail is drawn


def test_conversion_and_labels_follow_the_model(sample):
    name, t = sample
    y, p = t.column("label").to_numpy(), true_probability(t, name)
    assert 0.035 < y.mean() < 0.07
    assert abs(y.mean() - p.mean()) < 4 * np.sqrt(p.mean() * (1 - p.mean()) / y.size)
    o = oracle_aucs(t, name)
    assert o["auc_all"] > 0.7 and o["auc_nonsensitive"] < o["auc_all"] and o["nonsensitive_method"] == "exact"
    # labels drawn without the model would leave the oracle at 0.5
    shuffled = np.random.default_rng(0).permutation(y)
    from trainers.metrics import auc

    assert abs(auc(shuffled, p) - 0.5) < 0.05


def test_per_user_columns_are_fixed_per_user(sample):
    name, t = sample
    users = t.column("user_id").to_numpy()
    order = np.argsort(users, kind="stable")
    starts = np.r_[0, np.flatnonzero(np.diff(users[order])) + 1]
    per_user = [c.name for c in SHAPES[name].columns if c.per_user and c.kind == "cat"]
    assert per_user
    for column in per_user:
        codes = t.column(column).to_numpy()[order]
        assert np.array_equal(codes, np.repeat(codes[starts], np.diff(np.r_[starts, users.size]))), column
    other = next(c.name for c in SHAPES[name].columns if not c.per_user and c.kind == "cat" and c.size > 100)
    codes = t.column(other).to_numpy()[order]
    assert not np.array_equal(codes, np.repeat(codes[starts], np.diff(np.r_[starts, users.size])))


@pytest.mark.parametrize("block", [4096, layouts.BLOCK_ROWS])
def test_chunked_generation_is_the_unchunked_table(monkeypatch, block):
    monkeypatch.setattr(layouts, "BLOCK_ROWS", block)
    rows = 30_000 if block < 30_000 else 70_000  # chunk edges inside and across generation blocks
    whole = synthesize(rows, rows // 5, seed=9, shape="pctr")
    chunks = list(SHAPES["pctr"].chunks(rows, rows // 5, 9, 7_000))
    assert [c.num_rows for c in chunks] == [7_000] * (rows // 7_000) + ([rows % 7_000] if rows % 7_000 else [])
    assert pa.concat_tables(chunks).equals(whole)
    assert not whole.equals(synthesize(rows, rows // 5, seed=10, shape="pctr"))


def test_shards_directory_holds_the_table(tmp_path):
    summary = synth.write_synthetic_shards(tmp_path / "d", 20_000, 4_000, seed=2, shape="attribution",
                                           shard_rows=6_000)
    shards = list_shards(tmp_path / "d")
    assert [p.name for p in shards] == [f"part-0000{i}.parquet" for i in range(4)]
    assert [s["rows"] for s in summary["shards"]] == [6_000, 6_000, 6_000, 2_000]
    back = read_table(tmp_path / "d")
    assert back.equals(synthesize(20_000, 4_000, seed=2, shape="attribution"))
    sidecar = json.loads((tmp_path / "d" / synth.SIDECAR).read_text())
    assert sidecar["rows"] == 20_000 and sidecar["shards"] == summary["shards"]
    assert sidecar["conversion_rate"] == pytest.approx(back.column("label").to_numpy().mean())
    with pytest.raises(InvalidParameterError, match="is not empty"):
        synth.write_synthetic_shards(tmp_path / "d", 100, 10, shape="pctr")


def test_a_drawn_whole_shape_writes_the_same_shards(tmp_path):
    synth.write_synthetic_shards(tmp_path / "legacy", 5_000, 500, seed=4, shard_rows=2_000)
    assert read_table(tmp_path / "legacy").equals(synthesize(5_000, 500, seed=4))


def test_cli_writes_a_directory_and_caps_it(runner, tmp_path):
    out = tmp_path / "gen"
    result = runner.invoke(cli, ["data", "synth", "--rows", "12000", "--users", "2400", "--shape", "pctr", "--out",
                                 f"{out}/", "--shard-rows", "5000", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 12_000 and len(summary["shards"]) == 3 and summary["shape"] == "pctr"
    assert summary["features"]["sensitive_numeric"] == [f"i{i}" for i in range(8, 14)]
    # the cap's N is the closed form sum over users of min(rows, K)
    ids = read_table(out, columns=["user_id"]).column("user_id").to_numpy()
    counts = np.unique(ids, return_counts=True)[1]
    manifest = prepare.cap(out, unit_id="user_id", cap=3, key=KEY, out=tmp_path / "capped")
    assert manifest["rows"] == int(np.minimum(counts, 3).sum()) and manifest["units"] == 2_400
    kept = read_table(tmp_path / "capped")
    assert np.unique(kept.column("user_id").to_numpy(), return_counts=True)[1].max() == 3


@pytest.mark.parametrize("args, fragment", [
    (["--format", "csv"], "--format csv writes one file"),
    (["--shard-rows", "0"], "--shard-rows must be an integer >= 1"),
])
def test_cli_refuses_bad_directory_output(runner, tmp_path, args, fragment):
    result = runner.invoke(cli, ["data", "synth", "--rows", "100", "--users", "10", "--shape", "pctr",
                                 "--out", f"{tmp_path}/d/", *args])
    assert result.exit_code == 2 and fragment in result.stderr and result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "d").exists()


def test_foreign_codes_are_refused():
    t = synthesize(100, 10, shape="pctr")
    bad = t.set_column(t.column_names.index("c9"), "c9", pa.array([3] + [0] * 99, pa.int32()))
    with pytest.raises(InvalidParameterError, match="column 'c9' has a value outside the synthetic model"):
        true_probability(bad, "pctr")
    with pytest.raises(InvalidParameterError, match="column 'c1' is not in the table"):
        true_probability(t.drop_columns(["c1"]), "pctr")
