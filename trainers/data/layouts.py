"""The paper's data layouts as synthetic shapes, generated chunk by chunk: Criteo pCTR and Criteo attribution.

The Hybrid paper (arXiv:2401.15246) trains on Criteo pCTR (Display Advertising: 13 numeric
and 26 categorical columns, split into 20 non-sensitive and 19 sensitive) and Criteo
attribution. These shapes have those layouts, as ``benchmarks/harness.py`` models them,
with a known logistic model in the style of :mod:`trainers.data.shapes`:

    z = intercept + ns_scale * z_ns + s_scale * z_s

where z_ns sums an effect per non-sensitive categorical column (a table drawn once from the
layout's model seed, N(0, effect) per value), one within-group interaction, and for each
numeric column ``beta log1p(x)`` (or a fixed effect when it is missing); z_s likewise over
the sensitive columns. Sensitive and non-sensitive features are drawn independently, so z_ns
ranks rows as well as the non-sensitive features can (:meth:`LayoutShape.nonsensitive_logit`).

Layouts (categorical columns are int32 codes 0..size-1, code 0 the most frequent, Zipf;
numeric columns float32 counts, floor of a lognormal, null where missing; a few columns are
fixed per user, as device and lists are in the Criteo-like shapes):

- ``pctr``: ``c1..c13`` and ``i1..i7`` non-sensitive, ``c14..c26`` and ``i8..i13``
  sensitive. Cardinalities are the Criteo Kaggle Display counts hashed to at most 10^6
  (five columns reach 10^6, three more exceed 10^4); missing fractions roughly Criteo's.
  Per user: c6, c9 (non-sensitive), c14, c17, c19 and i8 (a gamma-Poisson count).
- ``attribution``: ``campaign``, ``cat1..cat5``, ``cost``, ``cpo`` non-sensitive;
  ``cat6..cat9``, ``time_since_last_click``, ``clicks_30d`` sensitive; per user: cat1, cat6,
  cat8 and clicks_30d.

Calibrated at 1,000,000 rows (200,000 users, data seed 0) like the Criteo-like shapes (the
relative AUC loss of the non-sensitive oracle as in arXiv:2401.15246):

    shape        ns_scale  s_scale  intercept  conversion  AUC all  AUC non-sensitive  relative loss
    pctr         1.10      0.50     -4.52      4.94%       0.7994   0.7794             9.9%
    attribution  1.25      0.55     -3.58      5.00%       0.8049   0.7860             9.7%

(Seed 1 moves these by about 0.002 AUC.) Both leave the non-sensitive features about 10%
behind in relative AUC loss, like the balanced Criteo-like shape (Criteo's measured RR plateau).

Generation streams: the rows are a deterministic function of (seed, rows, users, shape)
whatever the chunking. Per-user draws (rows per user, heavy-tailed as in
:func:`trainers.data.shapes.heavy_tailed_users`; the shuffled user of every row; the per-user
columns) come first from a stream of their own, O(users) memory plus 4 bytes a row; the
other columns and the label are drawn in fixed blocks of ``BLOCK_ROWS`` rows, block j from
its own generator seeded by (seed, j), so a chunk is the blocks it overlaps, sliced.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import pyarrow as pa

from budgetplan.errors import InvalidParameterError
from budgetplan.scenario.model import FeatureSpec
from trainers.data.shapes import USER_WEIGHT_SIGMA, Shape, sigmoid

__all__ = ["Column", "LayoutShape", "LAYOUTS", "BLOCK_ROWS"]

BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class Column:
    """One column of a layout: ``kind`` "cat" (``size`` codes, Zipf(``zipf``)) or "num" (a count)."""

    name: str
    sensitive: bool
    kind: str
    size: int = 0
    zipf: float = 1.05
    per_user: bool = False
    missing: float = 0.0  # numeric: the fraction of rows with no value
    mu: float = 1.0  # numeric: floor(lognormal(mu, sigma)); per-user numerics are Poisson(gamma(0.6, 2))
    sigma: float = 1.2


@lru_cache(maxsize=64)
def _zipf_cdf(n: int, s: float) -> np.ndarray:
    cdf = np.cumsum(1.0 / np.arange(1, n + 1, dtype=np.float64) ** s)
    cdf /= cdf[-1]
    return cdf


def _zipf(rng, n: int, size: int, s: float) -> np.ndarray:
    """As :func:`trainers.data.shapes.zipf`, with the cumulative table cached (10^6-value columns)."""
    return np.minimum(np.searchsorted(_zipf_cdf(n, s), rng.random(size)), n - 1).astype(np.int32)


class LayoutShape(Shape):
    """A layout's generator and model (module docstring); chunked generation through :meth:`chunks`."""

    def __init__(self, name: str, description: str, columns: tuple[Column, ...], *, interactions, model_seed: int,
                 effect: float, ns_scale: float, s_scale: float, intercept: float):
        self.name, self.description, self.columns = name, description, columns
        self.interactions = tuple(interactions)  # (column a, column b): a table of N(0, 0.3) per pair of values
        self.model_seed, self.effect = model_seed, effect
        self.ns_scale, self.s_scale, self.intercept = ns_scale, s_scale, intercept
        self._by_name = {c.name: c for c in columns}

        def names(sensitive, kind):
            return tuple(c.name for c in columns if c.sensitive == sensitive and c.kind == kind)

        self.features = FeatureSpec(
            label="label", unit_id="user_id", nonsensitive_categorical=names(False, "cat"),
            nonsensitive_numeric=names(False, "num"), sensitive_categorical=names(True, "cat"),
            sensitive_numeric=names(True, "num"))
        self.dtypes = {"user_id": "int64", "label": "int8"} | {
            c.name: "int32" if c.kind == "cat" else "float32" for c in columns}

    @property
    def categories(self) -> dict[str, tuple[str, ...]]:
        return {}  # codes, not strings: at 10^6 values a column a string dictionary would dwarf the data

    def parameters(self) -> dict:
        return {"shape": self.name, "ns_scale": self.ns_scale, "s_scale": self.s_scale, "intercept": self.intercept,
                "model_seed": self.model_seed, "effect": self.effect,
                "cardinalities": {c.name: c.size for c in self.columns if c.kind == "cat"}}

    @cached_property
    def _effects(self) -> dict:
        """Per categorical column a table, per numeric column (beta, missing effect), per interaction a table."""
        g = np.random.default_rng(self.model_seed)
        out: dict = {}
        for c in self.columns:
            out[c.name] = g.normal(0.0, self.effect, c.size) if c.kind == "cat" else \
                (g.normal(0.0, 0.15), g.normal(0.0, 0.2))
        for a, b in self.interactions:
            out[(a, b)] = g.normal(0.0, 0.3, (self._by_name[a].size, self._by_name[b].size))
        return out

    # ------------------------------------------------------------------ the model

    def _part(self, cols, sensitive: bool) -> np.ndarray:
        e = self._effects
        z = None
        for c in self.columns:
            if c.sensitive != sensitive:
                continue
            if c.kind == "cat":
                term = e[c.name][cols[c.name]]
            else:
                beta, gone = e[c.name]
                x = np.asarray(cols[c.name], dtype=np.float64)
                term = np.where(np.isnan(x), gone, beta * np.log1p(np.nan_to_num(x)))
            z = term if z is None else z + term
        for a, b in self.interactions:
            if self._by_name[a].sensitive == sensitive:
                z += e[(a, b)][cols[a], cols[b]]
        return z

    def nonsensitive_part(self, cols) -> np.ndarray:
        """z_ns, before scaling."""
        return self._part(cols, False)

    def sensitive_part(self, cols) -> np.ndarray:
        """z_s, before scaling."""
        return self._part(cols, True)

    def logit(self, cols) -> np.ndarray:
        z = self.ns_scale * self.nonsensitive_part(cols)
        z += self.s_scale * self.sensitive_part(cols)
        z += self.intercept
        return z

    def nonsensitive_logit(self, cols) -> np.ndarray:
        return self.ns_scale * self.nonsensitive_part(cols)

    def columns_of(self, table) -> dict[str, np.ndarray]:
        cols = {}
        for c in self.columns:
            if c.name not in table.column_names:
                raise InvalidParameterError(f"column {c.name!r} is not in the table")
            x = table.column(c.name).cast(pa.float64()).to_numpy()  # nulls become NaN
            if c.kind == "cat":
                bad = ~((x >= 0) & (x < c.size) & (x == np.floor(x)))  # NaN included
                if bad.any():
                    raise InvalidParameterError(f"column {c.name!r} has a value outside the synthetic model of shape "
                                                f"{self.name!r}: {x[bad][0]!r} (codes 0..{c.size - 1})")
                x = x.astype(np.int64)
            cols[c.name] = x
        return cols

    # ------------------------------------------------------------------ generation

    def draw(self, rows: int, users: int, rng) -> dict[str, np.ndarray]:
        raise NotImplementedError(f"shape {self.name!r} draws by blocks: use chunks() or synthesize()")

    def _users(self, rows: int, users: int, seed: int):
        """(the user index of every row, the user ids, the per-user columns): the per-user stream."""
        rng = np.random.default_rng([seed, 0])
        weights = rng.lognormal(0.0, USER_WEIGHT_SIGMA, users)
        per_user = 1 + rng.multinomial(rows - users, weights / weights.sum())
        del weights
        user = np.repeat(np.arange(users, dtype=np.int32 if users < 2**31 else np.int64), per_user)
        del per_user
        rng.shuffle(user)  # in place: a time-ordered log, 4 bytes a row
        user_ids = rng.permutation(users).astype(np.int64)
        attrs = {}
        for c in self.columns:
            if c.per_user:
                attrs[c.name] = _zipf(rng, c.size, users, c.zipf) if c.kind == "cat" else \
                    rng.gamma(0.6, 2.0, users).astype(np.float32)  # a rate, drawn into a count per row
        return user, user_ids, attrs

    def _block(self, j: int, user: np.ndarray, attrs: dict, seed: int) -> dict[str, np.ndarray]:
        """Every column but the ids, and the label, of the rows of block j (``user``: their user indices)."""
        rng = np.random.default_rng([seed, 1, j])
        n = user.size
        cols: dict[str, np.ndarray] = {}
        for c in self.columns:
            if c.kind == "cat":
                cols[c.name] = attrs[c.name][user] if c.per_user else _zipf(rng, c.size, n, c.zipf)
            elif c.per_user:
                cols[c.name] = rng.poisson(attrs[c.name][user]).astype(np.float32)
            else:
                x = np.floor(rng.lognormal(c.mu, c.sigma, n)).astype(np.float32)
                x[rng.random(n) < c.missing] = np.nan
                cols[c.name] = x
        cols["label"] = (rng.random(n) < sigmoid(self.logit(cols))).astype(np.int8)
        return cols

    def chunks(self, rows: int, users: int, seed: int, chunk_rows: int):
        """Tables of at most ``chunk_rows`` consecutive rows; the same rows however they are chunked."""
        user, user_ids, attrs = self._users(rows, users, seed)
        for start in range(0, rows, chunk_rows):
            stop = min(rows, start + chunk_rows)
            first, last = start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS
            blocks = [self._block(j, user[j * BLOCK_ROWS:min(rows, (j + 1) * BLOCK_ROWS)], attrs, seed)
                      for j in range(first, last + 1)]
            lo, hi = start - first * BLOCK_ROWS, stop - first * BLOCK_ROWS
            cols = {k: np.concatenate([b[k] for b in blocks])[lo:hi] for k in blocks[0]}
            del blocks
            cols["user_id"] = user_ids[user[start:stop]]
            yield self._table(cols)

    def _table(self, cols: dict[str, np.ndarray]):
        out = {}
        for name in (self.features.unit_id, self.features.label) + self.features.nonsensitive \
                + self.features.sensitive:
            values = cols.pop(name)
            mask = np.isnan(values) if values.dtype.kind == "f" else None
            out[name] = pa.array(values, self.dtypes[name], mask=mask if mask is not None and mask.any() else None)
        return pa.table(out)

    def synthesize(self, rows: int, users: int, seed: int):
        return pa.concat_tables(self.chunks(rows, users, seed, rows))


