"""WALR: clipping enforces the planned sensitivity, one unbiased Gaussian release, label-free descent.

Statistical assertions state their false-alarm rate; every one is at most 1e-6 per run and
the data are seeded, so a failure means a bug, not bad luck.
"""

import dataclasses
import inspect
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from budgetplan.errors import PlanMismatchError
from trainers.randomness import Randomness
from trainers.walr import (
    bytes_moved,
    fit,
    float32_error_bound,
    predict,
    prepare_rows,
    release,
    release_throughput,
    run_walr,
)

ALARM = 1e-6


def _norms(Xc):
    return torch.linalg.vector_norm(Xc.to(torch.float64), dim=1)


def _exact(Xc, y, wc):
    """sum_i y_i w_i x_i by an independent path: math.fsum per coordinate."""
    x = Xc.to(torch.float64).numpy()
    c = np.asarray(y, dtype=np.float64) * wc.numpy()
    return np.array([math.fsum(x[:, j] * c) for j in range(x.shape[1])])


# ---- prepare_rows: clipping -------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_clipping_bounds_every_row_and_keeps_the_rest(dtype):
    g = torch.Generator().manual_seed(0)
    X = (torch.randn(5000, 6, generator=g) * torch.rand(5000, 1, generator=g) * 3).to(dtype)
    before = X.clone()
    R = 2.5
    Xc, wc, info = prepare_rows(X, row_norm_bound=R)
    assert torch.equal(X, before)  # the input is not modified
    assert Xc.shape == (5000, 7) and Xc.dtype == dtype and info["k"] == 7
    full = torch.cat([X, torch.ones(5000, 1, dtype=dtype)], dim=1)
    outside = _norms(full) > R
    assert info["rows_clipped"] == int(outside.sum()) and 0 < info["rows_clipped"] < 5000
    assert bool((_norms(Xc) <= R).all())  # intercept included
    assert torch.equal(Xc[~outside], full[~outside])  # bit for bit
    # clipped rows keep their direction and land on the bound (up to the dtype's rounding)
    clipped, orig = Xc[outside].double(), full[outside].double()
    tol = 2 * torch.finfo(dtype).eps
    assert torch.allclose(_norms(clipped), torch.full((len(clipped),), R, dtype=torch.float64), rtol=tol, atol=0)
    assert torch.allclose(clipped / _norms(clipped)[:, None], orig / _norms(orig)[:, None], rtol=0, atol=tol * 4)
    assert torch.equal(wc, torch.ones(5000, dtype=torch.float64)) and info["weights_clipped"] == 0


def test_the_intercept_is_clipped_with_its_row():
    Xc, _, info = prepare_rows(torch.tensor([[3.0, 4.0], [0.0, 0.0]]), row_norm_bound=1.0)
    assert info["rows_clipped"] == 1
    assert torch.equal(Xc[1], torch.tensor([0.0, 0.0, 1.0]))
    assert _norms(Xc)[0] <= 1.0 and Xc[0, 2] < 0.2  # the intercept shrank with the row


def test_weights_are_clipped_and_counted():
    X = torch.zeros(4, 2)
    _, wc, info = prepare_rows(X, row_norm_bound=1.0, weights=torch.tensor([0.0, 0.5, 2.0, 7.0]), weights_bound=1.5)
    assert wc.tolist() == [0.0, 0.5, 1.5, 1.5] and info["weights_clipped"] == 2
    _, wc, info = prepare_rows(X, row_norm_bound=1.0, weights_bound=0.25)  # default weights 1, bound below 1
    assert wc.tolist() == [0.25] * 4 and info["weights_clipped"] == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"X": torch.tensor([[1.0], [float("nan")]])}, "X must hold finite features: row 1 has nan"),
    ({"X": torch.tensor([[float("inf")]])}, "row 0 has inf"),
    ({"X": torch.tensor([[1.0], [1e200]], dtype=torch.float64)}, "X row 1 is too large to clip"),
    ({"row_norm_bound": 0.9}, "row_norm_bound must be a finite number >= 1, got 0.9"),
    ({"row_norm_bound": float("nan")}, "row_norm_bound must be a finite number >= 1, got nan"),
    ({"expected_features": 5}, "features: the plan declares 5 features"),
    ({"weights": torch.tensor([1.0, -0.5, -2.0]), "weights_bound": 1.0}, "weights[1] = -0.5"),
    ({"weights": torch.tensor([1.0, 1.0, float("nan")]), "weights_bound": 1.0}, "weights[2] = nan"),
    ({"weights": torch.ones(3)}, "weights_bound is required"),
    ({"weights": torch.ones(3), "weights_bound": 0.0}, "weights_bound must be a finite number > 0"),
    ({"weights": torch.ones(2), "weights_bound": 1.0}, "weights must have shape (3,)"),
    ({"X": torch.zeros(3)}, "X must be a 2-D torch tensor"),
])
def test_prepare_refusals(kwargs, message):
    args = {"X": torch.zeros(3, 2), "row_norm_bound": 2.0} | kwargs
    with pytest.raises(ValueError) as err:
        prepare_rows(args.pop("X"), **args)
    assert message in str(err.value) and "\n" not in str(err.value)


