"""Sweeps of Hybrid splits: every (total epsilon, split rule) cell, calibrated.

Each cell gives eps1 and the RR flip probability for the RR phase, eps2 and the DP-SGD
noise multiplier calibrated to (eps2, delta). Cells with eps2 = 0 (alpha = 1) have no
DP-SGD phase; cells with eps1 = 0 (alpha = 0) no RR phase. Cells that share an eps2
share one calibration. The sweep skips the half-grid re-check of each calibration (the
answer still meets its target at the working grid, with the usual margin); ``budgetplan
plan`` re-checks the cell it plans. Progress shows on stderr.

The calibrations are independent: ``jobs`` runs them in that many processes at once
(``"auto"``: the free CPUs, ``budgetplan.util.cpus``). Each is deterministic, so the grid is the
same whatever ``jobs``; on 2 cores the 35-cell pCTR grid went from 17.0 s to about 10 s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from budgetplan.accounting import rr
from budgetplan.errors import InvalidParameterError
from budgetplan.limits import MAX_GRID_CELLS, MAX_THREADS
from budgetplan.planning.calibrate import Calibration, dpsgd_noise_multiplier, steps_for_epochs
from budgetplan.scenario.split_rules import PAPER_ALPHAS, PAPER_EPSILONS, SplitRule, choose_split, parse_rule
from budgetplan.util import validate
from budgetplan.util.cpus import free_cpus

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["sweep", "SweepShape", "SweepCells", "check_sweep_shape", "sweep_warnings", "alpha_grid", "one_rule"]


def _calibrate(eps2: float, *, delta: float, sampling_rate: float, steps: int, adjacency: str,
               method: str) -> Calibration:
    return dpsgd_noise_multiplier(epsilon=eps2, delta=delta, sampling_rate=sampling_rate, steps=steps,
                                  adjacency=adjacency, method=method, verify=False)


def _workers(jobs: int | str, tasks: int) -> int:
    if jobs == "auto":
        return max(1, min(tasks, free_cpus()))
    if isinstance(jobs, bool) or not isinstance(jobs, int) or not 1 <= jobs <= MAX_THREADS:
        raise InvalidParameterError(f'jobs must be an integer in [1, {MAX_THREADS}] or "auto", got {jobs!r}')
    return max(1, min(tasks, jobs))


def sweep(epsilons: Sequence[float], rules: Sequence[str | SplitRule], *, delta: float, sampling_rate: float,
          steps: int, adjacency: str = "replace-one", method: str = "pld", progress: bool = False,
          jobs: int | str = "auto") -> list[dict[str, Any]]:
    """One dict per (epsilon, rule): alpha (resolved), epsilon1, flip_probability, epsilon2, noise_multiplier,
    dpsgd_epsilon."""
    cells = []
    for eps, rule in [(e, r) for e in epsilons for r in rules]:
        choice = choose_split(eps, rule)
        cells.append((eps, rule, choice))
    todo = sorted({c.epsilon2 for _, _, c in cells if c.epsilon2 > 0})
    workers = _workers(jobs, len(todo))
    calibrate = functools.partial(_calibrate, delta=delta, sampling_rate=sampling_rate, steps=steps,
                                  adjacency=adjacency, method=method)
    calibrated: dict[float, Calibration] = {}
    bar = _progress(len(todo)) if progress else None
    try:
        if workers == 1:
            for eps2 in todo:
                calibrated[eps2] = calibrate(eps2)
                if bar is not None:
                    bar[0].advance(bar[1])
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            # spawn: fresh interpreters (a fork would copy the progress bar's thread state)
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                futures = {pool.submit(calibrate, eps2): eps2 for eps2 in todo}
                for future in as_completed(futures):
                    calibrated[futures[future]] = future.result()
                    if bar is not None:
                        bar[0].advance(bar[1])
    finally:
        if bar is not None:
            bar[0].stop()
    out: list[dict[str, Any]] = []
    for eps, rule, choice in cells:
        eps1, eps2 = choice.epsilon1, choice.epsilon2
        cell = {"epsilon": eps, "rule": str(rule), "alpha": choice.alpha, "epsilon1": eps1,
                "flip_probability": rr.flip_probability(eps1) if eps1 > 0 else None,
                "epsilon2": eps2, "noise_multiplier": None, "dpsgd_epsilon": None}
        if eps2 > 0:
            cal = calibrated[eps2]
            cell.update(noise_multiplier=cal.value, dpsgd_epsilon=cal.guarantee.epsilon)
        out.append(cell)
    return out


def _progress(total: int) -> tuple[Progress, TaskID]:
    # rich's progress bar is imported when asked for: this module is on the CLI's import path (`split`)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("calibrating splits' DP-SGD noise"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    progress.start()
    return progress, progress.add_task("grid", total=total)


# ------------------------------------------------------------------ sweeps of splits (``budgetplan split``)


def _as_named(name: str) -> str:
    return name


@dataclass(frozen=True, slots=True)
class SweepShape:
    """The DP-SGD shape a sweep of splits is calibrated for; RR is pure, so all of delta goes to DP-SGD."""

    delta: float
    dataset_size: int
    batch_size: int
    steps: int
    epochs: float | None
    adjacency: str
    accountant: str

    @classmethod
    def of(cls, *, delta: float, dataset_size: int, batch_size: int, epochs: float | None, steps: int | None,
           adjacency: str, accountant: str) -> SweepShape:
        """The shape with its steps: ``steps`` as given, else the steps of ``epochs`` at expected batch B."""
        if steps is None:
            assert epochs is not None  # one of the two is given
            steps = steps_for_epochs(epochs=epochs, dataset_size=dataset_size, batch_size=batch_size)
        return cls(delta=delta, dataset_size=dataset_size, batch_size=batch_size, steps=steps, epochs=epochs,
                   adjacency=adjacency, accountant=accountant)

    @property
    def sampling_rate(self) -> float:
        return self.batch_size / self.dataset_size

    def to_dict(self) -> dict[str, Any]:
        return {"delta": self.delta, "dataset_size": self.dataset_size, "batch_size": self.batch_size,
                "steps": self.steps, "epochs": self.epochs, "sampling_rate": self.sampling_rate,
                "adjacency": self.adjacency, "accountant": self.accountant}


def check_sweep_shape(*, dataset_size: int, batch_size: int, adjacency: str,
                      label: Callable[[str], str] = _as_named) -> None:
    """Refuse a batch larger than the data, and any adjacency Hybrid's RR phase cannot be accounted under.

    ``label`` names each input in the messages as the caller knows it (the CLI: its options).

    Raises:
        InvalidParameterError: batch_size > dataset_size, or an adjacency other than replace-one.
    """
    if batch_size > dataset_size:
        raise InvalidParameterError(f"{label('batch_size')} ({batch_size}) must not exceed {label('dataset_size')} "
                                    f"({dataset_size})")
    if adjacency != "replace-one":
        raise InvalidParameterError(f"{label('adjacency')} {adjacency} cannot account Hybrid's RR phase: randomized "
                                    "response protects labels, a replace-one relation")


def sweep_warnings(*, delta: float, dataset_size: int) -> tuple[str, ...]:
    """Doubtful but legal: a delta not below 1/N."""
    warning = validate.delta_warning(delta, dataset_size)
    return () if warning is None else (warning,)


@dataclass(frozen=True, slots=True)
class SweepCells:
    """The (total epsilon, split rule) cells a sweep calibrates: every epsilon with every rule."""

    epsilons: tuple[float, ...]
    rules: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.epsilons) * len(self.rules)


def alpha_grid(epsilons: tuple[float, ...] | None, alphas: tuple[float, ...] | None, epsilon: float | None = None,
               *, label: Callable[[str], str] = _as_named) -> SweepCells:
    """The paper's grid: ``epsilons`` (else ``epsilon`` alone, else PAPER_EPSILONS) by ``alphas`` (else PAPER_ALPHAS).

    Raises:
        InvalidParameterError: more than ``MAX_GRID_CELLS`` cells.
    """
    eps_list = epsilons or ((epsilon,) if epsilon else PAPER_EPSILONS)
    rules = tuple(f"alpha={a:g}" for a in (alphas or PAPER_ALPHAS))
    cells = SweepCells(tuple(eps_list), rules)
    if cells.size > MAX_GRID_CELLS:
        raise InvalidParameterError(f"{label('rule')} grid of {len(eps_list)} epsilons x {len(rules)} alphas is "
                                    f"{cells.size} calibrations: at most {MAX_GRID_CELLS} (budgetplan's stated limit)")
    return cells


def one_rule(epsilon: float, rule: str, *, label: Callable[[str], str] = _as_named) -> SweepCells:
    """One cell: ``rule`` (checked by :func:`parse_rule`) at ``epsilon``."""
    parse_rule(rule, label("rule"))
    return SweepCells((epsilon,), (rule,))
