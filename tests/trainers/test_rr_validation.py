"""The RR phase's free validation: held-out units scored on their RR labels, the best state kept.

What must hold: the held-out rows are the units the keyed split names (never chosen from
labels); nothing after the release reads a true label (poisoned labels change nothing);
the kept state is the one with the lowest debiased validation loss and the phase stops
``patience`` checks after it; ``validation_fraction = 0`` trains exactly the plan's epochs;
several processes pool the held-out scores into the one-process numbers.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from trainers.baseline import validation_split
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.run import RunOptions, TrainSettings, execute_plan

FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=256, rr_checks_per_epoch=2,
                     rr_patience=2)
N = 6000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rrval")
    table = synthesize(N + 2000, 2000, 11)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    pq.write_table(table.slice(N), root / "eval.parquet")
    return root, table.slice(0, N)


def _plan(*, split="alpha=1", epochs=6, rr_extra="", eps=3.0):
    return build_plan(parse_scenario(f"""
[budget]
epsilon = {eps}
delta = "0.1/N"
[privacy]
adjacency = "replace-one"
[data]
dataset_size = {N}
[algorithm]
name = "hybrid"
split = "{split}"
[rr]
epochs = {epochs}
batch_size = 256
{rr_extra}
[dpsgd]
batch_size = 1000
epochs = 1
clipping_norm = 5.0
[calibration]  # off: the kept state is compared before any shift
share = 0
{SYNTH_FEATURES.to_toml()}"""))


class _Recording:
    """Wraps DebiasedStopping to keep the instance a run made."""

    made: list = []

    def __init__(self, original):
        self.original = original

    def __call__(self, *args, **kwargs):
        inst = self.original(*args, **kwargs)
        _Recording.made.append(inst)
        return inst


def test_a_plan_holds_out_a_tenth_of_the_units_by_default():
    plan = _plan()
    assert plan.rr.params.validation_fraction == 0.1
    assert "validation_fraction = 0.1" not in plan.scenario.to_dict()  # the scenario dict holds it as a number
    assert plan.scenario.rr.validation_fraction == 0.1
    assert _plan(rr_extra="validation_fraction = 0").rr.params.validation_fraction is None


def test_held_out_rows_are_the_keyed_split_and_the_best_state_is_kept(data, monkeypatch):
    import trainers.rr_validation as rv

    root, table = data
    _Recording.made = []
    monkeypatch.setattr(rv, "DebiasedStopping", _Recording(rv.DebiasedStopping))
    rec = execute_plan(_plan(), root / "train.parquet", RunOptions(settings=FAST, seed=3, threads=1))
    rr = rec.phases[0]
    held, what, _ = validation_split(table, "user_id", 0.1)
    assert what == "unit" and rr.validation_rows == int(held.sum()) and rr.labels == N
    losses = [x for x in rr.validation_log_loss]
    assert all(x is not None for x in losses)
    assert rr.validation_kept == int(np.argmin(losses))
    if rr.stopped == "patience":
        assert len(losses) - 1 - rr.validation_kept == FAST.rr_patience
    else:
        assert rr.stopped == "epochs" and rr.validation_checks[-1] == pytest.approx(6.0)
    stopping = _Recording.made[-1]
    assert stopping._scores()[0] == pytest.approx(losses[rr.validation_kept], rel=1e-12)  # the kept state is in
    assert len(stopping.validation) == int(held.sum())
    assert all(a is None or 0 <= a <= 1.2 for a in rr.validation_auc)


def test_nothing_after_the_release_reads_a_true_label(data, monkeypatch):
    """Poison every true label once the RR release is drawn: an RR run must come out the same."""
    import trainers.distributed as dist
    import trainers.rr_phase as rrp

    root, _ = data
    plan = _plan()
    clean = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", settings=FAST,
                                                                  seed=9, threads=1))
    original_phase, original_release = rrp.run_rr_phase, dist.release_once
    seen = {}

    def phase(model, data, *args, **kwargs):
        seen["data"] = data
        return original_phase(model, data, *args, **kwargs)

    def release(*args, **kwargs):
        out = original_release(*args, **kwargs)
        seen["data"].label.fill_(float("nan"))  # any later read of a true label now shows
        return out

    monkeypatch.setattr(rrp, "run_rr_phase", phase)
    monkeypatch.setattr(dist, "release_once", release)
    poisoned = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", settings=FAST,
                                                                     seed=9, threads=1))
    assert torch.isnan(seen["data"].label).all()
    a, b = clean.phases[0], poisoned.phases[0]
    assert a.validation_log_loss == b.validation_log_loss and a.validation_auc == b.validation_auc
    assert a.epoch_loss == b.epoch_loss and a.release_sha256 == b.release_sha256
    assert clean.metrics["eval"] == poisoned.metrics["eval"]


def test_without_validation_the_plans_epochs_are_trained_exactly(data):
    root, _ = data
    rec = execute_plan(_plan(epochs=2, rr_extra="validation_fraction = 0"), root / "train.parquet",
                       RunOptions(settings=FAST, seed=3, threads=1))
    rr = rec.phases[0]
    assert rr.validation_rows is None and rr.stopped is None
    assert rr.batches == 2 * int(np.ceil(N / 256)) and len(rr.epoch_loss) == 2


def test_a_hybrid_run_starts_its_dpsgd_phase_from_the_kept_rr_state(data):
    root, _ = data
    rec = execute_plan(_plan(split="alpha=0.5"), root / "train.parquet", RunOptions(settings=FAST, seed=4, threads=1))
    rr, dpsgd = rec.phases[0], rec.phases[1]
    assert rr.validation_rows and rr.validation_kept is not None
    assert dpsgd.name == "dpsgd" and dpsgd.steps_executed == dpsgd.steps_planned


# ---------------------------------------------------------------- several processes


def _pooled_rank(coll, scores, noisy, rho):
    from trainers.rr_validation import DebiasedStopping

    block = coll.shard(len(scores))
    stopping = _stopping(DebiasedStopping, scores[block], noisy[block], rho[block], coll)
    return stopping._scores()


class _Fixed(torch.nn.Module):
    """A 'model' whose truncated predictions are given logits (one per row, read from ns_num)."""

    def forward_truncated(self, ns_cat, ns_num):
        return ns_num[:, 0]


class _Rows:
    def __init__(self, logits):
        self.ns_num = torch.as_tensor(logits, dtype=torch.float32)[:, None]
        self.ns_cat = torch.zeros(len(logits), 0, dtype=torch.long)
        self.label = torch.zeros(len(logits))

    def __len__(self):
        return self.ns_num.shape[0]


def _stopping(cls, logits, noisy, rho, coll):
    return cls(_Fixed(), _Rows(logits), noisy, rho, patience=2, collective=coll)


def test_two_ranks_pool_the_held_out_scores_into_the_one_process_numbers():
    from trainers.distributed import launch
    from trainers.rr_validation import DebiasedStopping

    rng = np.random.default_rng(0)
    logits = rng.normal(-2, 1, 501)
    noisy = (rng.random(501) < 0.2).astype(float)
    rho = np.full(501, 0.1)
    one = _stopping(DebiasedStopping, logits, noisy, rho, None)._scores()
    ranks = launch(_pooled_rank, 2, logits, noisy, rho, timeout_s=60)
    assert ranks[0][0] == pytest.approx(one[0], rel=1e-6) and ranks[1][0] == pytest.approx(one[0], rel=1e-6)
    assert ranks[0][1] == pytest.approx(one[1], rel=1e-6) and ranks[1][1] is None


def test_the_statements_say_what_the_held_out_units_decided(data):
    from budgetplan.report.statement import render_run_statement, render_statement

    root, _ = data
    plan = _plan()
    assert "scores itself on those held-out units' randomised labels" in " ".join(render_statement(plan).split())
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST, seed=3, threads=1))
    text = " ".join(render_run_statement(plan, rec).split())
    rr = rec.phases[0]
    assert f"on {rr.validation_rows} held-out rows" in text and "was kept (debiased held-out AUC" in text
    off = _plan(rr_extra="validation_fraction = 0")
    assert "held-out" not in render_statement(off)


# ---------------------------------------------------------------- (learning rate, L2) pairs

COLLAPSES = 5.0  # an L2 this strong drives the model to a constant: its held-out loss is the worst


@pytest.mark.parametrize("order", [((1e-3, 0.0), (1e-3, COLLAPSES)), ((1e-3, COLLAPSES), (1e-3, 0.0))])
def test_the_held_out_units_choose_the_pair_and_keep_its_model(data, order):
    """The pair with the lower debiased held-out loss is kept, whichever comes first, and the model
    is exactly what that pair alone trains (same start, same row order)."""
    from dataclasses import replace

    root, _ = data
    plan = _plan(epochs=2)
    opts = dict(eval_path=root / "eval.parquet", seed=5, threads=1)
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=replace(FAST, rr_candidates=order), **opts))
    rr = rec.phases[0]
    good = [i for i, (_, decay) in enumerate(order) if decay == 0.0][0]
    assert rr.candidate_chosen == good
    assert rr.candidate_lr == tuple(r for r, _ in order) and rr.candidate_weight_decay == tuple(d for _, d in order)
    assert rr.candidate_log_loss[good] == min(rr.candidate_log_loss)
    assert rr.validation_log_loss[rr.validation_kept] == rr.candidate_log_loss[good]
    alone = execute_plan(plan, root / "train.parquet",
                         RunOptions(settings=replace(FAST, rr_candidates=None, lr=1e-3, rr_weight_decay=0.0), **opts))
    assert alone.phases[0].candidate_chosen is None
    assert alone.phases[0].validation_log_loss == rr.validation_log_loss
    assert alone.metrics["eval"]["auc"] == rec.metrics["eval"]["auc"]


def test_without_held_out_units_the_phase_trains_lr_and_rr_weight_decay(data):
    from dataclasses import replace

    root, _ = data
    plan, opts = _plan(epochs=1, rr_extra="validation_fraction = 0"), dict(seed=3, threads=1)
    pairs = execute_plan(plan, root / "train.parquet", RunOptions(
        settings=replace(FAST, lr=2e-3, rr_candidates=((1e-3, 0.0), (1e-3, COLLAPSES))), **opts))
    alone = execute_plan(plan, root / "train.parquet", RunOptions(settings=replace(FAST, lr=2e-3, rr_candidates=None),
                                                                  **opts))
    rr = pairs.phases[0]
    assert rr.candidate_chosen is None and rr.candidate_lr is None and rr.batches == int(np.ceil(N / 256))
    assert rr.epoch_loss == alone.phases[0].epoch_loss


@pytest.mark.parametrize("bad", [(), ((1e-3,),), ((0.0, 0.0),), ((1e-3, -1.0),), ((float("nan"), 0.0),)])
def test_bad_pairs_are_refused_naming_the_setting(bad):
    from budgetplan.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match="rr_candidates"):
        TrainSettings(rr_candidates=bad)


def test_a_record_refuses_candidate_fields_that_do_not_fit(data):
    from dataclasses import replace

    from budgetplan.errors import InvalidParameterError
    from budgetplan.record.records import RRRun
    from budgetplan.util.typed import from_json_object, to_json_object

    root, _ = data
    rec = execute_plan(_plan(epochs=1), root / "train.parquet", RunOptions(settings=FAST, seed=3, threads=1))
    rr = rec.phases[0]
    assert rr.candidate_chosen is not None  # the default trains two pairs
    assert from_json_object(RRRun, to_json_object(rr), "rr") == rr
    for change in ({"candidate_chosen": 2}, {"candidate_lr": (1e-3,)}, {"candidate_log_loss": None}):
        with pytest.raises(InvalidParameterError, match="candidate"):
            replace(rr, **change)


def test_a_phase_that_stops_itself_trains_the_same_under_a_larger_cap(data):
    """What the frontier's carrying of cells across a change of ``[rr] epochs`` rests on: the cap
    only ends a phase that has not stopped, so a Hybrid run whose RR phase stopped at its held-out
    units before the smaller cap trains the same, RR and DP-SGD phases, under a larger one."""
    root, _ = data
    opts = RunOptions(eval_path=root / "eval.parquet", settings=FAST, seed=5, threads=1)
    short, long = (execute_plan(_plan(split="alpha=0.5", epochs=e), root / "train.parquet", opts) for e in (6, 12))
    a, b = short.phases[0], long.phases[0]
    assert a.stopped == b.stopped == "patience" and a.validation_checks[-1] < 6
    assert a.validation_checks == b.validation_checks and a.validation_log_loss == b.validation_log_loss
    assert a.epoch_loss == b.epoch_loss and a.validation_kept == b.validation_kept
    assert short.phases[1].steps_executed == long.phases[1].steps_executed
    assert short.metrics["eval"] == long.metrics["eval"]
    assert short.plan_sha256 != long.plan_sha256  # two plans, one training
