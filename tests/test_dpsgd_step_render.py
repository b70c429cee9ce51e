"""The step benchmark's ratio table marks each ratio against its own target, and shows the noise's floor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_benchmark_settings import _script as benchmark_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def step():
    return benchmark_script("dpsgd_step.py")  # the loader the settings test uses, and its cached module


def _ratio_rows(markdown: str) -> dict:
    lines = markdown.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| shape | batch | ours/non-private time |"))
    names = [c.strip() for c in lines[head].strip("|").split("|")]
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[(cells["shape"], int(cells["batch"].replace(",", "")))] = cells
    return rows


def _marked(cell: str) -> tuple[float, bool]:
    value, mark = cell.split()[:2]
    return float(value.rstrip("x")), mark == "(met)"


def test_each_ratio_is_marked_against_its_target(step):
    result = json.loads((ROOT / "benchmarks" / "results" / "dpsgd_step.json").read_text())
    rows = _ratio_rows(step._markdown(result))
    assert len(rows) == len(result["ratios"]) > 0
    seen = set()
    for q in result["ratios"]:
        cells = rows[(q["shape"], q["batch"])]
        t, t_met = _marked(cells["ours/non-private time"])
        m, m_met = _marked(cells["ours/non-private memory"])
        assert t == pytest.approx(q["ours_over_nonprivate_time"], abs=0.005)
        assert t_met == (q["ours_over_nonprivate_time"] <= step.TIME_TARGET)
        assert m_met == (q["ours_over_nonprivate_memory"] <= step.MEMORY_TARGET)
        seen |= {t_met, m_met}
        # the lowest ratio the noise allows: (non-private + noise) / non-private, never below 1
        lowest = q["ours_over_nonprivate_time"] / q["ours_over_nonprivate_plus_noise_time"]
        assert lowest >= 1 and float(cells["lowest possible"].rstrip("x")) == pytest.approx(lowest, abs=0.005)
    assert seen == {True, False}  # the file has ratios on both sides of the targets


def test_the_results_file_records_the_targets_it_is_marked_against(step):
    result = json.loads((ROOT / "benchmarks" / "results" / "dpsgd_step.json").read_text())
    assert result["targets"] == step.TARGETS
