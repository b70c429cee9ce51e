"""Built-in synthetic ads data with semi-sensitive features and a known conversion model.

A stand-in for the Criteo logs when they are not at hand: the same shape of problem (a rare
binary label, non-sensitive context known to an adversary, sensitive user signals, users with
very different numbers of impressions) with a ground truth, so tests and benchmarks can check
that a trainer recovers signal from each feature group.

Rows (one impression each) and columns:

    user_id           int64   the privacy unit
    label             int8    1 if the impression converted
    publisher         str     non-sensitive categorical, 500 values, Zipf
    campaign          str     non-sensitive categorical, 200 values, Zipf
    ad_format         str     non-sensitive categorical, 5 values
    hour              int8    non-sensitive categorical, 0..23, diurnal
    device            str     non-sensitive categorical, 4 values, fixed per user
    bid_floor         float32 non-sensitive numeric, lognormal
    slot_position     int8    non-sensitive numeric, 1..8
    remarketing_list  str     sensitive categorical, "none" or one of 100 lists, per user
    interest_segment  str     sensitive categorical, 50 values, per user
    past_site         str     sensitive categorical, 5000 values, Zipf
    days_since_visit  float32 sensitive numeric, Pareto (heavy-tailed), null if never visited
    visits_7d         int16   sensitive numeric, gamma-Poisson count, rate per user

Examples per user are heavy-tailed, like the Criteo attribution data: every user has at least
one row and the remaining ``rows - users`` are spread multinomially with lognormal(0, 1.8)
weights, so most users have one or two rows and a few have hundreds or thousands. Rows are
shuffled, so a user's rows are spread through the table as in a time-ordered log.

The label is Bernoulli(sigmoid(z)) with

    z = b0 + a_pub[publisher] + a_camp[campaign] + a_fmt[ad_format] + a_hour[hour]
           + a_dev[device] + 0.25 log1p(bid_floor) - 0.12 (slot_position - 1)
           + b_list[remarketing_list] + b_seg[interest_segment] + b_site[past_site]
           + (-0.35 log1p(days_since_visit), or -0.3 if never visited) + 0.3 log1p(visits_7d)
           + c_cl[campaign, remarketing_list] + c_ps[publisher, interest_segment]

The effect tables are drawn once from a fixed generator (``MODEL_SEED``), independent of the
data seed: a_pub ~ N(0, .4), a_camp ~ N(0, .5), b_list ~ N(.6, .4) (0 for "none"),
b_seg ~ N(0, .4), b_site ~ N(0, .3), c_cl ~ N(0, .6) (0 for "none"), c_ps ~ N(0, .4).
Both feature groups and the two cross-group interactions carry signal; b0 = ``INTERCEPT`` puts
the conversion rate near 7%. :func:`true_probability` evaluates the model on any table with
these columns (e.g. one read back from disk).

Everything is vectorised numpy and deterministic for a given seed; this module never imports
torch.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from budgetplan._files import atomic_output
from budgetplan.errors import InvalidParameterError
from budgetplan.scenario import FeatureSpec

__all__ = ["synthesize", "write_synthetic", "true_logit", "true_probability", "SYNTH_FEATURES",
           "INTERCEPT", "MODEL_SEED"]

SYNTH_FEATURES = FeatureSpec(
    label="label",
    unit_id="user_id",
    nonsensitive_categorical=("publisher", "campaign", "ad_format", "hour", "device"),
    nonsensitive_numeric=("bid_floor", "slot_position"),
    sensitive_categorical=("remarketing_list", "interest_segment", "past_site"),
    sensitive_numeric=("days_since_visit", "visits_7d"),
)

MODEL_SEED = 20240115
INTERCEPT = -3.2
USER_WEIGHT_SIGMA = 1.8

PUBLISHERS = tuple(f"pub{i:04d}" for i in range(500))
CAMPAIGNS = tuple(f"cmp{i:03d}" for i in range(200))
AD_FORMATS = ("banner", "native", "video", "interstitial", "rich_media")
DEVICES = ("desktop", "mobile", "tablet", "ctv")
LISTS = ("none",) + tuple(f"rl{i:03d}" for i in range(100))
SEGMENTS = tuple(f"seg{i:02d}" for i in range(50))
SITES = tuple(f"site{i:04d}" for i in range(5000))
_CATEGORIES = {"publisher": PUBLISHERS, "campaign": CAMPAIGNS, "ad_format": AD_FORMATS, "device": DEVICES,
               "remarketing_list": LISTS, "interest_segment": SEGMENTS, "past_site": SITES}


@lru_cache(maxsize=1)
def _effects() -> dict:
    """The fixed effect tables of the true model (same for every data seed)."""
    g = np.random.default_rng(MODEL_SEED)
    b_list = g.normal(0.6, 0.4, len(LISTS))
    b_list[0] = 0.0
    c_cl = g.normal(0.0, 0.6, (len(CAMPAIGNS), len(LISTS)))
    c_cl[:, 0] = 0.0
    hours = np.arange(24)
    return {
        "publisher": g.normal(0.0, 0.4, len(PUBLISHERS)),
        "campaign": g.normal(0.0, 0.5, len(CAMPAIGNS)),
        "ad_format": np.array([0.0, 0.2, 0.35, -0.3, 0.1]),
        "hour": 0.25 * np.sin(2 * np.pi * (hours - 8) / 24),
        "device": np.array([0.0, -0.15, 0.05, -0.4]),
        "remarketing_list": b_list,
        "interest_segment": g.normal(0.0, 0.4, len(SEGMENTS)),
        "past_site": g.normal(0.0, 0.3, len(SITES)),
        "campaign_x_list": c_cl,
        "publisher_x_segment": g.normal(0.0, 0.4, (len(PUBLISHERS), len(SEGMENTS))),
    }


def _logit(codes: dict, bid_floor, slot_position, days_since_visit, visits_7d) -> np.ndarray:
    """The true logit from category codes and raw numeric values (NaN days: never visited)."""
    e = _effects()
    z = np.full(len(bid_floor), INTERCEPT, dtype=np.float64)
    for name in ("publisher", "campaign", "ad_format", "hour", "device", "remarketing_list",
                 "interest_segment", "past_site"):
        z += e[name][codes[name]]
    z += e["campaign_x_list"][codes["campaign"], codes["remarketing_list"]]
    z += e["publisher_x_segment"][codes["publisher"], codes["interest_segment"]]
    z += 0.25 * np.log1p(bid_floor) - 0.12 * (slot_position - 1.0)
    days = np.asarray(days_since_visit, dtype=np.float64)
    z += np.where(np.isnan(days), -0.3, -0.35 * np.log1p(np.nan_to_num(days)))
    z += 0.3 * np.log1p(visits_7d)
    return z


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _zipf(rng, n_values: int, size: int, s: float) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, n_values + 1) ** s)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_values - 1).astype(np.int32)


def _codes_of(table, name: str) -> np.ndarray:
    """Codes 0..k-1 of a synthetic categorical column, by value (any string-like type)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    encoded = pc.dictionary_encode(column).unify_dictionaries()
    values = encoded.chunks[0].dictionary.cast(pa.string()).to_pylist() if encoded.num_chunks else []
    position = {v: i for i, v in enumerate(_CATEGORIES[name])}
    unknown = [v for v in values if v not in position]
    if unknown:
        raise InvalidParameterError(f"column {name!r} has a value outside the synthetic model: {unknown[0]!r}")
    lookup = np.array([position[v] for v in values], dtype=np.int64)
    if encoded.null_count:
        raise InvalidParameterError(f"column {name!r} has a missing value; the synthetic model has none")
    index = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in encoded.chunks]) \
        if encoded.num_chunks else np.zeros(0, dtype=np.int64)
    return lookup[index]


