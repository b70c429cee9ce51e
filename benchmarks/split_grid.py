"""The Hybrid split grid of issue #3: 7 total epsilons x 5 alphas, timed end to end.

`budgetplan split --rule grid` over the paper's epsilons (1, 3, 5, 10, 20, 30, 50) and
alphas (0, .25, .5, .75, 1) on the Criteo pCTR shape (N = 32M, batch 16,384, 3 epochs,
delta = 1e-8, replace-one), run through the CLI in-process as a user would. The target is
under 15 s on a 2-core machine. Writes ``benchmarks/results/split_grid.json`` and ``.md``.
Not a test: run it with ``python benchmarks/split_grid.py`` (``--smoke --out DIR``: a 2 x 3 grid at 1M rows, one round).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import harness as h

RESULTS = h.RESULTS
ARGS = ["split", "--rule", "grid", "--delta", "1e-8", "--dataset-size", "32000000", "--batch-size", "16384",
        "--epochs", "3", "--json"]
TARGET_SECONDS = 15.0
# --smoke: the same command on a 2 x 3 grid (a phase-less RR cell, DP-SGD-only and Hybrid ones) at 1M rows, one round
SMOKE_GRID = {"epsilons": [1.0, 8.0], "alphas": [0.0, 0.5, 1.0]}
SMOKE_ARGS = [*(x for k, v in SMOKE_GRID.items() for x in (f"--{k}", ",".join(f"{e:g}" for e in v))),
              "--dataset-size", "1000000"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed runs, each from cleared caches")
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    args.argv = list(argv)
    h.apply_smoke(parser, args, argv, {"rounds": 1})
    # later options win: the smoke's grid and size replace the paper's
    args.command = ARGS + (SMOKE_ARGS if args.smoke else [])
    return args


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the grid, the CLI's defaults read from the library."""
    from budgetplan.accounting.account import DEFAULT_DISCRETIZATION
    from budgetplan.planning import calibrate
    from budgetplan.scenario.split_rules import PAPER_ALPHAS, PAPER_EPSILONS

    return h.settings_record("split_grid.py", args.argv, {
        "command": args.command, **(SMOKE_GRID if args.smoke else {"epsilons": PAPER_EPSILONS, "alphas": PAPER_ALPHAS}),
        "adjacency": "replace-one",
        "accountant": "pld", "discretization": DEFAULT_DISCRETIZATION,
        "relative_tolerance": calibrate.REL_TOL, "target_seconds": TARGET_SECONDS, "rounds": args.rounds,
        "jobs": "auto (the CLI's default: the free CPUs, in separate processes)"})


def main(argv: list[str]) -> None:
    from click.testing import CliRunner

    from budgetplan.cli import cli

    args = parse_args(argv)

    load_before, times = os.getloadavg()[0], []
    for _ in range(args.rounds):
        h.clear_pld_caches()  # nothing carried over between rounds
        t0 = time.perf_counter()
        result = CliRunner().invoke(cli, args.command)
        times.append(time.perf_counter() - t0)
        if result.exit_code != 0:
            raise SystemExit(result.output)
    seconds = statistics.median(times)
    grid = json.loads(result.stdout)
    out = {"settings": settings(args), "command": "budgetplan " + " ".join(args.command), "seconds": seconds,
           "seconds_all": times, "target_seconds": TARGET_SECONDS, "cells": len(grid["results"]),
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "load_average_1min_before": load_before, "load_average_1min_after": os.getloadavg()[0]},
           "results": grid["results"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "split_grid.json").write_text(json.dumps(out, indent=2) + "\n")
    alphas = sorted({c["rule"] for c in grid["results"]}, key=lambda r: float(r.split("=")[1]))
    m = out["machine"]
    lines = ["# Split grid benchmark", "", f"`{out['command']}`: {seconds:.1f} s for {out['cells']} cells "
             f"(median of {len(times)} runs from cleared caches, {min(times):.1f}-{max(times):.1f} s; target < 15 s), "
             f"{m['cpus']} CPUs, load average (1 min) {m['load_average_1min_before']:.2f} before and "
             f"{m['load_average_1min_after']:.2f} after.", "", "Noise multiplier of the DP-SGD phase "
             "(rows: total epsilon; columns: alpha = eps1 / eps; - : no DP-SGD phase):", "",
             "| epsilon | " + " | ".join(alphas) + " |", "|---" * (len(alphas) + 1) + "|"]
    by = {(c["epsilon"], c["rule"]): c["noise_multiplier"] for c in grid["results"]}
    for eps in sorted({c["epsilon"] for c in grid["results"]}):
        cells = [f"{by[(eps, a)]:.4f}" if by[(eps, a)] is not None else "-" for a in alphas]
        lines.append(f"| {eps:g} | " + " | ".join(cells) + " |")
    lines += ["", h.settings_markdown(out["settings"])]
    (args.out / "split_grid.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1:])
