"""Poisson sampling with static shapes: sizes, uniformity, padding, truncation."""

import numpy as np
import pytest
import torch
from scipy import stats

from trainers.sampling import PoissonSampler, default_padded_size


def test_realised_batch_sizes_pass_a_binomial_test():
    n, q, steps = 20_000, 0.01, 2000
    s = PoissonSampler(n, q, seed=1)
    sizes = np.array([s.sample().size for _ in range(steps)])
    # the total over all steps is Binomial(n steps, q): two-sided test, false alarm 1e-6
    assert stats.binomtest(int(sizes.sum()), n * steps, q).pvalue > 1e-6
    # and the spread is Poisson's, not a fixed size: variance n q (1-q) within a chi-square band
    var = sizes.var(ddof=1)
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], steps - 1) / (steps - 1) * n * q * (1 - q)
    assert lo < var < hi


def test_every_row_equally_likely_and_without_repeats():
    n, q = 500, 0.1
    s = PoissonSampler(n, q, seed=2)
    counts = np.zeros(n)
    for _ in range(3000):
        b = s.sample()
        rows = torch.cat([idx[mask > 0] for idx, mask in b.chunks]).numpy()
        assert len(set(rows.tolist())) == rows.size == b.size
        counts[rows] += 1
    assert stats.chisquare(counts).pvalue > 1e-6


def test_large_q_path_is_uniform_too():
    s = PoissonSampler(40, 0.5, seed=3)
    counts = np.zeros(40)
    for _ in range(4000):
        b = s.sample()
        counts[torch.cat([idx[mask > 0] for idx, mask in b.chunks]).numpy()] += 1
    assert stats.chisquare(counts).pvalue > 1e-6


def test_static_shapes_and_overflow_chunks():
    s = PoissonSampler(1000, 0.5, padded_size=64, seed=4)
    b = s.sample()
    assert all(idx.shape == (64,) and mask.shape == (64,) for idx, mask in b.chunks)
    assert len(b.chunks) == -(-b.size // 64) and sum(int(m.sum()) for _, m in b.chunks) == b.size
    # padded slots are masked out
    last_idx, last_mask = b.chunks[-1]
    assert last_mask[b.size - 64 * (len(b.chunks) - 1):].sum() == 0


def test_empty_batch_is_still_a_step():
    s = PoissonSampler(10, 1e-9, seed=5)
    b = s.sample()
    assert b.size == 0 and len(b.chunks) == 1 and b.chunks[0][1].sum() == 0


def test_truncated_poisson_cuts_to_the_maximum():
    s = PoissonSampler(1000, 0.5, max_batch_size=100, seed=6)
    b = s.sample()
    assert b.truncated and b.size == 100 and b.drawn > 100 and len(b.chunks) == 1


def test_default_padding_holds_a_poisson_batch():
    e = 16384.0
    p = default_padded_size(e)
    assert p % 8 == 0 and stats.poisson.sf(p, e) < 1e-8


def test_seeded_sampler_is_reproducible():
    a = [PoissonSampler(100, 0.2, seed=9).sample().size for _ in range(1)]
    b = [PoissonSampler(100, 0.2, seed=9).sample().size for _ in range(1)]
    assert a == b
    with pytest.raises(ValueError):
        PoissonSampler(10, 0.0, seed=1)
