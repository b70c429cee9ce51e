"""Built-in synthetic ads data with semi-sensitive features and a known conversion model.

A stand-in for the Criteo logs when they are not at hand: the same shape of problem (a rare
binary label, non-sensitive context known to an adversary, sensitive user signals, users with
very different numbers of impressions) with a ground truth, so tests and benchmarks can check
that a trainer recovers signal from each feature group.

Data come in named shapes (``SHAPES``; each with its ``features``, a FeatureSpec whose
``to_toml()`` is a scenario's ``[features]`` table): ``legacy``, the default and the original
generator below, and the Criteo-like ``nonsensitive``, ``balanced`` and ``sensitive`` of
:mod:`trainers.data.shapes`, which differ in how much of the signal the non-sensitive
features carry. The legacy shape leans towards DP-SGD: at 1,000,000 rows (200,000 users,
seed 0) its oracle AUC is 0.793 with all features and 0.672 with the non-sensitive ones
alone (:func:`nonsensitive_probability`, 32 draws), a 58.5% relative AUC loss, and its
cardinalities (at most 5,000 values) are far below Criteo's.

The legacy shape's rows (one impression each) and columns:

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

Examples per user are heavy-tailed, like the Criteo attribution data
(:func:`trainers.data.shapes.heavy_tailed_users`): most users have one or two rows and a few
have hundreds or thousands.

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
the conversion rate near 7%. :func:`true_probability` evaluates the model of any shape on a table
with its columns (e.g. one read back from disk); :func:`oracle_aucs` ranks rows by it and by
the best score from the non-sensitive features alone (:func:`nonsensitive_probability`).

The paper's layouts, ``pctr`` and ``attribution`` (:mod:`trainers.data.layouts`), are drawn
by blocks: :func:`write_synthetic_shards` writes them as a directory of Parquet shards chunk by
chunk, in memory bounded by a chunk (and 4 bytes a row for the users' rows), the same rows
whatever the chunking. Other shapes are written to a directory too, drawn whole first.

Everything is vectorised numpy and deterministic for a given seed; this module never imports
torch.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError
from budgetplan.scenario.model import FeatureSpec
from budgetplan.util import validate
from budgetplan.util.fileio import atomic_output, write_atomic
from trainers.data.layouts import LAYOUTS
from trainers.data.mixed import MIXED
from trainers.data.prepared import Output, shard_name
from trainers.data.shapes import CRITEO_LIKE, Shape, heavy_tailed_users, sigmoid, zipf
from trainers.metrics import auc, relative_auc_loss
from trainers.progress import bar

__all__ = ["synthesize", "write_synthetic", "write_synthetic_shards", "SHARD_ROWS", "SIDECAR", "true_logit",
           "true_probability", "nonsensitive_probability", "oracle_aucs", "get_shape", "SHAPES", "DEFAULT_SHAPE",
           "SYNTH_FEATURES", "INTERCEPT", "MODEL_SEED"]

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


class _Legacy(Shape):
    """The original generator (module docstring); its output for a seed is unchanged."""

    name = "legacy"
    description = "the original generator: cross-group interactions, at most 5,000 values a column"
    features = SYNTH_FEATURES
    dtypes = {"user_id": "int64", "label": "int8", "hour": "int8", "bid_floor": "float32", "slot_position": "int8",
              "days_since_visit": "float32", "visits_7d": "int16"}

    @property
    def categories(self) -> dict[str, tuple[str, ...]]:
        return _CATEGORIES

    def parameters(self) -> dict:
        return {"shape": self.name, "intercept": INTERCEPT, "model_seed": MODEL_SEED,
                "cardinalities": {k: len(v) for k, v in _CATEGORIES.items()}}

    def draw(self, rows: int, users: int, rng) -> dict[str, np.ndarray]:
        user, user_ids = heavy_tailed_users(rng, rows, users)
        device_u = rng.choice(len(DEVICES), users, p=[0.45, 0.4, 0.1, 0.05]).astype(np.int32)
        on_list = rng.random(users) < 0.45
        list_u = np.where(on_list, 1 + zipf(rng, len(LISTS) - 1, users, 1.0), 0).astype(np.int32)
        segment_u = zipf(rng, len(SEGMENTS), users, 0.8)
        visit_rate_u = rng.gamma(0.6, 2.0, users)
        hour_p = 1.0 + 0.6 * np.sin(2 * np.pi * (np.arange(24) - 8) / 24)
        cols = {
            "user_id": user_ids[user],
            "publisher": zipf(rng, len(PUBLISHERS), rows, 1.1),
            "campaign": zipf(rng, len(CAMPAIGNS), rows, 1.0),
            "ad_format": rng.choice(len(AD_FORMATS), rows, p=[0.5, 0.25, 0.1, 0.1, 0.05]).astype(np.int32),
            "hour": rng.choice(24, rows, p=hour_p / hour_p.sum()).astype(np.int8),
            "device": device_u[user],
            "remarketing_list": list_u[user],
            "interest_segment": segment_u[user],
            "past_site": zipf(rng, len(SITES), rows, 1.05),
            "bid_floor": rng.lognormal(-0.5, 0.8, rows).astype(np.float32),
            "slot_position": (1 + zipf(rng, 8, rows, 1.2)).astype(np.int8),
        }
        never = rng.random(rows) < 0.25
        days = (rng.pareto(1.2, rows) * 3.0).astype(np.float32)
        days[never] = np.nan
        cols["days_since_visit"] = days
        cols["visits_7d"] = np.minimum(rng.poisson(visit_rate_u[user]), np.iinfo(np.int16).max).astype(np.int16)
        return cols

    def logit(self, cols) -> np.ndarray:
        e = _effects()
        z = np.full(len(cols["bid_floor"]), INTERCEPT, dtype=np.float64)
        for name in ("publisher", "campaign", "ad_format", "device", "remarketing_list", "interest_segment",
                     "past_site"):
            z += e[name][cols[name]]
        z += e["hour"][np.asarray(cols["hour"], dtype=np.int64)]
        z += e["campaign_x_list"][cols["campaign"], cols["remarketing_list"]]
        z += e["publisher_x_segment"][cols["publisher"], cols["interest_segment"]]
        z += 0.25 * np.log1p(np.asarray(cols["bid_floor"], dtype=np.float64))
        z -= 0.12 * (np.asarray(cols["slot_position"], dtype=np.float64) - 1.0)
        days = np.asarray(cols["days_since_visit"], dtype=np.float64)
        z += np.where(np.isnan(days), -0.3, -0.35 * np.log1p(np.nan_to_num(days)))
        z += 0.3 * np.log1p(np.asarray(cols["visits_7d"], dtype=np.float64))
        return z


DEFAULT_SHAPE = "legacy"
SHARD_ROWS = 2_000_000
SIDECAR = "_synthetic.json"  # "_"-prefixed: readers of the directory's shards skip it (trainers.data.loaders, Spark)
SHAPES: dict[str, Shape] = {"legacy": _Legacy(), **CRITEO_LIKE, **MIXED, **LAYOUTS}


def get_shape(shape: str | Shape) -> Shape:
    """The shape named ``shape`` (a Shape passes through)."""
    if isinstance(shape, Shape):
        return shape
    if not isinstance(shape, str) or shape not in SHAPES:
        raise InvalidParameterError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    return SHAPES[shape]


def true_logit(table, shape: str | Shape = DEFAULT_SHAPE) -> np.ndarray:
    """The true conversion logit of every row of ``table`` (the columns of the shape's features)."""
    s = get_shape(shape)
    return s.logit(s.columns_of(table))


def true_probability(table, shape: str | Shape = DEFAULT_SHAPE) -> np.ndarray:
    """The true conversion probability sigmoid(true_logit) of every row of ``table``."""
    return sigmoid(true_logit(table, shape))


def nonsensitive_probability(table, shape: str | Shape = DEFAULT_SHAPE, *, draws: int = 32,
                             seed: int = 0) -> np.ndarray:
    """A Monte Carlo estimate of E[true probability | the row's non-sensitive features].

    Every shape draws its sensitive features independently of its non-sensitive ones, so
    replacing a row's sensitive features (jointly) by those of a random row is a draw from
    their distribution given the non-sensitive ones; the estimate averages ``draws`` such
    replacements. It is the best non-sensitive-only predictor, up to Monte Carlo error.
    """
    draws = validate.positive_int("draws", draws)
    s = get_shape(shape)
    cols = s.columns_of(table)
    sensitive = set(s.features.sensitive)
    rng = np.random.default_rng(seed)
    n = table.num_rows
    total = np.zeros(n)
    for _ in range(draws):
        perm = rng.permutation(n)
        total += sigmoid(s.logit({k: v[perm] if k in sensitive else v for k, v in cols.items()}))
    return total / draws


def oracle_aucs(table, shape: str | Shape = DEFAULT_SHAPE, *, draws: int = 32) -> dict:
    """AUC of the true probability and of the best non-sensitive-only score against the table's labels.

    The non-sensitive score is exact for a shape that knows it (``Shape.nonsensitive_logit``),
    else :func:`nonsensitive_probability` with ``draws`` draws. ``relative_auc_loss`` is the
    non-sensitive oracle's loss against the all-feature oracle, in percent: roughly where an
    RR-only model plateaus.
    """
    s = get_shape(shape)
    cols = s.columns_of(table)
    y = table.column(s.features.label).to_numpy()
    exact = s.nonsensitive_logit(cols)
    ns = exact if exact is not None else nonsensitive_probability(table, s, draws=draws)
    out = {"shape": s.name, "rows": table.num_rows, "conversion_rate": float(np.mean(y)),
           "auc_all": auc(y, s.logit(cols)), "auc_nonsensitive": auc(y, ns),
           "nonsensitive_method": "exact" if exact is not None else f"monte carlo, {draws} draws"}
    out["relative_auc_loss"] = relative_auc_loss(out["auc_nonsensitive"], out["auc_all"])
    return out


def _check(rows, users, seed, shape) -> tuple[int, int, int, Shape]:
    rows = validate.positive_int("rows", rows)
    users = validate.positive_int("users", users)
    seed = validate.non_negative_int("seed", seed)
    if users > rows:
        raise InvalidParameterError(
            f"users must not exceed rows (every user has a row), got users={users} > rows={rows}")
    return rows, users, seed, get_shape(shape)


def synthesize(rows: int, users: int, seed: int = 0, shape: str | Shape = DEFAULT_SHAPE):
    """A synthetic table of ``rows`` impressions by ``users`` users, deterministic in ``seed``.

    Raises:
        InvalidParameterError: rows or users below 1, users above rows, a negative seed, or an
            unknown shape.
    """
    rows, users, seed, s = _check(rows, users, seed, shape)
    return s.synthesize(rows, users, seed)


def write_synthetic(path, rows: int, users: int, seed: int = 0, format: str = "parquet",
                    shape: str | Shape = DEFAULT_SHAPE) -> dict:
    """Synthesise and write to ``path`` atomically (a temporary file, then ``os.replace``).

    Returns:
        A summary: path, format, shape, rows, users, seed, conversion_rate, bytes, seconds.

    Raises:
        InvalidParameterError: bad sizes, an unknown format or shape, a missing output
            directory, or an output path that is a directory.
    """
    start = time.perf_counter()
    rows, users, seed, s = _check(rows, users, seed, shape)
    if format not in ("parquet", "csv"):
        raise InvalidParameterError(f"format must be parquet or csv, got {format!r}")
    path = Path(path)
    with atomic_output(path) as tmp:
        table = s.synthesize(rows, users, seed)
        if format == "parquet":
            pq.write_table(table, str(tmp))
        else:
            plain = pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                              for c in table.columns], names=table.column_names)
            pacsv.write_csv(plain, str(tmp))
    label = table.column(s.features.label).to_numpy()
    return {"path": str(path), "format": format, "shape": s.name, "rows": rows, "users": users, "seed": seed,
            "conversion_rate": float(label.mean()), "bytes": path.stat().st_size,
            "seconds": time.perf_counter() - start}


