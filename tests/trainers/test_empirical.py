"""Empirical audits: the statistics, and each phase's audit on the real training loops.

Every audit here is seeded, so a run is reproducible. For a correct implementation the
bound exceeds the planned epsilon with probability at most 1 - confidence = 1e-6, and each
mechanism check fails with probability 1e-6. The planted defects at the README's plan are
in ``test_empirical_mutants.py``.
"""

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from budgetplan.accounting import account
from budgetplan.accounting.gaussian import analytic_epsilon, analytic_sigma
from budgetplan.accounting.rr import flip_probability
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.plan.phases import DPSGDParams, RRParams, WALRParams
from tests.trainers.mutants import Mutant
from trainers import dpsgd
from trainers.clipping import CLIP_MARGIN_ULPS
from trainers.empirical import (
    DEFAULT_CONFIDENCE,
    Result,
    canaries,
    epsilon_from_counts,
    rr_lower_bound,
    split_threshold_bound,
    walr_lower_bound,
)
from trainers.empirical.canaries import canary_counts, dpsgd_lower_bound
from trainers.empirical.releases import walr_inputs
from trainers.randomness import Randomness
from trainers.rr_phase import randomize_labels
from trainers.walr import prepare_rows, release

DELTA = 1e-5
SMALL_DPSGD = DPSGDParams(noise_multiplier=1.0, noise_std=0.5, clipping_norm=0.5, sensitivity=0.5, sampling_rate=0.05,
                          steps=30, batch_size=200, epochs=1.5, dataset_size=4000, sampling="poisson",
                          max_batch_size=None, cap=1, capping=None, normalise_by="q N", model="full")


# ---- the statistics -------------------------------------------------------------------------


def test_clopper_pearson_matches_the_closed_forms_at_the_extremes():
    n, alpha = 1000, (1 - DEFAULT_CONFIDENCE) / 2
    # no event under the denominator: upper bound 1 - alpha^(1/n); every trial an event: lower alpha^(1/n)
    eps, lo, hi = epsilon_from_counts(hits_numerator=n, n_numerator=n, hits_denominator=0, n_denominator=n,
                                      delta=0.0)
    assert lo == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert hi == pytest.approx(-math.expm1(math.log(alpha) / n), rel=1e-9)
    assert eps == pytest.approx(math.log(lo / hi), rel=1e-12)


def test_bound_subtracts_delta_and_is_never_negative():
    base = {"hits_numerator": 30_000, "n_numerator": 100_000, "hits_denominator": 10_000, "n_denominator": 100_000}
    e0, lo, hi = epsilon_from_counts(**base, delta=0.0)
    assert e0 == pytest.approx(math.log(lo / hi)) and 0.9 < e0 < math.log(3)
    e1, _, _ = epsilon_from_counts(**base, delta=0.1)
    assert e1 == pytest.approx(math.log((lo - 0.1) / hi)) and 0 < e1 < e0
    assert epsilon_from_counts(**base, delta=lo)[0] == 0.0
    assert epsilon_from_counts(hits_numerator=1000, n_numerator=100_000, hits_denominator=3000,
                               n_denominator=100_000, delta=0.0)[0] == 0.0


def test_clopper_pearson_covers_at_the_stated_rate():
    # 2000 binomial draws at a loose level (alpha = 0.05 per side): coverage failures ~ Binomial(2000, <= 0.05)
    rng = np.random.default_rng(1)
    p, n = 0.03, 500
    ks = rng.binomial(n, p, 2000)
    lows = np.array([epsilon_from_counts(hits_numerator=int(k), n_numerator=n, hits_denominator=0, n_denominator=n,
                                         delta=0.0, confidence=0.9)[1] for k in ks])
    misses = int(np.count_nonzero(lows > p))
    assert misses <= stats.binom.ppf(1 - 1e-6, 2000, 0.05)


def test_counts_are_validated():
    with pytest.raises(InvalidParameterError, match="hits_numerator"):
        epsilon_from_counts(hits_numerator=11, n_numerator=10, hits_denominator=0, n_denominator=10, delta=0.0)
    with pytest.raises(InvalidParameterError, match="confidence"):
        epsilon_from_counts(hits_numerator=1, n_numerator=10, hits_denominator=0, n_denominator=10, delta=0.0,
                            confidence=1.0)


