"""WALR on ads data: categoricals one-hot, numerics scaled into [0, 1], one sparse release, regularised descent.

Under label DP every feature is public, so the rows may be encoded from the features freely:

- each categorical column contributes one coordinate set to its column's weight a_k (its value's row of the
  trainer's encoding: a vocabulary of the values seen often enough for non-sensitive columns,
  hashed bins for sensitive ones, as ``trainers.data.encode`` does for the neural models);
- each numeric column ``v`` (already ``sign(v) log1p(|v|)``) is scaled into [0, 1] by
  ``(v - lo) / (hi - lo)``, clipped, with ``lo`` and ``hi`` its minimum and maximum over the
  training rows: a transform fitted on the features alone (public under label DP; the
  statement says so), kept with the model so that new rows are scaled alike, then times its
  column's weight;
- an intercept coordinate holding its weight.

The plan's ``row_norm_bound`` is R = sqrt(1 + c + m) for c categorical and m numeric columns,
whatever the vocabularies; the weights' squares add up to R^2 (``column_weights``: fitted on the
public counts, so that the columns whose rare values the noise would bury get more of the
norm), so a row's L2 norm is at most R. The dimension k does not enter the noise (the
Gaussian release is accounted by its L2 sensitivity alone). Two columns hashed to one bin
would put a_j + a_l in one coordinate and make a row longer than the bound: every row is
scaled by ``min(1, R / ||x_i||)``, computed exactly, so the bound holds for every row all the
same (the count of scaled rows is in the private record).

The release is ``S = sum_i y_i w_i x_i + N(0, s^2 I_k)``, summed sparsely (a scatter-add per
column). The model is then fitted on S and the public features alone (post-processing):

    minimise  (1/N) [ sum_i w_i log(1 + exp(theta . x_i)) - theta . S + sum_j lam_j theta_j^2 / 2 ]

(the intercept not penalised) by L-BFGS in float64. The penalty matters: a value seen in a
handful of rows has a coordinate of S that is mostly noise, and without it theta there grows
without bound. Its weight is per coordinate (``penalties``): ``lam_j = b_k a_j^2 (1 + s^2 /
(c_j p (1 - p)))`` for coordinate j of column k, with ``c_j`` the (public, weighted) count of
rows behind coordinate j and ``p`` the base rate read from the release. ``c_j p (1 - p)`` is
what the data tell about theta_j and ``s^2`` what the noise adds to its statistic; with a
Gaussian prior of precision ``b_k`` on ``a_j theta_j`` the posterior mean solves this objective
to first order. A uniform penalty proportional to s was worse at every epsilon measured
(CHANGELOG).

The prior's precision is estimated per column from the release (``fit_empirical_bayes``,
empirical Bayes): the columns of an ads table differ in how much their values matter (a
creative's effect spreads wider than a device's), and one precision for all of them shrinks
some too far and others too little. Starting from ``L2_BASE`` (10, the best single penalty of
the non-private fit, 1 to 1,000 tried), each round fits theta, then sets column k's precision to
MacKay's fixed point ``b_k = gamma_k / sum_(j in k) (a_j theta_j)^2``, where ``gamma_k = sum_(j in
k) (1 - b_k a_j^2 / H_j)`` counts the values the data determine and ``H_j = i_j^2 / (i_j + s^2) +
b_k a_j^2`` is theta_j's posterior precision (``i_j = c_j p (1 - p)``), until no precision moves
by more than ``EB_TOLERANCE`` or after ``EB_ROUNDS`` fits. ``L2_BASE`` is also a prior on the
precisions, worth ``EB_PSEUDO`` (20) values: ``b_k = (gamma_k + 20) / (sum (a_j theta_j)^2 + 20 /
L2_BASE)``, so a column whose values the data barely determine (a few hundred positives) stays
near ``L2_BASE`` instead of following its noise, and one of thousands of determined values is
set by them. The rounds' fits stop after ``EB_ROUND_ITERATIONS`` L-BFGS iterations, each from
the last one's theta, and the last fit, at the precisions returned, runs in full. A column of
fewer than ``EB_MIN_COORDINATES`` values (a device, an ad format, the numerics, pooled) has too
few values to estimate a spread from and keeps ``L2_BASE``. Everything it reads is the release and the
public features: post-processing, free in privacy. The non-private reference of the WALR
benchmark is fitted the same way (at s = 0), so that the prior improves both and flatters
neither.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from trainers.walr import WALRResult, draw_once

__all__ = ["ColumnWeights", "column_weights", "coordinate_weights", "WEIGHT_FLOOR", "OneHotRows", "numeric_range",
           "encode_rows", "release", "fit", "predict", "run_walr_onehot", "curvature", "penalties", "L2_BASE",
           "FIT_ITERATIONS", "EB_ROUNDS", "EB_TOLERANCE", "EB_MIN_COORDINATES", "PRECISION_RANGE", "PRIORS",
           "EB_PSEUDO", "EB_ROUND_ITERATIONS", "column_groups", "fit_empirical_bayes"]

L2_BASE = 10.0
FIT_ITERATIONS = 200
# the prior's precisions (module docstring): at most this many fits; stop when no column's precision moves by more
# than this share; columns with fewer coordinates keep L2_BASE; every precision kept within this range
EB_ROUNDS = 5
EB_TOLERANCE = 0.05
EB_MIN_COORDINATES = 20
PRECISION_RANGE = (0.1, 1000.0)
EB_PSEUDO = 20.0
EB_ROUND_ITERATIONS = 40
PRIORS = ("empirical-bayes", "fixed")
WEIGHT_FLOOR = 0.05
_BLOCK = 1 << 16


@dataclass(frozen=True)
class ColumnWeights:
    """What each column's coordinate holds: the intercept's, each categorical's and each numeric's factor.

    A row's squared norm is at most ``intercept^2 + sum categorical^2 + sum numeric^2`` (numerics
    lie in [0, 1]) when no two of its columns share a coordinate. ``uniform`` (every factor 1) is
    the plain one-hot encoding.
    """

    intercept: float
    categorical: tuple[float, ...]
    numeric: tuple[float, ...]

    @classmethod
    def uniform(cls, categorical: int, numeric: int) -> ColumnWeights:
        return cls(1.0, (1.0,) * categorical, (1.0,) * numeric)

    def squared_total(self) -> float:
        return self.intercept ** 2 + sum(a * a for a in self.categorical) + sum(a * a for a in self.numeric)

    def to_dict(self) -> dict:
        return {"intercept": self.intercept, "categorical": list(self.categorical), "numeric": list(self.numeric)}


@dataclass(frozen=True)
class OneHotRows:
    """Rows of the one-hot encoding, sparse.

    Attributes:
        cat: [N, c] int64 coordinates of the categorical columns (1 .. num_offset - 1); column j's
            coordinate holds ``weights.categorical[j]`` (1 without weights).
        num: [N, m] float64 numerics in [0, 1], each times its column's weight (coordinates
            num_offset .. k - 1).
        scale: [N] float64, each row's factor min(1, R / ||x_i||).
        norm: [N] float64, each row's norm after scaling, ||scale_i x_i|| (at most R).
        k: the dimension, intercept (coordinate 0) included.
        weights: the columns' weights (``ColumnWeights``).
    """

    cat: torch.Tensor
    num: torch.Tensor
    scale: torch.Tensor
    norm: torch.Tensor
    num_offset: int
    k: int
    weights: ColumnWeights

    def _cat_weights(self) -> torch.Tensor:
        return torch.tensor(self.weights.categorical, dtype=torch.float64, device=self.scale.device)

    def __len__(self) -> int:
        return self.scale.shape[0]

    def logits(self, theta: torch.Tensor) -> torch.Tensor:
        a0 = self.weights.intercept
        z = a0 * theta[0] + theta[self.cat] @ self._cat_weights() if self.cat.shape[1] else \
            (a0 * theta[0]).expand(len(self)).clone()
        if self.num.shape[1]:
            z = z + self.num @ theta[self.num_offset:]
        return z * self.scale


def _numeric(data) -> torch.Tensor:
    return torch.cat([data.ns_num, data.s_num], 1).to(torch.float64)


def numeric_range(data, collective=None) -> tuple[list[float], list[float]]:
    """(lo, hi) of each numeric column over the rows (every rank's), the transform's parameters."""
    x = _numeric(data)
    if x.shape[1] == 0:
        return [], []
    lo, hi = x.min(0).values, x.max(0).values
    if collective is not None:
        los = collective.gather_object(lo.tolist())
        his = collective.gather_object(hi.tolist())
        pooled = None if los is None else (np.min(los, axis=0).tolist(), np.max(his, axis=0).tolist())
        return collective.broadcast_object(pooled)
    return lo.tolist(), hi.tolist()


def encode_rows(data, lo: list[float], hi: list[float], *, row_norm_bound: float,
                weights: ColumnWeights | None = None) -> tuple[OneHotRows, int]:
    """(the rows, how many were scaled to the bound) for ``data`` (``EncodedData``), the fitted transform
    and the columns' weights (``column_weights``; None: every weight 1)."""
    n = len(data)
    cat = torch.cat([data.ns_cat + 1, data.s_cat + 1 + data.ns_vocab], 1).to(torch.int64)
    num_offset = 1 + data.ns_vocab + data.s_vocab
    x = _numeric(data)
    if weights is None:
        weights = ColumnWeights.uniform(cat.shape[1], x.shape[1])
    if len(weights.categorical) != cat.shape[1] or len(weights.numeric) != x.shape[1]:
        raise InvalidParameterError(f"the column weights name {len(weights.categorical)} categorical and "
                                    f"{len(weights.numeric)} numeric columns; the rows have {cat.shape[1]} and "
                                    f"{x.shape[1]}")
    if x.shape[1]:
        low = torch.tensor(lo, dtype=torch.float64, device=x.device)
        width = (torch.tensor(hi, dtype=torch.float64, device=x.device) - low).clamp_min(1e-300)
        x = ((x - low) / width).clamp_(0.0, 1.0) * torch.tensor(weights.numeric, dtype=torch.float64, device=x.device)
    # ||x_i||^2 = a0^2 + sum over the row's column pairs (j, l) sharing a coordinate of a_j a_l + sum of numerics^2
    a = torch.tensor(weights.categorical, dtype=torch.float64, device=x.device)
    products = a[:, None] * a[None, :]
    squared = torch.empty(n, dtype=torch.float64, device=x.device)
    c = cat.shape[1]
    for s in range(0, n, _BLOCK):
        block = cat[s:s + _BLOCK]
        pairs = ((block[:, :, None] == block[:, None, :]) * products).sum((1, 2)) if c else \
            torch.zeros(len(block), dtype=torch.float64, device=x.device)
        squared[s:s + _BLOCK] = weights.intercept ** 2 + pairs + (x[s:s + _BLOCK] ** 2).sum(1)
    norms = squared.sqrt()
    # a row above the bound is scaled to a hair below it, so that no rounding of its coordinates, in
    # any order, can take it past the bound
    scale = torch.where(norms > row_norm_bound, row_norm_bound / norms * (1 - 64 * torch.finfo(torch.float64).eps),
                        torch.ones_like(norms))
    return (OneHotRows(cat, x, scale, norms * scale, num_offset, num_offset + x.shape[1], weights),
            int((norms > row_norm_bound).sum()))


def _used(rows: OneHotRows, collective=None) -> torch.Tensor:
    """[c, k]: whether any row of any rank sets categorical column j's coordinate."""
    used = torch.zeros(rows.cat.shape[1], rows.k, dtype=torch.float64, device=rows.scale.device)
    for j in range(rows.cat.shape[1]):
        used[j, rows.cat[:, j]] = 1.0
    if collective is not None:
        collective.sum_([used])
    return used > 0


def coordinate_weights(rows: OneHotRows, collective=None) -> torch.Tensor:
    """[k] each coordinate's column weight, the same on every rank (a coordinate two hashed columns
    share, or none uses: the later column's, or 1)."""
    a = torch.ones(rows.k, dtype=torch.float64, device=rows.scale.device)
    a[0] = rows.weights.intercept
    for j, used in enumerate(_used(rows, collective)):
        a[used] = rows.weights.categorical[j]
    a[rows.num_offset:] = torch.tensor(rows.weights.numeric, dtype=torch.float64, device=a.device)
    return a


def _column_counts(rows: OneHotRows, w: torch.Tensor, collective=None) -> list[torch.Tensor]:
    """Per column (categoricals, then numerics, then the intercept): the curvature weight of each
    coordinate it uses, pooled over ranks. Unweighted rows; features only."""
    c = curvature(rows, w, collective)
    used = _used(rows, collective)
    groups = [c[used[j]] for j in range(rows.cat.shape[1])]
    groups += [c[rows.num_offset + i:rows.num_offset + i + 1] for i in range(rows.num.shape[1])]
    return [g.cpu() for g in groups] + [c[0:1].cpu()]


def column_weights(rows: OneHotRows, w: torch.Tensor, *, noise_std: float, row_norm_bound: float,
                   collective=None, label_variance: float = 0.25) -> ColumnWeights:
    """The columns' weights that spend the row norm where the noise hides most rows; features only.

    Every coordinate's statistic in the release is ``a_k`` times its rows' label sum plus noise of
    std ``s``, ``a_k`` the weight of its column k, and a row's norm is sqrt(sum_k a_k^2) (the
    intercept and the numerics are columns too), so the plan's bound R fixes sum_k a_k^2 = R^2 and
    the weights decide which columns the noise hides. A coordinate of c_j rows carries
    information a_k^2 c_j v against noise s^2: the share of its statistic that is signal is
    r = a_k^2 c_j v / (a_k^2 c_j v + s^2). The weights maximise the rows' total share,
    sum_k sum_(j in k) c_j r, subject to sum_k a_k^2 = R^2 and a_k >= ``WEIGHT_FLOOR`` (the
    objective is concave in a_k^2: water-filling, by bisection on the multiplier), with v = 1/4,
    the label variance's largest value, so that no label is read. A column of a few values seen
    in every row (a device, an intercept, a numeric) is informed at any weight and gives its norm
    to the long-tailed columns whose rare values the noise would bury. ``rows``: the unweighted
    rows; the counts are public under label DP, so this is free.
    """
    groups = _column_counts(rows, w, collective)
    total, floor2, v = row_norm_bound ** 2, WEIGHT_FLOOR ** 2, label_variance
    s2 = max(noise_std, 1e-12) ** 2
    if floor2 * len(groups) >= total:
        raise InvalidParameterError(f"row_norm_bound {row_norm_bound!r} leaves no room above the weights' floor")
    infos = [g * v / s2 for g in groups]

    def marginal(t: float, g: torch.Tensor, x: torch.Tensor) -> float:
        return float((g * x / (1 + t * x) ** 2).sum())

    def t_for(mu: float, g: torch.Tensor, x: torch.Tensor) -> float:
        lo, hi = floor2, total
        if marginal(lo, g, x) <= mu:
            return lo
        if marginal(hi, g, x) >= mu:
            return hi
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if marginal(mid, g, x) > mu else (lo, mid)
        return math.sqrt(lo * hi)

    lo, hi = 1e-300, max(marginal(floor2, g, x) for g, x in zip(groups, infos)) + 1.0
    for _ in range(200):
        mu = math.sqrt(lo * hi) if lo > 0 else hi / 2
        if sum(t_for(mu, g, x) for g, x in zip(groups, infos)) > total:
            lo = mu
        else:
            hi = mu
        if hi / max(lo, 1e-300) < 1 + 1e-12:
            break
    ts = [t_for(hi, g, x) for g, x in zip(groups, infos)]
    fill = total / sum(ts)  # the last hair of the bound, so that sum a_k^2 = R^2 to rounding
    a = [math.sqrt(t * fill) * (1 - 1e-12) for t in ts]
    c, m = rows.cat.shape[1], rows.num.shape[1]
    return ColumnWeights(a[-1], tuple(a[:c]), tuple(a[c:c + m]))


def release(rows: OneHotRows, y: torch.Tensor, w: torch.Tensor, *, noise_std: float, sensitivity: float,
            randomness, collective=None):
    """The one private release: sum_i y_i w_i x_i (sparse) + N(0, noise_std^2 I_k); (noisy, info).

    Refused if a row contributes more than ``sensitivity``. With a ``collective`` the ranks' exact
    sums are added and rank 0 alone draws the noise; other ranks get None.
    """
    t0 = time.perf_counter()
    y = torch.as_tensor(y, dtype=torch.float64)
    if not bool(((y == 0) | (y == 1)).all()):
        raise InvalidParameterError("labels must be 0 or 1")
    v = y * w * rows.scale
    largest = float((w * rows.norm).max()) if len(rows) else 0.0  # depends on no label
    if not largest <= sensitivity * (1 + 1e-12):
        raise PlanMismatchError(f"a row contributes {largest!r} to the sum, more than the planned sensitivity "
                                f"{sensitivity!r}")
    total = torch.zeros(rows.k, dtype=torch.float64, device=v.device)
    total[0] = rows.weights.intercept * v.sum()
    if rows.cat.shape[1]:
        total.index_add_(0, rows.cat.reshape(-1), (v[:, None] * rows._cat_weights()).reshape(-1))
    if rows.num.shape[1]:
        total[rows.num_offset:] += rows.num.T @ v
    if collective is not None:
        collective.sum_([total])
        everyone = collective.gather_object(largest)
        if everyone is None:
            return None
        largest = max(everyone)
    u = randomness.uniform_u64(2)
    gen = np.random.Generator(np.random.PCG64((int(u[0]) << 64) | int(u[1])))
    total += torch.as_tensor(gen.standard_normal(rows.k), dtype=torch.float64).to(total.device) * noise_std
    return total, {"noise_draws": rows.k, "max_contribution": largest, "noise_std": noise_std,
                   "seconds": time.perf_counter() - t0}


def curvature(rows: OneHotRows, w: torch.Tensor, collective=None) -> torch.Tensor:
    """sum_i w_i x_ij^2 for every coordinate j: how many (scaled) rows inform it. Features only: public."""
    out = torch.zeros(rows.k, dtype=torch.float64, device=rows.scale.device)
    ws2 = w * rows.scale ** 2
    out[0] = rows.weights.intercept ** 2 * ws2.sum()
    if rows.cat.shape[1]:
        out.index_add_(0, rows.cat.reshape(-1), (ws2[:, None] * rows._cat_weights() ** 2).reshape(-1))
    if rows.num.shape[1]:
        out[rows.num_offset:] = (rows.num ** 2).T @ ws2
    if collective is not None:
        collective.sum_([out])
    return out


def _base_rate(rows: OneHotRows, released: torch.Tensor, c: torch.Tensor) -> float:
    """The base rate read from the release's intercept coordinate, within [1e-4, 0.5] (post-processing)."""
    p = rows.weights.intercept * float(released[0]) / max(float(c[0]), 1e-300)
    return min(max(p, 1e-4), 0.5)


def penalties(rows: OneHotRows, w: torch.Tensor, noisy: torch.Tensor, *, noise_std: float,
              base: float | torch.Tensor, collective=None) -> torch.Tensor:
    """Per-coordinate L2 weights lam_j = base a_j^2 (1 + s^2 / (c_j p (1 - p))), the intercept unpenalised.

    ``base``: the prior's precision, one for every coordinate or a [k] tensor of them (one per
    coordinate, as ``fit_empirical_bayes`` sets them column by column).

    ``c_j`` is the coordinate's curvature weight (``curvature``) and ``p`` the base rate read from
    the release's intercept coordinate: ``c_j p (1 - p)`` is the information the data hold about
    theta_j, ``s^2`` what the noise adds to its statistic, so the penalty is the prior's
    (``base``) inflated by the noise-to-information ratio: a coordinate of thousands of rows is
    barely touched, one of a handful is held near 0. ``a_j`` is the coordinate's column weight:
    theta_j multiplies a_j, so a prior of precision ``base`` on a_j theta_j is one of precision
    ``base a_j^2`` on theta_j, and the unweighted fit at no noise is the same model whatever the
    weights. Post-processing of the release and of public features.
    """
    c = curvature(rows, w, collective)
    p = _base_rate(rows, noisy, c)
    info = c * p * (1 - p)
    if isinstance(base, torch.Tensor):
        base = base.to(info.device, torch.float64)
    lam = base * coordinate_weights(rows, collective) ** 2 * (1.0 + noise_std ** 2 / info.clamp_min(1e-12))
    lam[0] = 0.0
    return lam


def column_groups(rows: OneHotRows, collective=None) -> tuple[torch.Tensor, list[int]]:
    """([k] the group of each coordinate, each group's size): categorical column j is group j, the
    numerics together the last group, the intercept -1. A coordinate two hashed columns share is
    the later column's (as in ``coordinate_weights``). Features only: public."""
    c = rows.cat.shape[1]
    group = torch.full((rows.k,), -1, dtype=torch.long, device=rows.scale.device)
    for j, used in enumerate(_used(rows, collective)):
        group[used] = j
    group[rows.num_offset:] = c
    return group, [int((group == g).sum()) for g in range(c + 1)]


def fit_empirical_bayes(rows: OneHotRows, noisy: torch.Tensor, w: torch.Tensor, *, n_rows: int, noise_std: float,
                        base: float = L2_BASE, rounds: int = EB_ROUNDS, iterations: int = FIT_ITERATIONS,
                        pseudo: float = EB_PSEUDO, round_iterations: int = EB_ROUND_ITERATIONS,
                        collective=None) -> tuple[torch.Tensor, list[float]]:
    """(theta, each group's prior precision): the fit at precisions estimated from the release (module docstring).

    The precisions returned are those theta was fitted with; groups of fewer than
    ``EB_MIN_COORDINATES`` coordinates keep ``base``. Reads the release and public features only.
    """
    group, sizes = column_groups(rows, collective)
    a = coordinate_weights(rows, collective)
    c = curvature(rows, w, collective)
    p = _base_rate(rows, torch.as_tensor(noisy, dtype=torch.float64), c)
    info = (c * p * (1 - p)).clamp_min(1e-12)
    s2 = float(noise_std) ** 2
    member = [(group == g) for g in range(len(sizes))]
    estimated = [g for g, size in enumerate(sizes) if size >= EB_MIN_COORDINATES]
    b = torch.full((len(sizes),), float(base), dtype=torch.float64, device=info.device)
    lo, hi = PRECISION_RANGE

    def per_coordinate(b: torch.Tensor) -> torch.Tensor:
        return b[group.clamp_min(0)]

    def fitted(b: torch.Tensor, start: torch.Tensor | None, steps: int) -> torch.Tensor:
        # ``penalties``' weights from the counts above (no pass over the rows per round)
        lam = per_coordinate(b) * a ** 2 * (1.0 + s2 / info)
        lam[0] = 0.0
        return fit(rows, noisy, w, n_rows=n_rows, iterations=steps, collective=collective, start=start, l2=lam)

    theta = fitted(b, None, min(round_iterations, iterations))
    for _ in range(rounds - 1):
        prior = per_coordinate(b) * a ** 2
        gamma = 1.0 - prior / (info ** 2 / (info + s2) + prior)
        beta2 = (a * theta) ** 2
        new = b.clone()
        for g in estimated:
            new[g] = min(max(float((gamma[member[g]].sum() + pseudo) / (beta2[member[g]].sum() + pseudo / base)),
                             lo), hi)
        if float(((new / b) - 1).abs().max()) <= EB_TOLERANCE:
            break
        b = new
        theta = fitted(b, theta, min(round_iterations, iterations))
    if round_iterations < iterations:  # the full fit at the precisions returned, from the last round's theta
        theta = fitted(b, theta, iterations)
    return theta, b.tolist()


def fit(rows: OneHotRows, noisy: torch.Tensor, w: torch.Tensor, *, n_rows: int, l2,
        iterations: int = FIT_ITERATIONS, collective=None, start: torch.Tensor | None = None) -> torch.Tensor:
    """theta minimising the module docstring's objective on the released vector (reads no label).

    ``l2``: one L2 weight for every coordinate but the intercept, or a vector of them (``penalties``).
    ``start``: theta to start from (0 by default).
    L-BFGS runs on theta_j / d_j with d_j = 1 / sqrt(lam_j + c_j p (1 - p)), the objective's
    diagonal at its optimum, so that coordinates of a handful of rows and of millions are
    equally well conditioned.
    """
    target = torch.as_tensor(noisy, dtype=torch.float64).to(rows.scale.device)
    if target.shape != (rows.k,) or not bool(torch.isfinite(target).all()):
        raise InvalidParameterError(f"the released vector must be {rows.k} finite numbers")
    if isinstance(l2, torch.Tensor):
        lam = l2.to(target.device, torch.float64)
    else:
        lam = torch.full((rows.k,), float(l2), dtype=torch.float64, device=target.device)
        lam[0] = 0.0  # the intercept
    c = curvature(rows, w, collective)
    p = _base_rate(rows, target, c)
    d = 1.0 / torch.sqrt(lam + c * p * (1 - p) + 1e-12)
    phi = torch.zeros(rows.k, dtype=torch.float64, device=target.device) if start is None else \
        start.to(target.device, torch.float64) / d
    phi.requires_grad_(True)
    opt = torch.optim.LBFGS([phi], lr=1.0, max_iter=iterations, history_size=20, tolerance_grad=1e-10,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")

    def objective(theta, data_term):
        return (data_term - target @ theta + 0.5 * (lam * theta ** 2).sum()) / n_rows

    def closure():
        opt.zero_grad()
        theta = phi * d
        local = (w * torch.nn.functional.softplus(rows.logits(theta))).sum()
        if collective is not None:
            local.backward()
            pooled = torch.stack([local.detach()])
            collective.sum_([phi.grad, pooled])
            t = theta.detach()
            phi.grad.sub_(d * target).add_(d * lam * t).div_(n_rows)
            return objective(t, pooled[0])
        loss = objective(theta, local)
        loss.backward()
        return loss

    opt.step(closure)
    return (phi * d).detach()


def predict(theta: torch.Tensor, rows: OneHotRows) -> torch.Tensor:
    """Probabilities sigmoid(theta . x_i) for rows encoded with the training transform."""
    with torch.no_grad():
        return torch.sigmoid(rows.logits(theta.to(rows.scale.device)))


@dataclass(frozen=True, kw_only=True)
class OneHotWALR:
    """The fitted model and what the run did (``trainers.walr.WALRResult``'s fields and the encoding)."""

    theta: torch.Tensor
    lo: list[float]
    hi: list[float]
    k: int
    rows_scaled: int
    l2: float
    weights: ColumnWeights
    prior: str = "fixed"
    precisions: tuple[float, ...] = ()  # each group's prior precision (``column_groups``) theta was fitted with


def run_walr_onehot(data, y, weights, params, randomness, *, persist=None, collective=None,
                    l2_base: float | None = None, iterations: int = FIT_ITERATIONS, fitted_weights: bool = True,
                    prior: str = "empirical-bayes"):
    """Execute a one-hot WALR phase as planned: encode, release once, fit; returns (OneHotWALR, WALRResult).

    ``fitted_weights``: the columns weighted by ``column_weights``; False: every weight 1.
    ``prior``: ``"empirical-bayes"`` (each column's prior precision estimated from the release,
    ``fit_empirical_bayes``) or ``"fixed"`` (``l2_base`` for every column).
    """
    if prior not in PRIORS:
        raise InvalidParameterError(f"prior must be one of {', '.join(PRIORS)}, got {prior!r}")

    if getattr(params, "encoding", None) != "one-hot":
        raise PlanMismatchError("run_walr_onehot runs a WALR phase planned with encoding = \"one-hot\"")
    n = len(data) if collective is None else collective.total(len(data))
    if n != params.dataset_size:
        raise InvalidParameterError(f"the data has {n} rows; the plan accounts N = {params.dataset_size}: re-plan "
                                    "with this N or supply the planned data")
    lo, hi = numeric_range(data, collective)
    w = torch.ones(len(data), dtype=torch.float64) if weights is None else \
        torch.as_tensor(weights, dtype=torch.float64)
    if not bool(((w >= 0) & torch.isfinite(w)).all()):
        raise InvalidParameterError("weights must be finite numbers >= 0")
    weights_clipped = int((w > params.weights_bound).sum())
    w = w.clamp(max=params.weights_bound)
    rows, scaled = encode_rows(data, lo, hi, row_norm_bound=params.row_norm_bound)
    if fitted_weights:  # the weights read the unweighted rows' counts, then the rows are encoded with them
        columns = column_weights(rows, w, noise_std=params.noise_std, row_norm_bound=params.row_norm_bound,
                                 collective=collective)
        rows, scaled = encode_rows(data, lo, hi, row_norm_bound=params.row_norm_bound, weights=columns)

    def draw():
        out = release(rows, y, w, noise_std=params.noise_std, sensitivity=params.sensitivity, randomness=randomness,
                      collective=collective)
        return None if out is None else (out[0].cpu().numpy(), out[1])

    noisy, rel = draw_once(draw, persist, collective)
    t0 = time.perf_counter()
    noisy = torch.as_tensor(np.asarray(noisy))
    base = L2_BASE if l2_base is None else l2_base
    if prior == "empirical-bayes":
        theta, precisions = fit_empirical_bayes(rows, noisy, w, n_rows=n, noise_std=params.noise_std, base=base,
                                                iterations=iterations, collective=collective)
    else:
        lam = penalties(rows, w, noisy, noise_std=params.noise_std, base=base, collective=collective)
        theta = fit(rows, noisy, w, n_rows=n, l2=lam, iterations=iterations, collective=collective)
        precisions = [base] * (rows.cat.shape[1] + 1)
    if collective is not None:
        scaled, weights_clipped = collective.total(scaled), collective.total(weights_clipped)
    result = WALRResult(rows=n, rows_clipped=scaled, weights_clipped=weights_clipped, noise_std=rel["noise_std"],
                        noise_draws=rel["noise_draws"], max_contribution=rel["max_contribution"],
                        sensitivity=params.sensitivity, release_sha256=rel.get("sha256"),
                        release_seconds=rel["seconds"], fit_steps=iterations, fit_seconds=time.perf_counter() - t0)
    if not math.isfinite(float(theta.abs().max())):
        raise InvalidParameterError("the fit diverged")  # pragma: no cover - L-BFGS on a strictly convex objective
    return OneHotWALR(theta=theta, lo=lo, hi=hi, k=rows.k, rows_scaled=scaled, l2=base, weights=rows.weights,
                      prior=prior, precisions=tuple(precisions)), result