def _c(i: int, size: int, **kw) -> Column:
    return Column(f"c{i}", i > 13, "cat", min(size, PCTR_HASH_BINS), **kw)


# Criteo Kaggle Display Advertising Challenge: distinct values of C1..C26 (as counted for
# DLRM's Kaggle benchmark), hashed to at most 10^6.
CRITEO_DISPLAY_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                                27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
PCTR_HASH_BINS = 1_000_000
_PCTR_PER_USER = {6, 9, 14, 17, 19}
_PCTR_MISSING = (0.45, 0.0, 0.02, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)

PCTR = LayoutShape(
    "pctr", "the Criteo pCTR (Display) layout: 13 numeric and 26 categorical columns, up to 10^6 values a column",
    tuple(_c(i, n, per_user=i in _PCTR_PER_USER) for i, n in enumerate(CRITEO_DISPLAY_CARDINALITIES, 1))
    + tuple(Column(f"i{i}", i > 7, "num", per_user=i == 8, missing=_PCTR_MISSING[i - 1]) for i in range(1, 14)),
    interactions=[("c2", "c5"), ("c14", "c19")], model_seed=20250701, effect=0.25,
    ns_scale=1.1, s_scale=0.5, intercept=-4.52)

ATTRIBUTION = LayoutShape(
    "attribution", "the Criteo attribution layout: 8 non-sensitive and 6 sensitive columns",
    (Column("campaign", False, "cat", 675, 1.0), Column("cat1", False, "cat", 11, 0.9, per_user=True),
     Column("cat2", False, "cat", 60), Column("cat3", False, "cat", 1_800), Column("cat4", False, "cat", 30),
     Column("cat5", False, "cat", 25), Column("cost", False, "num", mu=0.5, sigma=1.0),
     Column("cpo", False, "num", mu=2.0, sigma=1.0, missing=0.1),
     Column("cat6", True, "cat", 40, per_user=True), Column("cat7", True, "cat", 18_000),
     Column("cat8", True, "cat", 12, 0.9, per_user=True), Column("cat9", True, "cat", 2_500),
     Column("time_since_last_click", True, "num", mu=2.0, sigma=1.5, missing=0.4),
     Column("clicks_30d", True, "num", per_user=True)),
    interactions=[("campaign", "cat2"), ("cat6", "cat9")], model_seed=20250702, effect=0.4,
    ns_scale=1.25, s_scale=0.55, intercept=-3.58)

LAYOUTS: dict[str, LayoutShape] = {s.name: s for s in (PCTR, ATTRIBUTION)}
