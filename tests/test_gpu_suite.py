"""benchmarks/gpu_suite.py without a GPU: the plan of commands it would run on one, and its runner on tiny
stand-in commands (the concurrent steps together, each step killed at its limit, a failure or a skip leaving
the rest running, the budget, what comes back). Its whole run at the smallest sizes (``--device cpu
--smoke``) takes about 2 minutes on 2 cores and is not a test here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _script(stem: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    name = f"_benchmark_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{stem}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _args(step) -> list[str]:
    """A benchmark step's arguments after its script (``python benchmarks/x.py ARGS``)."""
    return list(step.command[2:])


# ------------------------------------------------------------------------------------ the plan


def test_the_cuda_plan_measures_what_issue_27_item_3_asks_in_its_order(tmp_path):
    suite = _script("gpu_suite")
    plan = {s.name: s for s in suite.steps("cuda", False, tmp_path)}
    assert list(plan) == ["synth", "gpu-tests", "reproduction", "epoch", "step", "paper"]
    assert [s.timed for s in plan.values()] == [False, False, False, True, True, True]  # untimed ones first
    assert plan["gpu-tests"].command[-1].endswith("tests/trainers/test_gpu.py") and "gpu" in plan["gpu-tests"].command
    for name, stem in (("reproduction", "reproduction"), ("epoch", "epoch_throughput"), ("step", "dpsgd_step"),
                       ("paper", "paper_sizes")):
        bench = _script(stem)
        args = bench.parse_args(_args(plan[name]))
        assert args.device == "cuda" and not args.smoke and args.out == tmp_path / "results", name
    step = _script("dpsgd_step").parse_args(_args(plan["step"]))
    assert sorted((s, b) for s, b, _ in step.todo) == [("attribution", 4096), ("attribution", 16384), ("pctr", 4096),
                                                       ("pctr", 16384)]
    assert {"non-private", "ours", "opacus-ghost"} <= set(step.mode_list)
    assert _script("harness").results_name("dpsgd_step", step.device) == "dpsgd_step_cuda"
    epoch = _script("epoch_throughput").parse_args(_args(plan["epoch"]))
    assert not epoch.skip_walr and not epoch.quick and epoch.shape_list == ["pctr", "attribution"]
    paper = _script("paper_sizes").parse_args(_args(plan["paper"]))
    synth = list(plan["synth"].command)
    assert paper.name == "paper_sizes_cuda" and paper.rows == 40_000_000 == int(synth[synth.index("--rows") + 1])
    assert int(synth[synth.index("--users") + 1]) == paper.rows // 5 and "pctr" in synth
    assert f"{paper.data}/" == synth[synth.index("--out") + 1] and plan["paper"].needs == "synth"


def test_the_smoke_plan_runs_every_step_small_on_a_cpu(tmp_path):
    suite = _script("gpu_suite")
    plan = {s.name: s for s in suite.steps("cpu", True, tmp_path)}
    for name, stem in (("reproduction", "reproduction"), ("epoch", "epoch_throughput"), ("step", "dpsgd_step"),
                       ("paper", "paper_sizes")):
        args = _script(stem).parse_args(_args(plan[name]))
        assert args.device == "cpu" and args.smoke, name
    assert _script("dpsgd_step").parse_args(_args(plan["step"])).todo  # --shapes would have emptied it
    synth = list(plan["synth"].command)
    assert int(synth[synth.index("--rows") + 1]) == _script("paper_sizes").parse_args(_args(plan["paper"])).rows


def test_the_header_states_each_steps_estimate_and_the_total_fits_the_budget(tmp_path):
    suite = _script("gpu_suite")
    plan = suite.steps("cuda", False, tmp_path)
    for s in plan:
        kind = "timed" if s.timed else "concurrent"
        assert f"``{s.name}`` ({kind}; {s.estimate:.0f} / {s.cap:.0f})" in suite.__doc__, s.name
        assert s.cap >= s.estimate
    total = 10 + suite.estimate(plan)  # the device check first
    assert f"About {total:.0f} s in all" in suite.__doc__ and total <= suite.BUDGET


