"""Shuffled fixed-size batches: an upper bound without amplification, and Chua et al.'s lower bound.

No tight accountant exists for DP-SGD whose epochs cut a random permutation into batches
of B. Two numbers are honest:

* Upper bound (the guarantee): each example lands in at most one batch per epoch, so
  whatever the order, the run is at most E compositions of the Gaussian mechanism with
  sensitivity 1 (add-remove) or 2 (replace-one), in units of the clipping norm, the batch
  layout treated as public. E Gaussians of noise sigma compose exactly into one of noise
  sigma / sqrt(E) (analytic Gaussian, Balle and Wang 2018, arXiv:1805.06530).
* Lower bound (what shuffling cannot beat): Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha
  and Zhang, "How Private are DP-SGD Implementations?" (ICML 2024, arXiv:2403.17673). The
  other examples' clipped gradients are -1 and the example's is +1 against 0 (its gradient
  zeroed, a special case of replace-one), so one epoch's T sums are, shifted by the known
  batch totals, P = (1/T) sum_t N(2 e_t, sigma^2 I) against Q = (1/T) sum_t N(e_t, sigma^2 I).
  Any test on (P, Q) bounds the mechanism's hockey-stick divergence from below; theirs is
  the largest coordinate, whose law is exact: P(max <= c) = Phi((c - 2)/s) Phi(c/s)^{T-1}.
  Here the largest coordinate is cut into cells (post-processing, so still a lower bound),
  the cell losses rounded down (dp_accounting's optimistic PLD) and the epochs composed.
  Under add-remove the same pair is shown as what shuffling cannot beat for neighbours that
  differ by one zeroed example, the usual reading of that adjacency for fixed-size batches.

The Poisson figure at q = B / N is never a guarantee for a shuffled run: it is shown only as
what Poisson sampling would give.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special

from budgetplan.accounting import gaussian
from budgetplan.units import Adjacency
from budgetplan.util import validate

__all__ = ["upper_epsilon", "lower_epsilon", "participations", "sensitivity", "LOWER_REFERENCE", "LOWER_CELL",
           "LOWER_DISCRETIZATION"]

LOWER_REFERENCE = "lower bound for shuffled batches (Chua et al., ICML 2024, arXiv:2403.17673)"
# The lower bound's grid: cells of the largest coordinate, and the loss rounding (optimistic).
LOWER_CELL, LOWER_DISCRETIZATION = 0.01, 1e-3


def participations(epochs: float) -> int:
    """How many batches an example can be in: one per epoch begun."""
    return math.ceil(validate.positive("epochs", epochs) - 1e-12)


def sensitivity(adjacency: Adjacency | str, cap: int = 1) -> float:
    """What a unit of ``cap`` examples moves one epoch's sums by (L2, units of C): K or 2K."""
    return cap * (2.0 if Adjacency.parse(adjacency) is Adjacency.REPLACE_ONE else 1.0)


def upper_epsilon(*, noise_multiplier: float, epochs: float, delta: float, adjacency: Adjacency | str,
                  cap: int = 1) -> float:
    """The no-amplification epsilon: ceil(epochs) Gaussian releases of sensitivity K or 2K."""
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    if delta <= 0:
        return math.inf
    return gaussian.analytic_epsilon(sigma=sigma / math.sqrt(participations(epochs)), delta=delta,
                                     sensitivity=sensitivity(adjacency, cap))


@functools.lru_cache(maxsize=64)
def _epoch_pld(sigma: float, steps: int) -> Any:  # dp_accounting's PrivacyLossDistribution (untyped)
    """Optimistic PLD of one epoch's largest coordinate under (P, Q) (module note)."""
    # heavy: dp_accounting (~1 s), for the lower bound only
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    lo, hi = -8.0 * sigma, 2.0 + 8.0 * sigma + math.sqrt(2 * math.log(steps + 1)) * sigma
    caps = np.arange(lo, hi, LOWER_CELL)

    def log_cdf(mean: float) -> np.ndarray:
        out: np.ndarray = special.log_ndtr((caps - mean) / sigma) + (steps - 1) * special.log_ndtr(caps / sigma)
        return out

    def cells(mean: float) -> np.ndarray:
        c = np.exp(log_cdf(mean))
        return np.concatenate(([c[0]], np.diff(c), [1.0 - c[-1]]))

    p, q = cells(2.0), cells(1.0)
    keep = (p > 0) & (q > 0)
    losses = np.floor(np.log(p[keep] / q[keep]) / LOWER_DISCRETIZATION).astype(int)
    pmf: dict[int, float] = {}
    for k, mass in zip(losses.tolist(), p[keep].tolist()):
        pmf[k] = pmf.get(k, 0.0) + mass
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        pmf, 0.0, LOWER_DISCRETIZATION, pessimistic_estimate=False)


def lower_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: float, delta: float) -> float:
    """Chua et al.'s lower bound on a shuffled run's epsilon at ``delta`` (module note)."""
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    delta = validate.open_unit("delta", delta)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # dp_accounting's FFT on tiny masses
        composed = _epoch_pld(sigma, t).self_compose(participations(epochs))
        return max(0.0, float(composed.get_epsilon_for_delta(delta)))
