"""Execute a plan's calibration phase: one Gaussian release after training, then shift the intercept.

An RR-only plan's calibration is free and has no phase: its exact shift is solved from the
truncated model's logits and the RR labels' debiased count (``budgetplan.intercept``).

The release and the solve are specified in ``budgetplan.intercept``; this module computes
the exact vector on the trained model, adds the plan's noise once (persisted through the
run's session, so a resumed run reloads it rather than draws again), solves for the shift
and adds it to the model's output bias. Nothing but the noisy vector, and for Hybrid the
debiased count of the RR labels (post-processing of the RR release), reaches the solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from budgetplan import intercept
from budgetplan.errors import InvalidParameterError
from budgetplan.record.records import CalibrationRun, CalibrationStats
from trainers.distributed import release_once
from trainers.fit import model_logits

__all__ = ["CalibrationResult", "exact_release", "run_calibration", "calibration_entry", "free_calibration"]


@dataclass(frozen=True, kw_only=True)
class CalibrationResult:
    """What the calibration did: the public facts, then the private ones (the release and the solve)."""

    rows: int
    coordinates: int
    noise_std: float
    sensitivity: float
    release_sha256: str
    seconds: float
    release: tuple[float, ...]
    target_positives: float
    target_variance: float
    mean_prediction_before: float
    shift: float
    clamped: bool


@torch.no_grad()
def exact_release(model, data, shifts, *, truncated: bool = False, batch_size: int = 65536) -> np.ndarray:
    """(sum_i s(z_i + d) for d in shifts) + (sum_i y_i,), in float64; private until noised.

    A non-finite logit counts as 1/2 at every shift, so each row's contribution to every
    coordinate stays in [0, 1] whatever the model does (the sensitivity relies on it).
    """
    d = torch.as_tensor(shifts, dtype=torch.float64, device=data.label.device)
    sums = torch.zeros(d.numel(), dtype=torch.float64, device=d.device)
    model.eval()
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(len(data), start + batch_size), device=data.label.device)
        z = model_logits(model, data, idx, truncated).double()
        s = torch.sigmoid(z[:, None] + d[None, :])
        sums += torch.where(torch.isnan(s), torch.full_like(s, 0.5), s).sum(0)
    positives = data.label.double().sum()
    return torch.cat([sums, positives[None]]).cpu().numpy()


def run_calibration(model, data, phase, *, randomness, session, rr_result=None, collective=None) -> CalibrationResult:
    """Release the plan's noisy vector once, solve for the shift and add it to the model's output bias.

    The means divide by the plan's N: the data's row count when N is exact (the run checked
    it), the DP count when N is one (the true count is never used).

    Args:
        phase: the plan's ``CalibrationPhase``.
        rr_result: the run's ``RRResult`` when the plan has an RR phase (its debiased count
            joins the target), else None.
        collective: with several processes (``data`` this rank's rows), the exact vectors
            are added across ranks and rank 0 alone adds the noise, once; every rank then
            solves the same shift from the same noisy vector.
    """
    par = phase.params
    t0 = time.perf_counter()
    shifts = par.shifts

    def draw():
        exact = exact_release(model, data, shifts)
        if collective is not None:
            pooled = torch.from_numpy(exact)
            collective.sum_([pooled])
            if collective.rank != 0:
                return None
            exact = pooled.numpy()
        u = randomness.uniform_u64(2)
        gen = np.random.Generator(np.random.PCG64((int(u[0]) << 64) | int(u[1])))
        exact += gen.standard_normal(exact.size) * par.noise_std  # in place: the exact vector is gone
        return exact, {"noise_draws": int(exact.size), "noise_std": par.noise_std}

    noisy, note = release_once(collective, session, "calibration", draw)
    noisy = np.asarray(noisy, dtype=np.float64)
    if noisy.shape != (par.coordinates,):
        raise InvalidParameterError(f"the run's saved calibration release has shape {noisy.shape}, the plan "
                                    f"{par.coordinates} coordinates")
    estimates = [(float(noisy[-1]), par.noise_std**2)]
    if par.target == "positives and rr labels":
        if rr_result is None or rr_result.debiased_positives is None:
            raise InvalidParameterError("the plan combines the RR labels' debiased count into the calibration "
                                        "target, but the run has no RR result to take it from")
        estimates.append(tuple(rr_result.debiased_positives))
    target, variance = intercept.combine(*estimates)
    sums = noisy[:-1]
    shift, clamped = intercept.solve_shift(sums, rows=par.dataset_size, target=target, shifts=shifts)
    with torch.no_grad():
        model.output_bias().add_(shift)
    return CalibrationResult(
        rows=par.dataset_size, coordinates=int(noisy.size), noise_std=float(note["noise_std"]),
        sensitivity=par.sensitivity, release_sha256=note["sha256"], seconds=time.perf_counter() - t0,
        release=tuple(float(x) for x in noisy), target_positives=target, target_variance=variance,
        mean_prediction_before=intercept.mean_prediction_at_zero(sums, rows=par.dataset_size, shifts=shifts),
        shift=shift, clamped=clamped)


def calibration_entry(r: CalibrationResult) -> tuple[CalibrationRun, CalibrationStats]:
    """The calibration's release as the record holds it: ``(public entry, private statistics)``."""
    public = CalibrationRun(rows=r.rows, releases=1, release_sha256=r.release_sha256, coordinates=r.coordinates,
                            noise_std=r.noise_std, noise_draws=r.coordinates, sensitivity=r.sensitivity,
                            seconds=r.seconds)
    stats = CalibrationStats(release=r.release, target_positives=r.target_positives,
                             target_variance=r.target_variance, mean_prediction_before=r.mean_prediction_before,
                             shift=r.shift, clamped=r.clamped)
    return public, stats


@torch.no_grad()
def free_calibration(model, data, rr_result, collective=None) -> CalibrationStats:
    """An RR-only run's exact shift: its truncated logits over the training rows meet the RR labels' debiased count.

    Called after the RR phase of a plan whose calibration is free (``plan.free_calibration``):
    it releases nothing, so it has no public entry. With several processes rank 0 solves on
    every rank's logits (gathered in rank order) and every rank applies rank 0's shift.
    """
    if rr_result is None or rr_result.debiased_positives is None:
        raise InvalidParameterError("the plan calibrates the intercept from the RR labels, but the run has no RR "
                                    "result to take their debiased count from")
    model.eval()
    z = torch.cat([model_logits(model, data, torch.arange(i, min(len(data), i + 65536), device=data.label.device), True)
                   .double().cpu() for i in range(0, len(data), 65536)]).numpy()
    target, variance = rr_result.debiased_positives
    solved = None
    if collective is not None:
        blocks = collective.gather_object(z)
        z = np.concatenate(blocks) if blocks is not None else z
    if collective is None or collective.rank == 0:
        shift, clamped = intercept.solve_free(z, target=target)
        before = float(np.mean(np.where(np.isnan(z), 0.5, 0.5 * (1.0 + np.tanh(0.5 * z)))))
        solved = (shift, clamped, before)
    if collective is not None:
        solved = collective.broadcast_object(solved)
    shift, clamped, before = solved
    model.output_bias().add_(shift)
    return CalibrationStats(release=(), target_positives=target, target_variance=variance,
                            mean_prediction_before=before, shift=shift, clamped=clamped)