def true_logit(table) -> np.ndarray:
    """The true conversion logit of every row of ``table`` (the columns of SYNTH_FEATURES)."""
    import pyarrow as pa

    missing = [c for c in SYNTH_FEATURES.nonsensitive + SYNTH_FEATURES.sensitive if c not in table.column_names]
    if missing:
        raise InvalidParameterError(f"column {missing[0]!r} is not in the table")
    codes = {name: _codes_of(table, name) for name in _CATEGORIES}
    codes["hour"] = table.column("hour").to_numpy().astype(np.int64)

    def floats(name):
        return table.column(name).cast(pa.float64()).to_numpy()  # nulls become NaN

    return _logit(codes, floats("bid_floor"), floats("slot_position"), floats("days_since_visit"),
                  floats("visits_7d"))


def true_probability(table) -> np.ndarray:
    """The true conversion probability sigmoid(true_logit) of every row of ``table``."""
    return _sigmoid(true_logit(table))


def _check(rows, users, seed) -> tuple[int, int, int]:
    from budgetplan import _validate

    rows = _validate.positive_int("rows", rows)
    users = _validate.positive_int("users", users)
    seed = _validate.non_negative_int("seed", seed)
    if users > rows:
        raise InvalidParameterError(
            f"users must not exceed rows (every user has a row), got users={users} > rows={rows}")
    return rows, users, seed


