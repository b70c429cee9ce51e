"""One process against several: a Hybrid plan trained with ``--nproc`` has one process's guarantee and model.

The Hybrid plan ``results/distributed.json`` was measured at (the utility frontier's when it
was measured: balanced shape, C = 5, DP-SGD batch 4,096 for 3 epochs, one RR epoch at batch
1,024, the frozen tower, a calibration share of 0.05 and the ``alpha-by-eps`` split) at
``--epsilon``, trained on ``--rows`` rows (a fifth of the users held out:
``harness.HOLDOUT``) for each seed with 1 process and with each count in ``--nproc``. Every
run is audited (``budgetplan.audit.audit_run``, the per-rank check included). Reported per
process count: eval AUC, relative AUC loss against the non-private baseline, calibration ratio
(mean +- std over the seeds), wall seconds, the DP-SGD phase's seconds and rows per second, and
the audit verdicts; then the difference between the arms beside the spread between seeds, so a
difference smaller than the seed noise is called that.

Pinned: a 1M-row run takes hours, so the plan and the training settings are this script's
constants, the values ``results/distributed.json`` records, not the frontier's or the
library's defaults of today. The RR phase's validation (held-out units that stop it early) did
not exist when it was measured: the scenario recorded is the text as measured, which today
would hold units out, so the script trains it with ``[rr].validation_fraction = 0``
(``harness.as_planned_then``), the plan it made then: one RR epoch on every training row.
With no held-out units the RR stopping rule (``rr_checks_per_epoch``, ``rr_patience``) is
never read, and ``rr_weight_decay`` is pinned at 0.0, what the RR phase did then; the record
leaves the three out, as it did. Not pinned, because no setting reaches it: the RR phase now
starts the model's intercept at the debiased base rate of its labels (since commit 30be4cc),
so a rerun's AUCs may differ from the recorded ones; both arms of the comparison start alike.

Not a test: ``python benchmarks/distributed.py`` (about 20 minutes on 2 cores at the
defaults); writes ``results/distributed.json`` and ``.md``. ``--smoke --out DIR``: one seed of 8,000 rows
(the pinned DP-SGD batch of 4,096 needs N above it), 1 and 2 processes (gloo), each audited.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness as h

SHAPE = "balanced"
# The plan results/distributed.json was measured at (the frontier's then), pinned: it cannot be re-measured soon.
SPLIT = "alpha-by-eps"  # the product's split rule when measured: the alpha table by epsilon
DELTA = "0.1/N"  # as measured
TOWER = "frozen"  # as measured
RR_EPOCHS, RR_BATCH = 1, 1024  # as measured
DPSGD_BATCH, DPSGD_EPOCHS, CLIPPING_NORM = 4096, 3, 5.0  # as measured
CALIBRATION_SHARE = 0.05  # as measured
# The trainer's settings it was measured at, pinned (the library's defaults have changed since).
TRAINING = {"model": "mlp", "embedding_dim": 8, "tower_hidden": 128, "common_hidden": (128, 64), "lr": 0.001,
            "optimizer": "adam", "loss": "forward", "batch_size": 1024, "hash_bins_nonsensitive": 65536,
            "hash_bins_sensitive": 65536, "nonsensitive_encoding": "auto", "vocab_threshold": 16, "device": "cpu",
            "data_format": "auto", "hybrid_start": "rr-model"}
RR_WEIGHT_DECAY = 0.0  # the RR phase had no weight decay when measured (the setting came later; not recorded)
DPSGD_TRAINING = {"optimizer": "adam", "lr": 0.01,  # lr 0.01: the default when measured (now 0.12 / sqrt(T))
                  "cosine_decay": False, "padded_size": None, "max_chunk": 4096}
BASELINE = {"max_epochs": 20, "patience": 2, "validation_fraction": 0.1, "weight_decay": 0.0001,
            "check_every": None}  # the non-private baseline's early stopping as measured


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows before the held-out users are set aside")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--nproc", default="2", help="comma-separated process counts compared with 1")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    h.add_smoke(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    # --smoke: the pinned plan, one seed, the least data it plans on; 2 processes as in the real run
    h.apply_smoke(ap, args, argv, {"rows": 8_000, "seeds": 1, "nproc": "2"})
    for what, value in (("--rows", args.rows), ("--seeds", args.seeds)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not 0 < args.epsilon < float("inf"):
        ap.error(f"--epsilon must be positive and finite, got {args.epsilon!r}")
    try:
        args.counts = [1] + [int(c) for c in args.nproc.split(",") if c and int(c) != 1]
    except ValueError:
        ap.error(f"--nproc: not a comma-separated list of integers: {args.nproc!r}")
    if any(c < 1 for c in args.counts):
        ap.error(f"--nproc counts must be at least 1, got {args.nproc!r}")
    args.users = max(1, args.rows // 5)
    return args


def scenario(epsilon: float, n: int, spec) -> str:
    """The Hybrid scenario as measured (its text then, byte for byte; ``h.as_planned_then`` plans it as then)."""
    return f"""name = "frontier-{SPLIT}-eps{epsilon:g}"
