"""Thin, guarded calls into dp_accounting (RDP, reference PLD) and prv_accountant (PRV).

Every call here receives inputs already validated as finite and in range (dp_accounting's
RdpAccountant silently reports eps = 0 for a NaN noise multiplier or delta), names the
neighbouring relation explicitly, and turns a back-end exception into a one-line
``AccountingError``. The back-ends are imported lazily: ``budgetplan --help`` must not pay
for them.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import special

from budgetplan.accounting.limits import MAX_GRID_POINTS
from budgetplan.errors import AccountingError
from budgetplan.units import Adjacency

__all__ = [
    "RDP_CONVERSION",
    "rdp_dpsgd_curve",
    "rdp_gaussian_curve",
    "rdp_rr_curve",
    "reference_pld_dpsgd",
    "truncated_single_step",
    "reference_discrete_laplace_epsilon",
    "prv_dpsgd_curve",
    "quiet_absl",
    "relation_of",
]

RDP_CONVERSION = (
    "RDP to (eps, delta) by Canonne, Kamath and Steinke 2020 (arXiv:2004.00010, Prop. 12), "
    "as in dp_accounting's RdpAccountant, minimised over its default orders"
)


def quiet_absl() -> None:
    # dp_accounting logs a warning per excluded Renyi order; the result already accounts for it.
    logging.getLogger("absl").setLevel(logging.ERROR)


def relation_of(adjacency: Adjacency) -> object:
    """dp_accounting's NeighboringRelation for ``adjacency``."""
    from dp_accounting import privacy_accountant  # heavy: dp_accounting (~1 s), a peer back-end

    rel = privacy_accountant.NeighboringRelation
    return rel.ADD_OR_REMOVE_ONE if adjacency is Adjacency.ADD_REMOVE else rel.REPLACE_ONE


def _rdp_curve(event: object, relation: object) -> Callable[[float], float]:
    """eps(delta) of ``event`` under RDP; the RDP vector is computed once."""
    quiet_absl()
    from dp_accounting.rdp import rdp_privacy_accountant as rdp  # heavy: dp_accounting (~1 s), a peer back-end

    accountant = rdp.RdpAccountant(neighboring_relation=relation)
    try:
        with warnings.catch_warnings():  # overflow to an infinite RDP at extreme inputs is fine
            warnings.simplefilter("ignore")
            accountant.compose(event)
    except Exception as exc:  # dp_accounting raises on unsupported events
        raise AccountingError(f"dp_accounting RDP failed: {exc}") from None

    def epsilon(delta: float) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eps = accountant.get_epsilon(delta)
        if math.isnan(eps) or eps < 0:
            raise AccountingError(f"dp_accounting RDP returned epsilon={eps!r} at delta={delta!r}")
        return float(eps)

    return epsilon


def rdp_dpsgd_curve(*, noise_multiplier: float, sampling_rate: float, steps: int) -> Callable[[float], float]:
    """eps(delta) of Poisson DP-SGD under add-remove, by RDP."""
    import dp_accounting as dpa  # heavy: dp_accounting (~1 s), a peer back-end

    event = dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(sampling_rate, dpa.GaussianDpEvent(noise_multiplier)), steps
    )
    return _rdp_curve(event, relation_of(Adjacency.ADD_REMOVE))


def rdp_gaussian_curve(*, noise_multiplier: float) -> Callable[[float], float]:
    """eps(delta) of one Gaussian release of noise std / sensitivity ``noise_multiplier``.

    Accounted under ADD_OR_REMOVE_ONE on purpose: that relation shifts the mean by exactly
    the stated sensitivity, which is what ``noise_multiplier`` is relative to. Under
    dp_accounting's REPLACE_ONE a GaussianDpEvent is treated as sensitivity 2.
    """
    import dp_accounting as dpa  # heavy: dp_accounting (~1 s), a peer back-end

    return _rdp_curve(dpa.GaussianDpEvent(noise_multiplier), relation_of(Adjacency.ADD_REMOVE))


