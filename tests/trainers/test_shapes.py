"""trainers.data.shapes: the Criteo-like shapes differ where the signal sits, and only there."""

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from budgetplan.errors import InvalidParameterError  # noqa: E402
from budgetplan.scenario.model import parse_scenario  # noqa: E402
from trainers.data import shapes  # noqa: E402
from trainers.data.synth import SHAPES, nonsensitive_probability, oracle_aucs, synthesize, true_probability  # noqa: E402

CRITEO_LIKE = ("nonsensitive", "balanced", "sensitive")
ROWS, USERS = 200_000, 40_000


@pytest.fixture(scope="module")
def tables():
    return {name: synthesize(ROWS, USERS, seed=7, shape=name) for name in CRITEO_LIKE}


@pytest.fixture(scope="module")
def oracles(tables):
    return {name: oracle_aucs(t, name) for name, t in tables.items()}


@pytest.mark.parametrize("name", CRITEO_LIKE)
def test_deterministic_per_seed(name):
    a, b = synthesize(3000, 400, seed=5, shape=name), synthesize(3000, 400, seed=5, shape=name)
    assert a.equals(b)
    assert not a.equals(synthesize(3000, 400, seed=6, shape=name))


def test_shapes_share_the_data_and_differ_in_the_labels():
    # Same seed: the same features (the generator draws them identically), other labels.
    a, b = (synthesize(5000, 500, seed=1, shape=n) for n in ("nonsensitive", "sensitive"))
    assert a.drop_columns(["label"]).equals(b.drop_columns(["label"]))
    assert not a.column("label").equals(b.column("label"))


@pytest.mark.parametrize("name", CRITEO_LIKE)
def test_columns_and_feature_spec(tables, name):
    t, spec = tables[name], SHAPES[name].features
    assert t.column_names[:2] == ["user_id", "label"]
    assert set(t.column_names) == set(spec.columns)
    # the spec is a scenario's [features] table for this data
    text = f'name = "x"\n[budget]\nepsilon = 1.0\ndelta = 1e-6\n[privacy]\nadjacency = "replace-one"\n' \
           f'unit = "impression"\n[data]\ndataset_size = {ROWS}\n[algorithm]\nname = "rr"\n{spec.to_toml()}'
    assert parse_scenario(text).features == spec
    days = t.column("days_since_visit")
    assert 0.2 < days.null_count / t.num_rows < 0.3


@pytest.mark.parametrize("name", CRITEO_LIKE)
@pytest.mark.parametrize("seed", [0, 1])
def test_base_rate_is_between_3_and_10_percent(name, seed):
    t = synthesize(100_000, 20_000, seed=seed, shape=name)
    assert 0.03 <= t.column("label").to_numpy().mean() <= 0.10
    assert 0.03 <= true_probability(t, name).mean() <= 0.10


def test_cardinalities_are_as_declared_and_zipf(tables):
    t = tables["balanced"]
    declared = {"publisher": shapes.N_PUBLISHERS, "advertiser": shapes.N_ADVERTISERS,
                "creative": shapes.N_CREATIVES, "remarketing_list": shapes.N_LISTS + 1,
                "interest_segment": shapes.N_SEGMENTS, "past_site": shapes.N_SITES, "ad_format": 5, "device": 4}
    for column, (n, s) in {"publisher": (shapes.N_PUBLISHERS, 1.05), "advertiser": (shapes.N_ADVERTISERS, 1.0),
                           "creative": (shapes.N_CREATIVES, 0.95), "past_site": (shapes.N_SITES, 1.05)}.items():
        codes = t.column(column).combine_chunks().indices.to_numpy()
        assert len(t.column(column).combine_chunks().dictionary) == declared[column]
        # Zipf: the top value's share is 1 / H(n, s), within 5 binomial standard deviations
        top = 1.0 / np.sum(np.arange(1, n + 1, dtype=np.float64) ** -s)
        assert abs(np.mean(codes == 0) - top) < 5 * np.sqrt(top * (1 - top) / ROWS), column
        # a long tail: most values are seen at most a few times, and 10^4 or more are seen
        seen = np.bincount(codes, minlength=n)
        assert np.count_nonzero(seen) >= 9_000 and np.median(seen[seen > 0]) <= 10, column
    for column in ("remarketing_list", "interest_segment", "ad_format", "device"):
        assert len(t.column(column).combine_chunks().dictionary) == declared[column]
    assert max(declared.values()) >= 10**5


