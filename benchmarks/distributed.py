"""One process against several: a Hybrid plan trained with ``--nproc`` has one process's guarantee and model.

The frontier's Hybrid plan (``utility_frontier.py``: balanced shape, its C, batch, epochs,
calibration share and the ``alpha-by-eps`` split) at ``--epsilon``, trained on ``--rows``
rows (a fifth of the users held out, as there) for each seed with 1 process and with each
count in ``--nproc``. Every run is audited (``budgetplan.audit.audit_run``, the per-rank
check included). Reported per process count: eval AUC, relative AUC loss against the
non-private baseline, calibration ratio (mean +- std over the seeds), wall seconds, the
DP-SGD phase's seconds and rows per second, and the audit verdicts; then the difference
between the arms beside the spread between seeds, so a difference smaller than the seed
noise is called that.

Not a test: ``python benchmarks/distributed.py`` (about 20 minutes on 2 cores at the
defaults); writes ``results/distributed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _harness as h
import utility_frontier as uf

SHAPE = "balanced"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows before the held-out users are set aside")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--nproc", default="2", help="comma-separated process counts compared with 1")
    ap.add_argument("--out", type=Path, default=h.RESULTS)
    args = ap.parse_args(argv)
    args.argv = list(argv)
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
    # the frontier's options this benchmark shares, at the frontier's defaults
    args.users = max(1, args.rows // 5)
    args.rr_epochs, args.dpsgd_batch = uf.PLAN["rr"]["epochs"], uf.PLAN["dpsgd"]["batch_size"]
    args.dpsgd_epochs, args.clipping_norm = uf.PLAN["dpsgd"]["epochs"], uf.PLAN["dpsgd"]["clipping_norm"]
    args.dpsgd_lr, args.device = None, "cpu"
    return args


def _split(epsilon: float) -> str:
    return uf.ARMS["Hybrid"]  # the product's split rule: the alpha table by epsilon


def settings(args: argparse.Namespace) -> dict:
    from trainers.data.synth import get_shape

    training, dpsgd = uf._train_settings(args)
    return h.settings_record("distributed.py", args.argv, {
        "rows": args.rows, "users": args.users, "seeds": args.seeds, "epsilon": args.epsilon,
        "processes": args.counts, "shape": get_shape(SHAPE).parameters(), "split": _split(args.epsilon),
        "scenario": uf.scenario(args, epsilon=args.epsilon, split=_split(args.epsilon), n=0,
                                spec=get_shape(SHAPE).features),
        "training": training.to_dict(), "dpsgd_settings": dpsgd.to_dict(),
        "baseline": uf._baseline_settings().to_dict(), "threads_per_process": 1, "holdout": uf.HOLDOUT})


def _one(args, plan, train, evaluation, seed: int, nproc: int, work: Path, baseline_auc: float) -> dict:
    from budgetplan.audit import audit_run
    from trainers.run import execute_plan

    training, dpsgd = uf._train_settings(args)
    out = work / f"run-{seed}-{nproc}"
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    record = execute_plan(plan, train, eval_path=evaluation, out_dir=out, settings=training, dpsgd_settings=dpsgd,
                          seed=seed, threads=1, nproc=nproc, baseline_auc=baseline_auc)
    wall = time.perf_counter() - t0
    report = audit_run(out, data_path=train)
    dp = next(p for p in record.phases if p.name == "dpsgd")
    rows = dp.batch_size_sum or 0
    return {"seed": seed, "processes": nproc, **uf._metrics(record), "wall_seconds": wall,
            "dpsgd_seconds": dp.seconds, "dpsgd_rows_per_second": rows / dp.seconds if dp.seconds else None,
            "rr_seconds": record.timings.get("rr_phase_seconds"), "audit_passed": report.passed,
            "audit_failed": [c.name for c in report.checks if not c.passed],
            "epsilon_reaccounted": [c.detail for c in report.checks if c.name == "independent re-accounting"],
            "load_before": load, "load_after": os.getloadavg()[0]}


def run(args) -> dict:
    from rich.console import Console
    from rich.progress import Progress

    from budgetplan.planner import build_plan
    from budgetplan.scenario import parse_scenario
    from trainers.data.synth import get_shape
    from trainers.run import run_baseline

    work = Path(tempfile.mkdtemp(prefix="distributed-"))
    result: dict = {"settings": settings(args), "runs": [], "baselines": []}
    spec = get_shape(SHAPE).features
    with Progress(console=Console(stderr=True)) as bar:
        task = bar.add_task("runs", total=args.seeds * (len(args.counts) + 1))
        for seed in range(args.seeds):
            train, evaluation, n = uf._data(SHAPE, seed, args, work)
            plan = build_plan(parse_scenario(uf.scenario(args, epsilon=args.epsilon, split=_split(args.epsilon), n=n,
                                                         spec=spec)))
            training, _ = uf._train_settings(args)
            bar.update(task, description=f"seed {seed}: non-private baseline")
            base = run_baseline(plan, train, eval_path=evaluation, settings=training,
                                baseline=uf._baseline_settings(), seed=seed, threads=1)
            result["baselines"].append({"seed": seed, **uf._metrics(base)})
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
             "torch thread per process, gloo on CPU. Mean +- std over the seeds; every run audited.", "",
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
