"""WALR on ads data: one-hot categoricals and scaled numerics, the row bound derived and enforced."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.examples import adapted
from budgetplan.scenario.model import parse_scenario
from trainers.data.encoded import EncodedData
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.randomness import Randomness
from trainers.run import RunOptions, execute_plan
from trainers.walr_onehot import (
    WEIGHT_FLOOR,
    ColumnWeights,
    column_weights,
    encode_rows,
    fit,
    numeric_range,
    predict,
    release,
)

N = 6000


def _onehot_text(n=N, eps=3.0, extra=""):
    text = adapted("walr", epsilon=eps, dataset_size=n, features=SYNTH_FEATURES)
    lines = [line for line in text.splitlines() if not line.startswith(("features = ", "row_norm_bound"))]
    return "\n".join(lines).replace("weights_bound = 1.0", "weights_bound = 1.0\n" + extra)


def _data(rows):
    """Three categorical and two numeric columns, with a collision in row 0 (ids 3 and 3)."""
    g = torch.Generator().manual_seed(0)
    ns_cat = torch.randint(0, 20, (rows, 2), generator=g)
    ns_cat[0] = torch.tensor([3, 3])
    return EncodedData(ns_cat=ns_cat, ns_num=torch.randn(rows, 1, generator=g) * 5, s_cat=torch.randint(0, 9, (rows, 1),
                       generator=g), s_num=torch.rand(rows, 1, generator=g), label=(torch.rand(rows, generator=g)
                       < 0.3).float(), unit=None, ns_vocab=20, s_vocab=9)


def _dense(rows):
    x = torch.zeros(len(rows), rows.k, dtype=torch.float64)
    x[:, 0] = rows.weights.intercept
    for j in range(rows.cat.shape[1]):
        x[torch.arange(len(rows)), rows.cat[:, j]] += rows.weights.categorical[j]
    x[:, rows.num_offset:] = rows.num
    return x * rows.scale[:, None]


WEIGHTED = ColumnWeights(0.3, (1.2, 1.2, 0.9), (1.1, 0.05))


@pytest.mark.parametrize("weights", [None, WEIGHTED], ids=["unweighted", "weighted"])
def test_every_row_is_within_the_bound_and_the_sparse_sum_is_the_dense_one(weights):
    data = _data(500)
    lo, hi = numeric_range(data)
    bound = math.sqrt(1 + 3 + 2 if weights is None else weights.squared_total())
    rows, scaled = encode_rows(data, lo, hi, row_norm_bound=bound, weights=weights)
    dense = _dense(rows)
    norms = torch.linalg.vector_norm(dense, dim=1)
    assert bool((norms <= bound).all()) and scaled >= 1 and rows.scale[0] < 1  # the collision is scaled down
    assert torch.allclose(norms, rows.norm) and rows.k == 1 + 20 + 9 + 2
    assert float(rows.num.min()) == 0.0 and float(rows.num.max()) == (1.0 if weights is None else 1.1)
    y, w = data.label.double(), torch.ones(500, dtype=torch.float64)
    exact, info = release(rows, y, w, noise_std=0.0, sensitivity=bound, randomness=Randomness(0))
    assert torch.allclose(exact, (y[:, None] * dense).sum(0)) and info["noise_draws"] == rows.k
    with pytest.raises(PlanMismatchError, match="more than the planned sensitivity"):
        release(rows, y, w, noise_std=1.0, sensitivity=bound / 2, randomness=Randomness(0))


def test_new_rows_are_scaled_by_the_training_range_and_clipped():
    data = _data(300)
    lo, hi = numeric_range(data)
    shifted = _data(300)
    shifted.ns_num.add_(1e3)
    rows, _ = encode_rows(shifted, lo, hi, row_norm_bound=3.0)
    assert float(rows.num[:, 0].min()) == 1.0  # beyond the training range: clipped to 1


def test_the_fit_recovers_a_logistic_model_from_the_exact_sum():
    g = torch.Generator().manual_seed(1)
    n = 20_000
    data = _data(n)
    lo, hi = numeric_range(data)
    rows, _ = encode_rows(data, lo, hi, row_norm_bound=math.sqrt(6))
    truth = torch.zeros(rows.k, dtype=torch.float64)
    truth[0], truth[1:21] = -1.0, torch.linspace(-1, 1, 20, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < torch.sigmoid(rows.logits(truth))).double()
    w = torch.ones(n, dtype=torch.float64)
    exact, _ = release(rows, y, w, noise_std=0.0, sensitivity=math.sqrt(6), randomness=Randomness(0))
    theta = fit(rows, exact, w, n_rows=n, l2=1.0)
    assert float(torch.corrcoef(torch.stack([theta[1:21], truth[1:21]]))[0, 1]) > 0.95
    from trainers.metrics import auc

    assert auc(y.numpy(), predict(theta, rows).numpy()) > auc(y.numpy(), np.zeros(n) + np.arange(n) % 2) + 0.1


def test_scenarios_derive_the_bound_from_features_and_keep_numeric_plans_as_they_were():
    plan = build_plan(parse_scenario(_onehot_text()))
    par = plan.walr.params
    columns = len(SYNTH_FEATURES.nonsensitive) + len(SYNTH_FEATURES.sensitive)
    assert par.encoding == "one-hot" and par.features is None
    assert par.row_norm_bound == pytest.approx(math.sqrt(1 + columns)) and par.sensitivity == par.row_norm_bound
    text = " ".join(render_statement(plan).split())
    assert "every categorical column one-hot" in text and "fitted on the training rows' features" in text
    assert "each column's weight" in text
    numeric = build_plan(parse_scenario(adapted("walr")))
    assert numeric.walr.params.encoding is None and numeric.walr.params.features == 20
    assert "encoding" not in numeric.scenario.to_dict()["walr"]  # the bytes of plans made before


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("weights_bound = 1.0", 'weights_bound = 1.0\nencoding = "one-hot"\nfeatures = 5'),
     "derived from [features]"),
    (lambda t: t.replace("weights_bound = 1.0", 'weights_bound = 1.0\nencoding = "numeric"\nfeatures = 5'),
     "missing required key [walr].row_norm_bound"),
    (lambda t: t[:t.index("[features]")], "derives its row bound from [features]"),
    (lambda t: t.replace("weights_bound = 1.0", 'weights_bound = 1.0\nencoding = "dense"'), "[walr].encoding"),
])
def test_bad_walr_tables_are_refused_in_one_line(edit, message):
    with pytest.raises(InvalidParameterError) as err:
        build_plan(parse_scenario(edit(_onehot_text())))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_one_hot_walr_plan_trains_on_categoricals_and_audits(tmp_path):
    from trainers.audit import audit_run

    table = synthesize(N + 3000, 1500, 4)
    pq.write_table(table.slice(0, N), tmp_path / "train.parquet")
    pq.write_table(table.slice(N), tmp_path / "eval.parquet")
    plan = build_plan(parse_scenario(_onehot_text(eps=8.0)))
    rec = execute_plan(plan, tmp_path / "train.parquet", RunOptions(eval_path=tmp_path / "eval.parquet",
                                                                    out_dir=tmp_path / "run", seed=3, threads=1))
    entry = rec.phases[0]
    assert entry.name == "walr" and rec.model.config["encoding"] == "one-hot"
    kept = ColumnWeights(**{k: (tuple(v) if k != "intercept" else v)
                            for k, v in rec.model.config["column_weights"].items()})
    assert kept.squared_total() <= plan.walr.params.row_norm_bound ** 2
    assert entry.noise_draws == rec.model.config["features"] > 100  # one coordinate per category value
    assert rec.metrics["eval"]["auc"] > 0.6
    report = audit_run(tmp_path / "run", data_path=tmp_path / "train.parquet")
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]
    state = torch.load(tmp_path / "run" / "model.pt")
    assert state["theta"].shape == (entry.noise_draws,) and state["numeric_lo"].shape == (4,)
    assert state["column_weights"].tolist() == [kept.intercept, *kept.categorical, *kept.numeric]


def test_over_two_processes_it_is_the_one_process_release_and_fit(tmp_path):
    """Rank 0's noise from the same seed: the same released vector, the same theta, the same range."""
    table = synthesize(N + 1000, 1500, 6)
    pq.write_table(table.slice(0, N), tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(_onehot_text(eps=4.0)))
    r1 = execute_plan(plan, tmp_path / "train.parquet", RunOptions(seed=4, threads=1, out_dir=tmp_path / "one"))
    r2 = execute_plan(plan, tmp_path / "train.parquet", RunOptions(seed=4, threads=1, nproc=2,
                                                                   out_dir=tmp_path / "two"))
    a, b = np.load(tmp_path / "one" / "walr_sum.npy"), np.load(tmp_path / "two" / "walr_sum.npy")
    np.testing.assert_allclose(b, a, rtol=1e-9)  # summed over ranks, noised once
    one, two = torch.load(tmp_path / "one" / "model.pt"), torch.load(tmp_path / "two" / "model.pt")
    assert torch.equal(one["numeric_lo"], two["numeric_lo"]) and torch.equal(one["numeric_hi"], two["numeric_hi"])
    # the same prior precisions, estimated from the pooled counts (the estimated ones differ from the start's)
    p1, p2 = r1.model.config["prior_precisions"], r2.model.config["prior_precisions"]
    assert r1.model.config["prior"] == "empirical-bayes" and any(abs(x - 10.0) > 1 for x in p1)
    np.testing.assert_allclose(p2, p1, rtol=1e-5)
    # each L-BFGS fit stops at its tolerance and the ranks add their sums in another order, so the
    # several fits of the prior's rounds agree to about 1e-5 of theta's scale, not to rounding
    np.testing.assert_allclose(two["theta"].numpy(), one["theta"].numpy(), rtol=1e-4, atol=1e-5)


