"""The README's "Plan, then train" commands run as written, in order, in an empty directory.

The block is read from README.md itself, so the README cannot drift from what works.
"""

import json
import re
import shlex
from pathlib import Path

import pytest

from budgetplan.cli import cli

pytest.importorskip("torch")

README = Path(__file__).resolve().parents[2] / "README.md"


def walkthrough_commands() -> list[list[str]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Plan, then train", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    assert all(c[0] == "budgetplan" for c in commands), commands
    return [c[1:] for c in commands]


def test_readme_plan_then_train_runs_as_written(runner, tmp_path, monkeypatch):
    commands = walkthrough_commands()
    assert [c[0] for c in commands] == ["data", "data", "plan", "train", "train", "audit"]
    monkeypatch.chdir(tmp_path)
    for args in commands:
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, f"budgetplan {' '.join(args)}: {result.output}"
    record = json.loads((tmp_path / "runs" / "hybrid" / "run.json").read_text())
    assert record["algorithm"] == "hybrid"
    assert [p["name"] for p in record["phases"]] == ["rr", "dpsgd", "calibration"]
    assert record["phases"][1]["steps_executed"] == record["phases"][1]["steps_planned"]
    assert "metrics" not in record  # metrics on private labels stay with the data owner
    metrics = json.loads((tmp_path / "runs" / "hybrid" / "private" / "record.json").read_text())["metrics"]["eval"]
    # a private model that has learnt something, compared against the baseline the README trains
    assert metrics["auc"] > 0.6 and metrics["relative_auc_loss"] is not None
    # the intercept calibration brings the mean prediction to the base rate (about 0.7 without it)
    assert abs(metrics["calibration_ratio"] - 1) < 0.1, metrics["calibration_ratio"]
