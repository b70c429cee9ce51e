"""Scenarios: what a privacy engineer asks for, read strictly from TOML.

A scenario states the total budget (or a delta policy), the adjacency and privacy unit,
the dataset size, the algorithm and every part of its training shape that touches
privacy. Anything else is refused: an unknown key, a missing one, a value of the wrong
kind or out of range, or settings that contradict each other. Every error is one line
naming the key (``[dpsgd].epochs must be ...``) and is a usage error (exit 2).

    name = "criteo-pctr-hybrid"               # optional
    description = "..."                       # optional

    [budget]
    epsilon = 8.0
    delta = "1/N"                             # a number, or "<c>/N"
    delta_policy = "warn"                     # "warn" (default) or "strict": refuse delta >= 1/N

    [privacy]
    adjacency = "replace-one"                 # or "add-remove"
    unit = "impression"                       # or a unit name such as "user x time"
    cap = 1                                   # K examples per unit after capping
    capping = "random"                        # keep K random examples, or the "first" K
    unit_accounting = "tight"                 # or "group"

    [data]
    dataset_size = 32000000                   # N, rows after capping
    size_release_epsilon = 0.1                # add-remove only, optional: dataset_size is a DP
                                              # count released at this epsilon (budgetplan data
                                              # count --dp-epsilon), accounted in the plan

    [algorithm]
    name = "hybrid"                           # rr | walr | dpsgd | hybrid
    split = "paper-v1"                        # hybrid: "paper-v1", "alpha=<a>", or "eps1=<e>"
    tower = "frozen"                          # hybrid: non-sensitive tower in phase 2 ("fine-tune")

    [rr]                                      # rr, hybrid
    epochs = 10
    batch_size = 1024
    per_impression = "eps/K"                  # user level: "eps/K", "eps/K_i" or "tight"

    [dpsgd]                                   # dpsgd, hybrid
    batch_size = 16384                        # expected batch size B; q = B / N
    epochs = 3                                # or steps = ...
    clipping_norm = 10.0
    sampling = "poisson"                      # or "truncated-poisson" with max_batch_size
    noise_multiplier = 1.0                    # optional: fixed, else calibrated
    max_noise_multiplier = 5.0                # optional: refuse plans that need more noise

    [walr]                                    # walr
    features = 20                             # k, intercept column included
    row_norm_bound = 4.47                     # every row clipped to this L2 norm
    weights_bound = 1.0                       # per-example weights bounded by this

    [features]                                # needed to train: the columns and who may see them
    label = "conversion"
    unit_id = "uid"                           # required for a unit capped at K > 1
    weight = "w"                              # WALR only, optional: per-example weights
    nonsensitive_categorical = ["campaign"]   # known to an adversary
    nonsensitive_numeric = ["cost"]
    sensitive_categorical = ["cat1"]          # protected (semi-sensitive DP); hashed, never
    sensitive_numeric = []                    # given a data-dependent vocabulary

    [tuning]                                  # optional
    configurations = 8
    selection = "naive"                       # or "repeat-and-select"
    distribution = "poisson"                  # repeat-and-select: poisson | geometric | logarithmic

    [accounting]                              # optional
    method = "pld"                            # pld | rdp | prv (DP-SGD and Gaussian phases)
    discretization = 1e-4
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from budgetplan import _validate
from budgetplan.errors import InvalidParameterError
from budgetplan.units import CAPPING_RULES, Adjacency

__all__ = ["Scenario", "load_scenario", "parse_scenario", "ALGORITHMS"]

ALGORITHMS = ("rr", "walr", "dpsgd", "hybrid")
PER_IMPRESSION_RULES = ("eps/K", "eps/K_i", "tight")
SAMPLING = ("poisson", "truncated-poisson")
SELECTIONS = ("naive", "repeat-and-select")
DISTRIBUTIONS = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}
TOWERS = ("frozen", "fine-tune")
METHODS = ("pld", "rdp", "prv")
_DELTA_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)?\s*/\s*N\s*$")


class _Table:
    """One TOML table read strictly: every key is consumed or reported as unknown."""

    def __init__(self, raw: dict, name: str):
        if not isinstance(raw, dict):
            raise InvalidParameterError(f"[{name}] must be a table, got {type(raw).__name__}")
        self.raw, self.name, self.used = raw, name, set()

    def _key(self, key: str) -> str:
        return f"[{self.name}].{key}" if self.name else key

    def get(self, key: str, check, *, required: bool = False, default=None):
        self.used.add(key)
        if key not in self.raw:
            if required:
                raise InvalidParameterError(f"missing required key {self._key(key)}")
            return default
        return check(self._key(key), self.raw[key])

    def has(self, key: str) -> bool:
        return key in self.raw

    def finish(self) -> None:
        unknown = sorted(set(self.raw) - self.used)
        if unknown:
            raise InvalidParameterError(f"unknown key {self._key(unknown[0])}")


def _choice(choices):
    def check(name: str, value):
        if value not in choices:
            raise InvalidParameterError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    return check


def _string(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _delta(name: str, value) -> float | str:
    """A number in [0, 1) (0: pure DP, randomized response only), or a policy string "<c>/N"."""
    if isinstance(value, str):
        m = _DELTA_RE.match(value)
        if not m:
            raise InvalidParameterError(f'{name} must be a number in [0, 1) or "<c>/N", got {value!r}')
        c = float(m.group(1)) if m.group(1) else 1.0
        if not c > 0:
            raise InvalidParameterError(f"{name} must have a positive constant, got {value!r}")
        return f"{c!r}/N"
    return _validate.probability(name, value, allow_zero=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class DPSGDShape:
    """The part of a DP-SGD phase that touches privacy."""

    batch_size: int
    epochs: float | None
    steps: int | None
    clipping_norm: float
    sampling: str = "poisson"
    max_batch_size: int | None = None
    noise_multiplier: float | None = None
    max_noise_multiplier: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RRShape:
    epochs: int = 1
    batch_size: int | None = None
    per_impression: str = "eps/K"


@dataclass(frozen=True, slots=True, kw_only=True)
class WALRShape:
    features: int
    row_norm_bound: float
    weights_bound: float


@dataclass(frozen=True, slots=True, kw_only=True)
class FeatureSpec:
    """Which columns are the label, the unit id, and the (non-)sensitive features.

    Non-sensitive features are known to an adversary; sensitive features and the label are
    protected. Randomized response protects only the label, so a model trained on RR
    labels may use non-sensitive features only.
    """

    label: str
    unit_id: str | None = None
    weight: str | None = None
    nonsensitive_categorical: tuple[str, ...] = ()
    nonsensitive_numeric: tuple[str, ...] = ()
    sensitive_categorical: tuple[str, ...] = ()
    sensitive_numeric: tuple[str, ...] = ()

    @property
    def nonsensitive(self) -> tuple[str, ...]:
        return self.nonsensitive_categorical + self.nonsensitive_numeric

    @property
    def sensitive(self) -> tuple[str, ...]:
        return self.sensitive_categorical + self.sensitive_numeric

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column the trainer reads, label and unit id included, without repeats."""
        out = [self.label] + ([self.unit_id] if self.unit_id else []) + ([self.weight] if self.weight else []) \
            + list(self.nonsensitive + self.sensitive)
        return tuple(dict.fromkeys(out))

    def to_toml(self) -> str:
        """The scenario's ``[features]`` table that parses back to this spec."""
        def value(v) -> str:
            return json.dumps(v) if isinstance(v, str) else "[" + ", ".join(json.dumps(c) for c in v) + "]"

        lines = ["[features]", f"label = {value(self.label)}"]
        lines += [f"{k} = {value(getattr(self, k))}" for k in ("unit_id", "weight") if getattr(self, k) is not None]
        lines += [f"{k} = {value(getattr(self, k))}" for k in ("nonsensitive_categorical", "nonsensitive_numeric",
                                                              "sensitive_categorical", "sensitive_numeric")]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    configurations: int
    selection: str = "naive"
    distribution: str = "poisson"


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A validated scenario. ``delta`` is a number or a ``"<c>/N"`` policy string."""

    name: str
    description: str
    epsilon: float
    delta: float | str
    delta_policy: str
    adjacency: Adjacency
    unit_name: str
    cap: int
    capping: str
    unit_accounting: str
    dataset_size: int
    algorithm: str
    split: str | None = None
    tower: str | None = None
    rr: RRShape | None = None
    dpsgd: DPSGDShape | None = None
    walr: WALRShape | None = None
    tuning: Tuning | None = None
    features: FeatureSpec | None = None
    method: str = "pld"
    discretization: float = 1e-4
    size_release_epsilon: float | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def resolved_delta(self) -> float:
        """delta as a number: a "<c>/N" policy is c / N."""
        if isinstance(self.delta, str):
            return float(self.delta.split("/")[0]) / self.dataset_size
        return self.delta

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("warnings")
        if out["size_release_epsilon"] is None:
            out.pop("size_release_epsilon")  # plans without a DP count keep their bytes
        out["adjacency"] = self.adjacency.value
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Scenario":
        data = dict(data)
        data["adjacency"] = Adjacency.parse(data["adjacency"])
        for key, kind in (("rr", RRShape), ("dpsgd", DPSGDShape), ("walr", WALRShape), ("tuning", Tuning),
                          ("features", FeatureSpec)):
            if data.get(key) is not None:
                data[key] = kind(**data[key])
        if data.get("features") is not None:
            f = data["features"]
            data["features"] = FeatureSpec(label=f.label, unit_id=f.unit_id, weight=f.weight, **{
                k: tuple(getattr(f, k)) for k in ("nonsensitive_categorical", "nonsensitive_numeric",
                                                  "sensitive_categorical", "sensitive_numeric")})
        return cls(**data)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; errors name the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidParameterError(f"scenario file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidParameterError(f"cannot read scenario {path}: {exc}") from None
    try:
        return parse_scenario(text, default_name=path.stem)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"{path.name}: {exc}") from None


def parse_scenario(text: str, *, default_name: str = "scenario") -> Scenario:
    """Validate a scenario given as TOML text."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidParameterError(f"malformed TOML: {exc}") from None
    top = _Table(raw, "")
    name = top.get("name", _string, default=default_name)
    description = top.get("description", _string, default="")

    budget = _Table(top.get("budget", lambda n, v: v, required=True), "budget")
    epsilon = budget.get("epsilon", _validate.positive, required=True)
    delta = budget.get("delta", _delta, required=True)
    policy = budget.get("delta_policy", _choice(("warn", "strict")), default="warn")
    budget.finish()

    priv = _Table(top.get("privacy", lambda n, v: v, required=True), "privacy")
    adjacency = priv.get("adjacency", lambda n, v: Adjacency.parse(v, n), required=True)
    unit_name = priv.get("unit", _string, default="impression")
    cap = priv.get("cap", _validate.positive_int, default=None)
    capping = priv.get("capping", _choice(CAPPING_RULES), default="random")
    unit_accounting = priv.get("unit_accounting", _choice(("tight", "group")), default="tight")
    priv.finish()

    data = _Table(top.get("data", lambda n, v: v, required=True), "data")
    n = data.get("dataset_size", _validate.positive_int, required=True)
    size_release = data.get("size_release_epsilon", _validate.positive, default=None)
    data.finish()

    algo = _Table(top.get("algorithm", lambda n, v: v, required=True), "algorithm")
    algorithm = algo.get("name", _choice(ALGORITHMS), required=True)
    split = algo.get("split", _string, default=None)
    tower = algo.get("tower", _choice(TOWERS), default=None)
    algo.finish()

    rr = _rr(top) if algorithm in ("rr", "hybrid") else None
    dpsgd = _dpsgd(top, n) if algorithm in ("dpsgd", "hybrid") else None
    walr = _walr(top) if algorithm == "walr" else None
    for table, used_by in (("rr", ("rr", "hybrid")), ("dpsgd", ("dpsgd", "hybrid")), ("walr", ("walr",))):
        if algorithm not in used_by:
            top.used.add(table)
            if table in raw:
                raise InvalidParameterError(f"[{table}] does not apply to algorithm {algorithm!r}")
    tuning = _tuning(top) if "tuning" in raw else None
    top.used.add("tuning")
    features = _features(top, cap or 1) if "features" in raw else None
    top.used.add("features")
    if features is not None and features.weight is not None and algorithm != "walr":
        raise InvalidParameterError(f"[features].weight applies to algorithm 'walr' only, not {algorithm!r}")
    method, disc = "pld", 1e-4
    if "accounting" in raw:
        acc = _Table(top.get("accounting", lambda n, v: v), "accounting")
        method = acc.get("method", _choice(METHODS), default="pld")
        disc = acc.get("discretization", _validate.positive, default=1e-4)
        acc.finish()
    top.used.add("accounting")
    top.finish()
    _check_size_release(size_release, epsilon=epsilon, adjacency=adjacency)

    warnings = _check_consistency(
        epsilon=epsilon, delta=delta, policy=policy, adjacency=adjacency, unit_name=unit_name, cap=cap, n=n,
        algorithm=algorithm, split=split, tower=tower, rr=rr, dpsgd=dpsgd)
    if algorithm == "hybrid":
        split = split or "paper-v1"
        tower = tower or "frozen"
    cap = cap or 1
    return Scenario(
        name=name, description=description, epsilon=epsilon, delta=delta, delta_policy=policy,
        adjacency=adjacency, unit_name=unit_name, cap=cap, capping=capping, unit_accounting=unit_accounting,
        dataset_size=n, algorithm=algorithm, split=split, tower=tower, rr=rr, dpsgd=dpsgd, walr=walr,
        tuning=tuning, features=features, method=method, discretization=disc, size_release_epsilon=size_release,
        warnings=warnings)


