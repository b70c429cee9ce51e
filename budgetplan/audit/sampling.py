"""Batch sizes against the plan's batch selection: Poisson at q, whole allocation epochs, fixed shuffled batches."""

from __future__ import annotations

import math

from scipy import stats

from budgetplan.audit.private_n import SizesEvidence, full_dpsgd
from budgetplan.audit.ranks import rank_checks
from budgetplan.audit.record import missing_check, record_entry
from budgetplan.audit.report import Check
from budgetplan.plan import Plan
from budgetplan.plan.phases import DPSGDParams
from budgetplan.record.ledger import LedgerView
from budgetplan.record.records import (
    DPSGDRun,
    RunRecord,
)


def two_sided_binomial(k: int, n: int, p: float) -> float:
    if n == 0:
        return 1.0
    if n < 10**7:
        return float(stats.binomtest(int(k), int(n), p).pvalue)
    z = (k - n * p) / math.sqrt(n * p * (1 - p))
    return float(2 * min(stats.norm.cdf(z), stats.norm.sf(z)))



def batch_moments(n: int, q: float, cap: int | None) -> tuple[float, float]:
    """Mean and variance of one step's batch size: Binomial(N, q), truncated at ``cap`` if given."""
    if cap is None or cap >= n:
        return n * q, n * q * (1 - q)
    dist = stats.binom(n, q)
    k = batch_support(n, q, cap)
    m = [min(int(x), cap) for x in k]
    pmf = dist.pmf(k)
    tail = float(dist.sf(k[-1]))  # mass above the evaluated support, all truncated to cap
    mean = float(sum(a * b for a, b in zip(m, pmf))) + cap * tail
    second = float(sum(a * a * b for a, b in zip(m, pmf))) + cap * cap * tail
    return mean, second - mean * mean



def batch_support(n: int, q: float, cap: int) -> list[int]:
    mu, sd = n * q, math.sqrt(n * q * (1 - q))
    lo, hi = max(0, int(mu - 12 * sd) - 1), min(n, max(cap, int(mu + 12 * sd) + 1))
    return list(range(lo, hi + 1))



EPOCH_NAMES = {"allocation": "Allocation batch sizes", "shuffle": "Shuffled batch sizes"}



def epoch_size_checks(name: str, sizes: list[int], counted: int, par: DPSGDParams, alpha: float) -> list[Check]:
    """The batch sizes of an allocation or shuffled run against the plan's epochs of T = N // B steps.

    Shuffle: every batch is exactly B, so an epoch totals T B. Allocation: every row is in
    exactly one step of an epoch, so each whole epoch totals exactly N, and its sizes are
    multinomial(N; 1/T, ..., 1/T): Pearson's X^2 = sum_t (s_t - N/T)^2 / (N/T) has mean
    exactly T - 1 and variance 2 (T - 1)(1 - 1/N), so the sum over E whole epochs is tested,
    two-sided, against chi-square with E (T - 1) degrees of freedom (fixed-size batches have
    none of that spread, Poisson batches miss the exact totals).
    """
    n, t = par.dataset_size, par.steps_per_epoch
    if len(sizes) != counted:
        return [Check(name, False, f"{len(sizes)} batch sizes for {counted} counted steps: the sizes cannot be "
                                   f"cut into the plan's epochs of {t} steps")]
    whole = [sizes[i:i + t] for i in range(0, len(sizes) - len(sizes) % t, t)]
    part = sizes[len(whole) * t:]
    if par.sampling == "shuffle":
        wrong = [(i, x) for i, x in enumerate(sizes) if x != par.batch_size]
        detail = (f"{len(sizes)} batches, every one of exactly B = {par.batch_size}" if not wrong else
                  f"{len(wrong)} of {len(sizes)} batches are not of exactly B = {par.batch_size} (step {wrong[0][0]}: "
                  f"{wrong[0][1]}); shuffled batches have no spread")
        return [Check(f"{name}: fixed size", not wrong, detail)]
    bad = [i for i, epoch in enumerate(whole) if sum(epoch) != n]
    over = sum(part) > n
    detail = (f"{len(whole)} whole epoch(s) of {t} steps, each totals exactly N = {n}" if not bad else
              f"{len(bad)} of {len(whole)} whole epochs do not total N = {n} (epoch {bad[0]}: {sum(whole[bad[0]])}): "
              "every row is used exactly once per epoch under allocation")
    if over:
        detail += f"; the unfinished epoch already uses {sum(part)} > N rows"
    checks = [Check(f"{name}: epoch totals", not bad and not over, detail)]
    if whole and t >= 2:
        expected = n / t
        stat = math.fsum((x - expected) ** 2 / expected for epoch in whole for x in epoch)
        df = len(whole) * (t - 1)
        p_var = float(2 * min(stats.chi2.cdf(stat, df), stats.chi2.sf(stat, df)))
        checks.append(Check(f"{name}: spread", p_var >= alpha,
                            f"Pearson X^2 = {stat:.1f} over {len(whole)} epoch(s) against chi-square({df}) "
                            f"(multinomial sizes, mean N/T = {expected:.2f}); two-sided p = {p_var:.3g} "
                            f"(fails below {alpha:g})"))
    return checks


