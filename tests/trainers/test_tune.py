"""Tuned runs: every configuration of a grid trained as planned, scored, one selected by noisy max."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from budgetplan.errors import UnsupportedError
from budgetplan.planning import grid
from budgetplan.planning.planner import build_plan
from budgetplan.record.ledger import read_ledger
from budgetplan.record.parts import LedgerHead
from budgetplan.record.records import DPSGDRun, RRRun, load_record
from budgetplan.scenario.model import parse_scenario
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.demo import demo_scenario
from trainers.randomness import Randomness
from trainers.run import RunOptions, TrainSettings, execute_plan
from trainers.tune import clipped_log_loss_sum, gumbel, noisy_max, split_units

FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=512)
ROWS = 3000


def grid_scenario(tuning: str, *, unit: str = 'unit = "impression"', n: int = ROWS) -> str:
    text = demo_scenario(epsilon=4.0, dataset_size=n, spec=SYNTH_FEATURES, epochs=1)
    text = text.replace('name = "rr"', 'name = "hybrid"').replace("delta = 0.0", "delta = 1e-6")
    text = text.replace('unit = "impression"', unit)
    return text + "\n[dpsgd]\nbatch_size = 150\nepochs = 1\nclipping_norm = 1.0\n\n[tuning]\n" + tuning


GRID_2X1 = 'split = ["alpha=0.25", "alpha=0.75"]\nclipping_norm = [2.0]\n'


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    table = synthesize(ROWS + 600, 900, 7)
    pq.write_table(table.slice(0, ROWS), root / "train.parquet")
    pq.write_table(table.slice(ROWS), root / "eval.parquet")
    return root


@pytest.fixture(scope="module")
def tuned(data, tmp_path_factory):
    plan = build_plan(parse_scenario(grid_scenario(GRID_2X1)))
    out = tmp_path_factory.mktemp("runs") / "run"
    record = execute_plan(plan, data / "train.parquet", RunOptions(eval_path=data / "eval.parquet", out_dir=out,
                                                                   settings=FAST))
    return plan, record, out


def test_every_configuration_trains_its_planned_phases(tuned):
    plan, record, _ = tuned
    runs = grid.runs_of(plan)
    assert len(record.tuning.runs) == len(runs) == record.tuning.configurations == 2
    for (c, phases), ran in zip(runs, record.tuning.runs):
        assert ran.index == c.index and [p.name for p in ran.phases] == [p.name for p in phases]
        rr, sgd = ran.phases
        assert isinstance(rr, RRRun) and isinstance(sgd, DPSGDRun)
        assert rr.flip_probability == phases[0].params.flip_probability
        assert sgd.steps_executed == sgd.steps_planned == phases[1].params.steps
        assert sgd.noise_multiplier == phases[1].params.noise_multiplier
        assert sgd.clipping_norm == 2.0 == phases[1].params.clipping_norm
        assert sgd.sampling_rate == phases[1].params.sampling_rate
    # alpha = 0.75 leaves DP-SGD a quarter of the run's epsilon: more noise than alpha = 0.25
    assert record.tuning.runs[1].phases[1].noise_multiplier > record.tuning.runs[0].phases[1].noise_multiplier


def test_training_and_validation_parts_are_disjoint_and_not_the_eval_file(tuned):
    _, record, _ = tuned
    t = record.private_part.metrics["tuning"]
    assert t["training_rows"] + t["validation_rows"] == ROWS
    assert 0 < t["validation_rows"] < ROWS
    for ran in record.tuning.runs:
        assert ran.phases[0].labels == t["training_rows"]  # RR randomised the training part only
    assert record.metrics["eval"]["rows"] == 600


def test_selection_is_the_noisy_max_and_its_model_is_kept(tuned):
    _, record, out = tuned
    private = record.private_part.metrics["tuning"]
    scores = [r["score"] for r in private["runs"]]
    noise = [r["gumbel_noise"] for r in private["runs"]]
    selected = record.tuning.selection.selected
    assert selected == noisy_max(scores, noise) == private["selected"]
    for r in private["runs"]:
        assert r["score"] == -r["validation_log_loss_sum"] and 0 < r["validation_log_loss"] <= math.log(1000)
    assert record.phases == record.tuning.runs[selected].phases
    assert record.tuning.selection.epsilon == pytest.approx(0.2)
    assert (out / "model.pt").exists()
    assert load_record(out) == record
    # scores and noise are statistics of private labels: not in the public record
    public = (out / "run.json").read_text()
    assert "gumbel_noise" not in public and "validation_log_loss" not in public


def test_ledger_covers_every_configuration_and_one_selection(tuned):
    plan, record, out = tuned
    view = read_ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)
    for (c, phases), ran in zip(grid.runs_of(plan), record.tuning.runs):
        assert view.count(f"c{c.index}/dpsgd") == phases[1].params.steps
        released = view.events("released", f"c{c.index}/rr")
        assert len(released) == 1 and released[0]["sha256"] == ran.phases[0].release_sha256
    assert [e["index"] for e in view.events("configuration")] == [0, 1]
    assert view.count("dpsgd") == 0 and view.count("rr") == 0
    assert view.count("selection") == 1
    (note,) = view.events("released", "selection")
    assert note["selected"] == record.tuning.selection.selected
    assert record.ledger == LedgerHead(head=view.head, lines=len(view.entries))


def test_a_tuned_run_is_not_resumed(data, tmp_path):
    plan = build_plan(parse_scenario(grid_scenario(GRID_2X1)))
    with pytest.raises(UnsupportedError, match="a tuned run cannot be resumed"):
        execute_plan(plan, data / "train.parquet", RunOptions(out_dir=tmp_path / "run", settings=FAST, resume=True))
    assert not (tmp_path / "run").exists()


def test_user_level_units_stay_in_one_part(data, tmp_path):
    table = pq.read_table(data / "train.parquet")
    counts = np.unique(table.column("user_id").to_numpy(), return_counts=True)[1]
    n = int(np.minimum(counts, 2).sum())
    plan = build_plan(parse_scenario(grid_scenario('clipping_norm = [1.0, 4.0]\n', n=n,
                                                   unit='unit = "user x time"\ncap = 2\nunit_accounting = "group"')))
    assert plan.tuning.noisy_max.sensitivity == pytest.approx(2 * math.log(1000))
    record = execute_plan(plan, data / "train.parquet", RunOptions(settings=FAST, seed=3))
    dpsgd = [next(p for p in r.phases if isinstance(p, DPSGDRun)) for r in record.tuning.runs]
    assert [p.clipping_norm for p in dpsgd] == [1.0, 4.0]


def test_split_units_keeps_each_unit_whole():
    units = np.repeat(np.arange(400), 3)
    held = split_units(units, 0.25, np.random.default_rng(0))
    assert all(len(set(held[units == u])) == 1 for u in range(400))
    assert 0.15 < held.mean() < 0.35


@given(st.lists(st.floats(0, 1), min_size=1, max_size=50), st.floats(1e-6, 0.49))
def test_each_clipped_loss_is_at_most_log_one_over_p(ps, clip):
    p = np.array(ps)
    for y in (0.0, 1.0):
        total = clipped_log_loss_sum(np.full(p.size, y), p, clip)
        assert 0 <= total <= p.size * math.log(1 / clip) * (1 + 1e-12)


def test_gumbel_noisy_max_is_the_exponential_mechanism():
    """argmax(u + Gumbel(b)) picks i with probability softmax(u / b): the exponential mechanism, eps = 2 Delta / b."""
    scores, scale, draws = [0.0, 1.0, 2.5], 1.5, 30000
    rnd = Randomness(11)
    counts = np.zeros(3)
    for _ in range(draws):
        counts[noisy_max(scores, gumbel(3, scale, rnd))] += 1
    want = np.exp(np.array(scores) / scale)
    want /= want.sum()
    assert stats.chisquare(counts, want * draws).pvalue > 1e-6
    # a mutant with the wrong scale is caught by the same test
    wrong = np.exp(np.array(scores) / (2 * scale))
    assert stats.chisquare(counts, wrong / wrong.sum() * draws).pvalue < 1e-6


def test_record_lists_configuration_metrics_privately(tuned):
    _, record, out = tuned
    private = json.loads((out / "private" / "record.json").read_text())
    runs = private["metrics"]["tuning"]["runs"]
    assert [r["index"] for r in runs] == [0, 1]
    assert all({"validation_log_loss", "score", "gumbel_noise", "noisy_score", "phases"} <= r.keys() for r in runs)
