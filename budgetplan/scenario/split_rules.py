"""How Hybrid splits a total (eps, delta) between its RR phase (eps1, 0) and DP-SGD (eps2, delta).

Published rules (Chua et al., "Training Differentially Private Ad Prediction Models with
Semi-Sensitive Features", arXiv:2401.15246):

- ``paper-v1``: eps1 = min(0.6 eps, 3) (v1 of the paper: RR utility collapses below
  eps1 ~ 3, and above eps1 = 4 the rest is better spent on DP-SGD);
- ``alpha=<a>``: eps1 = a eps for a in [0, 1] (v2; a is tuned per eps from
  {0, .25, .5, .75, 1}); a = 0 is plain DP-SGD, a = 1 plain RR on the truncated model;
- ``eps1=<e>``: an explicit eps1 strictly between 0 and eps;
- ``units=<r>``: split the units, not the budget (parallel composition): the RR phase trains
  on the units whose public keyed hash falls in the first share r (0 < r < 1), the DP-SGD
  phase on the rest, each phase at the whole training budget (``budgetplan.planning.composition``);
  it has no eps1 (``choose_split`` refuses it; ``units_share`` reads it);
- ``alpha-by-eps``: alpha read from ``ALPHA_BY_EPSILON``, a step function of the epsilon
  being split (the run's epsilon when tuning divides the budget). The table is the
  measured frontier (budgetplan's own measurements, in line with the v2 paper's Fig. 3),
  here and nowhere else.

A rule is read strictly: no spaces, a plain decimal number (``alpha=0.5``, ``eps1=1.5e0``),
nothing else. The two arms without a split are spelled with alpha only: ``alpha=0`` (no RR
phase) and ``alpha=1`` (no DP-SGD phase); ``eps1=0`` and ``eps1=<eps>`` are refused and
point there, so that each arm has one name and a typo cannot silently drop a phase.

By basic composition the two phases are (eps1 + eps2, delta)-DP; RR is pure, so all of
delta goes to DP-SGD. Under ``units=<r>`` a unit's data reaches one phase only, so the two
are (eps, delta)-DP together.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["SplitRule", "SplitChoice", "AlphaStep", "parse_rule", "split_budget", "choose_split", "alpha_by_epsilon",
           "DEFAULT_RULE", "units_share", "part_rows", "dpsgd_rows",
           "ALPHA_BY_EPSILON", "ALPHA_BY_EPSILON_SOURCE", "PAPER_ALPHAS", "PAPER_EPSILONS"]

# The rule a Hybrid scenario gets when it names none: the least worst-case regret (relative AUC
# loss above the best alpha of the grid) on the 1M-row frontier
# (benchmarks/results/utility_frontier.md: 5.29 and 0.50 points at eps 3 and 8 over five shapes,
# against 9.69 and 0.50 for alpha 0.5 and 10.77 and 2.02 for alpha 0.75).
DEFAULT_RULE = "alpha-by-eps"
PAPER_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_EPSILONS = (1.0, 3.0, 5.0, 10.0, 20.0, 30.0, 50.0)
_RULE = re.compile(r"^(alpha|eps1|units)=((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)$")
_FORMS = '"paper-v1", "alpha-by-eps", "alpha=<a>", "eps1=<e>" or "units=<r>" (no spaces)'
_TABLE_RULE = "alpha-by-eps"


@dataclass(frozen=True, slots=True)
class AlphaStep:
    """One step of ``ALPHA_BY_EPSILON``: ``alpha`` for from_epsilon <= eps < the next step's from_epsilon."""

    from_epsilon: float
    alpha: float
    evidence: str


ALPHA_BY_EPSILON_SOURCE = (
    "budgetplan's 1M-row utility frontier (benchmarks/results/utility_frontier.md: five synthetic shapes, from 95% of "
    "the signal in non-sensitive features to most of it in sensitive ones, 3 seeds each, alpha from {0, 0.5, 0.75, 1} "
    "at eps 3 and 8, the template's DP-SGD at batch N/50 for 10 epochs); the table with the least worst-case regret "
    "over those shapes")