def test_bad_arguments_are_refused_in_one_line(capsys):
    suite = _script("gpu_suite")
    for argv, needle in (([], "the output folder is required"),
                         (["o", "--only", "paper,nope"], "unknown step 'nope': the steps are synth, gpu-tests"),
                         (["o", "--device", "tpu"], "--device must be cuda, cuda:N or cpu, got 'tpu'"),
                         (["o", "--device", "cpu"], "--device cpu needs --smoke"),
                         (["o", "--budget", "nan"], "--budget must be a positive number of seconds, got nan")):
        with pytest.raises(SystemExit) as stop:
            suite.parse_args(argv)
        assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_dry_run_prints_the_commands_and_makes_nothing(tmp_path, capsys):
    suite = _script("gpu_suite")
    assert suite.main([str(tmp_path / "out"), "--dry-run", "--skip", "gpu-tests", "--work", str(tmp_path / "w")]) == 0
    text = capsys.readouterr().out
    assert "benchmarks/dpsgd_step.py --device cuda" in text and "gpu-tests" not in text
    assert "paper (timed, estimate 180 s, cap 300 s, needs synth)" in text
    assert not (tmp_path / "out").exists() and not (tmp_path / "w").exists()


def test_the_device_check_names_what_stops_the_suite():
    suite = _script("gpu_suite")
    ok = {"missing": [], "missing_optional": [], "torch": "2.11", "cuda": True}
    assert suite.stop_reason(ok, "cuda") is None
    assert "no CUDA device here (torch 2.11" in suite.stop_reason({**ok, "cuda": False}, "cuda")
    assert suite.stop_reason({**ok, "cuda": False}, "cpu") is None
    missing = suite.stop_reason({**ok, "missing": ["dp_accounting"]}, "cuda")
    assert "missing Python packages dp_accounting" in missing and "--prepare" in missing
    assert "the device probe failed: boom" in suite.stop_reason({"error": "boom"}, "cuda")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the probe imports torch")
def test_without_cuda_the_suite_stops_at_once_with_exit_2(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    suite = _script("gpu_suite")
    monkeypatch.setattr(suite, "REQUIRED", ("torch",))
    monkeypatch.setattr(suite, "OPTIONAL", ())
    assert suite.main([str(tmp_path / "out"), "--work", str(tmp_path / "w")]) == 2
    log = (tmp_path / "out" / "suite.log").read_text()
    assert "gpu_suite: no CUDA device here" in log and "started" not in log
    state = json.loads((tmp_path / "out" / "suite.json").read_text())
    assert state["steps"] == [] and "no CUDA device" in state["stopped"] and state["device"]["cuda"] is False


# ---------------------------------------------------------------------------------- the runner


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def _run(suite, tmp_path, todo, budget=60.0):
    log = suite.Log(tmp_path / "out", tmp_path / "work")
    (tmp_path / "work").mkdir(exist_ok=True)
    status = suite.run_steps(todo, log=log, budget=budget, env=suite.environment(), memory=suite.GpuMemory(False),
                             poll_seconds=0.05)
    return status, log


def test_concurrent_steps_run_together_then_timed_ones_alone(tmp_path):
    suite = _script("gpu_suite")
    mark = tmp_path / "work" / "order"
    sleep = "import time, pathlib; time.sleep(0.6); pathlib.Path({!r}).open('a').write({!r})"
    todo = [suite.Step("a", _py(sleep.format(str(mark), "a")), 1, 10, timed=False),
            suite.Step("b", _py(sleep.format(str(mark), "b")), 1, 10, timed=False),
            suite.Step("t", _py(f"import pathlib; pathlib.Path({str(mark)!r}).open('a').write('t')"), 1, 10,
                       timed=True)]
    t0 = time.monotonic()
    status, log = _run(suite, tmp_path, todo)
    assert status == {"a": "ok", "b": "ok", "t": "ok"}
    assert time.monotonic() - t0 < 1.1  # a and b side by side, not one after the other
    assert sorted(mark.read_text()[:2]) == ["a", "b"] and mark.read_text()[2] == "t"  # t after both


def test_a_step_past_its_limit_is_killed_with_its_children_and_the_rest_still_run(tmp_path):
    suite = _script("gpu_suite")
    late = tmp_path / "late"
    # a grandchild that would write after 2 s: killed with its process group
    grandchild = tmp_path / "grandchild.py"
    grandchild.write_text(f"import time, pathlib\ntime.sleep(2)\npathlib.Path({str(late)!r}).write_text('x')\n")
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, {str(grandchild)!r}]); time.sleep(30)"
    todo = [suite.Step("slow", _py(child), 0.4, 0.5, timed=True),
            suite.Step("fails", _py("print('boom'); raise SystemExit(3)"), 1, 10, timed=True),
            suite.Step("after", _py("pass"), 1, 10, timed=True, needs="fails"),
            suite.Step("last", _py("pass"), 1, 10, timed=True)]
    status, log = _run(suite, tmp_path, todo)
    assert status == {"slow": "timed out", "fails": "failed", "after": "skipped", "last": "ok"}
    time.sleep(2.2)
    assert not late.exists()
    text = log.path.read_text()
    assert "slow: timed out (killed at its limit of 0 s)" in text
    assert "fails: failed (exit status 3)" in text and "    | boom" in text
    assert "after: skipped (needs fails, which failed)" in text
    rows = {r["name"]: r for r in json.loads((tmp_path / "out" / "suite.json").read_text())["steps"]}
    assert rows["slow"]["seconds"] < 5 and rows["fails"]["returncode"] == 3


