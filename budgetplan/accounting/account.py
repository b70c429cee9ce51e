"""``account(mechanism, ...) -> Guarantee``: one entry point, every path explicit.

Which methods apply to which mechanism (anything else raises UnsupportedError naming the
part that is unsupported; nothing falls back silently to a looser method):

=====================  ==============================  ==================================
mechanism              methods (default first)         unit capped at K > 1, "tight"
=====================  ==============================  ==================================
RandomizedResponse     exact, pld, rdp                 K-fold composition (exact binomial)
GaussianRelease        exact, pld, rdp, classical      sensitivity K * Delta
PoissonDPSGD           pld, rdp, prv                   mixture of Gaussians (pld, add-remove);
                                                       double mixture (pld, replace-one)
UnitPoissonDPSGD       pld, rdp, prv                   the unit is the sampled element: as K=1
TruncatedPoissonDPSGD  pld (dp_accounting)             unsupported: use "group"
AllocationDPSGD        pld, rdp (add-remove only)      unsupported: use "group"
ShuffledDPSGD          exact, pld (no amplification)   sensitivity K per epoch
DiscreteLaplaceCount   exact                           K rows move the count by K
Composition            pld, basic                      each phase's tight unit accounting
=====================  ==============================  ==================================

A Composition holding DiscreteLaplaceCount phases (a DP count of N) is composed by mixing
the counts' finite privacy loss distributions exactly into the other phases' PLD.

``unit_accounting="group"`` instead applies the generic group-privacy formula to the
example-level guarantee of the chosen method (see ``group.py``), for every mechanism but
UnitPoissonDPSGD, whose sampled and clipped element already is the unit (no group step).

Randomized response protects labels and is accounted under replace-one only. DP-SGD under
replace-one (sensitivity 2C per example) is accounted by PLD only: dp_accounting's RDP and
prv_accountant support Poisson sampling under add-remove alone.

PLD epsilons are upper bounds at every delta accepted (``limits.MIN_PLD_DELTA`` and up):
each is composed for the delta it is read at (``pld_build``), its rounding error counted.
Work is bounded by ``limits``: a PLD grid that would not fit is coarsened (the guarantee's
``discretization`` and notes say so) or, past ``MAX_DISCRETIZATION``, refused naming the
value that works; PRV grids are sized and refused before they are allocated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from budgetplan.accounting import gaussian, group, pld_build, rr
from budgetplan.accounting.guarantee import Guarantee
from budgetplan.errors import AccountingError, BudgetplanError, InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    Composition,
    DiscreteLaplaceCount,
    GaussianRelease,
    Mechanism,
    PoissonDPSGD,
    RandomizedResponse,
    ShuffledDPSGD,
    TruncatedPoissonDPSGD,
    UnitPoissonDPSGD,
)
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate

__all__ = ["account", "account_phases", "supports", "supported_methods", "default_method", "METHODS",
           "DEFAULT_DISCRETIZATION"]

DEFAULT_DISCRETIZATION = 1e-4
METHODS = ("exact", "pld", "rdp", "prv", "classical", "basic")
UNIT_ACCOUNTING = ("tight", "group")

_DEFAULT_METHOD = {
    RandomizedResponse: "exact",
    GaussianRelease: "exact",
    PoissonDPSGD: "pld",
    UnitPoissonDPSGD: "pld",
    TruncatedPoissonDPSGD: "pld",
    AllocationDPSGD: "pld",
    ShuffledDPSGD: "exact",
    DiscreteLaplaceCount: "exact",
    Composition: "pld",
}
_SUPPORTED = {
    RandomizedResponse: ("exact", "pld", "rdp"),
    GaussianRelease: ("exact", "pld", "rdp", "classical"),
    PoissonDPSGD: ("pld", "rdp", "prv"),
    UnitPoissonDPSGD: ("pld", "rdp", "prv"),
    TruncatedPoissonDPSGD: ("pld",),
    AllocationDPSGD: ("pld", "rdp"),
    ShuffledDPSGD: ("exact", "pld"),
    DiscreteLaplaceCount: ("exact",),
    Composition: ("pld", "basic"),
}
_UNIT_SAMPLING_NOTE = (
    "units sampled, not examples: each {} joins each batch independently with probability q and the "
    "sum of its examples' gradients is clipped once to C, so one unit's change is one Poisson-sampled "
    "contribution, accounted as example-level DP-SGD over units (Charles et al., arXiv:2407.07737)"
)
_POISSON_NOTE = (
    "valid only if every example joins each batch independently with probability q; "
    "shuffled or fixed-size batches void it"
)


@dataclass(frozen=True)
class _Curve:
    """epsilon as a function of delta, with how it was obtained."""

    epsilon: Callable[[float], float]
    method: str
    bound: str = "upper"
    discretization: float | None = None
    conversion: str | None = None
    notes: tuple[str, ...] = ()
    band: Callable[[float], tuple[float, float, float]] | None = None


def account(
    mechanism: Mechanism,
    *,
    delta: float,
    adjacency: Adjacency | str,
    unit: PrivacyUnit | None = None,
    method: str | None = None,
    unit_accounting: str = "tight",
    discretization: float = DEFAULT_DISCRETIZATION,
    prv_eps_error: float = 0.05,
) -> Guarantee:
    """The (epsilon, delta) guarantee of ``mechanism`` for ``unit`` under ``adjacency``.

    Args:
        mechanism: a value from ``budgetplan.mechanisms``.
        delta: the delta to report epsilon at; 0 is allowed where the method gives pure DP.
        adjacency: ``"add-remove"`` or ``"replace-one"``.
        unit: the privacy unit (default: one example).
        method: see the module table; ``None`` picks the mechanism's default.
        unit_accounting: ``"tight"`` or ``"group"`` for a unit capped at K > 1.
        discretization: PLD grid spacing (pessimistic: a coarser grid gives a larger epsilon).
        prv_eps_error: the epsilon error band requested from prv_accountant.

    Raises:
        InvalidParameterError: a number out of range, an unknown method.
        UnsupportedError: a combination that cannot be accounted soundly here.
        AccountingError: a back-end failed.
    """
    adjacency = Adjacency.parse(adjacency)
    unit = PrivacyUnit.example() if unit is None else unit
    delta = validate.probability("delta", delta, allow_zero=True)
    discretization = _check_discretization(discretization)
    prv_eps_error = validate.positive("prv_eps_error", prv_eps_error)
    if unit_accounting not in UNIT_ACCOUNTING:
        raise InvalidParameterError(
            f"unit_accounting must be one of {', '.join(UNIT_ACCOUNTING)}, got {unit_accounting!r}"
        )
    method = _check_method(mechanism, method)
    if method == "basic":
        return _basic(mechanism, delta=delta, adjacency=adjacency, unit=unit,
                      unit_accounting=unit_accounting, discretization=discretization,
                      prv_eps_error=prv_eps_error)[0]
    if unit.cap > 1 and unit_accounting == "group" and not isinstance(mechanism, UnitPoissonDPSGD):
        # the example-level curve is read first at delta / K, then below (delta_e ~ delta / e^{K eps})
        example = _curve(mechanism, adjacency, PrivacyUnit.example(), method, discretization, prv_eps_error,
                         delta / unit.cap, smallest=delta * 1e-6)
        eps, delta_e = group.group_from_curve(example.epsilon, group_size=unit.cap, delta=delta)
        return Guarantee(
            epsilon=eps, delta=delta, method=f"group({example.method})", adjacency=adjacency, unit=unit,
            bound="upper", discretization=example.discretization, conversion=example.conversion,
            notes=example.notes + (
                f"group privacy over K={unit.cap} examples from the example-level guarantee at "
                f"delta={delta_e:.3g} (Vadhan 2017, Lemma 2.2)",
            ),
        )
    curve = _curve(mechanism, adjacency, unit, method, discretization, prv_eps_error, delta)
    eps_range = None
    if curve.band is not None:
        low, _, up = curve.band(delta)
        eps, eps_range = up, (low, up)
    else:
        eps = curve.epsilon(delta)
    bound, notes = curve.bound, curve.notes
    if curve.method == "classical":
        valid = eps < gaussian.CLASSICAL_VALID_BELOW
        bound = "upper" if valid else "invalid"
        notes += (
            "classical Gaussian formula (Dwork and Roth 2014, Thm A.1), shown for comparison: "
            + ("valid here (eps < 1) but over-noised" if valid else
               "proved only for eps < 1, so this is NOT a guarantee"),
        )
    return Guarantee(
        epsilon=eps, delta=delta, method=curve.method, adjacency=adjacency, unit=unit,
        bound=bound, epsilon_range=eps_range, discretization=curve.discretization,
        conversion=curve.conversion, notes=notes,
    )


def account_phases(
    composition: Composition,
    *,
    delta: float,
    adjacency: Adjacency | str,
    unit: PrivacyUnit | None = None,
    unit_accounting: str = "tight",
    discretization: float = DEFAULT_DISCRETIZATION,
    prv_eps_error: float = 0.05,
) -> list[Guarantee]:
    """Each phase's guarantee, with ``delta`` shared out as basic composition does."""
    adjacency = Adjacency.parse(adjacency)
    unit = PrivacyUnit.example() if unit is None else unit
    delta = validate.probability("delta", delta, allow_zero=True)
    return _basic(composition, delta=delta, adjacency=adjacency, unit=unit,
                  unit_accounting=unit_accounting, discretization=discretization,
                  prv_eps_error=prv_eps_error)[1]


