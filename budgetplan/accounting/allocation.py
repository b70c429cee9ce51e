"""Random allocation ("balls in bins") by RDP: every example in exactly one of the T steps of each epoch.

Plans account allocation by its PLD (``allocation_pld``: 3-28% less noise for the same target
at the Criteo shapes); this RDP bound is the alternative (``method="rdp"``), fast and
independent of the PLD's grid, and the tests' cross-check of it. The bound follows Feldman
and Shenfeld's "direct" analysis of random allocation ("Privacy amplification by random
allocation", arXiv:2502.08202), in units of the clipping norm and under add-remove.
Within one epoch the adversary knows every other example's contribution, so with the example
the T noisy sums are P = (1/T) sum_t N(e_t, sigma^2 I) and without it Q = N(0, sigma^2 I).
Epochs draw their allocations independently, so their privacy losses add.

Remove direction (P against Q). The likelihood ratio is Z = (1/T) sum_t Y_t with
Y_t = exp((x_t - 1/2) / sigma^2) independent under Q and E[Y^m] = exp(m (m - 1) / (2 sigma^2)).
For an integer order a the multinomial expansion gives
E_Q[Z^a] = a! [u^a] (sum_m E[Y^m] u^m / m!)^T / T^a, which the paper writes as a sum over
the partitions of a. Here the T-th power of the moment series is taken by repeated
squaring in log space (every term is positive: nothing cancels), which gives the exact
Renyi divergence of each integer order; the epochs add.

Add direction (Q against P). Its Renyi divergence needs the negative moments
E_Q[Z^{-b}], b = a - 1, which have no finite sum. With ln Y ~ N(m, v), v = 1 / sigma^2,
m = -v / 2, and phi(u) = E[e^{-u Y}],
E_Q[Z^{-b}] = (1/Gamma(b)) int_0^inf s^{b-1} phi(s / T)^T ds (Z^{-b} = (1/Gamma(b)) int s^{b-1}
e^{-s Z} ds, Fubini, the Y_t independent). It is bounded above, every piece by an inequality:

1. phi <= phi_up. On grid nodes y_k = e^{m + sqrt(v) z_k} (z_k a grid in standard units),
   e^{-u y} is convex in y, so on each cell it lies below its chord; the lowest cell
   (0, y_0] takes the chord from (0, 1); above the top node e^{-u y} <= e^{-u y_K}. Taking
   expectations, phi(u) <= phi_up(u) = w_floor + sum_k w_k e^{-u y_k}, whose weights are
   exact: cell probabilities and cell means E[Y 1{cell}] of the lognormal (normal CDF
   differences, e^{m + v/2} = 1). phi_up is a mixture of exponentials, so ln phi_up is convex.
2. Between nodes s_i < s_{i+1} of the outer grid, ln phi is convex (a cumulant generating
   function), so ln phi(s / T) lies below its chord, itself below the chord of ln phi_up.
   The exponent f(s) = (b - 1) ln s + T chord(s) is then concave with
   f'' = -(b - 1) / s^2 <= -(b - 1) / s_{i+1}^2 on the cell; Taylor's theorem at the cell's
   midpoint c gives f(s) <= f(c) + f'(c)(s - c) - (b - 1)(s - c)^2 / (2 s_{i+1}^2), integrated
   in closed form (a normal CDF difference; for b = 1 the linear bound alone).
3. [0, s_0]: phi <= 1, so that piece is at most s_0^b / b.
4. [S, inf): by Fubini the piece is E[h(Z)] with h(z) = z^{-b} Q(b, S z) (Q the regularised
   upper incomplete gamma), decreasing in z. Z >= G = (prod_t Y_t)^{1/T} (AM-GM), ln G ~
   N(m, v / T), so E[h(Z)] <= E[h(G)] <= E[G^{-b} 1{G < g}] + g^{-b} Q(b, S g) for any g: a
   normal CDF in closed form, and Gamma(b, x) <= x^b e^{-x} / (x - b + 1) for x > b - 1
   (tangent of the concave ln t at x). g and S are chosen to make this piece about e^{-60}
   of the total; it is added either way.

Every value is formed in log space (the moments span hundreds of orders of magnitude).
Dropping nodes of weight below e^-60 from 1 - phi_up, or merging the nodes of large y into
the lowest of them where e^{-u y} is negligible, only raises phi_up. Float rounding is
covered by explicit slack: phi_up's weights carry relative errors below about
5e-14 (1 + z^2) / (cell width in ln Y) (checked against 50-digit arithmetic), so 1 - phi_up
is shrunk, or ln phi_up raised where phi_up < 1/2, by 1e-8 plus 20 times that, and 1e-9 is
added to every log moment. The grid steps set only how tight the bound is (about
1e-4 of the add direction's epsilon at T = 1953); the trapezoid rule on the same integrals,
accurate but uncertified, is the tests' cross-check. Above the orders the grids reach
cheaply, and wherever it is smaller, the certified Jensen bound is used
(-ln Z <= (1 - 1/T) / (2 sigma^2) + the loss of a Gaussian of noise sigma sqrt(T); the paper's
"direct" add bound for one epoch, its shift added once per epoch), also kept as
``jensen_add_epsilon``: valid, but (1 - 1/T) / (2 sigma^2) per epoch is far more than the
amplified epsilon at sigma near 1.

Each direction is converted at the same delta and the larger epsilon reported: delta at
that epsilon is at most delta in both directions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import special

from budgetplan.accounting import gaussian
from budgetplan.util import validate

__all__ = ["ORDERS", "remove_rdp", "add_rdp", "epsilon", "remove_epsilon", "add_epsilon", "jensen_add_epsilon",
           "REFERENCE", "Z_STEP", "W_STEP", "PHI_SLACK"]

REFERENCE = "random allocation (Feldman and Shenfeld, arXiv:2502.08202)"
# Integer Renyi orders. The moment series is cut at the largest; a few milliseconds per sigma.
ORDERS = tuple(range(2, 257))
# Added to every log moment: covers the rounding of ~20 log-space products of ~2e3-sized logs,
# and of the add bound's log-space sums (terms of size ~1e3, absolute rounding ~1e-12).
_LOG_SLACK = 1e-9


def _log_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Log coefficients of the product of two power series given by log coefficients, cut at len(a)."""
    n = a.size
    k, j = np.ogrid[:n, :n]
    terms = np.where(j <= k, a[None, :] + b[np.clip(k - j, 0, n - 1)], -np.inf)
    out: np.ndarray = special.logsumexp(terms, axis=1)
    return out


