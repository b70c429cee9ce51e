"""The one-run audit of a trained model: canaries in the data, one training run, the test in the record.

The mutant tests train the audit plan (``trainers.canary.audit_scenario``) with fixed seeds:
honest, the guesses do not refute the plan's trade-off curve and ``budgetplan audit``
passes; with per-example clipping off (``mutants.CLIPPING_OFF``) or the DP-SGD noise halved
(``mutants.NOISE_HALVED``, at 20,000 canaries under SGD, where benchmarks/one_run_audit.py
caught it in every seed) they do, and ``budgetplan audit`` fails on it.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from budgetplan.audit import audit_run
from budgetplan.cli import cli
from budgetplan.errors import UnsupportedError
from budgetplan.planning.planner import build_plan
from budgetplan.record.records import load_record
from budgetplan.scenario.model import parse_scenario
from budgetplan.util.typed import to_json
from tests.trainers.mutants import CLIPPING_OFF, NOISE_HALVED
from trainers.canary import CANARY_DATA, audit_scenario, canary_audit, insert_canaries
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.dpsgd import DPSGDSettings
from trainers.randomness import Randomness
from trainers.run import RunOptions, TrainSettings

# The audit's setting (measured in benchmarks/one_run_audit.py): FM model, hashed columns
# with room for every canary's values, the plan at epsilon 2 with C small against a canary's
# gradient, so that both of its labels' gradients are clipped (replace-one sensitivity 2C).
ROWS, CANARIES = 20_000, 5_000
EPSILON, DELTA, BATCH, EPOCHS, CLIP = 2.0, 1e-8, 10_000, 5, 0.1
SETTINGS = TrainSettings(model="fm", embedding_dim=4, nonsensitive_encoding="hash", hash_bins_nonsensitive=2**20,
                         hash_bins_sensitive=2**20)


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("canary")
    pq.write_table(synthesize(ROWS, ROWS // 5, 1), root / "train.parquet")
    plan = build_plan(parse_scenario(audit_scenario(epsilon=EPSILON, delta=DELTA, dataset_size=ROWS, batch_size=BATCH,
                                                    epochs=EPOCHS, clipping_norm=CLIP, spec=SYNTH_FEATURES)))
    (root / "plan.json").write_text(plan.to_json())
    return root, plan


def audited(root, plan, name):
    return canary_audit(plan, root / "train.parquet", RunOptions(out_dir=root / name, settings=SETTINGS,
                                                                  dpsgd_settings=DPSGDSettings(), seed=11, threads=2),
                        canaries=CANARIES, canary_randomness=Randomness(12))


def test_canaries_replace_rows_and_keep_the_rest():
    table = synthesize(3000, 600, 2)
    out, positions, bits = insert_canaries(table, SYNTH_FEATURES, 500, randomness=Randomness(3))
    assert out.num_rows == 3000 and positions.size == 500 and np.unique(positions).size == 500
    assert set(np.unique(bits)) == {0, 1} and 200 < bits.sum() < 300
    keep = np.setdiff1d(np.arange(3000), positions)
    for name in SYNTH_FEATURES.sensitive_categorical + SYNTH_FEATURES.nonsensitive_categorical:
        canary_values = out.column(name).take(positions).to_pylist()
        assert len(set(canary_values)) == 500  # a value of its own for each canary...
        assert not set(canary_values) & set(table.column(name).cast(pa.string()).to_pylist())  # ...no real row has
        assert out.column(name).take(keep).to_pylist() == table.column(name).cast(pa.string()).take(keep).to_pylist()
    assert out.column("label").take(positions).to_pylist() == bits.tolist()
    assert out.column("label").take(keep).equals(table.column("label").take(keep))
    assert out.column("user_id").equals(table.column("user_id"))  # every unit keeps its size: capping keeps N


def test_canary_values_take_hashed_rows_no_real_value_or_other_canary_holds():
    from budgetplan.errors import InvalidParameterError
    from trainers.data.encode import hash_value

    table = synthesize(3000, 600, 2)
    bins = {"sensitive": 4096, "nonsensitive": 8192}  # small: without the choice, collisions are certain
    out, positions, _ = insert_canaries(table, SYNTH_FEATURES, 500, randomness=Randomness(3), hash_bins=bins)
    for group, names in (("sensitive", SYNTH_FEATURES.sensitive_categorical),
                         ("nonsensitive", SYNTH_FEATURES.nonsensitive_categorical)):
        real = {hash_value(n, v, bins[group]) for n in names for v in table.column(n).cast(pa.string()).to_pylist()}
        rows = [hash_value(n, v, bins[group]) for n in names for v in out.column(n).take(positions).to_pylist()]
        assert len(set(rows)) == len(rows) == 500 * len(names) and not set(rows) & real
    # the same data and seed without the choice collide (the test can fail)
    plain, _, _ = insert_canaries(table, SYNTH_FEATURES, 500, randomness=Randomness(3))
    names = SYNTH_FEATURES.sensitive_categorical
    rows = [hash_value(n, v, 4096) for n in names for v in plain.column(n).take(positions).to_pylist()]
    assert len(set(rows)) < len(rows)
    with pytest.raises(InvalidParameterError, match="hash bins of at least"):
        insert_canaries(table, SYNTH_FEATURES, 500, randomness=Randomness(3), hash_bins={"sensitive": 2048})


def test_honest_run_stays_below_the_plan_and_passes_the_audit(setting):
    root, plan = setting
    rec = audited(root, plan, "honest")
    one = rec.private_part.one_run
    assert one["canaries"] == CANARIES and one["planned_epsilon"] == plan.guarantee.epsilon
    assert not one["refutes_plan"] and one["noise_divisor"] < 1
    assert 0 <= one["epsilon_lower_bound"] < plan.guarantee.epsilon
    assert load_record(root / "honest") == rec and (root / "honest" / CANARY_DATA).exists()
    assert any("canaries" in n for n in rec.notes)
    report = audit_run(root / "honest")
    by = {c.name: c for c in report.checks}
    assert report.passed, report.failing()
    assert by["one-run canary audit"].passed
    # the scores are how far training moved each canary's logit from the kept initial model
    import torch

    from budgetplan.record.records import PRIVATE_DIR
    from trainers.canary import score_canaries
    from trainers.data.encode import encode
    from trainers.fit import model_logits
    from trainers.models import build_model
    from trainers.run import INITIAL_MODEL

    data_table = pq.read_table(root / "honest" / CANARY_DATA)
    col = data_table.column(SYNTH_FEATURES.sensitive_categorical[0]).to_pylist()
    canaries = data_table.take([i for i, v in enumerate(col) if ":canary-" in v])
    encoded, _ = encode(canaries, SYNTH_FEATURES, nonsensitive_encoding="hash", hash_bins_nonsensitive=2**20,
                        hash_bins_sensitive=2**20)

    def logits(path):
        model = build_model(rec.model.kind, to_json(rec.model.config))
        model.load_state_dict(torch.load(path, weights_only=True))
        model.eval()
        with torch.no_grad():
            return model_logits(model, encoded, torch.arange(len(encoded)), False).double().numpy()

    moved = logits(root / "honest" / "model.pt") - logits(root / "honest" / PRIVATE_DIR / INITIAL_MODEL)
    assert np.allclose(score_canaries(root / "honest", canaries, SYNTH_FEATURES, rec), moved)
    assert np.abs(moved).max() > 0


def test_clipping_off_is_caught_by_the_audit_of_the_model(setting, monkeypatch):
    root, plan = setting
    CLIPPING_OFF.install(monkeypatch)
    rec = audited(root, plan, "mutant")
    monkeypatch.undo()
    one = rec.private_part.one_run
    assert one["refutes_plan"] and one["epsilon_lower_bound"] > plan.guarantee.epsilon, one
    # the record's own numbers are the plan's (the defect is in the code): only the canaries see it
    result = CliRunner().invoke(cli, ["audit", str(root / "mutant"), "--json"])
    out = json.loads(result.stdout)
    assert result.exit_code == 1 and out["failing"] == ["one-run canary audit"], out["failing"]


def test_noise_halved_is_caught_by_the_audit_of_the_model(tmp_path, monkeypatch):
    # The setting where benchmarks/one_run_audit.py caught it in every seed: 20,000 canaries
    # (80,000 rows), SGD in the DP-SGD phase, the plan at epsilon 4 (noise divisors 1.09-1.24
    # for the mutant, 0.52-0.66 honest).
    rows, canaries = 80_000, 20_000
    pq.write_table(synthesize(rows, rows // 5, 1), tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=DELTA, dataset_size=rows, batch_size=rows // 2,
                                                    epochs=EPOCHS, clipping_norm=CLIP, spec=SYNTH_FEATURES)))
    NOISE_HALVED.install(monkeypatch)
    rec = canary_audit(plan, tmp_path / "train.parquet",
                       RunOptions(out_dir=tmp_path / "halved", settings=SETTINGS,
                                  dpsgd_settings=DPSGDSettings(optimizer="sgd", lr=1.0), seed=11, threads=2),
                       canaries=canaries, canary_randomness=Randomness(12))
    monkeypatch.undo()
    one = rec.private_part.one_run
    assert one["refutes_plan"] and one["noise_divisor"] > 1 and one["epsilon_lower_bound"] > 4.0, one
    report = audit_run(tmp_path / "halved")
    assert not report.passed and report.failing() == ["one-run canary audit"], report.failing()


def test_the_shipped_example_is_the_audit_scenario():
    from budgetplan.scenario import examples, load_scenario

    shipped = build_plan(load_scenario(examples.path("one-run-audit")))
    made = build_plan(parse_scenario(audit_scenario(epsilon=4.0, delta=DELTA, dataset_size=80_000, batch_size=40_000,
                                                    epochs=EPOCHS, clipping_norm=CLIP, spec=SYNTH_FEATURES)))
    assert shipped.phases == made.phases and shipped.guarantee == made.guarantee


def test_add_remove_and_walr_plans_are_refused(tmp_path):
    text = audit_scenario(epsilon=2.0, delta=1e-6, dataset_size=1000, batch_size=100, epochs=1, clipping_norm=1.0,
                          spec=SYNTH_FEATURES).replace('name = "hybrid"\nsplit = "alpha=0"\ntower = "fine-tune"',
                                                       'name = "dpsgd"').replace("replace-one", "add-remove")
    plan = build_plan(parse_scenario(text))
    with pytest.raises(UnsupportedError, match="replace-one"):
        canary_audit(plan, tmp_path / "x.parquet", RunOptions(out_dir=tmp_path / "run"), canaries=10)
    assert not (tmp_path / "run").exists()


def test_train_cli_records_the_bound_and_refuses_misuse(tmp_path):
    pq.write_table(synthesize(3000, 600, 4), tmp_path / "train.parquet")
    plan = build_plan(parse_scenario(audit_scenario(epsilon=EPSILON, delta=DELTA, dataset_size=3000, batch_size=1500,
                                                    epochs=2, clipping_norm=CLIP, spec=SYNTH_FEATURES)))
    (tmp_path / "plan.json").write_text(plan.to_json())
    base = ["train", str(tmp_path / "plan.json"), "--data", str(tmp_path / "train.parquet")]
    runner = CliRunner()
    result = runner.invoke(cli, base + ["--out", str(tmp_path / "run"), "--canaries", "300", "--model", "fm",
                                        "--encoding", "hash", "--hash-bins", str(2**18), "--json"])
    assert result.exit_code == 0, result.output
    one = json.loads(result.stdout)["private_record"]["one_run"]
    assert one["canaries"] == 300 and one["confidence"] == 0.95 and one["epsilon_lower_bound"] < EPSILON
    audited = runner.invoke(cli, ["audit", str(tmp_path / "run"), "--one-run", "--json"])
    assert audited.exit_code == 0, audited.output
    (row,) = json.loads(audited.stdout)["empirical"]
    assert row["name"] == "one-run dpsgd" and row["passed"] and row["canaries"] == 1_000_000
    stated = runner.invoke(cli, ["statement", str(tmp_path / "run")])
    assert stated.exit_code == 0 and "One-run audit (arXiv:2410.22235): 300 rows were replaced" in " ".join(
        stated.output.split())
    refused = runner.invoke(cli, base + ["--out", str(tmp_path / "r2"), "--canary-confidence", "0.9"])
    assert refused.exit_code == 2 and "--canaries" in refused.output
    too_many = runner.invoke(cli, base + ["--out", str(tmp_path / "r3"), "--canaries", "5000"])
    assert too_many.exit_code == 2 and "at most the data's 3000 rows" in too_many.output
    assert len(too_many.output.strip().splitlines()) == 1 and not (tmp_path / "r3").exists()