def _check_discretization(value: object) -> float:
    from budgetplan.accounting.limits import MAX_DISCRETIZATION

    d = validate.positive("discretization", value)
    if d > MAX_DISCRETIZATION:
        raise InvalidParameterError(f"discretization must be at most {MAX_DISCRETIZATION:g}, got {d!r}")
    return d


def supported_methods(mechanism: object) -> tuple[str, ...]:
    """The accounting methods that apply to ``mechanism`` (a mechanism or its type), the default first."""
    kind = mechanism if isinstance(mechanism, type) else type(mechanism)
    if kind not in _SUPPORTED:
        raise InvalidParameterError(f"mechanism must be a budgetplan mechanism, got {mechanism!r}")
    default = _DEFAULT_METHOD[kind]
    return (default, *(m for m in _SUPPORTED[kind] if m != default))


def supports(mechanism: object, method: str) -> bool:
    """Whether ``method`` applies to ``mechanism`` (a mechanism or its type): the one table the planner,
    the CLI and ``account`` all ask (as dp_accounting's accountants answer ``supports(event)``)."""
    return method in supported_methods(mechanism)


def default_method(mechanism: object) -> str:
    """The method ``account`` uses for ``mechanism`` (a mechanism or its type) when none is named."""
    return supported_methods(mechanism)[0]