def test_the_split_bound_recounts_on_the_held_out_halves_only():
    # unequal samples (as the DP-SGD canaries: many more absent); the reported counts are those of
    # the second halves at the chosen threshold, and the bound is epsilon_from_counts of them
    rng = np.random.default_rng(2)
    present, absent = rng.normal(3.0, 1.0, 20_000), rng.normal(0.0, 1.0, 300_000)
    out = split_threshold_bound(present, absent, delta=1e-6, alpha=5e-7, unit="x")
    t = float(out["event"].split("> ")[1].split(":")[0])
    assert out["hits"] == (int(np.count_nonzero(present[10_000:] > t)), int(np.count_nonzero(absent[150_000:] > t)))
    again = epsilon_from_counts(hits_numerator=out["hits"][0], n_numerator=10_000, hits_denominator=out["hits"][1],
                                n_denominator=150_000, delta=1e-6)
    assert out["epsilon_lower_bound"] == pytest.approx(again[0], rel=1e-12)
    # two unit-variance Gaussians 3 apart are (eps, 1e-6)-DP at eps = 16.5 (analytic); the bound is below it
    assert 2.0 < out["epsilon_lower_bound"] < 16.5


@settings(max_examples=25, deadline=None)
@given(mu=st.floats(0.5, 4.0), delta=st.floats(1e-7, 1e-3), n_present=st.integers(2000, 20_000),
       n_absent=st.integers(2000, 60_000), seed=st.integers(0, 2**32 - 1))
def test_the_split_bound_never_exceeds_the_true_epsilon_of_two_gaussians(mu, delta, n_present, n_absent, seed):
    # N(mu, 1) against N(0, 1) is (eps, delta)-DP exactly at the analytic Gaussian epsilon (Balle and Wang,
    # arXiv:1805.06530); a valid bound stays below it (each example fails with probability <= 1e-6)
    rng = np.random.default_rng(seed)
    out = split_threshold_bound(rng.normal(mu, 1.0, n_present), rng.normal(0.0, 1.0, n_absent), delta=delta,
                                alpha=5e-7, unit="x")
    assert 0.0 <= out["epsilon_lower_bound"] <= analytic_epsilon(sigma=1.0, delta=delta, sensitivity=mu)


def test_identical_neighbours_give_no_bound():
    rng = np.random.default_rng(3)
    out = split_threshold_bound(rng.normal(size=50_000), rng.normal(size=80_000), delta=0.0, alpha=5e-7, unit="x")
    assert out["epsilon_lower_bound"] == 0.0


def test_inputs_are_validated():
    with pytest.raises(InvalidParameterError, match="epsilon"):
        rr_lower_bound(epsilon=float("nan"))
    with pytest.raises(InvalidParameterError, match="exactly one of epsilon and phase"):
        rr_lower_bound()
    with pytest.raises(InvalidParameterError, match="delta"):
        walr_lower_bound(_walr_plan(), delta=0.0)
    with pytest.raises(InvalidParameterError, match="delta"):
        dpsgd_lower_bound(SMALL_DPSGD, delta=0.0)
    with pytest.raises(InvalidParameterError, match="absent"):
        dpsgd_lower_bound(SMALL_DPSGD, delta=DELTA, absent=0)


# ---- randomized response --------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_rr_bound_is_tight_and_never_above_the_plan(epsilon):
    # sd of the bound about 0.002 at 5M labels per neighbour; it sits 0.004-0.011 below eps
    r = rr_lower_bound(epsilon=epsilon, randomness=Randomness(11))
    assert isinstance(r, Result) and r.mechanism == "randomized-response" and r.delta == 0.0
    assert r.samples == 5_000_000 and r.confidence == DEFAULT_CONFIDENCE
    assert r.passed and r.epsilon_lower_bound <= epsilon and r.failing == []
    assert r.tight and r.epsilon_lower_bound >= epsilon - 0.05
    assert [c.name for c in r.checks] == ["flip rate"] and r.checks[0].passed


