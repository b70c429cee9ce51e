"""WALR's utility on ads features: the one-hot release against a logistic regression on the same rows.

WALR (``trainers.walr_onehot``) releases ``sum_i y_i x_i + N(0, s^2 I_k)`` once under label DP,
with every categorical column one-hot, every numeric column scaled into [0, 1] and an
intercept, then fits a logistic regression on the release alone. This benchmark measures what
the noise costs: per (shape, epsilon, seed), on the synthetic data and held-out users of the
other benchmarks (``harness.holdout_data``),

- the private arm: the shipped ``walr`` example adapted as a user would (its epsilon, N and
  ``[features]`` set, and ``[walr].features`` / ``row_norm_bound`` removed, so that the plan
  uses the one-hot encoding with the row bound derived from ``[features]``), planned and
  trained through the product's own entry point ``trainers.run.execute_plan``;
- the non-private arm: the same logistic regression on exactly the same rows and encoding,
  fitted on the exact sum (``release`` with ``noise_std`` 0) by WALR's own fit at no noise
  (``fit_empirical_bayes``: the L2 penalty's precision estimated per column, from ``L2_BASE``,
  the intercept free), so that the prior improves the reference as much as the private arm. The
  private arm weights its columns (``column_weights``); with its penalty on ``a_j theta_j`` the
  fit at no noise is the same model whatever the weights, so this is the same encoding's model.

The rows and their encoding are those ``execute_plan`` prepares: the non-private arm reads them
with the trainer's own ``trainers.inputs.prepare_data`` and ``prepare_eval`` (what reads, caps and
encodes data as a plan's run does), with the
settings resolved for the same plan, then ``numeric_range`` and ``encode_rows``; each
(shape, seed) checks that the private run's dimension and numeric range are the non-private
arm's.

Reported per (shape, epsilon): WALR's AUC, its relative AUC loss (%) against the non-private
model (``trainers.metrics.relative_auc_loss``) and its calibration ratio mean(p) / mean(y), each
mean +- std over the seeds, and the non-private model's AUC.

Not a test: ``python benchmarks/walr_utility.py`` (the frontier's 5 shapes x 3 seeds x 3 epsilons at 1,000,000
rows); ``--quick`` for a smoke run (20,000 rows, one seed, epsilon 3, the mixed shape).
Writes ``<out>/<name>.json`` and ``.md`` (``--out`` defaults to benchmarks/results).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness as h

EXAMPLE = "walr"  # the shipped scenario every private plan is made from
SHAPES = ("balanced", "mixed", "mixed-ns", "mixed-s", "sensitive")  # the utility frontier's
EPSILONS = (1.0, 3.0, 8.0)
HOLDOUT = h.HOLDOUT
QUICK = {"rows": 20_000, "seeds": 1, "epsilons": "3", "shapes": "mixed"}
# the [walr] keys of the numeric example that a one-hot plan leaves out (derived from [features])
REMOVED = ("features", "row_norm_bound")
# the TrainSettings fields a one-hot WALR run reads (``trainers.inputs.prepare_data`` and ``resolve_device``)
TRAINING = ("hash_bins_nonsensitive", "hash_bins_sensitive", "nonsensitive_encoding", "vocab_threshold", "device",
            "data_format")


def parse_args(argv: list[str]) -> argparse.Namespace:
    from trainers.data.synth import SHAPES as KNOWN

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per shape and seed")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated; of {', '.join(KNOWN)}")
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['rows']:,} rows, epsilon {QUICK['epsilons']}, {QUICK['seeds']} seed, "
                         f"shape {QUICK['shapes']}")
    ap.add_argument("--out", type=Path, default=h.RESULTS, help="results folder (default benchmarks/results)")
    ap.add_argument("--name", default=None, help="results file stem (default walr_utility, _quick with --quick)")
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_quick(args, argv, QUICK)
    args.name = args.name or ("walr_utility_quick" if args.quick else "walr_utility")
    args.users = max(1, args.rows // 5)
    args.shape_list = [s for s in str(args.shapes).split(",") if s]
    try:
        args.epsilon_list = [float(e) for e in str(args.epsilons).split(",") if e]
    except ValueError:
        ap.error(f"--epsilons: not a comma-separated list of numbers: {args.epsilons!r}")
    bad = [s for s in args.shape_list if s not in KNOWN] or ([] if args.shape_list else ["(none)"])
    if bad:
        ap.error(f"--shapes: unknown {bad[0]!r}; known: {', '.join(KNOWN)}")
    for what, value in (("--rows", args.rows), ("--seeds", args.seeds)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not args.epsilon_list or not all(0 < e < float("inf") for e in args.epsilon_list):
        ap.error(f"--epsilons must be positive and finite, got {args.epsilons!r}")
    return args


def scenario(*, epsilon: float, n: int, spec) -> str:
    """The shipped example with its epsilon, N and [features] set and the numeric encoding's
    ``[walr]`` keys removed (the plan then encodes one-hot, its row bound derived from [features])."""
    from budgetplan.scenario.examples import adapted

    lines, table = [], None
    for line in adapted(EXAMPLE, epsilon=epsilon, dataset_size=n, features=spec).splitlines():
        if line.startswith("["):
            table = line.split("]")[0].strip("[ ")
        if table == "walr" and line.split("=")[0].strip() in REMOVED:
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _shared_scenario(args) -> dict:
    """What every private plan's scenario shares, the planner's defaults resolved: epsilon, N
    and the features vary by cell and shape (the shapes' features are recorded apart)."""
    from budgetplan.planning.planner import resolve_composition
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape

    text = scenario(epsilon=max(args.epsilon_list), n=args.rows, spec=get_shape(args.shape_list[0]).features)
    shared = resolve_composition(parse_scenario(text)).to_dict()  # as the plans have it
    for key in ("epsilon", "dataset_size", "features"):
        shared.pop(key)
    return shared


def settings(args) -> dict:
    """Every setting of the run: data, plans, encoding and both fits (the library's defaults resolved)."""
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape
    from trainers.run import TrainSettings
    from trainers.settings import WALRSettings
    from trainers.walr_onehot import (
        EB_MIN_COORDINATES,
        EB_PSEUDO,
        EB_ROUND_ITERATIONS,
        EB_ROUNDS,
        EB_TOLERANCE,
        FIT_ITERATIONS,
        L2_BASE,
        PRECISION_RANGE,
        WEIGHT_FLOOR,
    )

    return h.settings_record("walr_utility.py", args.argv, {
        "rows": args.rows, "users": args.users, "seeds": args.seeds,
        "data_seeds": [1000 + s for s in range(args.seeds)], "training_seed": "the data seed", "holdout": HOLDOUT,
        "shapes": {s: get_shape(s).parameters() for s in args.shape_list},
        "features": {s: parse_scenario(scenario(epsilon=1.0, n=args.rows, spec=get_shape(s).features)).to_dict()[
            "features"] for s in args.shape_list},
        "epsilons": args.epsilon_list, "example": EXAMPLE, "removed_walr_keys": list(REMOVED),
        "scenario": _shared_scenario(args),
        # the trainer's defaults that a one-hot WALR run reads (the encoding of both arms: vocabulary,
        # hashing, resolved per plan; the data format; the device); its model and optimiser settings it does not
        "training": {k: v for k, v in TrainSettings().to_dict().items() if k in TRAINING},
        "walr_fit": {"fit": "L-BFGS", "iterations": FIT_ITERATIONS, "l2_base": L2_BASE,
                     "penalty": "lam_j = b_k a_j^2 (1 + s^2 / (c_j p (1 - p))), intercept free",
                     "prior": WALRSettings().prior, "eb_rounds": EB_ROUNDS, "eb_tolerance": EB_TOLERANCE,
                     "eb_min_coordinates": EB_MIN_COORDINATES, "precision_range": list(PRECISION_RANGE),
                     "eb_pseudo_values": EB_PSEUDO, "eb_round_iterations": EB_ROUND_ITERATIONS,
                     "column_weights": "sum_k a_k^2 = R^2 maximising sum_k sum_(j in k) c_j r_j, "
                                       "r_j = a_k^2 c_j v / (a_k^2 c_j v + s^2), v = 1/4",
                     "weight_floor": WEIGHT_FLOOR},
        "non_private": {"fit": "L-BFGS", "iterations": FIT_ITERATIONS, "l2": L2_BASE,
                        "penalty": "WALR's fit at s = 0 (fit_empirical_bayes), intercept free",
                        "release": "the exact sum (noise_std 0)"}})


def _non_private(plan, train, evaluation, seed: int) -> dict:
    """The logistic regression on the rows and encoding of ``plan``'s run, fitted on the exact sum."""
    import torch

    from trainers.inputs import prepare_data, prepare_eval, resolve_device
    from trainers.metrics import evaluate_model
    from trainers.randomness import Randomness
    from trainers.run import TrainSettings
    from trainers.threads import torch_threads
    from trainers.walr_onehot import L2_BASE, encode_rows, fit_empirical_bayes, numeric_range, predict, release

    t0 = time.perf_counter()
    par = plan.walr.params
    spec = plan.scenario.features
    with torch_threads("auto"):
        settings = TrainSettings().for_plan(plan)  # as execute_plan resolves them
        device = resolve_device(settings.device)
        rnd = Randomness(seed)
        prep = prepare_data(train, spec, settings, device, cap=plan.unit.cap, capping=plan.unit.capping,
                        expected_rows=plan.dataset_size, randomness=rnd)
        eval_prep = prepare_eval(evaluation, spec, settings, device, prep.vocabulary)
        lo, hi = numeric_range(prep.data)
        rows, _ = encode_rows(prep.data, lo, hi, row_norm_bound=par.row_norm_bound)
        w = torch.ones(len(rows), dtype=torch.float64, device=rows.scale.device)
        exact, _ = release(rows, prep.data.label.double(), w, noise_std=0.0, sensitivity=par.sensitivity,
                           randomness=rnd)
        theta, precisions = fit_empirical_bayes(rows, exact, w, n_rows=len(rows), noise_std=0.0, base=L2_BASE)
        ev_rows, _ = encode_rows(eval_prep.data, lo, hi, row_norm_bound=par.row_norm_bound)
        metrics = evaluate_model(eval_prep.data.label.cpu().numpy(), predict(theta, ev_rows).cpu().numpy())
    return {"auc": metrics["auc"], "log_loss": metrics["log_loss"], "calibration_ratio": metrics["calibration_ratio"],
            "k": rows.k, "numeric_range": [lo, hi], "encoding": prep.encoding, "prior_precisions": precisions,
            "seconds": time.perf_counter() - t0}


def _unit(args, shape: str, seed: int) -> tuple[dict, list[dict]]:
    """One (shape, seed): its data, the non-private model, then WALR at every epsilon."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from budgetplan.util.typed import to_json
    from trainers.data.synth import get_shape
    from trainers.metrics import relative_auc_loss
    from trainers.run import RunOptions, execute_plan

    spec = get_shape(shape).features
    work = Path(tempfile.mkdtemp(prefix="walr-utility-"))
    cells = []
    try:
        print(f"{shape} seed {seed}: data", file=sys.stderr, flush=True)
        train, evaluation, n = h.holdout_data(shape, seed, args.rows, args.users, work)
        print(f"{shape} seed {seed}: non-private logistic regression", file=sys.stderr, flush=True)
        first = build_plan(parse_scenario(scenario(epsilon=args.epsilon_list[0], n=n, spec=spec)))
        lr = _non_private(first, train, evaluation, 1000 + seed)
        print(f"{shape} seed {seed}: non-private AUC {lr['auc']:.4f} ({lr['seconds']:.0f} s)", file=sys.stderr,
              flush=True)
        for eps in args.epsilon_list:
            t0 = time.perf_counter()
            plan = build_plan(parse_scenario(scenario(epsilon=eps, n=n, spec=spec)))
            par = plan.walr.params
            if par.encoding != "one-hot" or par.row_norm_bound != first.walr.params.row_norm_bound:
                raise RuntimeError(f"the plan at epsilon {eps:g} is not the one-hot plan of the non-private arm")
            rec = execute_plan(plan, train, RunOptions(eval_path=evaluation, out_dir=work / f"run-{eps:g}",
                                                       seed=1000 + seed))
            shutil.rmtree(work / f"run-{eps:g}", ignore_errors=True)
            config = rec.model.config
            # the record's configuration is frozen (tuples): compare JSON with JSON
            if config["features"] != lr["k"] or to_json(config["numeric_range"]) != to_json(lr["numeric_range"]):
                raise RuntimeError(f"{shape} seed {seed} eps {eps:g}: the private run's encoding ({config['features']} "
                                   f"coordinates) is not the non-private arm's ({lr['k']})")
            m = h.eval_metrics(rec)
            loss = None if m["auc"] is None else relative_auc_loss(m["auc"], lr["auc"])
            seconds = time.perf_counter() - t0
            print(f"{shape} seed {seed} eps {eps:g}: WALR AUC {m['auc']:.4f}, relative AUC loss {loss:.2f}% "
                  f"({seconds:.0f} s)", file=sys.stderr, flush=True)
            cells.append({"shape": shape, "seed": seed, "epsilon": eps, "dataset_size": plan.dataset_size,
                          "delta": plan.delta, "noise_std": par.noise_std, "row_norm_bound": par.row_norm_bound,
                          "k": config["features"],
                          "auc": m["auc"], "log_loss": m["log_loss"], "calibration_ratio": m["calibration_ratio"],
                          "relative_auc_loss": loss, "non_private_auc": lr["auc"], "seconds": seconds,
                          "prior_precisions": config.get("prior_precisions"),
                          "plan_sha256": plan.sha256})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    baseline = {k: v for k, v in lr.items() if k not in ("numeric_range", "encoding")}
    enc = lr["encoding"]
    baseline.update(shape=shape, seed=seed, dataset_size=n, encoding={
        g: {k: enc[g][k] for k in ("encoding", "table_size")} for g in ("nonsensitive", "sensitive")})
    return baseline, cells


def run(args) -> dict:
    t0 = time.perf_counter()
    baselines, cells = [], []
    for shape in args.shape_list:
        for seed in range(args.seeds):
            base, part = _unit(args, shape, seed)
            baselines.append(base)
            cells += part
    return {"settings": settings(args), "baselines": baselines, "cells": cells, "machine": h.machine(),
            "seconds": time.perf_counter() - t0}


def render(result: dict) -> str:
    st = result["settings"]["values"]
    lines = ["# WALR on one-hot ads features against a non-private logistic regression", "",
             f"{st['rows']:,} rows per shape and seed ({st['users']:,} users, a fifth of them held out for "
             f"evaluation), {st['seeds']} seed(s); mean +- std over the seeds. WALR: the shipped `{st['example']}` "
             "example at each epsilon with its one-hot encoding (categoricals one-hot, numerics scaled into [0, 1], "
             "row bound derived from [features]), trained by `execute_plan`. Non-private: the same logistic "
             "regression on the same rows and encoding, fitted on the exact sum by WALR's own fit at no noise "
             f"(each column's L2 precision estimated from the data, starting at {st['non_private']['l2']:g}). "
             "Relative AUC loss (%) against the non-private model "
             "(arXiv:2401.15246); calibration ratio mean(p) / mean(y).", "",
             "| shape | epsilon | noise std | WALR AUC | relative AUC loss (%) | calibration ratio | non-private AUC |",
             "|---|---|---|---|---|---|---|"]
    for (shape, eps), cs in sorted(h.by_shape_and_epsilon(result["cells"]).items()):
        lines.append(f"| {shape} | {eps:g} | {h.mean_std([c['noise_std'] for c in cs], 2)} | "
                     f"{h.mean_std([c['auc'] for c in cs], 4)} | "
                     f"{h.mean_std([c['relative_auc_loss'] for c in cs], 2)} | "
                     f"{h.mean_std([c['calibration_ratio'] for c in cs], 3)} | "
                     f"{h.mean_std([c['non_private_auc'] for c in cs], 4)} |")
    return "\n".join(lines + ["", h.settings_markdown(result["settings"])]) + "\n"


def main(argv: list[str]) -> dict:
    return h.run_and_save(parse_args(argv), run, render)


if __name__ == "__main__":
    main(sys.argv[1:])
