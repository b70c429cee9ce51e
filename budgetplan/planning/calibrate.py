"""Calibration and inverse queries: the noise for a target, the most steps, the fewest rows.

Every answer is rounded to the safe side and re-accounted: the returned noise multiplier
gives epsilon <= target at the working discretisation, and (``verify=True``) again at half
that spacing, so it never overshoots when checked more finely.

How the PLD search stays fast (a PLD-tight sigma for 125,000 steps in a fraction of a
second, where dp_accounting's ``calibrate_dp_mechanism`` takes seconds):
1. a closed-form first guess from the CLT for Poisson-subsampled Gaussians, mu =
   q sqrt(T (e^{1/sigma^2} - 1)) (Bu, Dong, Long, Su 2020, arXiv:1911.11607);
2. a solve on a grid 16 times coarser (cheap, and pessimistic, so it lands just above the
   answer);
3. the coarse grid's bias measured at that answer by one accounting at the working grid, the
   answer carried along the coarse curve's slope to the shifted target (``_shifted_start``),
   and the working grid's solve started there with a first step one tolerance wide: one or two
   more accountings (the start meets the target, one tolerance below does not), two or three
   at the working grid in all;
4. the single-step distributions are cached by the engine, so the searches over steps
   reuse them and only the FFT power changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from budgetplan.accounting import fastpld, gaussian, rr
from budgetplan.accounting.account import DEFAULT_DISCRETIZATION, account
from budgetplan.accounting.guarantee import Guarantee
from budgetplan.accounting.limits import MAX_CALIBRATION_EPSILON, MAX_COMPOSITIONS, MAX_STEPS
from budgetplan.accounting.pld_build import pld_of
from budgetplan.errors import AccountingError, InfeasibleError, InvalidParameterError
from budgetplan.limits import SIGMA_RANGE
from budgetplan.mechanisms import GaussianRelease, PoissonDPSGD
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate

__all__ = [
    "solve_noise_multiplier",
    "Calibration",
    "steps_for_epochs",
    "rr_per_example_epsilon",
    "gaussian_noise_std",
    "dpsgd_noise_multiplier",
    "dpsgd_max_steps",
    "dpsgd_min_dataset_size",
]

REL_TOL = 1e-4
_COARSE_FACTOR = 16
# Both solves on the coarse grid go this close to its answer: a coarse accounting costs about a
# twentieth of one at the working grid, and a close start saves working-grid accountings.
_COARSE_REL_TOL = 2e-5
# PLD searches aim 2e-5 (relative) inside the target: float64 FFT noise moves a composed
# epsilon by up to ~5e-6 relative over 1e5 steps in any engine (dp_accounting's included),
# so an independent re-accounting must not land above the target by that noise.
_PLD_MARGIN = 2e-5
# Accountings one search may spend; each is bounded by the engine's limits, so this bounds
# the time. The secant search needs about a dozen; the rest is headroom for odd curves.
_MAX_EVALUATIONS = 60
# A secant step that moves the same end this many times in a row is followed by a bisection:
# Illinois halving alone still creeps when the curve has a kink near the root.
_STALL_RUN = 3
# A group-privacy search takes the floor (``_group_floor``) for the epsilon only this far above its
# aim: there the full accounting is hopeless and slow; nearer, the secant steers on the real value.
_FLOOR_FACTOR = 2.0
# Re-checks at the finer grid, each moving sigma up by REL_TOL (0.5% in all).
_MAX_VERIFY_STEPS = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """A calibrated value and the guarantee it was re-accounted to.

    Attributes:
        value: the calibrated parameter (noise multiplier, noise std, steps, rows, epsilon).
        guarantee: the guarantee of the mechanism with ``value``, at the working settings.
        verified_epsilon: epsilon re-accounted at half the discretisation (PLD), if checked.
        evaluations: how many accountings the search took.
    """

    value: float
    guarantee: Guarantee
    verified_epsilon: float | None = None
    evaluations: int = 0


def steps_for_epochs(*, epochs: float, dataset_size: int, batch_size: int) -> int:
    """Noisy steps in ``epochs`` passes at expected batch ``batch_size``: ceil(epochs N / B).

    Rounded up so the plan never accounts fewer steps than the epochs imply.

    Raises:
        InvalidParameterError: on a non-positive or non-finite input, or more than
            ``MAX_STEPS`` steps (naming the most epochs that fit).
    """
    epochs = validate.positive("epochs", epochs)
    dataset_size = validate.positive_int("dataset_size", dataset_size)
    batch_size = validate.positive_int("batch_size", batch_size)
    steps = epochs * dataset_size / batch_size
    if not steps <= MAX_STEPS:
        most = MAX_STEPS * batch_size / dataset_size
        most = math.floor(most / 10 ** (math.floor(math.log10(most)) - 3)) * 10 ** (math.floor(math.log10(most)) - 3)
        raise InvalidParameterError(
            f"epochs={epochs:g} gives {steps:.3g} steps (limit {MAX_STEPS:.0e}); at most {most:.4g} epochs fit")
    return max(1, math.ceil(steps - 1e-9))


# ------------------------------------------------------------------ closed forms


def rr_per_example_epsilon(*, epsilon: float, cap: int, delta: float = 0.0) -> dict[str, float]:
    """Per-example RR budgets that make a unit of ``cap`` examples (epsilon, delta)-DP.

    Returns ``{"eps/K": epsilon / K, "tight": ...}``: the even pure split, and the largest
    per-example budget whose exact K-fold composition is (epsilon, delta)-DP (equal to the
    even split when delta = 0). A unit with K_i < K examples may use epsilon / K_i.
    """
    epsilon = validate.positive("epsilon", epsilon)
    cap = validate.positive_int("unit cap", cap)
    delta = validate.probability("delta", delta, allow_zero=True)
    return {"eps/K": epsilon / cap, "tight": rr.max_per_example_epsilon(epsilon, cap, delta)}


def gaussian_noise_std(*, epsilon: float, delta: float, sensitivity: float, cap: int = 1) -> Calibration:
    """The exact (analytic Gaussian) noise std for one release, at the unit's sensitivity."""
    epsilon = validate.positive("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    sensitivity = validate.positive("sensitivity", sensitivity)
    cap = validate.positive_int("unit cap", cap)
    sigma = gaussian.analytic_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity * cap)
    unit = PrivacyUnit.example() if cap == 1 else PrivacyUnit.capped(cap)
    g = account(GaussianRelease(noise_std=sigma, sensitivity=sensitivity), delta=delta,
                adjacency=Adjacency.REPLACE_ONE, unit=unit, method="exact")
    return Calibration(value=sigma, guarantee=g, evaluations=1)


