"""Weighted aggregate logistic regression (WALR): one Gaussian release, then free descent.

The logistic-regression gradient splits into a label-free term and the label term
S = sum_i y_i w_i x_i, which does not depend on theta. S is released once with Gaussian
noise N(0, noise_std^2 I_k); every gradient step after that reads only the features and the
noisy vector, so it is post-processing (the WALR design note; Chaudhuri, Monteleoni and
Sarwate 2011, arXiv:0912.0071, for the objective-perturbation view).

A label change moves S by w_i x_i (not 2 w_i x_i), so the sensitivity is max_i ||w_i x_i||.
The plan's bound weights_bound * row_norm_bound holds only because this module enforces it:
every row, intercept included, is clipped to row_norm_bound and every weight to
weights_bound (``prepare_rows``), and ``release`` measures the realised maximum and refuses
to release when it exceeds the planned sensitivity. The exact sum never leaves ``release``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.plan.phases import WALRParams
from trainers.randomness import Randomness

__all__ = ["WALRResult", "bytes_moved", "draw_once", "fit", "float32_error_bound", "norm_error_bound", "predict",
           "prepare_rows", "release", "release_throughput", "run_walr"]

# rows per float64 block. On CPU 2^16 x k x 8 bytes (10 MB at k = 20) stays in cache; with one reused buffer the
# release of 16M x 20 rows takes 0.16 s on 2 cores, against 2.5 s converting 2^20-row blocks afresh. On an
# accelerator larger blocks mean fewer kernel launches.
_CHUNK_ROWS = 1 << 16
_CHUNK_ROWS_ACCELERATOR = 1 << 22
# rows per block of the float32 release (``_float32_sum``): 2^14 x 20 x 4 bytes (1.3 MB) stays in a core's cache
# while the block's product and norms read it, so the rows come from memory once
_CHUNK_ROWS_FLOAT32 = 1 << 14
# rows squared at a time for the float32 release's row norms on a CPU (``_cpu_squares``): 2^12 x 20 x 4 bytes
# (330 KB) of squares beside the 1.3 MB block stay in a core's 2 MB L2 cache (2^11 to 2^13 measure alike, 2^14 slower)
_SQUARE_ROWS = 1 << 12
# rows per float32 partial sum of the release: its error bound grows as the square of this (``float32_error_bound``),
# the float64 work as its inverse
_GROUP_ROWS = 32
_U32, _U64 = 2.0 ** -24, 2.0 ** -53


def _default_chunk(device: torch.device, float32: bool = False) -> int:
    if device.type != "cpu":
        return _CHUNK_ROWS_ACCELERATOR
    return _CHUNK_ROWS_FLOAT32 if float32 else _CHUNK_ROWS


def _finite(name: str, value, *, low: float, strict: bool) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(v) or (v <= low if strict else v < low):
        raise InvalidParameterError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, got {value!r}")
    return v


def _count(name: str, value, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _first_bad(name: str, bad: torch.Tensor, values: torch.Tensor) -> str:
    i = int(torch.nonzero(bad)[0, 0])
    return f"{name}[{i}] = {values[i].item()!r}"


def _row_norms(x: torch.Tensor) -> torch.Tensor:
    """Float64 row norms; clipping and the release's sensitivity check both use this one function."""
    return torch.linalg.vector_norm(x.to(torch.float64), dim=1)


def _float64_blocks(x: torch.Tensor, chunk_rows: int):
    """(start, float64 copy of rows start:start+chunk_rows), reusing one buffer (no allocation per block)."""
    buf = torch.empty(min(chunk_rows, x.shape[0]), x.shape[1], dtype=torch.float64, device=x.device)
    for a in range(0, x.shape[0], chunk_rows):
        block = x[a:a + chunk_rows]
        view = buf[:block.shape[0]]
        view.copy_(block)
        yield a, view


