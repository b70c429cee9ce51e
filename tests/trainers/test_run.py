"""Executing plans: the RR phase end to end, the run record, and every refusal."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.planning.planner import build_plan
from budgetplan.record.records import RunRecord, load_record
from budgetplan.scenario.model import parse_scenario
from trainers.baseline import BaselineSettings
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.demo import demo_scenario
from trainers.run import RunOptions, TrainSettings, execute_plan, run_baseline

FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=512)
ROWS, USERS = 6000, 1500


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    table = synthesize(ROWS, USERS, 5)
    pq.write_table(table.slice(0, 5000), root / "train.parquet")
    pq.write_table(table.slice(5000), root / "eval.parquet")
    return root, table.slice(0, 5000)


def rr_plan(n, *, eps=2.0, extra_privacy="", rr_extra=""):
    text = demo_scenario(epsilon=eps, dataset_size=n, spec=SYNTH_FEATURES, epochs=1)
    if n < 1024:  # an RR batch never exceeds N
        text = text.replace("batch_size = 1024", f"batch_size = {n}")
    if extra_privacy:
        text = text.replace('unit = "impression"', extra_privacy)
    if rr_extra:
        text = text.replace("batch_size = 1024", f"batch_size = 1024\n{rr_extra}")
    return build_plan(parse_scenario(text))


def test_rr_run_writes_a_complete_record(data, tmp_path):
    root, _ = data
    plan = rr_plan(5000)
    base = run_baseline(plan, root / "train.parquet", eval_path=root / "eval.parquet", settings=FAST,
                        baseline=BaselineSettings(max_epochs=1))
    rec = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet",
                                                                out_dir=tmp_path / "run", settings=FAST,
                                                                baseline_auc=base.metrics["eval"]["auc"]))
    assert (tmp_path / "run" / "run.json").exists() and (tmp_path / "run" / "model.pt").exists()
    again = load_record(tmp_path / "run")
    assert again == rec and again.sha256 == rec.sha256
    assert rec.plan_sha256 == plan.sha256 and rec.private
    assert rec.rows_used == 5000 and rec.private_part.data.rows_used == 5000
    fp = rec.private_part.data.fingerprint
    assert len(fp.hmac_sha256) == 64 and fp.rows == 5000
    phase = rec.phases[0]
    assert phase.labels == 5000 and 0 < phase.labels_flipped < 5000
    assert phase.flip_probability == plan.phases[0].params.flip_probability
    assert rec.seeds.policy == "csprng"
    ev = rec.metrics["eval"]
    assert 0 <= ev["auc"] <= 1 and "relative_auc_loss" in ev
    from importlib.metadata import version

    assert rec.versions["torch"] == version("torch")  # the torch that ran, whichever it is


def test_seeded_runs_are_reproducible(data):
    root, _ = data
    plan = rr_plan(5000)
    a = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST, seed=123))
    b = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST, seed=123))
    assert (a.seeds.policy, a.seeds.seed) == ("seeded", 123) and a.seeds == b.seeds
    assert a.phases[0].labels_flipped == b.phases[0].labels_flipped
    assert a.phases[0].epoch_loss == b.phases[0].epoch_loss


def test_user_level_capping_and_eps_over_k_i(data):
    root, table = data
    units = table.column("user_id").to_numpy()
    counts = np.unique(units, return_counts=True)[1]
    n_capped = int(np.minimum(counts, 2).sum())
    plan = rr_plan(n_capped, extra_privacy='unit = "user x time"\ncap = 2', rr_extra='per_impression = "eps/K_i"')
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST))
    data = rec.private_part.data
    assert data.rows_in == 5000 and data.rows_used == rec.rows_used == n_capped
    assert data.capping is not None and data.capping["rows_dropped"] == 5000 - n_capped
    phase, stats = rec.phases[0], rec.private_part.phases[0]
    # per-unit flip probabilities depend on the unit sizes: the flips are private under eps/K_i
    assert phase.per_impression_rule == "eps/K_i" and phase.flip_probability is None and phase.labels_flipped is None
    rho = plan.phases[0].params.flip_probability_by_count
    assert rho[0] < stats.flip_probability_mean < rho[1]  # units of one row flip less
    assert stats.labels_flipped > 0


def test_refuses_a_different_row_count_and_writes_nothing(data, tmp_path):
    root, _ = data
    with pytest.raises(InvalidParameterError, match="the data has 5000 rows; the plan accounts N = 5001"):
        execute_plan(rr_plan(5001), root / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST))
    assert not (tmp_path / "run").exists()


def test_refuses_labels_outside_0_1(data, tmp_path):
    root, table = data
    labels = table.column("label").to_numpy().copy()
    labels[17] = 2
    bad = table.set_column(table.column_names.index("label"), "label", pa.array(labels))
    pq.write_table(bad, tmp_path / "bad.parquet")
    with pytest.raises(InvalidParameterError, match="label"):
        execute_plan(rr_plan(5000), tmp_path / "bad.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST))
    assert not (tmp_path / "run").exists()


def test_data_count_gives_the_n_a_user_level_plan_trains_on(data, tmp_path, runner):
    from budgetplan.cli import cli

    root, table = data
    out = runner.invoke(cli, ["data", "count", str(root / "train.parquet"), "--unit-id", "user_id",
                              "--unit-cap", "3", "--unit-cap", "1", "--json"])
    assert out.exit_code == 0, out.output
    counted = json.loads(out.stdout)
    assert counted["rows"] == 5000 and [c["cap"] for c in counted["caps"]] == [1, 3]
    n3 = counted["caps"][1]["rows"]
    assert counted["caps"][0]["rows"] == counted["units"] == len(set(table.column("user_id").to_pylist()))
    assert counted["units"] < n3 < 5000
    rec = execute_plan(rr_plan(n3, extra_privacy='unit = "user"\ncap = 3'), root / "train.parquet",
                       RunOptions(settings=FAST))
    assert rec.rows_used == n3
    human = runner.invoke(cli, ["data", "count", str(root / "train.parquet"), "--unit-id", "user_id",
                                "--unit-cap", "3"])
    assert human.exit_code == 0 and f"{n3:,}" in human.stdout and "[data] dataset_size" in human.stdout
    bad = runner.invoke(cli, ["data", "count", str(root / "train.parquet"), "--unit-id", "uid", "--unit-cap", "3"])
    assert bad.exit_code == 2 and "no column 'uid'" in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_refuses_user_level_plan_without_unit_ids(data, tmp_path):
    root, table = data
    pq.write_table(table.drop(["user_id"]), tmp_path / "nouser.parquet")
    plan = rr_plan(5000, extra_privacy='unit = "user"\ncap = 3')
    with pytest.raises(InvalidParameterError):
        execute_plan(plan, tmp_path / "nouser.parquet", RunOptions(settings=FAST))


def test_refuses_a_plan_that_does_not_verify(data):
    import dataclasses

    root, _ = data
    plan = rr_plan(5000)
    phase = plan.phases[0]
    tampered = dataclasses.replace(plan, phases=(dataclasses.replace(
        phase, params=dataclasses.replace(phase.params, flip_probability=0.01)),))
    with pytest.raises(PlanMismatchError, match="does not verify"):
        execute_plan(tampered, root / "train.parquet", RunOptions(settings=FAST))


def test_refuses_an_existing_record(data, tmp_path):
    root, _ = data
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    with pytest.raises(InvalidParameterError, match="already holds a run record"):
        execute_plan(rr_plan(5000), root / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST))


def hybrid_plan(n, split, *, tower="frozen", extra_privacy=""):
    text = demo_scenario(epsilon=4.0, dataset_size=n, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', f'name = "hybrid"\nsplit = "{split}"\ntower = "{tower}"').replace("delta = 0.0", "delta = 1e-6")
    if extra_privacy:
        text = text.replace('unit = "impression"', extra_privacy)
    return build_plan(parse_scenario(text + "\n[dpsgd]\nbatch_size = 250\nepochs = 1\nclipping_norm = 1.0\n"))


@pytest.mark.parametrize("split, phases", [("alpha=0.5", ["rr", "dpsgd", "calibration"]),
                                           ("alpha=0", ["dpsgd", "calibration"]), ("alpha=1", ["rr"])])
def test_hybrid_family_runs_through_one_code_path(data, split, phases):
    root, _ = data
    plan = hybrid_plan(5000, split)
    rec = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", settings=FAST))
    assert [p.name for p in rec.phases] == phases
    if "dpsgd" in phases:
        dp = rec.phases[phases.index("dpsgd")]
        planned = plan.dpsgd.params
        assert dp.steps_executed == planned.steps == 20
        assert dp.noise_std == pytest.approx(planned.noise_multiplier * planned.clipping_norm)
        assert dp.model == "full"
        assert dp.nonsensitive_tower == ("frozen" if split == "alpha=0.5" else "trained")
    assert rec.model.final == ("truncated" if phases == ["rr"] else "full")
    assert 0 <= rec.metrics["eval"]["auc"] <= 1


def test_user_level_dpsgd_mixture_plan(data):
    root, table = data
    counts = np.unique(table.column("user_id").to_numpy(), return_counts=True)[1]
    n = int(np.minimum(counts, 3).sum())
    text = demo_scenario(epsilon=4.0, dataset_size=n, spec=SYNTH_FEATURES).replace(
        'name = "rr"', 'name = "dpsgd"').replace("delta = 0.0", "delta = 1e-6").replace(
        'adjacency = "replace-one"\nunit = "impression"', 'adjacency = "add-remove"\nunit = "user x time"\ncap = 3')
    text = text.replace("[rr]\nepochs = 3\nbatch_size = 1024\n",
                        "[dpsgd]\nbatch_size = 250\nepochs = 1\nclipping_norm = 1.0\n")
    plan = build_plan(parse_scenario(text))
    assert plan.phases[0].guarantee.method == "mixture-of-gaussians(pld)"
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST))
    assert rec.rows_used == n and rec.phases[0].steps_executed == plan.phases[0].params.steps


WALR_SCENARIO = """
[budget]
epsilon = 1.0
delta = 1e-6
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = 5000
[algorithm]
name = "walr"
[walr]
features = 5
row_norm_bound = 8.0
weights_bound = 1.0
[features]
label = "label"
nonsensitive_numeric = ["bid_floor", "slot_position"]
sensitive_numeric = ["days_since_visit", "visits_7d"]
"""


def test_walr_plan_runs(data):
    root, _ = data
    plan = build_plan(parse_scenario(WALR_SCENARIO))
    rec = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet"))
    ph, stats = rec.phases[0], rec.private_part.phases[0]
    assert ph.name == "walr" and ph.noise_draws == 5 and ph.rows == 5000 and ph.releases == 1
    assert ph.noise_std == plan.phases[0].params.noise_std
    assert stats.max_contribution <= plan.phases[0].params.sensitivity
    assert 0 <= rec.metrics["eval"]["auc"] <= 1


def test_record_tamper_is_detected(data, tmp_path):
    root, _ = data
    rec = execute_plan(rr_plan(5000), root / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST))
    path = tmp_path / "run" / "run.json"
    path.write_text(path.read_text().replace(f'"labels_flipped": {rec.phases[0].labels_flipped}',
                                             '"labels_flipped": 1'))
    with pytest.raises(PlanMismatchError, match="sha256 mismatch"):
        load_record(path)
    assert RunRecord.from_json(rec.to_json()) == rec


def test_cli_train_and_baseline(data, tmp_path, runner, allocator_calls):
    from budgetplan.cli import cli

    root, _ = data
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(rr_plan(5000).to_json())
    common = ["--data", str(root / "train.parquet"), "--eval", str(root / "eval.parquet"), "--embedding-dim", "4"]
    base = runner.invoke(cli, ["train", str(plan_path), *common, "--out", str(tmp_path / "base"), "--non-private"])
    assert base.exit_code == 0, base.output
    assert allocator_calls == [1]  # the command's process is its own: glibc's thresholds set for training
    out = runner.invoke(cli, ["train", str(plan_path), *common, "--out", str(tmp_path / "rr"), "--baseline",
                              str(tmp_path / "base" / "run.json"), "--json"])
    assert out.exit_code == 0, out.output
    rec = json.loads(out.stdout)
    assert rec["plan_sha256"] and "relative_auc_loss" in rec["private_record"]["metrics"]["eval"]
    assert "metrics" not in rec and "data" not in rec  # the public record holds no data statistics
    bad = runner.invoke(cli, ["train", str(plan_path), "--data", str(root / "eval.parquet"), "--out",
                              str(tmp_path / "x")])
    assert bad.exit_code == 2 and "the plan accounts N = 5000" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and not (tmp_path / "x").exists()


def test_cli_dpsgd_options_reach_the_dpsgd_phase(data, tmp_path, runner):
    from budgetplan.cli import cli

    root, _ = data
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(hybrid_plan(5000, "alpha=0").to_json())
    out = runner.invoke(cli, ["train", str(plan_path), "--data", str(root / "train.parquet"), "--embedding-dim", "4",
                              "--out", str(tmp_path / "run"), "--dpsgd-optimizer", "sgd", "--dpsgd-lr", "0.05",
                              "--dpsgd-schedule", "cosine", "--json"])
    assert out.exit_code == 0, out.output
    settings = json.loads(out.stdout)["phases"][0]["settings"]
    assert (settings["optimizer"], settings["lr"], settings["cosine_decay"]) == ("sgd", 0.05, True)
    auto = runner.invoke(cli, ["train", str(plan_path), "--data", str(root / "train.parquet"), "--embedding-dim", "4",
                               "--out", str(tmp_path / "auto"), "--json"])
    steps = json.loads(auto.stdout)["phases"][0]["steps_executed"]
    assert json.loads(auto.stdout)["phases"][0]["settings"]["lr"] == pytest.approx(0.12 / steps ** 0.5)  # the one used
    bad = runner.invoke(cli, ["train", str(plan_path), "--data", str(root / "train.parquet"), "--out",
                              str(tmp_path / "x"), "--dpsgd-lr", "nan"])
    assert bad.exit_code == 2 and "--dpsgd-lr" in bad.stderr and not (tmp_path / "x").exists()


def test_cli_demo_small(runner, tmp_path, allocator_calls):
    from budgetplan.cli import cli

    out = runner.invoke(cli, ["demo", "--rows", "6000", "--epsilon", "8", "--out", str(tmp_path / "demo"), "--json"])
    assert out.exit_code == 0, out.output
    assert allocator_calls == [1]
    result = json.loads(out.stdout)
    names = [r["name"] for r in result["runs"]]
    assert names == ["non-private", "non-private, non-sensitive only", "RR", "DP-SGD", "Hybrid"]
    from budgetplan.scenario.split_rules import DEFAULT_RULE

    assert result["split"]["rule"] == DEFAULT_RULE and result["split"]["reason"]
    hybrid = result["runs"][-1]
    assert set(hybrid["phases"]) == {"rr", "dpsgd", "calibration"} and hybrid["rr_heldout_auc"] is not None
    assert all(r["calibration_ratio"] is not None for r in result["runs"])
    for arm in ("rr", "dpsgd", "hybrid"):
        assert (tmp_path / "demo" / f"statement-{arm}.txt").exists() and (tmp_path / "demo" / f"run-{arm}").is_dir()
    human = runner.invoke(cli, ["demo", "--rows", "6000", "--epsilon", "8"])
    assert human.exit_code == 0 and "Hybrid's split" in human.stdout


def test_cli_demo_refuses_too_few_rows_for_a_held_out_conversion(runner, tmp_path, allocator_calls):
    from budgetplan.cli import cli
    from budgetplan.cli.train_cmds import MIN_DEMO_ROWS

    bad = runner.invoke(cli, ["demo", "--rows", str(MIN_DEMO_ROWS - 1), "--out", str(tmp_path / "d")])
    assert bad.exit_code == 2 and f"--rows must be at least {MIN_DEMO_ROWS:,}" in bad.stderr
    assert allocator_calls == []  # refused before anything is set
    assert bad.stderr.strip().count("\n") == 0 and not (tmp_path / "d").exists()


def test_vocabulary_encoding_trains_and_is_kept(data, tmp_path):
    import dataclasses

    root, _ = data
    settings = dataclasses.replace(FAST, nonsensitive_encoding="vocab", vocab_threshold=3)
    rec = execute_plan(rr_plan(5000), root / "train.parquet", RunOptions(eval_path=root / "eval.parquet",
                                                                         out_dir=tmp_path / "run", settings=settings))
    assert rec.private_part.encoding["nonsensitive"]["encoding"] == "vocab"
    assert "vocabulary" not in rec.private_part.encoding
    vocab = json.loads((tmp_path / "run" / "vocabulary.json").read_text())
    assert set(vocab) == set(SYNTH_FEATURES.nonsensitive_categorical)
    assert 0 <= rec.metrics["eval"]["auc"] <= 1


def test_vocabulary_is_refused_where_the_adjacency_protects_the_columns(data, tmp_path):
    """Plain DP-SGD protects whole examples: a vocabulary counted on any column would leak."""
    import dataclasses

    from budgetplan.errors import UnsupportedError

    root, _ = data
    plan = hybrid_plan(5000, "alpha=0")  # DP-SGD inside a semi-sensitive plan: non-sensitive columns fixed
    assert plan.nonsensitive_fixed
    text = demo_scenario(epsilon=4.0, dataset_size=5000, spec=SYNTH_FEATURES).replace(
        'name = "rr"', 'name = "dpsgd"').replace("delta = 0.0", "delta = 1e-6").replace(
        'adjacency = "replace-one"', 'adjacency = "add-remove"')
    text = text.replace("[rr]\nepochs = 3\nbatch_size = 1024\n",
                        "[dpsgd]\nbatch_size = 250\nepochs = 1\nclipping_norm = 1.0\n")
    full_dp = build_plan(parse_scenario(text))
    assert not full_dp.nonsensitive_fixed
    vocab = dataclasses.replace(FAST, nonsensitive_encoding="vocab")
    with pytest.raises(UnsupportedError, match="--encoding vocab.*add-remove"):
        execute_plan(full_dp, root / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=vocab))
    assert not (tmp_path / "run").exists()


def test_a_seeded_cuda_run_takes_deterministic_kernels_and_gives_the_mode_back(monkeypatch):
    # The context only sets torch's flags, so it is checked here without a GPU; the bitwise
    # reproduction it buys is tests/trainers/test_gpu.py's.
    import os

    import torch

    from trainers.inputs import reproducible_kernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    for device, seeded in [(torch.device("cpu"), True), (torch.device("cuda"), False)]:
        with reproducible_kernels(device, seeded=seeded):
            assert not torch.are_deterministic_algorithms_enabled()
    with reproducible_kernels(torch.device("cuda"), seeded=True):
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled()
    with pytest.raises(RuntimeError), reproducible_kernels(torch.device("cuda"), seeded=True):
        raise RuntimeError("a failing run")
    assert not torch.are_deterministic_algorithms_enabled()


def test_refuses_training_labels_of_one_class(data, tmp_path):
    root, table = data
    for value in (0, 1):
        one = table.set_column(table.column_names.index("label"), "label",
                               pa.array(np.full(table.num_rows, value), table.column("label").type))
        pq.write_table(one, tmp_path / "one.parquet")
        with pytest.raises(InvalidParameterError, match=f"label column 'label' holds the single value {value} "):
            execute_plan(rr_plan(5000), tmp_path / "one.parquet", RunOptions(out_dir=tmp_path / "run",
                                                                             settings=FAST))
        assert not (tmp_path / "run").exists()


def test_a_new_run_refuses_a_directory_of_other_files(data, tmp_path):
    root, _ = data
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(InvalidParameterError, match=r"--out .*run is not empty \(it holds 'notes.txt'\)"):
        execute_plan(rr_plan(5000), root / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["notes.txt"]


def _file_size_limit(limit):
    def apply():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_run_that_cannot_save_its_first_release_leaves_nothing(data, tmp_path):
    # `ulimit -f 4`: plan.json (3.8 kB) fits, rr_labels.npy (4.5 kB) cannot be written: the draw
    # never left the process, so the run leaves no plan.json, no one-intent ledger, no .lock
    import subprocess
    import sys

    root, _ = data
    (tmp_path / "plan.json").write_text(rr_plan(5000).to_json())
    run = subprocess.run([sys.executable, "-m", "budgetplan", "train", str(tmp_path / "plan.json"), "--data",
                          str(root / "train.parquet"), "--out", str(tmp_path / "run"), "--embedding-dim", "1"],
                         preexec_fn=_file_size_limit(4096), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert run.stderr.startswith("error: cannot write ") and "rr_labels.npy" in run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_a_clean_failure_after_the_release_keeps_the_evidence_and_no_lock(data, tmp_path):
    import subprocess
    import sys

    root, _ = data
    (tmp_path / "plan.json").write_text(rr_plan(5000).to_json())
    run = subprocess.run([sys.executable, "-m", "budgetplan", "train", str(tmp_path / "plan.json"), "--data",
                          str(root / "train.parquet"), "--out", str(tmp_path / "run"), "--embedding-dim", "1"],
                         preexec_fn=_file_size_limit(6000), capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert "model.pt" in run.stderr  # torch's RuntimeError for a short write is an output error
    left = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert "rr_labels.npy" in left and "ledger.jsonl" in left and ".lock" not in left and "run.json" not in left