def test_rr_audits_the_most_sensitive_rows_of_an_eps_over_k_i_plan():
    # units with K_i = 1 spend the whole unit budget on their one row
    shares = (2.0, 1.0, 2.0 / 3)
    params = RRParams(per_impression_rule="eps/K_i", unit_epsilon=2.0, per_impression_epsilon=2.0 / 3,
                      flip_probability=flip_probability(2.0 / 3), cap=3, capping="random", epochs=1, batch_size=None,
                      dataset_size=10, labels_randomised="once", model="truncated",
                      per_impression_epsilon_by_count=shares,
                      flip_probability_by_count=tuple(flip_probability(e) for e in shares))
    r = rr_lower_bound(phase=SimpleNamespace(name="rr", params=params), samples=1_000_000, randomness=Randomness(13))
    assert r.planned_epsilon == 2.0 and r.passed and 1.95 < r.epsilon_lower_bound <= 2.0


def test_rr_with_a_flip_function_audits_that_function():
    # rho / 2 at eps = 1 is RR at eps 1.86; the bound (1.84 at 1M labels, sd ~0.003) is far above 1
    r = rr_lower_bound(epsilon=1.0, samples=1_000_000, randomness=Randomness(12),
                       flip=lambda labels, rho, rnd: randomize_labels(labels, rho / 2, rnd))
    assert not r.passed and not r.tight and r.epsilon_lower_bound > 1.5
    assert r.failing == ["epsilon lower bound", "flip rate"]


def test_rr_default_randomness_is_the_csprng():
    assert rr_lower_bound(epsilon=1.0, samples=200_000).passed


# ---- Gaussian release (WALR) ----------------------------------------------------------------


def _walr_plan(epsilon=2.0, features=5, row_norm_bound=2.5, weights_bound=0.8):
    sens = row_norm_bound * weights_bound
    sigma = analytic_sigma(epsilon=epsilon, delta=DELTA, sensitivity=sens)
    return WALRParams(noise_std=sigma, sensitivity=sens, unit_sensitivity=sens, features=features,
                      row_norm_bound=row_norm_bound, weights_bound=weights_bound, dataset_size=1_000_000, cap=1,
                      capping=None, release="once", classical_noise_std=sigma, classical_valid=False)


def test_the_walr_neighbours_differ_by_the_planned_sensitivity():
    par = _walr_plan()
    X, w, y1, y0, s1, s0, shift = walr_inputs(par)
    assert shift == pytest.approx(par.sensitivity, rel=1e-12)
    # the expected sums, computed independently, are what the real clipping and release produce
    Xc, wc, info = prepare_rows(X, row_norm_bound=par.row_norm_bound, weights=w, weights_bound=par.weights_bound)
    assert info["rows_clipped"] == 1 and info["weights_clipped"] == 1
    for y, s in ((y1, s1), (y0, s0)):
        out, _ = release(Xc, y, wc, noise_std=1e-300, randomness=Randomness(0), sensitivity=par.sensitivity)
        np.testing.assert_allclose(out.numpy(), s, rtol=1e-12, atol=1e-12)


def test_walr_audit_of_correct_code_passes():
    par = _walr_plan()
    r = walr_lower_bound(par, delta=DELTA, samples=3000, randomness=Randomness(21))
    assert r.planned_epsilon == pytest.approx(2.0, abs=1e-6)
    assert r.passed and r.epsilon_lower_bound <= r.planned_epsilon
    assert [c.name for c in r.checks] == ["release centred on the planned sum", "noise std", "noise is Gaussian"]


def test_walr_release_of_twice_the_sum_is_caught(monkeypatch):
    # a doubled sum doubles the sensitivity: the release is centred 2 S away from the planned S, about
    # |S| / (noise_std / sqrt(n)) = 20 standard errors per neighbour at 3,000 releases
    Mutant("twice the sum", "trainers.walr", "total += v.mul_(w) @ xs", "total += 2 * (v.mul_(w) @ xs)",
           ("_exact_sum",)).install(monkeypatch)
    r = walr_lower_bound(_walr_plan(), delta=DELTA, samples=3000, randomness=Randomness(22))
    assert r.failing == ["release centred on the planned sum"]


# ---- DP-SGD canaries ------------------------------------------------------------------------


def test_canary_counts_scale_with_the_plan():
    assert canary_counts(200_000, 147) == (200_000, 2_000_000, 147)        # the README plan: every step
    assert canary_counts(4000, 60) == (4000, 2_000_000, 60)
    present, absent, steps = canary_counts(32_000_000, 5860)               # long plans: fewer canaries
    assert steps == 2000 and present * 2 + 2000 >= 330_000_000 // 2000 and absent >= present


