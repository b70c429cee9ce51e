"""What RR's labels are worth in clean labels: the RR ceiling trained on the share of rows they equal.

Randomized response flips each label with probability rho = 1 / (1 + e^eps). For a row whose
label is 1 with probability p, the flipped label is 1 with probability q = rho + (1 - 2 rho) p,
and the Fisher information it carries about the logit of p is

    (1 - 2 rho)^2 p^2 (1 - p)^2 / (q (1 - q))    against p (1 - p) for the clean label.

Over the rows of a model that reads the non-sensitive features alone (RR's model), with p_i =
E[y | the row's non-sensitive features], the RR labels therefore carry the information of a
share

    F = sum_i (1 - 2 rho)^2 p_i^2 (1 - p_i)^2 / (q_i (1 - q_i))  /  sum_i p_i (1 - p_i)

of the clean labels (``fisher_share``). At eps 3 and a 4-5% base rate F is about a half: the
flips cost more than their 4.7% suggests, because the rows that carry the information (the
positives) are rare and each flipped negative looks like one.

This benchmark measures that yardstick on the utility frontier's own data: per shape and seed,
the truncated non-private model (non-sensitive features only, clean labels, the frontier's
trainer and early stopping) trained on a share F of the training users (by a fixed hash of the
unit id), evaluated on the frontier's held-out users, beside the frontier's truncated model on
all of them (RR's ceiling) and the frontier's RR arm. If RR at eps sits about where the clean
share sits, the RR phase is using what its labels hold, and no training choice can bring it
much closer to the ceiling: only more rows or a larger epsilon can. It is a yardstick, not a
bound (the Fisher information is an asymptotic, local measure; the trainer is the same one).

p_i is the generator's own (``trainers.data.synth.nonsensitive_probability``), so this runs on
the built-in shapes only. The data, seeds, rows, users, trainer and baseline settings are read
from the frontier results file (``--frontier``), whose RR cells and baselines it compares with.

Not a test: ``python benchmarks/rr_information.py`` (the 1M-row frontier's 5 shapes x 3 seeds at
eps 3, about 5 minutes on 2 cores); ``--smoke --out DIR``: the 20,000-row quick frontier, one
shape, eps 8. Writes ``<out>/rr_information.json`` and ``.md`` (``--out`` defaults to
benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness as h
import utility_frontier as uf

RESULTS = h.RESULTS
FRONTIER = RESULTS / "utility_frontier.json"
QUICK_FRONTIER = RESULTS / "utility_frontier_quick.json"
EPSILONS = [3.0]
SMOKE = {"frontier": QUICK_FRONTIER, "shapes": "mixed-ns", "epsilons": "8"}
# the users kept for a share s: those whose id * SHARE_HASH (mod 2^64), read as a fraction of 2^64, is below s
SHARE_HASH = 0xBF58476D1CE4E5B9


def fisher_share(p, epsilon: float) -> float:
    """The share of the clean labels' Fisher information (about each row's logit) that RR at
    ``epsilon`` keeps, over rows whose labels are 1 with probabilities ``p`` (module docstring)."""
    import numpy as np

    p = np.asarray(p, dtype=np.float64)
    rho = 1.0 / (1.0 + math.exp(epsilon))
    q = rho + (1.0 - 2.0 * rho) * p
    clean = p * (1.0 - p)
    kept = (1.0 - 2.0 * rho) ** 2 * clean ** 2 / (q * (1.0 - q))
    return float(kept.sum() / clean.sum())


def kept_users(ids, share: float):
    """Whether each unit id is among the users kept for ``share`` (a fixed hash: the same ids at every share)."""
    import numpy as np

    u = np.asarray(ids).astype(np.uint64) * np.uint64(SHARE_HASH)
    return (u >> np.uint64(11)).astype(np.float64) / 2.0 ** 53 < share


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frontier", type=Path, default=FRONTIER, help="the utility frontier's results file")
    ap.add_argument("--shapes", default=None, help="comma-separated (default: the frontier file's)")
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS),
                    help="each must be one of the frontier file's")
    h.add_smoke(ap, out=True)
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(ap, args, argv, SMOKE)
    args.frontier = Path(args.frontier)
    if not args.frontier.is_file():
        ap.error(f"--frontier: no such file {str(args.frontier)!r}")
    recorded = json.loads(args.frontier.read_text())
    args.recorded = recorded
    values = recorded["settings"]["values"]
    known = list(values["shapes"])
    args.shape_list = known if args.shapes is None else [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in args.shape_list:
        if s not in known:
            ap.error(f"--shapes: {s!r} is not a shape of {args.frontier.name} ({', '.join(known)})")
    try:
        args.epsilon_list = [float(e) for e in args.epsilons.split(",")]
    except ValueError:
        ap.error(f"--epsilons must be numbers, got {args.epsilons!r}")
    for e in args.epsilon_list:
        if e not in values["epsilons"]:
            ap.error(f"--epsilons: {e:g} is not an epsilon of {args.frontier.name} "
                     f"({', '.join(f'{x:g}' for x in values['epsilons'])})")
    return args


def _frontier_args(values: dict) -> argparse.Namespace:
    """The frontier script's options as its file records them (the trainer's and the plan's settings)."""
    return uf.parse_args(["--jobs", "1", "--rows", str(values["rows"]), "--users", str(values["users"])])