def test_a_step_with_less_than_half_its_estimate_left_is_skipped(tmp_path):
    suite = _script("gpu_suite")
    todo = [suite.Step("first", _py("import time; time.sleep(0.3)"), 0.1, 10, timed=True),
            suite.Step("big", _py("pass"), 100, 300, timed=True),
            suite.Step("small", _py("pass"), 0.2, 300, timed=True)]
    status, log = _run(suite, tmp_path, todo, budget=2.0)
    assert status == {"first": "ok", "big": "skipped", "small": "ok"}
    assert "of the budget left, estimate 100 s" in log.path.read_text()
    rows = {r["name"]: r for r in json.loads((tmp_path / "out" / "suite.json").read_text())["steps"]}
    assert rows["small"]["limit_seconds"] < 2.0  # what was left of the budget, not its cap of 300 s


def test_what_comes_back_is_the_results_and_logs_not_the_data(tmp_path):
    suite = _script("gpu_suite")
    write = ("import pathlib; r = pathlib.Path({!r}); r.mkdir(parents=True, exist_ok=True); "
             "(r / 'x_cuda.json').write_text('{{}}'); (r / 'x_cuda.md').write_text('# x')")
    data = ("import pathlib; d = pathlib.Path({!r}); d.mkdir(parents=True, exist_ok=True); "
            "(d / 'meta.json').write_text('{{}}'); (d / 'big.log').write_text('x' * 5_000_000)")
    todo = [suite.Step("data", _py(data.format(str(tmp_path / "work" / "data"))), 1, 10, timed=False),
            suite.Step("results", _py(write.format(str(tmp_path / "work" / "results"))), 1, 10, timed=True)]
    status, _ = _run(suite, tmp_path, todo)
    assert status == {"data": "ok", "results": "ok"}
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"results/x_cuda.json", "results/x_cuda.md", "logs/data.log", "logs/results.log"} <= names
    assert not any(n.startswith("data/") for n in names)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.tar.gz", "suite.json", "suite.log"]
    (tmp_path / "work" / "huge.log").write_text("y" * (suite.BUNDLE_FILE_LIMIT + 1))
    assert suite.bundle(tmp_path / "work", tmp_path / "again.tar.gz") == ["huge.log"]


