"""Named shapes of the built-in synthetic ads data: where the signal sits between the feature groups.

What an RR-only model can reach depends on how much of the signal the non-sensitive features
carry: RR may use only them. The three Criteo-like shapes share columns, distributions and
effect tables and differ in how the true logit weighs the two groups:

    z = intercept + ns_scale * z_ns + s_scale * z_s

``nonsensitive`` puts nearly all the signal in the non-sensitive group; ``balanced`` leaves
the sensitive group the share that Criteo's measured RR plateau suggests (the best
non-sensitive-only model about 10% behind the best model, in relative AUC loss), which is
still most of the logit's variance on the non-sensitive side; ``sensitive`` puts most of the
variance in the sensitive group. All three convert about 5% of impressions and have an
oracle AUC near 0.80. Measured at 1,000,000 rows (200,000 users, data seed 0; labels drawn
from the model; the relative AUC loss is ``100 (AUCloss_ns - AUCloss_all) / AUCloss_all`` as
in arXiv:2401.15246; the share is Var(ns_scale z_ns) / (Var(ns_scale z_ns) + Var(s_scale z_s))):

    shape          ns_scale  s_scale  conversion  AUC all  AUC non-sensitive  relative loss  ns share
    nonsensitive   1.35      0.30     4.98%       0.8040   0.7995             2.3%           97%
    balanced       1.28      0.62     5.00%       0.8060   0.7860             10.3%          86%
    sensitive      0.70      1.30     5.00%       0.7971   0.6653             64.9%          30%

(Seed 1 moves these by about 0.002 AUC.) Generating 1M rows takes about 1 s and a peak RSS of
about 210 MiB (90 MiB of it the interpreter and imports), 10M rows 12 s and 1.0 GiB, on 2
CPU cores.

Columns (one row per impression), with Criteo-like cardinalities and Zipf frequencies:

    user_id           int64    the privacy unit
    label             int8     1 if the impression converted
    publisher         str      non-sensitive, 50,000 values, Zipf(1.05)
    advertiser        str      non-sensitive, 10,000 values, Zipf(1.0)
    creative          str      non-sensitive, 100,000 values, Zipf(0.95)
    ad_format         str      non-sensitive, 5 values
    hour              int8     non-sensitive categorical, 0..23, diurnal
    device            str      non-sensitive, 4 values, fixed per user
    bid_floor         float32  non-sensitive numeric, lognormal(-0.5, 0.8)
    slot_position     int8     non-sensitive numeric, 1..8, Zipf(1.2)
    remarketing_list  str      sensitive, "none" or one of 2,000 lists (Zipf), per user
    interest_segment  str      sensitive, 500 values, Zipf(0.8), per user
    past_site         str      sensitive, 30,000 values, Zipf(1.05)
    days_since_visit  float32  sensitive numeric, Pareto(1.2) x 3, null for a quarter (never visited)
    visits_7d         int16    sensitive numeric, Poisson with a gamma(0.6, 2) rate per user

Rows per user are heavy-tailed (:func:`heavy_tailed_users`). The two parts of the logit:

    z_ns = a_pub[publisher] + a_adv[advertiser] + a_cre[creative] + a_fmt[ad_format]
           + a_hour[hour] + a_dev[device] + c_af[advertiser, ad_format]
           + 0.25 log1p(bid_floor) - 0.12 (slot_position - 1)
    z_s  = b_list[remarketing_list] + b_seg[interest_segment] + b_site[past_site]
           + c_ls[remarketing_list, interest_segment]
           + (-0.35 log1p(days_since_visit), or -0.3 if never visited) + 0.3 log1p(visits_7d)

with fixed tables drawn once from ``MODEL_SEED``: a_pub ~ N(0, .5), a_adv ~ N(0, .5),
a_cre ~ N(0, .3), c_af ~ N(0, .3), b_list ~ N(.6, .4) (0 for "none"), b_seg ~ N(0, .4),
b_site ~ N(0, .4), c_ls ~ N(0, .3) (0 for "none"). Interactions stay within a group, and
every sensitive feature is drawn independently of every non-sensitive one, so the best
ranking from the non-sensitive features alone is by z_ns: E[sigmoid(z) | non-sensitive
features] = E[sigmoid(b + ns_scale z_ns + s_scale Z_s)] over the independent Z_s, which is
increasing in z_ns. That is :meth:`Shape.nonsensitive_logit`, the non-sensitive oracle.

Vectorised numpy, deterministic for a given seed; this module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from budgetplan.errors import InvalidParameterError
from budgetplan.scenario.model import FeatureSpec

__all__ = ["Shape", "CriteoLikeShape", "CRITEO_LIKE", "CRITEO_LIKE_FEATURES", "heavy_tailed_users", "zipf", "sigmoid",
           "MODEL_SEED", "draw_criteo_like", "nonsensitive_part", "sensitive_part",
           "criteo_like_categories"]

MODEL_SEED = 20250601
USER_WEIGHT_SIGMA = 1.8


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def zipf(rng, n_values: int, size: int, s: float) -> np.ndarray:
    """``size`` codes in 0..n_values-1 with P(k) proportional to (k + 1)^-s."""
    cdf = np.cumsum(1.0 / np.arange(1, n_values + 1) ** s)
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size)), n_values - 1).astype(np.int32)


def heavy_tailed_users(rng, rows: int, users: int, *, sigma: float = USER_WEIGHT_SIGMA,
                       max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(the user index of every row, the user ids) with heavy-tailed rows per user.

    Every user has one row and the other ``rows - users`` are spread multinomially with
    lognormal(0, ``sigma``) weights, like the Criteo attribution logs: most users have one or
    two rows and a few hundreds or thousands. With ``max_rows``, no user has more: the rows
    above it are spread again, by the same weights, over the users still below it (the
    default draws exactly what it drew before the option existed). Rows are shuffled, as in
    a time-ordered log.
    """
    weights = rng.lognormal(0.0, sigma, users)
    per_user = 1 + rng.multinomial(rows - users, weights / weights.sum())
    if max_rows is not None:
        if max_rows * users < rows:
            raise InvalidParameterError(f"max_rows = {max_rows} per user cannot hold {rows} rows for {users} users")
        while (over := per_user > max_rows).any():
            excess = int((per_user[over] - max_rows).sum())
            per_user[over] = max_rows
            room = np.where(per_user < max_rows, weights, 0.0)
            per_user += rng.multinomial(excess, room / room.sum())
    user = np.repeat(np.arange(users, dtype=np.int64), per_user)[rng.permutation(rows)]
    return user, rng.permutation(users).astype(np.int64)


