"""Poisson sampling with static shapes: sizes, uniformity, padding, truncation."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from trainers.sampling import PoissonSampler, chunk_size, default_padded_size


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


@pytest.mark.parametrize("expected", [1.0, 100.0, 1000.0, 4096.0, 5000.0, 16384.0, 1e5])
@pytest.mark.parametrize("cap", [None, 8, 512, 4096, 8192])
def test_chunk_size_is_the_fewest_equal_chunks_under_the_cap(expected, cap):
    full = default_padded_size(expected)
    size = chunk_size(expected, cap)
    assert size % 8 == 0 and size >= 8
    if cap is None or full <= cap:
        assert size == full
    else:
        pieces = math.ceil(full / cap)
        assert size <= cap and pieces * size >= full  # the padded batch fits in the fewest chunks the cap allows
        assert (pieces - 1) * size < full              # and not in fewer


def _rows_processed_per_row(expected: float, chunk: int, draws: int = 20_000) -> float:
    sizes = np.random.default_rng(0).poisson(expected, draws)
    return float((np.maximum(1, np.ceil(sizes / chunk)) * chunk).sum() / sizes.sum())


def test_even_chunks_remove_the_overflow_padding_at_batch_4096():
    # Capping one chunk at 4,096 sent every batch above its mean into a second, mostly padded
    # chunk: about 1.5 rows processed per real row. Equal chunks process about 1.1.
    assert _rows_processed_per_row(4096, min(default_padded_size(4096), 4096)) > 1.45
    assert _rows_processed_per_row(4096, chunk_size(4096, 4096)) < 1.11


def test_chunk_size_refuses_a_cap_below_one_row_block():
    with pytest.raises(ValueError, match="max_chunk"):
        chunk_size(4096, 4)