def sampling_checks(plan: Plan, ledger: LedgerView | None, record: RunRecord | None, alpha: float,
                    evidence: SizesEvidence | None = None) -> list[Check]:
    """The batch sizes the ledger holds against the plan's batch selection (one check per test)."""
    planned = plan.dpsgd
    if planned is None:
        return []
    par = planned.params
    name = EPOCH_NAMES.get(par.sampling, "Poisson batch sizes")
    found = _batch_evidence(name, plan, ledger, record, evidence)
    if isinstance(found, Check):
        return [found]
    ran, sized, n = found
    assert ledger is not None  # _batch_evidence fails the check without one
    sizes = sized.batch_sizes("dpsgd")
    counted = ledger.count("dpsgd")
    problems = _size_problems(ran, sizes, counted, ledger)
    if par.sampling in EPOCH_NAMES and not problems:
        return epoch_size_checks(name, sizes, counted, par, alpha) if sizes else [Check(name, True,
                                                                                  "no noisy step taken yet")]
    cap = par.max_batch_size if par.sampling == "truncated-poisson" else None
    if cap is not None and sizes and max(sizes) > cap:
        problems.append(f"a batch of {max(sizes)} exceeds the plan's maximum {cap}")
    if problems:
        return [Check(name, False, "; ".join(problems))]
    if not sizes:
        return [Check(name, True, "no noisy step taken yet")]
    what = "rows" if par.units is None else "units"
    return _poisson_tests(name, sizes, n, par.sampling_rate, cap, what, alpha) + rank_checks(
        sized, ran, rows=n, q=par.sampling_rate, alpha=alpha, two_sided_binomial=two_sided_binomial, what=what)


def _batch_evidence(name: str, plan: Plan, ledger: LedgerView | None, record: RunRecord | None,
                    evidence: SizesEvidence | None) -> Check | tuple[DPSGDRun | None, LedgerView, int]:
    """The record's DP-SGD entry (withheld statistics restored), the ledger holding the batch sizes and the
    N (or M) they were drawn from; a failing check when any of it cannot be read."""
    planned = plan.dpsgd
    assert planned is not None
    ran = record_entry(record, DPSGDRun) if record is not None else None
    if record is not None and ran is None:
        return missing_check(name, "a DP-SGD phase")
    if ledger is None:
        return Check(name, False, "no readable ledger: the batch sizes of the run cannot be read")
    if ran is not None and record is not None:
        ran, problem = full_dpsgd(record, plan, ran)
        if problem is not None:
            return Check(name, False, problem)
    # a unit-sampled phase draws its batches from the M units: its sizes count units
    n = planned.params.dataset_size if planned.params.units is None else planned.params.units
    if planned.params.unit_part is not None:  # a units split: from its part's rows, which the record states
        if ran is None or ran.part_rows is None:
            return Check(name, False, "the plan trains DP-SGD on a part of the units, but the record does not say how "
                                      "many rows the part held")
        n = ran.part_rows
    if plan.count is None:
        return ran, ledger, n
    evidence = evidence or SizesEvidence(problem="no private batch-size ledger was read")
    if evidence.problem is not None or evidence.view is None or evidence.rows is None:
        return Check(name, False, evidence.problem or "the private batch sizes cannot be read")
    return ran, evidence.view, evidence.rows  # drawn at q from every row there was


def _size_problems(ran: DPSGDRun | None, sizes: list[int], counted: int, ledger: LedgerView) -> list[str]:
    """Where the ledger's batch sizes disagree with its step count or with the record's statistics."""
    problems = []
    if ran is not None and (len(sizes), sum(sizes), sum(s * s for s in sizes)) != (
            ran.batch_sizes_observed, ran.batch_size_sum, ran.batch_size_sumsq):
        problems.append("the record's batch-size statistics are not those of the ledger")
    if counted and not sizes:
        problems.append(f"the ledger counts {counted} noisy steps but records no batch size")
    if len(sizes) < counted - ledger.sessions:  # at most one torn intent per session lacks its size
        problems.append(f"only {len(sizes)} of {counted} counted steps have a batch size in the ledger")
    if len(sizes) > counted:
        problems.append(f"{len(sizes)} batch sizes for {counted} counted steps")
    return problems


def _poisson_tests(name: str, sizes: list[int], n: int, q: float, cap: int | None, what: str,
                   alpha: float) -> list[Check]:
    """The total and the spread of Poisson (or truncated Poisson) batch sizes, two-sided at ``alpha``."""
    t = len(sizes)
    total = sum(sizes)
    mu, var1 = batch_moments(n, q, cap)
    if cap is None:
        p_total = two_sided_binomial(total, n * t, q)
        how = "two-sided binomial"
    else:
        z = (total - t * mu) / math.sqrt(t * var1) if var1 > 0 else 0.0
        p_total = float(2 * stats.norm.sf(abs(z)))
        how = f"two-sided normal (Poisson truncated at {cap})"
    checks = [Check(f"{name}: total", p_total >= alpha,
                    f"{total} {what} over {t} steps (all sessions, from the ledger), expected {t * mu:.1f}; {how} "
                    f"p = {p_total:.3g} (fails below {alpha:g})")]
    if t >= 2 and var1 > 0:
        mean = total / t
        var = (sum(s * s for s in sizes) - t * mean * mean) / (t - 1)
        stat = (t - 1) * var / var1
        p_var = float(2 * min(stats.chi2.cdf(stat, t - 1), stats.chi2.sf(stat, t - 1)))
        checks.append(Check(f"{name}: spread", p_var >= alpha,
                            f"variance {var:.2f} against {var1:.2f}; two-sided chi-square p = {p_var:.3g} "
                            "(fixed-size or shuffled batches have no spread)"))
    return checks
