"""Hyperparameter tuning on private data: the selection of the best of n runs costs privacy.

Two accountings, named in every plan and statement that declares tuning:

- ``naive``: the n runs compose. Each run is planned to (eps / n, delta / n), so the n-fold
  basic composition meets the total exactly; the n-fold PLD composition, where the run has
  a PLD, is reported beside it (tighter).
- ``repeat-and-select``: the number of runs is random with mean n (Poisson, geometric or
  logarithmic) and only the best output is released. Papernot and Steinke 2022,
  "Hyperparameter Tuning with Renyi Differential Privacy" (arXiv:2110.03620), bound it in
  RDP; dp_accounting's ``RepeatAndSelectDpEvent`` implements the bound. It needs a run
  that RDP can account under the plan's adjacency: DP-SGD under add-remove at example
  level, Gaussian releases (a DP-SGD run's intercept calibration among them, composed with
  it), or randomized response. The trainer must draw the number of
  runs from the stated distribution; a fixed count voids this accounting.
"""

from __future__ import annotations

import math
from typing import Any

from budgetplan.accounting.backends import RDP_CONVERSION, quiet_absl, relation_of
from budgetplan.errors import AccountingError, UnsupportedError
from budgetplan.mechanisms import Composition, GaussianRelease, Mechanism, PoissonDPSGD, RandomizedResponse
from budgetplan.scenario.model import DISTRIBUTIONS
from budgetplan.units import Adjacency, PrivacyUnit

__all__ = ["repeat_and_select_epsilon", "REPEAT_AND_SELECT_REFERENCE"]

REPEAT_AND_SELECT_REFERENCE = (
    "repeat-and-select (Papernot and Steinke 2022, arXiv:2110.03620) by RDP in dp_accounting; "
    + RDP_CONVERSION
)


def _event(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit) -> Any:
    import dp_accounting as dpa

    if isinstance(mechanism, Composition):
        leaves = mechanism.leaves()
        if any(isinstance(leaf, RandomizedResponse) for leaf in leaves):
            raise UnsupportedError("repeat-and-select accounting does not cover runs mixing randomized response with "
                                   "other phases; use [tuning].selection = \"naive\"")
        return dpa.ComposedDpEvent([_event(leaf, adjacency, unit) for leaf in leaves])
    if unit.cap > 1 and not isinstance(mechanism, RandomizedResponse):
        raise UnsupportedError(
            "repeat-and-select accounting is available at example level only for DP-SGD and Gaussian "
            "releases; use [tuning].selection = \"naive\"")
    if isinstance(mechanism, PoissonDPSGD):
        if adjacency is not Adjacency.ADD_REMOVE:
            raise UnsupportedError(
                "repeat-and-select accounting of DP-SGD needs add-remove adjacency (RDP accounts Poisson "
                "sampling under add-remove only); use [tuning].selection = \"naive\"")
        return dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(mechanism.sampling_rate, dpa.GaussianDpEvent(mechanism.noise_multiplier)),
            mechanism.steps)
    if isinstance(mechanism, GaussianRelease):
        return dpa.GaussianDpEvent(mechanism.noise_std / (mechanism.sensitivity * unit.cap))
    if isinstance(mechanism, RandomizedResponse):
        rr = dpa.RandomizedResponseDpEvent(2.0 / (math.exp(mechanism.epsilon) + 1.0), 2)
        return rr if unit.cap == 1 else dpa.SelfComposedDpEvent(rr, unit.cap)
    raise UnsupportedError(
        f"repeat-and-select accounting does not cover {type(mechanism).__name__} runs (nor multi-phase runs); "
        "use [tuning].selection = \"naive\"")


def repeat_and_select_epsilon(mechanism: Mechanism, *, adjacency: Adjacency, unit: PrivacyUnit, delta: float,
                              mean: float, distribution: str) -> float:
    """epsilon at ``delta`` of running ``mechanism`` a random number of times and keeping the best."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    quiet_absl()
    event = _event(mechanism, adjacency, unit)
    # Gaussian and DP-SGD events are accounted under add-remove: their noise is relative to the
    # stated shift; randomized response needs replace-one.
    relation = relation_of(Adjacency.REPLACE_ONE if isinstance(mechanism, RandomizedResponse) else Adjacency.ADD_REMOVE)
    accountant = rdp.RdpAccountant(neighboring_relation=relation)
    try:
        accountant.compose(dp_event.RepeatAndSelectDpEvent(event, float(mean), DISTRIBUTIONS[distribution]))
        eps = float(accountant.get_epsilon(delta))
    except Exception as exc:
        raise AccountingError(f"dp_accounting repeat-and-select failed: {exc}") from None
    if math.isnan(eps) or eps < 0:
        raise AccountingError(f"dp_accounting repeat-and-select returned epsilon={eps!r}")
    return eps
