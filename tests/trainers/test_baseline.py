"""The non-private baseline: split by unit, early stopping to the best state, its record, the flag."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.record.records import BaselineRun, BaselineStats, load_record
from budgetplan.scenario.model import parse_scenario
from trainers import baseline as baseline_module
from trainers.baseline import BaselineSettings, compare, convergence_note, reference, train_baseline, validation_split
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.demo import demo_scenario
from trainers.fit import FitSettings, predict
from trainers.metrics import auc_standard_error, log_loss
from trainers.run import RunOptions, TrainSettings, execute_plan, run_baseline

SMALL = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=256,
                      nonsensitive_encoding="vocab")
ROWS = 4000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    table = synthesize(ROWS + 2000, 1200, 11)
    pq.write_table(table.slice(0, ROWS), root / "train.parquet")
    pq.write_table(table.slice(ROWS), root / "eval.parquet")
    # every row trains the RR model: at 4,000 rows a held-out tenth costs it more than early stopping gains
    text = demo_scenario(epsilon=2.0, dataset_size=ROWS, spec=SYNTH_FEATURES, epochs=1)
    plan = build_plan(parse_scenario(text.replace("batch_size = 1024", "batch_size = 1024\nvalidation_fraction = 0")))
    (root / "plan.json").write_text(plan.to_json())
    return root, plan, table.slice(0, ROWS)


# ------------------------------------------------------------------ the validation split


def test_the_split_keeps_every_unit_on_one_side():
    rng = np.random.default_rng(0)
    users = rng.integers(0, 5000, 40_000)
    table = pa.table({"user_id": users, "label": rng.integers(0, 2, users.size)})
    held, what, units = validation_split(table, "user_id", 0.2)
    assert what == "unit" and held.dtype == bool and held.size == users.size
    assert not set(users[held]) & set(users[~held])
    assert units == len(set(users[held]))
    assert units / len(set(users)) == pytest.approx(0.2, abs=0.02)  # 5000 units: sd of the share 0.006
    # Membership is a function of the id alone: not of row order, labels or the type of the column.
    order = rng.permutation(users.size)
    shuffled, _, _ = validation_split(table.take(order), "user_id", 0.2)
    assert np.array_equal(shuffled, held[order])
    as_text, _, _ = validation_split(pa.table({"user_id": users.astype(str)}), "user_id", 0.2)
    assert np.array_equal(as_text, held)
    # A larger fraction only adds units: the 10% split is inside the 20% one.
    smaller, _, _ = validation_split(table, "user_id", 0.1)
    assert not np.any(smaller & ~held) and smaller.sum() < held.sum()


def test_without_unit_ids_the_split_is_by_row():
    table = pa.table({"label": np.zeros(20_000, dtype=np.int64)})
    held, what, units = validation_split(table, None, 0.25)
    assert what == "row" and units is None
    assert held.mean() == pytest.approx(0.25, abs=0.015)
    assert np.array_equal(validation_split(table, None, 0.25)[0], held)


def test_a_split_with_an_empty_side_is_refused():
    table = pa.table({"user_id": [1, 1, 2, 2, 3]})
    with pytest.raises(InvalidParameterError, match=r"--validation-fraction 1e-09 puts no unit"):
        validation_split(table, "user_id", 1e-9)
    with pytest.raises(InvalidParameterError, match="puts every unit"):
        validation_split(table, "user_id", 1 - 1e-12)


@pytest.mark.parametrize("field, value, message", [
    ("validation_fraction", 0.0, "--validation-fraction"), ("validation_fraction", 1.0, "--validation-fraction"),
    ("validation_fraction", float("nan"), "--validation-fraction"), ("validation_fraction", 0.7, "at most 0.5"),
    ("patience", 0, "--patience"), ("max_epochs", 0, "--baseline-epochs"), ("max_epochs", 2.5, "--baseline-epochs"),
    ("weight_decay", -1e-3, "--weight-decay"), ("weight_decay", float("inf"), "--weight-decay"),
    ("weight_decay", 2.0, "at most 1"),
])
def test_bad_baseline_settings_are_refused(field, value, message):
    with pytest.raises(InvalidParameterError, match=message):
        BaselineSettings(**{field: value})


# ------------------------------------------------------------------ early stopping


def _encoded(data):
    from trainers.inputs import new_model, prepare_data, resolve_device

    root, plan, _ = data
    prep = prepare_data(root / "train.parquet", SYNTH_FEATURES, SMALL, resolve_device("cpu"), cap=1, capping=None,
                    expected_rows=None, randomness=None)
    held, _, _ = validation_split(prep.table, "user_id", 0.25)
    mask = torch.from_numpy(held)
    return prep.data.take(~mask), prep.data.take(mask), new_model(prep, SMALL, 5)


def test_early_stopping_stops_on_patience_and_keeps_the_best_state(data):
    """A big learning rate on 3000 rows overfits within a few epochs: validation loss turns up."""
    train, validation, model = _encoded(data)
    settings = BaselineSettings(max_epochs=40, patience=3, weight_decay=0.0)
    fit = FitSettings(epochs=settings.max_epochs, batch_size=128, lr=0.03, weight_decay=0.0)
    history = train_baseline(model, train, validation, fit, settings, truncated=False,
                             generator=torch.Generator().manual_seed(0))
    losses, best = history["validation_log_loss"], history["best"]
    assert history["stopped"] == "patience" and len(losses) < settings.max_epochs
    assert len(losses) == best + 1 + settings.patience  # stopped exactly `patience` checks after the best
    assert losses[best] == min(losses) and losses[-1] > losses[best]
    assert history["checked_at"] == [float(i + 1) for i in range(len(losses))]
    # The model left behind is the best one, not the last one trained.
    y = validation.label.numpy()
    now = log_loss(y, predict(model, validation, truncated=False))
    assert now == pytest.approx(losses[best], rel=1e-9) and now != pytest.approx(losses[-1], rel=1e-6)


def test_checks_within_epochs_and_a_run_to_max_epochs(data):
    train, validation, model = _encoded(data)
    batches = -(-len(train) // 256)
    settings = BaselineSettings(max_epochs=2, patience=50, check_every=batches // 2)
    fit = FitSettings(epochs=2, batch_size=256, weight_decay=settings.weight_decay)
    history = train_baseline(model, train, validation, fit, settings, truncated=True,
                             generator=torch.Generator().manual_seed(0))
    assert history["stopped"] == "max_epochs" and history["batches"] == 2 * batches
    checked = history["checked_at"]
    assert checked[-1] == 2.0 and all(0 < a < b for a, b in zip(checked, checked[1:]))
    assert len(checked) in (2 * batches // (batches // 2), 2 * batches // (batches // 2) + 1)


def _scripted(monkeypatch, losses):
    """Replace the validation scores by ``losses``, one per check, in order (the AUC is not read)."""
    scores = iter(losses)
    monkeypatch.setattr(baseline_module, "_scores", lambda *a: (next(scores), 0.5))


# A loss that falls, sits on a plateau for 4 checks, then falls again: what a model that learns an
# interaction of two high-cardinality columns late does (the module's BaselineSettings docstring).
PLATEAU = [0.30, 0.28, 0.27, 0.275, 0.272, 0.271, 0.2705, 0.25, 0.24, 0.245, 0.246, 0.247, 0.248, 0.249, 0.25]


def test_the_default_patience_waits_out_a_plateau_that_patience_2_stops_on(data, monkeypatch):
    train, validation, model = _encoded(data)
    fit = FitSettings(epochs=len(PLATEAU), batch_size=1024, weight_decay=0.0)
    kept = {}
    for patience in (2, BaselineSettings().patience):
        _scripted(monkeypatch, PLATEAU)
        settings = BaselineSettings(max_epochs=len(PLATEAU), patience=patience)
        kept[patience] = train_baseline(model, train, validation, fit, settings, truncated=True,
                                        generator=torch.Generator().manual_seed(0))
    assert kept[2]["best"] == 2 and len(kept[2]["checked_at"]) == 5  # stopped on the plateau
    default = kept[BaselineSettings().patience]
    assert default["best"] == 8 and default["stopped"] == "patience"  # past it, to the lower loss
    assert len(default["checked_at"]) == 9 + BaselineSettings().patience
    assert convergence_note(default, BaselineSettings()) is None


def test_a_baseline_that_runs_out_of_epochs_before_patience_is_noted(data, monkeypatch):
    train, validation, model = _encoded(data)
    settings = BaselineSettings(max_epochs=8, patience=5)
    _scripted(monkeypatch, PLATEAU)
    history = train_baseline(model, train, validation, FitSettings(epochs=8, batch_size=1024), settings,
                             truncated=True, generator=torch.Generator().manual_seed(0))
    assert history["stopped"] == "max_epochs" and history["best"] == 7
    note = convergence_note(history, settings)
    assert note.startswith("not converged:") and "all 8 epochs" in note and "check 8 of 8" in note
    assert "--baseline-epochs" in note and "--patience 5" in note
    # run out of patience exactly at the last epoch: it stopped on patience, nothing to note
    _scripted(monkeypatch, PLATEAU)
    settings = BaselineSettings(max_epochs=5, patience=2)
    history = train_baseline(model, train, validation, FitSettings(epochs=5, batch_size=1024), settings,
                             truncated=True, generator=torch.Generator().manual_seed(0))
    assert history["stopped"] == "patience" and convergence_note(history, settings) is None


# ------------------------------------------------------------------ the record and the flag


def test_the_curve_is_in_the_private_record_only(data, tmp_path):
    root, plan, table = data
    settings = BaselineSettings(max_epochs=3, patience=1, validation_fraction=0.2)
    rec = run_baseline(plan, root / "train.parquet", eval_path=root / "eval.parquet", out_dir=tmp_path / "base",
                       settings=SMALL, baseline=settings, seed=3)
    public, stats = rec.phases[0], rec.private_part.phases[0]
    assert isinstance(public, BaselineRun) and isinstance(stats, BaselineStats)
    assert (public.max_epochs, public.patience, public.validation_fraction) == (3, 1, 0.2)
    assert public.validation_split == "unit" and public.model == "full"
    checks = len(stats.checked_at)
    assert 1 <= checks <= 3 and len(stats.validation_auc) == len(stats.train_loss) == checks
    assert stats.validation_log_loss[stats.best] == min(stats.validation_log_loss)
    assert stats.train_rows + stats.validation_rows == ROWS
    users = table.column("user_id").to_numpy()
    held, _, units = validation_split(table, "user_id", 0.2)
    assert (stats.validation_rows, stats.validation_units) == (int(held.sum()), units)
    assert stats.validation_positives == int(table.column("label").to_numpy()[held].sum())
    assert len(set(users[held])) == units
    assert rec.training["baseline"]["weight_decay"] == settings.weight_decay
    assert rec.training["fit"]["weight_decay"] == settings.weight_decay
    public_json = (tmp_path / "base" / "run.json").read_text()
    assert "validation_log_loss" not in public_json and "validation_log_loss" in \
        (tmp_path / "base" / "private" / "record.json").read_text()
    assert load_record(tmp_path / "base", private=True) == rec


def test_reference_and_the_flag(data, tmp_path):
    root, plan, _ = data
    base = run_baseline(plan, root / "train.parquet", eval_path=root / "eval.parquet", settings=SMALL,
                        baseline=BaselineSettings(max_epochs=2), seed=1)
    ev = base.metrics["eval"]
    auc, tolerance = reference(base)
    assert auc == ev["auc"]
    assert tolerance == pytest.approx(2 * auc_standard_error(auc, ev["positives"], ev["n"] - ev["positives"]))
    # Within the tolerance: no flag; beyond it: flagged; a relative loss either way.
    metrics = {"auc": auc + 0.9 * tolerance}
    compare(metrics, auc, tolerance)
    assert metrics["beats_baseline"] is False and metrics["relative_auc_loss"] < 0
    metrics = {"auc": auc + 1.1 * tolerance}
    compare(metrics, auc, tolerance)
    assert metrics["beats_baseline"] is True and metrics["baseline_auc_tolerance"] == tolerance
    metrics = {"auc": None}
    compare(metrics, auc, tolerance)
    assert metrics["beats_baseline"] is False and metrics["relative_auc_loss"] is None
    # A DP run is not a ceiling.
    rr = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", settings=SMALL,
                                                               seed=2, baseline_auc=0.5, baseline_tolerance=0.001))
    assert rr.private_part.metrics["eval"]["beats_baseline"] is (rr.private_part.metrics["eval"]["auc"] > 0.501)
    with pytest.raises(InvalidParameterError, match="not a non-private baseline"):
        reference(rr)


# ------------------------------------------------------------------ the CLI


def _train(runner, root, out, *args):
    from budgetplan.cli import cli

    return runner.invoke(cli, ["train", str(root / "plan.json"), "--data", str(root / "train.parquet"), "--eval",
                               str(root / "eval.parquet"), "--out", str(out), "--embedding-dim", "4", *args])


def test_cli_baseline_options_reach_the_record(data, tmp_path, runner):
    root, _, _ = data
    out = _train(runner, root, tmp_path / "base", "--non-private", "--baseline-epochs", "2", "--patience", "1",
                 "--validation-fraction", "0.3", "--weight-decay", "0", "--hash-bins", "1024", "--truncated",
                 "--json")
    assert out.exit_code == 0, out.output
    rec = json.loads(out.stdout)
    assert rec["training"]["baseline"] == {"max_epochs": 2, "patience": 1, "validation_fraction": 0.3,
                                           "weight_decay": 0.0, "check_every": None}
    assert rec["training"]["fit"]["weight_decay"] == 0.0
    assert rec["training"]["hash_bins_nonsensitive"] == rec["training"]["hash_bins_sensitive"] == 1024
    assert rec["model"]["final"] == "truncated" and rec["phases"][0]["model"] == "truncated"
    stats = rec["private_record"]["phases"][0]
    assert 1 <= len(stats["checked_at"]) <= 2 and stats["validation_units"] > 0
    # two epochs cannot exhaust a patience of 1 unless the first was the best: the run says which
    unconverged = stats["stopped"] == "max_epochs"
    assert ("warning: not converged:" in out.stderr) == unconverged
    assert any(n.startswith("not converged:") for n in rec["notes"]) == unconverged


def test_cli_warns_when_the_baseline_runs_out_of_epochs(data, tmp_path, runner):
    root, _, _ = data
    out = _train(runner, root, tmp_path / "base", "--non-private", "--baseline-epochs", "1", "--hash-bins", "1024",
                 "--json")
    assert out.exit_code == 0, out.output
    rec = json.loads(out.stdout)
    assert rec["training"]["baseline"]["patience"] == BaselineSettings().patience  # the CLI's default is the library's
    assert "warning: not converged: the baseline ran all 1 epochs" in out.stderr
    assert [n for n in rec["notes"] if n.startswith("not converged:")]


@pytest.mark.parametrize("args, names", [
    (("--validation-fraction", "0"), "--validation-fraction"),
    (("--validation-fraction", "1"), "--validation-fraction"),
    (("--validation-fraction", "nan"), "--validation-fraction"),
    (("--validation-fraction", "0.9"), "--validation-fraction"),
    (("--patience", "0"), "--patience"),
    (("--baseline-epochs", "0"), "--baseline-epochs"),
    (("--weight-decay", "-1"), "--weight-decay"),
    (("--weight-decay", "inf"), "--weight-decay"),
    (("--hash-bins", "0"), "--hash-bins"),
])
def test_cli_bad_baseline_options(data, tmp_path, runner, args, names):
    root, _, _ = data
    out = _train(runner, root, tmp_path / "x", "--non-private", *args)
    assert out.exit_code == 2 and names in out.stderr, out.output
    assert out.stderr.strip().count("\n") == 0 and "Traceback" not in out.stderr
    assert not (tmp_path / "x").exists()


def test_cli_refuses_baseline_options_on_a_dp_run_and_a_baseline_that_is_no_ceiling(data, tmp_path, runner):
    root, _, _ = data
    for option in (("--patience", "3"), ("--truncated",), ("--weight-decay", "0")):
        out = _train(runner, root, tmp_path / "x", *option)
        assert out.exit_code == 2 and option[0] in out.stderr and "--non-private" in out.stderr, out.output
    base = _train(runner, root, tmp_path / "base", "--non-private", "--baseline-epochs", "1")
    assert base.exit_code == 0, base.output
    other = _train(runner, root, tmp_path / "x", "--hash-bins", "4096", "--baseline",
                   str(tmp_path / "base" / "run.json"))
    assert other.exit_code == 2 and "hash_bins_nonsensitive" in other.stderr and "same model" in other.stderr
    assert not (tmp_path / "x").exists()
    rr = _train(runner, root, tmp_path / "rr", "--baseline", str(tmp_path / "base" / "run.json"), "--json")
    assert rr.exit_code == 0, rr.output
    ev = json.loads(rr.stdout)["private_record"]["metrics"]["eval"]
    assert {"baseline_auc", "relative_auc_loss", "baseline_auc_tolerance", "beats_baseline"} <= set(ev)
    not_a_ceiling = _train(runner, root, tmp_path / "y", "--baseline", str(tmp_path / "rr" / "run.json"))
    assert not_a_ceiling.exit_code == 2 and "not a non-private baseline" in not_a_ceiling.stderr
    assert not_a_ceiling.stderr.strip().count("\n") == 0


def test_cli_warns_when_a_dp_run_beats_an_undertrained_baseline(data, tmp_path, runner):
    """Weight decay 1 pins every weight near 0: a ceiling at AUC 1/2 that an RR run must beat."""
    from budgetplan.cli import cli

    root, _, _ = data
    weak = _train(runner, root, tmp_path / "weak", "--non-private", "--baseline-epochs", "1", "--weight-decay", "1",
                  "--seed", "0")
    assert weak.exit_code == 0, weak.output
    assert "kept epoch" in weak.stdout and "stopped by" in weak.stdout
    # an RR plan that learns at 4,000 rows (10 epochs of 256 at epsilon 8), so beating AUC 1/2 is not luck
    text = demo_scenario(epsilon=8.0, dataset_size=ROWS, spec=SYNTH_FEATURES, epochs=10)
    plan = build_plan(parse_scenario(text.replace("batch_size = 1024", "batch_size = 256\nvalidation_fraction = 0")))
    (tmp_path / "rr-plan.json").write_text(plan.to_json())
    rr = runner.invoke(cli, ["train", str(tmp_path / "rr-plan.json"), "--data", str(root / "train.parquet"), "--eval",
                             str(root / "eval.parquet"), "--out", str(tmp_path / "rr"), "--embedding-dim", "4",
                             "--baseline", str(tmp_path / "weak" / "run.json"), "--seed", "0"])
    assert rr.exit_code == 0, rr.output
    ev = load_record(tmp_path / "rr", private=True).metrics["eval"]
    assert ev["beats_baseline"] is True and ev["auc"] - ev["baseline_auc"] > ev["baseline_auc_tolerance"] > 0
    assert "exceeds the baseline's" in rr.stderr and ev["relative_auc_loss"] < 0
