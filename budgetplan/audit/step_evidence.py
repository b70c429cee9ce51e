"""The audit of what each noisy step did, from the evidence the trainer measured (``budgetplan.record.evidence``).

The private record's DP-SGD statistics hold, for the last session, each step's noise (which
ranks drew it, how many draws, their sum of squares), the participation of every row in each
epoch of allocation or shuffled batches, and whether every sampled unit was whole. Three
checks, each failing closed when its evidence is not there:

- ``DP-SGD noise evidence``: every step of the session has its noise drawn by exactly one
  rank (rank 0 of the record's processes), with one draw per trainable parameter, adding up
  to the record's ``noise_draws``; and the draws are standard normal: the sum of squares of
  the session, chi-square with (steps x parameters) degrees of freedom, two-sided, and the
  smallest step's, chi-square with one step's draws, lower tail with Bonferroni over the
  steps, each at ``alpha / 2`` (a step whose claimed draw was not made has a sum of 0).
- ``Allocation participation`` / ``Shuffled participation``: in every whole epoch each of
  the N rows took part exactly once (allocation, k = 1 per epoch as accounted), or at most
  once with exactly T B rows taking part (shuffled batches); an unfinished epoch has no row
  twice. Exact: an honest run never fails it.
- ``Units kept whole`` (unit sampling): every sampled block held all the rows of one unit
  and no unit came twice in a step. Exact as well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scipy import stats

from budgetplan.audit.record import record_entry
from budgetplan.audit.report import Check
from budgetplan.plan import Plan
from budgetplan.plan.phases import DPSGDParams
from budgetplan.record.records import DPSGDRun, DPSGDStats, RunRecord

__all__ = ["evidence_checks", "NOISE", "UNITS", "PARTICIPATION"]

NOISE = "DP-SGD noise evidence"
UNITS = "Units kept whole"
PARTICIPATION = {"allocation": "Allocation participation", "shuffle": "Shuffled participation"}


def evidence_checks(record: RunRecord, plan: Plan, alpha: float) -> list[Check]:
    """The checks of the DP-SGD session's evidence (``[]`` when the plan has no DP-SGD phase)."""
    if plan.dpsgd is None:
        return []
    par = plan.dpsgd.params
    names = [NOISE] + ([PARTICIPATION[par.sampling]] if par.sampling in PARTICIPATION else []) + (
        [UNITS] if par.samples_units else [])
    ran = record_entry(record, DPSGDRun)
    stats_ = None if record.private_part is None else next(
        (p for p in record.private_part.phases if isinstance(p, DPSGDStats)), None)
    missing = ("the record shows no DP-SGD phase" if ran is None else
               "the private record, which holds the per-step evidence, is not here" if record.private_part is None
               else "the private record keeps no per-step evidence of the DP-SGD phase" if stats_ is None
               or stats_.evidence is None else None)
    if missing is not None:
        return [Check(name, False, missing) for name in names]
    assert ran is not None and stats_ is not None and stats_.evidence is not None
    ev = stats_.evidence
    checks = [noise_evidence_check(ev, ran, alpha)]
    if par.sampling in PARTICIPATION:
        checks.append(participation_check(ev, ran, par))
    if par.samples_units:
        checks.append(units_check(ev, ran))
    return checks