# ---- release: unbiased, the right spread, one draw of k -------------------------------


@pytest.fixture(scope="module")
def small():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(300, 3, generator=g)
    w = torch.rand(300, generator=g, dtype=torch.float64) * 2
    Xc, wc, _ = prepare_rows(X, row_norm_bound=2.0, weights=w, weights_bound=1.5)
    y = (torch.rand(300, generator=g) < 0.4).to(torch.int64)
    return Xc, y, wc


def test_release_is_unbiased_with_the_planned_spread(small):
    Xc, y, wc = small
    sigma, reps = 0.7, 4000
    exact = _exact(Xc, y, wc)
    d = np.stack([release(Xc, y, wc, noise_std=sigma, randomness=Randomness(s))[0].numpy() - exact
                  for s in range(reps)]) / sigma
    k = d.shape[1]
    # mean: sum over coordinates of z^2 with z = sqrt(reps) mean ~ chi2(k); one-sided, false alarm 1e-6
    assert stats.chi2.sf(float((reps * d.mean(0) ** 2).sum()), k) > ALARM
    # spread per coordinate: sum d^2 ~ chi2(reps) when the std is sigma; two-sided, false alarm 1e-6 each
    for j in range(k):
        q = float((d[:, j] ** 2).sum())
        assert ALARM / 2 < stats.chi2.cdf(q, reps) < 1 - ALARM / 2
    # shape: Gaussian (KS, false alarm 1e-6), and coordinates uncorrelated (|r| < 0.09: z > 5.7)
    assert stats.kstest(d.ravel(), "norm").pvalue > ALARM
    r = np.corrcoef(d.T)
    assert np.abs(r[np.triu_indices(k, 1)]).max() < 0.09


class _Counting(Randomness):
    def __init__(self, seed):
        super().__init__(seed)
        self.calls = []

    def uniform_u64(self, n):
        self.calls.append(("uniform_u64", n))
        return super().uniform_u64(n)

    def generator(self):
        self.calls.append(("generator",))
        return super().generator()

    def torch_seed(self):
        self.calls.append(("torch_seed",))
        return super().torch_seed()


def test_noise_is_drawn_once_per_release(small):
    Xc, y, wc = small
    rnd = _Counting(3)
    noisy, info = release(Xc, y, wc, noise_std=1.0, randomness=rnd)
    assert rnd.calls == [("uniform_u64", 2)]  # one 128-bit seed, one generator, k normal draws
    assert info["noise_draws"] == Xc.shape[1] == noisy.shape[0] and noisy.dtype == torch.float64
    assert set(info) == {"noise_draws", "max_contribution", "noise_std", "seconds"}  # nothing label-dependent
    assert not np.allclose(noisy.numpy(), _exact(Xc, y, wc))


def _old_float64_release(Xc, y, wc, sigma, seed, chunk=1 << 16):
    """The float64 release as it was before the float32 path: float64 blocks of 2^16 rows, then the noise."""
    total = torch.zeros(Xc.shape[1], dtype=torch.float64)
    for a in range(0, Xc.shape[0], chunk):
        total += (torch.as_tensor(y[a:a + chunk]).to(torch.float64) * wc[a:a + chunk]) @ Xc[a:a + chunk]
    u = Randomness(seed).uniform_u64(2)
    gen = np.random.Generator(np.random.PCG64((int(u[0]) << 64) | int(u[1])))
    return total + torch.as_tensor(gen.standard_normal(Xc.shape[1])) * sigma