def rdp_rr_curve(*, epsilon: float, count: int) -> Callable[[float], float]:
    """eps(delta) of ``count`` binary RR releases under REPLACE_ONE, by RDP."""
    import dp_accounting as dpa  # heavy: dp_accounting (~1 s), a peer back-end

    noise_parameter = 2.0 * float(special.expit(-epsilon))  # 2 / (e^eps + 1), no overflow
    event = dpa.SelfComposedDpEvent(dpa.RandomizedResponseDpEvent(noise_parameter, 2), count)
    return _rdp_curve(event, relation_of(Adjacency.REPLACE_ONE))


def reference_pld_dpsgd(
    *, noise_multiplier: float, sampling_rate: float, steps: int, adjacency: Adjacency, discretization: float
) -> Any:  # a dp_accounting PrivacyLossDistribution (dp_accounting ships no types)
    """dp_accounting's own PLD of Poisson DP-SGD: the slow reference the fast engine is checked against."""
    from dp_accounting.pld import privacy_loss_distribution as pld  # heavy: dp_accounting (~1 s), a peer back-end

    return pld.from_gaussian_mechanism(
        noise_multiplier,
        sampling_prob=sampling_rate,
        value_discretization_interval=discretization,
        neighboring_relation=relation_of(adjacency),
    ).self_compose(steps)


def reference_pld_rr(*, epsilon: float, discretization: float) -> Any:
    """dp_accounting's own PLD of one binary randomized response at ``epsilon`` (replace-one)."""
    from dp_accounting.pld import privacy_loss_distribution as pld  # heavy: dp_accounting (~1 s), a peer back-end

    noise_parameter = 2.0 * float(special.expit(-epsilon))  # 2 / (e^eps + 1): a uniform bucket w.p. this
    return pld.from_randomized_response(noise_parameter, 2, value_discretization_interval=discretization,
                                        neighboring_relation=relation_of(Adjacency.REPLACE_ONE))


def reference_pld_gaussian(*, noise_std: float, sensitivity: float, discretization: float) -> Any:
    """dp_accounting's own PLD of one Gaussian release of L2 ``sensitivity`` (no sampling)."""
    from dp_accounting.pld import privacy_loss_distribution as pld  # heavy: dp_accounting (~1 s), a peer back-end

    return pld.from_gaussian_mechanism(noise_std, sensitivity=sensitivity,
                                       value_discretization_interval=discretization)


def truncated_single_step(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    dataset_size: int,
    max_batch_size: int,
    adjacency: Adjacency,
    discretization: float,
) -> list[tuple[int, np.ndarray, float]]:
    """One step of truncated Poisson DP-SGD (arXiv:2508.15089), dp_accounting's pessimistic pmfs.

    Returns:
        ``[(lower_index, probs, infinity_mass), ...]``: the REMOVE and ADD directions (one if
        symmetric), for the caller to compose (dp_accounting's own float64 FFT composition is
        not used: its rounding noise decides epsilon at small deltas).
    """
    from dp_accounting.pld import privacy_loss_distribution as pld  # heavy: dp_accounting (~1 s), a peer back-end

    try:
        single = pld.from_truncated_subsampled_gaussian_mechanism(
            dataset_size=dataset_size,
            sampling_probability=sampling_rate,
            truncated_batch_size=max_batch_size,
            noise_multiplier=noise_multiplier,
            value_discretization_interval=discretization,
            neighboring_relation=relation_of(adjacency),
        )
        directions = [single._pmf_remove] if single._symmetric else [single._pmf_remove, single._pmf_add]
        dense = [p.to_dense_pmf() for p in directions]
        return [(int(p._lower_loss), p._probs.astype(float), float(p._infinity_mass)) for p in dense]
    except Exception as exc:
        raise AccountingError(f"dp_accounting truncated-Poisson PLD failed: {exc}") from None


