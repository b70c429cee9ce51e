"""Empirical audits of a plan's phases, run on the trainer's own training loops.

An accountant proves an upper bound on epsilon for the mechanism as planned; these audits
run the code that executes it (``rr_phase.run_rr_phase``, ``walr.run_walr``,
``dpsgd.run_dpsgd``, each looked up on its module at call time, so a patched or edited
loop is what gets measured) on neighbouring inputs and report two kinds of evidence:

- a lower bound on epsilon. If the code is (eps, delta)-DP then P1[S] <= e^eps P0[S] + delta
  for every event S, so eps >= ln((P1_low - delta) / P0_high), where P1_low and P0_high are
  one-sided Clopper-Pearson bounds (Clopper and Pearson 1934) on the event's probability
  under the two neighbours, each at level (1 - confidence) / 2. A bound above the plan
  proves, at that confidence, that the code leaks more than the plan says (Jagielski,
  Ullman and Oprea, arXiv:2006.07709; Nasr et al., arXiv:2101.04535). Where an event has
  to be chosen, it is chosen on one half of the observations and bounded on the other.
- mechanism checks: the released quantities are compared with the distribution the plan
  accounts (flip rate, noise scale, independence, the canary's shift), each a two-sided test
  with false-alarm rate ``ALPHA``. They catch defects whose epsilon lies in tails no
  affordable sample reaches (a Gaussian release with half its noise, at delta = 1e-8).

A phase passes when its bound is at most the planned epsilon and every check holds. A
passing audit does not prove the code private: it found no violation these tests can see.
The audit measures the code installed now, not necessarily the code that produced a run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace

import numpy as np
from scipy import stats

from budgetplan import _validate
from budgetplan.errors import BudgetplanError, InvalidParameterError

__all__ = [
    "ALPHA",
    "DEFAULT_CONFIDENCE",
    "MechanismCheck",
    "Result",
    "audit_plan",
    "epsilon_from_counts",
    "rr_lower_bound",
    "walr_lower_bound",
]

DEFAULT_CONFIDENCE = 1.0 - 1e-6
ALPHA = 1e-6  # false-alarm rate of each mechanism check, as the run auditor's tests
# RR's optimal event is known, so at the default sample size its bound must come this close.
TIGHT_RR_MARGIN = 0.05
RR_SAMPLES = 5_000_000
WALR_SAMPLES = 10_000
# Thresholds tried on the selection half: tail positions spaced geometrically down to one sample.
_CANDIDATES_PER_TAIL = 160
# The selection half scores each threshold by the bound it would give at a level this much
# stricter than the final one: among ~300 candidates the best-looking one on few counts is
# mostly luck (winner's curse) and does not replicate on the held-out half. Measured on
# simulated Gaussian releases (eps 2, 2 x 20,000): mean bound 0.567 -> 0.576, sd 0.086 ->
# 0.052, worst of 300 runs 0.157 -> 0.440.
_SELECTION_STRICTNESS = 1e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class MechanismCheck:
    """One test that the released quantities follow the planned mechanism.

    Attributes:
        name: what is tested, e.g. "noise std per step".
        passed: p_value >= alpha.
        p_value: the test's p-value (two-sided where a deviation either way is a defect).
        alpha: the false-alarm rate it fails at.
        detail: the statistic against what the plan implies.
    """

    name: str
    passed: bool
    p_value: float
    alpha: float
    detail: str


def check(name: str, p_value: float, detail: str, alpha: float = ALPHA) -> MechanismCheck:
    p = float(p_value) if math.isfinite(p_value) else 0.0
    return MechanismCheck(name=name, passed=bool(p >= alpha), p_value=p, alpha=alpha,
                          detail=f"{detail}; p = {p:.3g} (fails below {alpha:g})")


def two_sided_chi2(statistic: float, dof: float) -> float:
    return float(min(1.0, 2.0 * min(stats.chi2.cdf(statistic, dof), stats.chi2.sf(statistic, dof))))


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One phase's audit: the lower bound on epsilon against the plan, and the mechanism checks.

    Attributes:
        mechanism: "randomized-response", "gaussian-release" or "poisson-dpsgd".
        planned_epsilon: the epsilon the bound is compared with, at ``delta`` (``compared``
            says which accounting that is).
        compared: what ``planned_epsilon`` is (adjacency, steps, accountant).
        phase_epsilon: the plan's own epsilon for the phase (its adjacency and unit).
        delta: the delta both are read at.
        epsilon_lower_bound: ln((P1_low - delta) / P0_high), or 0.0 when that is not positive.
        confidence: the probability that the bound is valid (both Clopper-Pearson bounds hold).
        samples: observations per neighbour (RR: labels; WALR: releases; DP-SGD: canaries
            present; ``absent`` holds the other neighbour's count where it differs).
        absent: observations of the second neighbour.
        evaluated: observations per neighbour the bound was computed on (the held-out half).
        event: the distinguishing event, and which neighbour is in the numerator.
        hits: (event count under the numerator's neighbour, under the denominator's).
        probability_lower: P1_low. probability_upper: P0_high.
        checks: the mechanism checks.
        seconds: wall time of the whole audit of the phase.
        passed: epsilon_lower_bound <= planned_epsilon and every check passed.
        tight: RR only: 0 <= planned_epsilon - epsilon_lower_bound <= TIGHT_RR_MARGIN.
    """

    mechanism: str
    planned_epsilon: float
    compared: str
    phase_epsilon: float | None
    delta: float
    epsilon_lower_bound: float
    confidence: float
    samples: int
    absent: int
    evaluated: int
    event: str
    hits: tuple[int, int]
    probability_lower: float
    probability_upper: float
    checks: tuple[MechanismCheck, ...] = ()
    seconds: float
    passed: bool
    tight: bool | None = None

    @property
    def failing(self) -> list[str]:
        """Names of what failed: "epsilon lower bound" and/or the failing checks."""
        out = [] if self.epsilon_lower_bound <= self.planned_epsilon else ["epsilon lower bound"]
        return out + [c.name for c in self.checks if not c.passed]

    def detail(self) -> str:
        head = (f"lower bound {self.epsilon_lower_bound:.4g} vs {self.planned_epsilon:.4g} ({self.compared})")
        parts = [("FAIL " if "epsilon lower bound" in self.failing else "") + head]
        parts += [("FAIL " if not c.passed else "") + f"{c.name}: p = {c.p_value:.3g}" for c in self.checks]
        return "; ".join(parts)

    def to_row(self, name: str) -> dict:
        """The audit report's row: JSON-ready, with ``name``, ``passed``, ``failing`` and ``detail``."""
        row = {"name": name, **asdict(self)}
        row["hits"] = list(row["hits"])
        row["checks"] = list(row["checks"])
        row["failing"] = self.failing
        row["detail"] = self.detail()
        return row


