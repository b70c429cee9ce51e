"""Calibration speed and accuracy, ours against dp_accounting, measured side by side.

Case (issue #2): the PLD-tight noise multiplier for eps = 2, delta = 1/N, N = 32,000,000,
batch 16,384, 64 epochs (T = 125,000 steps, q = 5.12e-4).

- peer: dp_accounting's ``calibrate_dp_mechanism`` with a default ``PLDAccountant``
  (discretisation 1e-4) and ``tol=1e-3``: 14 PLD evaluations, about 5.7 s on a 2-core
  machine.
- ours: ``budgetplan.dpsgd_noise_multiplier`` with its defaults (discretisation 1e-4,
  relative tolerance 1e-4, the answer re-checked at 5e-5), engine caches cleared before
  every run so nothing is reused between repetitions.
- reference: dp_accounting's own calibration at discretisation 1e-5 (tol 1e-5, bracketed
  around the answer): ours must be within 0.5% of it and never below it.
- user level: K = 8 examples per user (mixture of Gaussians), 3 epochs, eps = 2, delta = 1e-7;
  ours end to end, and one single dp_accounting mixture-of-Gaussians evaluation for scale.

Peer and ours alternate for ``--repeats`` rounds (the machine's other work weighs on both);
the speed-up is the ratio of their medians, with each round's ratio and the load average
beside it. Writes ``benchmarks/results/calibration.json`` and ``calibration.md``. Not a test: run it
with ``python benchmarks/calibration.py`` (about two minutes; ``--quick`` skips the 1e-5
reference and the peer's mixture evaluation; ``--smoke --out DIR``: ``--quick`` with one round).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time

import harness as h

logging.getLogger("absl").setLevel(logging.ERROR)

N, B, EPOCHS, TARGET = 32_000_000, 16_384, 64, 2.0
Q, STEPS, DELTA = B / N, 125_000, 1 / N
USER = dict(cap=8, epochs=3, target=2.0, delta=1e-7)
RESULTS = h.RESULTS
PEER = {"accountant": "PLDAccountant", "discretization": 1e-4, "tol": 1e-3}
REFERENCE = {"accountant": "PLDAccountant", "discretization": 1e-5, "tol": 1e-5, "bracket": [0.99, 1.01]}
# --smoke: one round of the peer against ours and the user level; the 1e-5 reference (a minute) as --quick skips it
SMOKE = {"quick": True, "repeats": 1}


def _clear_caches() -> None:
    h.clear_pld_caches()


def _event(sigma: float, steps: int = STEPS, q: float = Q):
    import dp_accounting as dpa

    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)


def peer_calibration() -> tuple[float, float, int]:
    from dp_accounting import mechanism_calibration as mc
    from dp_accounting.pld import pld_privacy_accountant as pa

    calls = 0

    def fresh():
        nonlocal calls
        calls += 1
        return pa.PLDAccountant()

    t0 = time.perf_counter()
    sigma = mc.calibrate_dp_mechanism(fresh, _event, TARGET, DELTA, tol=PEER["tol"])
    return sigma, time.perf_counter() - t0, calls


def ours_calibration():
    import budgetplan as bp

    _clear_caches()
    t0 = time.perf_counter()
    cal = bp.dpsgd_noise_multiplier(epsilon=TARGET, delta=DELTA, sampling_rate=Q, steps=STEPS)
    return cal, time.perf_counter() - t0


def reference_sigma(near: float) -> tuple[float, float]:
    from dp_accounting import mechanism_calibration as mc
    from dp_accounting.pld import pld_privacy_accountant as pa

    t0 = time.perf_counter()
    low, high = REFERENCE["bracket"]
    sigma = mc.calibrate_dp_mechanism(
        lambda: pa.PLDAccountant(value_discretization_interval=REFERENCE["discretization"]), _event, TARGET, DELTA,
        mc.ExplicitBracketInterval(near * low, near * high), tol=REFERENCE["tol"])
    return sigma, time.perf_counter() - t0


def user_level(quick: bool) -> dict:
    import budgetplan as bp
    from budgetplan.planning.calibrate import steps_for_epochs

    steps = steps_for_epochs(epochs=USER["epochs"], dataset_size=N, batch_size=B)
    unit = bp.PrivacyUnit.capped(USER["cap"])
    _clear_caches()
    t0 = time.perf_counter()
    cal = bp.dpsgd_noise_multiplier(epsilon=USER["target"], delta=USER["delta"], sampling_rate=Q, steps=steps,
                                    unit=unit)
    ours = time.perf_counter() - t0
    out = {"cap": USER["cap"], "steps": steps, "target_epsilon": USER["target"], "delta": USER["delta"],
           "noise_multiplier": cal.value, "epsilon": cal.guarantee.epsilon, "evaluations": cal.evaluations,
           "seconds": ours}
    if not quick:
        import numpy as np
        from dp_accounting.pld import privacy_loss_distribution as pld
        from scipy import stats

        k = USER["cap"]
        t0 = time.perf_counter()
        single = pld.from_mixture_gaussian_mechanism(
            standard_deviation=cal.value, sensitivities=list(range(k + 1)),
            sampling_probs=list(stats.binom.pmf(np.arange(k + 1), k, Q)))
        peer_eps = single.self_compose(steps).get_epsilon_for_delta(USER["delta"])
        out.update(peer_single_evaluation_seconds=time.perf_counter() - t0, peer_epsilon_at_ours=peer_eps)
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the slow 1e-5 reference and peer MoG run")
    parser.add_argument("--repeats", type=int, default=5)
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    h.apply_smoke(parser, args, argv, SMOKE)
    return args


def settings(args: argparse.Namespace) -> dict:
    """The case, the peer's and the reference's settings, and our calibration's library defaults."""
    from budgetplan.accounting.account import DEFAULT_DISCRETIZATION
    from budgetplan.planning import calibrate

    return h.settings_record("calibration.py", args.argv, {
        "quick": args.quick, "repeats": args.repeats, "rounds": "peer and ours alternate, each timed every round",
        "case": {"dataset_size": N, "batch_size": B, "epochs": EPOCHS, "steps": STEPS, "sampling_rate": Q,
                 "target_epsilon": TARGET, "delta": DELTA},
        "user_level": USER, "peer": PEER, "reference": None if args.quick else REFERENCE,
        "ours": {"discretization": DEFAULT_DISCRETIZATION, "relative_tolerance": calibrate.REL_TOL,
                 "verify": True, "caches_cleared": True}})


