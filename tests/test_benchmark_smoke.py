"""Every benchmark script without a test of its own runs end to end at its smallest size (``--smoke``).

Each script runs as a user runs it, ``python benchmarks/<script>.py --smoke --out DIR`` in a
fresh interpreter from the repository root, so none can rot between two real measurements:
exit status 0, its results files written under ``DIR`` (never over ``benchmarks/results``) and
readable, and one or two of its numbers sane. What a smoke run runs, and what it leaves out and
why, is in each script's docstring. Those that take 20 s or more are in conftest's ``SLOW``. The
scripts tested otherwise (``gpu_suite.py``, ``threads.py``, ``utility_frontier.py``,
``walr_utility.py``) have their own test files.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _finite(*xs) -> bool:
    return all(isinstance(x, int | float) and math.isfinite(x) for x in xs)


def _batch_selection(r: dict) -> None:
    (c,) = r["cells"]
    assert _finite(c["poisson_pld"], c["allocation"], c["shuffle_upper"], c["shuffle_lower"])
    assert 0.5 < c["allocation_over_poisson_pld"] < 1.5 and c["shuffle_lower"] <= c["shuffle_upper"]


def _calibration(r: dict) -> None:
    peer, ours = r["peer"]["noise_multiplier"], r["ours"]["noise_multiplier"]
    assert _finite(peer, ours, r["speedup"]) and abs(ours / peer - 1) < 0.01  # the peer at tol 1e-3
    assert ours > 0 and r["user_level"]["noise_multiplier"] > 0 and "reference" not in r


def _split_grid(r: dict) -> None:
    sigmas = {(c["epsilon"], c["rule"]): c["noise_multiplier"] for c in r["results"]}
    assert r["cells"] == len(sigmas) == 6 and _finite(r["seconds"])
    assert sigmas[(1.0, "alpha=1")] is None  # all of it to RR: no DP-SGD phase
    assert sigmas[(8.0, "alpha=0")] < sigmas[(8.0, "alpha=0.5")] < sigmas[(1.0, "alpha=0.5")]


def _dpsgd_step(r: dict) -> None:
    # Opacus is the `bench` extra, not the `test` one: without it its modes are infeasible, saying why
    peer = importlib.util.find_spec("opacus") is not None
    modes = ("non-private", "ours", "ours-4chunks", "opacus", "opacus-ghost")
    runs = {x["mode"]: x for x in r["runs"]}
    assert list(runs) == list(modes)
    for mode in modes:
        if mode.startswith("opacus") and not peer:
            assert runs[mode]["status"] == "infeasible" and "opacus" in str(runs[mode].get("reason")
                                                                             or runs[mode].get("error")), runs[mode]
            continue
        assert runs[mode]["status"] == "ok", runs[mode]
        assert _finite(runs[mode]["step_seconds_median"]) and runs[mode]["step_seconds_median"] > 0
    (q,) = r["ratios"]
    assert _finite(q["ours_over_nonprivate_memory"])
    # the noise floor: timed in the ours process, beside non-private + noise
    assert _finite(runs["ours"]["noise_seconds_median"]) and runs["ours"]["noise_seconds_median"] > 0
    assert "noise_seconds_median" not in runs["non-private"]
    assert q["noise_draw_seconds"] == runs["ours"]["noise_seconds_median"]
    assert q["ours_over_nonprivate_plus_noise_time"] == pytest.approx(
        runs["ours"]["step_seconds_median"] / (runs["non-private"]["step_seconds_median"] + q["noise_draw_seconds"]))
    if peer:
        assert _finite(q["opacus_over_ours_time"], q["ghost_over_ours_time"])


def _epoch_throughput(r: dict) -> None:
    assert [(x["mode"], x["status"]) for x in r["runs"]] == [("non-private", "ok"), ("dpsgd", "ok")]
    assert all(_finite(x["rows_per_s"]) and x["rows_per_s"] > 0 for x in r["runs"])
    release = r["walr"]["release"]
    assert release["rows"] == 20_000 and 0 < release["fraction_of_read_bandwidth"] < 10
    assert 0 < release["fraction_of_copy_median"] < 100 and release["bytes_moved"] > release["input_bytes"]
    assert 0 < release["time_over_copy_median"] < 1e4
    one = r["walr"]["release_one_thread"]  # beside torch's default threads, interleaved with it
    assert one["threads"] == 1 and one["repeats"] == release["repeats"] == 1 and 0 < one["time_over_copy_median"]


def _data_scale(r: dict) -> None:
    (size,) = r["sizes"]
    assert size["synth"]["shards"] == 2 and size["synth"]["bytes_on_disk"] > 0
    local = size["cap_local"]
    assert local["rows_in"] == 1_000 and 0 < local["rows"] <= 2 * local["units"] <= 2 * size["users"]
    assert "not in a smoke run" in size["cap_spark"]["skipped"]


def _distributed(r: dict) -> None:
    by = r["summary"]["by_processes"]
    assert sorted(by) == ["1", "2"] and all(row["audits_passed"] == row["runs"] == 1 for row in by.values())
    assert all(0 <= run["auc"] <= 1 and _finite(run["dpsgd_rows_per_second"]) for run in r["runs"])


def _one_run_audit(r: dict) -> None:
    arms = {(a["optimizer"], a["arm"]): a for a in r["arms"]}
    assert sorted(arms) == sorted((o, a) for o in ("adam", "sgd") for a in ("honest", "noise halved", "clipping off"))
    for optimizer in ("adam", "sgd"):
        honest, off = arms[(optimizer, "honest")], arms[(optimizer, "clipping off")]
        assert honest["refuted"] == 0 and _finite(honest["bound_median"], off["bound_median"])
        assert off["bound_median"] > honest["bound_median"]  # a canary's whole gradient kept shows
    assert len(r["step"]) == 2 and len(r["ideal"]) == 2


def _paper_sizes(r: dict) -> None:
    (run,) = r["runs"]
    assert run["processes"] == 1 and run["audit_passed"] and run["steps"] > 0
    assert _finite(run["dpsgd_rows_per_second"]) and run["dpsgd_rows_per_second"] > 0
    assert set(r["stages"]) == {"synth", "plan"}


def _reproduction(r: dict) -> None:
    same, other = r["same_seed"], r["other_seed"]
    assert r["passed"] and same["differences"] == [] and other["model_differs"]
    assert same["compared"]["tensors"] > 0 and same["compared"]["fields"] > 100 and r["seeds"]["b"] == r["seeds"]["a"]


def _split_selection(r: dict) -> None:
    plans = {c["plan"]: c for c in r["cells"]}
    assert sorted(plans) == ["3 splits", "5 splits", "default"]
    assert plans["default"]["selected"] is None and plans["5 splits"]["selected"].startswith("alpha=")
    assert all(0 <= c["auc"] <= 1 for c in r["cells"])
    assert plans["5 splits"]["run_epsilon"] < plans["3 splits"]["run_epsilon"] < plans["default"]["run_epsilon"]


def _planner(r: dict) -> None:
    rows = {row["command"]: row for row in r["rows"]}
    assert sorted(rows) == ["accounting", "grid", "user-level plan"]
    assert all(_finite(row["wall_median"], row["cpu_median"]) and row["wall_median"] > 0 for row in rows.values())
    assert "--smoke" in r["settings"]["argv"] and "1000000" in rows["grid"]["argv"]
    assert isinstance(r["machine"]["python_dont_write_bytecode"], bool)


def _user_level(r: dict) -> None:
    arms = r["summary"]["arms"]
    assert sorted(arms) == ["1|example", "2|example", "2|unit"]
    assert all(a["audits_passed"] == a["runs"] == 1 for a in arms.values())
    assert all(0 <= run["auc"] <= 1 and run["noise_multiplier"] > 0 for run in r["runs"])
    assert r["summary"]["differences"]["2"]["beyond_seed_noise"] is False  # one seed: never a result


def _rr_information(r: dict) -> None:
    (c,) = r["cells"]
    assert c["shape"] == "mixed-ns" and c["epsilon"] == 8.0 and 0.98 < c["fisher_share"] < 1.0
    assert 0.9 * c["fisher_share"] * c["training_rows"] < c["rows"] <= c["training_rows"]
    assert _finite(c["share_above_ceiling"], c["rr_above_ceiling"]) and 0.5 < c["share_auc"] < 1


# script: (its markdown's table header, the check of its JSON); both files are named after the script
SCRIPTS = {
    "batch_selection": ("| epochs | target eps | Poisson (PLD) |", _batch_selection),
    "calibration": ("| method | noise multiplier | seconds | evaluations |", _calibration),
    "data_scale": ("| rows | users | synth s | synth peak MiB |", _data_scale),
    "distributed": ("| processes | eval AUC | relative AUC loss (%) |", _distributed),
    "dpsgd_step": ("| shape | batch | mode | step median (s) |", _dpsgd_step),
    "epoch_throughput": ("| shape | mode | steps | seconds | rows/s |", _epoch_throughput),
    "one_run_audit": ("| plan epsilon | canaries | model | DP-SGD optimiser | arm |", _one_run_audit),
    "planner": ("| command | tree | wall s | CPU s | wall ratio | CPU ratio | target wall s |", _planner),
    "paper_sizes": ("| processes | wall s | read s | encode s | DP-SGD s |", _paper_sizes),
    "reproduction": ("| comparison | model tensors | record fields | files | differences |", _reproduction),
    "rr_information": ("| shape | epsilon | F | base rate | clean share - ceiling | RR - ceiling |", _rr_information),
    "split_grid": ("| epsilon | alpha=0 | alpha=0.5 | alpha=1 |", _split_grid),
    "split_selection": ("| shape | epsilon | plan | epsilon per configuration |", _split_selection),
    "user_level": ("| K | sampling | noise multiplier | accounting | AUC |", _user_level),
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_smoke_run(script, tmp_path):
    header, check = SCRIPTS[script]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, f"benchmarks/{script}.py", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / f"{script}.json").read_text())
    assert result["settings"]["values"] and "--smoke" in result["settings"]["argv"]
    assert header in (tmp_path / f"{script}.md").read_text()
    check(result)


def test_a_smoke_run_refuses_to_write_over_the_results():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "benchmarks/batch_selection.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--smoke needs --out DIR" in proc.stderr
