"""Sweeps of Hybrid splits: every (total epsilon, split rule) cell, calibrated.

Each cell gives eps1 and the RR flip probability for the RR phase, eps2 and the DP-SGD
noise multiplier calibrated to (eps2, delta). Cells with eps2 = 0 (alpha = 1) have no
DP-SGD phase; cells with eps1 = 0 (alpha = 0) no RR phase. Cells that share an eps2
share one calibration. The sweep skips the half-grid re-check of each calibration (the
answer still meets its target at the working grid, with the usual margin); ``budgetplan
plan`` re-checks the cell it plans. Progress shows on stderr.
"""

from __future__ import annotations

from budgetplan.accounting import rr
from budgetplan.calibrate import Calibration, dpsgd_noise_multiplier
from budgetplan.split import choose_split

__all__ = ["sweep"]


def sweep(epsilons, rules, *, delta: float, sampling_rate: float, steps: int, adjacency: str = "replace-one",
          method: str = "pld", progress: bool = False) -> list[dict]:
    """One dict per (epsilon, rule): alpha (resolved), epsilon1, flip_probability, epsilon2, noise_multiplier,
    dpsgd_epsilon."""
    cells = [(e, r) for e in epsilons for r in rules]
    out = []
    calibrated: dict[float, Calibration] = {}
    bar = _progress(len(cells)) if progress else None
    try:
        for eps, rule in cells:
            choice = choose_split(eps, rule)
            eps1, eps2 = choice.epsilon1, choice.epsilon2
            cell = {"epsilon": eps, "rule": str(rule), "alpha": choice.alpha, "epsilon1": eps1,
                    "flip_probability": rr.flip_probability(eps1) if eps1 > 0 else None,
                    "epsilon2": eps2, "noise_multiplier": None, "dpsgd_epsilon": None}
            if eps2 > 0:
                if eps2 not in calibrated:
                    calibrated[eps2] = dpsgd_noise_multiplier(epsilon=eps2, delta=delta, sampling_rate=sampling_rate,
                                                              steps=steps, adjacency=adjacency, method=method,
                                                              verify=False)
                cal = calibrated[eps2]
                cell.update(noise_multiplier=cal.value, dpsgd_epsilon=cal.guarantee.epsilon)
            out.append(cell)
            if bar is not None:
                bar[0].advance(bar[1])
    finally:
        if bar is not None:
            bar[0].stop()
    return out


def _progress(total: int):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("calibrating splits"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    progress.start()
    return progress, progress.add_task("grid", total=total)
