"""Poisson sampling of units: Binomial(M, q) units per batch, each unit's rows in one padded block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from budgetplan.errors import InvalidParameterError
from trainers.sampling import PoissonSampler, UnitPoissonSampler, default_padded_size, unit_table


def random_units(m, k, seed):
    """A per-row unit index for m units of 1..k rows each, the rows of units interleaved in data order."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, k + 1, m)
    index = np.repeat(np.arange(m), sizes)
    return rng.permutation(index)


def blocks(batch, k):
    """Each chunk's [units, K] indices and mask."""
    for idx, mask in batch.chunks:
        yield idx.reshape(-1, k), mask.reshape(-1, k)


def test_unit_table_round_trip():
    index = random_units(200, 4, seed=0)
    for given in (index, torch.from_numpy(index), index.astype(np.int32)):
        table = unit_table(given, 4)
        assert table.dtype == torch.int64 and table.shape == (200, 4)
        recovered = np.full(index.size, -1)
        for u, row in enumerate(table.tolist()):
            real = [r for r in row if r >= 0]
            assert row == real + [-1] * (4 - len(real))       # real rows first
            assert real == sorted(real)                        # in data order
            recovered[real] = u
        assert np.array_equal(recovered, index)                # every row once, in its own unit


@pytest.mark.parametrize("index, k, message", [
    ([0, 1, 1, 1, 0], 2, "unit 1 has 3 rows, more than k = 2: cap the units first"),
    ([0, 2, 2], 2, "unit_index must number the units 0..M-1 densely; unit 1 has no row"),
    ([0, -1], 2, "unit_index must be >= 0, got -1"),
    (np.array([0.0, 1.0]), 2, "unit_index must be a non-empty 1-D array of integers, got dtype torch.float64 "
                              "and shape [2]"),
    (np.zeros((2, 2), dtype=np.int64), 2, "unit_index must be a non-empty 1-D array of integers, got dtype "
                                          "torch.int64 and shape [2, 2]"),
    ([0, 1], 0, "k must be an integer >= 1, got 0"),
])
def test_unit_table_refuses_bad_input(index, k, message):
    with pytest.raises(InvalidParameterError) as err:
        unit_table(index, k)
    assert str(err.value) == message


def test_unit_counts_are_binomial():
    m, q, steps = 5000, 0.01, 2000
    s = UnitPoissonSampler(unit_table(random_units(m, 3, seed=1), 3), q, seed=2)
    sizes = np.array([s.sample().size for _ in range(steps)])
    # The total over all steps is Binomial(M steps, q): two-sided, false alarm 1e-6.
    assert stats.binomtest(int(sizes.sum()), m * steps, q).pvalue > 1e-6
    # The spread is the binomial's, M q (1 - q), within a chi-square band (false alarm 2e-6).
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], steps - 1) / (steps - 1) * m * q * (1 - q)
    assert lo < sizes.var(ddof=1) < hi


def test_units_are_equally_likely():
    m = 300
    index = random_units(m, 3, seed=3)
    s = UnitPoissonSampler(unit_table(index, 3), 0.1, seed=4)
    counts = np.zeros(m)
    for _ in range(2000):
        for idx, mask in blocks(s.sample(), 3):
            counts[index[idx[mask[:, 0] > 0, 0].numpy()]] += 1  # a block's first row names its unit
    assert stats.chisquare(counts).pvalue > 1e-6