def test_float64_rows_release_as_before_bit_for_bit():
    # 2^18 float64 rows whose float32 running sum would lose the small parts; compared with math.fsum
    n = 1 << 18
    g = torch.Generator().manual_seed(2)
    X = torch.cat([torch.rand(n, 1, generator=g, dtype=torch.float64) * 1e-3 + 0.5,
                   torch.rand(n, 1, generator=g, dtype=torch.float64)], dim=1)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=2.0)
    y = (torch.rand(n, generator=g) < 0.5).to(torch.uint8)
    a, _ = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(9))
    assert torch.equal(a, _old_float64_release(Xc, y, wc, 1.0, 9))  # the same seed gives the same release
    b, _ = release(Xc, torch.zeros(n, dtype=torch.uint8), wc, noise_std=1.0, randomness=Randomness(9))
    assert np.allclose((a - b).numpy(), _exact(Xc, y, wc), rtol=1e-13, atol=0)
    # a planted float32 sum of the same rows is caught by that tolerance
    wrong = (y.float() @ Xc.float()).double()
    assert not np.allclose(wrong.numpy(), _exact(Xc, y, wc), rtol=1e-13, atol=0)


def _float32_error(Xc, y, wc, chunk_rows=None):
    """|release - exact sum| (2-norm), its stated bound, and the bound of a 4,096-row group, for these rows."""
    n = Xc.shape[0]
    kw = {"noise_std": 1e-3, "chunk_rows": chunk_rows}
    a, _ = release(Xc, y, wc, randomness=Randomness(5), **kw)
    b, _ = release(Xc, torch.zeros(n, dtype=torch.uint8), wc, randomness=Randomness(5), **kw)  # the noise alone
    exact = _exact(Xc, y, wc)
    x = Xc.to(torch.float64)
    norms = _norms(x).numpy()
    yv = np.asarray(y, dtype=np.float64)
    T = float(yv @ (np.abs(wc.numpy()) * norms))
    Z = float(yv @ (norms + math.sqrt(x.shape[1])))
    rel, tiny = float32_error_bound(n, chunk_rows or (1 << 14))
    slack = 4 * np.finfo(np.float64).eps * (np.abs(a.numpy()).max() + np.abs(b.numpy()).max())  # a - b rounds
    return float(np.linalg.norm((a - b).numpy() - exact)), rel * T + tiny * Z + slack, T


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3000), k=st.integers(1, 24), dtype=st.sampled_from([torch.float32, torch.bfloat16,
                                                                              torch.float16]),
       chunk=st.sampled_from([None, 1, 31, 64, 1000]), kind=st.sampled_from(["random", "equal", "bound", "wide"]),
       seed=st.integers(0, 2**32 - 1))
def test_float32_release_is_within_its_stated_bound(n, k, dtype, chunk, kind, seed):
    rng = np.random.default_rng(seed)
    R = 3.0
    if kind == "equal":  # large equal rows: every float32 partial sum rounds the same way
        X = np.tile(rng.standard_normal(k) * 1e3 + 0.1, (n, 1))
    elif kind == "wide":
        span = 8 if dtype == torch.float16 else 20  # float16 overflows above 65504
        X = rng.standard_normal((n, k)) * np.exp(rng.uniform(-span, span, (n, 1)))
    else:
        X = rng.standard_normal((n, k)) * (10 if kind == "bound" else 0.3)  # "bound": nearly every row clipped to R
    Xc, wc, _ = prepare_rows(torch.as_tensor(X, dtype=torch.float64).to(dtype)[:, : k - 1] if k > 1
                             else torch.zeros(n, 0, dtype=dtype), row_norm_bound=R,
                             weights=torch.as_tensor(rng.uniform(0, 2, n)), weights_bound=1.5)
    y = torch.as_tensor(rng.integers(0, 2, n)) if kind != "equal" else torch.ones(n, dtype=torch.int64)
    error, bound, _ = _float32_error(Xc, y, wc, chunk)
    assert error <= bound
    _, info = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(0), sensitivity=1.5 * R)
    assert info["max_contribution"] == float((_norms(Xc) * wc).max()) <= 1.5 * R