def _rr(top: _Table) -> RRShape:
    t = _Table(top.get("rr", lambda n, v: v, default={}), "rr")
    shape = RRShape(
        epochs=t.get("epochs", _validate.positive_int, default=1),
        batch_size=t.get("batch_size", _validate.positive_int, default=None),
        per_impression=t.get("per_impression", _choice(PER_IMPRESSION_RULES), default="eps/K"),
    )
    t.finish()
    return shape


def _dpsgd(top: _Table, n: int) -> DPSGDShape:
    t = _Table(top.get("dpsgd", lambda n, v: v, required=True), "dpsgd")
    batch = t.get("batch_size", _validate.positive_int, required=True)
    epochs = t.get("epochs", _validate.positive, default=None)
    steps = t.get("steps", _validate.positive_int, default=None)
    if (epochs is None) == (steps is None):
        raise InvalidParameterError("[dpsgd] needs exactly one of epochs or steps")
    sampling = t.get("sampling", _choice(SAMPLING), default="poisson")
    max_batch = t.get("max_batch_size", _validate.positive_int, default=None)
    if sampling == "truncated-poisson" and max_batch is None:
        raise InvalidParameterError("missing required key [dpsgd].max_batch_size for truncated-poisson sampling")
    if sampling == "poisson" and max_batch is not None:
        raise InvalidParameterError('[dpsgd].max_batch_size needs sampling = "truncated-poisson"')
    if batch > n:
        raise InvalidParameterError(f"[dpsgd].batch_size ({batch}) must not exceed [data].dataset_size ({n})")
    if max_batch is not None and not batch <= max_batch <= n:
        raise InvalidParameterError(
            f"[dpsgd].max_batch_size must lie between batch_size ({batch}) and dataset_size ({n}), got {max_batch}")
    shape = DPSGDShape(
        batch_size=batch, epochs=epochs, steps=steps,
        clipping_norm=t.get("clipping_norm", _validate.positive, required=True),
        sampling=sampling, max_batch_size=max_batch,
        noise_multiplier=t.get("noise_multiplier", _validate.positive, default=None),
        max_noise_multiplier=t.get("max_noise_multiplier", _validate.positive, default=None),
    )
    t.finish()
    return shape