@functools.lru_cache(maxsize=256)
def _log_moments(noise_multiplier: float, steps: int) -> np.ndarray:
    """ln E_Q[(sum_t Y_t)^a] for a = 0..max(ORDERS), exactly (up to float rounding)."""
    top = max(ORDERS)
    m = np.arange(top + 1, dtype=float)
    base = m * (m - 1) / (2 * noise_multiplier**2) - special.gammaln(m + 1)  # ln(E[Y^m] / m!)
    out: np.ndarray = np.full(top + 1, -np.inf)
    out[0] = 0.0
    power, e = base, steps
    while e:
        if e & 1:
            out = _log_product(out, power)
        e >>= 1
        if e:
            power = _log_product(power, power)
    out = out + special.gammaln(m + 1)
    out.setflags(write=False)
    return out


def remove_rdp(*, noise_multiplier: float, steps_per_epoch: int, epochs: int = 1) -> np.ndarray:
    """The Renyi divergences D_a(P || Q) at ``ORDERS``, composed over ``epochs`` (an upper bound by 1e-9)."""
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = validate.positive_int("epochs", epochs)
    orders = np.asarray(ORDERS, dtype=float)
    logs = _log_moments(sigma, t)[np.asarray(ORDERS)]
    rdp: np.ndarray = e * (logs - orders * math.log(t) + _LOG_SLACK) / (orders - 1)
    return rdp


def remove_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """Epsilon of the remove direction at ``delta``, from the exact RDP (conversion of arXiv:2004.00010)."""
    # heavy: dp_accounting (~1 s), for the RDP conversion only
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    delta = validate.open_unit("delta", delta)
    values = remove_rdp(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs)
    eps, _ = rdp.compute_epsilon(list(ORDERS), [float(v) for v in values], delta)
    return float(eps)