# ------------------------------------------------------------------------ DP-SGD


def _clt_guess(*, epsilon: float, delta: float, sampling_rate: float, steps: int) -> float:
    """Noise multiplier at which the CLT (mu-GDP) approximation meets the target."""
    mu = 1.0 / gaussian.analytic_sigma(epsilon=epsilon, delta=delta)
    ratio = mu / (sampling_rate * math.sqrt(steps))
    if ratio > 1e150:
        return SIGMA_RANGE[0]
    return min(max(1.0 / math.sqrt(math.log1p(ratio * ratio)), SIGMA_RANGE[0]), SIGMA_RANGE[1])


def solve_decreasing(eps_of: Callable[[float], float], target: float, x0: float, *,
                      step: float, lo_limit: float, hi_limit: float,
                      rel_tol: float = REL_TOL) -> tuple[float, float, int]:
    """Smallest x (within rel_tol) with eps_of(x) <= target, for non-increasing eps_of.

    Works in (log x, log eps). Returns (x, eps_of(x), evaluations); x is always one that was
    evaluated and met the target. Raises InfeasibleError when none does below hi_limit.
    """
    evals = 0
    seen: dict[float, float] = {}  # eps_of by log x: the Illinois step rescales g, not what it returns

    def g(log_x: float) -> float:
        nonlocal evals
        evals += 1
        e = seen[log_x] = eps_of(math.exp(log_x))
        if e == 0:
            return -math.inf
        return math.log(e) - math.log(target) if math.isfinite(e) else math.inf

    lx = math.log(min(max(x0, lo_limit), hi_limit))
    gx = g(lx)
    if gx <= 0:
        hi, g_hi = lx, gx
        lo = lx - step
        while True:
            if lo < math.log(lo_limit) or evals >= _MAX_EVALUATIONS:
                return math.exp(hi), seen[hi], evals
            g_lo = g(lo)
            if g_lo > 0:
                break
            hi, g_hi, step = lo, g_lo, step * 2
            lo = hi - step
    else:
        lo, g_lo = lx, gx
        hi = lx + step
        while True:
            if hi > math.log(hi_limit) or evals >= _MAX_EVALUATIONS:
                raise InfeasibleError("no noise multiplier up to the search limit meets the target")
            g_hi = g(hi)
            if g_hi <= 0:
                break
            lo, g_lo, step = hi, g_hi, step * 2
            hi = lo + step
    side, run = 0, 0  # which end moved last, and how many times in a row
    while hi - lo > rel_tol and evals < _MAX_EVALUATIONS:  # hi always meets the target
        if run < _STALL_RUN and math.isfinite(g_lo) and math.isfinite(g_hi) and g_lo != g_hi:
            mid = hi - g_hi * (hi - lo) / (g_hi - g_lo)
            mid = min(max(mid, lo + 0.05 * (hi - lo)), hi - 0.05 * (hi - lo))
        else:  # one end has stalled (a curve far from linear, or a kink): halve the bracket
            mid, run = 0.5 * (lo + hi), 0
        g_mid = g(mid)
        moved = 1 if g_mid <= 0 else -1
        run = run + 1 if moved == side else 1
        if moved == 1:
            hi, g_hi = mid, g_mid
            if side == 1:
                g_lo *= 0.5  # Illinois: keep the stale end from stalling the secant
        else:
            lo, g_lo = mid, g_mid
            if side == -1:
                g_hi *= 0.5
        side = moved
    return math.exp(hi), seen[hi], evals


