"""Choosing the exponential tilt and the window of a tilted PLD composition.

Everything here reads the cumulant generating function C(theta) = sum_i T_i ln sum_j
p_ij e^{theta L_j} of the pmfs being composed (``_moments``, exact up to rounding):

* the tilt (``choose_tilt``): the smallest lambda for which the FFT rounding allowance at
  the epsilon read stays near _ALLOWANCE_TARGET x delta, from a Chernoff / saddle-point
  estimate (see ``pld_ops`` for why tilt at all);
* the window (``chernoff_window``): the losses outside which the tilted law holds a given tail, by
  Chernoff's inequality at near-optimal orders, plus Chernoff bounds on the untilted mass
  outside it, which the composition moves pessimistically.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from budgetplan.accounting.pld_types import PLDPmf

__all__ = ["Term", "Terms", "tilted_mean", "tilt_with_mean", "choose_tilt", "chernoff_window"]

# The tilt is chosen for a rounding allowance of about this share of delta at the epsilon read.
_ALLOWANCE_TARGET = 1e-5
# A tilt this many grid steps' worth of loss per unit (lambda * d) puts all but e^-60 of each
# tilted single step on its top loss; larger tilts change nothing.
_MAX_TILT_STEPS = 60.0


@dataclass(frozen=True, slots=True)
class Term:
    """One pmf to be composed ``count`` times: log masses, losses, squared losses, scratch."""

    pmf: PLDPmf
    count: int
    log_p: np.ndarray
    losses: np.ndarray
    squares: np.ndarray
    scratch: np.ndarray

    @classmethod
    def of(cls, pmf: PLDPmf, count: int) -> Term:
        losses = pmf.losses
        with np.errstate(divide="ignore"):
            return cls(pmf, count, np.log(pmf.probs), losses, np.square(losses), np.empty_like(losses))


class Terms(tuple[Term, ...]):
    """The terms of one composition, with a memo of their cumulants by order.

    The tilt and window solvers revisit orders (a bracket's end is the next solve's start).
    """

    memo: dict[float, tuple[float, float, float | None]]

    def __new__(cls, items: Iterable[Term]) -> Terms:
        obj = super().__new__(cls, items)
        obj.memo = {}
        return obj


# ----------------------------------------------------------------- cumulants and tilt


def _moments(terms: Sequence[Term], theta: float, variance: bool = True) -> tuple[float, float, float]:
    """C(theta), C'(theta), C''(theta) of the composition, C = sum count * ln MGF.

    Evaluated dozens of times per composition, so in place in a scratch array. Weights
    are clipped at e^-600 of the largest: subnormals slow every later operation ~20x, and
    the clip only raises C, which keeps every bound taken from it valid. The raw second
    moment loses a few digits of the variance to cancellation, which only steers solvers.
    einsum, not a BLAS product: under load BLAS spends milliseconds waking its threads.
    ``variance=False`` skips C'' (a pass over the squared losses; the Chernoff searches never
    read it) and returns NaN in its place; C and C' are the same either way.
    """
    memo: dict[float, tuple[float, float, float | None]] | None = getattr(terms, "memo", None)
    hit = memo.get(theta) if memo is not None else None
    if hit is not None and (hit[2] is not None or not variance):
        return hit[0], hit[1], math.nan if hit[2] is None else hit[2]
    c = c1 = c2 = 0.0
    for t in terms:
        w = np.multiply(t.losses, theta, out=t.scratch)
        w += t.log_p
        top = float(w.max())
        w -= top
        np.maximum(w, -600.0, out=w)
        np.exp(w, out=w)
        s = float(w.sum())
        mean = float(np.einsum("i,i->", w, t.losses)) / s
        c += t.count * (top + math.log(s))
        c1 += t.count * mean
        if variance:
            c2 += t.count * max(0.0, float(np.einsum("i,i->", w, t.squares)) / s - mean * mean)
    if memo is not None:
        memo[theta] = (c, c1, c2 if variance else None)
    return c, c1, c2 if variance else math.nan


def _bracket_root(f: Callable[[float], float], x0: float, cap: float, rel: float) -> tuple[float, float]:
    """(near, far) with f(near) < 0 <= f(far), far - near <= rel * far, f increasing on (0, cap].

    Regula falsi (Illinois, falling back to bisection when the secant stalls at an end)
    on ln x after doubling or halving out from x0: a handful of evaluations whether f is
    near-linear in ln x or steep.
    ``far`` is cap if f stays negative there; ``near`` is 0 if f never is.
    """
    x = min(max(x0, cap * 1e-12), cap)
    fx = f(x)
    if fx < 0:
        near, f_near = x, fx
        while True:
            if near >= cap:
                return cap, cap
            far = min(cap, near * 2.0)
            f_far = f(far)
            if f_far >= 0:
                break
            near, f_near = far, f_far
    else:
        far, f_far = x, fx
        while True:
            near = far / 2.0
            if near < cap * 1e-12:
                return 0.0, far
            f_near = f(near)
            if f_near < 0:
                break
            far, f_far = near, f_near
    side = 0
    for _ in range(60):
        if far - near <= rel * far:
            break
        a, b = math.log(near), math.log(far)
        t = (b * f_near - a * f_far) / (f_near - f_far) if f_far != f_near else 0.5 * (a + b)
        if not a + 0.1 * (b - a) < t < b - 0.1 * (b - a):  # a stalling secant: bisect instead
            t = 0.5 * (a + b)
        mid = math.exp(t)
        f_mid = f(mid)
        if f_mid < 0:
            near, f_near = mid, f_mid
            if side == -1:
                f_far *= 0.5
            side = -1
        else:
            far, f_far = mid, f_mid
            if side == 1:
                f_near *= 0.5
            side = 1
    return near, far


def _legendre(terms: Sequence[Term], theta0: float, c0: float, var: float, target: float, side: int,
              tried: Callable[[float, float], None] | None = None) -> float:
    """A theta on ``side`` of theta0 (+1 above, -1 below) with I(theta) >= target.

    I(theta) = (theta - theta0) C'(theta) - C(theta) + C(theta0) is the Chernoff exponent
    of the law tilted by theta0 at the loss C'(theta): P(L >= C'(theta)) (or <=, below)
    is at most exp(-I). I grows with x = |theta - theta0| (C is convex), like x^2 for a
    Gaussian and faster for heavy tails. Any theta gives a valid bound (callers evaluate
    the one they use); the far side of a 15% bracket is returned. ``tried``, if given, is
    called with (theta, C(theta)) at every order evaluated.
    """
    if not var > 0:
        return theta0
    log_target = math.log(target)

    def f(x: float) -> float:  # ln I - ln target: about linear in ln x, even for heavy tails
        theta = theta0 + side * x
        c, c1, _ = _moments(terms, theta, variance=False)
        if tried is not None:
            tried(theta, c)
        rate = side * x * c1 - c + c0
        return math.log(rate) - log_target if rate > 0 else -math.inf

    cap = _MAX_TILT_STEPS / terms[0].pmf.discretization
    _, far = _bracket_root(f, math.sqrt(2.0 * target / var), cap, 0.3)
    return theta0 + side * far


def tilted_mean(terms: Sequence[Term], lam: float) -> float:
    """C'(lam): the mean loss of the composition tilted by ``lam`` (increasing in lam)."""
    return _moments(terms, lam, variance=False)[1]