[budget]
epsilon = {epsilon!r}
delta = "{DELTA}"
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = {n}
[algorithm]
name = "hybrid"
split = "{SPLIT}"
tower = "{TOWER}"
[rr]
epochs = {RR_EPOCHS}
batch_size = {RR_BATCH}
[dpsgd]
batch_size = {DPSGD_BATCH}
epochs = {DPSGD_EPOCHS}
clipping_norm = {CLIPPING_NORM!r}
[calibration]
share = {CALIBRATION_SHARE!r}
{spec.to_toml()}"""


def _plan(epsilon: float, n: int):
    """The plan trained: the scenario as measured, planned as then (no RR validation)."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape

    plan = build_plan(parse_scenario(h.as_planned_then(scenario(epsilon, n, get_shape(SHAPE).features))))
    if plan.rr is None or plan.rr.params.validation_fraction is not None:
        raise SystemExit("the plan is not the one measured: an RR phase without held-out units")
    return plan


def _train_settings():
    """(TrainSettings, DPSGDSettings, BaselineSettings) of every run, as measured."""
    from trainers.baseline import BaselineSettings
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    return (TrainSettings(**TRAINING, rr_weight_decay=RR_WEIGHT_DECAY), DPSGDSettings(**DPSGD_TRAINING),
            BaselineSettings(**BASELINE))


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    training, dpsgd, baseline = _train_settings()
    return h.settings_record("distributed.py", args.argv, {
        "rows": args.rows, "users": args.users, "seeds": args.seeds, "epsilon": args.epsilon,
        "processes": args.counts, "shape": get_shape(SHAPE).parameters(), "split": SPLIT,
        "scenario": scenario(args.epsilon, 0, get_shape(SHAPE).features),
        # the RR settings as recorded then: none (no held-out units to stop on; weight decay pinned at 0.0)
        "training": h.without_rr(training.to_dict()), "dpsgd_settings": dpsgd.to_dict(),
        "baseline": baseline.to_dict(), "threads_per_process": 1, "holdout": h.HOLDOUT})


def _one(args, plan, train, evaluation, seed: int, nproc: int, work: Path, baseline_auc: float) -> dict:
    from trainers.audit import audit_run
    from trainers.run import RunOptions, execute_plan

    training, dpsgd, _ = _train_settings()
    out = work / f"run-{seed}-{nproc}"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    record = execute_plan(plan, train, RunOptions(eval_path=evaluation, out_dir=out, settings=training,
                                                  dpsgd_settings=dpsgd, seed=seed, threads=1, nproc=nproc,
                                                  baseline_auc=baseline_auc))
    wall = time.perf_counter() - t0
    report = audit_run(out, data_path=train)
    dp = next(p for p in record.phases if p.name == "dpsgd")
    rows = dp.batch_size_sum or 0
    return {"seed": seed, "processes": nproc, **h.eval_metrics(record), "wall_seconds": wall,
            "dpsgd_seconds": dp.seconds, "dpsgd_rows_per_second": rows / dp.seconds if dp.seconds else None,
            "rr_seconds": record.timings.get("rr_phase_seconds"), "audit_passed": report.passed,
            "audit_failed": [c.name for c in report.checks if not c.passed],
            "epsilon_reaccounted": [c.detail for c in report.checks if c.name == "independent re-accounting"],
            "load_before": load, "load_after": os.getloadavg()[0]}