# ---------------------------------------------------------------------------------- --prepare


def test_prepare_copies_the_packages_the_gpu_image_lacks_and_the_commit(tmp_path):
    suite = _script("gpu_suite")
    for name in suite.PREPARED:
        pytest.importorskip(name.replace("-", "_"))
    copied = suite.prepare(tmp_path / "prep")
    site = tmp_path / "prep" / "site"
    assert [c.split()[0] for c in copied] == list(suite.PREPARED)
    for module in ("opacus", "dp_accounting", "prv_accountant"):
        assert (site / module / "__init__.py").is_file()
    assert len(list(site.glob("*.dist-info"))) == len(suite.PREPARED)  # importlib.metadata finds their versions
    assert not list(site.rglob("__pycache__")) and not list(site.rglob("*.pyc"))
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert json.loads((tmp_path / "prep" / "provenance.json").read_text())["commit"] == head


def test_the_steps_record_the_commit_a_copy_without_git_was_made_at(tmp_path, monkeypatch):
    suite, harness = _script("gpu_suite"), _script("harness")
    (tmp_path / "site").mkdir()
    (tmp_path / "provenance.json").write_text(json.dumps({"commit": "c0ffee", "dirty": True}))
    monkeypatch.setattr(suite, "PREPARED_DIR", tmp_path)
    env = suite.environment()
    assert env["PYTHONPATH"].split(":")[:2] == [str(ROOT), str(tmp_path / "site")]
    monkeypatch.setenv(harness.PROVENANCE, env["BENCHMARK_PROVENANCE"])
    assert harness.settings_record("x.py", [], {})["commit"] != "c0ffee"  # git is here: git says
    monkeypatch.setattr(harness, "_git", lambda *args: None)  # a copy without its git directory
    record = harness.settings_record("x.py", [], {})
    assert (record["commit"], record["dirty"]) == ("c0ffee", True)
    monkeypatch.delenv(harness.PROVENANCE)
    assert harness.settings_record("x.py", [], {})["commit"] is None


def test_the_paper_step_trains_on_cuda_with_the_gpus_chunk_and_reads_back_without_one(monkeypatch):
    torch = pytest.importorskip("torch")
    import trainers.run
    from trainers.dpsgd import GPU_MAX_CHUNK

    paper = _script("paper_sizes")
    # what a CUDA run's results file records, computed on a machine without CUDA (tests/test_benchmark_settings.py)
    values = paper.settings(paper.parse_args(["--device", "cuda"]))["values"]
    assert values["dpsgd_settings"]["max_chunk"] == GPU_MAX_CHUNK and values["training"]["device"] == "cuda"
    # on a GPU: the train command's options build exactly the recorded settings (it stops the run otherwise)
    monkeypatch.setattr(trainers.run, "resolve_device", lambda name: torch.device("cuda"))
    options = paper._train_options(*paper._train_settings("cuda"))
    assert options[options.index("--device") + 1] == "cuda"


def test_a_suite_stopped_from_outside_kills_what_runs_and_records_it(tmp_path):
    suite = _script("gpu_suite")
    calls = iter(range(10**6))

    def clock():  # the stop (SIGTERM raises SystemExit in main) arrives while the step runs
        if next(calls) == 5:
            raise KeyboardInterrupt
        return time.monotonic()

    log = suite.Log(tmp_path / "out", tmp_path / "work")
    step = suite.Step("long", _py("import time; time.sleep(30)"), 1, 60, timed=True)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        suite.run_steps([step], log=log, budget=60, env=suite.environment(), memory=suite.GpuMemory(False),
                        clock=clock, poll_seconds=0.05)
    assert time.monotonic() - t0 < 10
    (row,) = json.loads((tmp_path / "out" / "suite.json").read_text())["steps"]
    assert (row["status"], row["reason"]) == ("interrupted", "the suite was stopped") and row["returncode"] < 0