# The step (eps 5) lies between the measured epsilons 3 and 8 where the best alpha changes; its
# place is not itself measured. At eps 3 no alpha is within 5 points of the best on every shape
# (RR alone leads where the signal is non-sensitive, plain DP-SGD where it is sensitive): there
# `budgetplan split --proxy` or a [tuning] grid choose better. Each re-measurement of the frontier
# kept this table; docs/history.md ("The default split table, round by round") lists them.
ALPHA_BY_EPSILON: tuple[AlphaStep, ...] = (
    AlphaStep(0.0, 0.0, "alpha = 0 (plain DP-SGD) was best at eps = 3 on mixed, mixed-s and sensitive (relative "
              "AUC loss 10.93, 9.63 and 8.52); RR alone was best on balanced and mixed-ns, 1.52 and 5.29 points "
              "ahead of it"),
    AlphaStep(5.0, 0.5, "alpha = 0.5 was best at eps = 8 on mixed, mixed-s and sensitive (relative AUC loss 3.34, "
              "4.58 and 4.64), 0.50 points behind alpha 0.75 on balanced and 0.38 behind RR alone on mixed-ns"),
)


def _check_table(table: tuple[AlphaStep, ...]) -> tuple[AlphaStep, ...]:
    """A table starts at 0, steps strictly upward in eps, and gives each step an alpha in [0, 1]."""
    if not table or table[0].from_epsilon != 0.0:
        raise ValueError("ALPHA_BY_EPSILON must start at from_epsilon = 0")
    for a, b in zip(table, table[1:]):
        if not b.from_epsilon > a.from_epsilon:
            raise ValueError(f"ALPHA_BY_EPSILON must step upward in eps: {a.from_epsilon} then {b.from_epsilon}")
    for step in table:
        if not (0.0 <= step.alpha <= 1.0 and math.isfinite(step.from_epsilon)):
            raise ValueError(f"ALPHA_BY_EPSILON step {step} is out of range")
    return table


_check_table(ALPHA_BY_EPSILON)


def alpha_by_epsilon(epsilon: float, table: tuple[AlphaStep, ...] = ALPHA_BY_EPSILON) -> AlphaStep:
    """The table's step for ``epsilon`` (> 0)."""
    epsilon = validate.positive("epsilon", epsilon)
    return [step for step in _check_table(table) if step.from_epsilon <= epsilon][-1]