def _walr(top: _Table) -> WALRShape:
    t = _Table(top.get("walr", lambda n, v: v, required=True), "walr")
    shape = WALRShape(
        features=t.get("features", _validate.positive_int, required=True),
        row_norm_bound=t.get("row_norm_bound", _validate.positive, required=True),
        weights_bound=t.get("weights_bound", _validate.positive, required=True),
    )
    t.finish()
    return shape


def _columns(name: str, value) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidParameterError(f"{name} must be a list of column names, got {value!r}")
    if len(set(value)) != len(value):
        raise InvalidParameterError(f"{name} names a column twice: {value!r}")
    return tuple(value)


def _features(top: _Table, cap: int) -> FeatureSpec:
    t = _Table(top.get("features", lambda n, v: v), "features")
    spec = FeatureSpec(
        label=t.get("label", _string, required=True),
        unit_id=t.get("unit_id", _string, default=None),
        weight=t.get("weight", _string, default=None),
        **{key: t.get(key, _columns, default=()) for key in (
            "nonsensitive_categorical", "nonsensitive_numeric", "sensitive_categorical", "sensitive_numeric")},
    )
    t.finish()
    feats = spec.nonsensitive + spec.sensitive
    if not feats:
        raise InvalidParameterError("[features] lists no feature columns")
    seen: set[str] = set()
    for col in feats:
        if col in seen:
            raise InvalidParameterError(f"[features] lists column {col!r} in two groups")
        seen.add(col)
    if spec.label in seen:
        raise InvalidParameterError(f"[features].label {spec.label!r} is also listed as a feature")
    if cap > 1 and spec.unit_id is None:
        raise InvalidParameterError("[features].unit_id is required: the unit is capped at "
                                    f"{cap} examples, and capping needs unit ids")
    return spec