def prepare_rows(X: torch.Tensor, *, row_norm_bound: float, weights: torch.Tensor | None = None,
                 weights_bound: float | None = None, expected_features: int | None = None):
    """Append the intercept column, clip every row to row_norm_bound and every weight to weights_bound.

    Args:
        X: [N, k-1] float features, on any device; not modified.
        row_norm_bound: the plan's L2 bound R on a row, intercept included (so R >= 1).
        weights: [N] non-negative weights, default all 1.
        weights_bound: the plan's bound W on a weight; required when weights are given.
        expected_features: the plan's ``features`` (k, intercept included); refused if the data differ.

    Returns:
        (Xc [N, k] in X's float dtype, wc [N] float64, info) where info has rows_clipped,
        weights_clipped and k. A row inside the bound is kept bit for bit; a row outside is
        scaled down to norm <= R (measured in float64), the intercept with it.
    """
    R = _finite("row_norm_bound", row_norm_bound, low=1.0, strict=False)  # the intercept alone has norm 1
    if not isinstance(X, torch.Tensor) or X.dim() != 2:
        raise InvalidParameterError(f"X must be a 2-D torch tensor [rows, features], got "
                                    f"{getattr(X, 'shape', type(X).__name__)}")
    X = X.detach()
    n, k = X.shape[0], X.shape[1] + 1
    if n == 0:
        raise InvalidParameterError("X has no rows")
    if expected_features is not None and k != _count("expected_features", expected_features, low=1):
        raise InvalidParameterError(f"features: the plan declares {expected_features} features (intercept included), "
                                    f"the data have {k - 1} columns + the intercept = {k}")
    dtype = X.dtype if X.is_floating_point() else torch.get_default_dtype()
    wc, weights_clipped = _prepare_weights(weights, weights_bound, n, X.device)
    Xc = torch.cat([X.to(dtype), torch.ones(n, 1, dtype=dtype, device=X.device)], dim=1)
    rows_clipped = 0
    shrink = 1.0 - torch.finfo(dtype).eps  # one shrink outweighs the rounding (<= eps/2 per coordinate)
    for a, block64 in _float64_blocks(Xc, _default_chunk(Xc.device)):
        norms = _row_norms(block64)
        if not bool(torch.isfinite(norms).all()):  # checked here, in cache, not by a pass of its own
            _refuse_row(Xc, a + int(torch.nonzero(~torch.isfinite(norms))[0, 0]))
        out = torch.nonzero(norms > R).flatten()
        if out.numel() == 0:
            continue
        rows_clipped += out.numel()
        factor = R / norms[out]
        # scaling rounds each coordinate to dtype; shrink the stragglers until the float64 norm is <= R
        for _ in range(64):
            scaled = (block64[out] * factor[:, None]).to(dtype)
            over = _row_norms(scaled) > R
            if not bool(over.any()):
                break
            factor = torch.where(over, factor * shrink, factor)
        else:  # pragma: no cover - a few shrinks always suffice for IEEE rounding
            raise RuntimeError("row clipping did not converge")
        Xc[a + out] = scaled
    return Xc, wc, {"rows_clipped": rows_clipped, "weights_clipped": weights_clipped, "k": k}


def _refuse_row(Xc: torch.Tensor, i: int):
    bad = ~torch.isfinite(Xc[i])
    if bool(bad.any()):
        raise InvalidParameterError(f"X must hold finite features: row {i} has {Xc[i][bad][0].item()}")
    raise InvalidParameterError(f"X row {i} is too large to clip: its norm overflows float64")


def _prepare_weights(weights, weights_bound, n: int, device) -> tuple[torch.Tensor, int]:
    if weights is None and weights_bound is None:
        return torch.ones(n, dtype=torch.float64, device=device), 0
    if weights_bound is None:
        raise InvalidParameterError("weights_bound is required when weights are given: the sensitivity is "
                                    "weights_bound * row_norm_bound")
    W = _finite("weights_bound", weights_bound, low=0.0, strict=True)
    if weights is None:
        w = torch.ones(n, dtype=torch.float64, device=device)
    else:
        w = torch.as_tensor(weights, device=device).to(torch.float64)
        if w.shape != (n,):
            raise InvalidParameterError(f"weights must have shape ({n},) like the rows of X, got {tuple(w.shape)}")
        bad = ~(w >= 0) | torch.isinf(w)  # catches negatives, NaN and +inf
        if bool(bad.any()):
            raise InvalidParameterError(f"weights must be finite numbers >= 0, got {_first_bad('weights', bad, w)}")
    over = w > W
    clipped = int(over.sum())
    return (torch.where(over, torch.full_like(w, W), w) if clipped else w.clone()), clipped


def _check_labels(y, n: int, device) -> torch.Tensor:
    y = torch.as_tensor(y, device=device)
    if y.shape != (n,):
        raise InvalidParameterError(f"y must have shape ({n},) like the rows, got {tuple(y.shape)}")
    if y.dtype == torch.bool:
        return y
    if not (y.is_floating_point() or y.is_complex()):  # integers: one pass, min and max
        lo, hi = torch.aminmax(y)
        if int(lo) >= 0 and int(hi) <= 1:
            return y
    ok = (y == 0) | (y == 1)
    if not bool(ok.all()):
        raise InvalidParameterError(f"labels must be 0 or 1, got {_first_bad('y', ~ok, y)}")
    return y