def _check_method(mechanism: object, method: str | None) -> str:
    kind = type(mechanism)
    if kind not in _SUPPORTED:
        raise InvalidParameterError(f"mechanism must be a budgetplan mechanism, got {mechanism!r}")
    if method is None:
        return _DEFAULT_METHOD[kind]
    if method not in METHODS:
        raise InvalidParameterError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method not in _SUPPORTED[kind]:
        raise UnsupportedError(
            f"method {method!r} does not apply to {kind.__name__}; use one of {', '.join(_SUPPORTED[kind])}"
        )
    return method


def _basic(composition: Mechanism, *, delta: float, adjacency: Adjacency, unit: PrivacyUnit, unit_accounting: str,
           discretization: float, prv_eps_error: float) -> tuple[Guarantee, list[Guarantee]]:
    """Basic composition: sum the phases' epsilons and deltas (adaptive composition).

    Phases that are pure DP under their default method (RR accounted exactly) take no
    delta; the others share ``delta`` equally.
    """
    if not isinstance(composition, Composition):
        raise UnsupportedError("method 'basic' composes the phases of a Composition; this is a single mechanism")
    leaves = composition.leaves()
    pure = [isinstance(leaf, (RandomizedResponse, DiscreteLaplaceCount)) and unit_accounting == "tight"
            for leaf in leaves]
    impure = len(leaves) - sum(pure)
    if impure and delta == 0:
        raise InvalidParameterError("delta must be > 0 when a phase is not pure DP, got 0.0")
    share = delta / impure if impure else 0.0
    phases = [
        account(leaf, delta=0.0 if is_pure else share, adjacency=adjacency, unit=unit,
                unit_accounting=unit_accounting, discretization=discretization, prv_eps_error=prv_eps_error)
        for leaf, is_pure in zip(leaves, pure)
    ]
    total = Guarantee(
        epsilon=math.fsum(g.epsilon for g in phases),
        delta=math.fsum(g.delta for g in phases),
        method="basic-composition",
        adjacency=adjacency,
        unit=unit,
        bound="upper",
        notes=(f"sum of {len(phases)} phase guarantees ({', '.join(g.method for g in phases)})",),
    )
    return total, phases


