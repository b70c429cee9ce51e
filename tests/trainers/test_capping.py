"""trainers.data.capping: at most K rows per unit, first-K and uniformly random-K."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from budgetplan.errors import InvalidParameterError
from trainers.data.capping import cap_units, capped_rows, secure_rng


def test_first_keeps_the_first_k_rows_of_each_unit_in_data_order():
    units = np.array([5, 2, 5, 5, 2, 9, 5, 2, 2])
    kept, info = cap_units(units, 2, rule="first")
    assert kept.tolist() == [0, 1, 2, 4, 5]
    assert kept.dtype == np.int64
    assert info == {"rows_in": 9, "rows_kept": 5, "rows_dropped": 4, "units": 3, "units_capped": 2,
                    "cap": 2, "rule": "first"}


def test_random_keeps_k_rows_per_unit_sorted_and_reproducible():
    rng_units = np.random.default_rng(0)
    units = rng_units.integers(0, 300, 5000)
    kept, info = cap_units(units, 3, rule="random", rng=np.random.default_rng(1))
    assert np.all(np.diff(kept) > 0)
    sizes = np.bincount(units, minlength=300)
    kept_sizes = np.bincount(units[kept], minlength=300)
    assert np.array_equal(kept_sizes, np.minimum(sizes, 3))
    assert info["rows_kept"] == int(np.minimum(sizes, 3).sum()) == kept.shape[0]
    assert info["units"] == int(np.count_nonzero(sizes)) and info["units_capped"] == int(np.count_nonzero(sizes > 3))
    again, _ = cap_units(units, 3, rule="random", rng=np.random.default_rng(1))
    assert np.array_equal(kept, again)
    other, _ = cap_units(units, 3, rule="random", rng=np.random.default_rng(2))
    assert not np.array_equal(kept, other)


def test_units_under_the_cap_keep_every_row():
    units = np.array([1, 2, 3, 1])
    for rule in ("first", "random"):
        kept, info = cap_units(units, 2, rule=rule, rng=np.random.default_rng(0))
        assert kept.tolist() == [0, 1, 2, 3] and info["rows_dropped"] == 0 and info["units_capped"] == 0


def test_random_choice_is_uniform_chi_square():
    # 20000 units of 5 rows each, K = 2: each of the C(5, 2) = 10 subsets should be equally likely.
    units = np.repeat(np.arange(20000), 5)
    rng = np.random.default_rng(12345)
    units = units[rng.permutation(units.shape[0])]
    kept, _ = cap_units(units, 2, rule="random", rng=np.random.default_rng(7))
    # Position of each kept row within its unit, in data order.
    order = np.argsort(units, kind="stable")
    position = np.empty_like(order)
    position[order] = np.tile(np.arange(5), 20000)
    by_unit = position[kept][np.argsort(units[kept], kind="stable")].reshape(-1, 2)
    subsets = {pair: i for i, pair in enumerate(itertools.combinations(range(5), 2))}
    counts = np.bincount([subsets[tuple(sorted(p))] for p in by_unit.tolist()], minlength=10)
    assert stats.chisquare(counts).pvalue > 1e-3
    assert stats.chisquare(np.bincount(position[kept], minlength=5)).pvalue > 1e-3


def test_default_generator_is_fresh_from_the_os():
    units = np.repeat(np.arange(50), 20)
    a, _ = cap_units(units, 1)  # rng None: secure_rng()
    b, _ = cap_units(units, 1)
    assert a.shape == b.shape == (50,)
    assert not np.array_equal(a, b)  # 20**50 choices: equal only by a miracle
    assert isinstance(secure_rng(), np.random.Generator)


def test_bad_input_is_refused():
    with pytest.raises(InvalidParameterError, match="cap must be an integer >= 1, got 0"):
        cap_units(np.array([1, 2]), 0)
    with pytest.raises(InvalidParameterError, match="capping rule must be one of first, random, keyed, got 'last'"):
        cap_units(np.array([1, 2]), 1, rule="last")
    with pytest.raises(InvalidParameterError, match="one-dimensional"):
        cap_units(np.zeros((2, 2)), 1)
    kept, info = cap_units(np.array([], dtype=np.int64), 3, rule="first")
    assert kept.shape == (0,) and info["rows_in"] == 0


@settings(max_examples=60, deadline=None)
@given(units=st.lists(st.integers(0, 8), max_size=60), cap=st.integers(1, 5), rule=st.sampled_from(["first", "random"]),
       seed=st.integers(0, 2**32))
def test_cap_invariants(units, cap, rule, seed):
    units = np.array(units, dtype=np.int64)
    kept, info = cap_units(units, cap, rule=rule, rng=np.random.default_rng(seed))
    sizes = np.bincount(units, minlength=9) if units.size else np.zeros(9, dtype=int)
    assert np.array_equal(np.bincount(units[kept], minlength=9) if kept.size else np.zeros(9, dtype=int),
                          np.minimum(sizes, cap))
    assert np.array_equal(kept, np.unique(kept))
    assert info["rows_kept"] + info["rows_dropped"] == info["rows_in"] == units.size
    if rule == "first":
        for u in set(units.tolist()):
            assert kept[units[kept] == u].tolist() == np.flatnonzero(units == u)[:cap].tolist()


@settings(max_examples=60, deadline=None)
@given(units=st.lists(st.integers(0, 8), max_size=60), caps=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       seed=st.integers(0, 2**32))
def test_capped_rows_counts_what_cap_units_keeps(units, caps, seed):
    units = np.array(units, dtype=np.int64)
    out = capped_rows(units, caps)
    assert out["rows"] == units.size and out["units"] == np.unique(units).size
    for k, row in zip(caps, out["caps"]):
        for rule in ("first", "random"):
            kept, info = cap_units(units, k, rule=rule, rng=np.random.default_rng(seed))
            assert row["rows"] == kept.size == info["rows_kept"]
            assert row["units_capped"] == info["units_capped"]
        assert row["rows"] + row["rows_dropped"] == units.size