class Shape:
    """A synthetic-data generator with a known conversion model.

    A subclass sets ``name``, ``description``, ``features``, ``categories`` (string values of
    every string-valued categorical column, position = code), ``dtypes`` (the Arrow type of
    every other column) and implements :meth:`draw` and :meth:`logit`. Columns are passed
    around as numpy arrays: codes for string categoricals, numbers otherwise, NaN for null.
    """

    name: str
    description: str
    features: FeatureSpec
    dtypes: dict

    @property
    def categories(self) -> dict[str, tuple[str, ...]]:
        raise NotImplementedError

    def draw(self, rows: int, users: int, rng) -> dict[str, np.ndarray]:
        """Every column but the label, as arrays, for ``rows`` rows by ``users`` users."""
        raise NotImplementedError

    def logit(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """The true conversion logit of every row."""
        raise NotImplementedError

    def nonsensitive_logit(self, cols: dict[str, np.ndarray]) -> np.ndarray | None:
        """A score whose ranking is the best from the non-sensitive features alone, if known exactly."""
        return None

    def synthesize(self, rows: int, users: int, seed: int):
        rng = np.random.default_rng(seed)
        cols = self.draw(rows, users, rng)
        p = sigmoid(self.logit(cols))
        cols[self.features.label] = (rng.random(rows) < p).astype(np.int8)
        del p
        spec, out = self.features, {}
        for name in (spec.unit_id, spec.label) + spec.nonsensitive + spec.sensitive:
            values = cols.pop(name)
            if name in self.categories:
                out[name] = pa.DictionaryArray.from_arrays(pa.array(values, pa.int32()),
                                                           pa.array(self.categories[name]))
            elif np.issubdtype(values.dtype, np.floating) and np.isnan(values).any():
                out[name] = pa.array(values, self.dtypes[name], mask=np.isnan(values))
            else:
                out[name] = pa.array(values, self.dtypes[name])
        return pa.table(out)

    def chunks(self, rows: int, users: int, seed: int, chunk_rows: int):
        """The rows of :meth:`synthesize` as tables of at most ``chunk_rows`` consecutive rows.

        Here the whole table is drawn first (this generator's draws span every row); a shape
        that draws by blocks (:class:`trainers.data.layouts.LayoutShape`) streams instead.
        """
        table = self.synthesize(rows, users, seed)
        for start in range(0, rows, chunk_rows):
            yield table.slice(start, chunk_rows)

    def columns_of(self, table) -> dict[str, np.ndarray]:
        """The arrays :meth:`logit` reads, from any table with this shape's columns (e.g. read back)."""
        spec = self.features
        missing = [c for c in spec.nonsensitive + spec.sensitive if c not in table.column_names]
        if missing:
            raise InvalidParameterError(f"column {missing[0]!r} is not in the table")
        cols = {}
        for name in spec.nonsensitive + spec.sensitive:
            if name in self.categories:
                cols[name] = _codes_of(table, name, self.categories[name], self.name)
            else:
                cols[name] = table.column(name).cast(pa.float64()).to_numpy()  # nulls become NaN
        return cols


def _codes_of(table, name: str, values: tuple[str, ...], shape: str) -> np.ndarray:
    """Codes of a string categorical column by value (any string-like type, dictionary or not)."""
    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    encoded = pc.dictionary_encode(column).unify_dictionaries()
    seen = encoded.chunks[0].dictionary.cast(pa.string()).to_pylist() if encoded.num_chunks else []
    position = _positions(values)
    unknown = [v for v in seen if v not in position]
    if unknown:
        raise InvalidParameterError(
            f"column {name!r} has a value outside the synthetic model of shape {shape!r}: {unknown[0]!r}")
    if encoded.null_count:
        raise InvalidParameterError(f"column {name!r} has a missing value; the synthetic model has none")
    lookup = np.array([position[v] for v in seen], dtype=np.int64)
    index = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in encoded.chunks]) \
        if encoded.num_chunks else np.zeros(0, dtype=np.int64)
    return lookup[index]