def write_synthetic_shards(out, rows: int, users: int, seed: int = 0, shape: str | Shape = DEFAULT_SHAPE, *,
                           shard_rows: int = SHARD_ROWS, progress: bool = False) -> dict:
    """Synthesise into the directory ``out`` as Parquet shards of at most ``shard_rows`` rows, chunk by chunk.

    ``out`` must be new or empty; on failure what was written is removed. The shards are
    ``part-00000.parquet``, ... in row order (read back in order, they are
    :func:`synthesize`'s table), and ``_synthetic.json`` beside them, written last, says
    what they hold. ``progress`` shows a bar on stderr.

    Returns:
        The summary written to ``_synthetic.json``: path, format, shape, rows, users, seed,
        conversion_rate, bytes, seconds, shard_rows, shards (name and rows of each),
        parameters (the shape's model).

    Raises:
        InvalidParameterError: bad sizes, an unknown shape, or an output that is not a new or
            empty directory.
    """
    start = time.perf_counter()
    rows, users, seed, s = _check(rows, users, seed, shape)
    shard_rows = validate.positive_int("shard_rows", shard_rows)
    output = Output(out)
    shards, converted, size = [], 0, 0
    with output:
        shown = bar(f"synthesising {rows:,} rows ({s.name})", rows) if progress else None
        try:
            for i, table in enumerate(s.chunks(rows, users, seed, shard_rows)):
                path = output.path / shard_name(i)
                pq.write_table(table, str(path))
                converted += int(table.column(s.features.label).to_numpy().sum())
                size += path.stat().st_size
                shards.append({"name": path.name, "rows": table.num_rows})
                if shown is not None:
                    shown[0].advance(shown[1], table.num_rows)
        finally:
            if shown is not None:
                shown[0].stop()
        summary = {"path": str(output.path), "format": "parquet", "shape": s.name, "rows": rows, "users": users,
                   "seed": seed, "conversion_rate": converted / rows, "bytes": size, "shard_rows": shard_rows,
                   "shards": shards, "parameters": s.parameters() if hasattr(s, "parameters") else {"shape": s.name}}
        summary["seconds"] = time.perf_counter() - start
        write_atomic(output.path / SIDECAR, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
