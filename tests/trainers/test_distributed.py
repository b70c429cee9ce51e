"""DP-SGD over 2 processes (torch.distributed, gloo on CPU) against the single-process engine:
the same clipped sum, noise drawn once (std sigma C, not sigma C sqrt(2)), Poisson sampling
over the whole dataset, identical replicas, and a rank that dies or disagrees failing the run."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from scipy import stats  # noqa: E402

from budgetplan.errors import PlanMismatchError, UnsupportedError  # noqa: E402
from tests.trainers.test_dpsgd import params, tiny_data, tiny_model  # noqa: E402
from trainers.distributed import RankFailed, launch  # noqa: E402
from trainers.dpsgd import DPSGDSettings, encoded_rows, noisy_gradient, phase_sampler, run_dpsgd  # noqa: E402
from trainers.losses import bce  # noqa: E402
from trainers.randomness import Randomness  # noqa: E402
from trainers.sampling import Batch  # noqa: E402

N = 400
LOSS = functools.partial(bce, reduction="none")


def _shard(data, rank, world):
    return data.take(torch.arange(rank, len(data), world))


def _whole(data, rows):
    idx = torch.as_tensor(rows, dtype=torch.int64)
    return Batch(chunks=[(idx, torch.ones(len(idx)))], size=len(idx), drawn=len(idx), truncated=False)


def _flat(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()


def _engine_checks(coll, steps):
    """One rank's side of the engine checks (a module-level function: spawned processes import it)."""
    data = _shard(tiny_data(N), coll.rank, coll.world_size)
    out = {}
    # 1. the clipped sum of every rank's rows, no noise
    model = tiny_model()
    noisy_gradient(model, encoded_rows(data), _whole(data, range(len(data))), list(model.parameters()),
                   clipping_norm=0.5, noise_std=0.0, expected_batch=1.0,
                   noise_generator=torch.Generator().manual_seed(0), loss_fn=LOSS, collective=coll)
    out["clipped_sum"] = _flat(model)
    # 2. noise alone (empty batches on every rank), a different generator on each rank
    model = tiny_model()
    empty = Batch(chunks=[(torch.zeros(8, dtype=torch.int64), torch.zeros(8))], size=0, drawn=0, truncated=False)
    noisy_gradient(model, encoded_rows(data), empty, list(model.parameters()), clipping_norm=1.0, noise_std=2.0,
                   expected_batch=1.0, noise_generator=torch.Generator().manual_seed(100 + coll.rank), loss_fn=LOSS,
                   collective=coll)
    out["noise"] = _flat(model)
    # 3. the phase: global batch sizes, per-rank sizes, replicas
    model = tiny_model()
    torch.manual_seed(1000 + coll.rank)  # replicas that start apart: the broadcast must align them
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    res = run_dpsgd(model, data, params(N, sampling_rate=0.05, steps=steps), trainable=list(model.parameters()),
                    randomness=Randomness(7 + coll.rank), settings=DPSGDSettings(), collective=coll)
    out["batch_sizes"], out["rank_batch_sizes"] = list(res.batch_sizes), [list(r) for r in res.rank_batch_sizes]
    out["noise_draws"], out["world_size"], out["evidence"] = res.noise_draws, res.world_size, res.evidence
    out["weights"] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    # 4. inclusion: the phase's own sampler on this shard, global row ids of what it takes
    sampler = phase_sampler(data, params(N, sampling_rate=0.05, steps=steps), DPSGDSettings(),
                            Randomness(50 + coll.rank), distributed=True)
    counts = np.zeros(N, dtype=np.int64)
    mine = np.arange(coll.rank, N, coll.world_size)
    for _ in range(steps):
        b = sampler.sample()
        for idx, mask in b.chunks:
            np.add.at(counts, mine[idx[mask > 0].numpy()], 1)
    out["inclusions"] = counts.tolist()
    return out


@pytest.fixture(scope="module")
def ranks():
    return launch(_engine_checks, 2, 400, timeout_s=120)


def test_the_distributed_clipped_sum_is_the_single_process_sum(ranks):
    data, model = tiny_data(N), tiny_model()
    noisy_gradient(model, encoded_rows(data), _whole(data, range(N)), list(model.parameters()), clipping_norm=0.5,
                   noise_std=0.0, expected_batch=1.0, noise_generator=torch.Generator().manual_seed(0), loss_fn=LOSS)
    single = np.array(_flat(model))
    for r in ranks:
        np.testing.assert_allclose(np.array(r["clipped_sum"]), single, rtol=1e-5, atol=1e-6)