class _EpsilonCurve:
    """sigma -> the PLD epsilon of Poisson DP-SGD at one grid, remembering the sigmas it has accounted.

    The searches revisit points (the bias-corrected coarse solve starts where the first one
    ended); ``evaluations`` counts the accountings actually made.
    """

    def __init__(self, adjacency: Adjacency, unit: PrivacyUnit, sampling_rate: float, steps: int, delta: float,
                 discretization: float, *, keep: bool = True):
        self._shape = (adjacency, unit, sampling_rate, steps, delta, discretization)
        self._keep = keep  # whether the engine keeps the composed PLDs for the final re-accounting
        self._seen: dict[float, float] = {}
        self.evaluations = 0

    def __call__(self, sigma: float) -> float:
        if sigma in self._seen:
            return self._seen[sigma]
        self.evaluations += 1
        adjacency, unit, sampling_rate, steps, delta, discretization = self._shape
        mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=sampling_rate, steps=steps)
        eps = fastpld.epsilon_for_delta(
            pld_of(mech, adjacency=adjacency, unit=unit, discretization=discretization, delta=delta,
                   keep=self._keep), delta)
        self._seen[sigma] = eps
        return eps

    def slope_below(self, sigma: float) -> float | None:
        """d ln eps / d ln sigma between ``sigma`` and the nearest sigma accounted below it, if any."""
        below = [s for s in self._seen if s < sigma]
        if sigma not in self._seen or not below:
            return None
        near = max(below)
        e_hi, e_lo = self._seen[sigma], self._seen[near]
        if not (0 < e_hi < e_lo < math.inf):
            return None
        return (math.log(e_hi) - math.log(e_lo)) / (math.log(sigma) - math.log(near))


def _shifted_start(coarse: _EpsilonCurve, x0: float, e_coarse: float, target: float) -> float:
    """Where the fine solve starts: the coarse curve's sigma for ``target`` (its bias-shifted aim).

    The coarse solve left x0 and a point 2e-5 below it, so the curve's slope there is known: a
    shift of under 1e-3 is taken along it (the error is second order, some 1e-7), a larger one
    solved for on the coarse curve from there. Where the shift is under 0.8 tolerances, x0 itself
    (accounted at the fine grid already, and meeting the target) is within a tolerance of the
    fine answer: the fine solve starts there and its first step down should fail.
    """
    slope = coarse.slope_below(x0)
    shift = (math.log(target) - math.log(e_coarse)) / slope if slope is not None and slope < 0 else -math.inf
    if shift > -0.8 * REL_TOL:
        return x0
    if shift > -1e-3:
        return x0 * math.exp(shift)
    x1, _, _ = solve_decreasing(coarse, target, x0 * math.exp(max(shift, -0.25)), step=2e-3,
                                lo_limit=SIGMA_RANGE[0], hi_limit=SIGMA_RANGE[1], rel_tol=_COARSE_REL_TOL)
    return x1


