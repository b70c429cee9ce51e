"""Auditing a tuned run: an honest one passes; more runs than declared, a configuration missing from
the ledger, a selection without its noisy release, and spending outside the grid each fail closed."""

import json

import pyarrow.parquet as pq
import pytest

from budgetplan.audit import audit_run
from budgetplan.cli import cli
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from tests.forgeries import copy_run, public, rechain, write_record
from tests.trainers.test_tune import FAST, GRID_2X1, grid_scenario

ROWS = 3000


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    from trainers.data.synth import synthesize
    from trainers.run import RunOptions, execute_plan

    root = tmp_path_factory.mktemp("audit-tuned")
    pq.write_table(synthesize(ROWS, 900, 4), root / "train.parquet")
    plan = build_plan(parse_scenario(grid_scenario(GRID_2X1)))
    execute_plan(plan, root / "train.parquet", RunOptions(out_dir=root / "run", settings=FAST))
    return root, plan


def failing(report):
    return {c.name for c in report.checks if not c.passed}


def test_an_honest_tuned_run_passes_every_check(tuned):
    root, _ = tuned
    report = audit_run(root / "run")
    assert report.passed, report.failing
    names = {c.name for c in report.checks}
    assert {"model file", "seed policy", "tuned runs within plan", "configuration ledgers", "selection released",
            "#0 steps within plan", "#1 DP-SGD noise", "#1 RR flips", "#0 independent re-accounting",
            "#1 Poisson batch sizes: total"} <= names


def test_more_runs_than_declared_fail(tuned):
    root, _ = tuned
    out = copy_run(root, "extra-run")
    content = public(out)
    runs = content["tuning"]["runs"]
    content["tuning"] = {**content["tuning"], "runs": [*runs, {**runs[1], "index": 2}]}
    write_record(out, content)
    report = audit_run(out)
    assert "tuned runs within plan" in failing(report)
    assert "3 runs recorded, more than the 2 configurations declared" in " ".join(c.detail for c in report.checks)


def test_a_missing_run_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "missing-run")
    content = public(out)
    content["tuning"] = {**content["tuning"], "runs": content["tuning"]["runs"][:1],
                         "selection": {**content["tuning"]["selection"], "selected": 0}}
    content["phases"] = content["tuning"]["runs"][0]["phases"]
    write_record(out, content)
    assert "tuned runs within plan" in failing(audit_run(out))


def test_a_configuration_missing_from_the_ledger_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "missing-ledger")
    content = rechain(out, lambda es: [e for e in es if not str(e.get("phase", "")).startswith("c1/")
                                       and not (e.get("event") == "configuration" and e.get("index") == 1)])
    write_record(out, content)
    bad = failing(audit_run(out))
    assert {"configuration ledgers", "#1 steps within plan"} <= bad


def test_a_selection_without_its_noisy_release_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "no-selection")
    content = rechain(out, lambda es: [e for e in es if e.get("phase") != "selection"])
    write_record(out, content)
    report = audit_run(out)
    assert failing(report) == {"selection released"}


def test_a_selection_of_another_configuration_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "other-selection")
    content = public(out)
    sel = content["tuning"]["selection"]["selected"]
    other = 1 - sel
    content["tuning"] = {**content["tuning"], "selection": {**content["tuning"]["selection"], "selected": other}}
    content["phases"] = content["tuning"]["runs"][other]["phases"]
    write_record(out, content)
    assert "selection released" in failing(audit_run(out))


def test_a_cheaper_selection_in_the_record_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "cheap-selection")
    content = public(out)
    content["tuning"] = {**content["tuning"], "selection": {**content["tuning"]["selection"], "gumbel_scale": 1.0}}
    write_record(out, content)
    assert "selection released" in failing(audit_run(out))


def test_spending_outside_the_grid_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "outside")

    def extra(es):
        intent = next(e for e in es if e.get("phase") == "c0/dpsgd")
        return [*es[:-1], {**intent, "phase": "c2/dpsgd"}, es[-1]]

    write_record(out, rechain(out, extra))
    assert "configuration ledgers" in failing(audit_run(out))