def tilt_with_mean(terms: Sequence[Term], mean: float) -> float:
    """A lambda >= 0 whose tilted composition has mean at least ``mean`` (C'(lambda) >= mean)."""
    _, c1, c2 = _moments(terms, 0.0)
    if c1 >= mean or not c2 > 0:
        return 0.0
    cap = _MAX_TILT_STEPS / terms[0].pmf.discretization
    return _bracket_root(lambda lam: _moments(terms, lam, variance=False)[1] - mean, (mean - c1) / c2, cap,
                        0.02)[1]


def choose_tilt(terms: Sequence[Term], delta: float, gamma: float) -> float:
    """A tilt that leaves the rounding allowance near _ALLOWANCE_TARGET x delta, not far below.

    ``gamma`` is the FFT's componentwise error bound at the expected length. The allowance
    at eps is about (sum T) gamma e^G / (sd lambda (lambda + 1) sqrt(2 pi))
    with G = C(lambda) - lambda eps - ln delta (the FFT error relative to the tilted
    peak, untilted and summed over the losses above eps; sd is the tilted law's). G is
    about 0 at the Chernoff saddle point and grows as lambda falls. The smallest lambda
    meeting the target is taken, because a smaller tilt keeps the tilted law compact (for
    the remove direction of subsampled Gaussians the saddle point's tilted law is several
    times wider), with eps estimated by the central limit theorem (privacy losses are
    right-skewed, so this errs towards a larger tilt). ``_compose_direction`` checks the
    allowance afterwards and re-tilts if the estimate was off.
    """
    c0, m0, v0 = _moments(terms, 0.0)
    if not v0 > 0:
        return 0.0
    log_delta = math.log(delta)
    e_hat = m0 + math.sqrt(v0) * float(-special.ndtri(delta))
    log_target = math.log(_ALLOWANCE_TARGET / (sum(t.count for t in terms) * gamma))
    if c0 - log_delta <= log_target:  # no tilt needed at this delta
        return 0.0

    def f(lam: float) -> float:  # > 0 once the predicted allowance meets the target
        c, c1, c2 = _moments(terms, lam)
        if c1 >= e_hat:
            return 1.0
        shape = math.log(math.sqrt(2 * math.pi * c2) * lam * (lam + 1))
        return log_target - (c - lam * e_hat - log_delta - shape)

    # Gaussian guess: G = (e_hat - m0)^2 / (2 v0) - v0 (lambda_e - lambda)^2 / 2 ... solved for G = target.
    lam_e = (e_hat - m0) / v0
    guess = max(lam_e - math.sqrt(max(0.0, 2.0 * (log_target + log_delta) / v0 + lam_e * lam_e)), lam_e / 8)
    cap = _MAX_TILT_STEPS / terms[0].pmf.discretization
    near, far = _bracket_root(f, min(guess, cap), cap, 0.3)
    if near > 0 and _moments(terms, far, variance=False)[1] > e_hat:
        # Past the saddle point: a heavy upper tail (the remove direction of a subsampled
        # Gaussian) can carry the tilted law's mass far above e_hat within a few percent of
        # lambda, leaving the masses near the epsilon read in the FFT's noise. Stay at or
        # below the saddle point (the mean is increasing in lambda).
        return _bracket_root(lambda lam: _moments(terms, lam, variance=False)[1] - e_hat, near, far, 0.02)[0]
    return far


