"""The split grid's calibrations in parallel processes: the same grid as one process, and
--jobs refused in one line when it is no count."""

import json

import pytest

from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from budgetplan.planning.sweep import sweep

GRID = dict(delta=1e-7, sampling_rate=1000 / 100_000, steps=100, adjacency="replace-one")


def test_parallel_calibrations_give_the_same_grid():
    rules = ["alpha=0", "alpha=0.5", "alpha=1"]
    one = sweep((1.0, 4.0), rules, jobs=1, **GRID)
    two = sweep((1.0, 4.0), rules, jobs=2, **GRID)
    assert one == two  # each calibration is deterministic: the same numbers, in the same cells
    assert [c["noise_multiplier"] is None for c in one] == [False, False, True] * 2
    # alpha 0 gives DP-SGD all of eps 1, alpha 0.5 half of it: the half needs more noise
    assert one[1]["noise_multiplier"] > one[0]["noise_multiplier"]


@pytest.mark.parametrize("jobs", [0, -1, True, 1.5, "2"])
def test_a_bad_jobs_value_is_refused(jobs):
    with pytest.raises(InvalidParameterError, match="jobs"):
        sweep((1.0, 2.0), ["alpha=0"], jobs=jobs, **GRID)


def test_cli_jobs(runner):
    base = ["split", "--delta", "1e-7", "--dataset-size", "100000", "--batch-size", "1000", "--steps", "100",
            "--rule", "grid", "--epsilons", "1,4", "--alphas", "0,0.5", "--json"]
    one = runner.invoke(cli, [*base, "--jobs", "1"])
    two = runner.invoke(cli, [*base, "--jobs", "2"])
    assert one.exit_code == two.exit_code == 0, one.output + two.output
    assert json.loads(one.stdout)["results"] == json.loads(two.stdout)["results"]
    for bad in ("0", "x", "1.5"):
        res = runner.invoke(cli, [*base, "--jobs", bad])
        assert res.exit_code == 2 and "--jobs" in res.stderr and res.stderr.strip().count("\n") == 0, bad
