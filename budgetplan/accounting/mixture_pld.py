"""PLDs of the mixture of Gaussians (add-remove) and the double mixture (replace-one), fast.

One step of user-level Poisson DP-SGD for a unit of K examples: the sensitivity is
Binomial(K, q) (``mog``, ``double_mog`` hold the mechanisms' losses); here their
hockey-stick curves go through connect-the-dots onto the engine's grid. ``fastpld``
re-exports both builders.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from budgetplan.accounting import double_mog, mog
from budgetplan.accounting.ctd import cdf_side, check_grid, connect_the_dots, loss_grid, split_gap
from budgetplan.accounting.limits import MAX_MIXTURE_WORK, MAX_SINGLE_GRID_POINTS
from budgetplan.accounting.pld_args import check_discretization, check_noise, check_truncation_bound
from budgetplan.accounting.pld_ops import GridLimitError
from budgetplan.accounting.pld_types import ADD_REMOVE, PLD, REPLACE_ONE, PLDPmf
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["mixture_of_gaussians", "double_mixture_of_gaussians", "check_size"]

# Entries of one (atoms x losses) block of the mixture's inverse-loss solve (32 MiB).
_MOG_CHUNK = 1 << 22


def _check_mixture_work(atoms: int, eps_lower: float, eps_upper: float, discretization: float, what: str) -> None:
    """Refuse a single step needing more (atom, loss) pairs than MAX_MIXTURE_WORK, naming the grid that fits.

    The discretization named also fits ``check_grid``'s limit on the grid length.
    """
    width = eps_upper - eps_lower
    span = width / discretization
    if math.isfinite(width) and atoms * span > MAX_MIXTURE_WORK:
        smallest = width * max(atoms / MAX_MIXTURE_WORK, 1 / (MAX_SINGLE_GRID_POINTS - 2)) * 1.01
        raise GridLimitError(
            f"discretization {discretization:g} needs {atoms:,} sensitivities x {span:.3g} grid points for one "
            f"step of {what} (limit {MAX_MIXTURE_WORK:,} pairs); use discretization >= {smallest:.3g}",
            points=math.ceil(atoms * span), limit=MAX_MIXTURE_WORK)
    check_grid(discretization, eps_lower, eps_upper, what)


@functools.lru_cache(maxsize=16)
def _mog_pmf(sigma: float, sens: tuple[float, ...], probs: tuple[float, ...], bottom: float, adjacency: str,
             discretization: float, log_bound: float) -> PLDPmf:
    mix = mog.Mixture(sigma, sens, probs, bottom)
    eps_lower, eps_upper = mog.grid_loss_bounds(mix, adjacency, log_bound)
    atoms = int(np.count_nonzero(mix.pos))
    what = f"the mixture of Gaussians with sigma={sigma:g}"
    _check_mixture_work(atoms, eps_lower, eps_upper, discretization, what)
    lo, eps = loss_grid(discretization, eps_lower, eps_upper, what)
    h = np.zeros_like(eps)
    chunk = max(1, _MOG_CHUNK // max(1, atoms))
    for start in range(0, eps.size, chunk):
        e = eps[start : start + chunk]
        inside, log_p, log_q = mog.split_terms(mix, adjacency, e, cdf_side(e))
        part = np.zeros_like(e)
        part[inside] = split_gap(e[inside], log_p, log_q)
        if bottom:
            # The left-out atoms (see mog.Mixture): REMOVE puts their mass at loss +inf, which adds
            # it to delta (for eps < 0 the survival-side formula already counts it); ADD loses
            # it from the lower distribution, which the survival side misses by bottom e^eps.
            if adjacency == "remove":
                part[inside & (e >= 0)] += bottom
            else:
                neg = inside & (e < 0)
                part[neg] += bottom * np.exp(e[neg])
        h[start : start + chunk] = part
    return connect_the_dots(discretization, lo, eps, h)


def _mixture_args(standard_deviation: float, sensitivities: Sequence[float], probabilities: Sequence[float],
                  discretization: float, log_mass_truncation_bound: float, dropped_mass: float,
                  ) -> tuple[float, tuple[float, ...], tuple[float, ...], float, float, float]:
    """The validated (sigma, sens, probs, bottom, discretization, bound) of a mixture builder."""
    sigma = check_noise("standard_deviation", standard_deviation)
    d = check_discretization(discretization)
    bound = check_truncation_bound(log_mass_truncation_bound)
    bottom = validate.probability("dropped_mass", dropped_mass, allow_zero=True)
    sens = tuple(validate.non_negative("sensitivities", s) for s in sensitivities)
    probs = tuple(validate.probability("probabilities", p, allow_zero=True, allow_one=True) for p in probabilities)
    if len(sens) != len(probs) or not sens:
        raise InvalidParameterError(
            f"sensitivities and probabilities must be non-empty and of equal length, got {len(sens)} and {len(probs)}")
    total = math.fsum(probs) + bottom
    if not math.isclose(total, 1.0, rel_tol=1e-9):
        raise InvalidParameterError(f"probabilities must sum to 1 - dropped_mass, got a total of {total!r}")
    if not any(s > 0 and p > 0 for s, p in zip(sens, probs)):
        raise InvalidParameterError("at least one positive sensitivity needs a positive probability")
    return sigma, sens, probs, bottom, d, bound


def mixture_of_gaussians(
    *,
    standard_deviation: float,
    sensitivities: Sequence[float],
    probabilities: Sequence[float],
    discretization: float = 1e-4,
    log_mass_truncation_bound: float = -50.0,
    dropped_mass: float = 0.0,
) -> PLD:
    """PLD of one step of the mixture-of-Gaussians mechanism (add-remove; REMOVE and ADD).

    The sensitivity is ``sensitivities[i]`` with probability ``probabilities[i]``. For
    user-level DP-SGD (K examples per user, each Poisson-sampled at rate q) pass
    sensitivities 0..K with Binomial(K, q) probabilities, or only a window of them with the
    rest as ``dropped_mass``. Matches dp_accounting's ``from_mixture_gaussian_mechanism``
    (MixtureGaussianPrivacyLoss), except that the inverse privacy loss is solved to
    rounding accuracy instead of on a 1e-6 x-grid.

    Args:
        standard_deviation: standard deviation of the Gaussian noise.
        sensitivities: the support of the sensitivity, each >= 0.
        probabilities: their probabilities (summing to 1 - dropped_mass).
        discretization: grid step of the privacy losses.
        log_mass_truncation_bound: ln of the noise mass left out of the grid.
        dropped_mass: probability of sensitivities not listed (an upper bound will do). It
            is accounted as an infinite sensitivity, i.e. added to delta (pessimistic).

    Returns:
        The PLD with pmfs (remove, add); cached and read-only.

    Raises:
        InvalidParameterError (a ValueError): on a non-positive standard deviation,
            mismatched lengths, a negative or non-finite sensitivity or probability,
            probabilities not summing to 1 - dropped_mass, no positive sensitivity with
            positive probability, or more (sensitivity, loss) pairs than
            ``MAX_MIXTURE_WORK`` (a ``GridLimitError`` naming the discretization that fits).
    """
    sigma, sens, probs, bottom, d, bound = _mixture_args(
        standard_deviation, sensitivities, probabilities, discretization, log_mass_truncation_bound, dropped_mass)
    return PLD(
        (_mog_pmf(sigma, sens, probs, bottom, "remove", d, bound),
         _mog_pmf(sigma, sens, probs, bottom, "add", d, bound)),
        ADD_REMOVE,
    )


@functools.lru_cache(maxsize=16)
def _double_mog_pmf(sigma: float, sens: tuple[float, ...], probs: tuple[float, ...], bottom: float,
                    discretization: float, log_bound: float) -> PLDPmf:
    mix = double_mog.DoubleMixture(sigma, sens, probs, bottom)
    eps_lower, eps_upper = double_mog.grid_loss_bounds(mix, log_bound)
    atoms = int(mix.sens.size)
    what = f"the double mixture of Gaussians with sigma={sigma:g}"
    _check_mixture_work(atoms, eps_lower, eps_upper, discretization, what)
    lo, eps = loss_grid(discretization, eps_lower, eps_upper, what)
    h = np.empty_like(eps)
    chunk = max(1, _MOG_CHUNK // max(1, atoms))
    for start in range(0, eps.size, chunk):
        e = eps[start : start + chunk]
        a = np.abs(e)
        log_p, log_q = double_mog.split_terms(mix, a, double_mog.solve(mix, a))
        # The left-out atoms add their mass to delta at every eps (see double_mog.DoubleMixture).
        delta = np.minimum(1.0, split_gap(a, log_p, log_q) + bottom)
        # Symmetry: g(-a) = delta(-a) - (1 - e^-a) = e^-a delta(a), small and exact where delta is.
        h[start : start + chunk] = np.where(e >= 0, delta, np.exp(np.minimum(e, 0.0)) * delta)
    return connect_the_dots(discretization, lo, eps, h)


def double_mixture_of_gaussians(
    *,
    standard_deviation: float,
    sensitivities: Sequence[float],
    probabilities: Sequence[float],
    discretization: float = 1e-4,
    log_mass_truncation_bound: float = -50.0,
    dropped_mass: float = 0.0,
) -> PLD:
    """PLD of one step of the double mixture of Gaussians (replace-one; one symmetric pmf).

    The pair sum_i p_i N(-s_i, sigma^2) vs sum_i p_i N(+s_i, sigma^2) dominates one step of
    Poisson DP-SGD for a unit of K examples under replace-one (sensitivities 0..K with
    Binomial(K, q) probabilities, in units of the clipping norm; arXiv:2403.04867,
    Theorem 3.8). For K = 1 it is ``gaussian(relation="replace-one")``'s pair; for q = 1 a
    Gaussian of sensitivity 2K. See ``double_mog``. The arguments are
    ``mixture_of_gaussians``'s, with the same meaning.

    Returns:
        A replace-one PLD with a single pmf; cached and read-only.

    Raises:
        InvalidParameterError (a ValueError): as ``mixture_of_gaussians``, including a
            ``GridLimitError`` past ``MAX_MIXTURE_WORK`` naming the discretization that fits.
    """
    sigma, sens, probs, bottom, d, bound = _mixture_args(
        standard_deviation, sensitivities, probabilities, discretization, log_mass_truncation_bound, dropped_mass)
    return PLD((_double_mog_pmf(sigma, sens, probs, bottom, d, bound),), REPLACE_ONE)


def check_size(
    *,
    standard_deviation: float,
    sensitivities: Sequence[float],
    probabilities: Sequence[float],
    relation: str,
    discretization: float = 1e-4,
    log_mass_truncation_bound: float = -50.0,
    dropped_mass: float = 0.0,
) -> None:
    """Raise the ``GridLimitError`` the builder of ``relation`` would raise, without building.

    Only the grid's ends are solved for (no loss grid, no inverse-loss solve), so a search for
    the largest mixture that fits costs next to nothing per probe.
    """
    sigma, sens, probs, bottom, d, bound = _mixture_args(
        standard_deviation, sensitivities, probabilities, discretization, log_mass_truncation_bound, dropped_mass)
    if relation == REPLACE_ONE:
        dmix = double_mog.DoubleMixture(sigma, sens, probs, bottom)
        lower, upper = double_mog.grid_loss_bounds(dmix, bound)
        _check_mixture_work(int(dmix.sens.size), lower, upper, d,
                            f"the double mixture of Gaussians with sigma={sigma:g}")
        return
    mix = mog.Mixture(sigma, sens, probs, bottom)
    for adjacency in ("remove", "add"):
        lower, upper = mog.grid_loss_bounds(mix, adjacency, bound)
        _check_mixture_work(int(np.count_nonzero(mix.pos)), lower, upper, d,
                            f"the mixture of Gaussians with sigma={sigma:g}")