def test_the_float32_bound_holds_on_large_equal_rows_and_a_long_group_breaks_it(monkeypatch):
    import trainers.walr as walr

    n, k = 1 << 14, 8
    row = torch.full((k - 1,), 0.1 + 2.0 ** -20, dtype=torch.float32)  # a full mantissa: each partial sum rounds
    Xc, wc, _ = prepare_rows(row.repeat(n, 1) * 100, row_norm_bound=1.0)  # every row clipped to the bound
    y = torch.ones(n, dtype=torch.uint8)
    error, bound, T = _float32_error(Xc, y, wc)
    assert 0 < error <= bound and bound < 3e-6 * T
    # the noise's standard deviation sigma R dwarfs one group's worst case: 2 gamma_33 32 R = 1.3e-4 R
    rel, _ = float32_error_bound(n)
    assert 2 * rel * 32 < 1.3e-4
    # planted: float32 sums over groups of 4,096 rows instead of 32 exceed the bound stated for 32
    monkeypatch.setattr(walr, "_GROUP_ROWS", 4096)
    error, _, _ = _float32_error(Xc, y, wc)
    assert error > bound


def test_one_label_moves_the_float32_release_by_its_group_bound_only():
    """The privacy claim of ``float32_error_bound``: flipping one label changes one group's float32 sum only,
    so the release moves by w_i x_i within 2 gamma_33 32 W R (plus float64 terms), far inside the global bound."""
    n, k, R = 1 << 14, 8, 1.0
    row = torch.full((k - 1,), 0.1 + 2.0 ** -20, dtype=torch.float32)
    Xc, wc, _ = prepare_rows(row.repeat(n, 1) * 100, row_norm_bound=R)  # equal rows at the bound: the worst case
    y = torch.ones(n, dtype=torch.uint8)
    rel, _ = float32_error_bound(n)
    group = 2 * (33 * 2.0 ** -24 / (1 - 33 * 2.0 ** -24)) * 32 * R
    float64 = 2 * 600 * 2.0 ** -53 * n * R + 8 * np.finfo(np.float64).eps * n * R  # block sums, fsum, a - b
    a, _ = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(1))
    for i in (0, 31, 32, 5000, n - 1):
        y2 = y.clone()
        y2[i] = 0
        b, _ = release(Xc, y2, wc, noise_std=1.0, randomness=Randomness(1))
        moved = float(np.linalg.norm((a - b).numpy() - Xc[i].double().numpy()))
        assert moved <= group + float64 < rel * n * R / 100


def test_float32_release_moves_within_the_bound_and_far_below_the_noise():
    g = torch.Generator().manual_seed(6)
    X = torch.rand(20_000, 9, generator=g)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=4.0)
    y = torch.randint(0, 2, (20_000,), generator=g)
    a, _ = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(3))
    before = _old_float64_release(Xc.double(), y, wc, 1.0, 3)  # the float64 path's release of the same rows
    rel, _ = float32_error_bound(20_000)
    T = float(y.double() @ _norms(Xc))
    moved = float(np.linalg.norm((a - before).numpy()))
    assert 0 < moved <= rel * T + 1e-9 and moved < 1e-3  # noise std 1: a thousandth of it at most


def test_release_refusals(small):
    Xc, y, wc = small
    kw = {"noise_std": 1.0, "randomness": Randomness(0)}
    for bad, shown in ((2, "y[5] = 2"), (-1, "y[5] = -1")):
        y2 = y.clone()
        y2[5] = bad
        with pytest.raises(ValueError, match=rf"labels must be 0 or 1, got {re.escape(shown)}"):
            release(Xc, y2, wc, **kw)
    with pytest.raises(ValueError, match="labels must be 0 or 1"):
        release(Xc, torch.full((300,), 0.5), wc, **kw)
    with pytest.raises(ValueError, match=r"y must have shape \(300,\)"):
        release(Xc, y[:10], wc, **kw)
    for sigma in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_std must be a finite number > 0"):
            release(Xc, y, wc, noise_std=sigma, randomness=Randomness(0))
    # rows that were never clipped to the plan: refused, nothing released
    with pytest.raises(PlanMismatchError, match="more than the planned sensitivity 1"):
        release(Xc, y, wc, sensitivity=1.0, **kw)
    assert release(Xc, y, wc, sensitivity=1.5 * 2.0, **kw)[1]["max_contribution"] <= 3.0
    # a negative weight slipped past prepare_rows still counts by its size
    with pytest.raises(PlanMismatchError, match="more than the planned sensitivity"):
        release(Xc, y, torch.where(torch.arange(300) == 7, -10.0, 1.0).double(), sensitivity=3.0, **kw)


