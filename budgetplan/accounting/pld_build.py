"""The fast-engine PLD of a mechanism at the unit level, on a grid the engine can afford.

``pld_of`` turns a mechanism into (single-step PLD, count) parts and composes them in one
tilted FFT per direction for the delta it will be read at (see ``pld_ops``). Three choices
are made here, each pessimistic:

* the single-step truncation reaches below delta / (1000 x steps), so the tails it moves to
  infinity cost at most a thousandth of delta;
* for K examples per unit (mixture of Gaussians under add-remove, double mixture under
  replace-one), only the window of Binomial(K, q) outside which at most
  delta / (1000 x steps) lies is kept; the rest is an infinite sensitivity;
* a grid longer than the engine's limits (``limits``) is replaced by the finest coarser one
  that fits; ``BuiltPLD.discretization`` and its note say so.

A unit cap so large that even the kept binomial window exceeds MAX_MIXTURE_ATOMS, and step
counts beyond MAX_COMPOSITIONS, are refused with the largest value that works.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from budgetplan.accounting import fastpld, mixture_pld, mog
from budgetplan.accounting.ctd import readonly
from budgetplan.accounting.limits import MAX_COMPOSITIONS, MAX_DISCRETIZATION, MAX_GRID_POINTS, MAX_MIXTURE_ATOMS
from budgetplan.errors import AccountingError, InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    Composition,
    GaussianRelease,
    Mechanism,
    PoissonDPSGD,
    RandomizedResponse,
    ShuffledDPSGD,
    UnitPoissonDPSGD,
)
from budgetplan.units import Adjacency, PrivacyUnit

__all__ = ["BuiltPLD", "build", "pld_of", "pure_epsilon"]

# Share of delta that the single-step truncation and the dropped binomial tails may take.
_TAIL_SHARE = 1e-3
# Each failed try coarsens the grid at least 1.5-fold; a few always suffice.
_COARSEN_TRIES = 8
# The last few compositions, by (mechanism, adjacency, unit, discretization, delta): a
# calibration re-accounts the noise it settled on, and a split grid's cells and a planner's
# alternatives ask for the same mechanism more than once. A composed grid is up to
# MAX_GRID_POINTS floats, so only a handful are kept (read-only).
_RECENT: OrderedDict[tuple[object, ...], BuiltPLD] = OrderedDict()
_RECENT_SIZE = 4


@dataclass(frozen=True, slots=True)
class BuiltPLD:
    """A composed PLD and the grid it was built on.

    Attributes:
        pld: the PLD (tilted for ``delta``).
        discretization: the grid spacing used, >= the one asked for.
        notes: what a reader must know about the grid (a coarsening), if anything.
    """

    pld: fastpld.PLD
    discretization: float
    notes: tuple[str, ...] = ()


def build(mechanism: Mechanism, *, adjacency: Adjacency, unit: PrivacyUnit, discretization: float,
          delta: float, keep: bool = True) -> BuiltPLD:
    """The PLD of ``mechanism`` for ``unit`` under ``adjacency``, tight at ``delta``.

    ``keep=False`` builds without entering the result among the last few kept (a search's
    throw-away evaluations on a coarse grid, which would push out the ones it will ask for again).

    Raises:
        InvalidParameterError: delta below MIN_PLD_DELTA.
        UnsupportedError: a combination without a PLD here, more steps or copies than
            MAX_COMPOSITIONS, a unit cap whose mixture exceeds MAX_MIXTURE_ATOMS.
    """
    key = (mechanism, adjacency, unit, discretization, delta)
    try:
        hit = _RECENT.get(key)
    except TypeError:  # a mechanism holding an unhashable value: not kept
        return _build(mechanism, adjacency, unit, discretization, delta)
    if hit is None and not keep:
        return _build(mechanism, adjacency, unit, discretization, delta)
    if hit is not None:
        _RECENT.move_to_end(key)
        return hit
    built = _build(mechanism, adjacency, unit, discretization, delta)
    for pmf in built.pld.pmfs:
        readonly(pmf)
    _RECENT[key] = built
    while len(_RECENT) > _RECENT_SIZE:
        _RECENT.popitem(last=False)
    return built


def _build(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit, discretization: float,
           delta: float) -> BuiltPLD:
    d = discretization
    for _ in range(_COARSEN_TRIES):
        try:
            pld = fastpld.compose_all(_parts(mechanism, adjacency, unit, d, delta), delta=delta)
            break
        except fastpld.GridLimitError as exc:
            if d >= MAX_DISCRETIZATION:
                raise UnsupportedError(_hopeless(mechanism, adjacency, unit, delta)) from None
            d = min(MAX_DISCRETIZATION, max(1.5 * d, d * exc.points / exc.limit * 1.05))
    else:
        raise AccountingError(f"no PLD grid up to discretization {d:.3g} fits the engine's limits")
    notes: tuple[str, ...] = ()
    if d > discretization:
        notes = (f"PLD grid coarsened from discretization {discretization:g} to {d:.3g} to stay within the "
                 "engine's size limits (still a pessimistic upper bound, looser by about that much per step)",)
    return BuiltPLD(pld, d, notes)


def pld_of(mechanism: Mechanism, *, adjacency: Adjacency, unit: PrivacyUnit, discretization: float,
           delta: float, keep: bool = True) -> fastpld.PLD:
    """``build(...).pld``."""
    return build(mechanism, adjacency=adjacency, unit=unit, discretization=discretization, delta=delta,
                 keep=keep).pld


def pure_epsilon(mechanism: Mechanism, unit: PrivacyUnit, discretization: float) -> float:
    """epsilon at delta = 0 on the PLD grid: the sum of each RR copy's rounded-up loss; inf otherwise."""
    if isinstance(mechanism, Composition):
        return math.fsum(pure_epsilon(p, unit, discretization) for p in mechanism.leaves())
    if not isinstance(mechanism, RandomizedResponse):
        return math.inf
    d = discretization
    while True:
        try:
            pmf = fastpld.randomized_response(epsilon=mechanism.epsilon, discretization=d).pmfs[0]
            return unit.cap * (pmf.lower_index + pmf.probs.size - 1) * d
        except fastpld.GridLimitError as exc:
            if d >= MAX_DISCRETIZATION:
                raise UnsupportedError(_hopeless(mechanism, Adjacency.REPLACE_ONE, unit, 1e-5)) from None
            d = min(MAX_DISCRETIZATION, max(1.5 * d, d * exc.points / exc.limit * 1.05))