def test_noise_is_drawn_once_not_once_per_rank(ranks):
    g = np.array(ranks[0]["noise"])
    assert g.size > 500 and np.array_equal(g, np.array(ranks[1]["noise"]))  # every rank applies the same update
    # sum of squares / sigma^2 is chi-square(d) when the std is sigma C = 2; with 2 draws it would be 2 d
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], g.size)
    assert lo < float(np.sum(g ** 2)) / 4.0 < hi


def test_global_batches_are_poisson_over_the_whole_dataset(ranks):
    sizes = np.array(ranks[0]["batch_sizes"])
    per_rank = np.array(ranks[0]["rank_batch_sizes"])
    assert ranks[1]["batch_sizes"] == list(sizes) and np.array_equal(per_rank.sum(axis=0), sizes)
    # Binomial(N, q) for the global batch, Binomial(N / 2, q) on each rank: a chi-square test of the sizes
    for counts, n in ((sizes, N), (per_rank[0], N // 2), (per_rank[1], N // 2)):
        assert stats.binomtest(int(counts.sum()), n * len(counts), 0.05).pvalue > 1e-4
        assert abs(np.var(counts) / (n * 0.05 * 0.95) - 1) < 0.35
    assert not np.array_equal(per_rank[0], per_rank[1])  # independent generators on the two shards
    assert ranks[0]["noise_draws"] == ranks[1]["noise_draws"] > 0 and ranks[0]["world_size"] == 2  # over the ranks
    # the draws were made by rank 0 alone at every step, as its evidence (merged on rank 0) shows
    evidence = ranks[0]["evidence"]
    assert ranks[1]["evidence"] is None and evidence["noise_ranks"] == [[0]] * len(sizes)
    assert sum(evidence["noise_draws"]) == ranks[0]["noise_draws"]


def test_every_example_is_included_at_q_whatever_its_shard(ranks):
    counts = np.array(ranks[0]["inclusions"]) + np.array(ranks[1]["inclusions"])
    assert np.all((np.array(ranks[0]["inclusions"]) > 0)[1::2] == 0)  # rank 0 never samples rank 1's rows
    # each count ~ Binomial(400 steps, 0.05): chi-square of the counts' spread, and the mean
    assert stats.binomtest(int(counts.sum()), N * 400, 0.05).pvalue > 1e-4
    statistic = float(np.sum((counts - 20.0) ** 2) / (400 * 0.05 * 0.95))
    assert stats.chi2.sf(statistic, N - 1) > 1e-4 and stats.chi2.cdf(statistic, N - 1) > 1e-4


def test_replicas_stay_identical(ranks):
    assert np.array_equal(np.array(ranks[0]["weights"]), np.array(ranks[1]["weights"]))


def _dies(coll, steps):
    class Dying:
        def intend(self, step, size, rank_batch_sizes=None):
            if coll.rank == 1 and step == 3:
                os._exit(3)

    data, model = _shard(tiny_data(N), coll.rank, coll.world_size), tiny_model()
    run_dpsgd(model, data, params(N, steps=steps), trainable=list(model.parameters()), randomness=Randomness(1),
              ledger=Dying(), collective=coll)


def test_a_rank_that_dies_fails_the_run():
    with pytest.raises(RankFailed, match="rank 1: exited with code 3"):
        launch(_dies, 2, 50, timeout_s=30)


def _disagrees(coll):
    data, model = _shard(tiny_data(N), coll.rank, coll.world_size), tiny_model()
    run_dpsgd(model, data, params(N, steps=20 + coll.rank), trainable=list(model.parameters()),
              randomness=Randomness(1), collective=coll)


def test_ranks_that_disagree_on_the_steps_refuse_to_start():
    # a refusal of budgetplan's own reaches the caller as itself, not as a crash of a rank
    with pytest.raises(PlanMismatchError, match="disagree on the DP-SGD phase's steps"):
        launch(_disagrees, 2, timeout_s=30)


class _One:
    rank, world_size, draws_noise = 0, 1, True

    def total(self, value, like=None):
        return value


def test_truncated_poisson_is_not_distributed():
    data, model = tiny_data(N), tiny_model()
    p = params(N, sampling="truncated-poisson", max_batch_size=30)
    with pytest.raises(UnsupportedError, match="truncated Poisson"):
        run_dpsgd(model, data, p, trainable=list(model.parameters()), randomness=Randomness(1), collective=_One())