def run(args) -> dict:

    from trainers.run import run_baseline

    work = Path(tempfile.mkdtemp(prefix="distributed-"))
    result: dict = {"settings": settings(args), "runs": [], "baselines": []}
    training, _, baseline = _train_settings()
    with h.progress() as bar:
        task = bar.add_task("runs", total=args.seeds * (len(args.counts) + 1))
        for seed in range(args.seeds):
            train, evaluation, n = h.holdout_data(SHAPE, seed, args.rows, args.users, work)
            plan = _plan(args.epsilon, n)
            bar.update(task, description=f"seed {seed}: non-private baseline")
            base = run_baseline(plan, train, eval_path=evaluation, settings=training, baseline=baseline, seed=seed,
                                threads=1)
            result["baselines"].append({"seed": seed, **h.eval_metrics(base)})
            bar.advance(task)
            for nproc in args.counts:
                bar.update(task, description=f"seed {seed}: {nproc} process(es)")
                result["runs"].append(_one(args, plan, train, evaluation, seed, nproc, work,
                                           base.metrics["eval"]["auc"]))
                bar.advance(task)
    result["machine"] = h.machine()
    result["summary"] = summarise(result)
    return result


def _stats(values) -> dict:
    values = [v for v in values if v is not None]
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def summarise(result: dict) -> dict:
    counts = sorted({r["processes"] for r in result["runs"]})
    out: dict = {"by_processes": {}}
    for c in counts:
        runs = [r for r in result["runs"] if r["processes"] == c]
        out["by_processes"][str(c)] = {k: _stats([r[k] for r in runs]) for k in (
            "auc", "relative_auc_loss", "calibration_ratio", "wall_seconds", "dpsgd_seconds",
            "dpsgd_rows_per_second")} | {"audits_passed": sum(r["audit_passed"] for r in runs), "runs": len(runs)}
    one = out["by_processes"]["1"]
    for c in counts[1:]:
        other = out["by_processes"][str(c)]
        paired = [b["auc"] - a["auc"] for a in result["runs"] if a["processes"] == 1
                  for b in result["runs"] if b["processes"] == c and b["seed"] == a["seed"]]
        spread = max(one["auc"]["std"], other["auc"]["std"])
        out[f"auc_difference_{c}_vs_1"] = {"mean": statistics.fmean(paired), "seed_std": spread,
                                           "within_seed_noise": abs(statistics.fmean(paired)) <= spread}
    return out


def render(result: dict) -> str:
    s = result["summary"]
    cfg = result["settings"]["values"]
    lines = [f"# One process against several: Hybrid at eps {cfg['epsilon']:g} (split {cfg['split']})", "",
             f"{cfg['rows']:,} rows of the {SHAPE} shape (a fifth of the users held out), {cfg['seeds']} seeds, one "
             "torch thread per process, gloo on CPU; the RR phase holds no units out (`[rr].validation_fraction = "
             "0`: the pinned plan). Mean +- std over the seeds; every run audited.", "",
             "| processes | eval AUC | relative AUC loss (%) | calibration ratio | wall s | DP-SGD s | "
             "DP-SGD rows/s | audits passed |", "|---|---|---|---|---|---|---|---|"]

    def pm(d, scale=1.0, digits=4):
        return f"{d['mean'] * scale:.{digits}f} +- {d['std'] * scale:.{digits}f}"

    for c, row in s["by_processes"].items():
        lines.append(f"| {c} | {pm(row['auc'])} | {pm(row['relative_auc_loss'], 1, 2)} | "
                     f"{pm(row['calibration_ratio'], 1, 3)} | {pm(row['wall_seconds'], 1, 1)} | "
                     f"{pm(row['dpsgd_seconds'], 1, 1)} | {row['dpsgd_rows_per_second']['mean']:,.0f} | "
                     f"{row['audits_passed']} of {row['runs']} |")
    base = _stats([b["auc"] for b in result["baselines"]])
    lines += ["", f"Non-private baseline: AUC {base['mean']:.4f} +- {base['std']:.4f}.", ""]
    for key, d in s.items():
        if key.startswith("auc_difference_"):
            c = key.split("_")[2]
            verdict = ("within the seed noise: the two arms are not distinguishable" if d["within_seed_noise"] else
                       "larger than the seed noise")
            lines.append(f"AUC with {c} processes minus 1 process, paired by seed: {d['mean']:+.4f}, against a "
                         f"seed std of {d['seed_std']:.4f}: {verdict}.")
    loads = [(r["load_before"], r["load_after"]) for r in result["runs"]]
    lines += ["", f"Load average (1 min) around the runs: {min(a for a, _ in loads):.2f} to "
              f"{max(b for _, b in loads):.2f}; timings on a loaded machine are upper bounds.", "",
              h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, "distributed", result, render))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
