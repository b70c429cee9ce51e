"""What a plan's guarantee means to an attacker: the most a test can catch at a given false-alarm rate.

Whatever an attacker does with what a plan releases to tell two neighbouring datasets apart
(was this person's label 1 or 0, their sensitive features these or those), its test has a
false-positive rate alpha and a true-positive rate TPR. If the release is (eps, delta(eps))-DP
for every eps (the hockey-stick curve of the plan's privacy loss distribution), then for
every eps, in both directions (Kairouz, Oh and Viswanath, arXiv:1311.0776; the f-DP
trade-off curve as the envelope of these lines: Dong, Roth and Su, arXiv:1905.02383, Prop. 2.12)

    TPR <= e^eps alpha + delta(eps)   and   TPR <= 1 - e^-eps (1 - delta(eps) - alpha),

so TPR(alpha) is at most the smallest of these over eps. For a Gaussian mechanism with
sensitivity / sigma = mu this is exactly Phi(Phi^-1(alpha) + mu) (mu-GDP); for randomized
response at eps it is min(e^eps alpha, 1 - e^-eps (1 - alpha)).

``plan_tradeoff`` reads delta(eps) from the PLD of the plan's composed mechanism (the
pessimistic PLD: delta is over-estimated, so the TPR is too, never under); where the plan's
phases compose only by basic composition (group privacy, eps/K_i, truncated Poisson, a
tuning grid), from its one (eps, delta) pair, a looser bound. The minimum is taken over a
grid of eps, which can only raise it: still a bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from budgetplan.accounting import fastpld, pld_build
from budgetplan.accounting.account import DEFAULT_DISCRETIZATION
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import Mechanism
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate

__all__ = ["ALPHAS", "alpha_array", "tpr_bound", "tpr_from_pair", "mechanism_tradeoff"]

ALPHAS = (1e-3, 1e-2)          # the false-positive rates a statement reports
_EPS_GRID = np.linspace(0.0, 40.0, 4001)  # step 0.01: the second-order loss of the grid is < 1e-4 relative here
_REFINE = 201                  # points of the finer grid around each coarse minimum (step 1e-4)
_PLD_DELTA = 1e-4              # the delta the PLD's composition is tilted for: the TPRs read it at 1e-4..1


def alpha_array(alphas: Sequence[float]) -> NDArray[np.float64]:
    a = np.asarray([validate.open_unit("alpha", x) for x in alphas], dtype=np.float64)
    if a.size == 0:
        raise InvalidParameterError("alphas must name at least one false-positive rate")
    return a


def tpr_bound(delta_of_eps: Callable[[NDArray[np.float64]], NDArray[np.float64]], alphas: Sequence[float] = ALPHAS,
              eps_grid: NDArray[np.float64] = _EPS_GRID) -> list[float]:
    """The largest TPR at each false-positive rate in ``alphas`` for a release with this hockey-stick curve.

    Args:
        delta_of_eps: delta(eps) on an array of epsilons (an upper bound keeps the result one).
    """
    a = alpha_array(alphas)

    def lines(eps: NDArray[np.float64]) -> NDArray[np.float64]:  # (eps, alpha) -> the smaller of the two lines' TPR
        d = np.clip(np.asarray(delta_of_eps(eps), dtype=np.float64), 0.0, 1.0)[:, None]
        e = np.exp(eps)[:, None]
        out: NDArray[np.float64] = np.minimum(e * a[None, :] + d, 1.0 - (1.0 - d - a[None, :]) / e)
        return out

    eps = np.asarray(eps_grid, dtype=np.float64)
    coarse = lines(eps)
    best = coarse.min(axis=0)
    if eps.size > 1:  # the optimum can sit on a kink of delta(eps) (pure DP): refine around each minimum
        step = float(np.max(np.diff(eps)))
        for j, i in enumerate(coarse.argmin(axis=0)):
            fine = np.linspace(max(0.0, eps[i] - step), eps[i] + step, _REFINE)
            best[j] = min(best[j], lines(fine)[:, j].min())
    return [float(min(1.0, max(x, alpha))) for x, alpha in zip(best, a)]


def tpr_from_pair(epsilon: float, delta: float, alphas: Sequence[float] = ALPHAS) -> list[float]:
    """The largest TPR at each of ``alphas`` allowed by one (epsilon, delta) guarantee."""
    if isinstance(epsilon, (int, float)) and epsilon == math.inf:  # no bound at all
        return [1.0 for _ in alpha_array(alphas)]
    eps = validate.non_negative("epsilon", epsilon)
    dl = validate.probability("delta", delta, allow_zero=True)
    return tpr_bound(lambda grid: np.full(grid.shape, dl), alphas, np.array([eps]))


def mechanism_tradeoff(mechanism: Mechanism, *, adjacency: Adjacency | str, unit: PrivacyUnit | None = None,
                       discretization: float | None = None, alphas: Sequence[float] = ALPHAS) -> list[float]:
    """TPR bounds at ``alphas`` from the PLD of ``mechanism`` (a ``budgetplan.mechanisms`` value).

    Raises:
        UnsupportedError: a mechanism or unit without a PLD here.
    """
    built = pld_build.build(mechanism, adjacency=Adjacency.parse(adjacency), unit=unit or PrivacyUnit.example(),
                            discretization=discretization or DEFAULT_DISCRETIZATION, delta=_PLD_DELTA)
    return tpr_bound(lambda eps: np.asarray(fastpld.delta_for_epsilon(built.pld, eps)), alphas)


