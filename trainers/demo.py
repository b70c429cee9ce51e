"""``budgetplan demo``: the product at one budget, on synthetic data its defaults were not fitted to.

Synthesises semi-sensitive ads data of the ``mixed`` shape (interactions across the feature
groups, heavy users: ``trainers.data.mixed``), holds out a fifth of the users for evaluation,
trains the non-private model and its non-sensitive-only twin (RR's ceiling), then plans the
shipped ``synthetic-hybrid`` template at one epsilon three ways, as a user adapts it (only
epsilon, N, split and ``[features]`` change): RR alone (alpha = 1), DP-SGD alone (alpha = 0)
and Hybrid with the default split rule. Each is trained and compared: AUC, relative AUC loss
against the non-private model, the calibration ratio, and for the RR phases where their
free held-out units stopped them. The split's choice comes with its reason. Everything it
writes (data, plans, statements, run records) lands in one directory.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.examples import adapted
from budgetplan.scenario.model import parse_scenario
from budgetplan.scenario.split_rules import DEFAULT_RULE, choose_split
from budgetplan.util.fileio import atomic_output, write_atomic
from trainers.baseline import reference
from trainers.data.synth import get_shape, synthesize
from trainers.metrics import relative_auc_loss
from trainers.run import RunOptions, execute_plan, run_baseline
from trainers.threads import resolve_threads

__all__ = ["run_demo", "demo_scenario", "DEMO_SHAPE", "DEMO_TEMPLATE"]

DEMO_SHAPE = "mixed"
DEMO_TEMPLATE = "synthetic-hybrid"
# (name, file stem, split): None is the default rule, as a Hybrid scenario that names none gets it
ARMS = (("RR", "rr", "alpha=1"), ("DP-SGD", "dpsgd", "alpha=0"), ("Hybrid", "hybrid", None))


def demo_scenario(*, epsilon: float, dataset_size: int, spec, epochs: int = 3) -> str:
    """An RR-only scenario (label DP per impression) for ``spec``: the small plan many tests train."""
    return f"""name = "demo-rr-eps{epsilon:g}"
description = "randomized response per impression on synthetic semi-sensitive ads data."

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


def run_demo(*, rows: int = 250_000, users: int | None = None, epsilon: float = 8.0, shape: str = DEMO_SHAPE,
             out_dir=None, seed: int = 0, progress: bool = True, threads: int | str = "auto") -> dict:
    """Run the demo; returns {"out_dir", "shape", "train_rows", "eval_rows", "epsilon", "split", "runs"}.

    ``threads``: torch's CPU threads (``trainers.threads``), resolved once for every run.
    """
    threads = resolve_threads(threads)  # before the demo's own work adds to the load
    users = users or max(1, rows // 5)
    spec = get_shape(shape).features
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="budgetplan-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    table = synthesize(rows, users, seed, shape)
    user = table.column(spec.unit_id).to_numpy()
    # a fixed fifth of the users, by a multiplicative hash of the id (wrapping uint64 arithmetic)
    held_out = (user.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0
    train, test = table.filter(~held_out), table.filter(held_out)
    for name, part in (("train.parquet", train), ("eval.parquet", test)):
        with atomic_output(out / name) as tmp:
            pq.write_table(part, str(tmp))
    plans = {}
    for arm, stem, split in ARMS:
        text = adapted(DEMO_TEMPLATE, epsilon=epsilon, dataset_size=train.num_rows, split=split or DEFAULT_RULE,
                       features=spec, scenario_name=f"demo-{stem}-eps{epsilon:g}")
        plans[arm] = build_plan(parse_scenario(text))
        write_atomic(out / f"plan-{stem}.json", plans[arm].to_json())
        write_atomic(out / f"statement-{stem}.txt", render_statement(plans[arm]))
    runs = []
    t0 = time.perf_counter()
    base = run_baseline(plans["Hybrid"], out / "train.parquet", eval_path=out / "eval.parquet",
                        out_dir=out / "run-baseline", progress=progress, threads=threads)
    runs.append(_row("non-private", None, base, time.perf_counter() - t0))
    base_auc, tolerance = reference(base)
    t0 = time.perf_counter()
    ceiling = run_baseline(plans["Hybrid"], out / "train.parquet", eval_path=out / "eval.parquet",
                           out_dir=out / "run-baseline-nonsensitive", truncated=True, progress=progress,
                           threads=threads)
    row = _row("non-private, non-sensitive only", None, ceiling, time.perf_counter() - t0)
    row["relative_auc_loss"] = relative_auc_loss(row["auc"], base_auc) if row["auc"] is not None else None
    runs.append(row)
    for arm, stem, _ in ARMS:
        plan = plans[arm]
        t0 = time.perf_counter()
        rec = execute_plan(plan, out / "train.parquet", RunOptions(eval_path=out / "eval.parquet",
                                                                   out_dir=out / f"run-{stem}", baseline_auc=base_auc,
                                                                   baseline_tolerance=tolerance, progress=progress,
                                                                   threads=threads))
        runs.append(_row(arm, epsilon, rec, time.perf_counter() - t0, plan))
    hybrid = plans["Hybrid"]
    share = hybrid.calibration.params.share if hybrid.calibration is not None else 0.0
    choice = choose_split(epsilon * (1 - share), hybrid.scenario.split)
    return {"out_dir": str(out), "shape": shape, "train_rows": train.num_rows, "eval_rows": test.num_rows,
            "conversion_rate": float(np.mean(table.column(spec.label).to_numpy())), "epsilon": epsilon,
            "split": {**choice.to_dict(), "calibration_share": share}, "runs": runs}


def _row(name, epsilon, record, seconds, plan=None) -> dict:
    ev = record.metrics["eval"]
    out = {"name": name, "epsilon": epsilon, "auc": ev["auc"], "log_loss": ev["log_loss"],
           "calibration_ratio": ev["calibration_ratio"], "relative_auc_loss": ev.get("relative_auc_loss"),
           "seconds": seconds, "run_sha256": record.sha256}
    if plan is not None:
        out["phases"] = {p.name: p.target_epsilon for p in plan.phases}
        rr = next((p for p in record.phases if p.name == "rr"), None)
        if rr is not None and rr.validation_kept is not None:
            out["rr_kept_epoch"] = rr.validation_checks[rr.validation_kept]
            out["rr_heldout_auc"] = rr.validation_auc[rr.validation_kept]
    return out
