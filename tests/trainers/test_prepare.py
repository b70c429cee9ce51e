"""Keyed capping and splitting on the local engine: the rule, its privacy property, the CLI, the trainer."""

import json
import math
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from tests.trainers.prep_data import CAP, KEY, OTHER_KEY, kept_rids, reference_kept, write_shards
from trainers.data import prepare
from trainers.data.capping import cap_units, capped_rows
from trainers.data.keyed import cap_priorities, held_out_threshold, hmac_pads, split_scores
from trainers.data.loaders import read_table
from trainers.data.prepared import MANIFEST, read_manifest


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("prep")
    return root, write_shards(root / "in")


def test_priority_is_hmac_sha256_of_the_documented_message():
    import hmac

    from trainers.data.keyed import CAP_DOMAIN, SPLIT_DOMAIN

    message = CAP_DOMAIN + (2).to_bytes(8, "big") + (7).to_bytes(8, "big") + b"-42"
    expected = int.from_bytes(hmac.digest(KEY, message, "sha256")[:8], "big")
    assert int(cap_priorities(KEY, [-42], [2], [7])[0]) == expected
    assert int(split_scores(KEY, ["u1"])[0]) == int.from_bytes(hmac.digest(KEY, SPLIT_DOMAIN + b"u1", "sha256")[:8],
                                                                "big")
    long_key = bytes(100)  # longer than a block: hashed first, as RFC 2104 says
    assert int(split_scores(long_key, [1])[0]) == int.from_bytes(
        hmac.digest(long_key, SPLIT_DOMAIN + b"1", "sha256")[:8], "big")
    with pytest.raises(InvalidParameterError, match="at least 16 bytes"):
        hmac_pads(bytes(15))
    assert held_out_threshold(0.5) == 1 << 63


def test_local_engine_keeps_the_rule_rows_and_counts_agree(shards, tmp_path):
    root, paths = shards
    manifest = prepare.cap(root / "in", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "out")
    kept = kept_rids(tmp_path / "out")
    assert kept == reference_kept(paths, KEY, CAP)
    units = read_table(root / "in", columns=["uid"]).column("uid").to_numpy()
    counted = capped_rows(units, [CAP])
    assert manifest["rows"] == len(kept) == counted["caps"][0]["rows"]
    assert manifest["units_capped"] == counted["caps"][0]["units_capped"] > 0
    assert manifest["rows_in"] == units.size and manifest["units"] == counted["units"]
    # each unit keeps min(n_u, K)
    before = dict(zip(*np.unique(units, return_counts=True)))
    after = dict(zip(*np.unique(read_table(tmp_path / "out", columns=["uid"]).column("uid").to_numpy(),
                                return_counts=True)))
    assert after == {u: min(n, CAP) for u, n in before.items()}
    assert read_manifest(tmp_path / "out") == json.loads((tmp_path / "out" / MANIFEST).read_text()) == manifest
    assert manifest["key_id"] != KEY.hex() and KEY.hex() not in (tmp_path / "out" / MANIFEST).read_text()


def test_another_key_keeps_other_rows_and_labels_do_not_matter(shards, tmp_path):
    root, _ = shards
    a = prepare.cap(root / "in", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "a")
    b = prepare.cap(root / "in", unit_id="uid", cap=CAP, key=OTHER_KEY, out=tmp_path / "b")
    assert a["rows"] == b["rows"] and kept_rids(tmp_path / "a") != kept_rids(tmp_path / "b")
    write_shards(tmp_path / "relabelled", labels_seed=99)  # same units and positions, other labels and features
    assert not np.array_equal(read_table(tmp_path / "relabelled", columns=["label"]).column("label").to_numpy(),
                              read_table(root / "in", columns=["label"]).column("label").to_numpy())
    prepare.cap(tmp_path / "relabelled", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "c")
    assert kept_rids(tmp_path / "c") == kept_rids(tmp_path / "a")


def test_string_ids_and_csv_shards_keep_the_same_positions(tmp_path):
    paths = write_shards(tmp_path / "s", string_ids=True)
    prepare.cap(paths, unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "out")
    assert kept_rids(tmp_path / "out") == reference_kept(paths, KEY, CAP)
    csv = write_shards(tmp_path / "csv", string_ids=True, fmt="csv")
    prepare.cap(tmp_path / "csv", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "csv_out")
    assert kept_rids(tmp_path / "csv_out") == kept_rids(tmp_path / "out")  # same ids, same positions
    assert reference_kept(csv, KEY, CAP) == kept_rids(tmp_path / "out")