def test_rows_per_user_are_heavy_tailed_and_user_attributes_fixed(tables):
    t = tables["sensitive"]
    users = t.column("user_id").to_numpy()
    counts = np.unique(users, return_counts=True)[1]
    assert counts.size == USERS
    assert np.median(counts) <= 3 and counts.max() >= 50 * np.median(counts)
    assert np.mean(counts <= 2) > 0.4 and np.sum(counts >= 100) >= 5
    order = np.argsort(users, kind="stable")
    starts = np.flatnonzero(np.diff(users[order])) + 1
    for column in ("device", "remarketing_list", "interest_segment"):
        codes = t.column(column).combine_chunks().indices.to_numpy()[order]
        first = np.repeat(codes[np.r_[0, starts]], np.diff(np.r_[0, starts, users.size]))
        assert np.array_equal(codes, first), column  # one value per user


def test_oracle_gap_orders_the_shapes(oracles):
    loss = {n: o["relative_auc_loss"] for n, o in oracles.items()}
    assert loss["nonsensitive"] < loss["balanced"] < loss["sensitive"]
    # the calibration of the module docstring, with room for 200k-row noise
    assert loss["nonsensitive"] < 5
    assert 6 < loss["balanced"] < 15
    assert loss["sensitive"] > 40
    for o in oracles.values():
        assert 0.77 < o["auc_all"] < 0.83 and o["auc_nonsensitive"] < o["auc_all"]
        assert o["nonsensitive_method"] == "exact"


def test_sensitive_part_carries_what_the_shape_says(tables):
    from trainers.metrics import auc

    for name, t in tables.items():
        shape = SHAPES[name]
        cols, y = shape.columns_of(t), t.column("label").to_numpy()
        ns, s = auc(y, shape.nonsensitive_part(cols)), auc(y, shape.sensitive_part(cols))
        assert (ns > s) == (name != "sensitive"), (name, ns, s)


def test_monte_carlo_oracle_agrees_with_the_exact_one(tables):
    # Two independent routes to the best non-sensitive-only ranking: the exact z_ns, and the
    # average of the true probability over random draws of the sensitive features.
    from trainers.metrics import auc

    t = tables["balanced"].slice(0, 50_000)
    shape, y = SHAPES["balanced"], t.column("label").to_numpy()
    exact = auc(y, shape.nonsensitive_logit(shape.columns_of(t)))
    mc = auc(y, nonsensitive_probability(t, "balanced", draws=48, seed=3))
    assert abs(exact - mc) < 0.004
    assert mc < exact + 0.002  # Monte Carlo noise can only blur the ranking
    full = auc(y, true_probability(t, "balanced"))
    assert mc < full


def test_read_back_keeps_the_model(tmp_path):
    import pyarrow.parquet as pq

    t = synthesize(4000, 400, seed=3, shape="sensitive")
    pq.write_table(t, tmp_path / "s.parquet")
    back = pq.read_table(tmp_path / "s.parquet")
    assert np.allclose(true_probability(back, "sensitive"), true_probability(t, "sensitive"))
    plain = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in t.columns],
                     names=t.column_names)
    assert np.allclose(true_probability(plain, "sensitive"), true_probability(t, "sensitive"))


def test_bad_shapes_and_tables_are_refused():
    with pytest.raises(InvalidParameterError, match="shape must be one of legacy, nonsensitive, balanced, sensitive"):
        synthesize(10, 2, shape="criteo")
    with pytest.raises(InvalidParameterError, match="column 'advertiser' is not in the table"):
        true_probability(synthesize(10, 2), "balanced")  # legacy columns under a Criteo-like model
    t = synthesize(10, 2, shape="balanced")
    bad = t.set_column(t.column_names.index("creative"), "creative", pa.array(["cr99999"] * 9 + ["cr100000"]))
    with pytest.raises(InvalidParameterError, match="outside the synthetic model of shape 'balanced'"):
        true_probability(bad, "balanced")
    with pytest.raises(InvalidParameterError, match="draws must be an integer >= 1"):
        nonsensitive_probability(t, "balanced", draws=0)