def test_the_penalty_grows_with_the_noise_over_what_the_rows_tell():
    from trainers.walr_onehot import curvature, penalties

    data = _data(4000)
    lo, hi = numeric_range(data)
    rows, _ = encode_rows(data, lo, hi, row_norm_bound=math.sqrt(6))
    w = torch.ones(len(rows), dtype=torch.float64)
    noisy = torch.zeros(rows.k, dtype=torch.float64)
    noisy[0] = 0.3 * len(rows)  # base rate 0.3, read from the intercept coordinate
    lam = penalties(rows, w, noisy, noise_std=5.0, base=10.0)
    c = curvature(rows, w)
    p = float(noisy[0] / c[0])  # c[0]: the rows' squared scales, just below their count
    assert abs(p - 0.3) < 0.01 and lam[0] == 0 and torch.allclose(lam[1:], 10.0 * (1 + 25.0 / (c[1:] * p * (1 - p))))
    frequent, rare = int(torch.argmax(c[1:21])) + 1, int(torch.argmin(c[1:21])) + 1
    assert lam[rare] > lam[frequent] > 10.0
    assert bool((penalties(rows, w, noisy, noise_std=1e-9, base=10.0)[1:] - 10.0).abs().max() < 1e-6)


def _objective(groups, weights, s2):
    """The rows' total share of signal that ``column_weights`` maximises, at v = 1/4."""
    a = [*weights.categorical, *weights.numeric, weights.intercept]
    return sum(float((g * (t * g / 4 / s2) / (1 + t * g / 4 / s2)).sum()) for g, t in zip(groups, [x * x for x in a]))