def main(argv: list[str]) -> None:
    args = parse_args(argv)

    # Rounds alternate peer and ours, so that whatever else the machine runs weighs on both.
    load_before = os.getloadavg()[0]
    peers, runs = [], []
    for _ in range(args.repeats):
        peers.append(peer_calibration())
        runs.append(ours_calibration())
    load_after = os.getloadavg()[0]
    peer_sigma, _, peer_calls = peers[0]
    peer_s = statistics.median(t for _, t, _ in peers)
    ours_s = statistics.median(t for _, t in runs)
    ratios = [pt / ot for (_, pt, _), (_, ot) in zip(peers, runs)]
    cal = runs[0][0]
    result = {
        "settings": settings(args),
        "case": {"dataset_size": N, "batch_size": B, "epochs": EPOCHS, "steps": STEPS, "sampling_rate": Q,
                 "target_epsilon": TARGET, "delta": DELTA},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1min_before": load_before, "load_average_1min_after": load_after},
        "versions": dict(cal.guarantee.versions),
        "peer": {"what": "dp_accounting calibrate_dp_mechanism, PLDAccountant(1e-4), tol=1e-3",
                 "noise_multiplier": peer_sigma, "seconds": peer_s, "seconds_all": [t for _, t, _ in peers],
                 "evaluations": peer_calls},
        "ours": {"what": "budgetplan.dpsgd_noise_multiplier (defaults, caches cleared)",
                 "noise_multiplier": cal.value, "epsilon": cal.guarantee.epsilon,
                 "verified_epsilon_half_grid": cal.verified_epsilon, "evaluations": cal.evaluations,
                 "seconds_median": ours_s, "seconds_all": [t for _, t in runs]},
        "speedup": peer_s / ours_s,
        "speedup_per_round": ratios,
    }
    if not args.quick:
        ref, ref_s = reference_sigma(cal.value)
        result["reference"] = {"what": "dp_accounting calibrate_dp_mechanism at discretisation 1e-5, tol 1e-5",
                               "noise_multiplier": ref, "seconds": ref_s,
                               "ours_relative_difference": cal.value / ref - 1,
                               "ours_not_below": cal.value >= ref}
    result["user_level"] = user_level(args.quick)

    print(h.save_results(args.out, "calibration", result, _markdown))


def _markdown(r: dict) -> str:
    c, p, o = r["case"], r["peer"], r["ours"]
    lines = [
        "# Calibration benchmark",
        "",
        f"PLD-tight noise multiplier for eps={c['target_epsilon']}, delta=1/N, N={c['dataset_size']:,}, "
        f"batch {c['batch_size']:,}, {c['epochs']} epochs ({c['steps']:,} steps). "
        f"Machine: {r['machine']['platform']}, {r['machine']['cpus']} CPUs.",
        "",
        "| method | noise multiplier | seconds | evaluations |",
        "|---|---|---|---|",
        f"| {p['what']} | {p['noise_multiplier']:.6f} | {p['seconds']:.2f} (median of {len(p['seconds_all'])}, "
        f"{min(p['seconds_all']):.2f}-{max(p['seconds_all']):.2f}) | {p['evaluations']} |",
        f"| {o['what']} | {o['noise_multiplier']:.6f} | {o['seconds_median']:.3f} (median of "
        f"{len(o['seconds_all'])}, {min(o['seconds_all']):.3f}-{max(o['seconds_all']):.3f}) | {o['evaluations']} |",
    ]
    if "reference" in r:
        ref = r["reference"]
        lines.append(f"| {ref['what']} | {ref['noise_multiplier']:.6f} | {ref['seconds']:.1f} | |")
    per = r["speedup_per_round"]
    m = r["machine"]
    lines += ["", f"Speed-up: **{r['speedup']:.1f}x** (the peer's median seconds / ours, rounds alternating "
              f"peer and ours; per round {min(per):.1f}-{max(per):.1f}x). Load average (1 min) "
              f"{m['load_average_1min_before']:.2f} before, {m['load_average_1min_after']:.2f} after."]
    if "reference" in r:
        ref = r["reference"]
        lines.append(f"Ours vs the 1e-5 reference: {100 * ref['ours_relative_difference']:+.3f}% "
                     f"({'not below' if ref['ours_not_below'] else 'BELOW'} it).")
    u = r["user_level"]
    lines += ["", f"User level, K={u['cap']} (mixture of Gaussians), {u['steps']:,} steps, eps={u['target_epsilon']}, "
              f"delta={u['delta']}: noise multiplier {u['noise_multiplier']:.6f} in {u['seconds']:.2f} s "
              f"({u['evaluations']} evaluations)."]
    if "peer_single_evaluation_seconds" in u:
        lines.append(f"One dp_accounting mixture-of-Gaussians evaluation at that sigma takes "
                     f"{u['peer_single_evaluation_seconds']:.1f} s (epsilon {u['peer_epsilon_at_ours']:.6f}).")
    if "settings" in r:
        lines += ["", h.settings_markdown(r["settings"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
