"""Audit a tuned run: every configuration of the plan's grid, and the one selection, as accounted.

A plan with a grid (``budgetplan.planning.grid``) accounts n runs on the training part and one
report-noisy-max selection; the run (``trainers.tune``) logs configuration i's phases in
the ledger as ``c<i>/rr`` and ``c<i>/dpsgd`` and the selection as ``selection``. The audit
fails closed on anything it cannot match to the plan:

- ``tuned runs within plan``: the record lists exactly the plan's configurations, each
  once and in order, never more than declared, each with its planned phases; the record's
  own phases are the selected configuration's;
- ``configuration ledgers``: the ledger is intact, names the plan and ends where the
  record says; it opens exactly the declared configurations, spends under no other phase
  name, and holds each configuration's RR release (with the record's digest);
- ``selection released``: one selection intent and one release, naming the record's
  selected index among the declared number of candidates, at the plan's epsilon and
  Gumbel scale;
- per configuration (``#i ...``): the checks of a single run (steps, DP-SGD noise, Poisson
  batch sizes, RR flips, independent re-accounting) against that configuration's phases,
  its ledger lines and its record entries, with the training part's row count as N for
  the sampling and flip tests;
- the selected configuration s (``#s DP-SGD noise evidence``, ``#s Units kept whole``): the
  per-step evidence its DP-SGD phase measured, which the private record keeps as a
  one-process run's (``budgetplan.audit.step_evidence``): every step's noise drawn by rank 0,
  one draw per parameter, chi-square sums of squares; every sampled unit whole. Only the
  selected configuration's model is released and only its statistics are in the private
  record's phases, so the others are checked on their ledger and record entries alone.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from budgetplan.audit.ledger import array_sha256, steps_check
from budgetplan.audit.reaccount import reaccount_check
from budgetplan.audit.releases import flips_check, noise_check
from budgetplan.audit.report import AuditReport, Check
from budgetplan.audit.sampling import sampling_checks
from budgetplan.audit.step_evidence import evidence_checks
from budgetplan.errors import BudgetplanError
from budgetplan.plan import Plan
from budgetplan.plan.phases import DPSGDPhase, Phase, RRPhase
from budgetplan.planning.grid import Configuration, runs_of
from budgetplan.record.ledger import LedgerView, read_ledger
from budgetplan.record.records import PhaseRun, RunRecord, TuningRecord, phase_run_dict

__all__ = ["audit_tuned", "audit_tuned_interrupted"]

_PHASE = re.compile(r"^c([0-9]+)/(rr|dpsgd)$")


def _config_view(view: LedgerView, index: int) -> LedgerView:
    """Configuration ``index``'s ledger lines with their phases named as in a single run."""
    out, last = [], None
    for entry in view.entries:
        phase = entry.get("phase")
        if entry.get("event") == "intent":
            last = phase
        m = _PHASE.match(phase) if isinstance(phase, str) else None
        if m is not None:
            if int(m.group(1)) == index:
                out.append({**entry, "phase": m.group(2)})
        elif entry.get("event") == "torn":
            m = _PHASE.match(last) if isinstance(last, str) else None
            if m is not None and int(m.group(1)) == index:
                out.append(entry)
        elif phase is None:  # open, resume: the sessions
            out.append(entry)
    return LedgerView(path=view.path, entries=tuple(out), torn=view.torn)


