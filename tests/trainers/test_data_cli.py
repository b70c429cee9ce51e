"""``budgetplan data synth``: writes the synthetic data, or refuses with one line and exit 2."""

import json

import pytest

pytest.importorskip("pyarrow")

from budgetplan.cli import cli  # noqa: E402
from trainers.data.loaders import read_table  # noqa: E402
from trainers.data.synth import SHAPES, SYNTH_FEATURES, true_probability  # noqa: E402


def run(runner, *args):
    return runner.invoke(cli, ["data", "synth", *[str(a) for a in args]])


def test_synth_writes_parquet_and_prints_a_summary(runner, tmp_path):
    out = tmp_path / "d.parquet"
    result = run(runner, "--rows", 2000, "--users", 200, "--out", out, "--seed", 4)
    assert result.exit_code == 0, result.output
    assert "conversion rate" in result.stdout and "2,000" in result.stdout
    table = read_table(out)
    assert table.num_rows == 2000 and set(table.column_names) == set(SYNTH_FEATURES.columns)


def test_synth_json_is_alone_on_stdout(runner, tmp_path):
    out = tmp_path / "d.csv"
    result = run(runner, "--rows", 1000, "--users", 100, "--out", out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "csv" and summary["rows"] == 1000 and summary["users"] == 100
    assert summary["seed"] == 0 and 0 < summary["conversion_rate"] < 0.2 and summary["seconds"] >= 0
    assert summary["features"]["unit_id"] == "user_id"
    assert read_table(out).num_rows == 1000
    again = run(runner, "--rows", 1000, "--users", 100, "--out", tmp_path / "e.parquet", "--format", "parquet",
                "--json")
    assert json.loads(again.stdout)["conversion_rate"] == summary["conversion_rate"]  # same seed, same data


@pytest.mark.parametrize("args, fragment", [
    (["--rows", 0, "--users", 1], "--rows must be an integer >= 1, got 0"),
    (["--rows", 10, "--users", 0], "--users must be an integer >= 1, got 0"),
    (["--rows", 10, "--users", 11], "--users (11) must not exceed --rows (10)"),
    (["--rows", "ten", "--users", 1], "--rows must be a number"),
    (["--rows", 10, "--users", 1, "--seed", -1], "--seed"),
    (["--rows", 10, "--users", 1, "--format", "json"], "--format"),
    (["--rows", 10, "--users", 1, "--shape", "criteo"], "--shape"),
    (["--rows", 10, "--users", 1, "--shape", ""], "--shape"),
])
def test_synth_refuses_bad_sizes(runner, tmp_path, args, fragment):
    out = tmp_path / "d.parquet"
    result = run(runner, *args, "--out", out)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr and result.stderr.strip().count("\n") == 0
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_synth_refuses_a_missing_directory_or_a_directory(runner, tmp_path):
    result = run(runner, "--rows", 10, "--users", 2, "--out", tmp_path / "missing" / "d.parquet")
    assert result.exit_code == 2 and "--out directory does not exist" in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "missing").exists()
    result = run(runner, "--rows", 10, "--users", 2, "--out", tmp_path)
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0
    assert list(tmp_path.iterdir()) == []


def test_help_lists_the_data_group(runner):
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0 and "data" in result.stdout


def test_shape_names_match_the_generator():
    from budgetplan.cli.data_cmd import SHAPE_NAMES

    assert SHAPE_NAMES == tuple(SHAPES)


@pytest.mark.parametrize("shape", ["balanced", "sensitive"])
def test_synth_writes_the_named_shape(runner, tmp_path, shape):
    out = tmp_path / "d.parquet"
    result = run(runner, "--rows", 3000, "--users", 300, "--out", out, "--seed", 2, "--shape", shape, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    spec = SHAPES[shape].features
    assert summary["shape"] == shape
    assert summary["features"]["sensitive_categorical"] == list(spec.sensitive_categorical)
    assert summary["features"]["nonsensitive_categorical"] == list(spec.nonsensitive_categorical)
    table = read_table(out)
    assert table.num_rows == 3000 and set(table.column_names) == set(spec.columns)
    assert "advertiser" in table.column_names and "campaign" not in table.column_names
    p = true_probability(table, shape)  # the file reads back under its own shape's model
    assert p.shape == (3000,) and 0.01 < p.mean() < 0.15