def test_replace_one_epsilon_is_at_least_the_add_remove_epsilon_the_canaries_test():
    for sigma, q, steps in ((0.7607846919313398, 0.02048, 147), (1.0, 0.01, 500), (0.6, 0.05, 40)):
        mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps)
        ar = account(mech, delta=5e-7, adjacency="add-remove").epsilon
        ro = account(mech, delta=5e-7, adjacency="replace-one").epsilon
        assert ro >= ar > 0


@pytest.mark.parametrize("noise", [False, True])
def test_the_observer_recovers_every_step_of_the_real_loop(monkeypatch, noise):
    # x_t recovered from the weights (momentum undone) against the gradient the step set; without
    # noise, a sampled canary moves by C less the clipping's rounding margin (from 4C), never more,
    # and everything else by 0
    truth, seen = [], []
    real_step, real_add = dpsgd.noisy_gradient, canaries.CanaryObserver.add

    def step(model, data, batch, trainable, **kw):
        out = real_step(model, data, batch, trainable, **{**kw, "noise_std": kw["noise_std"] if noise else 0.0})
        truth.append(trainable[0].grad[:, 0] * (kw["expected_batch"] / kw["clipping_norm"]))
        return out

    monkeypatch.setattr(dpsgd, "noisy_gradient", step)
    monkeypatch.setattr(canaries.CanaryObserver, "add", lambda self, x: (seen.append(x.clone()), real_add(self, x)))
    dpsgd_lower_bound(SMALL_DPSGD, delta=DELTA, absent=6000, randomness=Randomness(5))
    assert len(truth) == len(seen) == SMALL_DPSGD.steps
    for t, s in zip(truth, seen):
        torch.testing.assert_close(s, t, atol=2e-4, rtol=0)
        if not noise:
            moved = t[t != 0]
            assert bool((t[4000:] == 0).all()) and 100 <= moved.numel() <= 300  # Binomial(4000, 0.05) sampled
            margin = CLIP_MARGIN_ULPS * torch.finfo(torch.float32).eps
            torch.testing.assert_close(moved, torch.full_like(moved, 1 - margin), atol=2e-7, rtol=0)
            assert bool((moved <= 1).all())


def test_dpsgd_audit_of_correct_code_passes():
    r = dpsgd_lower_bound(SMALL_DPSGD, delta=DELTA, absent=200_000, randomness=Randomness(31))
    planned = account(PoissonDPSGD(noise_multiplier=1.0, sampling_rate=0.05, steps=30), delta=DELTA,
                      adjacency="add-remove").epsilon
    assert r.planned_epsilon == planned and r.passed and r.failing == []
    assert 0 <= r.epsilon_lower_bound <= planned
    assert [c.name for c in r.checks] == ["every step observed", "noise std per step", "noise independent across "
                                          "steps", "canary gradient is C at rate q"]
    assert r.samples == 4000 and r.absent == 200_000 and r.evaluated == 2000


def test_a_loop_that_runs_fewer_steps_than_planned_is_reported(monkeypatch):
    real = dpsgd.run_dpsgd

    def short(model, data, params, **kw):
        return real(model, data, replace(params, steps=params.steps - 1), **kw)

    monkeypatch.setattr(dpsgd, "run_dpsgd", short)
    r = dpsgd_lower_bound(SMALL_DPSGD, delta=DELTA, absent=20_000, randomness=Randomness(32))
    assert "every step observed" in r.failing


# ---- the canary audits on every execution the trainer offers ------------------------------------


def _executed(**changes):
    return replace(SMALL_DPSGD, **changes)


UNITS = _executed(sample_by="unit", units=4000, cap=3, capping="first")
ALLOCATION = _executed(sampling="allocation", sampling_rate=0.05, steps=40, epochs=2.0)
SHUFFLE = _executed(sampling="shuffle", sampling_rate=0.05, steps=40, epochs=2.0)


@pytest.mark.parametrize("params, sampler", [(UNITS, "UnitPoissonSampler"), (ALLOCATION, "AllocationSampler"),
                                             (SHUFFLE, "ShuffleSampler")])
