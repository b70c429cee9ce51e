"""torch's CPU threads against the machine's load: the evidence behind ``--threads auto``.

Two conditions: ``idle`` (once the 1-minute load average has fallen below ``--idle-below``,
waiting at most 5 minutes), and ``loaded``: one busy process on every
CPU but one, as when another job shares the machine. In each, the same two runs at each
thread count (1; every CPU, torch's own default; and ``auto``, resolved by the run itself
after the load average has had ``--settle`` seconds to see the busy processes):

- ``non-private``: ``run_baseline`` for ``--epochs`` full epochs (no early stop) on
  ``--rows`` rows of the balanced synthetic shape;
- ``dp-sgd``: ``execute_plan`` of a plain DP-SGD plan (one epoch at batch 4,096, C = 5) on
  the same rows.

Reported: median wall seconds over ``--rounds`` (min and max beside it), each count's ratio
to one thread, the count ``auto`` chose, and the load average at each condition's start
and end. Not a test: ``python benchmarks/threads.py`` (about 15 minutes on 2 cores); writes
``results/threads.json`` and ``.md``.

Pinned at what ``results/threads.json`` was measured with: the DP-SGD step size 0.01 (the
default then; the automatic 0.12 / sqrt(T) came later, and the time a step takes does not
depend on it), and the DP-SGD plan as planned then: the scenario it records, with
calibration off (``[calibration]`` was opt-in then; ``harness.as_planned_then``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness as h

WORKLOADS = ("non-private", "dp-sgd")
SHAPE = "balanced"
DPSGD_LR = 0.01  # the DP-SGD step size results/threads.json was timed at (a step's time does not depend on it)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=1, help="non-private epochs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=60.0,
                    help="seconds the busy processes run before the loaded measurements")
    ap.add_argument("--idle-below", type=float, default=0.5,
                    help="before the idle condition, wait (at most 5 minutes) for the 1-minute load average to "
                    "fall below this")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    for what, value in (("--rows", args.rows), ("--epochs", args.epochs), ("--rounds", args.rounds)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not 0 <= args.settle < float("inf"):
        ap.error(f"--settle must be a finite number of seconds >= 0, got {args.settle!r}")
    if not 0 <= args.idle_below < float("inf"):
        ap.error(f"--idle-below must be a finite load >= 0, got {args.idle_below!r}")
    return args


def _cpus() -> int:
    from trainers.threads import available_cpus

    return available_cpus()


def _train_settings(args):
    """(TrainSettings, DPSGDSettings, BaselineSettings) of every run: the DP-SGD step size pinned."""
    from trainers.baseline import BaselineSettings
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    return (TrainSettings(), DPSGDSettings(lr=DPSGD_LR),
            BaselineSettings(max_epochs=args.epochs, patience=args.epochs))


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    training, dpsgd, baseline = _train_settings(args)
    return h.settings_record("threads.py", args.argv, {
        "rows": args.rows, "shape": get_shape(SHAPE).parameters(), "epochs": args.epochs, "rounds": args.rounds,
        "settle_seconds": args.settle, "idle_below": args.idle_below, "threads": ["1", "every CPU", "auto"],
        "workloads": list(WORKLOADS),
        # a DP-SGD-only plan (and the non-private baseline) reads no RR setting
        "scenario": _scenario(args.rows), "training": h.without_rr(training.to_dict()),
        "dpsgd_settings": dpsgd.to_dict(), "baseline": baseline.to_dict()})


def _scenario(n: int) -> str:
    from trainers.data.synth import get_shape

    return f"""name = "threads"
