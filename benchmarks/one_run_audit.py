"""One-run audits of trained models: the plan's trade-off curve tested, honest and with the noise halved.

For each plan epsilon (``--epsilons``), canary count (``--canaries``) and seed, the audit
plan (``trainers.canary.audit_scenario``: DP-SGD under semi-sensitive DP on the built-in
synthetic data, ``--rows-per-canary`` rows per canary, Poisson rate 0.5, 5 epochs) is
trained by ``canary_audit``, that many rows replaced by canaries whose labels are secret
coins: with the installed trainer, with the DP-SGD noise halved and with per-example
clipping off (the planted defects of ``tests/trainers/mutants.py``). Each run's model is
queried on the canaries and its guesses test the plan's trade-off curve
(``budgetplan.audit.canary``: the f-DP analysis of arXiv:2410.22235, confidence 0.95,
Bonferroni over the guess fractions). ``refuted``: runs whose guesses refute the plan's own
curve (``budgetplan audit`` fails them); ``noise divisor``: the largest s such that the
plan with its noise divided by s is refuted, and the bound is that mechanism's epsilon.
``dprime`` is the canaries' score separation (mean difference over the pooled sd).
Training seeds and canary coins are fixed per seed (``--first-seed``), so the numbers
reproduce.

Beside the runs, the same audit on ideal canaries (``ideal``): scores drawn exactly from a
mu-Gaussian mechanism whose epsilon at the plan's delta is the plan's (mu-GDP, Dong, Roth and
Su, arXiv:1905.02383), honest (mu) and with the noise halved (2 mu), at each canary count
and at ``--ideal-canaries``.

And the white-box audit of the DP-SGD step (``trainers.empirical.one_run``, gradient
canaries at each of ``--step-canaries``; ``budgetplan audit --one-run`` uses a million),
honest and with the noise halved (``step``).

Arms: ``--models`` (``fm``: a linear weight per value, where a canary's own parameters hold
most of its gradient; ``mlp``, the default model) and ``--optimizers`` of the DP-SGD phase
(``adam``, the default, at step size 0.01 as measured (``ADAM_LR``), whose per-coordinate step
sizes keep little more than the sign of a canary's noisy sum; ``sgd``, under which the score
is linear in it). Writes
``benchmarks/results/one_run_audit.json`` and ``.md``. Not a test: run it with
``python benchmarks/one_run_audit.py`` (about 25 minutes on 2 cores). ``--smoke --out DIR``: every arm
(honest, noise halved, clipping off) under both optimisers, the FM model only, on one seed of 300 canaries,
then the step and ideal audits small.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness as h

sys.path.insert(0, str(h.ROOT))

RESULTS = h.RESULTS
DATA_SEED = 1
ARMS = {"honest": None, "noise halved": "NOISE_HALVED", "clipping off": "CLIPPING_OFF"}  # mutants.py names
ADAM_LR = 0.01  # the adam arm's DP-SGD step size results/one_run_audit.json was measured at (the default then)
# --smoke: each planted defect under each optimiser once, at sizes that prove nothing (the audit's power is
# tests/trainers/test_canary.py's and this script's real run's); the MLP model is one setting away
SMOKE = {"seeds": 1, "canaries": [300], "epsilons": [4.0], "models": ["fm"], "hash_bins": 4096,
         "ideal_canaries": 2_000, "step_canaries": [1_000]}


def _dpsgd_settings(optimizer: str, args: argparse.Namespace):
    """The DP-SGD phase's settings of an arm: adam at ADAM_LR, sgd at --sgd-lr."""
    from trainers.dpsgd import DPSGDSettings

    return DPSGDSettings(lr=ADAM_LR) if optimizer == "adam" else DPSGDSettings(optimizer="sgd", lr=args.sgd_lr)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="runs per arm")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--canaries", type=int, nargs="+", default=[5_000, 20_000])
    parser.add_argument("--rows-per-canary", type=int, default=4, help="rows of data per canary (the rest real)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 4.0])
    parser.add_argument("--delta", type=float, default=1e-8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--models", nargs="+", default=["fm", "mlp"], choices=["fm", "mlp"])
    parser.add_argument("--optimizers", nargs="+", default=["adam", "sgd"], choices=["adam", "sgd"],
                        help="the DP-SGD phase's optimiser (adam at lr 0.01; sgd at --sgd-lr)")
    parser.add_argument("--sgd-lr", type=float, default=1.0)
    parser.add_argument("--embedding-dim", type=int, default=4)
    parser.add_argument("--hash-bins", type=int, default=2**20)
    parser.add_argument("--ideal-canaries", type=int, default=1_000_000)
    parser.add_argument("--step-canaries", type=int, nargs="+", default=[5_000, 1_000_000])
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    h.apply_smoke(parser, args, argv, SMOKE)
    if args.seeds < 1 or min(args.canaries) < 2 or args.rows_per_canary < 1 or min(args.step_canaries) < 2:
        parser.error("need --seeds >= 1, --canaries and --step-canaries >= 2, --rows-per-canary >= 1")
    args.argv = list(argv)
    return args


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the runs, the library's defaults read from it."""
    from budgetplan.audit.canary import DEFAULT_CONFIDENCE, GUESS_FRACTIONS

    return h.settings_record("one_run_audit.py", args.argv, {
        "seeds": args.seeds, "first_seed": args.first_seed, "rows_per_canary": args.rows_per_canary,
        "data_seed": DATA_SEED, "canaries": args.canaries, "sampling_rate": 0.5, "step_canaries": args.step_canaries,
        "epsilons": args.epsilons, "delta": args.delta,
        "epochs": args.epochs, "clipping_norm": args.clip, "models": args.models, "optimizers": args.optimizers,
        "sgd_lr": args.sgd_lr,
        "embedding_dim": args.embedding_dim, "hash_bins": args.hash_bins,
        "ideal_canaries": args.ideal_canaries, "confidence": DEFAULT_CONFIDENCE,
        "guess_fractions": GUESS_FRACTIONS, "dpsgd": _dpsgd_settings("adam", args).to_dict(), "arms": list(ARMS)})


def _run(plan, data, out, model, args, seed, arm, optimizer: str, canaries: int) -> dict:
    import numpy as np
    from _pytest.monkeypatch import MonkeyPatch

    from tests.trainers import mutants
    from trainers.canary import CANARY_DATA, canary_audit, score_canaries
    from trainers.data.synth import SYNTH_FEATURES
    from trainers.randomness import Randomness
    from trainers.run import RunOptions, TrainSettings

    settings_ = TrainSettings(model=model, embedding_dim=args.embedding_dim, nonsensitive_encoding="hash",
                              hash_bins_nonsensitive=args.hash_bins, hash_bins_sensitive=args.hash_bins)
    patch = MonkeyPatch()
    if ARMS[arm] is not None:
        getattr(mutants, ARMS[arm]).install(patch)
    t0 = time.perf_counter()
    try:
        dpsgd = _dpsgd_settings(optimizer, args)
        rec = canary_audit(plan, data, RunOptions(out_dir=out, settings=settings_, seed=1000 + seed, threads=2,
                                                  dpsgd_settings=dpsgd),
                           canaries=canaries, canary_randomness=Randomness(2000 + seed))
    finally:
        patch.undo()
    seconds = time.perf_counter() - t0
    one = rec.private_part.one_run
    # the separation of the scores, for the record (the bound does not use it)
    import pyarrow.parquet as pq

    table = pq.read_table(out / CANARY_DATA)
    col = SYNTH_FEATURES.sensitive_categorical[0]
    values = np.asarray(table.column(col).to_pylist(), dtype=str)
    pos = np.flatnonzero(np.char.find(values, f"{col}:canary-") == 0)
    scores = score_canaries(out, table.take(pos), SYNTH_FEATURES, rec)
    y = table.column(SYNTH_FEATURES.label).take(pos).to_numpy()
    dprime = (scores[y == 1].mean() - scores[y == 0].mean()) / np.sqrt(0.5 * (scores[y == 1].var() +
                                                                              scores[y == 0].var()))
    return {"seed": seed, "epsilon_lower_bound": one["epsilon_lower_bound"], "noise_divisor": one["noise_divisor"],
            "refutes_plan": one["refutes_plan"], "correct": one["correct"], "guesses": one["guesses"],
            "k": one["k_pos"], "dprime": float(dprime), "seconds": seconds}


def _step(plan, seed: int, arm: str, canaries: int) -> dict:
    from _pytest.monkeypatch import MonkeyPatch

    from tests.trainers import mutants
    from trainers.empirical.one_run import dpsgd_one_run
    from trainers.randomness import Randomness

    patch = MonkeyPatch()
    if ARMS[arm] is not None:
        getattr(mutants, ARMS[arm]).install(patch)
    try:
        row = dpsgd_one_run(plan.dpsgd, canaries=canaries, randomness=Randomness(3000 + seed))
    finally:
        patch.undo()
    return {k: row[k] for k in ("epsilon_lower_bound", "noise_divisor", "refutes_plan", "correct", "guesses",
                                "canaries", "seconds")}


def gdp_mu(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is (epsilon, delta)-DP exactly (arXiv:1905.02383, Cor. 2.13)."""
    import math

    from scipy import optimize, stats

    def excess(mu: float) -> float:
        return (stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2)
                - delta)

    return float(optimize.brentq(excess, 1e-6, 50.0, xtol=1e-12))


def ideal(plan, m: int, seed: int) -> dict:
    """The audit of ``plan`` on m ideal canaries of the mu-GDP mechanism at its (epsilon, delta), honest and at 2 mu."""
    import numpy as np

    from budgetplan.audit.canary import bound_from_scores
    from budgetplan.audit.fdp import plan_family

    mu = gdp_mu(plan.guarantee.epsilon, plan.guarantee.delta)
    rng = np.random.default_rng(seed)
    out = {"mu": mu, "canaries": m}
    for name, shift in (("honest", mu), ("noise halved", 2 * mu)):
        bits = rng.integers(0, 2, m)
        res = bound_from_scores(rng.normal(0.0, 1.0, m) + shift * bits, bits, family=plan_family(plan))
        out[name] = {k: res[k] for k in ("epsilon_lower_bound", "noise_divisor", "refutes_plan", "correct",
                                         "guesses")}
    return out


def _plan(eps: float, m: int, args: argparse.Namespace):
    """The audit plan at ``eps`` for ``m`` canaries, built once per (eps, m)."""
    key = (eps, m)
    if key not in _PLANS:
        _PLANS[key] = _build_plan(eps, m, args)
    return _PLANS[key]


_PLANS: dict = {}


def _build_plan(eps: float, m: int, args: argparse.Namespace):
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.canary import audit_scenario
    from trainers.data.synth import SYNTH_FEATURES

    rows = m * args.rows_per_canary
    return build_plan(parse_scenario(audit_scenario(
        epsilon=eps, delta=args.delta, dataset_size=rows, batch_size=rows // 2, epochs=args.epochs,
        clipping_norm=args.clip, spec=SYNTH_FEATURES)))


def main(argv: list[str]) -> None:
    import pyarrow.parquet as pq

    from trainers.data.synth import synthesize

    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    plans, arms = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.canaries:
            rows = m * args.rows_per_canary
            data = Path(tmp) / f"train-{rows}.parquet"
            pq.write_table(synthesize(rows, rows // 5, DATA_SEED), data)
            for eps in args.epsilons:
                plan = _plan(eps, m, args)
                par = plan.dpsgd.params
                plans.append({"epsilon": plan.guarantee.epsilon, "delta": plan.guarantee.delta, "rows": rows,
                              "canaries": m, "noise_multiplier": par.noise_multiplier,
                              "sampling_rate": par.sampling_rate, "steps": par.steps,
                              "clipping_norm": par.clipping_norm})
                for model, optimizer in [(md, o) for md in args.models for o in args.optimizers]:
                    for arm in ARMS:
                        runs = []
                        for seed in range(args.first_seed, args.first_seed + args.seeds):
                            out = Path(tmp) / f"{m}-{eps}-{model}-{optimizer}-{arm.replace(' ', '_')}-{seed}"
                            runs.append(_run(plan, data, out, model, args, seed, arm, optimizer, m))
                            print(m, eps, model, optimizer, arm, runs[-1], flush=True)
                        bounds = [r["epsilon_lower_bound"] for r in runs]
                        arms.append({"plan_epsilon": plan.guarantee.epsilon, "canaries": m, "model": model,
                                     "optimizer": optimizer, "arm": arm, "runs": runs,
                                     "bound_min": min(bounds), "bound_median": statistics.median(bounds),
                                     "bound_max": max(bounds),
                                     "noise_divisor_median": statistics.median(r["noise_divisor"] for r in runs),
                                     "dprime_median": statistics.median(r["dprime"] for r in runs),
                                     "refuted": sum(r["refutes_plan"] for r in runs)})
    steps = []
    for eps in args.epsilons:
        plan = _plan(eps, args.canaries[0], args)
        for m in args.step_canaries:
            for arm in ("honest", "noise halved"):
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    steps.append({"plan_epsilon": plan.guarantee.epsilon, "arm": arm, "seed": seed,
                                  **_step(plan, seed, arm, m)})
                    print("step", steps[-1], flush=True)
    ideals = []
    for eps in args.epsilons:
        plan = _plan(eps, args.canaries[0], args)
        for m in sorted(set(args.canaries) | {args.ideal_canaries}):
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                ideals.append({"plan_epsilon": plan.guarantee.epsilon, **ideal(plan, m, seed)})
    result = {"settings": settings(args), "plans": plans, "arms": arms, "step": steps, "ideal": ideals,
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average_1min_before": load_before, "load_average_1min_after": os.getloadavg()[0]}}
    print(h.save_results(args.out, "one_run_audit", result, _markdown))


def _markdown(r: dict) -> str:
    lines = ["# One-run audit of trained models: the plan's trade-off curve tested (arXiv:2410.22235)", ""]
    seen = set()
    for p in r["plans"]:
        if (p["epsilon"], p["noise_multiplier"]) in seen:
            continue
        seen.add((p["epsilon"], p["noise_multiplier"]))
        lines.append(f"- plan at epsilon {p['epsilon']:.4g} (delta {p['delta']:.3g}): DP-SGD under semi-sensitive DP, "
                     f"sigma {p['noise_multiplier']:.4g}, q {p['sampling_rate']:.4g}, {p['steps']} steps, "
                     f"C {p['clipping_norm']:g}")
    lines += ["", "A query of the trained model on the canaries (confidence 0.95). refuted: runs whose guesses refute "
              "the plan's own trade-off curve, which fails `budgetplan audit`. noise divisor: the largest s such that "
              "the plan with its noise divided by s is refuted (the noise halved is s = 2); the bound is that "
              "mechanism's epsilon at the plan's delta. A canary's score is how far training moved its logit from the "
              "initial model's; each canary value has hashed rows of its own; the data holds "
              f"{r['settings']['values']['rows_per_canary']} rows per canary. dprime: the canaries' score separation.",
              "",
              "| plan epsilon | canaries | model | DP-SGD optimiser | arm | bound min | median | max | noise divisor "
              "(median) | refuted | dprime | s per run |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in r["arms"]:
        secs = statistics.median(x["seconds"] for x in a["runs"])
        lines.append(f"| {a['plan_epsilon']:.3g} | {a['canaries']:,} | {a['model']} | {a['optimizer']} | {a['arm']} | "
                     f"{a['bound_min']:.3f} | {a['bound_median']:.3f} | {a['bound_max']:.3f} | "
                     f"{a['noise_divisor_median']:.3f} | {a['refuted']} of {len(a['runs'])} | "
                     f"{a['dprime_median']:.2f} | {secs:.1f} |")
    lines += ["", "The DP-SGD step audited in one run with white-box gradient canaries "
              "(`budgetplan audit --one-run` uses a million):", "",
              "| plan epsilon | canaries | arm | seed | bound | noise divisor | refuted | correct of guesses "
              "| seconds |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in r["step"]:
        lines.append(f"| {row['plan_epsilon']:.3g} | {row['canaries']:,} | {row['arm']} | {row['seed']} | "
                     f"{row['epsilon_lower_bound']:.3f} | {row['noise_divisor']:.3f} | "
                     f"{'yes' if row['refutes_plan'] else 'no'} | {row['correct']:,} of {row['guesses']:,} | "
                     f"{row['seconds']:.1f} |")
    lines += ["", "Ideal canaries: scores drawn from the mu-Gaussian mechanism whose epsilon at the plan's delta is "
              "the plan's (honest), and from 2 mu (noise halved): the most a score of that mechanism could show.", "",
              "| plan epsilon | mu | canaries | honest bound | noise divisor | noise halved bound | noise divisor |",
              "|---|---|---|---|---|---|---|"]
    for row in r["ideal"]:
        hon, hal = row["honest"], row["noise halved"]
        lines.append(f"| {row['plan_epsilon']:.3g} | {row['mu']:.3f} | {row['canaries']:,} | "
                     f"{hon['epsilon_lower_bound']:.3f} | {hon['noise_divisor']:.3f} | "
                     f"{hal['epsilon_lower_bound']:.3f} | {hal['noise_divisor']:.3f} |")
    lines += ["", h.settings_markdown(r["settings"]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