def settings(args) -> dict:
    values = args.recorded["settings"]["values"]
    train, _ = uf.trainer_settings(_frontier_args(values))
    return h.settings_record("rr_information.py", args.argv, {
        "frontier": {"file": args.frontier.name, "commit": args.recorded["settings"].get("commit"),
                     "rows": values["rows"], "users": values["users"], "data_seeds": values["data_seeds"]},
        "shapes": args.shape_list, "epsilons": args.epsilon_list,
        "p": "trainers.data.synth.nonsensitive_probability on the training rows",
        "share_users": f"id * {SHARE_HASH:#x} (mod 2^64) / 2^64 < F", "training_seed": "the data seed",
        "training": train.to_dict(), "baseline": uf.baseline_settings().to_dict(), "threads": 1,
        "model": "run_baseline, truncated=True"})


def _unit(args, shape: str, seed_index: int) -> list[dict]:
    import numpy as np
    import pyarrow.parquet as pq

    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape, nonsensitive_probability
    from trainers.metrics import relative_auc_loss
    from trainers.run import run_baseline

    values = args.recorded["settings"]["values"]
    seed = values["data_seeds"][seed_index] - 1000
    spec = get_shape(shape).features
    fargs = _frontier_args(values)
    train_settings, _ = uf.trainer_settings(fargs)
    baseline = args.recorded["baselines"][f"{shape}|{seed}"]
    work = Path(tempfile.mkdtemp(prefix="rr-information-"))
    out = []
    try:
        train, evaluation, n = h.holdout_data(shape, seed, values["rows"], values["users"], work)
        table = pq.read_table(train)
        p = nonsensitive_probability(table, shape)
        plan = build_plan(parse_scenario(uf.scenario(fargs, epsilon=args.epsilon_list[0], split="alpha=0.5", n=n,
                                                     spec=spec)))
        for eps in args.epsilon_list:
            t0 = time.perf_counter()
            share = fisher_share(p, eps)
            keep = kept_users(table.column(spec.unit_id).to_numpy(), share)
            part = work / f"share-{eps:g}.parquet"
            pq.write_table(table.filter(keep), part)
            rec = run_baseline(plan, part, eval_path=evaluation, settings=train_settings,
                               baseline=uf.baseline_settings(), seed=1000 + seed, truncated=True, threads=1)
            auc = h.eval_metrics(rec)["auc"]
            rr = args.recorded["cells"][f"{shape}|{seed}|{float(eps)}|RR"]
            ref, ceiling = baseline["all"]["auc"], baseline["nonsensitive"]["auc"]
            above = relative_auc_loss(ceiling, ref)
            cell = {"shape": shape, "seed": seed, "epsilon": eps, "fisher_share": share,
                    "base_rate": float(np.mean(p)), "rows": int(keep.sum()), "training_rows": n,
                    "share_auc": auc, "ceiling_auc": ceiling, "rr_auc": rr["auc"], "reference_auc": ref,
                    "share_above_ceiling": relative_auc_loss(auc, ref) - above,
                    "rr_above_ceiling": rr["relative_auc_loss"] - above,
                    "seconds": time.perf_counter() - t0}
            print(f"{shape} seed {seed} eps {eps:g}: F = {share:.3f}, clean share {cell['share_above_ceiling']:+.2f}, "
                  f"RR {cell['rr_above_ceiling']:+.2f} points from the ceiling ({cell['seconds']:.0f} s)",
                  file=sys.stderr, flush=True)
            out.append(cell)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def render(result: dict) -> str:
    st = result["settings"]["values"]
    f = st["frontier"]
    intro = (f"The frontier's data ({f['file']}, {f['rows']:,} rows by {f['users']:,} users per shape and seed, "
             f"a fifth of the users held out; {len(f['data_seeds'])} seed(s), mean +- std). "
             "F: the share of the clean labels' Fisher information that randomized response at epsilon keeps "
             "over the rows, with each row's probability given its non-sensitive features taken from the "
             "generator. `clean share`: the truncated non-private model (non-sensitive features only) trained "
             "on a share F of the training users; `RR`: the frontier's RR arm. Each is given in points of "
             "relative AUC loss above RR's ceiling (the truncated model on all training users), the "
             "frontier's criterion being within 3 points at epsilon 3 and 1 from 8.")
    lines = ["# RR's labels in clean labels: the RR ceiling trained on the share they are worth", "", intro, "",
             "| shape | epsilon | F | base rate | clean share - ceiling | RR - ceiling |", "|---|---|---|---|---|---|"]
    for (shape, eps), cs in h.by_shape_and_epsilon(result["cells"]).items():
        lines.append(f"| {shape} | {eps:g} | {h.mean_std([c['fisher_share'] for c in cs], 3)} | "
                     f"{h.mean_std([c['base_rate'] for c in cs], 4)} | "
                     f"{h.mean_std([c['share_above_ceiling'] for c in cs], 2)} | "
                     f"{h.mean_std([c['rr_above_ceiling'] for c in cs], 2)} |")
    return "\n".join(lines + ["", h.settings_markdown(result["settings"])]) + "\n"


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    cells = []
    seeds = len(args.recorded["settings"]["values"]["data_seeds"])
    for shape in args.shape_list:
        for i in range(seeds):
            cells += _unit(args, shape, i)
    result = {"settings": settings(args), "cells": cells, "machine": h.machine(), "seconds": time.perf_counter() - t0}
    text = h.save_results(args.out, "rr_information", result, render)
    print(text)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