def _group_floor(mech: PoissonDPSGD, delta: float, adjacency: Adjacency, unit: PrivacyUnit, method: str,
                 discretization: float) -> float:
    """K eps_e(delta / K): a floor under the group-privacy unit epsilon, in one example-level accounting.

    Group privacy reads the example-level curve at some delta_e <= delta / K, where eps_e(delta_e)
    >= eps_e(delta / K), and multiplies by K. Where the floor is above the target the full
    accounting (a search over delta_e, a dozen compositions where no delta_e is feasible, ~4 s
    each at q near 1e-8 and 1e8 steps) cannot meet it either. 0 where delta / K is below what
    the method reads.
    """
    try:
        example = account(mech, delta=delta / unit.cap, adjacency=adjacency, unit=PrivacyUnit.example(unit.name),
                          method=method, discretization=discretization)
    except InvalidParameterError:
        return 0.0
    return unit.cap * example.epsilon


def _verified_sigma(finer_eps: Callable[[float], float], sigma: float, epsilon: float,
                    slope: float | None) -> tuple[float, float, int]:
    """(sigma', its epsilon at the finer grid, accountings): the smallest sigma' >= sigma, within
    REL_TOL, whose finer-grid epsilon is <= ``epsilon``; sigma itself where it passes.

    Where the finer grid disagrees (at q near 1e-8 and 1e8 steps its rounding allowance sits
    above the working grid's), the search starts where the working curve's slope
    (d ln eps / d ln sigma, if known) says the finer one meets epsilon, and brackets from there
    in doubling steps: two or three accountings, not one per REL_TOL step. It stops, as the
    REL_TOL steps did, _MAX_VERIFY_STEPS tolerances above sigma.
    """
    verified = finer_eps(sigma)
    if verified <= epsilon:
        return sigma, verified, 1
    shift = REL_TOL
    if slope is not None and slope < 0 and math.isfinite(verified):
        shift = max(shift, (math.log(epsilon) - math.log(verified)) / slope)
    hi_limit = sigma * (1 + REL_TOL) ** _MAX_VERIFY_STEPS
    first = verified
    try:
        # the doubling steps may pass hi_limit before they bracket an answer below it: search twice as far
        found, verified, n = solve_decreasing(
            finer_eps, epsilon, min(sigma * math.exp(shift), hi_limit), step=REL_TOL * (1 - 1e-6),
            lo_limit=sigma * (1 + 0.5 * REL_TOL), hi_limit=sigma * (1 + REL_TOL) ** (2 * _MAX_VERIFY_STEPS))
    except InfeasibleError:
        found = math.inf
    if found > hi_limit:
        raise AccountingError(
            f"re-accounting at the finer discretization keeps exceeding epsilon={epsilon:g} up to "
            f"noise_multiplier={hi_limit:.6g} (first {first:.6g} at {sigma:.6g}); the grids disagree")
    return found, verified, n + 1