def _exact_sum(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor, *, chunk_rows: int | None):
    """(sum_i y_i w_i x_i in float64, max_i ||w_i x_i|| as float64 computes it), in row blocks.

    Private to ``release``: the exact sum must be noised before anything sees it. Float64 rows
    take ``_float64_sum`` (as before the float32 path existed), every other float dtype the
    one-pass ``_float32_sum``.
    """
    float32 = Xc.dtype != torch.float64
    chunk = _default_chunk(Xc.device, float32) if chunk_rows is None else chunk_rows
    return _float32_sum(Xc, y, wc, chunk_rows=chunk) if float32 else _float64_sum(Xc, y, wc, chunk_rows=chunk)


def _float64_sum(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor, *, chunk_rows: int):
    """(sum_i y_i w_i x_i, max_i ||w_i x_i||) in float64, in row blocks of float64 rows.

    Rows that are not float64 are copied into one reused float64 block (cache-resident on a
    CPU); float64 rows are used in place. The block's norms and its product are float64, the
    product's partial sums too, so a float64 release is the same, bit for bit, as before the
    float32 path existed.
    """
    n, k = Xc.shape
    total = torch.zeros(k, dtype=torch.float64, device=Xc.device)
    largest = torch.zeros((), dtype=torch.float64, device=Xc.device)
    yw = torch.empty(min(chunk_rows, n), dtype=torch.float64, device=Xc.device)
    buf = None if Xc.dtype == torch.float64 else torch.empty(yw.shape[0], k, dtype=torch.float64, device=Xc.device)
    for a in range(0, n, chunk_rows):
        block = Xc[a:a + chunk_rows]
        w = wc[a:a + chunk_rows].to(torch.float64)
        xs = block if buf is None else buf[:block.shape[0]].copy_(block)
        # float multiplication is monotone: w <= W and ||x|| <= R give w ||x|| <= W R exactly
        largest = torch.maximum(largest, (_row_norms(xs) * w.abs()).max())
        v = yw[:block.shape[0]]
        v.copy_(y[a:a + chunk_rows])
        total += v.mul_(w) @ xs
    return total, float(largest)