# --------------------------------------------------------------------------- curves


def _curve(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit, method: str, discretization: float,
           prv_eps_error: float, delta: float, *, smallest: float | None = None) -> _Curve:
    """The curve of ``mechanism``, read first at ``delta`` and never below ``smallest``."""
    if isinstance(mechanism, RandomizedResponse):
        return _rr_curve(mechanism, adjacency, unit, method, discretization, delta)
    if isinstance(mechanism, GaussianRelease):
        return _gaussian_curve(mechanism, adjacency, unit, method, discretization, delta)
    if isinstance(mechanism, PoissonDPSGD):
        return _dpsgd_curve(mechanism, adjacency, unit, method, discretization, prv_eps_error, delta,
                            delta if smallest is None else smallest)
    if isinstance(mechanism, UnitPoissonDPSGD):
        curve = _dpsgd_curve(mechanism.as_poisson(), adjacency, PrivacyUnit.example(), method, discretization,
                             prv_eps_error, delta, delta if smallest is None else smallest)
        return dataclasses.replace(curve, notes=(_UNIT_SAMPLING_NOTE.format(unit.describe()),) + tuple(
            n for n in curve.notes if n != _POISSON_NOTE))
    if isinstance(mechanism, TruncatedPoissonDPSGD):
        return _truncated_curve(mechanism, adjacency, unit, discretization)
    if isinstance(mechanism, AllocationDPSGD):
        if method == "rdp":
            return _allocation_curve(mechanism, adjacency, unit)
        from budgetplan.accounting import allocation_pld  # the back-ends load with the mechanisms that need them

        how = (f"{allocation_pld.REFERENCE}: one epoch's likelihood ratio bounded in the convex order (mean-preserving "
               "spreads on a grid), so both directions are dominated; epochs composed",)
        if mechanism.noise_multiplier < allocation_pld.MIN_NOISE:
            how = (f"noise multiplier below {allocation_pld.MIN_NOISE:g}: no amplification claimed, each epoch "
                   "accounted as the one Gaussian release it places at a random step",)
        return _pld_curve(mechanism, adjacency, unit, discretization, delta, "pld", _allocation_notes(mechanism, how))
    if isinstance(mechanism, ShuffledDPSGD):
        return _shuffle_curve(mechanism, adjacency, unit, method, discretization, delta)
    if isinstance(mechanism, DiscreteLaplaceCount):
        return _count_curve(mechanism, unit)
    if any(isinstance(m, DiscreteLaplaceCount) for m in mechanism.leaves()):
        return _composed_with_counts(mechanism, adjacency, unit, discretization, delta)
    return _pld_curve(mechanism, adjacency, unit, discretization, delta, "pld",
                      ("PLD composition of all phases under one adjacency",))


def _pld_curve(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit, discretization: float, delta: float,
               method: str, notes: tuple[str, ...] = ()) -> _Curve:
    """The fast-engine PLD of ``mechanism`` as a curve, one composition per delta read.

    Each composition is tilted for its delta (tight there); the one for ``delta`` is built
    now, so that a refusal or a coarsened grid shows up before anything is reported. At
    delta = 0 the curve answers the pure-DP epsilon (inf unless every phase is RR). Deltas
    below MIN_PLD_DELTA read by a search (group privacy) answer inf, a valid upper bound.
    """
    from budgetplan.accounting import fastpld
    from budgetplan.accounting.limits import MIN_PLD_DELTA

    built: dict[float, pld_build.BuiltPLD] = {}

    def get(d: float) -> pld_build.BuiltPLD:
        if d not in built:
            built[d] = pld_build.build(mechanism, adjacency=adjacency, unit=unit, discretization=discretization,
                                       delta=d)
        return built[d]

    def epsilon(d: float) -> float:
        if d <= 0:
            return pld_build.pure_epsilon(mechanism, unit, discretization)
        if d < MIN_PLD_DELTA and d != delta:
            return math.inf
        return fastpld.epsilon_for_delta(get(d).pld, d)

    main = get(delta) if delta > 0 else None
    return _Curve(
        epsilon=epsilon, method=method, bound="upper",
        discretization=main.discretization if main else discretization,
        notes=("pessimistic PLD (connect-the-dots, arXiv:2207.04380), composed by an exponentially tilted "
               "FFT with its rounding error added",) + tuple(notes) + (main.notes if main else ()),
    )


