"""The noise each batch selection needs at the Criteo shapes: Poisson, random allocation, shuffled batches.

Case: N = 32,000,000 rows, batch B = 16,384, delta = 1/N, add-remove; epochs 1, 2, 4, 16, 64;
target epsilon 1, 2, 4, 8, 12. For each cell, the smallest noise multiplier sigma that meets
the target under:

- Poisson sampling at q = B/N over ceil(E N / B) steps (PLD, the planner's default);
- random allocation, one uniformly random step per example in each epoch of N // B steps,
  by its PLD (what a plan uses; ``budgetplan.accounting.allocation_pld``) and by RDP
  (arXiv:2502.08202; ``budgetplan.accounting.allocation``), and for comparison Poisson at
  q = B/N accounted by the same RDP conversion over the same orders (dp_accounting);
- shuffled fixed-size batches: the guarantee (no amplification, one Gaussian per epoch) and
  the least sigma that Chua et al.'s lower bound (arXiv:2403.17673) allows: no analysis of
  a shuffled run can certify the target with less noise than that.

Why sigma for a target epsilon rather than epsilon at a fixed sigma: sigma is the knob a plan
sets and what utility depends on, the ratios of sigmas compare across rows, and at a fixed
sigma the shuffled run's epsilon spans orders of magnitude (tens to hundreds) where the
others are near 1.

Writes ``benchmarks/results/batch_selection.json`` and ``batch_selection.md``. Not a test:
``python benchmarks/batch_selection.py`` (a few minutes on 2 cores; ``--quick`` keeps
epochs 1, 4, 16 and targets 1, 4, 12; ``--smoke --out DIR`` one cell at N = 8,192, B = 1,024).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time

import harness as h

logging.getLogger("absl").setLevel(logging.ERROR)

N, B = 32_000_000, 16_384
DELTA = 1 / N
EPOCHS, TARGETS = (1, 2, 4, 16, 64), (1.0, 2.0, 4.0, 8.0, 12.0)
QUICK_EPOCHS, QUICK_TARGETS = (1, 4, 16), (1.0, 4.0, 12.0)
# --smoke: one cell of a small case (8 steps per epoch), every accountant of the table on it
SMOKE = {"dataset_size": 8_192, "batch_size": 1_024, "epochs": (1,), "targets": (1.0,)}


def _solve(eps_of, target: float) -> float:
    from budgetplan.planning.calibrate import solve_noise_multiplier

    return solve_noise_multiplier(eps_of, epsilon=target)


def cell(epochs: int, target: float, n: int = N, b: int = B) -> dict:
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from budgetplan.accounting import account, allocation
    from budgetplan.accounting import batch_selection as bs
    from budgetplan.accounting.shuffle import lower_epsilon
    from budgetplan.mechanisms import AllocationDPSGD
    from budgetplan.planning.calibrate import dpsgd_noise_multiplier, steps_for_epochs

    N, B, DELTA = n, b, 1 / n  # the case: the default one, or a small one under --smoke
    t = bs.steps_per_epoch(dataset_size=N, batch_size=B)
    q = B / N
    out: dict = {"epochs": epochs, "target_epsilon": target, "steps_per_epoch": t}
    t0 = time.perf_counter()
    poisson_steps = steps_for_epochs(epochs=epochs, dataset_size=N, batch_size=B)
    out["poisson_pld"] = dpsgd_noise_multiplier(epsilon=target, delta=DELTA, sampling_rate=q, steps=poisson_steps,
                                                adjacency="add-remove").value

    def poisson_rdp(sigma: float) -> float:
        acc = rdp.RdpAccountant(orders=list(allocation.ORDERS))
        acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), poisson_steps)
        return acc.get_epsilon(DELTA)

    out["poisson_rdp"] = _solve(poisson_rdp, target)
    out["allocation"] = _solve(lambda s: account(AllocationDPSGD(noise_multiplier=s, steps_per_epoch=t, epochs=epochs),
                                                 delta=DELTA, adjacency="add-remove").epsilon, target)
    out["allocation_rdp"] = _solve(lambda s: allocation.epsilon(noise_multiplier=s, steps_per_epoch=t, epochs=epochs,
                                                                delta=DELTA), target)
    shuffle = bs.mechanism("shuffle", 1.0, dataset_size=N, batch_size=B, steps=t * epochs)
    out["shuffle_upper"] = _solve(lambda s: account(type(shuffle)(noise_multiplier=s, steps_per_epoch=t,
                                                                  epochs=epochs), delta=DELTA,
                                                    adjacency="add-remove").epsilon, target)
    out["shuffle_lower"] = _solve(lambda s: lower_epsilon(noise_multiplier=s, steps_per_epoch=t, epochs=epochs,
                                                          delta=DELTA), target)
    out["allocation_over_poisson_pld"] = out["allocation"] / out["poisson_pld"]
    out["allocation_rdp_over_poisson_rdp"] = out["allocation_rdp"] / out["poisson_rdp"]
    out["seconds"] = time.perf_counter() - t0
    return out


def render(result: dict) -> str:
    st = result["settings"]["values"]
    n, b = st["dataset_size"], st["batch_size"]
    lines = ["# Noise for a target epsilon, by batch selection (Criteo shapes)", "",
             f"N = {n:,}, B = {b:,} (N // B = {n // b:,} steps per epoch), delta = 1/N, add-remove. Each entry is "
             "the smallest noise multiplier sigma meeting the target. Allocation is accounted by its PLD (what a "
             "plan uses) and, for comparison, by RDP beside `Poisson (RDP)`, Poisson under the same RDP "
             "conversion. Shuffle: "
             "`guarantee` is what a plan uses (no amplification); `lower bound` is the least sigma Chua et al.'s "
             "lower bound allows: below it no analysis can certify the target for shuffled batches.", "",
             "| epochs | target eps | Poisson (PLD) | allocation (PLD) | alloc / Poisson PLD | Poisson (RDP) | "
             "allocation (RDP) | alloc / Poisson RDP | shuffle guarantee | shuffle lower bound |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in result["cells"]:
        lines.append(f"| {c['epochs']} | {c['target_epsilon']:g} | {c['poisson_pld']:.4f} | {c['allocation']:.4f} | "
                     f"{c['allocation_over_poisson_pld']:.4f} | {c['poisson_rdp']:.4f} | {c['allocation_rdp']:.4f} | "
                     f"{c['allocation_rdp_over_poisson_rdp']:.4f} | {c['shuffle_upper']:.3f} | "
                     f"{c['shuffle_lower']:.3f} |")
    lines += ["", h.settings_markdown(result["settings"]), ""]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="epochs 1, 4, 16 and targets 1, 4, 12 only")
    h.add_smoke(parser, out=True)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    args.dataset_size, args.batch_size = N, B
    args.epochs = QUICK_EPOCHS if args.quick else EPOCHS
    args.targets = QUICK_TARGETS if args.quick else TARGETS
    h.apply_smoke(parser, args, argv, SMOKE)
    return args


def settings(args: argparse.Namespace) -> dict:
    """The case and every library default the numbers depend on."""
    from budgetplan.accounting import allocation, allocation_pld, shuffle
    from budgetplan.accounting.account import DEFAULT_DISCRETIZATION
    from budgetplan.planning import calibrate

    return h.settings_record("batch_selection.py", args.argv, {
        "quick": args.quick, "dataset_size": args.dataset_size, "batch_size": args.batch_size,
        "delta": 1 / args.dataset_size, "adjacency": "add-remove", "epochs": list(args.epochs),
        "targets": list(args.targets),
        "poisson": {"discretization": DEFAULT_DISCRETIZATION, "relative_tolerance": calibrate.REL_TOL},
        "allocation": {"pld": {"fineness": allocation_pld.FINENESS,
                               "grid_step": [allocation_pld.MIN_GRID_STEP, allocation_pld.MAX_GRID_STEP],
                               "discretization": DEFAULT_DISCRETIZATION},
                       "orders": [min(allocation.ORDERS), max(allocation.ORDERS)],
                       "add_bound": {"z_step": allocation.Z_STEP, "w_step": allocation.W_STEP,
                                     "phi_slack": allocation.PHI_SLACK}},
        "shuffle_lower": {"cell": shuffle.LOWER_CELL, "discretization": shuffle.LOWER_DISCRETIZATION},
        "search": {"sigma_range": list(calibrate.SIGMA_RANGE)}})


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    cells = []
    for epochs in args.epochs:
        for target in args.targets:
            c = cell(epochs, target, args.dataset_size, args.batch_size)
            print(f"epochs {epochs:>2} eps {target:>4g}: poisson {c['poisson_pld']:.4f}, allocation "
                  f"{c['allocation']:.4f} ({c['allocation_over_poisson_pld']:.4f} of Poisson), shuffle "
                  f"{c['shuffle_lower']:.3f}..{c['shuffle_upper']:.3f} ({c['seconds']:.1f} s)", flush=True)
            cells.append(c)
    result = {"settings": settings(args), "machine": h.machine(), "cells": cells,
              "worst_allocation_over_poisson_pld": max(c["allocation_over_poisson_pld"] for c in cells),
              "best_allocation_over_poisson_pld": min(c["allocation_over_poisson_pld"] for c in cells)}
    print(h.save_results(args.out, "batch_selection", result, render))
    sys.exit(0 if all(math.isfinite(c["allocation"]) for c in cells) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