def synthesize(rows: int, users: int, seed: int = 0):
    """A synthetic table of ``rows`` impressions by ``users`` users, deterministic in ``seed``.

    Raises:
        InvalidParameterError: rows or users below 1, users above rows, or a negative seed.
    """
    import pyarrow as pa

    rows, users, seed = _check(rows, users, seed)
    rng = np.random.default_rng(seed)

    # Heavy-tailed rows per user: one each, the rest spread by lognormal weights.
    weights = rng.lognormal(0.0, USER_WEIGHT_SIGMA, users)
    per_user = 1 + rng.multinomial(rows - users, weights / weights.sum())
    user = np.repeat(np.arange(users, dtype=np.int64), per_user)[rng.permutation(rows)]
    user_ids = rng.permutation(users).astype(np.int64)

    # Per-user attributes.
    device_u = rng.choice(len(DEVICES), users, p=[0.45, 0.4, 0.1, 0.05]).astype(np.int32)
    on_list = rng.random(users) < 0.45
    list_u = np.where(on_list, 1 + _zipf(rng, len(LISTS) - 1, users, 1.0), 0).astype(np.int32)
    segment_u = _zipf(rng, len(SEGMENTS), users, 0.8)
    visit_rate_u = rng.gamma(0.6, 2.0, users)

    hour_p = 1.0 + 0.6 * np.sin(2 * np.pi * (np.arange(24) - 8) / 24)
    codes = {
        "publisher": _zipf(rng, len(PUBLISHERS), rows, 1.1),
        "campaign": _zipf(rng, len(CAMPAIGNS), rows, 1.0),
        "ad_format": rng.choice(len(AD_FORMATS), rows, p=[0.5, 0.25, 0.1, 0.1, 0.05]).astype(np.int32),
        "hour": rng.choice(24, rows, p=hour_p / hour_p.sum()).astype(np.int8),
        "device": device_u[user],
        "remarketing_list": list_u[user],
        "interest_segment": segment_u[user],
        "past_site": _zipf(rng, len(SITES), rows, 1.05),
    }
    bid_floor = rng.lognormal(-0.5, 0.8, rows).astype(np.float32)
    slot_position = (1 + _zipf(rng, 8, rows, 1.2)).astype(np.int8)
    never = rng.random(rows) < 0.25
    days = (rng.pareto(1.2, rows) * 3.0).astype(np.float32)
    days_nan = np.where(never, np.float32(np.nan), days)
    visits = np.minimum(rng.poisson(visit_rate_u[user]), np.iinfo(np.int16).max).astype(np.int16)

    p = _sigmoid(_logit(codes, bid_floor.astype(np.float64), slot_position.astype(np.float64),
                        days_nan, visits.astype(np.float64)))
    label = (rng.random(rows) < p).astype(np.int8)

    def category(name):
        return pa.DictionaryArray.from_arrays(pa.array(codes[name], pa.int32()), pa.array(_CATEGORIES[name]))

    return pa.table({
        "user_id": pa.array(user_ids[user]),
        "label": pa.array(label),
        "publisher": category("publisher"),
        "campaign": category("campaign"),
        "ad_format": category("ad_format"),
        "hour": pa.array(codes["hour"]),
        "device": category("device"),
        "bid_floor": pa.array(bid_floor),
        "slot_position": pa.array(slot_position),
        "remarketing_list": category("remarketing_list"),
        "interest_segment": category("interest_segment"),
        "past_site": category("past_site"),
        "days_since_visit": pa.array(days, mask=never),
        "visits_7d": pa.array(visits),
    })


def write_synthetic(path, rows: int, users: int, seed: int = 0, format: str = "parquet") -> dict:
    """Synthesise and write to ``path`` atomically (a temporary file, then ``os.replace``).

    Returns:
        A summary: path, format, rows, users, seed, conversion_rate, bytes, seconds.

    Raises:
        InvalidParameterError: bad sizes, an unknown format, a missing output directory, or an
            output path that is a directory.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    start = time.perf_counter()
    rows, users, seed = _check(rows, users, seed)
    if format not in ("parquet", "csv"):
        raise InvalidParameterError(f"format must be parquet or csv, got {format!r}")
    path = Path(path)
    with atomic_output(path) as tmp:
        table = synthesize(rows, users, seed)
        if format == "parquet":
            pq.write_table(table, str(tmp))
        else:
            plain = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                              for c in table.columns], names=table.column_names)
            pacsv.write_csv(plain, str(tmp))
    label = table.column("label").to_numpy()
    return {"path": str(path), "format": format, "rows": rows, "users": users, "seed": seed,
            "conversion_rate": float(label.mean()), "bytes": path.stat().st_size,
            "seconds": time.perf_counter() - start}
