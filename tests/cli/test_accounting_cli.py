"""The CLI contract of issue #2: commands, JSON shapes, exit codes, one-line errors."""

import json
import math
import subprocess
import sys

import pytest

from budgetplan.cli import cli


def run(runner, *args):
    result = runner.invoke(cli, list(args))
    return result


def run_json(runner, *args):
    result = run(runner, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


TOP = {"epsilon", "delta", "accountant", "adjacency"}


def test_rr_epsilon(runner):
    out = run_json(runner, "rr", "--epsilon", "1")
    assert TOP <= out.keys()
    assert out["flip_probability"] == pytest.approx(0.268941, abs=1e-6)
    assert out["epsilon"] == 1.0 and out["delta"] == 0.0 and out["adjacency"] == "replace-one"


def test_rr_flip_probability(runner):
    out = run_json(runner, "rr", "--flip-probability", "0.1")
    assert out["epsilon"] == pytest.approx(math.log(9))
    human = run(runner, "rr", "--flip-probability", "0.1")
    assert human.exit_code == 0 and human.stdout.count("flip probability") == 1


def test_rr_unit_cap_shows_both_splits(runner):
    out = run_json(runner, "rr", "--epsilon", "1", "--unit-cap", "10", "--delta", "1e-7")
    rules = {s["rule"]: s for s in out["splits"]}
    assert rules["eps/K"]["per_impression_epsilon"] == pytest.approx(0.1)
    assert rules["tight"]["per_impression_epsilon"] >= 0.1
    assert out["epsilon"] <= 1.0 and out["unit"]["cap"] == 10
    assert [c["count"] for c in out["per_count"]] == list(range(1, 11))
    human = run(runner, "rr", "--epsilon", "1", "--unit-cap", "10", "--delta", "1e-7")
    assert human.exit_code == 0 and "eps/K" in human.stdout and "tight" in human.stdout


def test_gaussian_both_ways(runner):
    cal = run_json(runner, "gaussian", "--epsilon", "1", "--delta", "1e-5", "--sensitivity", "1")
    assert round(cal["noise_std"], 4) == 3.7306
    assert cal["classical"]["valid"] is False  # eps >= 1 is outside the classical formula
    fwd = run_json(runner, "gaussian", "--noise-std", "3.73", "--delta", "1e-5", "--sensitivity", "1")
    assert fwd["epsilon"] == pytest.approx(1.0, abs=1e-3)
    human = run(runner, "gaussian", "--epsilon", "1", "--delta", "1e-5", "--sensitivity", "1")
    assert "OUTSIDE its validity" in human.stdout


def test_dpsgd_forward_all_accountants(runner):
    out = run_json(runner, "dpsgd", "--noise-multiplier", "1.1", "--dataset-size", "60000", "--batch-size",
                   "256", "--epochs", "60", "--delta", "1e-5", "--accountant", "all")
    assert TOP <= out.keys() and out["steps"] == 14063 and out["noise_multiplier"] == 1.1
    by = {r["accountant"]: r for r in out["results"]}
    assert round(by["pld"]["epsilon"], 3) == 2.382 and round(by["rdp"]["epsilon"], 3) == 2.597
    assert by["prv"]["guarantee"]["epsilon_range"][0] <= by["pld"]["epsilon"]
    human = run(runner, "dpsgd", "--noise-multiplier", "1.1", "--dataset-size", "60000", "--batch-size",
                "256", "--epochs", "60", "--delta", "1e-5")
    assert human.exit_code == 0 and "2.38" in human.stdout


def test_dpsgd_calibration(runner):
    out = run_json(runner, "dpsgd", "--epsilon", "2", "--delta", "3.125e-8", "--dataset-size", "32000000",
                   "--batch-size", "16384", "--epochs", "64")
    assert out["noise_multiplier"] == pytest.approx(0.7751, abs=2e-4)
    assert out["epsilon"] <= 2.0 and out["verified_epsilon"] <= 2.0 and out["steps"] == 125000


def test_dpsgd_user_level_side_by_side(runner):
    out = run_json(runner, "dpsgd", "--noise-multiplier", "1.0", "--dataset-size", "32000000", "--batch-size",
                   "16384", "--epochs", "3", "--delta", "1e-7", "--unit-cap", "8")
    assert out["guarantee"]["method"] == "mixture-of-gaussians(pld)"
    options = {o["accountant"]: o["epsilon"] for o in out["unit_accounting_options"]}
    assert options["mixture-of-gaussians"] < options["group(pld)"] < options["group(rdp)"]
    assert round(options["group(rdp)"], 1) == 15.9
    # sampling units instead: one unit is one Poisson contribution, the example-level figure (DOMAIN: 0.2385)
    assert round(options["unit-sampling"], 4) == 0.2385


def test_dpsgd_user_level_replace_one_side_by_side(runner):
    out = run_json(runner, "dpsgd", "--noise-multiplier", "1.0", "--dataset-size", "32000000", "--batch-size",
                   "16384", "--epochs", "3", "--delta", "1e-7", "--unit-cap", "5", "--adjacency", "replace-one")
    assert out["guarantee"]["method"] == "double-mixture-of-gaussians(pld)"
    options = {o["accountant"]: o["epsilon"] for o in out["unit_accounting_options"]}
    assert set(options) == {"double-mixture-of-gaussians", "group(pld)", "unit-sampling"}
    assert options["double-mixture-of-gaussians"] == out["epsilon"] <= options["group(pld)"]
    example = run_json(runner, "dpsgd", "--noise-multiplier", "1.0", "--dataset-size", "32000000", "--batch-size",
                       "16384", "--epochs", "3", "--delta", "1e-7", "--adjacency", "replace-one")
    assert options["unit-sampling"] == example["epsilon"] < options["double-mixture-of-gaussians"]


def test_dpsgd_solves_for_epochs_and_rows(runner):
    ep = run_json(runner, "dpsgd", "--noise-multiplier", "1.0", "--epsilon", "1", "--delta", "1e-6",
                  "--dataset-size", "60000", "--batch-size", "600")
    assert ep["max_steps"] >= 1 and ep["epsilon"] <= 1.0
    assert ep["max_epochs"] == pytest.approx(ep["max_steps"] * 600 / 60000)
    rows = run_json(runner, "dpsgd", "--noise-multiplier", "1.0", "--epsilon", "2", "--delta", "1e-6",
                    "--batch-size", "256", "--epochs", "10")
    assert rows["min_dataset_size"] > 256 and rows["epsilon"] <= 2.0


def test_group(runner):
    out = run_json(runner, "group", "--epsilon", "1", "--delta", "1e-7", "--group-size", "5")
    assert out["epsilon"] == 5.0
    assert out["delta"] == pytest.approx(1e-7 * (math.exp(5) - 1) / (math.e - 1))


def test_json_is_alone_on_stdout_and_warnings_go_to_stderr(runner):
    result = run(runner, "dpsgd", "--noise-multiplier", "1", "--dataset-size", "1000", "--batch-size", "10",
                 "--epochs", "1", "--delta", "0.01", "--json")
    assert result.exit_code == 0
    json.loads(result.stdout)  # nothing but JSON
    assert "warning: delta=0.01 is not below 1/N" in result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["rr", "--epsilon", "nan"], "--epsilon must be a finite number > 0, got nan"),
    (["rr", "--epsilon", "inf"], "--epsilon must be a finite number > 0, got inf"),
    (["rr", "--epsilon", "0"], "--epsilon must be a finite number > 0, got 0"),
    (["rr", "--epsilon", "-1"], "--epsilon must be a finite number > 0, got -1"),
    (["rr", "--epsilon", "abc"], "--epsilon must be a number, got 'abc'"),
    (["rr", "--flip-probability", "0.7"], "--flip-probability must be < 0.5, got 0.7"),
    (["rr"], "give exactly one of --epsilon or --flip-probability"),
    (["gaussian", "--epsilon", "1", "--delta", "1", "--sensitivity", "1"], "--delta must be in (0, 1), got 1"),
    (["gaussian", "--epsilon", "1", "--delta", "-inf", "--sensitivity", "1"], "--delta must be in (0, 1), got -inf"),
    (["dpsgd", "--noise-multiplier", "1", "--dataset-size", "100", "--batch-size", "200", "--epochs", "1",
      "--delta", "1e-5"], "--batch-size (200) must not exceed --dataset-size (100)"),
    (["dpsgd", "--noise-multiplier", "1", "--dataset-size", "100", "--batch-size", "10", "--epochs", "0",
      "--delta", "1e-5"], "--epochs must be a finite number > 0, got 0"),
    (["dpsgd", "--noise-multiplier", "nan", "--dataset-size", "100", "--batch-size", "10", "--epochs", "1",
      "--delta", "1e-5"], "--noise-multiplier must be a finite number > 0, got nan"),
    (["dpsgd", "--noise-multiplier", "1", "--dataset-size", "100.5", "--batch-size", "10", "--epochs", "1",
      "--delta", "1e-5"], "--dataset-size must be an integer >= 1, got 100.5"),
    (["dpsgd", "--noise-multiplier", "1", "--dataset-size", "100", "--batch-size", "10", "--epochs", "1",
      "--delta", "1e-5", "--adjacency", "replace-one", "--accountant", "rdp"], "add-remove only"),
    (["group", "--epsilon", "1", "--delta", "1e-7", "--group-size", "0"], "--group-size must be an integer >= 1"),
    (["dpsgd", "--bogus"], "No such option '--bogus'"),
])
def test_usage_errors_are_one_line_exit_2(runner, args, fragment):
    result = run(runner, *args)
    assert result.exit_code == 2, result.output
    assert fragment in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "Traceback" not in result.output and result.stdout == ""


def test_infeasible_is_exit_1_and_names_the_knob(runner):
    result = run(runner, "dpsgd", "--noise-multiplier", "0.2", "--epsilon", "0.1", "--delta", "1e-8",
                 "--dataset-size", "100", "--batch-size", "50")
    assert result.exit_code == 1
    assert "one step needs noise_multiplier >=" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_console_script_and_help_are_light():
    """`budgetplan --help` and `import budgetplan` import neither torch nor the back-ends."""
    code = (
        "import sys, budgetplan, budgetplan.cli\n"
        "from budgetplan.cli import cli\n"
        "from click.testing import CliRunner\n"
        "assert CliRunner().invoke(cli, ['--help']).exit_code == 0\n"
        "heavy = [m for m in ('torch', 'pyarrow', 'dp_accounting', 'prv_accountant', 'scipy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_budgetplan_public_api_without_torch():
    code = (
        "import sys, budgetplan as bp\n"
        "bp.account(bp.RandomizedResponse(epsilon=1.0), delta=0.0, adjacency='replace-one')\n"
        "bp.dpsgd_noise_multiplier(epsilon=1.0, delta=1e-6, sampling_rate=0.01, steps=10)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