# ---- the sensitivity claim ------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), d=st.integers(0, 5), scale=st.floats(1e-3, 1e3), R=st.floats(1.0, 10.0),
       W=st.floats(0.05, 5.0), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_one_label_moves_the_sum_by_w_i_x_i_within_the_bound(n, d, scale, R, W, seed, data):
    rng = np.random.default_rng(seed)
    X = torch.as_tensor(rng.standard_normal((n, d)) * scale, dtype=torch.float32)
    w = torch.as_tensor(rng.exponential(W, n))
    Xc, wc, _ = prepare_rows(X, row_norm_bound=R, weights=w, weights_bound=W)
    assert bool((_norms(Xc) <= R).all()) and bool((wc <= W).all())
    i = data.draw(st.integers(0, n - 1))
    y = torch.as_tensor(rng.integers(0, 2, n))
    y2 = y.clone()
    y2[i] = 1 - y2[i]
    before, after = _exact(Xc, y, wc), _exact(Xc, y2, wc)
    exact_change = after - before  # each sum correctly rounded: the difference is good to a few ulps of the sums
    ulps = 4 * np.finfo(np.float64).eps * np.abs(np.concatenate([before, after])).max()
    step = wc[i].item() * Xc[i].double().numpy() * (1 if y2[i] == 1 else -1)
    assert np.allclose(exact_change, step, rtol=1e-13, atol=ulps + 1e-300)  # w_i x_i, not 2 w_i x_i
    assert np.linalg.norm(step) <= W * R * (1 + 1e-15)
    # through the release itself (float32 rows: within the stated bound of each sum); the same seed, the same noise
    a, info = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(seed), sensitivity=W * R)
    b, _ = release(Xc, y2, wc, noise_std=1.0, randomness=Randomness(seed), sensitivity=W * R)
    rel, tiny = float32_error_bound(n)
    contributions = wc.numpy() * _norms(Xc).numpy()
    allowed = rel * (y.numpy() @ contributions + y2.numpy() @ contributions) + tiny * 2 * n * (R + math.sqrt(d + 1))
    allowed += 4 * np.finfo(np.float64).eps * (1 + np.abs(a.numpy()).max() + np.abs(b.numpy()).max())
    assert np.linalg.norm((b - a).numpy() - exact_change) <= allowed
    assert info["max_contribution"] <= W * R


# ---- fit: label-free hybrid minibatch descent -----------------------------------------


def test_fit_takes_no_labels():
    params = set(inspect.signature(fit).parameters)
    assert params == {"Xc", "noisy_sum", "n_rows", "steps", "minibatch", "lr", "generator", "collective"}


def _logistic_data(n=20000, seed=4):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g)
    true = torch.tensor([1.5, -2.0, 0.5, -0.3], dtype=torch.float64)
    Xc, wc, _ = prepare_rows(X, row_norm_bound=3.0)
    p = torch.sigmoid(Xc.double() @ true)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).to(torch.int64)
    return Xc, y, wc


def _newton_mle(Xc, y, iters=30):
    x, t = Xc.double().numpy(), y.numpy().astype(np.float64)
    theta = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-x @ theta))
        theta -= np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x, x.T @ (p - t))
    return theta


def _log_loss(theta, Xc, y):
    p = predict(torch.as_tensor(theta), Xc.double()).numpy()
    t = y.numpy()
    return float(-np.mean(t * np.log(p) + (1 - t) * np.log1p(-p)))


def test_fit_on_the_clean_sum_approaches_logistic_regression():
    Xc, y, wc = _logistic_data()
    n = Xc.shape[0]
    clean = torch.as_tensor(_exact(Xc, y, wc))  # zero noise: the test computes the sum itself
    theta = fit(Xc, clean, n_rows=n, steps=3000, minibatch=2048, lr=2.0, generator=torch.Generator().manual_seed(0))
    mle = _newton_mle(Xc, y)
    assert _log_loss(theta, Xc, y) - _log_loss(mle, Xc, y) < 2e-3
    p_fit = predict(theta, Xc).numpy()
    p_mle = predict(torch.as_tensor(mle), Xc).numpy()
    assert np.abs(p_fit - p_mle).max() < 0.05 and np.abs(p_fit - p_mle).mean() < 0.01
    # full batch (m = N) on the clean sum is ordinary gradient descent: it reaches the MLE
    full = fit(Xc, clean, n_rows=n, steps=400, minibatch=n, lr=4.0, generator=torch.Generator().manual_seed(0))
    assert np.abs(full.numpy() - mle).max() < 0.05


