"""User-level DP-SGD both ways: sampling examples against sampling units, at K in {1, 2, 5, 10}.

The synthetic data (``balanced`` shape, ``--rows`` rows by ``--rows / 5`` users, a fifth of
the users held out for evaluation) is capped at K rows per user before anything else, so N
and the unit count M are exact. For each K and seed two DP-SGD plans at the same budget,
steps and expected rows per step (q equal) are trained and audited:

* ``examples``: each row joins a step w.p. q = B / N and is clipped alone; one user's K rows
  are accounted by the tight user-level bound (``unit_accounting = "tight"``);
* ``units``: each user joins a step w.p. q = B_u / M (B_u = B M / N, so q is the same), the
  sum of its rows' gradients clipped once to the same C; accounted as Poisson over units.

At K = 1 the two are the same mechanism, so only ``examples`` runs. Reported per arm: eval
AUC, relative AUC loss against the non-private baseline (all features, trained to
convergence on the K = max data), calibration ratio (mean +- std over the seeds), the noise
multiplier and the planner's recommendation; then the paired difference between the arms
beside the spread between seeds.

Pinned: the plans and the training settings are this script's constants, the values
``results/user_level.json`` was measured at (1M rows, 3 seeds), not the utility frontier's or
the library's defaults of today: C = 5, 3 DP-SGD epochs at B = 4,096, delta 0.1/N, a
calibration share of 0.05, the DP-SGD step size 0.01 (the default then; 0.12 / sqrt(T) now).
The scenarios state their calibration and have no RR phase; ``harness.as_planned_then`` adds
the basic composition they were planned by (before the default became "auto", which plans a
DP-SGD phase and its calibration release to their PLD total), so they plan today what they
planned then; with no RR phase the RR settings are never read, and the record leaves them out.

Not a test: ``python benchmarks/user_level.py`` (about 35 minutes on 2 cores at the
defaults; ``--rows 100000`` takes 4); writes ``results/user_level.json`` and ``.md``. ``--smoke --out DIR``:
K = 1 and 2 (both arms) on one seed of 2,000 rows at batch 64.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import harness as h

SHAPE = "balanced"
CAPS = (1, 2, 5, 10)
# The plans results/user_level.json was measured at (the frontier's DP-SGD then), pinned: it cannot be re-measured soon.
DELTA = "0.1/N"  # as measured
DPSGD_BATCH, DPSGD_EPOCHS, CLIPPING_NORM = 4096, 3, 5.0  # as measured (--batch defaults to DPSGD_BATCH)
CALIBRATION_SHARE = 0.05  # as measured
# The trainer's settings it was measured at, pinned (the library's defaults have changed since).
TRAINING = {"model": "mlp", "embedding_dim": 8, "tower_hidden": 128, "common_hidden": (128, 64), "lr": 0.001,
            "optimizer": "adam", "loss": "forward", "batch_size": 1024, "hash_bins_nonsensitive": 65536,
            "hash_bins_sensitive": 65536, "nonsensitive_encoding": "auto", "vocab_threshold": 16, "device": "cpu",
            "data_format": "auto", "hybrid_start": "rr-model"}
DPSGD_TRAINING = {"optimizer": "adam", "lr": 0.01,  # lr 0.01: the default when measured (now 0.12 / sqrt(T))
                  "cosine_decay": False, "padded_size": None, "max_chunk": 4096}
BASELINE = {"max_epochs": 20, "patience": 2, "validation_fraction": 0.1, "weight_decay": 0.0001,
            "check_every": None}  # the non-private baseline's early stopping as measured


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows before capping and the held-out users")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--batch", type=int, default=DPSGD_BATCH,
                    help="expected rows per step B (units per step: B M / N)")
    ap.add_argument("--adjacency", choices=("replace-one", "add-remove"), default="replace-one")
    ap.add_argument("--caps", default=",".join(map(str, CAPS)), help="comma-separated K")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    h.add_smoke(ap)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    # --smoke: K = 1 (one arm) and K = 2 (both), so every branch; a batch the capped rows can take
    h.apply_smoke(ap, args, argv, {"rows": 2_000, "seeds": 1, "caps": "1,2", "batch": 64})
    if args.rows < 100 or args.seeds < 1:
        ap.error(f"--rows must be at least 100 and --seeds at least 1, got {args.rows} and {args.seeds}")
    if not 0 < args.epsilon < float("inf"):
        ap.error(f"--epsilon must be positive and finite, got {args.epsilon!r}")
    try:
        args.cap_list = [int(k) for k in args.caps.split(",") if k]
    except ValueError:
        ap.error(f"--caps: not a comma-separated list of integers: {args.caps!r}")
    if not args.cap_list or any(k < 1 for k in args.cap_list):
        ap.error(f"--caps must be integers >= 1, got {args.caps!r}")
    args.users = max(1, args.rows // 5)
    return args


def scenario(args, *, k: int, n: int, m: int, by: str, spec) -> str:
    """The DP-SGD plan of one arm: ``by`` is "example" or "unit" (then the batch counts units, q kept)."""
    batch = args.batch if by == "example" else max(1, round(args.batch * m / n))
    unit = f'unit = "user"\ncap = {k}' if k > 1 else 'unit = "impression"'
    return f"""name = "user-level-k{k}-{by}"