def test_cap_units_keyed_breaks_ties_by_position():
    ids = np.array([1, 1, 1, 2, 1])
    kept, info = cap_units(ids, 2, rule="keyed", priorities=np.array([5, 3, 3, 0, 1], dtype=np.uint64))
    assert kept.tolist() == [1, 3, 4] and info["rule"] == "keyed" and info["units_capped"] == 1
    kept, _ = cap_units(ids, 2, rule="keyed", priorities=np.array([5, 3, 3, 0, 9], dtype=np.uint64))
    assert kept.tolist() == [1, 2, 3]  # rows 1 and 2 tie: both kept, the earlier first
    with pytest.raises(InvalidParameterError, match="priorities go with the keyed"):
        cap_units(ids, 2, rule="keyed")
    with pytest.raises(InvalidParameterError, match="priorities go with the keyed"):
        cap_units(ids, 2, rule="first", priorities=np.zeros(5, dtype=np.uint64))


def test_split_puts_each_unit_on_one_side_near_the_fraction(shards, tmp_path):
    root, _ = shards
    sides = prepare.split(root / "in", unit_id="uid", held_out=0.3, key=KEY, out=tmp_path / "sp")
    train = set(read_table(tmp_path / "sp" / "train", columns=["uid"]).column("uid").to_pylist())
    held = set(read_table(tmp_path / "sp" / "held_out", columns=["uid"]).column("uid").to_pylist())
    assert not train & held
    units = len(train | held)
    assert sides["held_out"]["units"] == len(held) and sides["train"]["units"] == len(train)
    # the number held out is Binomial(units, 0.3) for a pseudo-random score: within 4.5 standard deviations
    assert abs(len(held) - 0.3 * units) <= 4.5 * math.sqrt(units * 0.3 * 0.7)
    assert sides["train"]["rows"] + sides["held_out"]["rows"] == sides["train"]["rows_in"]
    assert kept_rids(tmp_path / "sp" / "train") | kept_rids(tmp_path / "sp" / "held_out") == kept_rids(root / "in")
    assert read_manifest(tmp_path / "sp" / "held_out")["side"] == "held_out"


def test_split_of_a_capped_directory_keeps_its_cap(shards, tmp_path):
    root, _ = shards
    prepare.cap(root / "in", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "capped")
    sides = prepare.split(tmp_path / "capped", unit_id="uid", held_out=0.5, key=KEY, out=tmp_path / "sp")
    assert sides["train"]["cap"] == sides["held_out"]["cap"] == CAP and sides["train"]["rule"] == "keyed"


@pytest.mark.parametrize("args, message", [
    (["--unit-cap", "0"], "--unit-cap"),
    (["--unit-cap", "nan"], "--unit-cap"),
    (["--unit-cap", "3", "--unit-id", "nope"], "nope"),
])
def test_cap_cli_refuses_bad_input_and_writes_nothing(shards, tmp_path, runner, args, message):
    root, _ = shards
    (tmp_path / "k").write_bytes(KEY)
    base = ["data", "cap", str(root / "in"), "--key", str(tmp_path / "k"), "--out", str(tmp_path / "out")]
    if "--unit-id" not in args:
        base += ["--unit-id", "uid"]
    result = runner.invoke(cli, base + args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_cli_key_and_output_refusals(shards, tmp_path, runner):
    root, _ = shards
    common = ["data", "cap", str(root / "in"), "--unit-id", "uid", "--unit-cap", "3"]
    missing = runner.invoke(cli, common + ["--key", str(tmp_path / "nokey"), "--out", str(tmp_path / "o")])
    assert missing.exit_code == 2 and "--new-key" in missing.stderr and not (tmp_path / "o").exists()
    (tmp_path / "short").write_bytes(b"x" * 8)
    short = runner.invoke(cli, common + ["--key", str(tmp_path / "short"), "--out", str(tmp_path / "o")])
    assert short.exit_code == 2 and "at least 16" in short.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    full = runner.invoke(cli, common + ["--new-key", str(tmp_path / "k"), "--out", str(tmp_path / "full")])
    assert full.exit_code == 2 and "not empty" in full.stderr and not (tmp_path / "k").exists()
    bad_column = runner.invoke(cli, ["data", "cap", str(root / "in"), "--unit-id", "label_x", "--unit-cap", "3",
                                     "--new-key", str(tmp_path / "k"), "--out", str(tmp_path / "o")])
    assert bad_column.exit_code == 2 and not (tmp_path / "k").exists() and not (tmp_path / "o").exists()
    made = runner.invoke(cli, common + ["--new-key", str(tmp_path / "k"), "--out", str(tmp_path / "o"), "--json"])
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["rows"] == prepare.count(root / "in", unit_id="uid", caps=[3])["caps"][0]["rows"]
    assert len((tmp_path / "k").read_bytes()) == 32 and oct((tmp_path / "k").stat().st_mode)[-3:] == "600"


@pytest.mark.parametrize("fraction", ["0", "1", "nan", "-0.1", "1.5"])
def test_split_cli_refuses_fractions_outside_0_1(shards, tmp_path, runner, fraction):
    root, _ = shards
    (tmp_path / "k").write_bytes(KEY)
    result = runner.invoke(cli, ["data", "split", str(root / "in"), "--unit-id", "uid", "--held-out", fraction,
                                 "--key", str(tmp_path / "k"), "--out", str(tmp_path / "sp")])
    assert result.exit_code == 2 and "--held-out" in result.stderr and not (tmp_path / "sp").exists()


def test_spark_engine_without_pyspark_is_one_line(shards, tmp_path, runner, monkeypatch):
    root, _ = shards
    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "pyspark.sql", None)
    (tmp_path / "k").write_bytes(KEY)
    result = runner.invoke(cli, ["data", "cap", str(root / "in"), "--unit-id", "uid", "--unit-cap", "3", "--key",
                                 str(tmp_path / "k"), "--out", str(tmp_path / "o"), "--engine", "spark"])
    assert result.exit_code == 2 and "pip install 'budgetplan[spark]'" in result.stderr
    assert not (tmp_path / "o").exists()


