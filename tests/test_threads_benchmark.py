"""benchmarks/threads.py at a tiny size: both conditions, every thread count, the counts used."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _script():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("_benchmark_threads_tiny", BENCH / "threads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_measures_every_count_in_both_conditions(tmp_path):
    bench = _script()
    result = bench.main(["--rows", "4000", "--rounds", "1", "--settle", "0", "--idle-below", "1000",
                           "--out", str(tmp_path)])
    assert json.loads((tmp_path / "threads.json").read_text()) == json.loads(json.dumps(result))
    cpus = result["cpus"]
    for condition, rows in result["conditions"].items():
        assert rows["busy_processes"] == (cpus - 1 if condition == "loaded" else 0)
        for workload in bench.WORKLOADS:
            used = {label: by[workload]["threads_used"] for label, by in rows["by_threads"].items()}
            assert used["1"] == 1 and used["every CPU"] == cpus and 1 <= used["auto"] <= cpus
            assert all(by[workload]["median"] > 0 for by in rows["by_threads"].values())
    text = (tmp_path / "threads.md").read_text()
    assert "| idle | non-private | 1 | 1 |" in text and "1.00x" in text


@pytest.mark.parametrize("argv, what", [(["--rows", "0"], "--rows"), (["--rounds", "0"], "--rounds"),
                                        (["--settle", "nan"], "--settle"),
                                        (["--idle-below", "-1"], "--idle-below")])
def test_bad_options_are_refused(argv, what, capsys):
    with pytest.raises(SystemExit) as exc:
        _script().parse_args(argv)
    assert exc.value.code == 2 and what in capsys.readouterr().err.splitlines()[-1]