# ------------------------------------------------------------------- refusals


def _hopeless(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit, delta: float) -> str:
    """Why no PLD grid within the limits holds ``mechanism``, and the value that would work.

    The value is found by bisection on the parameter, each probe building the single step
    at the coarsest grid (MAX_DISCRETIZATION) and sizing its composition without running it
    (``fastpld.window_size``).
    """
    def fits(mech: Mechanism, u: PrivacyUnit) -> bool:
        try:
            parts = _parts(mech, adjacency, u, MAX_DISCRETIZATION, delta)
            return fastpld.window_size(parts, delta) <= MAX_GRID_POINTS
        except fastpld.GridLimitError:
            return False

    if isinstance(mechanism, RandomizedResponse):
        best = _boundary(lambda e: fits(RandomizedResponse(epsilon=e), unit), mechanism.epsilon, larger_fits=False)
        return (f"epsilon={mechanism.epsilon:g} is too large for PLD accounting (it works up to about "
                f"{best:.3g}); use method 'exact'")
    if isinstance(mechanism, GaussianRelease):
        best = _boundary(lambda s: fits(GaussianRelease(noise_std=s, sensitivity=mechanism.sensitivity), unit),
                         mechanism.noise_std, larger_fits=True)
        return (f"noise_std={mechanism.noise_std:g} is too small for PLD accounting (it works from about "
                f"{best:.3g}); use method 'exact'")
    if isinstance(mechanism, UnitPoissonDPSGD) or (isinstance(mechanism, PoissonDPSGD) and unit.cap == 1):
        best = _boundary(lambda s: fits(replace(mechanism, noise_multiplier=s), unit), mechanism.noise_multiplier,
                         larger_fits=True)
        return (f"noise_multiplier={mechanism.noise_multiplier:g} is too small for PLD accounting (it works from "
                f"about {best:.3g}); use method 'rdp'")
    if isinstance(mechanism, PoissonDPSGD):
        steps = mechanism.steps
        bound, drop = _truncation(delta, steps), delta * _TAIL_SHARE / steps

        def step_fits(cap: int) -> bool:  # one step's grid sized, not built: cheap
            try:
                _mixture_inputs(mechanism, adjacency, cap, MAX_DISCRETIZATION, bound, drop, check_only=True)
                return True
            except (fastpld.GridLimitError, UnsupportedError):
                return False

        def full(cap: int) -> bool:
            return fits(mechanism, PrivacyUnit.capped(cap))

        # Where one step alone is too large, search on its size, then confirm with one build.
        lo = _largest_cap_that(step_fits if not step_fits(unit.cap) else full, unit.cap)
        if lo > 1 and not full(lo):
            lo = _largest_cap_that(full, lo)
        kind = "mixture-of-Gaussians" if adjacency is Adjacency.ADD_REMOVE else "double-mixture-of-Gaussians"
        return (f"unit cap {unit.cap:,} is too large for the {kind} PLD at noise_multiplier="
                f"{mechanism.noise_multiplier:g} (it works up to a unit cap of about {lo:,}); use unit_accounting "
                "'group'")
    return ("a phase of this composition has privacy losses beyond the PLD engine's grids; "
            "account the phases separately (method 'basic')")


