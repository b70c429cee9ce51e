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

from dataclasses import replace

from budgetplan.plan.phases import DPSGDPhase, RRPhase, WALRPhase
from trainers.empirical.releases import RR_SAMPLES, TIGHT_RR_MARGIN, WALR_SAMPLES, rr_lower_bound, walr_lower_bound
from trainers.empirical.stats import (
    ALPHA,
    DEFAULT_CONFIDENCE,
    MechanismCheck,
    Result,
    epsilon_from_counts,
    split_threshold_bound,
)

__all__ = [
    "ALPHA",
    "DEFAULT_CONFIDENCE",
    "RR_SAMPLES",
    "TIGHT_RR_MARGIN",
    "WALR_SAMPLES",
    "MechanismCheck",
    "Result",
    "audit_plan",
    "epsilon_from_counts",
    "rr_lower_bound",
    "split_threshold_bound",
    "walr_lower_bound",
]


def audit_plan(plan, *, randomness=None, progress: bool = False, confidence: float = DEFAULT_CONFIDENCE,
               alpha: float = ALPHA, processes: int = 1) -> list[dict]:
    """Audit every phase of ``plan`` on the installed trainer code; one row per phase.

    Each row is ``Result.to_row``: ``name`` ("empirical rr", "empirical walr", "empirical
    dpsgd"), ``passed``, ``epsilon_lower_bound``, ``planned_epsilon``, ``checks``,
    ``failing``, ``detail`` and the rest of the ``Result``, and ``phase_adjacency``: the
    adjacency of the plan's own ``phase_epsilon`` (``compared`` says what the bound is
    compared with, which may be another adjacency's epsilon). A DP-SGD phase under truncated
    Poisson sampling is audited as the Poisson run it is, at the plan's q with its batches
    uncut (the cut cannot be scaled down to the canary set as accounted, and it only removes
    participation, which the accounting covers): its row says so. A phase that samples
    units, allocates or shuffles is run so (``trainers.empirical.execution``); allocation and shuffled batches are
    compared with the phase's planned epsilon. ``processes``: the processes the run trained
    with; the DP-SGD canaries are run over as many gloo ranks.

    The code measured is the code installed now: it need not be the code that trained a
    given run.
    """
    from trainers.empirical import canaries  # torch: the RR and WALR audits run without it

    rows = []
    for phase in plan.phases:
        match phase:
            case RRPhase():
                res = rr_lower_bound(phase=phase, randomness=randomness, confidence=confidence, alpha=alpha)
            case WALRPhase(params=par):
                res = walr_lower_bound(par, delta=phase.guarantee.delta, randomness=randomness,
                                       confidence=confidence, alpha=alpha,
                                       progress="empirical WALR releases" if progress else None)
                res = _with_phase_epsilon(res, phase)
            case DPSGDPhase(params=par):
                epochs = par.sampling in ("allocation", "shuffle")
                res = canaries.dpsgd_lower_bound(par, delta=phase.guarantee.delta, randomness=randomness,
                                                 epsilon=float(phase.guarantee.epsilon) if epochs else None,
                                                 confidence=confidence, alpha=alpha, processes=processes,
                                                 progress="empirical DP-SGD canaries" if progress else None)
                res = _with_phase_epsilon(res, phase)
            case _:
                continue
        row = res.to_row(f"empirical {phase.name}")
        row["phase_adjacency"] = phase.guarantee.adjacency.value  # what phase_epsilon is under (compared: the bound's)
        rows.append(row)
    return rows


def _with_phase_epsilon(res: Result, phase) -> Result:
    return replace(res, phase_epsilon=float(phase.guarantee.epsilon))

