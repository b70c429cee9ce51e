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

__all__ = ["WALRResult", "bytes_moved", "draw_once", "fit", "predict", "prepare_rows", "release", "release_throughput",
           "run_walr"]

# rows per float64 block. On CPU 2^16 x k x 8 bytes (10 MB at k = 20) stays in cache; with one reused buffer the
# release of 16M x 20 rows takes 0.16 s on 2 cores, against 2.5 s converting 2^20-row blocks afresh. On an
# accelerator larger blocks mean fewer kernel launches.
_CHUNK_ROWS = 1 << 16
_CHUNK_ROWS_ACCELERATOR = 1 << 22


def _default_chunk(device: torch.device) -> int:
    return _CHUNK_ROWS if device.type == "cpu" else _CHUNK_ROWS_ACCELERATOR


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
    ok = (y == 0) | (y == 1)
    if not bool(ok.all()):
        raise InvalidParameterError(f"labels must be 0 or 1, got {_first_bad('y', ~ok, y)}")
    return y


def _exact_sum(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor, *, chunk_rows: int):
    """(sum_i y_i w_i x_i, max_i ||w_i x_i||) in float64, in row blocks.

    Private to ``release``: the exact sum must be noised before anything sees it.

    Each block is read once from memory: rows that are not float64 are copied into one reused
    float64 block (cache-resident on a CPU), whose norms and product are then taken; float64
    rows are used in place. The sum must be float64: a float32 sum over a block of m rows can be
    off by up to about m^2 2^-24 W R in the worst case, so one label flip could move the computed
    sum by more than its own row's W R, the sensitivity the plan accounts for (float64 keeps that
    below 1e-6 W R at 2^16 rows). Float32 norms first, with a float64 recheck of the rows near
    the maximum, were measured slower on a CPU than the float64 norms of the block already in
    cache (the per-row reduction, not memory, bounds both), so the norms are float64 too.
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


def bytes_moved(Xc: torch.Tensor, y: torch.Tensor, wc: torch.Tensor) -> int:
    """The bytes ``release`` reads and writes on these rows, cache-resident blocks included (benchmark helper).

    Per row: the row read once (by the copy into the float64 block, or by the norms for float64
    rows), the float64 copy written and read twice (norms, sum; float64 rows: read once more in
    place instead), the weight read once, the label read three times (two checks for 0 or 1,
    then the per-block copy) with the check's three boolean masks written and read once each,
    and the float64 product ``y w`` written, read and written by the scaling, and read by the sum.
    """
    n, k = Xc.shape
    rows = n * k * Xc.element_size()
    block = 2 * rows if Xc.dtype == torch.float64 else rows + 3 * n * k * 8
    return block + n * wc.element_size() + 3 * n * y.element_size() + 6 * n + 4 * n * 8


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
        chunk_rows: rows per float64 block (performance only; default by device).
        collective: with several processes (``Xc`` this rank's rows), every rank checks its
            own rows against the sensitivity, the exact sums are added across ranks, and
            rank 0 alone adds the noise, once; the other ranks return None.

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
    chunk = _default_chunk(Xc.device) if chunk_rows is None else _count("chunk_rows", chunk_rows, low=1)
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


def release_throughput(n_rows: int, k: int, device="cpu") -> dict:
    """Rows/s and bytes/s of one release over synthetic float32 rows, and of a copy of those rows (benchmark helper).

    Bytes counted: every byte the release reads or writes (``bytes_moved``): the rows once, the
    float64 block written and read twice, the weights once and the labels three times.
    ``input_bytes`` is the input read once (N k 4 + N 8 + N), what a single pass would move. Right after the release,
    the same prepared rows are copied once into a buffer written beforehand (numpy on a CPU,
    torch on an accelerator; read + write counted): ``copy_bytes_per_s``, measured side by side.
    """

    n, k = _count("n_rows", n_rows, low=1), _count("k", k, low=1)
    g = torch.Generator(device=device).manual_seed(0)
    X = torch.rand(n, k - 1, generator=g, device=device)
    y = torch.randint(0, 2, (n,), generator=g, device=device, dtype=torch.uint8)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=math.sqrt(k))
    del X
    dst = torch.zeros_like(Xc)  # written once, so the copy below pays no first-touch page faults
    cuda = Xc.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(Xc.device)
    t0 = time.perf_counter()
    noisy, _ = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(0))
    float(noisy[0])  # waits for the device
    seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    if cuda:
        dst.copy_(Xc)
        torch.cuda.synchronize(Xc.device)
    else:
        np.copyto(dst.numpy(), Xc.numpy())
    copy_seconds = time.perf_counter() - t0
    nbytes = bytes_moved(Xc, y, wc)
    return {"rows": n, "k": k, "device": str(Xc.device), "seconds": seconds, "rows_per_s": n / seconds,
            "bytes_per_s": nbytes / seconds, "bytes_moved": nbytes,
            "input_bytes": n * k * Xc.element_size() + n * wc.element_size() + n * y.element_size(),
            "copy_seconds": copy_seconds, "copy_bytes_per_s": 2 * Xc.numel() * Xc.element_size() / copy_seconds}
