"""Random allocation ("balls in bins"): every example in exactly one of the T steps of each epoch.

The bound follows Feldman and Shenfeld's "direct" analysis of random allocation ("Privacy
amplification by random allocation", arXiv:2502.08202), in units of the clipping
norm and under add-remove. Within one epoch the adversary knows every other example's
contribution, so with the example the T noisy sums are P = (1/T) sum_t N(e_t, sigma^2 I)
and without it Q = N(0, sigma^2 I). Epochs draw their allocations independently, so their
privacy losses add.

Remove direction (P against Q). The likelihood ratio is Z = (1/T) sum_t Y_t with
Y_t = exp((x_t - 1/2) / sigma^2) independent under Q and E[Y^m] = exp(m (m - 1) / (2 sigma^2)).
For an integer order a the multinomial expansion gives
E_Q[Z^a] = a! [u^a] (sum_m E[Y^m] u^m / m!)^T / T^a, which the paper writes as a sum over
the partitions of a. Here the T-th power of the moment series is taken by repeated
squaring in log space (every term is positive: nothing cancels), which gives the exact
Renyi divergence of each integer order; the epochs add.

Add direction (Q against P). Its Renyi divergence needs the negative moments
E_Q[Z^{1-a}], which have no finite sum. They are computed from
Z^{-b} = (1/Gamma(b)) int_0^inf s^{b-1} e^{-s Z} ds and the independence of the Y_t:
E_Q[Z^{-b}] = (1/Gamma(b)) int_0^inf s^{b-1} phi(s / T)^T ds with phi(u) = E[e^{-u Y}], both
integrals by the trapezoid rule on fine grids (in ln Y and in ln s, where the integrands
are smooth and decay on both sides), rounded up by a relative margin far above the
quadrature's error. This direction is a numerical integral, not a certified bound; the
tests check it against closed forms (T = 1) and Monte Carlo. The simpler certified bound
(Jensen: -ln Z <= (1 - 1/T) / (2 sigma^2) + the loss of a Gaussian of noise sigma sqrt(T);
the paper's "direct" add bound for one epoch, its shift added once per epoch) is kept as
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

from budgetplan import _validate
from budgetplan.accounting import gaussian

__all__ = ["ORDERS", "remove_rdp", "add_rdp", "epsilon", "remove_epsilon", "add_epsilon", "jensen_add_epsilon",
           "REFERENCE"]

REFERENCE = "random allocation (Feldman and Shenfeld, arXiv:2502.08202)"
# Integer Renyi orders. The moment series is cut at the largest; a few milliseconds per sigma.
ORDERS = tuple(range(2, 257))
# Added to every log moment: covers the rounding of ~20 log-space products of ~2e3-sized logs.
_LOG_SLACK = 1e-9


def _log_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Log coefficients of the product of two power series given by log coefficients, cut at len(a)."""
    n = a.size
    k, j = np.ogrid[:n, :n]
    terms = np.where(j <= k, a[None, :] + b[np.clip(k - j, 0, n - 1)], -np.inf)
    return special.logsumexp(terms, axis=1)


@functools.lru_cache(maxsize=256)
def _log_moments(noise_multiplier: float, steps: int) -> np.ndarray:
    """ln E_Q[(sum_t Y_t)^a] for a = 0..max(ORDERS), exactly (up to float rounding)."""
    top = max(ORDERS)
    m = np.arange(top + 1, dtype=float)
    base = m * (m - 1) / (2 * noise_multiplier**2) - special.gammaln(m + 1)  # ln(E[Y^m] / m!)
    out = np.full(top + 1, -np.inf)
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
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    t = _validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = _validate.positive_int("epochs", epochs)
    orders = np.asarray(ORDERS, dtype=float)
    logs = _log_moments(sigma, t)[np.asarray(ORDERS)]
    return e * (logs - orders * math.log(t) + _LOG_SLACK) / (orders - 1)


def remove_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """Epsilon of the remove direction at ``delta``, from the exact RDP (conversion of arXiv:2004.00010)."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    delta = _validate.open_unit("delta", delta)
    values = remove_rdp(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs)
    eps, _ = rdp.compute_epsilon(list(ORDERS), [float(v) for v in values], delta)
    return float(eps)


# The add direction's quadrature: steps in z = (ln Y - m) / sqrt(v) and in ln s, and the
# relative margin its value is rounded up by (the trapezoid rule's error on these smooth,
# doubly decaying integrands is below 1e-11 relative: steps 2.5 and 2 times smaller move no
# value by more; tested against the closed form at T = 1 and against halved steps).
_Z_STEP, _W_STEP, _Z_SPAN, _W_LOW = 0.05, 0.02, 12.0, -20.0
_ADD_MARGIN = 1e-6


def _quadrature_orders(noise_multiplier: float, steps: int) -> int:
    """The largest order whose negative moment the grids resolve: its integrand's peak lies within
    about b sqrt(v) / T standard deviations of ln Y's centre, so the z-grid spans 12 + 24 of them."""
    return int(min(max(ORDERS), max(2, 20 * steps * noise_multiplier)))


