"""``budgetplan plan | show | verify | statement | examples``: plan files end to end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from budgetplan.cli.render import fmt, params_table, results_table
from budgetplan.cli.shell import console, emit_json, warn

if TYPE_CHECKING:
    from rich.console import Console

    from budgetplan.plan import Plan
    from budgetplan.record.records import RunRecord
    from budgetplan.scenario.model import Scenario

__all__ = ["plan", "show", "verify", "statement", "examples", "audit"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def scenario_of(source: str) -> Scenario:
    from budgetplan.scenario import examples as ex
    from budgetplan.scenario.model import load_scenario, parse_scenario

    if source.startswith(ex.PREFIX):
        name = source[len(ex.PREFIX):]
        return parse_scenario(ex.text(name), default_name=name)
    return load_scenario(source)


def _summary(p: Plan) -> dict[str, Any]:
    from budgetplan.util.typed import to_json_object

    g = p.guarantee
    return {
        "epsilon": g.epsilon, "delta": g.delta, "accountant": g.method, "adjacency": p.adjacency.value,
        "sha256": p.sha256, "schema_version": p.schema_version, "algorithm": p.scenario.algorithm,
        "unit": p.unit.to_dict(), "dataset_size": p.dataset_size,
        "budget": {"epsilon": p.epsilon, "delta": p.delta, "composition": p.scenario.composition},
        "run_budget": {"epsilon": p.run_epsilon, "delta": p.run_delta},
        "phases": [{"name": ph.name, "target_epsilon": ph.target_epsilon, "target_delta": ph.target_delta,
                    "epsilon": ph.guarantee.epsilon, "delta": ph.guarantee.delta, "method": ph.guarantee.method,
                    "parameters": to_json_object(ph.params)} for ph in p.phases],
        "total": {"basic": p.total.to_dict(), "pld": p.total_pld.to_dict() if p.total_pld else None},
        "tuning": p.tuning, "unit_alternatives": list(p.unit_alternatives), "warnings": list(p.warnings),
    }


_SHOWN = {  # what `show` lists per phase kind (parameter names of its params type)
    "RRParams": ("per_impression_epsilon", "flip_probability", "per_impression_rule", "epochs", "batch_size"),
    "DPSGDParams": ("noise_multiplier", "noise_std", "clipping_norm", "sampling_rate", "steps", "epochs", "batch_size",
              "max_batch_size"),
    "WALRParams": ("noise_std", "sensitivity", "unit_sensitivity", "features", "row_norm_bound", "weights_bound"),
    "CountParams": ("dataset_size", "epsilon", "sensitivity", "noise_std"),
    "CalibrationParams": ("share", "coordinates", "sensitivity", "unit_sensitivity", "noise_std", "target"),
}


def _render(p: Plan, out: Console) -> None:
    g = p.guarantee
    out.print(params_table(f"Plan {p.scenario.name}", [
        ("algorithm", p.scenario.algorithm), ("unit", p.unit.describe()), ("adjacency", p.adjacency.value),
        ("dataset size N", p.dataset_size), ("budget", f"({fmt(p.epsilon)}, {fmt(p.delta)})"),
        ("guarantee", f"({fmt(g.epsilon)}, {fmt(g.delta)}) by {g.method}"),
        *([("phases planned to", f"basic epsilon {fmt(p.run_epsilon)} (its PLD total is the budget)")]
          if p.pld_budget else []),
        ("sha256", p.sha256)]))
    for i, ph in enumerate(p.phases, 1):
        rows = [("target", f"({fmt(ph.target_epsilon)}, {fmt(ph.target_delta, 4)})"),
                ("guarantee", f"({fmt(ph.guarantee.epsilon)}, {fmt(ph.guarantee.delta, 4)}) by {ph.guarantee.method}")]
        rows += [(k.replace("_", " "), getattr(ph.params, k)) for k in _SHOWN[type(ph.params).__name__]
                 if getattr(ph.params, k) is not None]
        if (part := getattr(ph.params, "unit_part", None)) is not None:
            rows.append(("units (hash position)", f"[{fmt(part.low)}, {fmt(part.high)}): about {part.rows:,} rows"))
        out.print(params_table(f"Phase {i}: {ph.name}", rows))
    how = "basic composition" if len(p.phases) > 1 else "the one phase"
    if p.total.method == "parallel-composition":
        how = "parallel over the units split"
    totals: list[list[str | float | None]] = [[how, p.total.epsilon, p.total.delta]]
    if p.total_pld is not None:
        totals.append(["PLD composition" + (" (the budget)" if p.pld_budget else ""),
                       p.total_pld.epsilon, p.total_pld.delta])
    if p.tuning is not None:
        t = p.tuning
        how = f"{t.selection} + noisy max (eps {fmt(t.noisy_max.epsilon)})" if t.noisy_max else t.selection
        totals.append([f"tuning: {t.configurations} configs, {how}", g.epsilon, g.delta])
    out.print(results_table("Totals", ["composition", "epsilon", "delta"], totals))
    if p.unit_alternatives:
        alt = []
        for a in p.unit_alternatives:
            knob = a.knob
            cost = f"{knob[0].replace('_', ' ')} {fmt(knob[1])}" if knob else f"n/a: {a.note}"
            per = "-" if a.noise_per_contribution is None else \
                fmt(a.noise_per_contribution) + (" (recommended)" if a.recommended else "")
            alt.append([a.phase, a.bounding, cost, "-" if a.unit_epsilon is None else a.unit_epsilon,
                        "-" if a.unit_delta is None else a.unit_delta, per])
        out.print(results_table(f"Ways to bound a unit of {p.unit.cap} examples (the plan uses "
                                f"{p.scenario.unit_accounting}, per-impression rule "
                                f"{p.scenario.rr.per_impression if p.scenario.rr else '-'})",
                                ["phase", "bounding", "cost", "unit eps", "unit delta", "noise / contribution"],
                                alt))


@click.command()
@click.argument("scenario", metavar="SCENARIO.toml")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the plan here (atomically); without it the plan JSON goes to stdout.")
@_JSON
def plan(scenario: str, output: str | None, as_json: bool) -> None:
    """Plan SCENARIO.toml (or example:NAME): split, calibrate, account, write a hashed plan."""
    from budgetplan.plan import write_atomic
    from budgetplan.planning.planner import build_plan
    from budgetplan.util.fileio import check_not_input

    if output is not None:
        check_not_input(output, scenario)
    sc = scenario_of(scenario)
    for w in sc.warnings:
        warn(w)
    p = build_plan(sc)
    text = p.to_json()
    if output is None:
        click.echo(text, nl=False)
        return
    write_atomic(output, text)
    if as_json:
        emit_json({**_summary(p), "output": output})
        return
    out = console()
    _render(p, out)
    out.print(f"wrote {output}")


@click.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@_JSON
def show(plan_file: str, as_json: bool) -> None:
    """Render a plan (its integrity is checked; `verify` recomputes the numbers), and what it means to an attacker."""
    from budgetplan.plan import load_plan
    from budgetplan.planning.composition import plan_tradeoff

    p = load_plan(plan_file)
    attacker = plan_tradeoff(p)
    if as_json:
        emit_json({**_summary(p), "attacker": attacker})
        return
    out = console()
    _render(p, out)
    out.print(results_table(f"An attacker's best true-positive rate (from the {attacker['from']} curve)",
                            ["false-positive rate", "true-positive rate at most"],
                            [[fmt(a), fmt(t, 4)] for a, t in zip(attacker["alphas"], attacker["tpr"])]))


@click.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--no-replan", is_flag=True, help="Skip re-planning the embedded scenario.")
@click.option("--scenario", "signed", metavar="SCENARIO.toml",
              help="The scenario that was signed off: the plan's embedded scenario must be exactly it "
              "(catches a re-hashed plan whose columns or budget were changed).")
@_JSON
def verify(plan_file: str, no_replan: bool, signed: str | None, as_json: bool) -> None:
    """Recompute every guarantee of a plan; exit 1 naming each difference."""
    from budgetplan.audit.verify import verify_file

    report = verify_file(plan_file, replan=not no_replan, signed=scenario_of(signed) if signed else None)
    if as_json:
        emit_json({**report.to_dict(), "file": plan_file})
        if not report.ok:
            click.echo(f"error: {plan_file} does not verify ({len(report.problems)} problem(s), listed in the JSON)",
                       err=True)
    else:
        for note in report.notes:
            warn(note)
        if report.ok:
            assert report.plan is not None  # a plan that verifies was read
            g = report.plan.guarantee
            click.echo(f"{plan_file}: verified ({fmt(g.epsilon)}, {fmt(g.delta)}) by {g.method}, "
                       f"sha256 {report.plan.sha256}")
        else:
            # one line, as every error: the problems in order, each naming what differs (--json lists them)
            click.echo(f"error: {plan_file} does not verify ({len(report.problems)} problem(s)): "
                       + "; ".join(" ".join(p.split()) for p in report.problems), err=True)
    click.get_current_context().exit(0 if report.ok else 1)


@click.command()
@click.argument("plan_file", metavar="PLAN.json|run.json", type=click.Path())
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False), help="For a run record: its plan "
              "(default: plan.json beside it).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write it here (atomically).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the guarantee, what it means to an attacker (the "
              "largest true-positive rate at false-positive rates 0.001 and 0.01) and the text.")
def statement(plan_file: str, plan_path: str | None, output: str | None, as_json: bool) -> None:
    """The plain-language privacy statement of a plan, or of what a run actually did.

    The plan is verified first (every number recomputed): a statement is never printed for a
    plan whose numbers do not hold, nor for a run of another plan or a non-private run.
    """
    from pathlib import Path

    from budgetplan.audit.verify import verify_plan
    from budgetplan.errors import PlanMismatchError
    from budgetplan.plan import load_plan, parse_json, write_atomic
    from budgetplan.report.statement import render_run_statement, render_statement
    from budgetplan.util.fileio import check_not_input

    path = Path(plan_file)
    if output is not None:  # the plan or record read here, including those found beside a run
        check_not_input(output, path, plan_path, path / "run.json", path / "plan.json", path.parent / "plan.json")
    is_run = path.is_dir()
    if not is_run:
        try:  # a run record names its plan; anything else is read (and judged) as a plan
            is_run = "plan_sha256" in parse_json(path.read_bytes().decode("ascii", errors="replace"), "file")
        except (OSError, PlanMismatchError):
            is_run = False
    record: RunRecord | None
    if is_run:
        from budgetplan.audit.run import find_plan
        from budgetplan.record.records import load_record

        record = load_record(path)
        the_plan = find_plan(path, plan_path)
    else:
        record, the_plan = None, load_plan(plan_file)
    report = verify_plan(the_plan)
    if not report.ok:
        raise PlanMismatchError(f"the plan does not verify, so no statement is printed for it: {report.problems[0]}",
                                report.problems)
    from budgetplan.planning.composition import plan_tradeoff

    attacker = plan_tradeoff(the_plan)
    text = (render_run_statement(the_plan, record, attacker) if record is not None
            else render_statement(the_plan, attacker))
    if as_json:
        import json

        g = the_plan.guarantee
        text = json.dumps({"plan_sha256": the_plan.sha256, "epsilon": g.epsilon, "delta": g.delta,
                           "attacker": attacker, "run_sha256": record.sha256 if record is not None else None,
                           "text": text}, indent=2, sort_keys=True, allow_nan=False) + "\n"
    if output is not None:
        write_atomic(output, text)
    else:
        click.echo(text, nl=False)


@click.command()
@click.argument("name", required=False)
@_JSON
def examples(name: str | None, as_json: bool) -> None:
    """List the shipped example scenarios, or print one (use it as example:NAME)."""
    from budgetplan.scenario import examples as ex

    if name is not None:
        text = ex.text(name)
        if as_json:
            emit_json({"name": name, "toml": text})
        else:
            click.echo(text, nl=False)
        return
    rows = [{"name": n, "use": f"{ex.PREFIX}{n}", "description": ex.describe(n)} for n in ex.names()]
    if as_json:
        emit_json({"examples": rows})
        return
    console().print(results_table("Example scenarios (budgetplan plan example:NAME -o plan.json)",
                                  ["name", "description"], [[r["name"], r["description"]] for r in rows]))


@click.command()
@click.argument("run", metavar="runs/NAME[/run.json]", type=click.Path())
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False), help="The plan (default: plan.json beside it).")
@click.option("--data", "data_path", type=click.Path(),
              help="Recompute the keyed data fingerprint from here (needs the private record and the key).")
@click.option("--fingerprint-key", "key_path", type=click.Path(dir_okay=False),
              help="The data owner's fingerprint key (default: private/fingerprint.key in the run directory).")
@click.option("--format", "data_format", default="auto", show_default=True)
@click.option("--empirical", is_flag=True, help="Also audit the trainer's training loops: lower bounds on epsilon "
              "and mechanism checks (needs torch).")
@click.option("--one-run", "one_run", is_flag=True, help="Also audit each DP-SGD phase in one run with a million "
              "gradient canaries on the installed code, testing the phase's trade-off curve (arXiv:2410.22235; needs "
              "torch).")
@click.option("--scenario", "signed", metavar="SCENARIO.toml",
              help="The signed-off scenario the plan must embed exactly.")
@_JSON
def audit(run: str, plan_path: str | None, data_path: str | None, key_path: str | None, data_format: str,
          empirical: bool, one_run: bool, signed: str | None, as_json: bool) -> None:
    """Re-account a run against its plan: exit 0 when every check holds, 1 naming each failure."""
    signed_scenario = scenario_of(signed) if signed else None
    if data_path is None and key_path is None and not (empirical or one_run):
        from budgetplan.audit import audit_run  # the record and ledger alone: no torch, no data

        report = audit_run(run, plan_path, signed=signed_scenario)
    else:  # the checks that read the data or run the trainer's code live with the trainers
        from trainers.audit import audit_run as audit_with_data
        from trainers.data.fingerprint import read_key

        report = audit_with_data(run, plan_path, data_path=data_path, data_format=data_format,
                                 fingerprint_key=read_key(key_path) if key_path is not None else None,
                                 empirical=empirical, signed=signed_scenario, one_run=one_run)
    if as_json:
        emit_json(report.to_dict())
    else:
        rows = [[c.name, "pass" if c.passed else "FAIL", c.detail] for c in report.checks]
        rows += [[e["name"], "pass" if e["passed"] else "FAIL", empirical_detail(e)] for e in report.empirical]
        status = "" if report.status == "completed" else f", {report.status}"
        status += ", seeded: not certifiable as private" if report.seeded else ""
        assert report.plan_sha256 is not None  # an audit reads its plan before anything else
        console().print(results_table(f"Audit of {run} (plan {report.plan_sha256[:12]}..., "
                                      f"({fmt(report.epsilon)}, {fmt(report.delta)}) {report.adjacency}{status})",
                                      ["check", "result", "detail"], rows))
    if report.nothing_to_certify:
        click.echo("error: interrupted run: nothing to certify until it is resumed and completes", err=True)
        click.get_current_context().exit(INTERRUPTED_EXIT)
    if not report.passed:
        click.echo(f"error: audit failed: {', '.join(report.failing())}", err=True)
    click.get_current_context().exit(0 if report.passed else 1)


INTERRUPTED_EXIT = 3  # audit: an interrupted run whose ledger holds up, with no record yet to certify


def empirical_detail(row: dict[str, Any]) -> str:
    """An empirical row's bound against the epsilon it is compared with, each with the adjacency it is under."""
    compared = row.get("compared")
    text = f"lower bound {fmt(row['epsilon_lower_bound'])} vs {fmt(row['planned_epsilon'])}"
    text += f" ({compared})" if compared else ""
    if row.get("phase_epsilon") is not None and row.get("phase_epsilon") != row["planned_epsilon"]:
        text += f"; the plan's phase: {fmt(row['phase_epsilon'])} ({row.get('phase_adjacency', 'its adjacency')})"
    text += f"; failing: {', '.join(row['failing'])}" if row.get("failing") else ""
    return text + (f"; {row['detail']}" if row.get("detail") and not row["passed"] else "")
