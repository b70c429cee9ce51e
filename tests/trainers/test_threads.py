"""torch's CPU threads per run: the "auto" rule, explicit counts, refusals, and that a run
restores the caller's setting and records what it used."""

import json

import pytest

torch = pytest.importorskip("torch")

from budgetplan.errors import InvalidParameterError  # noqa: E402
from budgetplan.limits import MAX_THREADS  # noqa: E402
from trainers.threads import auto_threads, available_cpus, resolve_threads, torch_threads  # noqa: E402


@pytest.mark.parametrize("busy, expected", [(0.0, 4), (0.4, 4), (1.4, 3), (2.6, 1), (3.0, 1), (40.0, 1),
                                            (float("nan"), 4), (-1.0, 4)])
def test_auto_leaves_the_cores_others_are_using(busy, expected):
    assert auto_threads(cpus=4, busy=busy, environ={}) == expected


def test_auto_on_a_loaded_two_core_machine_is_one_thread():
    # the measured case: another job on one of two cores made torch's default 2-7x slower
    assert auto_threads(cpus=2, busy=1.0, environ={}) == 1
    assert auto_threads(cpus=2, busy=0.0, environ={}) == 2


@pytest.mark.parametrize("given, expected", [("3", 3), (" 1 ", 1), ("0", 2), ("many", 2), ("", 2)])
def test_auto_takes_omp_num_threads_when_the_environment_sets_it(given, expected):
    assert auto_threads(cpus=2, busy=0.0, environ={"OMP_NUM_THREADS": given}) == expected


def test_busy_elsewhere_reads_the_runnable_count_less_this_thread(tmp_path):
    from trainers.threads import busy_elsewhere

    path = tmp_path / "loadavg"
    path.write_text("1.92 1.40 1.09 3/412 20461\n")  # three runnable threads, this one among them
    assert busy_elsewhere(samples=3, interval=0.0, path=path) == 2.0
    path.write_text("0.00 0.01 0.05 1/300 1\n")
    assert busy_elsewhere(samples=1, path=path) == 0.0


def test_busy_elsewhere_sees_a_busy_process():
    import multiprocessing
    import time

    from trainers.threads import busy_elsewhere

    spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    spinner.start()
    try:
        time.sleep(1.0)  # the spawned interpreter is up and spinning
        assert busy_elsewhere(samples=20) >= 1.0  # the spinner is always runnable
    finally:
        spinner.terminate()
        spinner.join()


def _spin():
    while True:
        pass


def test_available_cpus_follows_a_cgroup_quota(tmp_path):
    import os

    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: one whole core
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cpus(tmp_path) == affinity
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cpus(v1) == affinity
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text(f"{100000 * (affinity + 8)}\n")  # a quota above the mask
    assert available_cpus(v1) == affinity
    assert available_cpus(tmp_path / "absent") == affinity


@pytest.mark.parametrize("bad", [0, -1, MAX_THREADS + 1, 1.5, True, "x", "2.0", float("nan")])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(InvalidParameterError, match="threads"):
        resolve_threads(bad)


def test_explicit_counts_and_auto_resolve(monkeypatch):
    assert resolve_threads(3) == 3 and resolve_threads("2") == 2
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for auto in ("auto", None):
        assert 1 <= resolve_threads(auto) <= available_cpus()
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert resolve_threads("auto") == 5


def test_the_callers_setting_is_restored_even_on_error():
    before = torch.get_num_threads()
    with torch_threads(1) as used:
        assert used == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_a_run_records_its_threads_and_restores_the_callers(tmp_path, runner):
    import pyarrow.parquet as pq

    from budgetplan.cli import cli
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import SYNTH_FEATURES, synthesize
    from trainers.demo import demo_scenario

    pq.write_table(synthesize(2000, 500, 3), tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(demo_scenario(epsilon=2.0, dataset_size=2000, spec=SYNTH_FEATURES, epochs=1)))
    (tmp_path / "plan.json").write_text(plan.to_json())
    common = ["train", str(tmp_path / "plan.json"), "--data", str(tmp_path / "train.parquet"), "--embedding-dim", "4"]
    before = torch.get_num_threads()
    out = runner.invoke(cli, [*common, "--out", str(tmp_path / "run"), "--threads", "1"])
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["timings"]["torch_threads"] == 1
    assert torch.get_num_threads() == before
    for bad in ("0", "abc", "1.5", "99999"):
        res = runner.invoke(cli, [*common, "--out", str(tmp_path / "x"), "--threads", bad])
        assert res.exit_code == 2 and "--threads" in res.stderr, bad
        assert res.stderr.strip().count("\n") == 0 and not (tmp_path / "x").exists()


def test_the_cli_default_is_the_api_default():
    import inspect

    from budgetplan.cli.train_cmds import demo, train
    from trainers.run import run_baseline
    from trainers.settings import RunOptions

    for command in (train, demo):
        assert {p.name: p.default for p in command.params}["threads"] == "auto"
    assert RunOptions().threads == "auto"  # execute_plan's options
    assert inspect.signature(run_baseline).parameters["threads"].default == "auto"