# The add direction's bound (module note): steps in z = (ln Y - m) / sqrt(v) and in ln s, the
# outer grid's lower end, how far below the total each cut-off piece is aimed (ln), and the
# rounding slack on phi_up. The steps set only the tightness: halving both moves the bound by
# about 1e-4 of the add epsilon at T = 1953, and never up.
Z_STEP, W_STEP, _W_LOW, _Z_HIGH = 0.025, 0.02, -30.0, 12.0
_NEGLIGIBLE = 60.0
# phi_up's rounding slack (relative): its log weights err by at most ~5e-14 (1 + z^2) / dz_x, dz_x the
# cell width in ln Y (the chord split divides ln-CDF differences of size z^2 / 2 by it; checked
# against 50-digit arithmetic for sigma 0.1 to 1000), covered 20 times over, and 1e-8 beside it.
PHI_SLACK, _WEIGHT_ROUNDING = 1e-8, 1e-12


def _bounded_orders(noise_multiplier: float, steps: int) -> int:
    """The largest order whose negative moment is bounded on the grids: its integrand reaches about
    b sqrt(v) / T standard deviations below ln Y's centre, so the grids widen with b / (T sigma)."""
    return int(min(max(ORDERS), max(2, 20 * steps * noise_multiplier)))


def _log_ndtr_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ln(Phi(b) - Phi(a)) for a < b, computed in the tail where no digits cancel."""
    flip = a > 0
    high = special.log_ndtr(np.where(flip, -a, b))
    low = special.log_ndtr(np.where(flip, -b, a))
    out: np.ndarray = high + _log1mexp(low - high)
    return out


def _log1mexp(d: np.ndarray) -> np.ndarray:
    """ln(1 - e^d) for d <= 0."""
    with np.errstate(divide="ignore"):
        out: np.ndarray = np.where(d > -math.log(2), np.log(-np.expm1(d)), np.log1p(-np.exp(d)))
        return out


def _phi_nodes(v: float, z_low: float, z_step: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The nodes y_k of phi_up, their log weights, the log weight of the node y = 0 (module note, 1) and
    the relative slack that covers the weights' rounding."""
    root = math.sqrt(v)
    z = z_low + z_step * np.arange(int(round((_Z_HIGH - z_low) / z_step)) + 1)
    x = -v / 2 + root * z
    dx = root * z_step
    log_p = _log_ndtr_diff(z[:-1], z[1:])
    # ln(E[Y | cell] / y_left) in [0, dx]; the chord puts t = expm1(r) / expm1(dx) of the cell on its right node
    r = np.clip(_log_ndtr_diff(z[:-1] - root, z[1:] - root) - log_p - x[:-1], 0.0, dx)
    log_w = np.full(z.size, -np.inf)
    log_w[:-1] = log_p + np.log(np.expm1(-(dx - r)) / np.expm1(-dx))
    log_w[1:] = np.logaddexp(log_w[1:], log_p + np.log(np.expm1(r) / np.expm1(dx)))
    low_p, low_m = special.log_ndtr(z[0]), special.log_ndtr(z[0] - root)
    log_w[0] = np.logaddexp(log_w[0], low_m - x[0])
    log_w[-1] = np.logaddexp(log_w[-1], special.log_ndtr(-z[-1]))
    slack = PHI_SLACK + _WEIGHT_ROUNDING * (1 + max(-z_low, _Z_HIGH) ** 2) / dx
    return np.exp(x), log_w, float(low_p + _log1mexp(np.array(min(low_m - low_p - x[0], 0.0)))), slack