def _check_prv_size(prv: object, steps: int, eps_error: float, delta_error: float) -> None:
    """Refuse a PRV composition whose grid would exceed MAX_GRID_POINTS, before it is allocated.

    prv_accountant's grid spans [-L, L] at mesh eps_error / sqrt(T/2 ln(12/delta_error))
    (Gopi, Lee, Wutschitz 2021, arXiv:2106.02848, Theorem 5.5), L from its RDP bound.
    """
    from prv_accountant.accountant import compute_safe_domain_size  # heavy: prv_accountant (~1 s), a peer back-end

    half_width = compute_safe_domain_size([prv], [steps], eps_error=eps_error, delta_error=delta_error)
    mesh = eps_error / np.sqrt(steps / 2 * np.log(12 / delta_error))
    points = 2 * half_width / mesh
    if not points <= MAX_GRID_POINTS:
        raise AccountingError(
            f"prv_accountant would need {points:.3g} grid points here (limit {MAX_GRID_POINTS:,}): too many steps, "
            "too little noise or too small an error band; use method 'pld'")


def reference_discrete_laplace_epsilon(*, epsilon: float, sensitivity: int, delta: float,
                                       discretization: float = 1e-4) -> float:
    """epsilon at ``delta`` of dp_accounting's DiscreteLaplaceDpEvent (add-remove, PLD accountant)."""
    import dp_accounting as dpa  # heavy: dp_accounting (~1 s), a peer back-end
    from dp_accounting.pld import pld_privacy_accountant  # heavy: dp_accounting (~1 s), a peer back-end

    accountant = pld_privacy_accountant.PLDAccountant(relation_of(Adjacency.ADD_REMOVE),
                                                      value_discretization_interval=discretization)
    try:
        accountant.compose(dpa.dp_event.DiscreteLaplaceDpEvent(epsilon / sensitivity, sensitivity))
        return float(accountant.get_epsilon(delta))
    except Exception as exc:  # dp_accounting raises on unsupported events
        raise AccountingError(f"dp_accounting discrete Laplace PLD failed: {exc}") from None


def prv_dpsgd_curve(
    *, noise_multiplier: float, sampling_rate: float, steps: int, delta_error: float, eps_error: float
) -> Callable[[float], tuple[float, float, float]]:
    """delta -> (lower, estimate, upper) epsilon of Poisson DP-SGD under add-remove, by PRV.

    The composition is computed once. prv_accountant raises at some settings (a "discrete
    mean differs" RuntimeError at large per-step loss, a ValueError below delta ~ 1e-13);
    both become an AccountingError here, and its band is reported, not trusted: callers
    cross-check it against PLD.
    """
    # heavy: prv_accountant (~1 s), a peer back-end
    from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

    def fail(exc: Exception) -> AccountingError:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return AccountingError(f"prv_accountant failed at these settings: {first}")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prv = PoissonSubsampledGaussianMechanism(
                noise_multiplier=noise_multiplier, sampling_probability=sampling_rate
            )
            _check_prv_size(prv, steps, eps_error, delta_error)
            accountant = PRVAccountant(
                prvs=prv, max_self_compositions=steps, eps_error=eps_error, delta_error=delta_error
            )
            composed = accountant.compute_composition(steps)
    except AccountingError:
        raise
    except Exception as exc:
        raise fail(exc) from None

    def band(delta: float) -> tuple[float, float, float]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                low, est, up = composed.compute_epsilon(delta, delta_error, eps_error)
        except Exception as exc:
            raise fail(exc) from None
        low, est, up = float(low), float(est), float(up)
        if not all(math.isfinite(v) for v in (low, est, up)) or not low <= est <= up:
            raise AccountingError(f"prv_accountant returned an invalid band ({low}, {est}, {up})")
        return max(0.0, low), max(0.0, est), max(0.0, up)

    return band