def noise_evidence_check(ev: Mapping[str, Any], ran: DPSGDRun, alpha: float) -> Check:
    ranks, draws, chi2 = ev["noise_ranks"], ev["noise_draws"], ev["noise_chi2"]
    t, d = ran.steps_this_session, ran.trainable_parameters
    drawer = (0,)  # rank 0 draws, with one process or several
    problems = []
    if len(ranks) != t:
        problems.append(f"noise evidence for {len(ranks)} steps; the session took {t}")
    wrong = [i for i, r in enumerate(ranks) if tuple(r) != drawer]
    if wrong:
        i = wrong[0]
        who = "no rank" if not ranks[i] else f"rank(s) {list(ranks[i])}"
        problems.append(f"{len(wrong)} of {len(ranks)} steps did not have their noise drawn by rank 0 alone (step "
                        f"{i}: {who} drew it)")
    short = [i for i, x in enumerate(draws) if x != d]
    if short:
        problems.append(f"{len(short)} steps made other than one draw per trainable parameter (step {short[0]}: "
                        f"{draws[short[0]]} draws for {d} parameters)")
    if sum(draws) != ran.noise_draws:
        problems.append(f"the steps made {sum(draws)} draws; the record claims {ran.noise_draws}")
    if problems or not chi2:
        return Check(NOISE, not problems, "; ".join(problems) or "no noisy step in this session")
    total, df = math.fsum(chi2), d * len(chi2)
    p_total = float(2 * min(stats.chi2.cdf(total, df), stats.chi2.sf(total, df)))
    low = min(chi2)
    p_low = min(1.0, len(chi2) * float(stats.chi2.cdf(low, d)))
    passed = p_total >= alpha / 2 and p_low >= alpha / 2
    return Check(NOISE, passed, f"{len(chi2)} steps, each drawn by rank 0 alone with {d} draws; sum of squares "
                                f"{total:.6g} against chi-square({df}), two-sided p = {p_total:.3g}; smallest step "
                                f"{low:.6g} against chi-square({d}), lower tail x {len(chi2)} steps p = {p_low:.3g} "
                                f"(each fails below {alpha / 2:g})")


def participation_check(ev: Mapping[str, Any], ran: DPSGDRun, par: DPSGDParams) -> Check:
    name = PARTICIPATION[par.sampling]
    epochs = ev.get("participation")
    if epochs is None:
        return Check(name, False, "the evidence holds no participation counts of the epochs")
    spe, n = par.steps_per_epoch, par.dataset_size
    whole_epochs, rest = divmod(ran.steps_this_session, spe)
    problems = []
    whole = [e for e in epochs if e["whole"]]
    if len(whole) != whole_epochs or len(epochs) - len(whole) > (1 if rest else 0):
        problems.append(f"participation of {len(whole)} whole and {len(epochs) - len(whole)} unfinished epochs; the "
                        f"session's {ran.steps_this_session} steps make {whole_epochs} whole epochs of {spe}")
    used = n if par.sampling == "allocation" else spe * par.batch_size
    want = {"1": used, **({"0": n - used} if used < n else {})}
    for i, e in enumerate(epochs):
        counts = {k: v for k, v in e["counts"].items()}
        twice = sum(v for k, v in counts.items() if int(k) > 1)
        if e["whole"] and counts != want:
            problems.append(f"epoch {i}: rows took part {_times(counts)}; every one of the {n} rows "
                            + ("takes part exactly once" if par.sampling == "allocation"
                               else f"at most once, {used} of them") + " per epoch as the plan accounts")
        elif not e["whole"] and twice:
            problems.append(f"the unfinished epoch {i} used {twice} rows more than once")
    detail = "; ".join(problems[:3]) or (f"{len(whole)} whole epoch(s): every row took part exactly once" if
                                         par.sampling == "allocation" else
                                         f"{len(whole)} whole epoch(s): {used} rows once, {n - used} sat out, none "
                                         "twice")
    return Check(name, not problems, detail)


def _times(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} row(s) {k} time(s)" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))


def units_check(ev: Mapping[str, Any], ran: DPSGDRun) -> Check:
    if "unit_blocks" not in ev:
        return Check(UNITS, False, "the evidence holds no check of the sampled units' blocks")
    blocks, split = ev["unit_blocks"], ev["units_split"]
    if split:
        return Check(UNITS, False, f"{split} of {blocks} sampled unit blocks in this session did not hold all the "
                                   "rows of one unit, or repeated a unit within a step: a unit was split across "
                                   "blocks or batches, and each part was clipped to C on its own")
    return Check(UNITS, True, f"all {blocks} sampled unit blocks of the session's {ran.steps_this_session} steps held "
                              "one whole unit each")