def _log_phi_upper(u: np.ndarray, y: np.ndarray, log_w: np.ndarray, log_floor: float, slack: float) -> np.ndarray:
    """ln phi_up(u) for ascending u, rounding slack included, in two regimes that only drop or merge mass
    towards smaller y (so they stay upper bounds). While phi_up >= 1/2 it is 1 - gap with the gap summed
    without cancellation over the nodes of weight above e^-60 (the rest only shrink the gap). Beyond, in
    log space, the nodes where e^{-u y} is below e^-700 of the largest term at the chunk's smallest u
    are merged into one node at the first of them (e^{-u y} is decreasing in y)."""
    out = np.empty(u.size)
    heavy = log_w > -_NEGLIGIBLE
    weights, y_heavy = np.exp(log_w[heavy]), y[heavy]
    near = True
    for start in range(0, u.size, 256):
        chunk_u = u[start:start + 256]
        chunk = np.full(chunk_u.size, np.nan)
        if near:
            gap = (-np.expm1(-chunk_u[:, None] * y_heavy[None, :]) @ weights) * (1 - slack)
            near = bool(gap[-1] < 0.5)
            chunk = np.where(gap < 0.5, np.log1p(-np.minimum(gap, 0.5)), np.nan)
        far = np.isnan(chunk)
        if far.any():
            u_far = chunk_u[far]
            top = u_far[0] * y
            cut = int(np.searchsorted(top, 700.0 - np.max(log_w - top))) + 1
            cut = min(cut, y.size)
            nodes, node_w = y[:cut], log_w[:cut].copy()
            node_w[-1] = special.logsumexp(log_w[cut - 1:])
            terms = np.concatenate([node_w[None, :] - u_far[:, None] * nodes[None, :],
                                    np.full((u_far.size, 1), log_floor)], axis=1)
            chunk[far] = special.logsumexp(terms, axis=1) + slack
        out[start:start + 256] = chunk
    return out


def _z_low(v: float, u_max: float, steps: int, top: int, log_s_max: float) -> float:
    """The grid's lowest z: below it phi_up's floor weight is negligible against phi(u_max) and the body."""
    z = np.arange(-2000.0, 0.5, 0.5)
    with np.errstate(over="ignore"):
        minus_log_phi = np.min(u_max * np.exp(-v / 2 + math.sqrt(v) * z) - special.log_ndtr(z))  # >= -ln phi(u_max)
    b = np.arange(1, top + 1)
    floor = (np.max(b * log_s_max - special.gammaln(b + 1.0)) + _NEGLIGIBLE) / steps
    return math.floor(-math.sqrt(2 * max(minus_log_phi + _NEGLIGIBLE / 2 + math.log(steps), floor, 72.0)))


@functools.lru_cache(maxsize=256)
def _log_negative_moments(noise_multiplier: float, steps: int, z_step: float = Z_STEP,
                          w_step: float = W_STEP) -> np.ndarray:
    """Certified upper bounds on ln E_Q[Z^{-b}] for b = 1..top - 1 (top from ``_bounded_orders``; module note)."""
    v = 1.0 / noise_multiplier**2
    m, var_g = -v / 2, v / steps
    b = np.arange(1, _bounded_orders(noise_multiplier, steps), dtype=float)
    log_gamma = special.gammaln(b)
    # 4: g per order about sqrt(2 (ln E[G^{-b}] + 60)) standard deviations below G's tilted centre, S from g
    jensen = -b * m + b * b * var_g / 2
    k = np.sqrt(2 * (jensen + _NEGLIGIBLE))
    log_g = m - b * var_g - k * math.sqrt(var_g)
    x = b + 1.0
    for _ in range(60):  # x - (b - 1) ln x - ln(x / (x - b + 1)) >= -b ln g - ln Gamma(b) + 60
        x = np.maximum(b + 1, _NEGLIGIBLE - b * log_g - log_gamma + (b - 1) * np.log(x) + np.log(x / (x - b + 1)))
    w = _W_LOW + w_step * np.arange(math.ceil((np.max(np.log(x) - log_g) - _W_LOW) / w_step) + 1)
    s = np.exp(w)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        tail = _log_tail(b, v, steps, log_g, w[-1])
        # 1 and 2: phi_up on the outer nodes, chords between them, a concave exponent bounded on each cell
        nodes = _phi_nodes(v, _z_low(v, s[-1] / steps, steps, b.size, w[-1]), z_step)
        log_phi = _log_phi_upper(s / steps, *nodes)
        width, mid = np.diff(s), (s[:-1] + s[1:]) / 2
        bb = b[:, None]
        slope = (bb - 1) / mid + steps * np.diff(log_phi) / width
        linear = np.log(width) + _log_sinhc(slope * width / 2)
        tau = s[1:] / np.sqrt(np.maximum(bb - 1, 1e-300))
        centre = slope * tau * tau
        quadratic = (slope * centre / 2 + np.log(tau) + 0.5 * math.log(2 * math.pi)
                     + _log_ndtr_diff((-width / 2 - centre) / tau, (width / 2 - centre) / tau))
        cell = np.where(bb > 1, np.fmin(linear, quadratic), linear)
        body = special.logsumexp((bb - 1) * np.log(mid) + steps * (log_phi[:-1] + log_phi[1:]) / 2 + cell, axis=1)
    head = b * _W_LOW - np.log(b)  # 3
    out: np.ndarray = special.logsumexp(np.stack([body - log_gamma, head - log_gamma, tail]), axis=0) + _LOG_SLACK
    out.setflags(write=False)
    return out


