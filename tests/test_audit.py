"""The auditor: every check passes on an honest run and names itself when it fails."""

import json

import pyarrow.parquet as pq
import pytest

from budgetplan.audit import audit_run
from budgetplan.demo import demo_scenario
from budgetplan.planner import build_plan
from budgetplan.records import RunRecord, load_record
from budgetplan.scenario import parse_scenario

N = 4000


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from trainers.data.synth import SYNTH_FEATURES, synthesize
    from trainers.run import TrainSettings, execute_plan

    root = tmp_path_factory.mktemp("audit")
    table = synthesize(N + 1000, 900, 3)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    text = demo_scenario(epsilon=4.0, dataset_size=N, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', 'name = "hybrid"\nsplit = "alpha=0.5"').replace("delta = 0.0", "delta = 1e-6")
    text += "\n[dpsgd]\nbatch_size = 100\nsteps = 60\nclipping_norm = 1.0\n"
    plan = build_plan(parse_scenario(text))
    execute_plan(plan, root / "train.parquet", out_dir=root / "run", settings=TrainSettings(embedding_dim=4))
    return root, plan


def forge(root, name, edit):
    """A record edited and re-hashed, as a forger who knows the format would."""
    rec = load_record(root / "run")
    content = rec.content()
    edit(content)
    out = root / name
    out.mkdir(exist_ok=True)
    (out / "plan.json").write_text((root / "run" / "plan.json").read_text())
    forged = RunRecord(**{k: v for k, v in content.items()})
    (out / "run.json").write_text(forged.to_json())
    return out


def test_an_honest_run_passes(runs):
    root, plan = runs
    report = audit_run(root / "run", data_path=root / "train.parquet")
    assert report.passed, [c for c in report.checks if not c.passed]
    names = [c.name for c in report.checks]
    for needed in ("plan verifies", "record names the plan and its data", "steps within plan",
                   "Poisson batch sizes: total", "Poisson batch sizes: spread", "RR flips",
                   "independent re-accounting"):
        assert needed in names
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True


def check(report, name):
    return next(c for c in report.checks if c.name == name)


def test_too_many_steps_fail(runs):
    root, _ = runs

    def edit(c):
        c["phases"][1]["steps_executed"] = 61
    report = audit_run(forge(root, "steps", edit))
    assert not report.passed and not check(report, "steps within plan").passed
    assert "more than the 60 planned" in check(report, "steps within plan").detail


def test_fixed_size_batches_fail_the_spread_test(runs):
    root, _ = runs

    def edit(c):
        ph = c["phases"][1]
        t = ph["steps_this_session"]
        ph["batch_size_sum"], ph["batch_size_sumsq"] = 100 * t, 100 * 100 * t  # every batch exactly 100
    report = audit_run(forge(root, "fixed", edit))
    assert not check(report, "Poisson batch sizes: spread").passed


def test_labels_flipped_too_rarely_fail(runs):
    root, _ = runs

    def edit(c):
        c["phases"][0]["labels_flipped"] //= 2
    report = audit_run(forge(root, "flips", edit))
    assert not check(report, "RR flips").passed


def test_record_of_another_plan_or_data_fails(runs, tmp_path):
    root, plan = runs

    def edit(c):
        c["plan_sha256"] = "0" * 64
    report = audit_run(forge(root, "other", edit))
    assert not check(report, "record names the plan and its data").passed
    other = pq.read_table(root / "train.parquet")
    pq.write_table(other.take(list(range(1, N)) + [0]), tmp_path / "shuffled.parquet")  # same rows, reordered
    report = audit_run(root / "run", data_path=tmp_path / "shuffled.parquet")
    assert not check(report, "record names the plan and its data").passed


def test_an_edited_record_is_refused(runs):
    from budgetplan.errors import PlanMismatchError

    root, _ = runs
    text = (root / "run" / "run.json").read_text().replace('"steps_executed": 60', '"steps_executed": 59')
    bad = root / "edited"
    bad.mkdir(exist_ok=True)
    (bad / "run.json").write_text(text)
    with pytest.raises(PlanMismatchError, match="sha256 mismatch"):
        audit_run(bad / "run.json", root / "run" / "plan.json")


def test_cli_audit_and_run_statement(runs, runner):
    from budgetplan.cli import cli

    root, _ = runs
    ok = runner.invoke(cli, ["audit", str(root / "run"), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["passed"] is True
    bad = runner.invoke(cli, ["audit", str(root / "steps")])
    assert bad.exit_code == 1 and "steps within plan" in bad.stderr
    stmt = runner.invoke(cli, ["statement", str(root / "run" / "run.json")])
    assert stmt.exit_code == 0 and stmt.stdout.startswith("RUN STATEMENT")
    assert "DP-SGD took 60 of 60 planned noisy steps" in stmt.stdout


def test_empirical_audit_runs_the_real_mechanisms(runs):
    root, plan = runs
    report = audit_run(root / "run", empirical=True)
    by = {e["name"]: e for e in report.empirical}
    assert set(by) == {"empirical rr", "empirical dpsgd"}
    rr = by["empirical rr"]
    assert rr["passed"] and rr["tight"] and rr["epsilon_lower_bound"] <= rr["planned_epsilon"]
    dp = by["empirical dpsgd"]
    assert dp["passed"] and 0 <= dp["epsilon_lower_bound"] <= dp["planned_epsilon"]
    assert report.passed
