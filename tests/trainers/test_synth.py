"""trainers.data.synth: deterministic, heavy-tailed users, a 5-10% rate, signal in both groups."""

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from budgetplan.errors import InvalidParameterError  # noqa: E402
from trainers.data import synth  # noqa: E402
from trainers.data.loaders import read_table  # noqa: E402
from trainers.data.synth import SYNTH_FEATURES, synthesize, true_logit, true_probability, write_synthetic  # noqa: E402


@pytest.fixture(scope="module")
def big():
    return synthesize(200_000, 20_000, seed=3)


def test_deterministic_per_seed():
    a, b = synthesize(5000, 700, seed=11), synthesize(5000, 700, seed=11)
    assert a.equals(b)
    assert not a.equals(synthesize(5000, 700, seed=12))


def test_columns_types_and_sizes(big):
    assert set(SYNTH_FEATURES.columns) == set(big.column_names)
    assert big.num_rows == 200_000
    assert big.schema.field("user_id").type == pa.int64()
    assert big.schema.field("label").type == pa.int8()
    assert set(np.unique(big.column("label").to_numpy()).tolist()) == {0, 1}
    users = big.column("user_id").to_numpy()
    assert np.unique(users).shape[0] == 20_000  # every user has at least one row
    days = big.column("days_since_visit")
    assert 0.15 < days.null_count / big.num_rows < 0.35
    assert float(np.nanmin(days.to_numpy(zero_copy_only=False))) >= 0


@pytest.mark.parametrize("seed", [0, 1])
def test_conversion_rate_is_between_5_and_10_percent(seed):
    t = synthesize(100_000, 10_000, seed=seed)
    rate = t.column("label").to_numpy().mean()
    assert 0.05 <= rate <= 0.10
    assert 0.05 <= true_probability(t).mean() <= 0.10


def test_rows_per_user_are_heavy_tailed(big):
    counts = np.unique(big.column("user_id").to_numpy(), return_counts=True)[1]
    assert np.median(counts) <= 3
    assert counts.max() >= 50 * np.median(counts)
    assert np.mean(counts <= 2) > 0.4  # most users have one or two rows
    assert np.sum(counts >= 100) >= 5  # and a tail has hundreds


def test_labels_follow_the_true_probabilities(big):
    p = true_probability(big)
    y = big.column("label").to_numpy()
    assert abs(y.mean() - p.mean()) < 4 * np.sqrt(p.mean() * (1 - p.mean()) / len(y))
    top, bottom = p > np.quantile(p, 0.9), p < np.quantile(p, 0.1)
    assert y[top].mean() > 3 * y[bottom].mean()


def _with(table, **columns):
    for name, values in columns.items():
        idx = table.column_names.index(name)
        table = table.set_column(idx, name, pa.array(values, table.schema.field(name).type.value_type
                                                     if pa.types.is_dictionary(table.schema.field(name).type)
                                                     else table.schema.field(name).type))
    return table


def test_both_feature_groups_and_their_interactions_carry_signal():
    base = synthesize(4, 4, seed=0)
    n = base.num_rows

    def z(**cols):
        return true_logit(_with(base, **{k: [v] * n for k, v in cols.items()}))

    # Non-sensitive features move the logit...
    assert not np.allclose(z(campaign="cmp000"), z(campaign="cmp001"))
    assert not np.allclose(z(bid_floor=0.1), z(bid_floor=5.0))
    # ... and so do sensitive ones.
    assert not np.allclose(z(remarketing_list="none"), z(remarketing_list="rl003"))
    assert not np.allclose(z(visits_7d=0), z(visits_7d=20))
    assert not np.allclose(z(days_since_visit=1.0), z(days_since_visit=None))
    # Interactions: the effect of the remarketing list depends on the campaign (and the
    # segment's on the publisher); an additive model would give equal differences.
    for a, b, x, y in [("campaign", "remarketing_list", ("cmp000", "cmp001"), ("none", "rl003")),
                       ("publisher", "interest_segment", ("pub0000", "pub0001"), ("seg00", "seg01"))]:
        d0 = z(**{a: x[0], b: y[1]}) - z(**{a: x[0], b: y[0]})
        d1 = z(**{a: x[1], b: y[1]}) - z(**{a: x[1], b: y[0]})
        assert np.all(np.abs(d0 - d1) > 0.05), (a, b)


def test_signal_shows_in_the_sampled_labels(big):
    y = big.column("label").to_numpy()
    on_list = big.column("remarketing_list").cast(pa.string()).to_numpy(zero_copy_only=False) != "none"
    assert y[on_list].mean() > 1.2 * y[~on_list].mean()


def test_write_and_read_back(tmp_path):
    t = synthesize(3000, 300, seed=5)
    for fmt, name in (("parquet", "s.parquet"), ("csv", "s.csv")):
        summary = write_synthetic(tmp_path / name, 3000, 300, seed=5, format=fmt)
        assert summary["rows"] == 3000 and summary["users"] == 300 and summary["format"] == fmt
        assert summary["conversion_rate"] == pytest.approx(t.column("label").to_numpy().mean())
        back = read_table(tmp_path / name, columns=SYNTH_FEATURES.columns)
        assert np.array_equal(back.column("label").to_numpy(), t.column("label").to_numpy())
        assert back.column("days_since_visit").null_count == t.column("days_since_visit").null_count
        assert np.allclose(true_probability(back), true_probability(t))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.csv", "s.parquet"]  # no temp files left


def test_encodes_with_its_feature_spec():
    pytest.importorskip("torch")
    from trainers.data.encode import encode

    data, info = encode(synthesize(2000, 200, seed=1), SYNTH_FEATURES)
    assert len(data) == 2000 and info["units"] == 200
    assert data.ns_cat.shape == (2000, 5) and data.s_cat.shape == (2000, 3)


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(InvalidParameterError, match="users must not exceed rows"):
        synthesize(10, 11)
    with pytest.raises(InvalidParameterError, match="rows must be an integer >= 1"):
        synthesize(0, 1)
    with pytest.raises(InvalidParameterError, match="output directory does not exist"):
        write_synthetic(tmp_path / "no" / "x.parquet", 10, 2)
    with pytest.raises(InvalidParameterError, match="format must be parquet or csv"):
        write_synthetic(tmp_path / "x.json", 10, 2, format="json")
    with pytest.raises(InvalidParameterError, match="outside the synthetic model"):
        true_logit(_with(synthesize(3, 3), campaign=["cmp000", "cmp999", "cmp001"]))
    assert list(tmp_path.iterdir()) == []
    assert synth.INTERCEPT < 0
