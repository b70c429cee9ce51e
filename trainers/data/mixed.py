"""Shapes our defaults were not fitted to: interactions across the feature groups, heavier-tailed users.

The Criteo-like shapes (:mod:`trainers.data.shapes`) keep every interaction inside a feature
group, so the truncated model (non-sensitive features only) loses exactly what the
sensitive group carries. Ads data rarely look like that: whether a remarketing list matters
depends on the advertiser, an interest segment on the publisher. A *mixed* shape has the
same columns and the same main effects, and its true logit adds factorised interactions
inside each group and across the two:

    z = b + s_ns * z_ns / sd(z_ns) + s_s * z_s / sd(z_s) + s_x * z_x / sd(z_x)

    z_ns = (the Criteo-like z_ns) + (<P_adv[advertiser], Q_hour[hour]> + <P_pub[publisher], Q_dev[device]>) / 2
    z_s  = (the Criteo-like z_s)  + (<R_list[remarketing_list], S_seg[interest_segment]>
                                     + <R_site[past_site], S_seg3[interest_segment]>) / 2
    z_x  = <A_fmt[ad_format], B_list[remarketing_list]> + <A_dev[device], B_seg[interest_segment]>
           + <A_hour[hour], B_list2[remarketing_list]> + <A_adv[advertiser], B_seg2[interest_segment]> / 2

Every factor table has rank ``RANK`` with N(0, RANK^-1/2) entries (each inner product has
unit variance); a list factor is 0 for "none". The standard deviations are measured once on
a reference sample (``REFERENCE_ROWS`` rows, a fixed seed), so the three parts carry the
stated shares of the signal variance ``signal_std^2``:

    s_ns^2 = (1 - cross_share) * nonsensitive_share * signal_std^2
    s_s^2  = (1 - cross_share) * (1 - nonsensitive_share) * signal_std^2
    s_x^2  = cross_share * signal_std^2

and the intercept b is solved on the same sample for the conversion rate ``base_rate``.
The truncated model cannot see z_s or the sensitive half of z_x: the larger
``cross_share`` and the smaller ``nonsensitive_share``, the further RR's ceiling falls
below the full model.

Rows per user are lognormal(0, ``user_sigma``)-weighted (1.8 in the Criteo-like shapes; 2.2
here puts a few users at thousands of rows) and capped at ``max_user_rows``.

Presets (``MIXED``), measured by :func:`trainers.data.synth.oracle_aucs` (1,000,000 rows by
200,000 users, data seed 0; "relative loss" is the non-sensitive oracle's against the
all-feature oracle, a Monte Carlo estimate over 32 draws of the sensitive features):

    shape      ns share  cross  conversion  AUC all  AUC non-sensitive  relative loss
    mixed      0.75      0.25   3.94%       0.810    0.735              39.5%
    mixed-ns   0.95      0.05   3.96%       0.809    0.795               7.2%
    mixed-s    0.50      0.30   3.95%       0.812    0.683              68.9%

Users: a median of 1 row, 62 at the 99th percentile, 324 at the 99.9th, 3,000 at most.
What a model trained on 800,000 of those rows reaches is lower (the oracle knows every
rare value's effect): on ``mixed`` the non-private two-tower model reaches AUC 0.704 and
the non-sensitive-only one 0.658 (15% relative loss; benchmarks/results/utility_frontier.md).
Vectorised numpy, deterministic for a given seed; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from budgetplan.errors import InvalidParameterError
from budgetplan.scenario.model import FeatureSpec
from budgetplan.util import validate
from trainers.data.shapes import (
    AD_FORMATS,
    CRITEO_LIKE_FEATURES,
    DEVICES,
    N_ADVERTISERS,
    N_LISTS,
    N_PUBLISHERS,
    N_SEGMENTS,
    N_SITES,
    Shape,
    criteo_like_categories,
    draw_criteo_like,
    nonsensitive_part,
    sensitive_part,
    sigmoid,
)

__all__ = ["MixedShape", "MIXED", "KNOBS", "RANK", "MIXED_MODEL_SEED", "REFERENCE_ROWS", "adjusted"]

MIXED_MODEL_SEED = 20261127
RANK = 4
REFERENCE_ROWS = 200_000
_REFERENCE_SEED = 7

# (name, rows of its table) of the factor tables; a pair is (weight, left table, left column, right table,
# right column). Most pairs have one side of a few values: interactions that the rows can teach a model (a
# pair of two Zipf columns of 10^4-10^5 values each is noise at any N we train on); the one pair of two large
# columns weighs half.
_TABLES = {"P_adv": N_ADVERTISERS, "Q_hour": 24, "P_pub": N_PUBLISHERS, "Q_dev": len(DEVICES),
           "R_list": N_LISTS + 1, "S_seg": N_SEGMENTS, "R_site": N_SITES, "S_seg3": N_SEGMENTS,
           "A_fmt": len(AD_FORMATS), "B_list": N_LISTS + 1, "A_dev": len(DEVICES), "B_seg": N_SEGMENTS,
           "A_hour": 24, "B_list2": N_LISTS + 1, "A_adv": N_ADVERTISERS, "B_seg2": N_SEGMENTS}
_WITHIN_NS = ((0.5, "P_adv", "advertiser", "Q_hour", "hour"), (0.5, "P_pub", "publisher", "Q_dev", "device"))
_WITHIN_S = ((0.5, "R_list", "remarketing_list", "S_seg", "interest_segment"),
             (0.5, "R_site", "past_site", "S_seg3", "interest_segment"))
_CROSS = ((1.0, "A_fmt", "ad_format", "B_list", "remarketing_list"),
          (1.0, "A_dev", "device", "B_seg", "interest_segment"),
          (1.0, "A_hour", "hour", "B_list2", "remarketing_list"),
          (0.5, "A_adv", "advertiser", "B_seg2", "interest_segment"))


@lru_cache(maxsize=1)
def _factors() -> dict[str, np.ndarray]:
    """The fixed factor tables (same for every mixed shape and data seed)."""
    g = np.random.default_rng(MIXED_MODEL_SEED)
    out = {name: g.normal(0.0, RANK ** -0.25, (rows, RANK)) for name, rows in _TABLES.items()}
    for name in ("R_list", "B_list", "B_list2"):
        out[name][0] = 0.0  # "none": no list, no interaction
    return out


def _pairs(cols, pairs) -> np.ndarray:
    f = _factors()
    z = np.zeros(len(cols["publisher"]))
    for weight, left, lcol, right, rcol in pairs:
        a = f[left][np.asarray(cols[lcol], dtype=np.int64)]
        b = f[right][np.asarray(cols[rcol], dtype=np.int64)]
        z += weight * np.einsum("ij,ij->i", a, b)
    return z


def _parts(cols) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z_ns, z_s, z_x) before standardising."""
    return (nonsensitive_part(cols) + _pairs(cols, _WITHIN_NS), sensitive_part(cols) + _pairs(cols, _WITHIN_S),
            _pairs(cols, _CROSS))