def make_result(*, checks=(), t0: float, tight=None, **fields) -> Result:
    checks = tuple(checks)
    passed = bool(fields["epsilon_lower_bound"] <= fields["planned_epsilon"]) and all(c.passed for c in checks)
    fields.setdefault("absent", fields["samples"])
    return Result(**fields, checks=checks, seconds=time.perf_counter() - t0, passed=passed, tight=tight)


# ---- statistics ---------------------------------------------------------------------------


def _cp_lower(k, n, alpha):
    """One-sided Clopper-Pearson lower bound: P[p < bound] <= alpha. Vectorised."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.ppf(alpha, k, n - k + 1)
    return np.where(k > 0, out, 0.0)


def _cp_upper(k, n, alpha):
    """One-sided Clopper-Pearson upper bound: P[p > bound] <= alpha. Vectorised."""
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = stats.beta.isf(alpha, k + 1, n - k)  # not ppf(1 - alpha): 1 - alpha rounds to 1 below 1e-16
    return np.where(k < n, out, 1.0)


def _log_ratio(p_low, p_high, delta):
    """ln((p_low - delta) / p_high), 0 where the numerator is not positive; never negative."""
    p_low, p_high = np.asarray(p_low, dtype=np.float64), np.asarray(p_high, dtype=np.float64)
    num = p_low - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.where(num > 0, num, 1.0)) - np.log(p_high)
    return np.where(num > 0, np.maximum(out, 0.0), 0.0)


def alpha_of(confidence: float) -> float:
    """The level of each of the two Clopper-Pearson bounds behind a bound valid at ``confidence``."""
    return (1.0 - _validate.open_unit("confidence", confidence)) / 2.0


def epsilon_from_counts(*, hits_numerator: int, n_numerator: int, hits_denominator: int, n_denominator: int,
                        delta: float, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float]:
    """(eps lower bound, P1_low, P0_high) from event counts under the two neighbours.

    Valid with probability >= ``confidence``: each Clopper-Pearson bound fails with
    probability at most (1 - confidence) / 2.
    """
    alpha = alpha_of(confidence)
    for name, k, n in (("hits_numerator", hits_numerator, n_numerator),
                       ("hits_denominator", hits_denominator, n_denominator)):
        if not 0 <= k <= n or n < 1:
            raise InvalidParameterError(f"{name} must be a count in [0, {n}] of n >= 1 trials, got {k}")
    lo = float(_cp_lower(hits_numerator, n_numerator, alpha))
    hi = float(_cp_upper(hits_denominator, n_denominator, alpha))
    return float(_log_ratio(lo, hi, delta)), lo, hi


def split_threshold_bound(present: np.ndarray, absent: np.ndarray, *, delta: float, alpha: float, unit: str,
                          names: tuple[str, str] = ("present", "absent")) -> dict:
    """Choose the best threshold event on the first half of each sample; bound it on the second half.

    ``present`` holds observations of the neighbour expected to score higher, ``absent`` of
    the other; the two may differ in size. Two families of events are tried: {x > t} with
    ``present`` in the numerator, and {x <= t} with ``absent`` in the numerator (both
    directions of the DP inequality). Thresholds are order statistics of each selection
    half at tail positions spaced geometrically from the extreme inwards. Only the second
    halves enter the bound, so it is valid whatever the first halves chose.

    Returns:
        dict with epsilon_lower_bound, probability_lower, probability_upper, hits, evaluated
        (size of the held-out half of ``present``), absent_evaluated and event (text).
    """
    hp, ha = present.size // 2, absent.size // 2
    if min(hp, ha) < 1:
        raise InvalidParameterError(f"need at least 2 observations per neighbour, got {min(present.size, absent.size)}")
    sel_p, sel_a = np.sort(present[:hp]), np.sort(absent[:ha])
    ev_p, ev_a = present[hp:2 * hp], absent[ha:2 * ha]
    thresholds = []
    for s in (sel_p, sel_a):
        tail = np.unique(np.geomspace(1, max(s.size / 2, 1), _CANDIDATES_PER_TAIL).astype(np.int64))
        thresholds += [s[s.size - tail], s[tail - 1]]
    thresholds = np.unique(np.concatenate(thresholds))

    def above(sorted_x, t):
        return sorted_x.size - np.searchsorted(sorted_x, t, side="right")

    ap, aa = above(sel_p, thresholds), above(sel_a, thresholds)
    sa = alpha * _SELECTION_STRICTNESS
    high = _log_ratio(_cp_lower(ap, hp, sa), _cp_upper(aa, ha, sa), delta)
    low = _log_ratio(_cp_lower(ha - aa, ha, sa), _cp_upper(hp - ap, hp, sa), delta)
    use_low = low.max() > high.max()
    t = float(thresholds[np.argmax(low if use_low else high)])
    k_p, k_a = int(np.count_nonzero(ev_p > t)), int(np.count_nonzero(ev_a > t))
    n_p, n_a = ev_p.size, ev_a.size
    if use_low:
        (hits, ns) = (n_a - k_a, n_p - k_p), (n_a, n_p)
        text = f"{unit} <= {t:.6g}: P[{names[1]}] / P[{names[0]}]"
    else:
        (hits, ns) = (k_p, k_a), (n_p, n_a)
        text = f"{unit} > {t:.6g}: P[{names[0]}] / P[{names[1]}]"
    lo, hi = float(_cp_lower(hits[0], ns[0], alpha)), float(_cp_upper(hits[1], ns[1], alpha))
    text += f" (threshold chosen on a disjoint half: {hp} {names[0]}, {ha} {names[1]})"
    return {"epsilon_lower_bound": float(_log_ratio(lo, hi, delta)), "probability_lower": lo,
            "probability_upper": hi, "hits": hits, "evaluated": n_p, "absent_evaluated": n_a, "event": text}


def _randomness(randomness):
    if randomness is None:
        from trainers.randomness import Randomness

        return Randomness()
    return randomness


class _Released(Exception):  # noqa: N818 - a control-flow sentinel, not an error
    """Raised by the capturing session: the release is recorded, the rest of the phase is skipped."""

    def __init__(self, data, info):
        super().__init__("released")
        self.data, self.info = data, info


class _CaptureSession:
    """A run session that keeps the phase's one release and stops the phase right after it.

    Training on the release is post-processing, so nothing after it can change the epsilon;
    stopping there means no model is trained on millions of rows.
    """

    resumed = False
    checkpoint_every = 0

    def rr_labels(self, make):
        raise _Released(*make())

    def walr_sum(self, make):
        raise _Released(*make())


# ---- randomized response ------------------------------------------------------------------


def _rr_phase_at(epsilon: float):
    from budgetplan.accounting.rr import flip_probability

    return SimpleNamespace(name="rr", parameters={"per_impression_rule": "eps/K", "per_impression_epsilon": epsilon,
                                                  "flip_probability": flip_probability(epsilon), "epochs": 1})


def rr_lower_bound(*, epsilon: float | None = None, phase=None, samples: int = RR_SAMPLES, randomness=None,
                   flip=None, confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA) -> Result:
    """Audit the RR phase's label randomisation, at delta = 0.

    The labels are released by the real ``trainers.rr_phase.run_rr_phase`` (looked up at call
    time) through a session that keeps the released labels and stops the phase there: one
    call randomises ``samples`` labels 1 and ``samples`` labels 0, each an independent trial.
    The event is fixed by the mechanism and optimal: the released label is 1. For correct RR
    the bound comes within ``TIGHT_RR_MARGIN`` of epsilon (about 0.01 at eps = 3 and 5M labels).
    Mechanism check: the flip rate equals the plan's flip probability (two-sided binomial).

    Args:
        epsilon: a per-example budget to audit (RR at that epsilon), or
        phase: the plan's ``rr`` phase (under eps/K_i, rows of units with K_i = 1, whose
            per-impression budget is the largest).
        samples: labels per neighbour.
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        flip: optional ``flip(labels, rho, randomness) -> (noisy, flipped)`` to audit instead of
            the RR phase (``randomize_labels``'s signature).
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of the flip-rate check.
    """
    from budgetplan.accounting.rr import flip_probability

    t0 = time.perf_counter()
    if (epsilon is None) == (phase is None):
        raise InvalidParameterError("give exactly one of epsilon and phase")
    if phase is None:
        phase = _rr_phase_at(_validate.positive("epsilon", epsilon))
    par = phase.parameters
    n = _validate.positive_int("samples", samples)
    rnd = _randomness(randomness)
    by_count = par["per_impression_rule"] == "eps/K_i"
    planned = float(par["per_impression_epsilon_by_count"][0] if by_count else par["per_impression_epsilon"])
    rho = flip_probability(planned)
    labels = np.concatenate([np.ones(n, np.int8), np.zeros(n, np.int8)])
    if flip is not None:
        out = flip(labels.copy(), np.full(2 * n, rho), rnd)
        noisy = np.asarray(out[0] if isinstance(out, tuple) else out)
    else:
        noisy = _release_rr(phase, labels, rnd, unit_counts=np.ones(2 * n, np.int64) if by_count else None)
    if noisy.shape != labels.shape:
        raise InvalidParameterError(f"the RR release must hold {labels.size} labels, got shape {noisy.shape}")
    k1, k0 = int(np.count_nonzero(noisy[:n] == 1)), int(np.count_nonzero(noisy[n:] == 1))
    a = alpha_of(confidence)
    lo, hi = float(_cp_lower(k1, n, a)), float(_cp_upper(k0, n, a))
    lb = float(_log_ratio(lo, hi, 0.0))
    flipped = (n - k1) + k0
    p = float(stats.binomtest(flipped, 2 * n, rho).pvalue)
    checks = [check("flip rate", p, f"{flipped} of {2 * n} labels flipped, expected {2 * n * rho:.1f} at the planned "
                                    f"flip probability {rho:.6g}", alpha)]
    return make_result(mechanism="randomized-response", planned_epsilon=planned, compared="per-example epsilon",
                       phase_epsilon=getattr(getattr(phase, "guarantee", None), "epsilon", None), delta=0.0,
                       epsilon_lower_bound=lb, confidence=confidence, samples=n, evaluated=n, hits=(k1, k0),
                       event="released label = 1: P[true label 1] / P[true label 0] (fixed by the mechanism)",
                       probability_lower=lo, probability_upper=hi, checks=checks, t0=t0,
                       tight=bool(0.0 <= planned - lb <= TIGHT_RR_MARGIN))


def _release_rr(phase, labels: np.ndarray, randomness, unit_counts) -> np.ndarray:
    import torch

    from trainers import rr_phase

    data = SimpleNamespace(label=torch.as_tensor(labels, dtype=torch.float32))
    try:
        rr_phase.run_rr_phase(None, data, phase, unit_counts=unit_counts, loss="unbiased", lr=1e-3,
                              optimizer="adam", batch_size=1024, randomness=randomness, session=_CaptureSession())
    except _Released as released:
        return np.asarray(released.data)
    raise BudgetplanError("run_rr_phase returned without releasing its labels through the run session")


# ---- Gaussian release (WALR) --------------------------------------------------------------


def _walr_inputs(par: Mapping):
    """(X, weights, y with row 0 labelled 1, y with it labelled 0, expected sum for each, shift).

    Three rows, k = the plan's features. Row 0 is far outside the row bound R, with weight
    2W: ``prepare_rows`` must clip it to norm R and weight W, so its contribution W R is
    what a label change moves the sum by, the most the clipping allows. The expected sums are
    computed here, independently of the trainer's code.
    """
    import torch

    k, R, W = int(par["features"]), float(par["row_norm_bound"]), float(par["weights_bound"])
    X = np.zeros((3, k - 1))
    X[0], X[1, :1], X[2, -1:] = 1e3, 0.3, 0.5
    w = np.array([2 * W, W / 2, W])
    rows = np.hstack([X, np.ones((3, 1))])
    norms = np.linalg.norm(rows, axis=1)
    rows = rows * np.minimum(1.0, R / norms)[:, None]
    contrib = rows * np.minimum(w, W)[:, None]
    y1, y0 = np.array([1.0, 0.0, 1.0]), np.array([0.0, 0.0, 1.0])
    return (torch.as_tensor(X), torch.as_tensor(w), torch.as_tensor(y1), torch.as_tensor(y0),
            y1 @ contrib, y0 @ contrib, float(np.linalg.norm(contrib[0])))


def walr_lower_bound(parameters: Mapping, *, delta: float, epsilon: float | None = None, samples: int = WALR_SAMPLES,
                     randomness=None, confidence: float = DEFAULT_CONFIDENCE, alpha: float = ALPHA,
                     progress: str | None = None) -> Result:
    """Audit WALR's one Gaussian release through the real ``trainers.walr.run_walr``.

    Each of ``samples`` releases per neighbour is one call of ``run_walr`` (looked up at call
    time) on a three-row dataset whose row 0 contributes the most the plan's clipping allows,
    labelled 1 against 0, with the plan's noise_std, bounds and features (N set to 3: it
    only scales the fit); the release is captured through ``run_walr``'s ``persist`` hook,
    which then stops the call before the fit. Evidence:

    - the bound: releases projected on the difference of the two sums, a threshold chosen on
      half of them. Far from tight: a Gaussian's epsilon at small delta lies in tails no
      affordable sample reaches.
    - "release centred on the planned sum": n ||mean residual||^2 / noise_std^2 ~ chi2(k) per
      neighbour, the residual being the release minus the sum computed here independently.
    - "noise std": the summed squared residuals / noise_std^2 ~ chi2(2 n k), two-sided.
    - "noise is Gaussian": Kolmogorov-Smirnov of the residuals, centred and divided by
      noise_std, against N(0, 1).

    Args:
        parameters: the plan's WALR phase parameters.
        delta: the plan's delta.
        epsilon: the epsilon to compare with; default the exact analytic Gaussian epsilon
            (Balle and Wang, arXiv:1805.06530) at the planned sensitivity.
        samples: releases per neighbour.
        randomness: a ``Randomness`` (default: a fresh CSPRNG one).
        confidence: probability that the bound is valid.
        alpha: false-alarm rate of each check.
        progress: a progress-bar label, or None.
    """
    from budgetplan.accounting.gaussian import analytic_epsilon
    from trainers import walr
    from trainers.progress import bar

    t0 = time.perf_counter()
    par = dict(parameters)
    sigma, sens = float(par["noise_std"]), float(par["sensitivity"])
    delta = _validate.open_unit("delta", delta)
    n = _validate.positive_int("samples", samples)
    planned = (analytic_epsilon(sigma=sigma, delta=delta, sensitivity=sens) if epsilon is None
               else _validate.non_negative("epsilon", epsilon))
    rnd = _randomness(randomness)
    X, w, y1, y0, s1, s0, shift = _walr_inputs(par)
    par["dataset_size"] = 3
    session = _CaptureSession()

    def one(y) -> np.ndarray:
        try:
            walr.run_walr(X, y, w, par, rnd, steps=0, minibatch=1, lr=1.0, persist=session.walr_sum)
        except _Released as released:
            return np.asarray(released.data.cpu() if hasattr(released.data, "cpu") else released.data, np.float64)
        raise BudgetplanError("run_walr returned without releasing its sum through the persist hook")

    k = s1.size
    r1, r0 = np.empty((n, k)), np.empty((n, k))
    pbar = bar(progress, n)
    try:
        for i in range(n):  # interleaved, so any drift in the randomness source hits both neighbours alike
            r1[i], r0[i] = one(y1) - s1, one(y0) - s0
            if pbar is not None:
                pbar[0].advance(pbar[1])
    finally:
        if pbar is not None:
            pbar[0].stop()
    u = (s1 - s0) / np.linalg.norm(s1 - s0)
    split = split_threshold_bound((r1 + s1) @ u, (r0 + s0) @ u, delta=delta, alpha=alpha_of(confidence),
                                  unit="release projected on the difference", names=("label 1", "label 0"))
    centred = n * (np.square(r1.mean(0)).sum() + np.square(r0.mean(0)).sum()) / sigma**2
    sq = (np.square(r1).sum() + np.square(r0).sum()) / sigma**2
    # centred on their own means, so that this check tests the shape alone (estimating the 2k means
    # only makes Kolmogorov-Smirnov conservative)
    ks = stats.kstest(np.concatenate([(r1 - r1.mean(0)).ravel(), (r0 - r0.mean(0)).ravel()]) / sigma, "norm")
    checks = [
        check("release centred on the planned sum", stats.chi2.sf(centred, 2 * k),
              f"n |mean residual|^2 / noise_std^2 = {centred:.4g} against chi2({2 * k})", alpha),
        check("noise std", two_sided_chi2(sq, 2 * n * k),
              f"measured {sigma * math.sqrt(sq / (2 * n * k)):.6g} against the planned {sigma:.6g}", alpha),
        check("noise is Gaussian", ks.pvalue, f"Kolmogorov-Smirnov distance {ks.statistic:.3g} over {2 * n * k} "
                                              "standardised residuals", alpha),
    ]
    split["event"] += f"; label 1 vs 0 of a row contributing {shift:.6g}"
    split.pop("absent_evaluated")
    return make_result(mechanism="gaussian-release", planned_epsilon=planned,
                       compared="analytic Gaussian epsilon at the planned sensitivity", phase_epsilon=None,
                       delta=delta, confidence=confidence, samples=n, checks=checks, t0=t0, **split)


# ---- the per-plan driver ------------------------------------------------------------------


def audit_plan(plan, *, randomness=None, progress: bool = False, confidence: float = DEFAULT_CONFIDENCE,
               alpha: float = ALPHA) -> list[dict]:
    """Audit every phase of ``plan`` on the installed trainer code; one row per phase.

    Each row is ``Result.to_row``: ``name`` ("empirical rr", "empirical walr", "empirical
    dpsgd"), ``passed``, ``epsilon_lower_bound``, ``planned_epsilon``, ``checks``,
    ``failing``, ``detail`` and the rest of the ``Result``. A DP-SGD phase under truncated
    Poisson sampling has no canary audit (its batches cannot be scaled down to the canary
    set as accounted) and gets no row.

    The code measured is the code installed now: it need not be the code that trained a
    given run.
    """
    from trainers import empirical_dpsgd

    rows = []
    for phase in plan.phases:
        par = phase.parameters
        if phase.name == "rr":
            res = rr_lower_bound(phase=phase, randomness=randomness, confidence=confidence, alpha=alpha)
        elif phase.name == "walr":
            res = walr_lower_bound(par, delta=phase.guarantee.delta, randomness=randomness, confidence=confidence,
                                   alpha=alpha, progress="empirical WALR releases" if progress else None)
            res = _with_phase_epsilon(res, phase)
        elif phase.name == "dpsgd" and par.get("sampling") == "poisson":
            res = empirical_dpsgd.dpsgd_lower_bound(par, delta=phase.guarantee.delta, randomness=randomness,
                                                    confidence=confidence, alpha=alpha,
                                                    progress="empirical DP-SGD canaries" if progress else None)
            res = _with_phase_epsilon(res, phase)
        else:
            continue
        rows.append(res.to_row(f"empirical {phase.name}"))
    return rows


def _with_phase_epsilon(res: Result, phase) -> Result:
    return replace(res, phase_epsilon=float(phase.guarantee.epsilon))