def test_a_record_whose_phases_are_not_the_selected_ones_fails(tuned):
    root, _ = tuned
    out = copy_run(root, "phases")
    content = public(out)
    sel = content["tuning"]["selection"]["selected"]
    content["phases"] = content["tuning"]["runs"][1 - sel]["phases"]
    write_record(out, content)
    assert "tuned runs within plan" in failing(audit_run(out))


def test_interrupted_tuned_runs_are_judged_on_the_ledger(tuned):
    root, _ = tuned
    out = copy_run(root, "interrupted")
    (out / "run.json").unlink()
    (out / "model.pt").unlink()  # killed before the model and record were written
    report = audit_run(out)
    assert report.status == "interrupted" and report.failing() == ["run completed"], report.failing()
    over = copy_run(root, "interrupted-over")

    def more(es):
        intent = next(e for e in es if e.get("phase") == "c1/dpsgd")
        return [*es, dict(intent)]

    rechain(over, more)
    (over / "run.json").unlink()
    assert "configuration ledgers" in failing(audit_run(over))


def test_cli_audit_exit_codes(tuned, runner):
    root, _ = tuned
    ok = runner.invoke(cli, ["audit", str(root / "run"), "--json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["passed"] is True
    out = copy_run(root, "cli-no-selection")
    write_record(out, rechain(out, lambda es: [e for e in es if e.get("phase") != "selection"]))
    bad = runner.invoke(cli, ["audit", str(out)])
    assert bad.exit_code == 1 and "selection released" in bad.stderr


def _selected(root) -> int:
    return json.loads((root / "run" / "run.json").read_text())["tuning"]["selection"]["selected"]


def test_the_selected_configuration_carries_its_step_evidence(tuned):
    root, _ = tuned
    sel = _selected(root)
    report = audit_run(root / "run")
    evidence = [c for c in report.checks if c.name == f"#{sel} DP-SGD noise evidence"]
    assert len(evidence) == 1 and evidence[0].passed, evidence
    assert "drawn by rank 0 alone" in evidence[0].detail


def test_a_tuned_record_without_its_step_evidence_fails(tuned):
    import dataclasses

    from budgetplan.record.records import DPSGDStats, load_record

    root, _ = tuned
    out = copy_run(root, "no-evidence")
    record = load_record(out)
    phases = tuple(dataclasses.replace(p, evidence=None) if isinstance(p, DPSGDStats) else p
                   for p in record.private_part.phases)
    write_record(out, public(out), dataclasses.replace(record.private_part, phases=phases))
    check = next(c for c in audit_run(out).checks if c.name == f"#{_selected(root)} DP-SGD noise evidence")
    assert not check.passed and "keeps no per-step evidence" in check.detail


def test_noise_not_added_in_the_selected_configuration_fails(tmp_path, monkeypatch):
    """A trainer defect planted in every configuration: the draws are counted but all zero (no noise added).
    The record's claims match the plan; only the selected configuration's step evidence shows it."""
    from tests.trainers.mutants import NOISE_NOT_ADDED
    from tests.trainers.test_tune import FAST as settings
    from trainers.data.synth import synthesize
    from trainers.run import RunOptions, execute_plan

    NOISE_NOT_ADDED.install(monkeypatch)
    pq.write_table(synthesize(ROWS, 900, 4), tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(grid_scenario(GRID_2X1)))
    execute_plan(plan, tmp_path / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=settings, seed=3))
    sel = _selected(tmp_path)
    report = audit_run(tmp_path / "run")
    assert failing(report) == {f"#{sel} DP-SGD noise evidence"}, report.failing()
    detail = next(c.detail for c in report.checks if c.name == f"#{sel} DP-SGD noise evidence")
    assert "smallest step 0 against chi-square" in detail, detail