# -------------------------------------------------------------------------- window


def _chernoff_end(terms: Sequence[Term], lam: float, c0: float, var: float, tail: float,
                  side: int) -> tuple[float, float, float]:
    """(loss, theta, C(theta)): the best Chernoff end of the law tilted by lam at the orders tried.

    For an order t > 0 the tilted mass above u(t) = (C(lam + t) - C(lam) - ln tail) / t is
    at most tail, and below l(t) = (C(lam) - C(lam - t) + ln tail) / t likewise. These
    ends are flat near the optimal order but C'(theta) is not (heavy tails), so the best
    end over every order the search tries is kept, not the tilted mean at the last one.
    """
    best = [math.inf, lam, c0]

    def tried(theta: float, c: float) -> None:
        end = side * (c - c0 - math.log(tail)) / abs(theta - lam)
        if side * end < side * best[0] or best[0] == math.inf:
            best[:] = [end, theta, c]

    _legendre(terms, lam, c0, var, math.log(1 / tail), side, tried)
    if best[0] == math.inf:
        return side * math.inf, lam, c0
    return best[0], best[1], best[2]


def chernoff_window(terms: Sequence[Term], lam: float, tail_up: float, tail_down: float,
            infinity_budget: float = 1.0) -> tuple[int, int, float, float]:
    """Loss window [low, high] of the tilted composition and the untilted mass outside it.

    Chernoff on the law tilted by lam, at near-optimal orders (``_chernoff_end``): the tilted
    mass above ``high`` is at most tail_up, below ``low`` at most tail_down. The untilted
    mass strictly above ``high`` is bounded at the same order (theta >= 0); strictly below
    ``low`` likewise when lam = 0, and by 1 otherwise (the caller moves it up onto ``low``).

    If the untilted mass above ``high`` would exceed ``infinity_budget`` (where the tilted
    law is cut off by the top of the support, say), ``high`` is raised until it does not.

    Returns:
        (low, high, mass_above, mass_below): grid indices of the composed pmf relative to
        sum(count * lower_index), and the two untilted bounds.
    """
    d = terms[0].pmf.discretization
    n_max = sum(t.count * (t.pmf.probs.size - 1) for t in terms)
    base = sum(t.count * t.pmf.lower_index for t in terms)
    c0, _, var = _moments(terms, lam)
    if not var > 0:  # a single point: nothing to cut
        return 0, n_max, 0.0, 0.0
    high_loss, up, c_up = _chernoff_end(terms, lam, c0, var, tail_up, +1)
    low_loss, down, c_down = _chernoff_end(terms, lam, c0, var, tail_down, -1)
    high = min(n_max, max(0, math.ceil(high_loss / d) - base)) if math.isfinite(high_loss) else n_max
    low = max(0, min(high, math.floor(low_loss / d) - base)) if math.isfinite(low_loss) else 0
    mass_above = mass_below = 0.0
    with np.errstate(over="ignore"):
        if high < n_max:
            mass_above = math.exp(min(0.0, c_up - up * (base + high + 1) * d))
        if mass_above > infinity_budget:
            c_0, _, var_0 = _moments(terms, 0.0)
            loss, up, c_up = _chernoff_end(terms, 0.0, c_0, var_0, infinity_budget, +1)
            high = max(high, min(n_max, math.ceil(loss / d) - base)) if math.isfinite(loss) else n_max
            mass_above = math.exp(min(0.0, c_up - up * (base + high + 1) * d)) if high < n_max else 0.0
        if low > 0:
            mass_below = math.exp(min(0.0, c_down - down * (base + low - 1) * d)) if down <= 0 else 1.0
    return low, high, mass_above, mass_below