def test_the_canaries_run_each_execution_on_its_real_sampler(params, sampler, monkeypatch):
    """A unit-sampled plan (every canary a unit of one row), random allocation and shuffled batches (the plan's
    T = N // B steps per epoch over T B' canaries) each run on the trainer's own sampler and pass honestly."""
    from trainers import sampling

    made = []
    real = getattr(sampling, sampler)

    class Spy(real):
        def __init__(self, *args, **kw):
            made.append(type(self).__mro__[1].__name__)
            super().__init__(*args, **kw)

    monkeypatch.setattr(dpsgd, sampler, Spy)
    epochs = params.sampling in ("allocation", "shuffle")
    r = dpsgd_lower_bound(params, delta=DELTA, absent=20_000, randomness=Randomness(33),
                          epsilon=4.0 if epochs else None)
    assert made == [sampler]
    assert r.passed and r.failing == [], r.checks
    if epochs:  # every canary once per epoch: the plan's 20 steps per epoch over 20 x 200 canaries
        assert r.samples == 4000 and r.planned_epsilon == 4.0 and "in each epoch once" in r.compared
        assert f"{params.sampling}-dpsgd" == r.mechanism
    else:
        assert "one canary is one unit of one row" in r.compared


def test_the_canaries_run_over_two_processes():
    """Two gloo ranks, each sampling its block of canaries from its own stream and rank 0 drawing the noise (the
    run's own distributed loop): the noise, its independence and the canaries' rate q all check out."""
    r = dpsgd_lower_bound(SMALL_DPSGD, delta=DELTA, absent=20_000, randomness=Randomness(34), processes=2)
    assert r.passed and "over 2 processes" in r.compared and r.samples == 4000, r.checks


@pytest.fixture(scope="module")
def truncated_plan():
    """A small add-remove DP-SGD plan whose Poisson batches are truncated at 150 (q N = 100)."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from tests.fuzz.artefacts import SMALL_SCENARIOS

    text = SMALL_SCENARIOS["dpsgd"].replace("noise_multiplier = 2.0", 'noise_multiplier = 2.0\nsampling = '
                                            '"truncated-poisson"\nmax_batch_size = 150').replace(
        "dataset_size = 10000", "dataset_size = 4000")
    plan = build_plan(parse_scenario(text))
    assert plan.dpsgd.params.sampling == "truncated-poisson"
    return plan


def test_a_truncated_poisson_phase_is_audited_as_the_poisson_run_it_is(truncated_plan, monkeypatch):
    """The phase gets its canary row (it once got none): the real loop runs Poisson at the plan's q, uncut, and
    the row says so; the bound is compared with the Poisson steps' add-remove epsilon."""
    from trainers.empirical import audit_plan

    ran = []
    real_loop, real_bound = dpsgd.run_dpsgd, canaries.dpsgd_lower_bound

    def loop(model, data, params, **kw):
        ran.append((params.sampling, params.sampling_rate, params.max_batch_size))
        return real_loop(model, data, params, **kw)

    monkeypatch.setattr(dpsgd, "run_dpsgd", loop)
    monkeypatch.setattr(canaries, "dpsgd_lower_bound", lambda par, **kw: real_bound(par, **{**kw, "absent": 5_000}))
    rows = audit_plan(truncated_plan, randomness=Randomness(35))
    assert [r["name"] for r in rows] == ["empirical dpsgd"]
    row = rows[0]
    assert ran == [("poisson", 0.025, None)]
    assert row["passed"] and row["failing"] == [], row["checks"]
    assert "truncated Poisson phase run as Poisson at the plan's q = 0.025, its batches not cut at 150" in \
        row["compared"]
    poisson = account(PoissonDPSGD(noise_multiplier=2.0, sampling_rate=0.025, steps=20),
                      delta=truncated_plan.dpsgd.guarantee.delta, adjacency="add-remove", method="pld").epsilon
    assert row["planned_epsilon"] == pytest.approx(poisson)


def test_a_truncated_poisson_phase_gets_a_one_run_row(truncated_plan, monkeypatch):
    from trainers.empirical import one_run

    real = one_run.dpsgd_one_run
    monkeypatch.setattr(one_run, "dpsgd_one_run", lambda phase, **kw: real(phase, **{**kw, "canaries": 20_000}))
    rows = one_run.one_run_rows(truncated_plan, randomness=Randomness(36))
    assert len(rows) == 1 and rows[0]["passed"], rows
    assert "run as Poisson at the plan's q = 0.025" in rows[0]["detail"]
    assert "its batches not cut at 150" in rows[0]["compared"]