@lru_cache(maxsize=16)
def _calibration(user_sigma: float, max_user_rows: int | None, nonsensitive_share: float, cross_share: float,
                 signal_std: float, base_rate: float) -> tuple[float, float, float, float, float, float, float]:
    """(sd_ns, sd_s, sd_x, s_ns, s_s, s_x, intercept) from the reference sample."""
    rng = np.random.default_rng(_REFERENCE_SEED)
    cols = draw_criteo_like(rng, REFERENCE_ROWS, REFERENCE_ROWS // 5, user_sigma=user_sigma,
                            max_user_rows=max_user_rows)
    parts = _parts(cols)
    sds = tuple(float(np.std(p)) for p in parts)
    var = signal_std ** 2
    scales = (math.sqrt((1 - cross_share) * nonsensitive_share * var),
              math.sqrt((1 - cross_share) * (1 - nonsensitive_share) * var), math.sqrt(cross_share * var))
    z = sum(s / sd * (p - p.mean()) for s, sd, p in zip(scales, sds, parts))
    lo, hi = -20.0, 20.0
    for _ in range(80):  # the mean conversion rate is increasing in b
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sigmoid(mid + z).mean() < base_rate else (lo, mid)
    means = tuple(float(p.mean()) for p in parts)
    intercept = 0.5 * (lo + hi) - sum(s / sd * m for s, sd, m in zip(scales, sds, means))
    return (*sds, *scales, intercept)