def _rr_curve(mech: RandomizedResponse, adjacency: Adjacency, unit: PrivacyUnit, method: str, discretization: float,
              delta: float) -> _Curve:
    if adjacency is not Adjacency.REPLACE_ONE:
        raise UnsupportedError(
            "randomized response protects labels under replace-one adjacency; add-remove would "
            "reveal an example's presence through its released features"
        )
    k, e = unit.cap, mech.epsilon
    if method == "exact":
        return _Curve(epsilon=lambda d: rr.composed_epsilon(e, k, d), method="exact", bound="exact",
                      notes=(f"{k} x RR(eps={e:.6g}) per unit, exact binomial privacy loss",) if k > 1 else ())
    if method == "rdp":
        from budgetplan.accounting import backends

        rdp = backends.rdp_rr_curve(epsilon=e, count=k)

        def checked(d: float) -> float:
            # dp_accounting's RR RDP cancels catastrophically at tiny per-copy epsilons (1e8 copies
            # of RR(1e-8) report 0): an upper bound below the exact value is a back-end failure.
            got, exact = rdp(d), rr.composed_epsilon(e, k, d)
            if got < exact * (1.0 - 1e-9):
                raise AccountingError(
                    f"dp_accounting RDP returned epsilon={got:.6g}, below the exact {exact:.6g}, for {k} x RR("
                    f"eps={e:.3g}); use method 'exact'")
            return got

        return _Curve(epsilon=checked, method="rdp", conversion=backends.RDP_CONVERSION)
    return _pld_curve(mech, adjacency, unit, discretization, delta, "pld")


def _gaussian_curve(mech: GaussianRelease, adjacency: Adjacency, unit: PrivacyUnit, method: str, discretization: float,
                    delta: float) -> _Curve:
    sens = mech.sensitivity * unit.cap  # a unit of K examples moves the sum by at most K * Delta
    sigma = mech.noise_std
    notes = (f"unit sensitivity {unit.cap} x {mech.sensitivity:.6g}",) if unit.cap > 1 else ()
    if method == "exact":
        return _Curve(epsilon=lambda d: gaussian.analytic_epsilon(sigma=sigma, delta=d, sensitivity=sens)
                      if d > 0 else math.inf, method="exact", bound="exact",
                      notes=("analytic Gaussian mechanism (Balle and Wang 2018, arXiv:1805.06530)",) + notes)
    if method == "classical":
        return _Curve(epsilon=lambda d: gaussian.classical_epsilon(sigma=sigma, delta=d, sensitivity=sens)
                      if d > 0 else math.inf, method="classical", bound="upper", notes=notes)
    if method == "rdp":
        from budgetplan.accounting import backends

        return _Curve(epsilon=backends.rdp_gaussian_curve(noise_multiplier=sigma / sens), method="rdp",
                      conversion=backends.RDP_CONVERSION, notes=notes)
    return _pld_curve(mech, adjacency, unit, discretization, delta, "pld", notes)


