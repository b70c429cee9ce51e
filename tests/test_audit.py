"""The auditor fails closed: every check passes on an honest run, and each has a forgery that fails it.

A forger here knows the formats: records are edited and re-hashed, ledgers re-chained. Each
forgery names the check that must catch it, so disabling any check fails a test, and every
check the audit runs has at least one forgery (``test_every_check_has_a_forgery``).
"""

import json
import shutil

import pyarrow.parquet as pq
import pytest

from budgetplan.planning.planner import build_plan
from budgetplan.record.records import PrivateRecord, load_record
from budgetplan.scenario.model import parse_scenario
from tests.forgeries import (
    FORGERIES,
    copy_run,
    forge_non_private,
    forge_plan_edited,
    forge_seeds_note,
    forge_too_many_steps,
    public,
    rechain,
    rehash,
    write_raw_record,
    write_record,
)
from trainers import audit as audit_mod
from trainers.audit import audit_run
from trainers.demo import demo_scenario

N = 4000


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from trainers.data.synth import SYNTH_FEATURES, synthesize
    from trainers.run import RunOptions, TrainSettings, execute_plan

    root = tmp_path_factory.mktemp("audit")
    table = synthesize(N + 1000, 900, 3)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    text = demo_scenario(epsilon=4.0, dataset_size=N, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', 'name = "hybrid"\nsplit = "alpha=0.5"').replace("delta = 0.0", "delta = 1e-6")
    text += "\n[dpsgd]\nbatch_size = 100\nsteps = 60\nclipping_norm = 1.0\n"
    plan = build_plan(parse_scenario(text))
    execute_plan(plan, root / "train.parquet", RunOptions(out_dir=root / "run",
                                                          settings=TrainSettings(embedding_dim=4)))
    return root, plan


# What the check that fails each forgery must name (the six forged records of issue 26 among them).
NAMED = {
    "seeds csprng to seeded": "session 0 drew under policy 'csprng' with seed None; the record says 'seeded'",
    "replayed streams": "session 1 drew from the streams of session 0",
    "no seed note": "spent privacy before the ledger recorded where its draws came from",
    "private rows below N": f"the private record says {N - 1000} rows were used; the plan accounts N = {N}",
    "private rows_in below rows_used": f"rows_in ({N - 1000}) and rows_used ({N}) do not fit",
    "private plan replaced": f"the private record names plan {'0' * 64}",
    "model deleted": "model.pt is not here",
    "model replaced": "model.pt is not the model the record names",
    "model digest removed": "the record names no digest of model.pt",
    "rr labels deleted": "rr_labels.npy, the rr release the ledger recorded, is not here",
    "vocabulary edited": "vocabulary.json is not the vocabulary the record names",
    "vocabulary deleted": "the vocabulary the record names (sha256",
    "vocabulary digest removed": "vocabulary.json is here but the record names none",
    "vocabulary and digest removed": "the record names no vocabulary.json and none is here",
}


def check(report, name):
    matches = [c for c in report.checks if c.name == name]
    assert matches, f"no check named {name!r} in {[c.name for c in report.checks]}"
    return matches[0]


@pytest.fixture
def no_empirical(monkeypatch):
    """The code check runs with --empirical; the bounds themselves are tested elsewhere."""
    monkeypatch.setattr(audit_mod, "run_empirical", lambda plan, **_: [])


def test_an_honest_run_passes(runs, no_empirical):
    root, plan = runs
    report = audit_run(root / "run", data_path=root / "train.parquet", empirical=True)
    assert report.passed, [c for c in report.checks if not c.passed]
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True


@pytest.mark.parametrize("name, forge, failing", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_each_forgery_fails_its_check(runs, no_empirical, name, forge, failing):
    root, _ = runs
    out = copy_run(root, name.replace(" ", "-").replace(":", ""))
    forge(out)
    report = audit_run(out, empirical=True)
    assert not report.passed
    assert not check(report, failing).passed, report.to_dict()
    if name in NAMED:
        assert NAMED[name] in check(report, failing).detail, check(report, failing).detail


def test_every_check_has_a_forgery(runs, no_empirical):
    root, _ = runs
    honest = audit_run(root / "run", data_path=root / "train.parquet", empirical=True)
    # the intercept calibration's forgeries are in tests/trainers/test_calibration_run.py
    targeted = {f[2] for f in FORGERIES} | {"data fingerprint", "intercept calibration"}
    assert {c.name for c in honest.checks} <= targeted | {"Poisson batch sizes: total", "WALR release",
                                                          "independent re-accounting"}


def test_data_fingerprint_needs_the_same_data_and_key(runs, tmp_path):
    root, _ = runs
    other = pq.read_table(root / "train.parquet")
    pq.write_table(other.take(list(range(1, N)) + [0]), tmp_path / "shuffled.parquet")  # same rows, reordered
    report = audit_run(root / "run", data_path=tmp_path / "shuffled.parquet")
    assert not check(report, "data fingerprint").passed
    report = audit_run(root / "run", data_path=root / "train.parquet", fingerprint_key=b"k" * 32)
    assert not check(report, "data fingerprint").passed and "made with" in check(report, "data fingerprint").detail
    bare = copy_run(root, "no-private")
    shutil.rmtree(bare / "private")
    report = audit_run(bare, data_path=root / "train.parquet")
    assert not check(report, "data fingerprint").passed


def test_the_public_record_holds_no_data_statistics(runs):
    root, _ = runs
    text = (root / "run" / "run.json").read_text()
    for secret in ("clipped_fraction", "hmac_sha256", "rows_in", '"auc":', "train.parquet", '"encoding":',
                   "capping"):
        assert secret not in text, secret
    private = (root / "run" / "private" / "record.json").read_text()
    assert "clipped_fraction" in private and "hmac_sha256" in private
    key = (root / "run" / "private" / "fingerprint.key")
    assert key.stat().st_mode & 0o077 == 0 and len(key.read_bytes()) == 32


def test_an_edited_record_is_refused(runs):
    root, plan = runs
    out = copy_run(root, "edited")
    text = (out / "run.json").read_text().replace('"steps_executed": 60', '"steps_executed": 59')
    (out / "run.json").write_text(text)
    report = audit_run(out)
    assert not check(report, "record is well-formed").passed
    assert "sha256 mismatch" in check(report, "record is well-formed").detail


def test_an_interrupted_run_is_audited_on_its_ledger_and_certifies_nothing(runs, runner):
    from budgetplan.cli import cli

    root, plan = runs
    out = copy_run(root, "interrupted")
    (out / "run.json").unlink()
    (out / "model.pt").unlink()  # killed before the model and record were written
    report = audit_run(out)
    assert report.status == "interrupted" and not report.passed, report.to_dict()
    assert report.failing() == ["run completed"] and report.nothing_to_certify
    assert "60 of 60 noisy steps counted so far" in check(report, "steps within plan").detail
    assert check(report, "seed policy").passed and "(csprng)" in check(report, "seed policy").detail
    res = runner.invoke(cli, ["audit", str(out)])
    assert res.exit_code == 3 and "nothing to certify" in res.stderr


def test_a_deleted_record_beside_its_model_fails(runs, runner):
    """run.json deleted while model.pt stays: a model without a record is never certified (it once exited 0)."""
    from budgetplan.cli import cli

    root, _ = runs
    out = copy_run(root, "record-deleted")
    (out / "run.json").unlink()
    report = audit_run(out)
    assert report.failing() == ["run completed", "model file"] and not report.nothing_to_certify
    assert "model.pt is here but no record is" in check(report, "model file").detail
    res = runner.invoke(cli, ["audit", str(out)])
    assert res.exit_code == 1 and "run completed, model file" in res.stderr


def test_cli_audit_and_run_statement(runs, runner):
    from budgetplan.cli import cli

    root, plan = runs
    ok = runner.invoke(cli, ["audit", str(root / "run"), "--json"])
    assert ok.exit_code == 0, ok.output
    shown = json.loads(ok.stdout)
    assert shown["passed"] is True and shown["seeded"] is False
    # top-level epsilon and delta, like every JSON object the CLI prints: the plan's guarantee
    assert (shown["epsilon"], shown["delta"]) == (plan.guarantee.epsilon, plan.guarantee.delta)
    assert shown["adjacency"] == plan.adjacency.value
    out = copy_run(root, "cli-steps")
    forge_too_many_steps(out)
    bad = runner.invoke(cli, ["audit", str(out)])
    assert bad.exit_code == 1 and "steps within plan" in bad.stderr
    stmt = runner.invoke(cli, ["statement", str(root / "run" / "run.json")])
    assert stmt.exit_code == 0 and stmt.stdout.startswith("RUN STATEMENT")
    assert "DP-SGD took 60 of 60 planned noisy steps" in stmt.stdout
    assert "Held by the data owner" in stmt.stdout


def test_a_run_seeded_by_its_evidence_is_not_certified(runs, runner):
    """Ledger and record both re-written to say seeded agree, but the seed is public: not certifiable as private."""
    from budgetplan.cli import cli

    root, _ = runs
    out = copy_run(root, "seeded-everywhere")
    forge_seeds_note(out)
    report = audit_run(out)
    assert report.seeded and "not certifiable as private" in check(report, "seed policy").detail
    assert "not checked: that the run's draws are the ones this seed makes" in check(report, "seed policy").detail
    res = runner.invoke(cli, ["audit", str(out), "--json"])
    assert json.loads(res.stdout)["seeded"] is True
    table = runner.invoke(cli, ["audit", str(out)])
    assert "seeded: not certifiable as private" in " ".join(table.stdout.split())


def test_a_seeded_run_rewritten_to_csprng_is_a_stated_limit(runs):
    """Records are not signed: a seeded run whose ledger and record both say csprng again (re-chained, re-hashed)
    reads as a CSPRNG run. The audit cannot tell; its seed-policy text says what it could not check."""
    root, _ = runs
    honest = load_record(root / "run").seeds
    out = copy_run(root, "seeded-then-csprng")
    forge_seeds_note(out)  # the files of a seeded run, as far as the audit can tell
    assert audit_run(out).seeded

    def edit(entries):
        for e in entries:
            if e.get("event") == "seeds":
                e.update(policy="csprng", seed=None)
        return entries
    content = rechain(out, edit)
    content["seeds"] = {"policy": "csprng", "seed": None, "note": honest.note}
    write_record(out, content)
    report = audit_run(out)
    assert report.passed and not report.seeded, report.failing()
    detail = check(report, "seed policy").detail
    assert "records and ledgers are not signed" in detail and "rewritten to say csprng reads the same" in detail
    assert detail == check(audit_run(root / "run"), "seed policy").detail  # word for word an honest run's


def test_audit_of_a_missing_directory_says_so(runner, tmp_path):
    from budgetplan.cli import cli

    for target in (tmp_path / "nope", tmp_path / "nope" / "run.json"):
        res = runner.invoke(cli, ["audit", str(target)])
        assert res.exit_code == 2 and not res.stdout, res.output
        assert res.stderr.count("\n") == 1 and "does not exist" in res.stderr and "no plan given" not in res.stderr
        assert str(tmp_path / "nope") in res.stderr


def test_a_completed_run_leaves_no_checkpoint(runs):
    root, _ = runs
    assert (root / "run" / "run.json").exists() and not (root / "run" / "checkpoint.pt").exists()


def test_an_empirical_row_names_the_adjacency_of_each_epsilon():
    from budgetplan.cli.plan_cmds import empirical_detail

    row = {"name": "empirical dpsgd", "passed": True, "epsilon_lower_bound": 1.367, "planned_epsilon": 3.61,
           "compared": "add-remove epsilon of all 60 steps, PLD; one canary is one example",
           "phase_epsilon": 4.59991, "phase_adjacency": "replace-one", "failing": []}
    text = empirical_detail(row)
    assert text.startswith("lower bound 1.367 vs 3.61 (add-remove epsilon of all 60 steps")
    assert text.endswith("the plan's phase: 4.59991 (replace-one)")
    assert "phase" not in empirical_detail({**row, "phase_epsilon": 3.61})  # one number: said once


def test_a_statement_is_only_printed_for_the_plan_that_ran(runs, runner, tmp_path):
    from budgetplan.cli import cli

    root, plan = runs
    other = build_plan(parse_scenario(demo_scenario(epsilon=2.0, dataset_size=N, spec=plan.scenario.features)))
    (tmp_path / "other.json").write_text(other.to_json())
    wrong = runner.invoke(cli, ["statement", str(root / "run" / "run.json"), "--plan", str(tmp_path / "other.json")])
    assert wrong.exit_code == 1 and "names plan" in wrong.stderr and not wrong.stdout
    base = copy_run(root, "baseline-like")
    forge_non_private(base)
    nonpriv = runner.invoke(cli, ["statement", str(base / "run.json")])
    assert nonpriv.exit_code == 1 and "non-private" in nonpriv.stderr and not nonpriv.stdout


def test_a_statement_is_refused_for_a_plan_that_does_not_verify(runs, runner, tmp_path):
    from budgetplan.cli import cli

    root, _ = runs
    out = copy_run(root, "stmt-plan")
    forge_plan_edited(out)
    res = runner.invoke(cli, ["statement", str(out / "plan.json")])
    assert res.exit_code == 1 and "does not verify" in res.stderr and not res.stdout


def test_run_statement_lines_fit_88_columns(runs):
    from budgetplan.report.statement import render_run_statement

    root, plan = runs
    text = render_run_statement(plan, load_record(root / "run"))
    assert max(len(line) for line in text.splitlines()) <= 88


@pytest.mark.parametrize("edit, names", [
    (lambda ev: ev["noise_chi2"].pop(), "lists 60 steps of noise ranks, 60 of draws and 59 of sums of squares"),
    (lambda ev: ev.__setitem__("noise_draws", [-1] * 60), "evidence.noise_draws[0]"),
    (lambda ev: ev.__setitem__("units_split", 0), "evidence.unit_blocks and evidence.units_split go together"),
    (lambda ev: ev.__setitem__("note", "ok"), "unknown field 'note'"),
])
def test_malformed_evidence_does_not_read(runs, edit, names):
    """The private record's per-step evidence is read strictly: a malformed one is refused, naming the field."""
    from budgetplan.errors import PlanMismatchError

    root, _ = runs
    content = json.loads((root / "run" / "private" / "record.json").read_text())
    stats = next(p for p in content["phases"] if p["name"] == "dpsgd")
    assert len(stats["evidence"]["noise_ranks"]) == 60 and stats["evidence"]["noise_ranks"][0] == [0]
    edit(stats["evidence"])
    del content["sha256"]
    with pytest.raises(PlanMismatchError, match="does not match its schema") as refused:
        PrivateRecord.from_json(rehash(content))
    assert names in str(refused.value)


def test_a_record_of_schema_2_has_its_vocabulary_not_recorded(runs, no_empirical):
    """A record written before the vocabulary's digest was recorded (schema 2, no digest) still loads and
    passes: its vocabulary is reported as not recorded. A schema 2 record naming a digest is refused."""
    root, _ = runs
    out = copy_run(root, "schema-2")
    c = public(out)
    named = c["model"].pop("vocabulary_sha256")
    c["schema_version"] = 2
    write_record(out, c)
    report = audit_run(out)
    assert report.passed, report.failing()
    assert check(report, "vocabulary file").detail.startswith("not recorded: a record of schema 2")
    c["model"]["vocabulary_sha256"] = named
    write_raw_record(out, c)
    assert "model.vocabulary_sha256 is a field of schema 3" in check(audit_run(out), "record is well-formed").detail


def test_the_record_names_the_vocabulary_it_wrote(runs):
    import hashlib

    root, _ = runs
    record = load_record(root / "run")
    assert record.schema_version == 3
    assert record.model.vocabulary_sha256 == hashlib.sha256((root / "run" / "vocabulary.json").read_bytes()).hexdigest()


def test_canaries_are_not_scored_through_another_vocabulary(runs):
    """The canary audit encodes its canaries with the run's vocabulary.json: one the record does not name is
    refused (scores through it would query rows other than the ones the run trained)."""
    from budgetplan.errors import PlanMismatchError
    from trainers.canary import score_canaries

    root, plan = runs
    out = copy_run(root, "canary-vocabulary")
    (out / "vocabulary.json").write_text((out / "vocabulary.json").read_text().replace('"', '"x', 2))
    table = pq.read_table(root / "train.parquet").slice(0, 5)
    with pytest.raises(PlanMismatchError, match="is not the vocabulary the run record names"):
        score_canaries(out, table, plan.scenario.features, load_record(out))