@pytest.mark.parametrize("noise_std", [0.5, 5.0, 50.0])
def test_column_weights_fill_the_bound_and_beat_every_other_allocation(noise_std):
    from trainers.walr_onehot import _column_counts

    g = torch.Generator().manual_seed(3)
    n = 4000
    data = _data(n)
    # column 0: a long tail (Zipf-like), column 1: two values only, column 2: nine values
    data.ns_cat[:, 0] = torch.clamp((torch.rand(n, generator=g) ** -1.5).long(), max=19)
    data.ns_cat[:, 1] = torch.randint(0, 2, (n,), generator=g)
    lo, hi = numeric_range(data)
    bound = math.sqrt(6)
    plain, _ = encode_rows(data, lo, hi, row_norm_bound=bound)
    w = torch.ones(n, dtype=torch.float64)
    got = column_weights(plain, w, noise_std=noise_std, row_norm_bound=bound)
    a = [got.intercept, *got.categorical, *got.numeric]
    assert got.squared_total() == pytest.approx(bound ** 2, rel=1e-9) and got.squared_total() <= bound ** 2
    assert min(a) >= WEIGHT_FLOOR * (1 - 1e-9)
    groups, s2 = _column_counts(plain, w), noise_std ** 2
    best = _objective(groups, got, s2)
    assert best >= _objective(groups, ColumnWeights.uniform(3, 2), s2) * (1 - 1e-9)
    rng = np.random.default_rng(0)
    for _ in range(200):  # any other allocation of the same norm, above the floor
        t = rng.dirichlet(np.ones(6)) * (bound ** 2 - 6 * WEIGHT_FLOOR ** 2) + WEIGHT_FLOOR ** 2
        r = np.sqrt(t)
        other = ColumnWeights(float(r[5]), tuple(float(x) for x in r[:3]), tuple(float(x) for x in r[3:5]))
        assert best >= _objective(groups, other, s2) * (1 - 1e-7)
    if noise_std == 5.0:  # two values of 2,000 rows each are informed at any weight, the tail's rare values are not
        assert got.categorical[0] > got.categorical[1]