def float32_error_bound(n_rows: int, chunk_rows: int = _CHUNK_ROWS_FLOAT32) -> tuple[float, float]:
    """(rel, tiny): the float32 release's sum is within ``rel * T + tiny * Z`` of sum_i y_i w_i x_i (2-norm).

    T = sum_i y_i |w_i| ||x_i|| and Z = sum_i y_i (||x_i|| + sqrt(k)), for n_rows rows in
    blocks of chunk_rows (``_float32_sum``). With u = 2^-24 and gamma_m = m u / (1 - m u)
    (Higham, Accuracy and Stability of Numerical Algorithms, (3.4)-(3.5)):

    - the float32 stage: each weight rounded to float32 (relative u) times a 0/1 label (exact),
      then a dot product over a group of at most G = 32 rows, in whatever order the kernel
      takes: gamma_(G+1) per coordinate, relative to sum |y w x_j| over the group;
    - the float64 stage: the block's group sums (exact in float64) added in any order,
      gamma64_(B/G) with B = chunk_rows, then the blocks' sums added by ``math.fsum``
      (correctly rounded, one rounding of 2^-53);
    - below float32's normal range (2^-126), a weight or a product may lose at most 2^-126
      ||x_i|| and 2^-126 per coordinate: ``tiny`` = 2^-126, times Z.

    Per coordinate that is rel * sum_i y_i |w_i x_ij|, and the 2-norm of that vector is at
    most rel * T. rel is about 2e-6 (G = 32). For privacy what matters is what one label
    changes: the kernels' summation order depends on the shapes and the thread count, not on
    the values, so every group but the changed row's gives the same bits, and the computed sum
    moves by w_i x_i plus at most 2 gamma_33 G W R = 1.3e-4 W R for rows of norm <= R and
    weights <= W (plus gamma64 terms below 1e-9 W R and one rounding of the total): about
    four orders of magnitude below the noise's standard deviation z W R at any noise
    multiplier z >= 1, and 2.6e-4 of it at z = 0.5.
    """
    n, chunk = _count("n_rows", n_rows, low=1), _count("chunk_rows", chunk_rows, low=1)

    def gamma(m: int, u: float) -> float:
        return m * u / (1 - m * u)

    group = min(_GROUP_ROWS, chunk, n)
    first = gamma(group + 1, _U32)
    groups = -(-min(chunk, n) // _GROUP_ROWS) + 1  # the block's group sums and its tail
    return first + (1 + first) * (gamma(groups, _U64) + 2 * _U64), 2.0 ** -126


def _float32_sum(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor, *, chunk_rows: int):
    """(sum_i y_i w_i x_i in float64, max_i ||w_i x_i|| as float64 computes it): one pass over float32 rows.

    Each block of rows is read from memory once, in the rows' dtype (rows in another dtype, or
    not contiguous, are converted into one reused float32 block, exactly): ``embedding_bag``
    adds each group of 32 rows times ``y w`` (the weight rounded to float32) into a float32
    group sum, the group sums are added in float64 (the blocks' sums by ``math.fsum``), and
    ``_largest`` takes the float64 maximum of ``|w_i| ||x_i||`` exactly from the block's float32
    row norms (on a CPU with one torch thread from its squared norms, ``_cpu_squares``, while the
    block is in cache).
    No torch matrix product is involved, so torch's TF32 or bfloat16 settings for float32
    products cannot lower the precision. The error bound and what it means for privacy:
    ``float32_error_bound``. A block whose float32 values overflow (weights above 3e38,
    products near it) is summed by ``_float64_sum`` instead.
    """
    n, k = Xc.shape
    rows = min(chunk_rows, n)
    dev = Xc.device
    yw, w32 = torch.empty(rows, device=dev), torch.empty(rows, device=dev)
    buf = None if Xc.dtype == torch.float32 and Xc.is_contiguous() else torch.empty(rows, k, device=dev)
    index = torch.arange(rows, device=dev)
    offsets = torch.arange(0, rows, _GROUP_ROWS, device=dev)
    table = torch.zeros(-(-n // chunk_rows), k, dtype=torch.float64, device=dev)  # each block's sum
    # one CPU thread: numpy's squares (single-threaded); several: torch's row norm, which uses them all
    one_thread = dev.type == "cpu" and torch.get_num_threads() == 1
    squares = _cpu_squares(Xc if buf is None else buf, rows) if one_thread else None
    largest = 0.0
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # inf and NaN squares: ``_largest``'s
        for i, a in enumerate(range(0, n, chunk_rows)):
            block, weights = Xc[a:a + chunk_rows], wc[a:a + chunk_rows]
            r = block.shape[0]
            xs = block if buf is None else buf[:r].copy_(block)
            w = w32.copy_(weights) if r == rows else w32[:r].copy_(weights)
            v = (yw if r == rows else yw[:r]).copy_(y[a:a + chunk_rows]).mul_(w)  # a 0/1 label times the weight: exact
            # the block's one read from memory; its squares (on a CPU) read it from the cache
            groups = torch.nn.functional.embedding_bag(index if r == rows else index[:r], xs,
                                                       offsets if r == rows else offsets[:-(-r // _GROUP_ROWS)],
                                                       mode="sum", per_sample_weights=v)
            torch.sum(groups, 0, dtype=torch.float64, out=table[i])
            s = None if squares is None else squares(a if buf is None else 0, r)
            largest = _largest(xs, w, weights, largest, s)
    sums = table.cpu().numpy()
    for i in np.flatnonzero(~np.isfinite(sums).all(1)):  # a float32 overflow: this block in float64
        a = int(i) * chunk_rows
        sums[i] = _float64_sum(Xc[a:a + chunk_rows], y[a:a + chunk_rows], wc[a:a + chunk_rows],
                               chunk_rows=chunk_rows)[0].cpu().numpy()
    if not np.isfinite(sums).all():  # the release refuses it; fsum would raise on inf - inf
        return torch.as_tensor(sums.sum(0), device=dev), largest
    return torch.tensor([math.fsum(sums[:, j]) for j in range(k)], dtype=torch.float64, device=dev), largest


def norm_error_bound(k: int) -> tuple[float, float]:
    """(relative, absolute) bounds on the error of ``w ||x||`` for k coordinates computed in float32.

    The sum of k squares in any order is within gamma_k = k u / (1 - k u) of its value (u the
    unit roundoff of float32, 2^-24; Higham (3.5)); the square root halves that and adds u, the
    weight's rounding to float32 and the product add 2u: relative (k / 2 + 3) u. A square below
    float32's smallest normal number may be flushed to zero or rounded to a subnormal (at most
    k 2^-126 lost from the sum, sqrt(k) 2^-63 from the norm, times the weight), and a weight or
    product below it is off by at most 2^-149 times a finite norm (< sqrt(k) 2^64). The bounds
    returned are twice the relative one (which also covers the float64 rounding of the same
    value) and sqrt(k) 2^-60 (to be multiplied by the largest weight, plus sqrt(k) 2^-80 on its
    own). A square or product that overflows gives inf, which the caller treats as unknown.
    Coordinates in half precision are converted to float32 exactly, so the bounds are the same.
    """
    u = _U32
    return 2 * (k / 2 + 3) * u / (1 - k * u), math.sqrt(k) * 2.0 ** -60


def _cpu_squares(rows: torch.Tensor, block_rows: int):
    """A function (a, r) -> float32 squared norms of ``rows[a:a + r]`` (r <= block_rows), on a CPU.

    ``rows`` is float32 and contiguous. Called once ``embedding_bag`` has read the block from
    memory: every 2^12 rows are squared from the cache into one reused buffer (numpy) and the
    squares' row sums taken by a float32 matrix-vector product with ones (numpy's BLAS, one
    thread at these sizes), in about 60% of the time torch's row norm takes on the cached block.
    Any order of the sum of the k rounded squares stays within ``norm_error_bound``
    (gamma_k); a square that overflows gives inf and one below 2^-126 may be flushed, as there
    (the caller ignores numpy's floating-point warnings).
    """
    x = rows.detach().numpy()
    q = np.empty((min(block_rows, _SQUARE_ROWS), x.shape[1]), dtype=np.float32)
    ones = np.ones(x.shape[1], dtype=np.float32)
    out = torch.empty(block_rows)
    sums = out.numpy()

    def squares(a: int, r: int) -> torch.Tensor:
        for c in range(0, r, q.shape[0]):
            m = min(q.shape[0], r - c)
            np.square(x[a + c:a + c + m], out=q[:m])
            np.matmul(q[:m], ones, out=sums[c:c + m])
        return out[:r]

    return squares


def _largest(block: torch.Tensor, w32: torch.Tensor, wc: torch.Tensor, largest: float,
             squares: torch.Tensor | None = None) -> float:
    """max(largest, the block's float64 ``|w_i| ||x_i||``), from float32 values first.

    ``block`` is float32 rows, ``wc`` their weights and ``w32`` those rounded to float32;
    ``squares``, when given, the rows' float32 squared norms (``_cpu_squares``), else the
    norms are taken here. With ``p_i`` the float32 value of ``|w_i| ||x_i||`` and (rel, abs)
    its error bounds (``norm_error_bound``; A = abs W + sqrt(k) 2^-80, W the block's largest
    weight), row i's float64 value ``t_i`` satisfies
    ``(1 - rel) t_i - A <= p_i <= (1 + rel) t_i + A``, and the same for the exact product
    ``sqrt(s_i) |w32_i|`` of its squared norm ``s_i``. So every ``t_i`` is at most
    ``(sqrt(max_i s_i) W + A) (1 + 2 rel)`` (the float64 roundings of that bound are far below
    rel): a block whose bound is not above ``largest`` cannot change the maximum and is passed
    over without a per-row pass. Otherwise the row j with the largest ``t_j`` has
    ``t_j >= M = max((max_i p_i - A) / (1 + rel), largest)`` whenever it matters, hence
    ``p_j >= M (1 - rel) - A``: exactly the rows over that threshold (rounded down to float32)
    are measured again by ``_row_norms``, so the result is bit for bit the float64 maximum over
    every row, and a row over the plan's bound is never passed on a float32 value. A block with
    a value that is not finite, or with more than a quarter of its rows over the threshold (rows
    all clipped to the bound), is measured in float64 throughout. A result that is not finite is
    returned as it is (the release refuses it).
    """
    if not math.isfinite(largest):
        return largest
    k = block.shape[1]
    rel, slack = norm_error_bound(k)
    wlo, whi = torch.aminmax(w32)
    heaviest = max(-float(wlo), float(whi))
    lost = slack * heaviest + math.sqrt(k) * 2.0 ** -80
    if squares is None:
        p = torch.linalg.vector_norm(block, dim=1).mul_(w32)
    elif (math.sqrt(float(squares.max())) * heaviest + lost) * (1 + 2 * rel) <= largest:  # NaN: not passed over
        return largest
    else:
        p = squares.sqrt().mul_(w32)
    lo, hi = torch.aminmax(p)
    top = max(-float(lo), float(hi))
    if not (math.isfinite(top) and math.isfinite(heaviest)):  # an overflow, a non-finite row or weight
        return _float64_largest(block, wc, largest)
    threshold = max((top - lost) / (1 + rel), largest) * (1 - rel) - lost
    if top < threshold:  # no row of this block can reach the maximum so far
        return largest
    cut = float(np.float32(threshold))
    if cut > threshold:  # rounded up to float32: step down, so that no row at the threshold is missed
        cut = float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))
    near = torch.nonzero(p.abs_() >= cut).flatten()
    if near.numel() > block.shape[0] // 4:
        return _float64_largest(block, wc, largest)
    exact = (_row_norms(block.index_select(0, near)) * wc.index_select(0, near).to(torch.float64).abs()).max()
    return max(largest, float(exact))


def _float64_largest(block: torch.Tensor, wc: torch.Tensor, largest: float) -> float:
    value = float((_row_norms(block) * wc.to(torch.float64).abs()).max())
    return value if not math.isfinite(value) else max(largest, value)


def bytes_moved(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor) -> int:
    """The bytes ``release`` reads from memory on these rows (benchmark helper).

    Float rows other than float64 (``_float32_sum``): each row once (its block's product and
    norms then read the block from the cache), each weight once. Float64 rows
    (``_float64_sum``): each row twice, the norms and the product each reading a 10 MB block
    that no core's cache holds, each weight once. Labels: integer labels twice (their minimum
    and maximum, then each block's), boolean labels once, float labels three times with the
    check's three boolean masks written and read. Per-block temporaries (a few MB at most) stay
    in the cache and are not counted; rows that ``_largest`` measures again in float64 are
    (a handful per block on most data) not either.
    """
    n, k = Xc.shape
    rows = n * k * Xc.element_size() * (2 if Xc.dtype == torch.float64 else 1)
    if y.dtype == torch.bool:
        labels = n
    elif y.is_floating_point() or y.is_complex():
        labels = 3 * n * y.element_size() + 6 * n
    else:
        labels = 2 * n * y.element_size()
    return rows + n * wc.element_size() + labels


def release(Xc: torch.Tensor, y, wc: torch.Tensor, *, noise_std: float, randomness,
            sensitivity: float | None = None, chunk_rows: int | None = None, collective=None):
    """The one private release: sum_i y_i w_i x_i + N(0, noise_std^2 I_k).

    Args:
        Xc: [N, k] prepared rows (``prepare_rows``).
        y: [N] labels, each 0 or 1.
        wc: [N] prepared weights.
        noise_std: the plan's noise standard deviation (> 0).
        randomness: the run's ``Randomness``; the k Gaussian draws come from one generator
            seeded with 128 bits of its privacy source (the OS CSPRNG unless seeded).
        sensitivity: the plan's sensitivity; when given, the release is refused (nothing is
            returned) if the realised max ||w_i x_i|| exceeds it.
        chunk_rows: rows per block (performance only; default by device and dtype; float32
            rows: the error bound's float64 stage depends on it, ``float32_error_bound``).
        collective: with several processes (``Xc`` this rank's rows), every rank checks its
            own rows against the sensitivity, the exact sums are added across ranks, and
            rank 0 alone adds the noise, once; the other ranks return None.

    Rows in float32 (or float16, bfloat16) are summed in one pass with float32 group sums
    (``_float32_sum``, within ``float32_error_bound`` of the exact sum); float64 rows in float64.

    Returns:
        (noisy_sum [k] float64 on Xc's device, not divided by N, info) where info has
        noise_draws (= k), max_contribution (realised max_i ||w_i x_i|| over all rows,
        which does not depend on the labels), noise_std and seconds.
    """
    t0 = time.perf_counter()
    sigma = _finite("noise_std", noise_std, low=0.0, strict=True)
    if not isinstance(Xc, torch.Tensor) or Xc.dim() != 2 or Xc.shape[0] == 0:
        raise InvalidParameterError("Xc must be the [N, k] rows from prepare_rows")
    n, k = Xc.shape
    y = _check_labels(y, n, Xc.device)
    wc = torch.as_tensor(wc, device=Xc.device)
    if wc.shape != (n,):
        raise InvalidParameterError(f"wc must have shape ({n},), got {tuple(wc.shape)}")
    # `noisy` holds the exact sum until the noise is added below, in place
    chunk = None if chunk_rows is None else _count("chunk_rows", chunk_rows, low=1)
    noisy, largest = _exact_sum(Xc, y, wc, chunk_rows=chunk)
    if not math.isfinite(largest) or not bool(torch.isfinite(noisy).all()):
        raise InvalidParameterError("Xc and wc must be finite: use prepare_rows")
    if sensitivity is not None and not largest <= sensitivity:
        raise PlanMismatchError(f"a row contributes {largest!r} to the sum, more than the planned sensitivity "
                                f"{sensitivity!r}: the rows were not clipped to the plan's bounds")
    if collective is not None:
        collective.sum_([noisy])
        everyone = collective.gather_object(largest)
        if everyone is None:
            return None  # rank 0 noises the sum
        largest = max(everyone)
    u = randomness.uniform_u64(2)
    gen = np.random.Generator(np.random.PCG64((int(u[0]) << 64) | int(u[1])))
    noise = torch.as_tensor(gen.standard_normal(k), dtype=torch.float64) * sigma
    noisy += noise.to(Xc.device)  # in place: no copy of the exact sum survives this line
    return noisy, {"noise_draws": k, "max_contribution": largest, "noise_std": sigma,
                   "seconds": time.perf_counter() - t0}


def fit(Xc: torch.Tensor, noisy_sum: torch.Tensor, *, n_rows: int, steps: int, minibatch: int, lr: float,
        generator: torch.Generator, collective=None) -> torch.Tensor:
    """Hybrid-minibatch gradient descent on the released vector (post-processing; reads no labels).

    theta <- theta - lr ((1/m) sum_{j in batch} sigmoid(theta . x_j) x_j - noisy_sum / N),
    from theta = 0, each batch m rows drawn uniformly with replacement from ``generator``.

    Args:
        Xc: [N, k] prepared rows.
        noisy_sum: [k] the released vector (not yet divided by N).
        n_rows: N, the plan's dataset size; must match the rows of Xc.
        steps: gradient steps (any number is free).
        minibatch: m, rows per step.
        lr: learning rate.
        generator: torch generator for the minibatch indices.
        collective: with several processes (``Xc`` this rank's block of the N rows, every
            rank's ``generator`` seeded alike): every rank draws the same global indices,
            sums its own rows' terms, and the partial sums are added across ranks, so each
            step is the one-process step and every rank ends with the same theta.

    Returns:
        theta [k] float64 on Xc's device (last coordinate: the intercept).
    """
    n, k = Xc.shape
    block = slice(0, n)
    if collective is not None:
        block, n = collective.shard(collective.total(n)), collective.total(n)
        if block.stop - block.start != Xc.shape[0]:
            raise InvalidParameterError(f"this rank holds {Xc.shape[0]} rows, its block {block.stop - block.start}")
    if _count("n_rows", n_rows, low=1) != n:
        raise InvalidParameterError(f"n_rows is {n_rows} but Xc has {n} rows")
    steps, m = _count("steps", steps, low=0), _count("minibatch", minibatch, low=1)
    rate = _finite("lr", lr, low=0.0, strict=True)
    target = torch.as_tensor(noisy_sum, dtype=torch.float64).to(Xc.device)
    if target.shape != (k,) or not bool(torch.isfinite(target).all()):
        raise InvalidParameterError(f"noisy_sum must be {k} finite numbers, got shape {tuple(target.shape)}")
    target = target / n
    theta = torch.zeros(k, dtype=torch.float64, device=Xc.device)
    gen_device = generator.device
    for _ in range(steps):
        idx = torch.randint(0, n, (m,), generator=generator, device=gen_device).to(Xc.device)
        if collective is not None:
            idx = idx[(idx >= block.start) & (idx < block.stop)] - block.start
        xb = Xc.index_select(0, idx).to(torch.float64)
        term = xb.T @ torch.sigmoid(xb @ theta)
        if collective is not None:
            collective.sum_([term])
        theta -= rate * (term / m - target)
    return theta


def predict(theta: torch.Tensor, Xc: torch.Tensor) -> torch.Tensor:
    """Probabilities sigmoid(theta . x) for rows prepared like the training rows (``prepare_rows``)."""
    return torch.sigmoid(Xc @ torch.as_tensor(theta).to(device=Xc.device, dtype=Xc.dtype))


@dataclass(frozen=True, kw_only=True)
class WALRResult:
    """What WALR's release and fit did.

    ``rows_clipped``, ``weights_clipped`` and ``max_contribution`` depend on the data (the
    private record holds them); ``release_sha256`` is the persisted release's digest, as the
    ledger records it (None without a run session).
    """

    rows: int
    rows_clipped: int
    weights_clipped: int
    noise_std: float
    noise_draws: int
    max_contribution: float
    sensitivity: float
    release_sha256: str | None
    release_seconds: float
    fit_steps: int
    fit_seconds: float


def draw_once(draw, persist=None, collective=None):
    """The release ``draw()`` makes, drawn once: through ``persist`` (which keeps it, so a resumed
    run never draws again), else here, every rank receiving rank 0's draw."""
    if persist is not None:
        return persist(draw)
    if collective is None:
        return draw()
    return collective.broadcast_object(draw())


def run_walr(X: torch.Tensor, y, weights, params: WALRParams, randomness, *, steps: int, minibatch: int,
             lr: float, persist=None, collective=None):
    """Execute a WALR phase as planned: prepare, release once, fit.

    Args:
        X: [N, k-1] features (after any unit capping the plan requires).
        y: [N] 0/1 labels; read once, by the release.
        weights: [N] weights or None (all 1).
        params: the plan's WALR phase parameters.
        randomness: the run's ``Randomness``: the release noise first, then the fit's seed.
        steps, minibatch, lr: optimisation settings (free: post-processing).
        persist: optional ``persist(draw) -> (noisy_sum, info)`` through which the release goes
            (the trainer's run session logs its intent, saves it, and on a resumed run returns
            the saved release instead of drawing a second one). With a ``collective`` it
            must give every rank rank 0's release (``trainers.distributed.release_once``).
        collective: several processes, each with its block of the rows in rank order: the
            exact sums are added before rank 0's one noise draw, and the fit adds the ranks'
            terms at every step (``release``, ``fit``); counts are over all ranks.

    Returns:
        (theta [k], WALRResult).
    """
    if not isinstance(params, WALRParams):
        raise PlanMismatchError(f"run_walr needs the plan's WALRParams, got {type(params).__name__}")
    R, W, sens = params.row_norm_bound, params.weights_bound, params.sensitivity
    if not sens >= W * R:
        raise PlanMismatchError(f"the plan's sensitivity {sens!r} is below weights_bound * row_norm_bound = {W * R!r}")
    if not isinstance(X, torch.Tensor):
        raise InvalidParameterError(f"X must be a torch tensor, got {type(X).__name__}")
    n = X.shape[0] if collective is None else collective.total(X.shape[0])
    if n != params.dataset_size:
        raise InvalidParameterError(f"the data has {n} rows; the plan accounts N = {params.dataset_size}: re-plan "
                                    "with this N or supply the planned data")
    Xc, wc, prep = prepare_rows(X, row_norm_bound=R, weights=weights, weights_bound=W,
                                expected_features=params.features)

    def draw():
        return release(Xc, y, wc, noise_std=params.noise_std, randomness=randomness, sensitivity=sens,
                       collective=collective)

    noisy, rel = draw_once(draw, persist, collective)
    noisy = torch.as_tensor(noisy, dtype=torch.float64, device=Xc.device)
    t0 = time.perf_counter()
    seed = randomness.torch_seed()
    if collective is not None:
        seed = collective.broadcast_object(seed)  # one stream of minibatch indices for all ranks
        prep = {key: collective.total(prep[key]) for key in ("rows_clipped", "weights_clipped")}
    gen = torch.Generator(device=Xc.device).manual_seed(seed)
    theta = fit(Xc, noisy, n_rows=n, steps=steps, minibatch=minibatch, lr=lr, generator=gen, collective=collective)
    fit_seconds = time.perf_counter() - t0
    return theta, WALRResult(
        rows=n, rows_clipped=prep["rows_clipped"], weights_clipped=prep["weights_clipped"],
        noise_std=rel["noise_std"], noise_draws=rel["noise_draws"], max_contribution=rel["max_contribution"],
        sensitivity=sens, release_sha256=rel.get("sha256"), release_seconds=rel["seconds"], fit_steps=steps,
        fit_seconds=fit_seconds)


def release_throughput(n_rows: int, k: int, device="cpu", threads: int | None = None) -> dict:
    """Rows/s and bytes/s of one release over synthetic float32 rows, and of a copy of its input (benchmark helper).

    Bytes counted: what the release reads from memory (``bytes_moved``: the rows and weights
    once, the uint8 labels twice). ``input_bytes`` is the input read once (N k 4 + N 8 + N).
    Right after the release, those input bytes (rows, weights and labels) are copied once into
    buffers written beforehand (numpy on a CPU, one thread; torch on an accelerator):
    ``copy_seconds``, and ``copy_bytes_per_s`` with read + write counted, measured side by side.
    ``threads`` sets torch's threads for the release only (restored after; default: as they are).
    """

    n, k = _count("n_rows", n_rows, low=1), _count("k", k, low=1)
    g = torch.Generator(device=device).manual_seed(0)
    X = torch.rand(n, k - 1, generator=g, device=device)
    y = torch.randint(0, 2, (n,), generator=g, device=device, dtype=torch.uint8)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=math.sqrt(k))
    del X
    inputs = (Xc, wc, y)
    copies = [torch.zeros_like(t) for t in inputs]  # written once, so the copy below pays no first-touch page faults
    cuda = Xc.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(Xc.device)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(_count("threads", threads, low=1))
    try:
        t0 = time.perf_counter()
        noisy, _ = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(0))
        float(noisy[0])  # waits for the device
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)
    t0 = time.perf_counter()
    for src, dst in zip(inputs, copies, strict=True):
        if cuda:
            dst.copy_(src)
        else:
            np.copyto(dst.numpy(), src.numpy())
    if cuda:
        torch.cuda.synchronize(Xc.device)
    copy_seconds = time.perf_counter() - t0
    nbytes = bytes_moved(Xc, y, wc)
    input_bytes = sum(t.numel() * t.element_size() for t in inputs)
    return {"rows": n, "k": k, "device": str(Xc.device), "threads": threads or before, "seconds": seconds,
            "rows_per_s": n / seconds, "bytes_per_s": nbytes / seconds, "bytes_moved": nbytes,
            "input_bytes": input_bytes, "copy_seconds": copy_seconds,
            "copy_bytes_per_s": 2 * input_bytes / copy_seconds}