def test_fit_validates():
    Xc, _, _ = prepare_rows(torch.zeros(10, 2), row_norm_bound=1.0)
    g = torch.Generator().manual_seed(0)
    base = {"n_rows": 10, "steps": 5, "minibatch": 4, "lr": 0.1, "generator": g}
    assert torch.equal(fit(Xc, torch.zeros(3), **base | {"steps": 0}), torch.zeros(3, dtype=torch.float64))
    for change, message in (({"n_rows": 11}, "n_rows is 11 but Xc has 10 rows"), ({"lr": 0.0}, "lr must be"),
                            ({"minibatch": 0}, "minibatch must be an integer >= 1"),
                            ({"steps": 1.5}, "steps must be an integer")):
        with pytest.raises(ValueError, match=re.escape(message)):
            fit(Xc, torch.zeros(3), **base | change)
    with pytest.raises(ValueError, match="noisy_sum must be 3 finite numbers"):
        fit(Xc, torch.zeros(4), **base)


# ---- run_walr: the phase as planned ---------------------------------------------------


def _plan_parameters(n):
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario import examples, parse_scenario

    text = examples.text("walr").replace("dataset_size = 1000000", f"dataset_size = {n}")
    return build_plan(parse_scenario(text)).phases[0].params


@pytest.fixture(scope="module")
def planned():
    n = 4000
    par = _plan_parameters(n)
    g = torch.Generator().manual_seed(5)
    X = torch.rand(n, par.features - 1, generator=g)
    X[:10] *= 3  # some rows outside sqrt(20)
    y = (torch.rand(n, generator=g) < 0.3).to(torch.int64)
    return X, y, par


def test_run_walr_record(planned):
    X, y, par = planned
    theta, rec = run_walr(X, y, None, par, Randomness(1), steps=50, minibatch=256, lr=0.5)
    assert theta.shape == (par.features,)
    assert rec.rows == 4000 and rec.rows_clipped == 10 and rec.weights_clipped == 0
    assert rec.noise_std == par.noise_std and rec.noise_draws == 20 and rec.fit_steps == 50
    assert rec.max_contribution <= par.sensitivity


def test_seeded_runs_reproduce_and_csprng_runs_do_not(planned):
    X, y, par = planned
    a, ra = run_walr(X, y, None, par, Randomness(7), steps=20, minibatch=64, lr=0.5)
    b, rb = run_walr(X, y, None, par, Randomness(7), steps=20, minibatch=64, lr=0.5)
    assert torch.equal(a, b)
    assert dataclasses.replace(ra, release_seconds=0, fit_seconds=0) == dataclasses.replace(rb, release_seconds=0,
                                                                                             fit_seconds=0)
    c, _ = run_walr(X, y, None, par, Randomness(), steps=20, minibatch=64, lr=0.5)
    d, _ = run_walr(X, y, None, par, Randomness(), steps=20, minibatch=64, lr=0.5)
    assert not torch.equal(c, d) and not torch.equal(a, c)


def test_run_walr_refuses_data_off_plan(planned):
    X, y, par = planned
    kw = {"steps": 1, "minibatch": 8, "lr": 0.1}
    with pytest.raises(ValueError, match="the data has 3999 rows; the plan accounts N = 4000"):
        run_walr(X[:-1], y[:-1], None, par, Randomness(0), **kw)
    with pytest.raises(ValueError, match="features: the plan declares 20 features"):
        run_walr(X[:, :-1], y, None, par, Randomness(0), **kw)
    with pytest.raises(PlanMismatchError, match="below weights_bound"):
        run_walr(X, y, None, dataclasses.replace(par, sensitivity=1.0), Randomness(0), **kw)
    with pytest.raises(PlanMismatchError, match="needs the plan's WALRParams"):
        run_walr(X, y, None, {"noise_std": 1.0}, Randomness(0), **kw)


def test_release_throughput_runs():
    r = release_throughput(10_000, 5, "cpu")
    assert r["rows"] == 10_000 and r["k"] == 5 and r["rows_per_s"] > 0 and r["bytes_per_s"] > r["rows_per_s"]
    # the rows and weights read once, the uint8 labels twice (their check, then the sum)
    assert r["bytes_moved"] == 10_000 * (5 * 4 + 8 + 2) > r["input_bytes"] == 10_000 * (5 * 4 + 9)
    assert r["copy_bytes_per_s"] > 0 and r["copy_seconds"] > 0


