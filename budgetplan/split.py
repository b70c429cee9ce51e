"""How Hybrid splits a total (eps, delta) between its RR phase (eps1, 0) and DP-SGD (eps2, delta).

Published rules (Chua et al., "Training Differentially Private Ad Prediction Models with
Semi-Sensitive Features", arXiv:2401.15246):

- ``paper-v1``: eps1 = min(0.6 eps, 3) (v1 of the paper: RR utility collapses below
  eps1 ~ 3, and above eps1 = 4 the rest is better spent on DP-SGD);
- ``alpha=<a>``: eps1 = a eps for a in [0, 1] (v2; a is tuned per eps from
  {0, .25, .5, .75, 1}); a = 0 is plain DP-SGD, a = 1 plain RR on the truncated model;
- ``eps1=<e>``: an explicit eps1 strictly between 0 and eps.

A rule is read strictly: no spaces, a plain decimal number (``alpha=0.5``, ``eps1=1.5e0``),
nothing else. The two arms without a split are spelled with alpha only: ``alpha=0`` (no RR
phase) and ``alpha=1`` (no DP-SGD phase); ``eps1=0`` and ``eps1=<eps>`` are refused and
point there, so that each arm has one name and a typo cannot silently drop a phase.

By basic composition the two phases are (eps1 + eps2, delta)-DP; RR is pure, so all of
delta goes to DP-SGD.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from budgetplan import _validate
from budgetplan.errors import InvalidParameterError

__all__ = ["SplitRule", "parse_rule", "split_budget", "PAPER_ALPHAS", "PAPER_EPSILONS"]

PAPER_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
PAPER_EPSILONS = (1.0, 3.0, 5.0, 10.0, 20.0, 30.0, 50.0)
_RULE = re.compile(r"^(alpha|eps1)=((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)$")
_FORMS = '"paper-v1", "alpha=<a>" or "eps1=<e>" (no spaces)'


@dataclass(frozen=True, slots=True)
class SplitRule:
    """A parsed split rule: ``kind`` is "paper-v1", "alpha" or "eps1"; ``value`` its number."""

    kind: str
    value: float | None = None

    def __str__(self) -> str:
        return "paper-v1" if self.kind == "paper-v1" else f"{self.kind}={self.value:g}"


def parse_rule(rule: str | SplitRule, name: str = "split rule") -> SplitRule:
    """Read ``"paper-v1"``, ``"alpha=<a>"`` or ``"eps1=<e>"``."""
    if isinstance(rule, SplitRule):
        return rule
    if not isinstance(rule, str):
        raise InvalidParameterError(f"{name} must be {_FORMS}, got {rule!r}")
    if rule == "paper-v1":
        return SplitRule("paper-v1")
    m = _RULE.match(rule)
    if not m:
        raise InvalidParameterError(f"{name} must be {_FORMS}, got {rule!r}")
    value = float(m.group(2))
    if m.group(1) == "alpha":
        return SplitRule("alpha", _validate.probability(f"{name} alpha", value, allow_zero=True, allow_one=True))
    if value == 0:
        raise InvalidParameterError(f"{name} eps1 must be > 0, got {rule!r}: the arm without an RR phase is "
                                    "spelled alpha=0")
    return SplitRule("eps1", _validate.positive(f"{name} eps1", value))


def split_budget(epsilon: float, rule: str | SplitRule) -> tuple[float, float]:
    """(eps1, eps2) with eps1 + eps2 = epsilon exactly (eps2 is computed as the remainder)."""
    epsilon = _validate.positive("epsilon", epsilon)
    r = parse_rule(rule)
    if r.kind == "paper-v1":
        eps1 = min(0.6 * epsilon, 3.0)
    elif r.kind == "alpha":
        assert r.value is not None  # parse_rule gives every alpha and eps1 rule its number
        eps1 = r.value * epsilon
    else:
        assert r.value is not None
        eps1 = r.value
        if not epsilon - eps1 >= _NO_PHASE * epsilon:
            raise InvalidParameterError(f"split eps1 must be below the total epsilon {epsilon:g}, got {eps1:g}: the "
                                        "arm without a DP-SGD phase is spelled alpha=1")
    eps2 = epsilon - eps1
    if eps2 < _NO_PHASE * epsilon:  # alpha = 1: no DP-SGD phase at all
        return epsilon, 0.0
    return eps1, eps2


_NO_PHASE = 1e-12  # relative: a DP-SGD share below this is no phase (alpha within rounding of 1)
