"""The utility frontier of the Hybrid paper's tables: RR, DP-SGD and Hybrid against epsilon.

For each seed: synthesise semi-sensitive ads data (``trainers.data.synth``), hold out a
fifth of the users, train the non-private baseline (all features), then for every total
epsilon of the paper's grid (1, 3, 5, 10, 20, 30, 50) plan and train the three arms of one
plan family: RR (Hybrid with alpha = 1: the truncated model on randomised labels), DP-SGD
(alpha = 0: all features) and Hybrid (the paper-v1 split, eps1 = min(0.6 eps, 3)), all
semi-sensitive DP (replace-one) per impression with delta = 0.1/N. The table has the
paper's layout: rows epsilon, columns RR, DP-SGD, Hybrid, each the relative AUC loss (%)
against the baseline as mean +- std over the seeds.

Not a test: ``python benchmarks/utility_frontier.py`` (minutes on CPU at the defaults;
``--quick`` for a smoke run; ``--rows``/``--device cuda`` toward the paper's sizes).
Writes benchmarks/results/utility_frontier.json and .md, and the frontier PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
EPSILONS = (1.0, 3.0, 5.0, 10.0, 20.0, 30.0, 50.0)
ARMS = (("RR", "alpha=1"), ("DP-SGD", "alpha=0"), ("Hybrid", "paper-v1"))


def scenario(*, epsilon: float, split: str, n: int, spec, dpsgd_batch: int, dpsgd_epochs: int, rr_epochs: int) -> str:
    return f"""name = "frontier-{split}-eps{epsilon:g}"
[budget]
epsilon = {epsilon!r}
delta = "0.1/N"
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = {n}
[algorithm]
name = "hybrid"
split = "{split}"
tower = "fine-tune"
[rr]
epochs = {rr_epochs}
batch_size = 1024
[dpsgd]
batch_size = {dpsgd_batch}
epochs = {dpsgd_epochs}
clipping_norm = 1.0
{spec.to_toml()}"""


def main() -> None:
    import numpy as np
    import pyarrow.parquet as pq

    from budgetplan.planner import build_plan
    from budgetplan.plots import frontier, plot_frontier
    from budgetplan.scenario import parse_scenario
    from trainers.baseline import reference
    from trainers.data.synth import SYNTH_FEATURES, synthesize
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings, execute_plan, run_baseline

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--users", type=int, default=40_000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--dpsgd-batch", type=int, default=2048)
    ap.add_argument("--dpsgd-epochs", type=int, default=3)
    ap.add_argument("--dpsgd-lr", type=float, default=3e-2, help="Adam, DP-SGD phase")
    ap.add_argument("--rr-epochs", type=int, default=3)
    ap.add_argument("--hash-bins", type=int, default=4096,
                    help="rows per hashed table: the synthetic features have at most a few thousand values, and "
                         "DP-SGD noises every row of a table, so oversized tables cost utility")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true", help="30k rows, epsilons 1, 10, 50, two seeds")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.users, args.seeds, args.epsilons = 30_000, 6_000, 2, "1,10,50"
    epsilons = [float(e) for e in args.epsilons.split(",")]
    settings = TrainSettings(device=args.device, hash_bins_nonsensitive=args.hash_bins,
                             hash_bins_sensitive=args.hash_bins)
    dp = DPSGDSettings(optimizer="adam", lr=args.dpsgd_lr)
    work = Path(tempfile.mkdtemp(prefix="frontier-"))
    rows, baselines, t0 = [], [], time.perf_counter()
    for seed in range(args.seeds):
        table = synthesize(args.rows, args.users, 1000 + seed)
        users = table.column(SYNTH_FEATURES.unit_id).to_numpy().astype(np.uint64)
        held = (users * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0
        root = work / f"seed{seed}"
        root.mkdir()
        pq.write_table(table.filter(~held), root / "train.parquet")
        pq.write_table(table.filter(held), root / "eval.parquet")
        n = int((~held).sum())
        plans = {(arm, eps): build_plan(parse_scenario(scenario(
            epsilon=eps, split=split, n=n, spec=SYNTH_FEATURES, dpsgd_batch=args.dpsgd_batch,
            dpsgd_epochs=args.dpsgd_epochs, rr_epochs=args.rr_epochs))) for arm, split in ARMS for eps in epsilons}
        base = run_baseline(next(iter(plans.values())), root / "train.parquet", eval_path=root / "eval.parquet",
                            settings=settings)
        base_auc, tolerance = reference(base)
        baselines.append(base_auc)
        runs = []
        for (arm, eps), plan in plans.items():
            out = root / f"{arm}-{eps:g}"
            execute_plan(plan, root / "train.parquet", eval_path=root / "eval.parquet", out_dir=out,
                         settings=settings, dpsgd_settings=dp, baseline_auc=base_auc,
                         baseline_tolerance=tolerance)
            runs.append(out)
            print(f"seed {seed} {arm:7s} eps {eps:g}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
        for r in frontier(runs):
            r["seed"] = seed
            r["arm"] = {"RR": "RR", "DP-SGD": "DP-SGD", "Hybrid": "Hybrid"}[r["arm"]]
            rows.append(r)
    seconds = time.perf_counter() - t0
    table = {}
    for eps in epsilons:
        for arm, _ in ARMS:
            vals = [r["relative_auc_loss"] for r in rows if r["epsilon"] == eps and r["arm"] == arm]
            table[(eps, arm)] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
    RESULTS.mkdir(exist_ok=True)
    plot_frontier(rows, RESULTS / "utility_frontier.png",
                  title=f"relative AUC loss, synthetic data ({args.rows:,} rows, {args.seeds} seeds)")
    out = {"rows": args.rows, "users": args.users, "seeds": args.seeds, "epsilons": epsilons,
           "arms": {a: s for a, s in ARMS}, "baseline_auc": baselines, "seconds": seconds,
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": settings.device},
           "runs": rows,
           "table": {f"{e:g}": {a: {"mean": table[(e, a)][0], "std": table[(e, a)][1]} for a, _ in ARMS}
                     for e in epsilons}}
    (RESULTS / "utility_frontier.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["# Utility frontier (synthetic data)", "",
             f"Relative AUC loss (%) against the non-private model with all features, mean +- std over "
             f"{args.seeds} seeds; {args.rows:,} synthetic rows ({args.users:,} users), a fifth of the users held "
             f"out; semi-sensitive DP per impression, delta = 0.1/N. RR = Hybrid alpha 1 (truncated model), "
             f"DP-SGD = alpha 0, Hybrid = paper-v1 split. Two-tower MLP (embedding 8, 128 / 128-64 units, "
             f"{args.hash_bins}-row hashed tables); RR and baseline Adam 1e-3, {args.rr_epochs} epochs; DP-SGD "
             f"Adam {args.dpsgd_lr:g}, batch {args.dpsgd_batch}, {args.dpsgd_epochs} epochs, C = 1, tower "
             f"fine-tuned. Baseline AUC "
             f"{statistics.fmean(baselines):.4f}. {seconds:.0f} s on {os.cpu_count()} CPUs.", "",
             "| epsilon | RR | DP-SGD | Hybrid |", "|---|---|---|---|"]
    for e in epsilons:
        lines.append(f"| {e:g} | " + " | ".join(f"{table[(e, a)][0]:.2f} +- {table[(e, a)][1]:.2f}"
                                                 for a, _ in ARMS) + " |")
    (RESULTS / "utility_frontier.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