def _largest_cap_that(fits: Callable[[int], bool], cap: int) -> int:
    """The largest unit cap below ``cap`` (to 1%) for which ``fits`` holds, for fits monotone (1 if none)."""
    lo, hi = 1, cap
    while hi - lo > max(1, lo // 100):  # to 1%
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _boundary(fits: Callable[[float], bool], value: float, *, larger_fits: bool) -> float:
    """The value nearest ``value`` (above it if larger values fit, else below) that fits, to 1%."""
    sign = 1.0 if larger_fits else -1.0
    bad, good = math.log(value), math.log(value) + sign
    step = 1.0
    while not fits(math.exp(good)):
        bad, step = good, 2.0 * step
        good += sign * step
        if step > 2048:  # e^2048: nothing fits
            return math.inf if larger_fits else 0.0
    while abs(good - bad) > 0.01:
        mid = 0.5 * (good + bad)
        good, bad = (mid, bad) if fits(math.exp(mid)) else (good, mid)
    return math.exp(good)


# ------------------------------------------------------------------------------ parts


def _truncation(delta: float, count: int) -> float:
    """ln of the single-step tail mass left to infinity: dp_accounting's -50, or lower."""
    return max(-700.0, min(-50.0, math.log(delta * _TAIL_SHARE / count)))


def _count(name: str, count: int) -> int:
    if count > MAX_COMPOSITIONS:
        raise UnsupportedError(
            f"{name}={count:.4g} is beyond the PLD engine's limit of {MAX_COMPOSITIONS:.0e} compositions; "
            "use method 'rdp'")
    return count


def _parts(mechanism: Mechanism, adjacency: Adjacency, unit: PrivacyUnit, d: float,
           delta: float) -> list[tuple[fastpld.PLD, int]]:
    if isinstance(mechanism, Composition):
        return [part for leaf in mechanism.leaves() for part in _parts(leaf, adjacency, unit, d, delta)]
    rel = adjacency.value
    if isinstance(mechanism, RandomizedResponse):
        if adjacency is not Adjacency.REPLACE_ONE:
            raise UnsupportedError("randomized response protects labels under replace-one adjacency only")
        return [(fastpld.randomized_response(epsilon=mechanism.epsilon, discretization=d),
                 _count("unit cap", unit.cap))]
    if isinstance(mechanism, GaussianRelease):
        ratio = mechanism.noise_std / (mechanism.sensitivity * unit.cap)
        if not 1e-100 <= ratio <= 1e100:
            raise InvalidParameterError(
                f"noise_std / unit sensitivity must be in [1e-100, 1e100] for PLD accounting, got {ratio:.3g}")
        # The stated sensitivity is the full shift between neighbours. The engine's replace-one
        # Gaussian shifts by 2 (+1 and -1), so the same shift needs twice the multiplier there.
        nm = ratio if adjacency is Adjacency.ADD_REMOVE else 2.0 * ratio
        return [(fastpld.gaussian(noise_multiplier=nm, relation=rel, discretization=d,
                                  log_mass_truncation_bound=_truncation(delta, 1)), 1)]
    if isinstance(mechanism, ShuffledDPSGD):
        if unit.cap > 1:
            raise UnsupportedError("the PLD of shuffled batches is built for one example per unit")
        # E releases of sensitivity 1 (2 under replace-one, as the engine's replace-one Gaussian
        # shifts) compose exactly into one of noise sigma / sqrt(E)
        return [(fastpld.gaussian(noise_multiplier=mechanism.noise_multiplier / math.sqrt(mechanism.epochs),
                                  relation=rel, discretization=d, log_mass_truncation_bound=_truncation(delta, 1)),
                 1)]
    if isinstance(mechanism, UnitPoissonDPSGD):
        # the unit is the element sampled and clipped: one unit moves one Poisson contribution
        return _parts(mechanism.as_poisson(), adjacency, PrivacyUnit.example(unit.name), d, delta)
    if isinstance(mechanism, AllocationDPSGD):
        from budgetplan.accounting import allocation_pld  # loaded with the mechanism that needs it

        allocation_pld.check_applies(adjacency, unit)
        return [(allocation_pld.epoch_pld(noise_multiplier=mechanism.noise_multiplier,
                                          steps_per_epoch=mechanism.steps_per_epoch, discretization=d),
                 _count("epochs", mechanism.epochs))]
    if isinstance(mechanism, PoissonDPSGD):
        steps = _count("steps", mechanism.steps)
        bound = _truncation(delta, steps)
        if unit.cap == 1:
            single = fastpld.gaussian(noise_multiplier=mechanism.noise_multiplier,
                                      sampling_rate=mechanism.sampling_rate, relation=rel,
                                      discretization=d, log_mass_truncation_bound=bound)
        else:
            single = _mixture(mechanism, adjacency, unit.cap, d, bound, delta * _TAIL_SHARE / steps)
        return [(single, steps)]
    raise UnsupportedError(
        f"{type(mechanism).__name__} has no fast PLD here; account it on its own with method 'pld'"
    )


def _mixture(mech: PoissonDPSGD, adjacency: Adjacency, cap: int, d: float, bound: float,
             drop: float) -> fastpld.PLD:
    """One step for a unit of ``cap`` examples: sensitivity Binomial(cap, q), tails dropped.

    Add-remove: the mixture of Gaussians (REMOVE and ADD). Replace-one: the double mixture,
    every sampled example of the unit moving its output from -C to +C.
    """
    pld = _mixture_inputs(mech, adjacency, cap, d, bound, drop, check_only=False)
    assert pld is not None  # built, not only checked
    return pld


def _mixture_inputs(mech: PoissonDPSGD, adjacency: Adjacency, cap: int, d: float, bound: float, drop: float, *,
                    check_only: bool) -> fastpld.PLD | None:
    """``_mixture``'s step, built, or (``check_only``) only sized: raises what building would raise."""
    from scipy import stats  # heavy: scipy.stats (~0.7 s), for mixtures only

    q = mech.sampling_rate
    lo, hi, outside = mog.binomial_window(cap, q, drop)
    if hi - lo + 1 > MAX_MIXTURE_ATOMS:
        raise UnsupportedError(
            f"unit cap {cap:,} at sampling rate {q:.4g} needs a mixture of {hi - lo + 1:,} Gaussians per step "
            f"(limit {MAX_MIXTURE_ATOMS:,}); the tight accounting works up to unit cap "
            f"{_largest_cap(cap, q, drop):,}; use unit_accounting 'group' beyond")
    sens = np.arange(lo, hi + 1)
    probs = stats.binom.pmf(sens, cap, q)
    # Atoms whose probability underflows to 0 are dropped by the engine: count them as left out too.
    outside += np.count_nonzero(probs == 0.0) * np.finfo(float).tiny
    sigma, atoms = mech.noise_multiplier, tuple(float(s) for s in sens)
    weights, dropped = tuple(float(p) for p in probs), min(1.0, outside)
    if check_only:
        mixture_pld.check_size(standard_deviation=sigma, sensitivities=atoms, probabilities=weights,
                               relation=adjacency.value, discretization=d, log_mass_truncation_bound=bound,
                               dropped_mass=dropped)
        return None
    builder = (fastpld.mixture_of_gaussians if adjacency is Adjacency.ADD_REMOVE
               else fastpld.double_mixture_of_gaussians)
    return builder(standard_deviation=sigma, sensitivities=atoms, probabilities=weights, discretization=d,
                   log_mass_truncation_bound=bound, dropped_mass=dropped)


def _largest_cap(cap: int, q: float, drop: float) -> int:
    """The largest unit cap below ``cap`` whose binomial window fits MAX_MIXTURE_ATOMS."""
    lo, hi = 1, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        a, b, _ = mog.binomial_window(mid, q, drop)
        if b - a + 1 <= MAX_MIXTURE_ATOMS:
            lo = mid
        else:
            hi = mid
    return lo