def dpsgd_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    adjacency: Adjacency | str = Adjacency.ADD_REMOVE,
    unit: PrivacyUnit | None = None,
    method: str = "pld",
    unit_accounting: str = "tight",
    discretization: float = DEFAULT_DISCRETIZATION,
    verify: bool = True,
) -> Calibration:
    """The smallest noise multiplier (within 0.01%) for which Poisson DP-SGD meets the target.

    Raises:
        InvalidParameterError: a bad input, or epsilon above MAX_CALIBRATION_EPSILON.
        InfeasibleError: when no noise multiplier up to 1e4 meets it.
    """
    epsilon = validate.positive("epsilon", epsilon)
    if epsilon > MAX_CALIBRATION_EPSILON:
        raise InvalidParameterError(
            f"epsilon must be at most {MAX_CALIBRATION_EPSILON:g} for noise calibration, got {epsilon:g}")
    delta = validate.open_unit("delta", delta)
    sampling_rate = validate.probability("sampling_rate", sampling_rate, allow_one=True)
    steps = validate.positive_int("steps", steps)
    discretization = validate.positive("discretization", discretization)
    adjacency = Adjacency.parse(adjacency)
    unit = PrivacyUnit.example() if unit is None else unit
    x0 = _clt_guess(epsilon=epsilon, delta=delta, sampling_rate=sampling_rate, steps=steps)
    fast = method == "pld" and (unit.cap == 1 or unit_accounting == "tight")
    aim = epsilon * (1 - _PLD_MARGIN) if method == "pld" else epsilon
    curves: tuple[_EpsilonCurve, ...] = ()
    eps_of: Callable[[float], float]
    if fast:
        coarse = _EpsilonCurve(adjacency, unit, sampling_rate, steps, delta, discretization * _COARSE_FACTOR,
                               keep=False)
        fine = _EpsilonCurve(adjacency, unit, sampling_rate, steps, delta, discretization)
        curves, eps_of = (coarse, fine), fine
        x0, e_coarse, _ = solve_decreasing(coarse, aim, x0, step=0.25, lo_limit=SIGMA_RANGE[0],
                                            hi_limit=SIGMA_RANGE[1], rel_tol=_COARSE_REL_TOL)
        # The coarse grid's epsilon sits a nearly constant bias above the fine one near the
        # answer: measure it once at x0, then solve the shifted target on the cheap curve.
        e_fine = eps_of(x0)
        if math.isfinite(e_fine) and math.isfinite(e_coarse) and 0 < e_fine < e_coarse:
            x0 = _shifted_start(coarse, x0, e_coarse, aim + (e_coarse - e_fine))
        # The fine solve's first step is one tolerance wide: the usual outcome is one or two
        # more fine accountings (x0 meets the target, x0 less one tolerance does not).
        step = REL_TOL * (1 - 1e-6)
    else:
        def accounted(sigma: float) -> float:
            mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=sampling_rate, steps=steps)
            if unit.cap > 1 and unit_accounting == "group":
                floor = _group_floor(mech, delta, adjacency, unit, method, discretization)
                if floor > _FLOOR_FACTOR * aim:
                    return floor  # fails the target: it only steers the search, never answers it
            return account(mech, delta=delta, adjacency=adjacency, unit=unit, method=method,
                           unit_accounting=unit_accounting, discretization=discretization).epsilon
        eps_of, step = accounted, 0.25
    try:
        sigma, _, n = solve_decreasing(eps_of, aim, x0, step=step, lo_limit=SIGMA_RANGE[0],
                                        hi_limit=SIGMA_RANGE[1])
    except InfeasibleError:
        raise InfeasibleError(
            f"no noise multiplier up to {SIGMA_RANGE[1]:g} gives epsilon <= {epsilon:g} at delta={delta:g}",
            knob="noise_multiplier",
        ) from None
    evals = sum(c.evaluations for c in curves) if fast else n
    verified = None
    if verify and method == "pld":
        finer = discretization / 2
        if fast:
            finer_eps: Callable[[float], float] = _EpsilonCurve(adjacency, unit, sampling_rate, steps, delta, finer)
        else:
            def finer_eps(s: float) -> float:
                m = PoissonDPSGD(noise_multiplier=s, sampling_rate=sampling_rate, steps=steps)
                return account(m, delta=delta, adjacency=adjacency, unit=unit, method=method,
                               unit_accounting=unit_accounting, discretization=finer).epsilon
        sigma, verified, n = _verified_sigma(finer_eps, sigma, epsilon, curves[-1].slope_below(sigma) if fast else None)
        evals += n
    mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=sampling_rate, steps=steps)
    g = account(mech, delta=delta, adjacency=adjacency, unit=unit, method=method,
                unit_accounting=unit_accounting, discretization=discretization)
    return Calibration(value=sigma, guarantee=g, verified_epsilon=verified, evaluations=evals + 1)


