"""The planner's three timings of issue 27: the 35-cell split grid, one accounting, the user-level plan.

Each is a ``python -m budgetplan ...`` command run in a fresh interpreter, as a user runs it
(so the imports are counted), timed by wall clock and by the CPU seconds of the child
processes (less sensitive to other users of the machine; the grid's calibrations run in
worker processes, whose CPU is summed):

* ``grid``: ``split --rule grid --delta 1e-7`` on the Criteo pCTR shape (N = 32M, batch
  16,384, 3 epochs): 7 epsilons x 5 alphas (target under 8 s on 2 cores);
* ``accounting``: ``dpsgd --noise-multiplier 1 --sampling-rate 0.01 --steps 1000
  --delta 1e-6`` (as ``--dataset-size 100000 --batch-size 1000``; target under 0.5 s);
* ``user-level plan``: ``plan example:dpsgd-user-level`` (target under 30 s).

``--baseline DIR`` times the same commands from another source tree (a checkout of the
previous release) in the same rounds, alternating with this one, so the two are measured
side by side under the same load. Writes ``benchmarks/results/planner.json`` and ``.md``.
Not a test: run it with ``python benchmarks/planner.py`` (``--smoke --out DIR``: a 2 x 2
grid at 1M rows, the accounting, and the user-level scenario at 1M rows, one round).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness as h

ROOT = Path(__file__).resolve().parent.parent
GRID = ["split", "--rule", "grid", "--delta", "1e-7", "--dataset-size", "32000000", "--batch-size", "16384",
        "--epochs", "3", "--json"]
SMOKE_GRID = ["--epsilons", "1,8", "--alphas", "0,0.5", "--dataset-size", "1000000"]
ACCOUNTING = ["dpsgd", "--noise-multiplier", "1", "--dataset-size", "100000", "--batch-size", "1000", "--steps",
              "1000", "--delta", "1e-6", "--json"]
USER_LEVEL = ["plan", "example:dpsgd-user-level", "-o", "{tmp}/plan.json"]
TARGETS = {"grid": 8.0, "accounting": 0.5, "user-level plan": 30.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each command")
    parser.add_argument("--baseline", type=Path, help="another source tree to time side by side")
    parser.add_argument("--baseline-label", default=None, help="what the baseline tree is (a commit, a release)")
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    args.argv = list(argv)
    h.apply_smoke(parser, args, argv, {"rounds": 1})
    return args


def commands(smoke: bool, tmp: str) -> dict[str, list[str]]:
    """The three commands; at --smoke the grid and the plan at 1M rows (later options win)."""
    plan = [a.format(tmp=tmp) for a in USER_LEVEL]
    if smoke:
        scenario = Path(tmp) / "user-level-1m.toml"
        text = (ROOT / "budgetplan/scenario/examples/dpsgd-user-level.toml").read_text()
        scenario.write_text(text.replace("dataset_size = 32000000", "dataset_size = 1000000"))
        plan[1] = str(scenario)
    return {"grid": GRID + (SMOKE_GRID if smoke else []), "accounting": ACCOUNTING, "user-level plan": plan}


def timed(tree: Path, argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the children) of ``python -m budgetplan argv`` run from ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "budgetplan", *argv], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=1200)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"budgetplan {' '.join(argv)} failed in {tree}: {proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the run: the commands as templates ({tmp}: a fresh temporary folder)."""
    todo = {"grid": GRID + (SMOKE_GRID if args.smoke else []), "accounting": ACCOUNTING,
            "user-level plan": ["plan", "example:dpsgd-user-level at 1M rows" if args.smoke else
                                "example:dpsgd-user-level", *USER_LEVEL[2:]]}
    return h.settings_record("planner.py", args.argv, {
        "commands": {k: " ".join(v) for k, v in todo.items()}, "rounds": args.rounds,
        "baseline": str(args.baseline) if args.baseline else None, "baseline_label": args.baseline_label,
        "targets_seconds": TARGETS})


def run(args: argparse.Namespace) -> dict:
    if args.baseline is not None and not (args.baseline / "budgetplan" / "__init__.py").is_file():
        raise SystemExit(f"--baseline must be a source tree holding budgetplan/, got {str(args.baseline)!r}")
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        todo = commands(args.smoke, tmp)
        times: dict[str, dict[str, list[tuple[float, float]]]] = {t: {c: [] for c in todo} for t in trees}
        for _ in range(args.rounds):
            for name, argv in todo.items():
                for tree_name, tree in trees.items():  # alternating: the same load for both
                    times[tree_name][name].append(timed(tree, argv))
    rows = []
    for tree_name in trees:
        for name, argv in todo.items():
            walls = [w for w, _ in times[tree_name][name]]
            cpus = [c for _, c in times[tree_name][name]]
            rows.append({"tree": tree_name, "command": name, "argv": [a.replace(tmp, "{tmp}") for a in argv],
                         "wall_median": statistics.median(walls),
                         "cpu_median": statistics.median(cpus), "wall_all": walls, "cpu_all": cpus,
                         "target_seconds": TARGETS[name]})
    return {"settings": settings(args),
            "machine": h.machine() | {"load_average_1min_before": load_before,
                                      "load_average_1min_after": os.getloadavg()[0],
                                      # set here: every run compiles budgetplan's sources (no cached bytecode)
                                      "python_dont_write_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))},
            "rows": rows}


def render(r: dict) -> str:
    m = r["machine"]
    lines = ["# Planner benchmark", "",
             f"Each command in a fresh interpreter (imports counted), median of {r['settings']['values']['rounds']} "
             f"run(s); {m['cpus']} CPUs, load average (1 min) {m['load_average_1min_before']:.2f} before and "
             f"{m['load_average_1min_after']:.2f} after. CPU seconds are the children's user + system time "
             "(the grid's worker processes included); on a loaded machine they move less than wall time. "
             "Ratios: this tree's median over the baseline's, the two timed alternately under the same load.", "",
             "| command | tree | wall s | CPU s | wall ratio | CPU ratio | target wall s |",
             "|---|---|---|---|---|---|---|"]
    base = {row["command"]: row for row in r["rows"] if row["tree"] == "baseline"}
    for row in r["rows"]:
        ref = base.get(row["command"]) if row["tree"] == "this tree" else None
        ratios = (f"{row['wall_median'] / ref['wall_median']:.2f} | {row['cpu_median'] / ref['cpu_median']:.2f}"
                  if ref else "- | -")
        lines.append(f"| {row['command']} | {row['tree']} | {row['wall_median']:.2f} | {row['cpu_median']:.2f} "
                     f"| {ratios} | {row['target_seconds']:g} |")
    lines += ["", h.settings_markdown(r["settings"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    args.name = "planner"
    h.run_and_save(args, run, render)


if __name__ == "__main__":
    main(sys.argv[1:])