def test_a_tampered_directory_is_refused(shards, tmp_path):
    root, _ = shards
    prepare.cap(root / "in", unit_id="uid", cap=CAP, key=KEY, out=tmp_path / "out")
    shard = sorted((tmp_path / "out").glob("*.parquet"))[0]
    table = pq.read_table(shard)
    pq.write_table(table.slice(1), shard)
    with pytest.raises(InvalidParameterError, match="rows, the manifest says"):
        read_manifest(tmp_path / "out")
    pq.write_table(table, shard)
    pq.write_table(table, tmp_path / "out" / "stray.parquet")
    with pytest.raises(InvalidParameterError, match="stray.parquet is not in the manifest"):
        read_manifest(tmp_path / "out")
    with pytest.raises(InvalidParameterError, match="no manifest.json"):
        read_manifest(root / "in")


@pytest.fixture(scope="module")
def synth_capped(tmp_path_factory):
    from trainers.data.synth import synthesize

    root = tmp_path_factory.mktemp("train")
    pq.write_table(synthesize(3000, 600, 3), root / "train.parquet")
    manifest = prepare.cap(root / "train.parquet", unit_id="user_id", cap=2, key=KEY, out=root / "capped")
    return root, manifest


def test_train_on_a_prepared_directory_reconciles_n_and_k(synth_capped, tmp_path):
    from tests.trainers.test_run import FAST, rr_plan
    from trainers.run import RunOptions, execute_plan

    root, manifest = synth_capped
    n = manifest["rows"]
    user = 'unit = "user x time"\ncap = 2'
    rec = execute_plan(rr_plan(n, extra_privacy=user), root / "capped", RunOptions(settings=FAST))
    data = rec.private_part.data
    assert data.rows_used == n and data.capping is not None
    assert data.capping["rows_dropped"] == 0 and data.capping["capped_ahead"]
    assert data.prepared is not None and data.prepared["key_id"] == manifest["key_id"]
    with pytest.raises(InvalidParameterError, match=f"holds N = {n} rows .* the plan accounts N = {n + 1}"):
        execute_plan(rr_plan(n + 1, extra_privacy=user), root / "capped",
                     RunOptions(settings=FAST, out_dir=tmp_path / "r"))
    with pytest.raises(InvalidParameterError, match="was capped at K = 2; the plan caps each unit at K = 3"):
        execute_plan(rr_plan(n, extra_privacy='unit = "user x time"\ncap = 3'), root / "capped",
                     RunOptions(settings=FAST))
    assert not (tmp_path / "r").exists()


def test_train_refuses_a_unit_over_the_plans_k(synth_capped, tmp_path):
    """A manifest that claims a smaller cap than its shards hold is caught by the count, not trusted."""
    from tests.trainers.test_run import FAST, rr_plan
    from trainers.run import RunOptions, execute_plan

    root, _ = synth_capped
    wide = prepare.cap(root / "train.parquet", unit_id="user_id", cap=4, key=KEY, out=tmp_path / "wide")
    lie = json.loads((tmp_path / "wide" / MANIFEST).read_text())
    (tmp_path / "wide" / MANIFEST).write_text(json.dumps({**lie, "cap": 2}))
    with pytest.raises(InvalidParameterError, match="has a unit with 4 rows, more than the plan's K = 2"):
        execute_plan(rr_plan(wide["rows"], extra_privacy='unit = "user x time"\ncap = 2'), tmp_path / "wide",
                     RunOptions(settings=FAST))