@functools.lru_cache(maxsize=256)
def _log_negative_moments(noise_multiplier: float, steps: int) -> np.ndarray:
    """ln E_Q[Z^{-b}] for b = 1..top - 1 (top from ``_quadrature_orders``), by quadrature (module note)."""
    v = 1.0 / noise_multiplier**2
    m = -v / 2
    top = _quadrature_orders(noise_multiplier, steps) - 1
    span = _Z_SPAN + 1.2 * (top + 1) * math.sqrt(v) / steps
    z = np.arange(-span, span + _Z_STEP / 2, _Z_STEP)
    log_weights = -z * z / 2
    log_weights -= special.logsumexp(log_weights)
    weights = np.exp(log_weights)
    y = np.exp(m + math.sqrt(v) * z)
    # the peak in ln s sits near ln T - m + b v / T for a heavy lower tail of Z, near ln b otherwise
    w_high = math.log(steps) - m + top * v / steps + 12.0 + 12.0 * math.sqrt(v) + math.log(top + 1)
    w = np.arange(_W_LOW, w_high, _W_STEP)
    log_phi = np.empty(w.size)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for start in range(0, w.size, 256):
            uy = (np.exp(w[start:start + 256]) / steps)[:, None] * y[None, :]
            gap = -np.expm1(-uy) @ weights  # 1 - phi(u), without cancellation while small
            far = special.logsumexp(log_weights[None, :] - uy, axis=1)  # ln phi(u) once phi is small
            log_phi[start:start + 256] = np.where(gap < 0.5, np.log1p(-np.minimum(gap, 0.5)), far)
    b = np.arange(1, top + 1, dtype=float)[:, None]
    trap = np.full(w.size, math.log(_W_STEP))
    trap[[0, -1]] -= math.log(2.0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        body = special.logsumexp(b * w[None, :] + steps * log_phi[None, :] + trap[None, :], axis=1)
    below = b[:, 0] * _W_LOW - np.log(b[:, 0])  # int_{-inf}^{w_low} e^{b w} dw, phi <= 1 there
    out = np.logaddexp(body, below) - special.gammaln(b[:, 0])
    out = out + np.abs(out) * _ADD_MARGIN + _LOG_SLACK
    out.setflags(write=False)
    return out


def add_rdp(*, noise_multiplier: float, steps_per_epoch: int, epochs: int = 1) -> np.ndarray:
    """The Renyi divergences D_a(Q || P) at ``ORDERS``, composed over ``epochs``.

    Numerical (module note) up to the orders the quadrature resolves; above them, and
    wherever it is smaller, the certified Jensen bound (1 - 1/T) / (2 sigma^2) + a / (2 T sigma^2).
    """
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    t = _validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = _validate.positive_int("epochs", epochs)
    orders = np.asarray(ORDERS, dtype=float)
    jensen = (1 - 1 / t) / (2 * sigma**2) + orders / (2 * t * sigma**2)
    logs = _log_negative_moments(sigma, t)
    numeric = np.full(orders.size, np.inf)
    numeric[:logs.size] = logs / (orders[:logs.size] - 1)
    return e * np.minimum(numeric, jensen)


def add_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """Epsilon of the add direction at ``delta``, from its numerically integrated RDP."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    delta = _validate.open_unit("delta", delta)
    values = add_rdp(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs)
    eps, _ = rdp.compute_epsilon(list(ORDERS), [float(v) for v in values], delta)
    return float(eps)


def jensen_add_epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """A certified but loose add-direction epsilon: the shifted Gaussian of the module note."""
    sigma = _validate.positive("noise_multiplier", noise_multiplier)
    t = _validate.positive_int("steps_per_epoch", steps_per_epoch)
    e = _validate.positive_int("epochs", epochs)
    shift = e * (1 - 1 / t) / (2 * sigma**2)
    return shift + gaussian.analytic_epsilon(sigma=sigma * math.sqrt(t / e), delta=delta)


def epsilon(*, noise_multiplier: float, steps_per_epoch: int, epochs: int, delta: float) -> float:
    """The allocation's epsilon at ``delta`` (add-remove, sensitivity 1): the worse direction."""
    return max(remove_epsilon(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
                              delta=delta),
               add_epsilon(noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
                           delta=delta))