def _ledger(record: RunRecord | None, plan: Plan, run_dir: Path,
            runs: list[tuple[Configuration, tuple[Phase, ...]]]) -> tuple[LedgerView | None, list[str]]:
    if not (run_dir / "ledger.jsonl").exists():
        return None, [f"no write-ahead ledger at {run_dir / 'ledger.jsonl'}: the runs cannot be confirmed"]
    try:
        view = read_ledger(run_dir / "ledger.jsonl", plan_sha256=plan.sha256)
    except BudgetplanError as exc:
        return None, [str(exc)]
    problems: list[str] = []
    if record is not None and (record.ledger is None or record.ledger.head != view.head
                               or record.ledger.lines != len(view.entries)):
        problems.append("the ledger does not end where the record says: it was cut or extended after the run")
    planned = {f"c{c.index}/{p.name}" for c, phases in runs for p in phases} | {"selection"}
    for entry in view.entries:
        phase = entry.get("phase")
        if entry.get("event") in ("intent", "released") and phase not in planned:
            problems.append(f"the ledger spends under {phase!r}, which no declared configuration has")
            break
    opened = [e.get("index") for e in view.events("configuration")]
    limit = len(runs)
    if len(opened) > limit or opened != list(range(len(opened))):
        problems.append(f"the ledger opens configurations {opened}; the plan declares {limit} (0 to {limit - 1}), "
                        "each once, in order")
    for c, phases in runs:
        if not any(isinstance(p, RRPhase) for p in phases):
            continue
        mine = _config_view(view, c.index)
        intents, notes = mine.events("intent", "rr"), mine.events("released", "rr")
        if record is None and not intents:
            continue
        if len(intents) != 1 or len(notes) != 1:
            problems.append(f"configuration {c.index}: the ledger shows {len(intents)} RR release intent(s) and "
                            f"{len(notes)} release(s); exactly one of each is planned")
            continue
        path = run_dir / f"c{c.index}_rr_labels.npy"
        if not path.exists():
            problems.append(f"{path.name}, configuration {c.index}'s RR release the ledger recorded, is not here")
        elif array_sha256(path) != notes[0].get("sha256"):
            problems.append(f"{path.name} does not match the digest the ledger recorded for it")
    return view, problems


def audit_tuned(report: AuditReport, record: RunRecord, plan: Plan, run_dir: Path, alpha: float) -> None:
    """Append the checks of a tuned run (``record`` read strictly already) to ``report``."""
    assert plan.tuning is not None  # audited as tuned because the plan declares its grid

    add = report.checks.append
    runs = runs_of(plan)
    t = record.tuning
    problems: list[str] = []
    listed: list[tuple[int, tuple[PhaseRun, ...]]] = []
    if t is None:
        add(Check("tuned runs within plan", False, "the plan declares a grid of configurations but the record "
                                                          "shows no tuning: nothing to check the runs against"))
        return
    # the record was read strictly: every run's phases are typed entries, the selection is there
    listed = [(r.index, r.phases) for r in t.runs]
    selected, training_rows = t.selection.selected, t.training_rows
    n = len(runs)
    if t.configurations != plan.tuning.configurations:
        problems.append(f"the record declares {t.configurations!r} configurations, the plan "
                        f"{plan.tuning.configurations}")
    if len(listed) > n:
        problems.append(f"{len(listed)} runs recorded, more than the {n} configurations declared")
    elif [i for i, _ in listed] != list(range(n)):
        problems.append(f"the record lists configurations {[i for i, _ in listed]}; the plan's grid is 0 to {n - 1}, "
                        "each once (a completed tuned run trains them all)")
    for (c, phases), (_, entries) in zip(runs, listed):
        if [e.name for e in entries] != [p.name for p in phases]:
            problems.append(f"configuration {c.index} ran {[e.name for e in entries]}, planned "
                            f"{[p.name for p in phases]}")
    if not (isinstance(selected, int) and 0 <= selected < len(listed)):
        problems.append(f"the selected configuration {selected!r} is not one that ran")
    elif [phase_run_dict(p) for p in record.phases] != [phase_run_dict(p) for p in listed[selected][1]]:
        problems.append(f"the record's phases are not those of the selected configuration {selected}")
    if not (isinstance(training_rows, int) and 0 < training_rows < plan.dataset_size):
        problems.append(f"the training part has {training_rows!r} rows; it must hold some but not all of the "
                        f"N = {plan.dataset_size}")
    add(Check("tuned runs within plan", not problems, "; ".join(problems) or
                     f"{len(listed)} of {n} declared configurations, each with its planned phases; configuration "
                     f"{selected} selected"))
    view, ledger_problems = _ledger(record, plan, run_dir, runs)
    add(Check("configuration ledgers", view is not None and not ledger_problems,
                     "; ".join(ledger_problems) or f"{len(view.entries) if view else 0} lines, hash chain intact; "
                                                   f"{n} configurations opened, each spending only its own phases"))
    add(_selection(view, t, plan, n))
    if problems:
        return
    for (c, phases), (_, entries) in zip(runs, listed):
        mine = dataclasses.replace(plan, phases=phases, tuning=None)
        sized = dataclasses.replace(plan, dataset_size=training_rows, tuning=None, phases=tuple(
            # each phase gets its own kind of parameters back: mypy cannot pair a union of phases with the union
            # of their parameters (as in plan.phases.phase_from_dict)
            dataclasses.replace(p, params=dataclasses.replace(p.params, dataset_size=training_rows))  # type: ignore[arg-type]
            for p in phases))
        sub = dataclasses.replace(record, phases=entries, tuning=None)
        cview = _config_view(view, c.index) if view is not None else None
        # the private record's phase statistics (and so the step evidence) are the selected configuration's
        evidence = evidence_checks(sub, sized, alpha) if c.index == selected else []
        for check in [steps_check(sub, mine, cview), noise_check(sub, mine), *evidence,
                      *sampling_checks(sized, cview, sub, alpha), flips_check(sub, sized, alpha),
                      reaccount_check(sub, mine)]:
            add(dataclasses.replace(check, name=f"#{c.index} {check.name}"))