@lru_cache(maxsize=32)
def _positions(values: tuple[str, ...]) -> dict[str, int]:
    return {v: i for i, v in enumerate(values)}


def _names(prefix: str, n: int) -> tuple[str, ...]:
    width = len(str(n - 1))
    return tuple(f"{prefix}{i:0{width}d}" for i in range(n))


AD_FORMATS = ("banner", "native", "video", "interstitial", "rich_media")
DEVICES = ("desktop", "mobile", "tablet", "ctv")
# Cardinalities of the Criteo-like columns (lists: "none" plus this many).
N_PUBLISHERS, N_ADVERTISERS, N_CREATIVES = 50_000, 10_000, 100_000
N_LISTS, N_SEGMENTS, N_SITES = 2_000, 500, 30_000

CRITEO_LIKE_FEATURES = FeatureSpec(
    label="label",
    unit_id="user_id",
    nonsensitive_categorical=("publisher", "advertiser", "creative", "ad_format", "hour", "device"),
    nonsensitive_numeric=("bid_floor", "slot_position"),
    sensitive_categorical=("remarketing_list", "interest_segment", "past_site"),
    sensitive_numeric=("days_since_visit", "visits_7d"),
)


@lru_cache(maxsize=1)
def _effects() -> dict:
    """The fixed effect tables of the Criteo-like model (same for every shape and data seed)."""
    g = np.random.default_rng(MODEL_SEED)
    b_list = g.normal(0.6, 0.4, N_LISTS + 1)
    b_list[0] = 0.0
    c_ls = g.normal(0.0, 0.3, (N_LISTS + 1, N_SEGMENTS))
    c_ls[0] = 0.0
    hours = np.arange(24)
    return {
        "publisher": g.normal(0.0, 0.5, N_PUBLISHERS),
        "advertiser": g.normal(0.0, 0.5, N_ADVERTISERS),
        "creative": g.normal(0.0, 0.3, N_CREATIVES),
        "ad_format": np.array([0.0, 0.2, 0.35, -0.3, 0.1]),
        "hour": 0.25 * np.sin(2 * np.pi * (hours - 8) / 24),
        "device": np.array([0.0, -0.15, 0.05, -0.4]),
        "advertiser_x_format": g.normal(0.0, 0.3, (N_ADVERTISERS, len(AD_FORMATS))),
        "remarketing_list": b_list,
        "interest_segment": g.normal(0.0, 0.4, N_SEGMENTS),
        "past_site": g.normal(0.0, 0.4, N_SITES),
        "list_x_segment": c_ls,
    }