# ---- the release's largest contribution: the float64 maximum, bit for bit -----------------------------


@pytest.fixture(params=[1, 2], ids=["one-thread", "two-threads"])
def threads(request):
    """torch's threads for the release: one takes the CPU's numpy squared norms, several torch's row norm."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _adversarial_rows(k: int = 20, seed: int = 0) -> torch.Tensor:
    """float32 rows where float32 norms are hard: near-ties, wide ranges, equal coordinates, subnormal squares."""
    g = torch.Generator().manual_seed(seed)
    n = 4096
    ties = 3.0 + torch.randint(-64, 65, (n, k), generator=g).to(torch.float32) * 2.0 ** -22  # within ulps
    wide = torch.randn(n, k, generator=g) * torch.logspace(-30, 18, k)[torch.randperm(k, generator=g)]
    equal = torch.full((n, k), 1.0 + 2.0 ** -23) * torch.rand(n, 1, generator=g)
    tiny = torch.randn(n, k, generator=g) * 1e-21  # squares below float32's smallest normal
    huge = torch.randn(n, k, generator=g) * 1e18
    return torch.cat([ties, wide, equal, tiny, huge])


@pytest.mark.parametrize("chunk_rows", [64, 1000, 1 << 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_largest_contribution_is_the_float64_maximum_bit_for_bit(chunk_rows, seed, threads):
    g = torch.Generator().manual_seed(seed)
    X = _adversarial_rows(seed=seed)
    X = X[torch.randperm(X.shape[0], generator=g)]
    w = torch.rand(X.shape[0], generator=g, dtype=torch.float64) * 3
    w[::7] = 0.0
    w[::11] = 1.0
    y = torch.randint(0, 2, (X.shape[0],), generator=g)
    want = float((_norms(X) * w).max())
    _, info = release(X, y, w, noise_std=1.0, randomness=Randomness(0), chunk_rows=chunk_rows)
    assert info["max_contribution"] == want
    # weights at float32's extremes: subnormal when rounded, and large enough to overflow a product
    w[::5] = 1e-40
    w[::13] = 1e30
    _, info = release(X, y, w, noise_std=1.0, randomness=Randomness(0), chunk_rows=chunk_rows)
    assert info["max_contribution"] == float((_norms(X) * w).max())
    # only the near-ties block: float32 orders some rows the other way round from float64, yet the maximum is exact
    ties = _adversarial_rows(seed=seed)[:4096]
    ones = torch.ones(4096, dtype=torch.float64)
    f32, f64 = torch.linalg.vector_norm(ties, dim=1).double(), _norms(ties)
    assert bool(((f32[:, None] > f32[None, :]) & (f64[:, None] < f64[None, :])).any())
    _, info = release(ties, y[:4096], ones, noise_std=1.0, randomness=Randomness(0), chunk_rows=chunk_rows)
    assert info["max_contribution"] == float(_norms(ties).max())


def test_cpu_squared_norms_are_within_the_norm_bound():
    """The float32 squared norms the CPU release screens rows with (numpy squares, a BLAS row sum) stay within
    ``norm_error_bound`` of the float64 norms on adversarial rows, block offsets and a partial last square."""
    import trainers.walr as walr

    big = torch.zeros(3, 20)
    big[:2] = 5e18  # each square finite, their sum over float32's range
    big[2, 0] = 3e19  # a square over it
    X = torch.cat([_adversarial_rows(seed=4), big])
    k = X.shape[1]
    rel, slack = walr.norm_error_bound(k)
    want = _norms(X)
    squares = walr._cpu_squares(X, 5000)  # 4,096 rows squared at a time: a block of 5,000 takes two
    with np.errstate(over="ignore"):  # as the release calls it
        got = torch.cat([squares(a, min(5000, X.shape[0] - a)).clone() for a in range(0, X.shape[0], 5000)]).double()
    finite = torch.isfinite(got)
    assert int((~finite).sum()) == int((want > 1.85e19).sum()) == 3  # over float32's range: inf, measured again
    assert bool(finite[want < 1.84e19].all())
    allowed = rel * want + slack + math.sqrt(k) * 2.0 ** -80
    assert bool(((got[finite].sqrt() - want[finite]).abs() <= allowed[finite]).all())
    # planted: squared norms summed in bfloat16 are caught by that bound
    coarse = got[finite].sqrt().to(torch.bfloat16).double()
    assert not bool(((coarse - want[finite]).abs() <= allowed[finite]).all())


def test_a_block_is_passed_over_only_below_the_maximum_with_its_error_bound(monkeypatch):
    """The CPU release passes over a block on its largest float32 squared norm; the bound's margin is what makes
    that exact: two rows whose float64 norms differ by less than float32 can tell, one block each."""
    import trainers.walr as walr

    g = torch.Generator().manual_seed(0)
    X = 3.0 + torch.randint(-64, 65, (4096, 20), generator=g).to(torch.float32) * 2.0 ** -22
    t = _norms(X)
    one = walr._cpu_squares(X, 1)  # as the release below squares them: one row per block
    f32 = torch.tensor([float(one(a, 1)[0]) for a in range(X.shape[0])], dtype=torch.float64).sqrt()
    order = torch.argsort(t).tolist()
    # the first neighbours in float64 order whose larger row's float32 norm is not above the smaller's float64 norm
    i, j = next((a, b) for a, b in zip(order, order[1:], strict=False) if t[b] > t[a] and f32[b] <= t[a])
    rows, y, w = X[[i, j]], torch.ones(2), torch.ones(2, dtype=torch.float64)
    kw = {"noise_std": 1.0, "randomness": Randomness(0), "chunk_rows": 1}
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the one-thread path, whatever the test runner's
    assert release(rows, y, w, **kw)[1]["max_contribution"] == float(t[j]) > float(t[i])
    # planted: the same screening without its error margins passes the second block over and misses the larger row
    monkeypatch.setattr(walr, "norm_error_bound", lambda k: (0.0, 0.0))
    assert release(rows, y, w, **kw)[1]["max_contribution"] == float(t[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_row_one_ulp_over_the_bound_is_refused(dtype, threads):
    """The sensitivity check decides on the float64 value of every row, whatever the rows' dtype."""
    g = torch.Generator().manual_seed(3)
    X = (1.0 + torch.rand(5000, 8, generator=g) * 0.01).to(dtype)
    y = torch.randint(0, 2, (5000,), generator=g)
    w = torch.ones(5000, dtype=torch.float64)
    top = float(_norms(X).max())
    assert release(X, y, w, noise_std=1.0, randomness=Randomness(0), sensitivity=top)[1]["max_contribution"] == top
    with pytest.raises(PlanMismatchError, match="more than the planned sensitivity"):
        release(X, y, w, noise_std=1.0, randomness=Randomness(0), sensitivity=math.nextafter(top, 0.0))