def _selection(view: LedgerView | None, t: TuningRecord, plan: Plan, n: int) -> Check:
    name = "selection released"
    if view is None:
        return Check(name, False, "no readable ledger: the selection's release cannot be confirmed")
    want, sel = plan.tuning.noisy_max if plan.tuning is not None else None, t.selection
    assert want is not None  # a tuned plan's selection
    problems: list[str] = []
    intents, notes = view.events("intent", "selection"), view.events("released", "selection")
    if len(intents) != 1 or len(notes) != 1:
        problems.append(f"the ledger shows {len(intents)} selection intent(s) and {len(notes)} release(s); exactly "
                        "one of each is planned (a selection without its noisy release is not accounted)")
    elif notes[0].get("selected") != sel.selected or notes[0].get("candidates") != n:
        problems.append(f"the ledger released configuration {notes[0].get('selected')!r} of "
                        f"{notes[0].get('candidates')!r}; the record says {sel.selected!r} of {n}")
    for key, have, planned in (("epsilon", sel.epsilon, want.epsilon),
                               ("gumbel_scale", sel.gumbel_scale, want.gumbel_scale)):
        if not math.isclose(have, planned, rel_tol=1e-12):
            problems.append(f"the selection's {key} is {have!r}, the plan's {planned!r}")
    return Check(name, not problems, "; ".join(problems) or
                 f"one report-noisy-max release (configuration {sel.selected} of {n}) at epsilon "
                 f"{want.epsilon:.6g}, Gumbel scale {want.gumbel_scale:.6g}")


def audit_tuned_interrupted(report: AuditReport, plan: Plan, run_dir: Path) -> None:
    """A tuned run without a record: its ledger spent nothing beyond the plan so far."""
    runs = runs_of(plan)
    view, problems = _ledger(None, plan, run_dir, runs)
    if view is not None:
        for c, phases in runs:
            mine = _config_view(view, c.index)
            for p in phases:
                planned = p.params.steps if isinstance(p, DPSGDPhase) else 1
                if mine.count(p.name) > planned:
                    problems.append(f"configuration {c.index}: {mine.count(p.name)} {p.name} intents, more than the "
                                    f"{planned} planned")
        if view.count("selection") > 1:
            problems.append(f"{view.count('selection')} selection intents; one is planned")
    report.checks.append(Check("configuration ledgers", view is not None and not problems,
                               "; ".join(problems) or "interrupted: nothing beyond the plan spent so far"))