def _dpsgd_curve(mech: PoissonDPSGD, adjacency: Adjacency, unit: PrivacyUnit, method: str, discretization: float,
                 prv_eps_error: float, delta: float, smallest: float) -> _Curve:
    user_level = unit.cap > 1
    if method in ("rdp", "prv"):
        if adjacency is not Adjacency.ADD_REMOVE:
            raise UnsupportedError(
                f"{method} accounts Poisson DP-SGD under add-remove only; use method 'pld' for replace-one"
            )
        if user_level:
            raise UnsupportedError(
                f"{method} cannot account K={unit.cap} examples per unit as a mixture of Gaussians; "
                "use method 'pld', or unit_accounting 'group'"
            )
    notes = (_POISSON_NOTE,)
    if method in ("rdp", "prv"):
        from budgetplan.accounting import backends
    if method == "rdp":
        return _Curve(epsilon=backends.rdp_dpsgd_curve(noise_multiplier=mech.noise_multiplier,
                                                       sampling_rate=mech.sampling_rate, steps=mech.steps),
                      method="rdp", conversion=backends.RDP_CONVERSION, notes=notes)
    if method == "prv":
        band = backends.prv_dpsgd_curve(noise_multiplier=mech.noise_multiplier, sampling_rate=mech.sampling_rate,
                                        steps=mech.steps, delta_error=max(smallest, 1e-300) / 1000,
                                        eps_error=prv_eps_error)
        return _Curve(epsilon=lambda d: band(d)[2], method="prv", bound="upper", band=band,
                      discretization=None, notes=notes + (
                          f"PRV accountant (Gopi, Lee and Wutschitz 2021, arXiv:2106.02848), requested "
                          f"eps error {prv_eps_error:g}; reported epsilon is the upper end of its band",))
    if user_level and adjacency is Adjacency.REPLACE_ONE:
        return _pld_curve(mech, adjacency, unit, discretization, delta, "double-mixture-of-gaussians(pld)", notes + (
            f"each of a unit's K={unit.cap} examples sampled independently, and under replace-one each sampled "
            f"one may change: sum_k b_k N(-k, sigma^2) vs sum_k b_k N(+k, sigma^2) with b = Binomial({unit.cap}, q) "
            "(double mixture of Gaussians, arXiv:2403.04867, Theorem 3.8)",))
    if user_level:
        return _pld_curve(mech, adjacency, unit, discretization, delta, "mixture-of-gaussians(pld)", notes + (
            f"each of a unit's K={unit.cap} examples sampled independently: sensitivity "
            f"Binomial({unit.cap}, q) (MixtureOfGaussians, arXiv:2310.15526)",))
    return _pld_curve(mech, adjacency, unit, discretization, delta, "pld", notes)


def _count_curve(mech: DiscreteLaplaceCount, unit: PrivacyUnit) -> _Curve:
    """Pure DP: the likelihood ratio of counts c + Z and c' + Z is at most e^{a |c - c'|}, a = eps / sensitivity.

    Exact at every delta: the bound is attained (an output beyond both counts has ratio
    exactly e^{a |c - c'|}), so the curve is flat. A unit of K rows moves the count by at
    most K; at K = sensitivity (how the planner draws it) this is ``epsilon`` itself.
    """
    k, s = unit.cap, mech.sensitivity
    eps = mech.epsilon if k == s else mech.epsilon * k / s
    notes: tuple[str, ...] = (
        f"discrete Laplace count, noise parameter {mech.noise_parameter:.6g}, sensitivity {s}: pure DP "
        "(Ghosh, Roughgarden and Sundararajan 2009, arXiv:0811.2841)",)
    if k != s:
        notes += (f"a unit of {k} rows moves the count by {k}, not the {s} it was drawn for",)
    return _Curve(epsilon=lambda d: eps, method="exact", bound="exact", notes=notes)


