"""``budgetplan demo``: plan-then-train end to end on the built-in synthetic data.

Synthesises semi-sensitive ads data, holds out a fifth of the users, plans randomized
response at each requested epsilon (label DP per impression), trains a non-private
baseline and each RR plan on CPU, and returns the comparison. Everything it writes (data,
plans, statements, run records) lands in one directory. torch is imported only when it
runs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

__all__ = ["run_demo", "demo_scenario"]


def demo_scenario(*, epsilon: float, dataset_size: int, spec, epochs: int = 3) -> str:
    """The TOML of the demo's RR scenario for the synthetic feature spec."""
    return f"""name = "demo-rr-eps{epsilon:g}"
description = "budgetplan demo: randomized response per impression on synthetic semi-sensitive ads data."

[budget]
epsilon = {epsilon!r}
delta = 0.0

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {dataset_size}

[algorithm]
name = "rr"

[rr]
epochs = {epochs}
batch_size = 1024

{spec.to_toml()}"""


def run_demo(*, rows: int = 300_000, users: int = 60_000, epsilons=(1.0, 3.0), out_dir=None, seed: int = 0,
             progress: bool = True, threads: int | str = "auto") -> dict:
    """Run the demo; returns {"out_dir", "train_rows", "eval_rows", "runs": [...]}.

    ``threads``: torch's CPU threads (``trainers.threads``), resolved once for every run.
    """
    import numpy as np
    import pyarrow.parquet as pq

    from budgetplan._files import atomic_output, write_atomic
    from budgetplan.planner import build_plan
    from budgetplan.scenario import parse_scenario
    from budgetplan.statement import render_statement
    from trainers.baseline import reference
    from trainers.data.synth import SYNTH_FEATURES, synthesize
    from trainers.run import TrainSettings, execute_plan, run_baseline
    from trainers.threads import resolve_threads

    threads = resolve_threads(threads)  # before the demo's own work adds to the load

    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="budgetplan-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    table = synthesize(rows, users, seed)
    user = table.column(SYNTH_FEATURES.unit_id).to_numpy()
    # a fixed fifth of the users, by a multiplicative hash of the id (wrapping uint64 arithmetic)
    held_out = (user.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0
    train, test = table.filter(~held_out), table.filter(held_out)
    for name, part in (("train.parquet", train), ("eval.parquet", test)):
        with atomic_output(out / name) as tmp:
            pq.write_table(part, str(tmp))
    settings = TrainSettings()
    runs = []
    first_plan = None
    for eps in epsilons:
        # the free intercept calibration of RR: the mean prediction meets the debiased label count
        text = demo_scenario(epsilon=float(eps), dataset_size=train.num_rows, spec=SYNTH_FEATURES) + "\n[calibration]\n"
        plan = build_plan(parse_scenario(text, default_name=f"demo-rr-eps{eps:g}"))
        first_plan = first_plan or plan
        write_atomic(out / f"plan-eps{eps:g}.json", plan.to_json())
        write_atomic(out / f"statement-eps{eps:g}.txt", render_statement(plan))
    t0 = time.perf_counter()
    base = run_baseline(first_plan, out / "train.parquet", eval_path=out / "eval.parquet",
                        out_dir=out / "run-baseline", settings=settings, progress=progress,
                        threads=threads)
    runs.append(_row("non-private", None, base, time.perf_counter() - t0))
    base_auc, tolerance = reference(base)
    t0 = time.perf_counter()
    ceiling = run_baseline(first_plan, out / "train.parquet", eval_path=out / "eval.parquet",
                           out_dir=out / "run-baseline-nonsensitive", settings=settings, truncated=True,
                           progress=progress, threads=threads)
    row = _row("non-private, non-sensitive features", None, ceiling, time.perf_counter() - t0)
    from trainers.metrics import relative_auc_loss

    row["relative_auc_loss"] = (relative_auc_loss(row["auc"], base_auc) if row["auc"] is not None
                                and base_auc is not None else None)
    runs.append(row)
    for eps in epsilons:
        from budgetplan.plan import load_plan

        plan = load_plan(out / f"plan-eps{eps:g}.json")
        t0 = time.perf_counter()
        rec = execute_plan(plan, out / "train.parquet", eval_path=out / "eval.parquet",
                           out_dir=out / f"run-rr-eps{eps:g}", settings=settings, baseline_auc=base_auc,
                           baseline_tolerance=tolerance, progress=progress, threads=threads)
        runs.append(_row(f"RR eps={eps:g} (label DP)", float(eps), rec, time.perf_counter() - t0))
    return {"out_dir": str(out), "train_rows": train.num_rows, "eval_rows": test.num_rows,
            "conversion_rate": float(np.mean(table.column(SYNTH_FEATURES.label).to_numpy())), "runs": runs}


def _row(name, epsilon, record, seconds) -> dict:
    ev = record.metrics["eval"]
    return {"name": name, "epsilon": epsilon, "auc": ev["auc"], "log_loss": ev["log_loss"],
            "calibration_ratio": ev["calibration_ratio"], "relative_auc_loss": ev.get("relative_auc_loss"),
            "seconds": seconds, "run_sha256": record.sha256}