@dataclass(frozen=True, eq=False)
class MixedShape(Shape):
    """A Criteo-like generator with factorised interactions inside and across the groups (module docstring).

    Attributes:
        nonsensitive_share: of the signal variance outside the cross-group part, the share
            the non-sensitive group carries, in [0, 1].
        cross_share: the share of the signal variance in cross-group interactions, in [0, 1).
        signal_std: the standard deviation of the true logit around its intercept.
        base_rate: the conversion rate, in (0, 0.5].
        user_sigma: the lognormal sigma of the users' weights (rows per user).
        max_user_rows: the most rows a user has, or None.
    """

    name: str
    description: str
    nonsensitive_share: float = 0.5
    cross_share: float = 0.3
    signal_std: float = 1.3
    base_rate: float = 0.04
    user_sigma: float = 2.2
    max_user_rows: int | None = 3000
    features: FeatureSpec = CRITEO_LIKE_FEATURES
    dtypes: dict = field(default_factory=lambda: {
        "user_id": "int64", "label": "int8", "hour": "int8", "bid_floor": "float32", "slot_position": "int8",
        "days_since_visit": "float32", "visits_7d": "int16"})

    def __post_init__(self) -> None:
        validate.probability("nonsensitive_share", self.nonsensitive_share, allow_zero=True, allow_one=True)
        validate.probability("cross_share", self.cross_share, allow_zero=True)
        validate.positive("signal_std", self.signal_std)
        validate.at_most("signal_std", self.signal_std, 5.0)
        validate.probability("base_rate", self.base_rate)
        validate.at_most("base_rate", self.base_rate, 0.5)
        validate.positive("user_sigma", self.user_sigma)
        validate.at_most("user_sigma", self.user_sigma, 4.0)
        if self.max_user_rows is not None:
            validate.positive_int("max_user_rows", self.max_user_rows)

    @property
    def categories(self) -> dict[str, tuple[str, ...]]:
        return criteo_like_categories()

    def _calibrated(self):
        return _calibration(self.user_sigma, self.max_user_rows, self.nonsensitive_share, self.cross_share,
                            self.signal_std, self.base_rate)

    def parameters(self) -> dict:
        """What defines the shape's data (recorded beside results made from it)."""
        *_, s_ns, s_s, s_x, intercept = self._calibrated()
        return {"shape": self.name, "family": "mixed", "nonsensitive_share": self.nonsensitive_share,
                "cross_share": self.cross_share, "signal_std": self.signal_std, "base_rate": self.base_rate,
                "user_sigma": self.user_sigma, "max_user_rows": self.max_user_rows, "rank": RANK,
                "model_seed": MIXED_MODEL_SEED, "scales": [s_ns, s_s, s_x], "intercept": intercept,
                "cardinalities": {k: len(v) for k, v in self.categories.items()}}

    def draw(self, rows: int, users: int, rng) -> dict[str, np.ndarray]:
        if self.max_user_rows is not None and self.max_user_rows * users < rows:
            raise InvalidParameterError(f"{users} users of at most {self.max_user_rows} rows each cannot hold "
                                        f"{rows} rows: raise users")
        return draw_criteo_like(rng, rows, users, user_sigma=self.user_sigma, max_user_rows=self.max_user_rows)

    def logit(self, cols) -> np.ndarray:
        sd_ns, sd_s, sd_x, s_ns, s_s, s_x, intercept = self._calibrated()
        z_ns, z_s, z_x = _parts(cols)
        z = z_ns * (s_ns / sd_ns)
        z += z_s * (s_s / sd_s)
        if s_x:
            z += z_x * (s_x / sd_x)
        z += intercept
        return z

    def nonsensitive_logit(self, cols) -> np.ndarray | None:
        # Without cross-group terms the best non-sensitive ranking is by z_ns (see shapes.py);
        # with them it is an expectation over the sensitive features (Monte Carlo).
        if self.cross_share:
            return None
        return nonsensitive_part(cols) + _pairs(cols, _WITHIN_NS)


KNOBS = ("nonsensitive_share", "cross_share", "signal_std", "base_rate", "user_sigma", "max_user_rows")


def adjusted(base: MixedShape, **knobs) -> MixedShape:
    """``base`` with the given knobs (``KNOBS``; None: unchanged), named after what changed."""
    changed = {k: v for k, v in knobs.items() if v is not None}
    unknown = sorted(set(changed) - set(KNOBS))
    if unknown:
        raise InvalidParameterError(f"{unknown[0]!r} is not a knob of a mixed shape (knobs: {', '.join(KNOBS)})")
    if not changed:
        return base
    name = base.name + "(" + ",".join(f"{k}={v:g}" for k, v in sorted(changed.items())) + ")"
    return replace(base, name=name, description=f"{base.description}; adjusted: {name}", **changed)


MIXED = {
    s.name: s for s in (
        MixedShape(name="mixed", description="a quarter of the signal in interactions across the groups, 75% of "
                   "the rest non-sensitive; heavy users up to 3,000 rows; 4% conversions", nonsensitive_share=0.75,
                   cross_share=0.25),
        MixedShape(name="mixed-ns", description="like mixed, nearly all the signal non-sensitive (95% of the "
                   "within-group part, 5% cross)", nonsensitive_share=0.95, cross_share=0.05),
        MixedShape(name="mixed-s", description="like mixed, half the within-group signal sensitive and 30% "
                   "across the groups", nonsensitive_share=0.5, cross_share=0.3),
    )
}