def _largest_true(ok: Callable[[int], bool], start: int, limit: int) -> int:
    """The largest n in [1, limit] with ok(n), for ok monotone (true then false); 0 if none."""
    if not ok(1):
        return 0
    lo, hi = 1, None
    n = max(2, start)
    while n <= limit:
        if ok(n):
            lo = n
            n *= 2
        else:
            hi = n
            break
    if hi is None:
        if lo == limit or ok(limit):
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def dpsgd_max_steps(
    *,
    noise_multiplier: float,
    sampling_rate: float,
    epsilon: float,
    delta: float,
    adjacency: Adjacency | str = Adjacency.ADD_REMOVE,
    unit: PrivacyUnit | None = None,
    method: str = "pld",
    unit_accounting: str = "tight",
    discretization: float = DEFAULT_DISCRETIZATION,
    limit: int = 10**8,
) -> Calibration:
    """The largest number of steps T for which Poisson DP-SGD stays within (epsilon, delta).

    Raises:
        InfeasibleError: when even one step exceeds the budget (names the noise multiplier
            that would allow one step).
    """
    noise_multiplier = validate.positive("noise_multiplier", noise_multiplier)
    sampling_rate = validate.probability("sampling_rate", sampling_rate, allow_one=True)
    epsilon = validate.positive("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    adjacency = Adjacency.parse(adjacency)
    unit = PrivacyUnit.example() if unit is None else unit
    evals = 0

    def guarantee(steps: int) -> Guarantee:
        nonlocal evals
        evals += 1
        mech = PoissonDPSGD(noise_multiplier=noise_multiplier, sampling_rate=sampling_rate, steps=steps)
        return account(mech, delta=delta, adjacency=adjacency, unit=unit, method=method,
                       unit_accounting=unit_accounting, discretization=discretization)

    guess = max(1, int(1.0 / sampling_rate))
    best = _largest_true(lambda t: guarantee(t).epsilon <= epsilon, guess, limit)
    if best == 0:
        one = dpsgd_noise_multiplier(epsilon=epsilon, delta=delta, sampling_rate=sampling_rate, steps=1,
                                     adjacency=adjacency, unit=unit, method=method,
                                     unit_accounting=unit_accounting, discretization=discretization,
                                     verify=False)
        raise InfeasibleError(
            f"even one step exceeds epsilon={epsilon:g} at noise_multiplier={noise_multiplier:g}; "
            f"one step needs noise_multiplier >= {one.value:.4g}",
            knob="noise_multiplier", suggestion=one.value,
        )
    return Calibration(value=best, guarantee=guarantee(best), evaluations=evals)


def dpsgd_min_dataset_size(
    *,
    noise_multiplier: float,
    batch_size: int,
    epochs: float,
    epsilon: float,
    delta: float,
    adjacency: Adjacency | str = Adjacency.ADD_REMOVE,
    unit: PrivacyUnit | None = None,
    method: str = "pld",
    unit_accounting: str = "tight",
    discretization: float = DEFAULT_DISCRETIZATION,
    limit: int = 10**12,
) -> Calibration:
    """The smallest dataset size N for which ``epochs`` at expected batch ``batch_size`` fit.

    More rows at a fixed batch size means a smaller sampling rate q = B/N and more steps
    T = ceil(epochs N / B); at fixed epochs the epsilon falls as N grows.
    """
    noise_multiplier = validate.positive("noise_multiplier", noise_multiplier)
    batch_size = validate.positive_int("batch_size", batch_size)
    epochs = validate.positive("epochs", epochs)
    epsilon = validate.positive("epsilon", epsilon)
    delta = validate.open_unit("delta", delta)
    adjacency = Adjacency.parse(adjacency)
    unit = PrivacyUnit.example() if unit is None else unit
    evals = 0
    if method == "pld":  # more rows mean more steps: stop where the PLD engine's step limit is
        limit = min(limit, int(MAX_COMPOSITIONS * batch_size / epochs))

    def guarantee(n: int) -> Guarantee:
        nonlocal evals
        evals += 1
        mech = PoissonDPSGD(noise_multiplier=noise_multiplier, sampling_rate=batch_size / n,
                            steps=steps_for_epochs(epochs=epochs, dataset_size=n, batch_size=batch_size))
        return account(mech, delta=delta, adjacency=adjacency, unit=unit, method=method,
                       unit_accounting=unit_accounting, discretization=discretization)

    def fits(n: int) -> bool:
        return guarantee(n).epsilon <= epsilon

    lo, hi = batch_size, batch_size
    if fits(lo):
        return Calibration(value=lo, guarantee=guarantee(lo), evaluations=evals)
    while not fits(hi):
        lo = hi
        if hi >= limit:
            raise InfeasibleError(
                f"no dataset size up to {limit:.3g} rows fits epsilon={epsilon:g} with these settings"
                + (" (more rows would exceed the PLD engine's step limit; try method 'rdp')"
                   if method == "pld" and limit < 10**12 else ""),
                knob="dataset_size",
            )
        hi = min(hi * 4, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return Calibration(value=hi, guarantee=guarantee(hi), evaluations=evals)


def solve_noise_multiplier(eps_of: Callable[[float], float], *, epsilon: float, guess: float = 1.0,
                           step: float = 0.25) -> float:
    """The smallest sigma whose ``eps_of(sigma)`` meets ``epsilon`` (eps_of non-increasing)."""
    try:
        sigma, _, _ = solve_decreasing(eps_of, epsilon, guess, step=step, lo_limit=SIGMA_RANGE[0],
                                        hi_limit=SIGMA_RANGE[1])
    except InfeasibleError:
        raise InfeasibleError(f"no noise up to {SIGMA_RANGE[1]:g} meets epsilon {epsilon:g}",
                              knob="epsilon") from None
    return sigma