def test_the_weighted_fit_at_no_noise_is_the_unweighted_model():
    """The prior is on a_j theta_j: without noise, weighting the columns changes no prediction."""
    g = torch.Generator().manual_seed(2)
    n = 6000
    data = _data(n)
    lo, hi = numeric_range(data)
    w = torch.ones(n, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < 0.3).double()
    predictions = []
    for weights in (None, WEIGHTED):
        rows, _ = encode_rows(data, lo, hi, row_norm_bound=10.0, weights=weights)
        exact, _ = release(rows, y, w, noise_std=0.0, sensitivity=10.0, randomness=Randomness(0))
        from trainers.walr_onehot import penalties

        lam = penalties(rows, w, exact, noise_std=0.0, base=10.0)
        predictions.append(predict(fit(rows, exact, w, n_rows=n, l2=lam, iterations=500), rows))
    np.testing.assert_allclose(predictions[1].numpy(), predictions[0].numpy(), rtol=1e-5, atol=1e-7)


def test_uniform_column_weights_are_the_plain_encoding_and_bad_values_are_refused(tmp_path):
    from trainers.settings import WALRSettings

    table = synthesize(N, 1500, 5)
    pq.write_table(table, tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(_onehot_text(eps=8.0)))
    runs = {}
    for choice in ("uniform", "fitted"):
        rec = execute_plan(plan, tmp_path / "train.parquet", RunOptions(
            seed=3, threads=1, walr_settings=WALRSettings(column_weights=choice)))
        runs[choice] = rec.model.config["column_weights"]
    assert set(runs["uniform"]["categorical"]) == set(runs["uniform"]["numeric"]) == {1.0}
    assert runs["uniform"]["intercept"] == 1.0
    assert runs["fitted"] != runs["uniform"]
    with pytest.raises(InvalidParameterError, match="column_weights must be fitted or uniform, got 'none'"):
        WALRSettings(column_weights="none")