[budget]
epsilon = {args.epsilon!r}
delta = "{DELTA}"
[privacy]
adjacency = "{args.adjacency}"
{unit}
[data]
dataset_size = {n}
units = {m}
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = {batch}
epochs = {DPSGD_EPOCHS}
clipping_norm = {CLIPPING_NORM!r}
sample_by = "{by}"
[calibration]
share = {CALIBRATION_SHARE!r}
{spec.to_toml()}"""


def _train_settings():
    """(TrainSettings, DPSGDSettings, BaselineSettings) of every run, as measured."""
    from trainers.baseline import BaselineSettings
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    return TrainSettings(**TRAINING), DPSGDSettings(**DPSGD_TRAINING), BaselineSettings(**BASELINE)


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    training, dpsgd, baseline = _train_settings()
    return h.settings_record("user_level.py", args.argv, {
        "rows": args.rows, "users": args.users, "seeds": args.seeds, "epsilon": args.epsilon,
        "adjacency": args.adjacency, "caps": args.cap_list, "batch": args.batch, "shape": get_shape(SHAPE).parameters(),
        "scenario": scenario(args, k=max(args.cap_list), n=0, m=0, by="example", spec=get_shape(SHAPE).features),
        # DP-SGD-only plans and the non-private baseline read no RR setting
        "training": h.without_rr(training.to_dict()), "dpsgd_settings": dpsgd.to_dict(),
        "baseline": baseline.to_dict(), "holdout": h.HOLDOUT,
        "capping": "random K rows per user (seeded), before the plan: N and M exact"})


def _capped(train: Path, k: int, seed: int, work: Path) -> tuple[Path, int, int]:
    """The training file capped at K rows per user; (path, N, M)."""
    import numpy as np
    import pyarrow.parquet as pq

    from trainers.data.capping import cap_units
    from trainers.data.synth import get_shape

    table = pq.read_table(train)
    users = table.column(get_shape(SHAPE).features.unit_id).to_numpy()
    kept, info = cap_units(users, k, rule="random", rng=np.random.default_rng(7919 * seed + k))
    path = work / f"train-k{k}-{seed}.parquet"
    pq.write_table(table.take(kept), path)
    return path, int(info["rows_kept"]), int(np.unique(users[kept]).size)


def _one(args, plan, train, evaluation, seed: int, baseline_auc: float, out: Path) -> dict:
    from trainers.audit import audit_run
    from trainers.run import RunOptions, execute_plan

    training, dpsgd, _ = _train_settings()
    record = execute_plan(plan, train, RunOptions(eval_path=evaluation, out_dir=out, settings=training,
                                                  dpsgd_settings=dpsgd, seed=seed, threads=1,
                                                  baseline_auc=baseline_auc))
    report = audit_run(out, data_path=train)
    dp = next(p for p in record.phases if p.name == "dpsgd")
    return {**h.eval_metrics(record), "noise_multiplier": plan.dpsgd.params.noise_multiplier,
            "epsilon": plan.guarantee.epsilon, "method": plan.dpsgd.guarantee.method, "dpsgd_seconds": dp.seconds,
            "audit_passed": report.passed, "audit_failed": [c.name for c in report.checks if not c.passed]}


def _recommended(plan) -> str | None:
    return next((a.execution for a in plan.unit_alternatives if a.recommended), None)


def run(args) -> dict:

    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape
    from trainers.run import run_baseline

    work = Path(tempfile.mkdtemp(prefix="user-level-"))
    spec = get_shape(SHAPE).features
    result: dict = {"settings": settings(args), "runs": [], "baselines": []}
    training, _, baseline = _train_settings()
    arms = [(k, by) for k in args.cap_list for by in (("example",) if k == 1 else ("example", "unit"))]
    with h.progress() as bar:
        task = bar.add_task("runs", total=args.seeds * (len(arms) + 1))
        for seed in range(args.seeds):
            train, evaluation, _ = h.holdout_data(SHAPE, seed, args.rows, args.users, work)
            top, n_top, m_top = _capped(train, max(args.cap_list), seed, work)
            bar.update(task, description=f"seed {seed}: non-private baseline")
            base_plan = build_plan(parse_scenario(h.as_planned_then(scenario(args, k=max(args.cap_list), n=n_top,
                                                                             m=m_top, by="example", spec=spec))))
            base = run_baseline(base_plan, top, eval_path=evaluation, settings=training, baseline=baseline,
                                seed=seed, threads=1)
            result["baselines"].append({"seed": seed, **h.eval_metrics(base)})
            bar.advance(task)
            for k, by in arms:
                bar.update(task, description=f"seed {seed}: K = {k}, sampling {by}s")
                path, n, m = _capped(train, k, seed, work)
                plan = build_plan(parse_scenario(h.as_planned_then(scenario(args, k=k, n=n, m=m, by=by, spec=spec))))
                row = _one(args, plan, path, evaluation, seed, base.metrics["eval"]["auc"],
                           work / f"run-{seed}-{k}-{by}")
                result["runs"].append({"seed": seed, "cap": k, "sample_by": by, "rows": n, "units": m,
                                       "recommended": _recommended(plan), **row})
                bar.advance(task)
    result["machine"] = h.machine()
    result["summary"] = summarise(result)
    return result


def _stats(values) -> dict:
    values = [v for v in values if v is not None]
    return {"mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else 0.0, "n": len(values)}


def summarise(result: dict) -> dict:
    out: dict = {"arms": {}, "differences": {}}
    for r in result["runs"]:
        out["arms"].setdefault(f"{r['cap']}|{r['sample_by']}", []).append(r)
    for key, runs in list(out["arms"].items()):
        out["arms"][key] = {m: _stats([r[m] for r in runs]) for m in (
            "auc", "relative_auc_loss", "calibration_ratio", "noise_multiplier", "epsilon", "dpsgd_seconds")} | {
            "audits_passed": sum(r["audit_passed"] for r in runs), "runs": len(runs),
            "recommended": sorted({r["recommended"] for r in runs if r["recommended"]}),
            "method": sorted({r["method"] for r in runs})}
    for k in sorted({r["cap"] for r in result["runs"] if r["sample_by"] == "unit"}):
        pairs = [(a["auc"], b["auc"]) for a in result["runs"] for b in result["runs"]
                 if a["cap"] == b["cap"] == k and a["seed"] == b["seed"] and a["sample_by"] == "unit"
                 and b["sample_by"] == "example"]
        diffs = [u - e for u, e in pairs]
        spread = max(out["arms"][f"{k}|example"]["auc"]["std"], out["arms"][f"{k}|unit"]["auc"]["std"])
        mean = statistics.fmean(diffs)
        sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
        out["differences"][str(k)] = {"units_minus_examples_auc": {"mean": mean, "std": sd, "n": len(diffs)},
                                      "seed_spread": spread,
                                      # one seed has no spread to compare with: never a result
                                      "beyond_seed_noise": len(diffs) > 1 and abs(mean) > max(spread, sd)}
    base = [b["auc"] for b in result["baselines"]]
    out["baseline_auc"] = _stats(base)
    return out


def _pm(s: dict, digits: int = 4) -> str:
    return "-" if s["mean"] is None else f"{s['mean']:.{digits}f} +- {s['std']:.{digits}f}"


def markdown(result: dict) -> str:
    s, summ = result["settings"]["values"], result["summary"]
    lines = ["# User-level DP-SGD: sampling examples vs sampling units", "",
             f"{s['rows']:,} rows by {s['users']:,} users ({SHAPE} shape), a fifth of the users held out; each "
             f"K-capped before planning; DP-SGD at epsilon {s['epsilon']:g} ({s['adjacency']}), "
             f"{s['seeds']} seeds. Non-private baseline AUC {_pm(summ['baseline_auc'])}.", "",
             "| K | sampling | noise multiplier | accounting | AUC | rel. AUC loss | calibration | audits | "
             "planner recommends |", "|---|---|---|---|---|---|---|---|---|"]
    for key, a in summ["arms"].items():
        k, by = key.split("|")
        lines.append(f"| {k} | {by}s | {_pm(a['noise_multiplier'], 3)} | {', '.join(a['method'])} | "
                     f"{_pm(a['auc'])} | {_pm(a['relative_auc_loss'], 3)} | {_pm(a['calibration_ratio'], 3)} | "
                     f"{a['audits_passed']}/{a['runs']} | {', '.join(a['recommended']) or '-'} |")
    lines += ["", "| K | AUC, units - examples (paired) | spread between seeds | a result? |", "|---|---|---|---|"]
    for k, d in summ["differences"].items():
        u = d["units_minus_examples_auc"]
        lines.append(f"| {k} | {u['mean']:+.4f} +- {u['std']:.4f} | {d['seed_spread']:.4f} | "
                     f"{'yes' if d['beyond_seed_noise'] else 'no: within the seed noise'} |")
    lines += ["", h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    result = run(args)
    print(h.save_results(args.out, "user_level", result, markdown))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