def _log_tail(b: np.ndarray, v: float, steps: int, log_g: np.ndarray, log_s: float) -> np.ndarray:
    """ln of a bound on (1/Gamma(b)) int_S^inf s^{b-1} phi(s / T)^T ds, S = e^log_s, for any g = e^log_g
    with S g > b - 1 (module note, 4): E[G^{-b} 1{G < g}] + g^{-b} Q(b, S g)."""
    m, var_g = -v / 2, v / steps
    below = -b * m + b * b * var_g / 2 + special.log_ndtr((log_g - m + b * var_g) / math.sqrt(var_g))
    x = np.exp(log_s + log_g)
    out: np.ndarray = np.logaddexp(below, -b * log_g + b * np.log(x) - x - np.log(x - b + 1) - special.gammaln(b))
    return out


def _log_sinhc(x: np.ndarray) -> np.ndarray:
    """ln(sinh(x) / x), rounded up (x^2 / 6 bounds it above where |x| is tiny)."""
    ax = np.abs(x)
    with np.errstate(divide="ignore"):
        big = ax + np.log1p(-np.exp(-2 * ax)) - math.log(2) - np.log(np.maximum(ax, 1e-300))
    out: np.ndarray = np.where(ax < 1e-4, ax * ax / 6, big)
    return out


def add_rdp(*, noise_multiplier: float, steps_per_epoch: int, epochs: int = 1) -> np.ndarray:
    """The Renyi divergences D_a(Q || P) at ``ORDERS``, composed over ``epochs``.

    Certified: the bound of the module note up to the orders it is computed for; above them,
    and wherever it is smaller, the Jensen bound (1 - 1/T) / (2 sigma^2) + a / (2 T sigma^2).
    """
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = validate.positive_int("epochs", epochs)
    orders = np.asarray(ORDERS, dtype=float)
    jensen = (1 - 1 / t) / (2 * sigma**2) + orders / (2 * t * sigma**2)
    logs = _log_negative_moments(sigma, t)
    numeric = np.full(orders.size, np.inf)
    numeric[:logs.size] = logs / (orders[:logs.size] - 1)
    rdp: np.ndarray = e * np.minimum(numeric, jensen)
    return rdp


def add_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """Epsilon of the add direction at ``delta``, from its certified RDP (conversion of arXiv:2004.00010)."""
    # heavy: dp_accounting (~1 s), for the RDP conversion only
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    delta = validate.open_unit("delta", delta)
    values = add_rdp(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs)
    eps, _ = rdp.compute_epsilon(list(ORDERS), [float(v) for v in values], delta)
    return float(eps)


def jensen_add_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """A certified but loose add-direction epsilon: the shifted Gaussian of the module note."""
    sigma = validate.positive("noise_multiplier", noise_multiplier)
    t = validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = validate.positive_int("epochs", epochs)
    shift = e * (1 - 1 / t) / (2 * sigma**2)
    return shift + gaussian.analytic_epsilon(sigma=sigma * math.sqrt(t / e), delta=delta)


def epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """The allocation's epsilon at ``delta`` (add-remove, sensitivity 1): the worse direction, both certified."""
    return max(remove_epsilon(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
                              delta=delta),
               add_epsilon(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
                           delta=delta))