@pytest.mark.parametrize("padded_units", [None, 3])
def test_each_sampled_unit_is_one_contiguous_block(padded_units):
    k, m = 4, 120
    index = random_units(m, k, seed=5)
    table = unit_table(index, k)
    s = UnitPoissonSampler(table, 0.2, padded_units=padded_units, seed=6)
    want_padded = padded_units or default_padded_size(0.2 * m)
    assert s.padded_units == want_padded and s.padded_size == want_padded * k
    for _ in range(50):
        b = s.sample()
        assert len(b.chunks) == max(1, -(-b.size // want_padded))
        seen, rows = [], 0
        for idx, mask in blocks(b, k):
            assert idx.shape == (want_padded, k) and mask.dtype == torch.float32
            for block, mblock in zip(idx.tolist(), mask.tolist()):
                n = int(sum(mblock))
                assert mblock == [1.0] * n + [0.0] * (k - n)   # real rows first, then padding
                assert block[n:] == [0] * (k - n)              # padding rows index 0
                if n == 0:
                    continue
                unit = int(index[block[0]])
                assert table[unit].tolist() == block[:n] + [-1] * (k - n)  # the whole unit, in order
                seen.append(unit)
                rows += n
        assert len(seen) == len(set(seen)) == b.size           # each sampled unit exactly once
        assert rows == b.rows and b.drawn == b.size and not b.truncated


def test_units_are_drawn_as_the_row_sampler_draws_rows():
    """The same seed gives the same units as PoissonSampler over range(M), in the same order."""
    m = 400
    table = unit_table(np.arange(m), 1)                        # one row per unit: row r is unit r
    units, rows = UnitPoissonSampler(table, 0.05, padded_units=8, seed=7), PoissonSampler(m, 0.05, padded_size=8,
                                                                                          seed=7)
    for _ in range(30):
        a, b = units.sample(), rows.sample()
        assert a.size == b.size
        assert all(torch.equal(x, y) and torch.equal(mx, my) for (x, mx), (y, my) in zip(a.chunks, b.chunks))


def test_seeded_sampler_is_reproducible():
    table = unit_table(random_units(100, 3, seed=8), 3)
    draws = []
    for seed in (9, 9, 10):
        s = UnitPoissonSampler(table, 0.3, seed=seed)
        draws.append([torch.cat([i for i, _ in s.sample().chunks]) for _ in range(5)])
    assert all(torch.equal(a, b) for a, b in zip(draws[0], draws[1]))
    assert not all(torch.equal(a, b) for a, b in zip(draws[0], draws[2]))


def test_empty_batch_is_one_all_padding_chunk():
    s = UnitPoissonSampler(unit_table(random_units(10, 3, seed=11), 3), 1e-12, padded_units=4, seed=12)
    b = s.sample()
    assert b.size == 0 and b.rows == 0 and len(b.chunks) == 1
    idx, mask = b.chunks[0]
    assert idx.shape == (12,) and not idx.any() and not mask.any()


def test_row_batches_keep_rows_unset():
    assert PoissonSampler(10, 0.5, seed=13).sample().rows is None


@pytest.mark.parametrize("table, message", [
    (torch.tensor([[0, 1], [2, -1]], dtype=torch.int32), "unit_table must be a non-empty int64 tensor [M, K], got "
                                                          "dtype torch.int32 and shape [2, 2]"),
    ([[0, 1]], "unit_table must be a non-empty int64 tensor [M, K], got list"),
    (torch.tensor([[0, -2]]), "unit_table must hold row indices >= 0 or -1, got -2"),
    (torch.tensor([[0, 1], [-1, 2]]), "unit_table row 1 must list at least one row index and then only -1s, "
                                      "got [-1, 2]"),
    (torch.tensor([[0, -1, 1]]), "unit_table row 0 must list at least one row index and then only -1s, "
                                 "got [0, -1, 1]"),
    (torch.tensor([[0, 1], [1, -1]]), "unit_table lists a row index in more than one place: each row belongs "
                                      "to one unit"),
])
def test_sampler_refuses_a_bad_table(table, message):
    with pytest.raises(InvalidParameterError) as err:
        UnitPoissonSampler(table, 0.5, seed=0)
    assert str(err.value) == message


@pytest.mark.parametrize("q, padded_units, message", [
    (0.0, None, "q must be in (0, 1], got 0.0"),
    (1.5, None, "q must be in (0, 1], got 1.5"),
    (float("nan"), None, "q must be in (0, 1]"),
    (0.5, 0, "padded_units must be an integer >= 1, got 0"),
])
def test_sampler_refuses_bad_rate_or_chunk(q, padded_units, message):
    with pytest.raises(InvalidParameterError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        UnitPoissonSampler(torch.tensor([[0], [1]]), q, padded_units=padded_units, seed=0)