[budget]
epsilon = 8.0
delta = 1e-7
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = {n}
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = {min(4096, max(1, n // 4))}
epochs = 1
clipping_norm = 5.0
{get_shape(SHAPE).features.to_toml()}"""


def _wait_idle(below: float, most: float = 300.0) -> None:
    """Wait until the 1-minute load average is below ``below`` (at most ``most`` seconds)."""
    end = time.monotonic() + most
    while os.getloadavg()[0] >= below and time.monotonic() < end:
        time.sleep(5.0)


def _spin() -> None:
    while True:
        pass


def _measure(args, path: Path, plan, threads) -> dict:
    from trainers.run import RunOptions, execute_plan, run_baseline

    training, dpsgd, baseline = _train_settings(args)
    out = {}
    for workload in WORKLOADS:
        times, used = [], None
        for r in range(args.rounds):
            t0 = time.perf_counter()
            if workload == "non-private":
                rec = run_baseline(plan, path, settings=training, baseline=baseline, seed=r, threads=threads)
            else:
                rec = execute_plan(plan, path, RunOptions(settings=training, dpsgd_settings=dpsgd, seed=r,
                                                          threads=threads))
            times.append(time.perf_counter() - t0)
            used = rec.timings.get("torch_threads")
        out[workload] = {"threads_used": used, "seconds": times, "median": statistics.median(times),
                         "min": min(times), "max": max(times)}
    return out


def run(args) -> dict:
    import pyarrow.parquet as pq

    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import synthesize

    cpus = _cpus()
    counts = [("1", 1), ("every CPU", cpus), ("auto", "auto")]
    work = Path(tempfile.mkdtemp(prefix="threads-"))
    path = work / "train.parquet"
    pq.write_table(synthesize(args.rows, max(1, args.rows // 5), 7, shape=SHAPE), path)
    plan = build_plan(parse_scenario(h.as_planned_then(_scenario(args.rows))))  # the plan measured (docstring)
    result: dict = {"settings": settings(args), "cpus": cpus, "conditions": {}}
    context = multiprocessing.get_context("fork")
    with h.progress() as bar:
        task = bar.add_task("threads", total=2 * len(counts))
        for condition in ("idle", "loaded"):
            spinners = [context.Process(target=_spin, daemon=True) for _ in range(cpus - 1 if condition == "loaded"
                                                                                  else 0)]
            for p in spinners:
                p.start()
            try:
                if spinners:
                    bar.update(task, description=f"{len(spinners)} busy processes settling")
                    time.sleep(args.settle)
                else:
                    bar.update(task, description=f"waiting for the load average to fall below {args.idle_below}")
                    _wait_idle(args.idle_below)
                rows = {"load_before": os.getloadavg()[0], "busy_processes": len(spinners), "by_threads": {}}
                for label, threads in counts:
                    bar.update(task, description=f"{condition}: {label} threads")
                    rows["by_threads"][label] = _measure(args, path, plan, threads)
                    bar.advance(task)
                rows["load_after"] = os.getloadavg()[0]
            finally:
                for p in spinners:
                    p.terminate()
                    p.join()
            result["conditions"][condition] = rows
    result["machine"] = h.machine()
    return result


def render(result: dict) -> str:
    lines = ["# torch threads against the machine's load", "",
             f"{result['cpus']} CPUs available. Median wall seconds over the rounds (min-max), and the ratio to one "
             "thread (above 1: slower). `loaded`: a busy process on every CPU but one. `auto` is what "
             "`--threads auto` (the default) chose in that condition.", "",
             "| condition | workload | threads | used | seconds | vs 1 thread |", "|---|---|---|---|---|---|"]
    for condition, rows in result["conditions"].items():
        for workload in WORKLOADS:
            one = rows["by_threads"]["1"][workload]["median"]
            for label, by in rows["by_threads"].items():
                w = by[workload]
                lines.append(f"| {condition} | {workload} | {label} | {w['threads_used']} | {w['median']:.1f} "
                             f"({w['min']:.1f}-{w['max']:.1f}) | {w['median'] / one:.2f}x |")
    lines += ["", "Load average (1 min) at the start and end of each condition: " + "; ".join(
        f"{c} {r['load_before']:.2f} -> {r['load_after']:.2f}" for c, r in result["conditions"].items()) + ".", "",
        h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, "threads", result, render))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