def _two_spreads(n, seed):
    """Column A's 200 values with effects of std 1, column B's 200 with std 0.2, a 4-value sensitive
    column without effect, one numeric each; labels from the logistic model (intercept -1)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 200, (n,), generator=g)
    b = torch.randint(200, 400, (n,), generator=g)
    s = torch.randint(0, 4, (n,), generator=g)
    fx = torch.Generator().manual_seed(99)  # the same truth for every seed
    effects = torch.cat([torch.randn(200, generator=fx, dtype=torch.float64),
                         0.2 * torch.randn(200, generator=fx, dtype=torch.float64)])
    p = torch.sigmoid(-1.0 + effects[a] + effects[b])
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p).float()
    return EncodedData(ns_cat=torch.stack([a, b], 1), ns_num=torch.rand(n, 1, generator=g),
                       s_cat=s[:, None], s_num=torch.rand(n, 1, generator=g), label=y, unit=None, ns_vocab=400,
                       s_vocab=4)


def _encoded(data, lo, hi):
    rows, _ = encode_rows(data, lo, hi, row_norm_bound=math.sqrt(6))
    return rows


def test_the_prior_precisions_are_estimated_per_column_and_small_columns_keep_the_base():
    """At no noise the estimated precisions are near 1 / the effects' variance (1 and 25), and a
    column of 4 values and the numerics keep the base; theta is the fit at the precisions returned."""
    from trainers.walr_onehot import EB_MIN_COORDINATES, fit_empirical_bayes, penalties

    n = 60_000
    data = _two_spreads(n, 0)
    lo, hi = numeric_range(data)
    rows = _encoded(data, lo, hi)
    w = torch.ones(n, dtype=torch.float64)
    exact, _ = release(rows, data.label.double(), w, noise_std=0.0, sensitivity=math.sqrt(6), randomness=Randomness(0))
    theta, b = fit_empirical_bayes(rows, exact, w, n_rows=n, noise_std=0.0, base=10.0)
    assert len(b) == 4 and 4 < EB_MIN_COORDINATES  # A, B, the sensitive column, the numerics
    assert 0.5 < b[0] < 2.0 and 12.5 < b[1] < 50.0, b
    assert b[2] == b[3] == 10.0
    group = torch.tensor([-1] + [0] * 200 + [1] * 200 + [2] * 4 + [3] * 2)
    lam = penalties(rows, w, exact, noise_std=0.0, base=torch.tensor(b, dtype=torch.float64)[group.clamp_min(0)])
    again = fit(rows, exact, w, n_rows=n, l2=lam, iterations=500)
    np.testing.assert_allclose(theta.numpy(), again.numpy(), atol=2e-3)


@pytest.mark.parametrize("noise_std", [0.0, 20.0])
def test_the_estimated_prior_predicts_new_rows_better_than_one_fixed_precision(noise_std):
    """On columns whose effects spread unlike the fixed prior's guess, the estimated precisions give a
    better held-out log loss, with and without the release's noise (the same release for both fits)."""
    from trainers.metrics import log_loss
    from trainers.walr_onehot import fit_empirical_bayes, penalties

    n = 60_000
    data, new = _two_spreads(n, 1), _two_spreads(20_000, 2)
    lo, hi = numeric_range(data)
    rows, new_rows = _encoded(data, lo, hi), _encoded(new, lo, hi)
    w = torch.ones(n, dtype=torch.float64)
    noisy, _ = release(rows, data.label.double(), w, noise_std=noise_std, sensitivity=math.sqrt(6),
                       randomness=Randomness(3))
    estimated, _ = fit_empirical_bayes(rows, noisy, w, n_rows=n, noise_std=noise_std, base=10.0)
    fixed = fit(rows, noisy, w, n_rows=n, l2=penalties(rows, w, noisy, noise_std=noise_std, base=10.0))
    y = new.label.numpy()
    better = log_loss(y, predict(estimated, new_rows).numpy())
    worse = log_loss(y, predict(fixed, new_rows).numpy())
    assert better < worse - 0.001, (better, worse)


def test_the_fixed_prior_is_the_old_fit_and_a_bad_prior_is_refused(tmp_path):
    from trainers.settings import WALRSettings

    with pytest.raises(InvalidParameterError, match="prior must be empirical-bayes or fixed, got 'flat'"):
        WALRSettings(prior="flat")
    table = synthesize(N, 1500, 5)
    pq.write_table(table, tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(_onehot_text(eps=8.0)))
    rec = execute_plan(plan, tmp_path / "train.parquet", RunOptions(seed=3, threads=1,
                                                                    walr_settings=WALRSettings(prior="fixed")))
    config = rec.model.config
    assert config["prior"] == "fixed" and set(config["prior_precisions"]) == {10.0}


def test_with_few_rows_the_precisions_are_drawn_towards_the_base():
    """The base is worth EB_PSEUDO values: on 3,000 rows each estimate lies between the data's own
    fixed point (no pseudo values) and the base, and on 60,000 rows the pull is smaller."""
    from trainers.walr_onehot import EB_PSEUDO, fit_empirical_bayes

    assert EB_PSEUDO > 0
    pulls = []
    for n in (3000, 60_000):
        data = _two_spreads(n, 0)
        lo, hi = numeric_range(data)
        rows = _encoded(data, lo, hi)
        w = torch.ones(n, dtype=torch.float64)
        exact, _ = release(rows, data.label.double(), w, noise_std=0.0, sensitivity=math.sqrt(6),
                           randomness=Randomness(0))
        drawn = fit_empirical_bayes(rows, exact, w, n_rows=n, noise_std=0.0, base=10.0)[1][:2]
        own = fit_empirical_bayes(rows, exact, w, n_rows=n, noise_std=0.0, base=10.0, pseudo=0.0)[1][:2]
        assert own[0] < drawn[0] < 10.0 < drawn[1] < own[1], (n, drawn, own)
        pulls.append(math.log(drawn[0] / own[0]) + math.log(own[1] / drawn[1]))
    assert pulls[0] > 2 * pulls[1] > 0