def test_rows_clipped_to_the_bound_and_rows_whose_float32_squares_overflow(threads):
    X = torch.randn(3000, 6, generator=torch.Generator().manual_seed(4)).abs() + 0.5
    Xc, wc, _ = prepare_rows(X * 10, row_norm_bound=2.0)  # every row clipped to about 2: all near the maximum
    y = torch.ones(3000)
    _, info = release(Xc, y, wc, noise_std=1.0, randomness=Randomness(0), sensitivity=2.0)
    assert info["max_contribution"] == float((_norms(Xc) * wc).max()) <= 2.0
    big = torch.full((10, 3), 3e19)  # float32 squares overflow; float64 does not
    _, info = release(big, torch.ones(10), torch.ones(10, dtype=torch.float64), noise_std=1.0,
                      randomness=Randomness(0))
    assert info["max_contribution"] == float(_norms(big).max())


def test_bytes_moved_counts_every_pass():
    n, k = 10_000, 4
    X = torch.rand(n, k)
    y = torch.randint(0, 2, (n,), dtype=torch.uint8)
    w = torch.ones(n, dtype=torch.float64)
    assert bytes_moved(X, y, w) == n * (k * 4 + 8 + 2)  # float32: one pass; labels: check, then the sum
    assert bytes_moved(X.double(), y, w) == n * (2 * k * 8 + 8 + 2)  # float64: norms and sum each read the block
    assert bytes_moved(X.half(), y.bool(), w) == n * (k * 2 + 8 + 1)  # boolean labels need no check
    assert bytes_moved(X, y.float(), w) == n * (k * 4 + 8 + 3 * 4 + 6)  # float labels: three reads, three masks