def _tuning(top: _Table) -> Tuning:
    t = _Table(top.get("tuning", lambda n, v: v), "tuning")
    shape = Tuning(
        configurations=t.get("configurations", _validate.positive_int, required=True),
        selection=t.get("selection", _choice(SELECTIONS), default="naive"),
        distribution=t.get("distribution", _choice(tuple(DISTRIBUTIONS)), default="poisson"),
    )
    t.finish()
    return shape


def _check_consistency(*, epsilon, delta, policy, adjacency, unit_name, cap, n, algorithm, split, tower, rr,
                       dpsgd) -> tuple[str, ...]:
    """Contradictions are errors; doubtful but legal settings become warnings."""
    warnings = []
    if not is_example_unit(unit_name) and cap is None:
        raise InvalidParameterError(
            f"[privacy].unit {unit_name!r} is a user-level unit: it needs [privacy].cap (K examples per unit)")
    if is_example_unit(unit_name) and cap is not None and cap > 1:
        raise InvalidParameterError(
            f"[privacy].cap = {cap} contradicts [privacy].unit = {unit_name!r}: name the unit the cap applies to")
    d = float(delta.split("/")[0]) / n if isinstance(delta, str) else delta
    if not 0 <= d < 1:
        raise InvalidParameterError(f"[budget].delta resolves to {d!r}, which is not in [0, 1)")
    if d == 0 and algorithm in ("dpsgd", "walr"):
        raise InvalidParameterError(f"[budget].delta must be > 0 for algorithm {algorithm!r} (only randomized "
                                    "response is pure DP)")
    if d >= 1.0 / n:
        if policy == "strict":
            raise InvalidParameterError(
                f"[budget].delta = {d:.6g} is not below 1/N = {1.0 / n:.6g}, which delta_policy = \"strict\" refuses")
        warnings.append(f"delta = {d:.6g} is not below 1/N = {1.0 / n:.6g}: even publishing one random row "
                        "in full meets it; prefer delta << 1/N")
    if algorithm in ("rr", "hybrid") and adjacency is not Adjacency.REPLACE_ONE:
        raise InvalidParameterError(
            f"[privacy].adjacency must be replace-one for algorithm {algorithm!r}: randomized response protects "
            "labels, a replace-one relation")
    if algorithm == "walr" and adjacency is not Adjacency.REPLACE_ONE:
        raise InvalidParameterError(
            "[privacy].adjacency must be replace-one for algorithm 'walr': WALR's descent reads every row's "
            "features without noise, so only a change of labels (label DP) is protected, not a row's presence")
    if algorithm != "hybrid":
        if split is not None:
            raise InvalidParameterError(f"[algorithm].split applies to hybrid only, not {algorithm!r}")
        if tower is not None:
            raise InvalidParameterError(f"[algorithm].tower applies to hybrid only, not {algorithm!r}")
    if rr is not None and rr.per_impression != "eps/K" and (cap or 1) == 1:
        warnings.append(f"[rr].per_impression = {rr.per_impression!r} only matters for a unit cap > 1")
    return tuple(warnings)


def _check_size_release(size_release: float | None, *, epsilon: float, adjacency: Adjacency) -> None:
    """A DP count of N protects N where neighbours differ in it: under add-remove only."""
    if size_release is None:
        return
    if adjacency is not Adjacency.ADD_REMOVE:
        raise InvalidParameterError(
            f"[data].size_release_epsilon = {size_release!r} applies under add-remove adjacency only: under "
            f"{adjacency.value}, neighbouring datasets have the same N, so N is public and needs no DP count")
    if not size_release < epsilon:
        raise InvalidParameterError(
            f"[data].size_release_epsilon = {size_release!r} must be below [budget].epsilon = {epsilon!r}: the "
            "training phases get what the count leaves")


def is_example_unit(unit_name: str) -> bool:
    """Whether a unit name means one example (no cap needed)."""
    return unit_name.strip().lower() in ("impression", "example", "row", "impression x time")