@dataclass(frozen=True, slots=True)
class SplitRule:
    """A parsed split rule: ``kind`` is "paper-v1", "alpha-by-eps", "alpha", "eps1" or "units"; ``value`` its number."""

    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind}={self.value:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SplitChoice:
    """What a rule gives at one epsilon: the alpha = eps1 / epsilon it resolved to, and why.

    A plan under a table-driven rule holds it as its ``split`` (read with
    ``budgetplan.util.typed.from_json_object``).
    """

    rule: str
    epsilon: float
    alpha: float
    epsilon1: float
    epsilon2: float
    reason: str

    def __post_init__(self) -> None:
        for name in ("rule", "reason"):
            if not isinstance(getattr(self, name), str):
                raise InvalidParameterError(f"split.{name} must be a string, got {getattr(self, name)!r}")
        validate.positive("split.epsilon", self.epsilon)
        validate.probability("split.alpha", self.alpha, allow_zero=True, allow_one=True)
        for name in ("epsilon1", "epsilon2"):
            validate.non_negative(f"split.{name}", getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "epsilon": self.epsilon, "alpha": self.alpha, "epsilon1": self.epsilon1,
                "epsilon2": self.epsilon2, "reason": self.reason}


def parse_rule(rule: str | SplitRule, name: str = "split rule") -> SplitRule:
    """Read ``"paper-v1"``, ``"alpha-by-eps"``, ``"alpha=<a>"``, ``"eps1=<e>"`` or ``"units=<r>"``."""
    if isinstance(rule, SplitRule):
        return rule
    if not isinstance(rule, str):
        raise InvalidParameterError(f"{name} must be {_FORMS}, got {rule!r}")
    if rule in ("paper-v1", _TABLE_RULE):
        return SplitRule(rule)
    m = _RULE.match(rule)
    if not m:
        raise InvalidParameterError(f"{name} must be {_FORMS}, got {rule!r}")
    value = float(m.group(2))
    if m.group(1) == "alpha":
        return SplitRule("alpha", validate.probability(f"{name} alpha", value, allow_zero=True, allow_one=True))
    if m.group(1) == "units":
        if not 0 < value < 1:
            raise InvalidParameterError(f"{name} units share must be strictly between 0 and 1 (the RR phase's "
                                        f"share of the units; the rest go to DP-SGD), got {rule!r}: the arms "
                                        "without a split are spelled alpha=1 and alpha=0")
        return SplitRule("units", value)
    if value == 0:
        raise InvalidParameterError(f"{name} eps1 must be > 0, got {rule!r}: the arm without an RR phase is "
                                    "spelled alpha=0")
    return SplitRule("eps1", validate.positive(f"{name} eps1", value))


def units_share(rule: str | SplitRule) -> float | None:
    """The RR phase's share of the units under a ``units=<r>`` rule; None for a rule that splits the budget."""
    r = parse_rule(rule)
    return r.value if r.kind == "units" else None


def part_rows(dataset_size: int, share: float) -> tuple[int, int]:
    """The expected rows of a units split's two parts, (RR's, DP-SGD's): round(share N) and the rest.

    Each unit falls in the RR part with probability ``share`` (a keyed hash of its id), so
    these are the parts' sizes in expectation; the plan's q and the normalisation use them.
    """
    rr = round(share * dataset_size)
    if not 0 < rr < dataset_size:
        raise InvalidParameterError(f"a units split with share {share:g} of N = {dataset_size} rows leaves a part "
                                    "with no rows: move the share away from 0 and 1 or use an alpha rule")
    return rr, dataset_size - rr


def dpsgd_rows(dataset_size: int, rule: str | SplitRule | None) -> int:
    """The rows a Hybrid's DP-SGD phase samples from: N, or under a units split its part's expected rows."""
    share = None if rule is None else units_share(rule)
    return dataset_size if share is None else part_rows(dataset_size, share)[1]


def split_budget(epsilon: float, rule: str | SplitRule) -> tuple[float, float]:
    """(eps1, eps2) with eps1 + eps2 = epsilon exactly (eps2 is computed as the remainder)."""
    choice = choose_split(epsilon, rule)
    return choice.epsilon1, choice.epsilon2


def choose_split(epsilon: float, rule: str | SplitRule, *, table_epsilon: float | None = None) -> SplitChoice:
    """The split of ``epsilon`` by ``rule``, with the alpha it resolved to and the reason in words.

    ``table_epsilon``: where ``alpha-by-eps`` reads its table, when not at ``epsilon`` itself (a
    plan to a PLD total splits a larger basic epsilon by the alpha of the budget's own).
    """
    epsilon = validate.positive("epsilon", epsilon)
    r = parse_rule(rule)
    if r.kind == "units":
        raise InvalidParameterError(f"split rule {str(r)!r} splits the units, not the budget: each phase gets the "
                                    "whole of it, so there is no eps1 to choose")
    if r.kind == "paper-v1":
        eps1 = min(0.6 * epsilon, 3.0)
        reason = "paper-v1: eps1 = min(0.6 eps, 3) (v1 of arXiv:2401.15246)"
    elif r.kind == _TABLE_RULE:
        at = epsilon if table_epsilon is None else validate.positive("table_epsilon", table_epsilon)
        step = alpha_by_epsilon(at)
        eps1 = step.alpha * epsilon
        reason = (f"alpha-by-eps: alpha = {step.alpha:g} for eps >= {step.from_epsilon:g} in ALPHA_BY_EPSILON "
                  f"({step.evidence}; {ALPHA_BY_EPSILON_SOURCE})")
        if table_epsilon is not None:
            reason += (f"; read at the budget's training epsilon {table_epsilon:.6g}, and applied to the larger "
                       f"{epsilon:.6g} the phases are planned to under a PLD total")
    elif r.kind == "alpha":
        assert r.value is not None  # parse_rule gives every alpha and eps1 rule its number
        eps1 = r.value * epsilon
        reason = f"a fixed alpha = {r.value:g}"
    else:
        assert r.value is not None
        eps1 = r.value
        if not epsilon - eps1 >= _NO_PHASE * epsilon:
            raise InvalidParameterError(f"split eps1 must be below the total epsilon {epsilon:g}, got {eps1:g}: the "
                                        "arm without a DP-SGD phase is spelled alpha=1")
        reason = f"a fixed eps1 = {eps1:g}"
    eps2 = epsilon - eps1
    if eps2 < _NO_PHASE * epsilon:  # alpha = 1: no DP-SGD phase at all
        eps1, eps2 = epsilon, 0.0
    return SplitChoice(rule=str(r), epsilon=epsilon, alpha=eps1 / epsilon, epsilon1=eps1, epsilon2=eps2,
                       reason=reason)


_NO_PHASE = 1e-12  # relative: a DP-SGD share below this is no phase (alpha within rounding of 1)
