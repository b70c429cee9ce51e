"""Allocation and shuffled batches as accounted: once per epoch, uniform, static shapes."""

import numpy as np
import pytest
import torch
from scipy import stats

from trainers.sampling import AllocationSampler, ShuffleSampler, fixed_chunk_size


def _rows(batch):
    return torch.cat([idx[mask > 0] for idx, mask in batch.chunks]).numpy()


def test_allocation_uses_every_row_exactly_once_per_epoch_in_a_uniform_step():
    n, t, epochs = 600, 12, 300
    s = AllocationSampler(n, t, seed=3)
    step_of = np.zeros((epochs, n), dtype=int)
    sizes = []
    for e in range(epochs):
        seen = np.zeros(n, dtype=int)
        for k in range(t):
            b = s.sample()
            rows = _rows(b)
            assert rows.size == b.size == b.drawn and not b.truncated
            seen[rows] += 1
            step_of[e, rows] = k
            sizes.append(b.size)
        assert np.all(seen == 1)  # exactly once per epoch
    # every row's step is uniform over the T steps (pooled over rows and epochs) ...
    counts = np.bincount(step_of.ravel(), minlength=t)
    assert stats.chisquare(counts).pvalue > 1e-6
    # ... and independent of the other rows': the sizes are multinomial, Pearson X^2 ~ chi2(T - 1) per epoch
    sizes = np.asarray(sizes).reshape(epochs, t)
    x2 = (((sizes - n / t) ** 2) / (n / t)).sum()
    df = epochs * (t - 1)
    assert stats.chi2.sf(x2, df) > 1e-6 and stats.chi2.cdf(x2, df) > 1e-6
    # and a row's step in one epoch says nothing of the next
    table = np.histogram2d(step_of[:-1].ravel(), step_of[1:].ravel(), bins=t)[0]
    assert stats.chi2_contingency(table)[1] > 1e-6


def test_shuffle_cuts_a_fresh_permutation_into_batches_of_exactly_b():
    n, b, epochs = 103, 10, 400
    s = ShuffleSampler(n, b, seed=5)
    assert s.steps_per_epoch == 10
    left_out = np.zeros(n)
    first = np.zeros(n)
    for _ in range(epochs):
        seen = np.zeros(n, dtype=int)
        for k in range(s.steps_per_epoch):
            batch = s.sample()
            rows = _rows(batch)
            assert batch.size == rows.size == b
            seen[rows] += 1
            if k == 0:
                first[rows] += 1
        assert seen.max() == 1 and seen.sum() == 100  # at most once; 3 rows sit the epoch out
        left_out += seen == 0
    assert stats.chisquare(left_out).pvalue > 1e-6
    assert stats.chisquare(first).pvalue > 1e-6


def test_static_chunks_and_seeds():
    s = ShuffleSampler(1000, 300, padded_size=fixed_chunk_size(300, 128), seed=1)
    batch = s.sample()
    assert {tuple(idx.shape) for idx, _ in batch.chunks} == {(104,)} and len(batch.chunks) == 3
    assert fixed_chunk_size(300, None) == 304 and fixed_chunk_size(5, None) == 8
    a = [AllocationSampler(50, 5, seed=9).sample().size for _ in range(3)]
    assert a == [AllocationSampler(50, 5, seed=9).sample().size for _ in range(3)]
    with pytest.raises(ValueError):
        ShuffleSampler(10, 11, seed=1)