def draw_criteo_like(rng, rows: int, users: int, *, user_sigma: float = USER_WEIGHT_SIGMA,
                     max_user_rows: int | None = None) -> dict[str, np.ndarray]:
    """Every Criteo-like column but the label (the module docstring's table), rows per user as
    :func:`heavy_tailed_users` draws them with ``user_sigma`` and ``max_user_rows``."""
    user, user_ids = heavy_tailed_users(rng, rows, users, sigma=user_sigma, max_rows=max_user_rows)
    device_u = rng.choice(len(DEVICES), users, p=[0.45, 0.4, 0.1, 0.05]).astype(np.int32)
    on_list = rng.random(users) < 0.45
    list_u = np.where(on_list, 1 + zipf(rng, N_LISTS, users, 1.0), 0).astype(np.int32)
    segment_u = zipf(rng, N_SEGMENTS, users, 0.8)
    visit_rate_u = rng.gamma(0.6, 2.0, users)
    hour_p = 1.0 + 0.6 * np.sin(2 * np.pi * (np.arange(24) - 8) / 24)
    days = (rng.pareto(1.2, rows) * 3.0).astype(np.float32)
    days[rng.random(rows) < 0.25] = np.nan
    return {
        "user_id": user_ids[user],
        "publisher": zipf(rng, N_PUBLISHERS, rows, 1.05),
        "advertiser": zipf(rng, N_ADVERTISERS, rows, 1.0),
        "creative": zipf(rng, N_CREATIVES, rows, 0.95),
        "ad_format": rng.choice(len(AD_FORMATS), rows, p=[0.5, 0.25, 0.1, 0.1, 0.05]).astype(np.int32),
        "hour": rng.choice(24, rows, p=hour_p / hour_p.sum()).astype(np.int8),
        "device": device_u[user],
        "bid_floor": rng.lognormal(-0.5, 0.8, rows).astype(np.float32),
        "slot_position": (1 + zipf(rng, 8, rows, 1.2)).astype(np.int8),
        "remarketing_list": list_u[user],
        "interest_segment": segment_u[user],
        "past_site": zipf(rng, N_SITES, rows, 1.05),
        "days_since_visit": days,
        "visits_7d": np.minimum(rng.poisson(visit_rate_u[user]), np.iinfo(np.int16).max).astype(np.int16),
    }


def nonsensitive_part(cols) -> np.ndarray:
    """z_ns of the Criteo-like model (module docstring), before scaling."""
    e = _effects()
    fmt = np.asarray(cols["ad_format"], dtype=np.int64)
    z = e["publisher"][cols["publisher"]] + e["advertiser"][cols["advertiser"]] + e["creative"][cols["creative"]]
    z += e["ad_format"][fmt] + e["hour"][np.asarray(cols["hour"], dtype=np.int64)] + e["device"][cols["device"]]
    z += e["advertiser_x_format"][cols["advertiser"], fmt]
    z += 0.25 * np.log1p(np.asarray(cols["bid_floor"], dtype=np.float64))
    z -= 0.12 * (np.asarray(cols["slot_position"], dtype=np.float64) - 1.0)
    return z


