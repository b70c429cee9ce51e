"""One-run audits tested against a whole trade-off curve (f-DP), not one (eps, delta) pair.

Mahloujifar, Melis and Chaudhuri, "Auditing f-Differential Privacy in One Run" (ICML 2025,
arXiv:2410.22235). The game is Steinke, Nasr and Jagielski's (arXiv:2305.08846): m canaries,
secret bits S_i independent fair coins, one run, and an auditor who makes c' guesses
(a number fixed in advance) of which c are right. What is tested is the hypothesis that the
run is f-DP with respect to every canary for a trade-off curve f, here the curve of the
plan's own privacy loss distribution: a correct count that such a run reaches with
probability below the test's level refutes it.

The bound, derived here so that an auditor can check it. Write g(x) = f(1 - x) for the
least probability that an event has in one world when it has probability x in the
neighbouring one (in either order); g is convex and increasing. Pick a canary I uniformly,
let N be the number of right guesses, and for j = 0..c'

    r_j = P[I is guessed, rightly, and N >= j],   h_j = P[I is guessed, wrongly, and N >= j].

(1) h_j >= g(r_{j+1}). Given I, S_{-I} and the guessed bit b, the event "I is guessed b and
    the other guesses have >= j right" does not depend on S_I except through the run's
    output, so f-DP bounds its probability under S_I = 1 - b (where it means "I wrong, N >=
    j") by g of its probability under S_I = b (where it means "I right, N >= j + 1"); g is
    convex, so the bound survives averaging over b, I and S_{-I} (Jensen).
(2) h_j >= h_{j+1}, and r_j - r_{j+1} = j P[N = j] / m and h_j - h_{j+1} = (c' - j) P[N = j] / m,
    so r_j - r_{j+1} = j / (c' - j) (h_j - h_{j+1}); and r_0 + h_0 = c' / m.
(3) If P[N >= c] >= tau, the mass of N above c can be moved down onto c, and then a share
    of what is on c down onto c - 1 until tau is left: each move keeps (1) at every level
    below (h there gains what r loses, and g increases), and keeps the total.
(4) Among all sequences with r_c = tau c / m, h_c = tau (c' - c) / m that satisfy (1) and
    (2), the smallest r_0 + h_0 is reached by adding at each level only what (1) forces:
    in any other, mass on a level whose constraint is slack can be moved one level down
    (the level below gains h and loses r, so every constraint below gets easier), and once
    no level can shed any, the sequence is the greedy one.

So if the greedy sequence (``least_mass``) ends with r_0 + h_0 > c' / m, no f-DP run has
P[N >= c] >= tau: c right guesses refute f at level tau. The test needs f to hold for each
canary given all the others, which a plan's guarantee gives (it holds for every pair of
neighbouring data sets), and no independence between canaries.

The curve comes from a hockey-stick function delta(eps) (``Curve.from_hockey_stick``):
each eps gives two lines under g, (x - delta) e^-eps and 1 - delta - e^eps (1 - x), and
their upper envelope is convex; any finite set of eps with upper bounds on delta(eps) (the
pessimistic PLD's) gives a curve below the true one, so the test stays valid and only
loses power. For a plan, the hypotheses form a family (``Family``): its mechanism with the
Gaussian noise divided by s and the randomized-response epsilons multiplied by s, at s = 1
the plan. Refutation grows with s, so the largest refuted s (``noise_divisor_bound``) is
found by bisection; it is stated as the epsilon of that mechanism at the plan's delta: an
empirical epsilon in the plan's family, not a bound on every (eps, delta) the run could
satisfy. The verdict is the test at s = 1 alone: the plan's own curve.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike

from budgetplan.accounting import fastpld, pld_build
from budgetplan.errors import AccountingError, InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import (
    AllocationDPSGD,
    Composition,
    DiscreteLaplaceCount,
    GaussianRelease,
    Mechanism,
    PoissonDPSGD,
    RandomizedResponse,
    ShuffledDPSGD,
    TruncatedPoissonDPSGD,
    UnitPoissonDPSGD,
)
from budgetplan.plan import Plan
from budgetplan.planning.composition import joint_mechanism
from budgetplan.units import Adjacency, PrivacyUnit
from budgetplan.util import validate

__all__ = ["METHOD", "NOISE_DIVISOR_RANGE", "DIVISOR_TOLERANCE", "Curve", "check_counts", "least_mass", "refutes",
           "Family", "MechanismFamily", "PairFamily", "plan_family", "scaled", "refuted_by", "noise_divisor_bound"]

METHOD = "f-DP one-run (arXiv:2410.22235)"
NOISE_DIVISOR_RANGE = (2.0 ** -6, 2.0 ** 4)  # the family searched: the plan's noise x64 down to /16
DIVISOR_TOLERANCE = 1e-3                       # the bisection stops within this relative width
_MARGIN = 1e-9       # a refutation must clear c'/m by this relative margin: float rounding never decides it
_EPS_STEP = 0.01     # the finest spacing of the hockey-stick grid; coarser only beyond eps 80
_EPS_POINTS = 8000
_EPS_TOP = 200.0     # lines beyond this touch g only within e^-200 of x = 1


class Curve:
    """g(x): the least probability, in one of two neighbouring worlds, of an event with probability x in the other.

    Held as the upper envelope of lines a x + b (with the line 0), each a valid lower bound
    on g by itself; evaluated at a float in O(log lines).
    """

    __slots__ = ("_breaks", "_slopes", "_intercepts")

    def __init__(self, slopes: ArrayLike, intercepts: ArrayLike) -> None:
        a = np.concatenate([np.asarray(slopes, dtype=np.float64).ravel(), [0.0]])
        b = np.concatenate([np.asarray(intercepts, dtype=np.float64).ravel(), [0.0]])
        if a.shape != b.shape or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or np.any(a < 0):
            raise InvalidParameterError("a curve's lines need finite, non-negative slopes and finite intercepts")
        order = np.lexsort((b, a))  # by slope, then intercept: the last of equal slopes is the highest
        hull_a: list[float] = []
        hull_b: list[float] = []
        for ai, bi in zip(a[order].tolist(), b[order].tolist()):
            if hull_a and hull_a[-1] == ai:
                hull_a.pop()
                hull_b.pop()
            while len(hull_a) >= 2:  # the last line is hidden if the new one overtakes the one before it earlier
                a1, b1, a2, b2 = hull_a[-2], hull_b[-2], hull_a[-1], hull_b[-1]
                if (bi - b1) * (a2 - a1) >= (b2 - b1) * (ai - a1):
                    hull_a.pop()
                    hull_b.pop()
                else:
                    break
            hull_a.append(ai)
            hull_b.append(bi)
        self._slopes = hull_a
        self._intercepts = hull_b
        self._breaks = [(hull_b[k] - hull_b[k + 1]) / (hull_a[k + 1] - hull_a[k]) for k in range(len(hull_a) - 1)]

    @classmethod
    def from_hockey_stick(cls, epsilons: ArrayLike, deltas: ArrayLike) -> Curve:
        """The curve of a release that is (eps, delta)-DP for each pair, in both directions.

        Args:
            epsilons: epsilons >= 0.
            deltas: an upper bound on delta at each (values outside [0, 1] are clipped).
        """
        eps = np.asarray(epsilons, dtype=np.float64).ravel()
        d = np.clip(np.asarray(deltas, dtype=np.float64).ravel(), 0.0, 1.0)
        if eps.shape != d.shape or eps.size == 0 or not np.all(np.isfinite(eps)) or np.any(eps < 0):
            raise InvalidParameterError("a hockey-stick curve needs as many finite epsilons >= 0 as deltas")
        if np.any(np.isnan(d)):
            raise InvalidParameterError("a hockey-stick curve's deltas must not be NaN")
        down, up = np.exp(-eps), np.exp(eps)
        return cls(np.concatenate([down, up]), np.concatenate([-d * down, 1.0 - d - up]))

    @classmethod
    def epsilon_delta(cls, epsilon: float, delta: float) -> Curve:
        """The curve of (epsilon, delta)-DP: max(0, (x - delta) e^-eps, 1 - delta - e^eps (1 - x))."""
        eps = validate.non_negative("epsilon", epsilon)
        dl = validate.probability("delta", delta, allow_zero=True)
        return cls.from_hockey_stick([eps], [dl])

    def __call__(self, x: float) -> float:
        k = bisect.bisect_right(self._breaks, x)
        return self._slopes[k] * x + self._intercepts[k]


def check_counts(m: int, guesses: int, correct: int) -> tuple[int, int, int]:
    """(m, guesses, correct) as ints, or an error naming the one out of 0 <= correct <= guesses <= m, m >= 1."""
    m = validate.positive_int("canaries", m)
    g = validate.non_negative_int("guesses", guesses)
    c = validate.non_negative_int("correct", correct)
    if not c <= g <= m:
        raise InvalidParameterError(f"need 0 <= correct <= guesses <= canaries, got correct={c!r}, guesses={g!r}, "
                                    f"canaries={m!r}")
    return m, g, c


def least_mass(curve: Curve, m: int, guesses: int, correct: int, tail: float) -> float:
    """The least r_0 + h_0 (the module's note) of a run satisfying ``curve`` with P[N >= correct] = tail.

    The greedy sequence from r_c = tail c / m, h_c = tail (c' - c) / m; it stops early once
    it passes c' / m (the value returned is then only known to exceed it) or once a level
    forces nothing (no level below can force anything then either: r and h stay).
    """
    m, g, c = check_counts(m, guesses, correct)
    tau = validate.probability("tail", tail, allow_zero=True, allow_one=True)
    r, h = tau * c / m, tau * (g - c) / m
    cap = g / m
    for i in range(c - 1, -1, -1):
        if r + h > cap:
            break
        need = curve(r)
        if need <= h:
            break
        r += i / (g - i) * (need - h)
        h = need
    return r + h


def refutes(curve: Curve, m: int, guesses: int, correct: int, level: float) -> bool:
    """Whether ``correct`` of ``guesses`` right on ``m`` canaries refutes ``curve`` at significance ``level``."""
    lv = validate.open_unit("level", level)
    return least_mass(curve, m, guesses, correct, lv) > (guesses / m) * (1.0 + _MARGIN)


def scaled(mechanism: Mechanism, s: float) -> Mechanism:
    """``mechanism`` with its Gaussian noise divided by ``s`` and its randomized-response epsilons multiplied by it.

    Raises:
        UnsupportedError: a mechanism with neither.
    """
    if isinstance(mechanism, Composition):
        return replace(mechanism, phases=tuple(scaled(p, s) for p in mechanism.phases))
    # by the field that carries the noise: noise_multiplier (DP-SGD), noise_std (Gaussian releases),
    # epsilon (randomized response, the discrete Laplace count)
    if isinstance(mechanism, _NOISE_MULTIPLIER):
        return replace(mechanism, noise_multiplier=mechanism.noise_multiplier / s)
    if isinstance(mechanism, GaussianRelease):
        return replace(mechanism, noise_std=mechanism.noise_std / s)
    if isinstance(mechanism, (RandomizedResponse, DiscreteLaplaceCount)):
        return replace(mechanism, epsilon=mechanism.epsilon * s)
    raise UnsupportedError(f"{type(mechanism).__name__} has no noise to scale")


_NOISE_MULTIPLIER = (PoissonDPSGD, UnitPoissonDPSGD, TruncatedPoissonDPSGD, AllocationDPSGD, ShuffledDPSGD)


class Family:
    """Hypotheses indexed by a noise divisor s > 0, less private as s grows; s = 1 is the plan."""

    description: str
    delta: float

    def curve(self, s: float) -> Curve:
        raise NotImplementedError

    def epsilon(self, s: float) -> float:
        """The hypothesis' epsilon at ``delta``."""
        raise NotImplementedError


@dataclass(eq=False)
class MechanismFamily(Family):
    """The mechanism's PLD (pessimistic, both directions) with its noise divided by s.

    Raises (from ``curve``/``epsilon``): UnsupportedError where no PLD can be built at s.
    """

    mechanism: Mechanism
    adjacency: Adjacency
    unit: PrivacyUnit
    delta: float
    discretization: float
    description: str = ""
    _cache: dict[float, tuple[Curve, float]] = field(default_factory=dict, repr=False)

    def _built(self, s: float) -> tuple[Curve, float]:
        if s not in self._cache:
            try:
                pld = pld_build.build(scaled(self.mechanism, s), adjacency=self.adjacency, unit=self.unit,
                                      discretization=self.discretization, delta=self.delta).pld
            except (InvalidParameterError, AccountingError) as exc:  # a scaled noise out of the engine's range
                raise UnsupportedError(f"no PLD at noise divisor {s:g}: {exc}") from None
            top = max((float(p.losses[np.flatnonzero(p.probs)[-1]]) for p in pld.pmfs if np.any(p.probs)),
                      default=0.0)
            top = min(max(top, _EPS_STEP), _EPS_TOP)
            eps = np.linspace(0.0, top, max(2, min(_EPS_POINTS, math.ceil(top / _EPS_STEP)) + 1))
            curve = Curve.from_hockey_stick(eps, np.asarray(fastpld.delta_for_epsilon(pld, eps)))
            self._cache[s] = (curve, float(fastpld.epsilon_for_delta(pld, self.delta)))
        return self._cache[s]

    def curve(self, s: float) -> Curve:
        return self._built(s)[0]

    def epsilon(self, s: float) -> float:
        return self._built(s)[1]


@dataclass(eq=False)
class PairFamily(Family):
    """(s epsilon, delta)-DP: for plans whose phases have no joint PLD here."""

    epsilon_: float
    delta: float
    description: str = ""

    def curve(self, s: float) -> Curve:
        return Curve.epsilon_delta(s * self.epsilon_, self.delta)

    def epsilon(self, s: float) -> float:
        return s * self.epsilon_


def plan_family(plan: Plan) -> Family:
    """The hypotheses a one-run audit of ``plan`` tests: its phases' joint PLD where there is one, else (eps, delta)."""
    g = plan.guarantee
    mech = joint_mechanism(plan)
    if mech is not None:
        fam = MechanismFamily(mech, plan.adjacency, plan.unit, g.delta, plan.scenario.discretization,
                              description=f"the plan's PLD ({plan.adjacency.value}) with its noise divided by s")
        try:
            fam.curve(1.0)
            return fam
        except UnsupportedError:
            pass
    return PairFamily(g.epsilon, g.delta, description="(s x the plan's epsilon, the plan's delta)-DP")


def refuted_by(family: Family, counts: Iterable[tuple[int, int, int]], s: float, level: float) -> int | None:
    """The index of the first (canaries, guesses, correct) in ``counts`` that refutes ``family.curve(s)``, or None.

    A member the family cannot build is not refuted, except the plan itself (s = 1), whose
    UnsupportedError is raised.
    """
    try:
        curve = family.curve(s)
    except UnsupportedError:
        if s == 1.0:
            raise
        return None
    return next((i for i, (m, g, c) in enumerate(counts) if refutes(curve, m, g, c, level)), None)


def noise_divisor_bound(family: Family, counts: Iterable[tuple[int, int, int]],
                        level: float) -> tuple[float, int | None]:
    """(s, i): the largest noise divisor s that guess counts ``counts[i]`` refute at ``level``.

    ``counts``: (canaries, guesses, correct) triples; s is refuted if any of them refutes
    ``family.curve(s)``. Searched over ``NOISE_DIVISOR_RANGE`` by doubling from s = 1, then
    bisection to within ``DIVISOR_TOLERANCE``: the s returned is refuted, s (1 + tolerance)
    is not (unless s is the range's top, or where the family cannot be built beyond s).
    Returns (0.0, None) when even the range's bottom is not refuted.
    """
    lo_end, hi_end = NOISE_DIVISOR_RANGE
    counts = [(int(m), int(g), int(c)) for m, g, c in counts]

    def which(s: float) -> int | None:
        return refuted_by(family, counts, s, level)

    hit = which(1.0)
    if hit is None:  # down from the plan, halving
        hi, lo = 1.0, 0.5
        while (hit := which(lo)) is None:
            if lo / 2 < lo_end:
                return 0.0, None
            hi, lo = lo, lo / 2
    else:  # up from the plan, doubling
        lo, hi = 1.0, 2.0
        while (got := which(hi)) is not None:
            lo, hit = hi, got
            if 2 * hi > hi_end:
                return lo, hit
            hi = 2 * hi
    while hi / lo > 1.0 + DIVISOR_TOLERANCE:
        mid = math.sqrt(lo * hi)
        got = which(mid)
        if got is None:
            hi = mid
        else:
            lo, hit = mid, got
    return lo, hit