def _count_losses(mech: DiscreteLaplaceCount, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """The privacy loss distribution of a count moved by ``shift``: a finite one, the same both ways.

    With a = eps / sensitivity and the output c + shift + Z, the loss is a (|Z + shift| - |Z|):
    a shift for Z >= 0, -a shift for Z <= -shift, a (shift + 2z) for -shift < z < 0.
    """
    a = mech.noise_parameter
    alpha = math.exp(-a)
    z = np.arange(-shift + 1, 0)
    losses = np.concatenate(([-a * shift], a * (shift + 2 * z), [a * shift]))
    probs = np.concatenate(([alpha**shift / (1 + alpha)], math.tanh(a / 2) * np.exp(-a * np.abs(z)),
                            [1 / (1 + alpha)]))
    return losses, probs


def _composed_with_counts(mechanism: Composition, adjacency: Adjacency, unit: PrivacyUnit, discretization: float,
                          delta: float) -> _Curve:
    """PLD composition of pure DP counts with the other phases, mixing the counts' losses exactly.

    For independent releases the losses add, so delta(eps) = sum_l P(L = l) delta_rest(eps - l)
    over the counts' finitely many losses l, with delta_rest the other phases' pessimistic
    PLD taken at its worse direction for each term (the count's loss is the same both ways):
    an upper bound on the composed delta at every eps. epsilon(delta) is then found by
    bisection and rounded up; it never exceeds basic composition.
    """
    from budgetplan.accounting import fastpld

    leaves = mechanism.leaves()
    counts = [m for m in leaves if isinstance(m, DiscreteLaplaceCount)]
    rest = tuple(m for m in leaves if not isinstance(m, DiscreteLaplaceCount))
    losses, probs = np.zeros(1), np.ones(1)
    for c in counts:
        l_c, p_c = _count_losses(c, unit.cap)
        losses, probs = (losses[:, None] + l_c).ravel(), (probs[:, None] * p_c).ravel()
    worst = float(losses.max())
    notes = ("pure DP counts composed exactly with the other phases' privacy loss distribution",)
    if not rest:
        return _Curve(epsilon=lambda d: worst, method="exact", bound="upper", notes=notes)
    rest_mech = rest[0] if len(rest) == 1 else Composition(phases=rest)
    built: dict[float, pld_build.BuiltPLD] = {}

    def pld_at(d: float) -> fastpld.PLD:
        # Tilted for d (tight there); every entry is an upper bound, so reading it at the
        # shifted epsilons eps - l stays an upper bound too.
        if d not in built:
            built[d] = pld_build.build(rest_mech, adjacency=adjacency, unit=unit, discretization=discretization,
                                       delta=d)
        return built[d].pld

    def epsilon(d: float) -> float:
        if d <= 0:
            return worst + pld_build.pure_epsilon(rest_mech, unit, discretization)
        pld = pld_at(d)

        def delta_at(eps: float) -> float:
            return float(np.dot(probs, fastpld.delta_for_epsilon(pld, eps - losses)))

        alone = fastpld.epsilon_for_delta(pld, d)
        if not math.isfinite(alone):
            return math.inf
        lo, hi = max(0.0, alone - worst), alone + worst  # delta_at(hi) <= d: basic composition
        if delta_at(lo) <= d:
            return lo
        while hi - lo > 1e-12 * max(hi, 1.0):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if delta_at(mid) <= d else (mid, hi)
        return hi

    return _Curve(epsilon=epsilon, method="pld", bound="upper", discretization=discretization,
                  notes=("pessimistic PLD (connect-the-dots, arXiv:2207.04380)",) + notes)


def _truncated_curve(mech: TruncatedPoissonDPSGD, adjacency: Adjacency, unit: PrivacyUnit,
                     discretization: float) -> _Curve:
    if unit.cap > 1:
        raise UnsupportedError(
            f"no tight accounting of truncated Poisson batches for K={unit.cap} examples per unit; "
            "use unit_accounting 'group'"
        )
    from budgetplan.accounting import backends, fastpld
    from budgetplan.accounting.limits import MAX_COMPOSITIONS, MAX_SINGLE_GRID_POINTS

    steps, rel = mech.steps, adjacency.value
    if steps > MAX_COMPOSITIONS:
        raise UnsupportedError(
            f"steps={steps:.4g} is beyond the PLD engine's limit of {MAX_COMPOSITIONS:.0e} compositions")
    # dp_accounting builds the step on its own grid: refuse, before it allocates, a grid past
    # the engine's limit (sized by the plain Poisson step, whose losses span about as far).
    span = fastpld.gaussian_loss_range(noise_multiplier=mech.noise_multiplier, sampling_rate=mech.sampling_rate,
                                       relation=rel)
    if span / discretization > MAX_SINGLE_GRID_POINTS:
        raise UnsupportedError(
            f"discretization {discretization:g} needs about {span / discretization:.3g} grid points per step of "
            f"these truncated Poisson batches (limit {MAX_SINGLE_GRID_POINTS:,}); use discretization >= "
            f"{span / MAX_SINGLE_GRID_POINTS * 1.05:.3g}")
    cache: list[fastpld.PLD] = []

    def single() -> fastpld.PLD:  # dp_accounting's step takes seconds: built once, composed per delta read
        if not cache:
            pmfs = backends.truncated_single_step(
                noise_multiplier=mech.noise_multiplier, sampling_rate=mech.sampling_rate,
                dataset_size=mech.dataset_size, max_batch_size=mech.max_batch_size, adjacency=adjacency,
                discretization=discretization)
            cache.append(fastpld.PLD(tuple(fastpld.PLDPmf(discretization, lo, p, inf) for lo, p, inf in pmfs), rel))
        return cache[0]

    def epsilon(d: float) -> float:
        return fastpld.epsilon_for_delta(fastpld.self_compose(single(), steps, delta=d), d) if d > 0 else math.inf

    return _Curve(epsilon=epsilon, method="pld", bound="upper", discretization=discretization, notes=(
                      "pessimistic PLD of truncated Poisson batches (dp_accounting's single step, "
                      "arXiv:2508.15089), composed by an exponentially tilted FFT with its rounding error added",
                      "valid only if batches are Poisson samples truncated to the declared maximum by a "
                      "uniformly random subset"))


def _allocation_curve(mech: AllocationDPSGD, adjacency: Adjacency, unit: PrivacyUnit) -> _Curve:
    from budgetplan.accounting import allocation, allocation_pld, backends

    allocation_pld.check_applies(adjacency, unit)

    def epsilon(d: float) -> float:
        if d <= 0:
            return math.inf
        return allocation.epsilon(noise_multiplier=mech.noise_multiplier, steps_per_epoch=mech.steps_per_epoch,
                                  epochs=mech.epochs, delta=min(d, 0.5))

    return _Curve(epsilon=epsilon, method="rdp", conversion=backends.RDP_CONVERSION.replace(
        "minimised over its default orders", "minimised over the integer orders 2-256"), notes=_allocation_notes(mech, (
            f"{allocation.REFERENCE}: remove direction by its exact Renyi divergences, add direction by a certified "
            "upper bound on its negative moments (convex chords, capped by the Jensen bound); the worse direction",)))


def _allocation_notes(mech: AllocationDPSGD, how: tuple[str, ...]) -> tuple[str, ...]:
    return (f"random allocation: every example in exactly one of the {mech.steps_per_epoch} steps of each of "
            f"{mech.epochs} epochs",) + how + (
        "valid only if each epoch allocates every example to one uniformly random step, from an unpredictable "
        "generator; Poisson, shuffled or fixed-size batches void it",)


def _shuffle_curve(mech: ShuffledDPSGD, adjacency: Adjacency, unit: PrivacyUnit, method: str, discretization: float,
                   delta: float) -> _Curve:
    from budgetplan.accounting import shuffle

    sens = shuffle.sensitivity(adjacency, unit.cap)
    notes = [f"shuffled fixed-size batches: no amplification claimed; each example is in at most one batch per "
             f"epoch, so {mech.epochs} Gaussian release(s) of sensitivity {sens:g} (units of the clipping norm), "
             "whatever the order of the batches"]
    if delta > 0 and unit.cap == 1:
        low = shuffle.lower_epsilon(noise_multiplier=mech.noise_multiplier, steps_per_epoch=mech.steps_per_epoch,
                                    epochs=mech.epochs, delta=min(delta, 0.5))
        notes.append(f"{shuffle.LOWER_REFERENCE}: no analysis of this run can give less than epsilon {low:.4g} "
                     f"at delta {delta:.3g}")
        poisson = PoissonDPSGD(noise_multiplier=mech.noise_multiplier, sampling_rate=1.0 / mech.steps_per_epoch,
                               steps=mech.steps)
        try:
            would = _dpsgd_curve(poisson, adjacency, unit, "pld", discretization, 0.05, delta, delta).epsilon(delta)
            notes.append(f"what Poisson sampling at q = 1/{mech.steps_per_epoch} would give: epsilon {would:.4g} "
                         "-- NOT a guarantee for shuffled batches")
        except BudgetplanError:
            pass
    if method == "pld":
        if unit.cap > 1:
            raise UnsupportedError("the PLD of shuffled batches is built for one example per unit; use method "
                                   "'exact'")
        return _pld_curve(mech, adjacency, unit, discretization, delta, "pld", tuple(notes))
    sigma = mech.noise_multiplier / math.sqrt(mech.epochs)
    return _Curve(epsilon=lambda d: shuffle.upper_epsilon(noise_multiplier=mech.noise_multiplier, epochs=mech.epochs,
                                                          delta=d, adjacency=adjacency, cap=unit.cap),
                  method="exact", bound="upper", notes=tuple(notes) + (
                      f"{mech.epochs} Gaussians of noise {mech.noise_multiplier:.6g} compose exactly into one of "
                      f"noise {sigma:.6g} (analytic Gaussian, Balle and Wang 2018, arXiv:1805.06530)",))