def sensitive_part(cols) -> np.ndarray:
    """z_s of the Criteo-like model (module docstring), before scaling."""
    e = _effects()
    z = e["remarketing_list"][cols["remarketing_list"]] + e["interest_segment"][cols["interest_segment"]]
    z += e["past_site"][cols["past_site"]] + e["list_x_segment"][cols["remarketing_list"], cols["interest_segment"]]
    days = np.asarray(cols["days_since_visit"], dtype=np.float64)
    z += np.where(np.isnan(days), -0.3, -0.35 * np.log1p(np.nan_to_num(days)))
    z += 0.3 * np.log1p(np.asarray(cols["visits_7d"], dtype=np.float64))
    return z


@dataclass(frozen=True, eq=False)
class CriteoLikeShape(Shape):
    """The Criteo-like generator with the logit ``intercept + ns_scale z_ns + s_scale z_s``."""

    name: str
    description: str
    ns_scale: float
    s_scale: float
    intercept: float
    features: FeatureSpec = CRITEO_LIKE_FEATURES
    dtypes: dict = field(default_factory=lambda: {
        "user_id": "int64", "label": "int8", "hour": "int8", "bid_floor": "float32", "slot_position": "int8",
        "days_since_visit": "float32", "visits_7d": "int16"})

    @property
    def categories(self) -> dict[str, tuple[str, ...]]:
        return criteo_like_categories()

    def parameters(self) -> dict:
        """What defines the shape's data (recorded beside results made from it)."""
        return {"shape": self.name, "ns_scale": self.ns_scale, "s_scale": self.s_scale, "intercept": self.intercept,
                "model_seed": MODEL_SEED, "cardinalities": {k: len(v) for k, v in self.categories.items()}}

    def draw(self, rows: int, users: int, rng) -> dict[str, np.ndarray]:
        return draw_criteo_like(rng, rows, users)

    def nonsensitive_part(self, cols) -> np.ndarray:
        """z_ns, before scaling."""
        return nonsensitive_part(cols)

    def sensitive_part(self, cols) -> np.ndarray:
        """z_s, before scaling."""
        return sensitive_part(cols)

    def logit(self, cols) -> np.ndarray:
        z = self.nonsensitive_part(cols)
        z *= self.ns_scale
        z += self.s_scale * self.sensitive_part(cols)
        z += self.intercept
        return z

    def nonsensitive_logit(self, cols) -> np.ndarray:
        return self.ns_scale * self.nonsensitive_part(cols)


@lru_cache(maxsize=1)
def criteo_like_categories() -> dict[str, tuple[str, ...]]:
    return {"publisher": _names("pub", N_PUBLISHERS), "advertiser": _names("adv", N_ADVERTISERS),
            "creative": _names("cr", N_CREATIVES), "ad_format": AD_FORMATS, "device": DEVICES,
            "remarketing_list": ("none",) + _names("rl", N_LISTS), "interest_segment": _names("seg", N_SEGMENTS),
            "past_site": _names("site", N_SITES)}


CRITEO_LIKE = {
    s.name: s for s in (
        CriteoLikeShape(name="nonsensitive", description="signal mostly in the non-sensitive features",
                        ns_scale=1.35, s_scale=0.30, intercept=-3.41),
        CriteoLikeShape(name="balanced", description="the non-sensitive features alone lose about 10% "
                        "(relative AUC loss), like Criteo's RR plateau", ns_scale=1.28, s_scale=0.62, intercept=-3.43),
        CriteoLikeShape(name="sensitive", description="signal mostly in the sensitive features",
                        ns_scale=0.7, s_scale=1.3, intercept=-3.46),
    )
}
