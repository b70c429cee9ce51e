"""What the RR phase's held-out checks compare and score: the debiased AUC or log loss
(``TrainSettings.rr_select``), of the last weights and of their moving average
(``TrainSettings.rr_average``).

The held-out sets here are small (a few dozen positives), below the floor at which the debiased
AUC decides (``AUC_MIN_POSITIVES``), so the tests that exercise the AUC lower the floor; the
floor's own tests (named so) keep it.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from budgetplan.errors import InvalidParameterError
from tests.trainers.test_rr_validation import FAST, _plan, _Rows, data  # noqa: F401  (the module's data fixture)
from trainers.debiased import debiased_auc
from trainers.run import RunOptions, TrainSettings, execute_plan
from trainers.weight_average import WeightAverage

ONE = replace(FAST, rr_candidates=None, rr_select="log_loss", rr_average=None)  # one pair, the rule as it was


@pytest.fixture(autouse=True)
def _floor(request, monkeypatch):
    if "floor" not in request.node.name:
        monkeypatch.setattr("trainers.rr_validation.AUC_MIN_POSITIVES", 0.0)


# ---------------------------------------------------------------- the weight average


def test_the_average_is_the_exponential_moving_average_and_swapping_restores_the_weights():
    model = torch.nn.Linear(3, 1)
    start = [p.detach().clone() for p in model.parameters()]
    avg = WeightAverage(model, horizon=4.0)
    expected = [s.clone() for s in start]
    for step in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(float(step + 1))
        avg.update()
        expected = [e + (p.detach() - e) / 4.0 for e, p in zip(expected, model.parameters(), strict=True)]
    own = [p.detach().clone() for p in model.parameters()]
    with avg.swapped():
        for p, e in zip(model.parameters(), expected, strict=True):
            torch.testing.assert_close(p.detach(), e, rtol=1e-6, atol=1e-6)
    for p, o in zip(model.parameters(), own, strict=True):
        assert torch.equal(p.detach(), o)
    with pytest.raises(RuntimeError), avg.swapped():
        raise RuntimeError("the weights come back even when the block fails")
    assert all(torch.equal(p.detach(), o) for p, o in zip(model.parameters(), own, strict=True))
    with pytest.raises(ValueError, match="horizon"):
        WeightAverage(model, horizon=0.5)


# ---------------------------------------------------------------- the checks, on fixed predictions


class _Scaled(torch.nn.Module):
    """Truncated logits ``a * x + b`` for a per-row ``x`` read from ns_num; ``a``, ``b`` parameters."""

    def __init__(self, a: float, b: float):
        super().__init__()
        self.a, self.b = torch.nn.Parameter(torch.tensor(a)), torch.nn.Parameter(torch.tensor(b))

    def forward_truncated(self, ns_cat, ns_num):
        return self.a * ns_num[:, 0] + self.b


def _held_out(n=4000, rho=0.1, seed=0):
    """Rows whose true logit is ``x`` (base rate about 10%) and their RR labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(-2.5, 1.0, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-x))).astype(float)
    q = np.full(n, rho)
    noisy = np.where(rng.random(n) < q, 1 - y, y)
    return x, noisy, q


def _set(model, a, b):
    @contextlib.contextmanager
    def view():
        own = (model.a.item(), model.b.item())
        with torch.no_grad():
            model.a.fill_(a)
            model.b.fill_(b)
        try:
            yield
        finally:
            with torch.no_grad():
                model.a.fill_(own[0])
                model.b.fill_(own[1])
    return view


def _noisy_view(model, x, noise):
    """A view whose predictions rank worse: its logits read ``x + noise`` instead of ``x``."""
    @contextlib.contextmanager
    def view():
        rows = model.rows
        own = rows.ns_num.clone()
        rows.ns_num = torch.as_tensor(x + noise, dtype=torch.float32)[:, None]
        with torch.no_grad():
            a, b = model.a.item(), model.b.item()
            model.a.fill_(1.0)
            model.b.fill_(0.0)
        try:
            yield
        finally:
            rows.ns_num = own
            with torch.no_grad():
                model.a.fill_(a)
                model.b.fill_(b)
    return view


@pytest.mark.parametrize("by", ["auc", "log_loss"])
def test_the_auc_keeps_the_ranking_the_log_loss_keeps_the_calibration(by):
    """The last weights rank perfectly but are miscalibrated (logit 3x + 6); the other view is
    calibrated (logit x + noise) but ranks worse. By AUC the check keeps the first, by log loss
    the second, and the kept state is that view's."""
    from trainers.rr_validation import DebiasedStopping

    x, noisy, q = _held_out()
    noise = np.random.default_rng(1).normal(0, 1.5, x.size)
    model, rows = _Scaled(3.0, 6.0), _Rows(x)
    model.rows = rows
    stop = DebiasedStopping(model, rows, noisy, q, patience=3, by=by,
                            views=[("last", contextlib.nullcontext), ("average", _noisy_view(model, x, noise))])
    assert not stop(1.0, 0.0)
    p_last = 1 / (1 + np.exp(-(3 * x + 6)))
    p_avg = 1 / (1 + np.exp(-(x + noise)))
    auc_last, auc_avg = debiased_auc(p_last, noisy, q), debiased_auc(p_avg, noisy, q)
    assert auc_last > auc_avg
    assert stop.averaged == [by == "log_loss"]
    assert stop.auc[0] == pytest.approx(auc_last if by == "auc" else auc_avg, rel=1e-5)
    assert stop.best == 0 and stop.best_score() == pytest.approx(
        stop.auc[0] if by == "auc" else -stop.log_loss[0], rel=1e-12)
    assert stop._state["a"].item() == (3.0 if by == "auc" else 1.0)  # the kept state is the chosen view's


def test_patience_counts_checks_not_views():
    """Two views per check, neither improving after the first check: the stop comes after
    ``patience`` checks, whichever view scores better at each."""
    from trainers.rr_validation import DebiasedStopping

    x, noisy, q = _held_out()
    model, rows = _Scaled(1.0, 0.0), _Rows(x)
    model.rows = rows
    views = [("last", contextlib.nullcontext), ("average", _set(model, 0.5, -1.0))]
    stop = DebiasedStopping(model, rows, noisy, q, patience=3, by="auc", views=views)
    decisions = [stop(1.0 + k / 4, 0.0) for k in range(4)]
    assert decisions == [False, False, False, True] and stop.best == 0 and len(stop.checked_at) == 4


def test_auc_falls_back_to_the_log_loss_where_the_held_out_rows_cannot_estimate_it():
    from trainers.rr_validation import DebiasedStopping

    x, _, _ = _held_out(n=200)
    none_positive = np.zeros(200)  # B~ = 0 with rho = 0: no positive, no AUC
    stop = DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x), none_positive, np.zeros(200), patience=2, by="auc")
    assert stop.by == "log_loss"
    assert not stop(1.0, 0.0) and stop.best == 0 and stop.auc == [None]


def test_the_floor_on_held_out_positives_decides_whether_the_auc_is_used(monkeypatch):
    import trainers.rr_validation as rv

    x, noisy, q = _held_out(n=4000, rho=0.1)
    u = (noisy - q) / (1 - 2 * q)
    positives = float(np.dot(u, (1 - 2 * q) ** 2))
    assert 0 < positives < rv.AUC_MIN_POSITIVES  # a few hundred positives, flips discounted: below
    stop = rv.DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x), noisy, q, patience=2, by="auc")
    assert stop.by == "log_loss" and stop.positives == pytest.approx(positives, rel=1e-12)
    monkeypatch.setattr(rv, "AUC_MIN_POSITIVES", positives)
    assert rv.DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x), noisy, q, patience=2, by="auc").by == "auc"
    monkeypatch.setattr(rv, "AUC_MIN_POSITIVES", positives * (1 + 1e-9))
    assert rv.DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x), noisy, q, patience=2, by="auc").by == "log_loss"


# ---------------------------------------------------------------- several processes


def _rank(coll, x, noisy, q):
    import trainers.rr_validation as rv
    from trainers.rr_validation import DebiasedStopping

    rv.AUC_MIN_POSITIVES = 0.0  # a spawned rank does not see the test's patch (module docstring)
    block = coll.shard(len(x))
    stop = DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x[block]), noisy[block], q[block], patience=2, collective=coll,
                            by="auc")
    return stop.by, stop.positives, stop._scores()


def test_two_ranks_take_the_same_auc_and_the_same_score():
    from trainers.distributed import launch
    from trainers.rr_validation import DebiasedStopping

    x, noisy, q = _held_out(n=1001)
    one = DebiasedStopping(_Scaled(1.0, 0.0), _Rows(x), noisy, q, patience=2, by="auc")
    ranks = launch(_rank, 2, x, noisy, q, timeout_s=60)
    for by, positives, (loss, area) in ranks:
        assert by == "auc" and positives == pytest.approx(one.positives, rel=1e-9)
        assert loss == pytest.approx(one._scores()[0], rel=1e-6) and area == pytest.approx(one._scores()[1], rel=1e-6)


# ---------------------------------------------------------------- end to end


def test_averaged_checks_score_the_better_of_the_last_weights_and_the_average(data):  # noqa: F811
    """The average never changes training: each check's score with it is the better of the plain
    run's score at that check (the last weights) and the average's, and the kept state is the best."""
    root, _ = data
    plan = _plan(epochs=4)
    opts = dict(eval_path=root / "eval.parquet", seed=5, threads=1)
    plain = execute_plan(plan, root / "train.parquet",
                         RunOptions(settings=replace(ONE, rr_select="auc", rr_patience=99), **opts)).phases[0]
    both = execute_plan(plan, root / "train.parquet", RunOptions(
        settings=replace(ONE, rr_select="auc", rr_average=0.5, rr_patience=99), **opts)).phases[0]
    assert plain.validation_by == both.validation_by == "auc" and plain.validation_averaged is None
    assert both.validation_checks == plain.validation_checks and both.epoch_loss == plain.epoch_loss
    assert len(both.validation_averaged) == len(both.validation_checks)
    for mine, last, averaged in zip(both.validation_auc, plain.validation_auc, both.validation_averaged, strict=True):
        assert mine >= last if averaged else mine == last
    assert any(both.validation_averaged) and not all(both.validation_averaged)
    assert both.validation_kept == int(np.argmax(both.validation_auc))
    assert plain.validation_kept == int(np.argmax(plain.validation_auc))


def test_the_log_loss_with_one_view_is_the_rule_as_it_was(data):  # noqa: F811
    """rr_select="log_loss" without an average keeps the lowest held-out loss: the rule before either setting."""
    root, _ = data
    rr = execute_plan(_plan(epochs=3), root / "train.parquet",
                      RunOptions(settings=replace(ONE, rr_patience=99), seed=2, threads=1)).phases[0]
    assert rr.validation_by == "log_loss" and rr.validation_averaged is None
    assert rr.validation_kept == int(np.argmin(rr.validation_log_loss))


def test_pairs_are_chosen_by_the_checks_score_and_the_record_holds_both(data):  # noqa: F811
    from budgetplan.record.records import RRRun
    from budgetplan.report.statement import render_run_statement
    from budgetplan.util.typed import from_json_object, to_json_object

    root, _ = data
    plan = _plan(epochs=2)
    settings = replace(FAST, rr_candidates=((1e-3, 0.0), (1e-3, 5.0)), rr_select="auc", rr_average=0.5)
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=settings, seed=5, threads=1))
    rr = rec.phases[0]
    assert rr.validation_by == "auc" and len(rr.candidate_auc) == 2
    assert rr.candidate_chosen == int(np.argmax([-1 if a is None else a for a in rr.candidate_auc]))
    assert rr.validation_auc[rr.validation_kept] == rr.candidate_auc[rr.candidate_chosen]
    assert from_json_object(RRRun, to_json_object(rr), "rr") == rr
    text = " ".join(render_run_statement(plan, rec).split())
    assert "the highest debiased held-out AUC" in text
    averaged = rr.validation_averaged[rr.validation_kept]
    assert ("the moving average of the weights after" if averaged else "the state after") in text
    for change, name in (({"validation_by": "brier"}, "validation_by"),
                         ({"validation_averaged": (True,) * (len(rr.validation_checks) + 1)}, "validation_averaged"),
                         ({"validation_averaged": (1,) * len(rr.validation_checks)}, "validation_averaged"),
                         ({"candidate_auc": (0.6,)}, "candidate_auc")):
        with pytest.raises(InvalidParameterError, match=name):
            replace(rr, **change)
    old = {k: v for k, v in to_json_object(rr).items() if k not in ("validation_by", "validation_averaged",
                                                                       "candidate_auc")}
    assert from_json_object(RRRun, old, "rr").validation_by is None  # records made before these fields still read


@pytest.mark.parametrize("change", [{"rr_select": "brier"}, {"rr_select": None}, {"rr_average": 0.0},
                                    {"rr_average": float("nan")}, {"rr_average": float("inf")},
                                    {"rr_average": 1e9}])
def test_bad_selection_settings_are_refused_naming_the_setting(change):
    with pytest.raises(InvalidParameterError, match=next(iter(change))):
        TrainSettings(**change)


def test_the_cli_options_reach_the_rr_phase_and_are_refused_where_nothing_reads_them(data, tmp_path, runner):  # noqa: F811
    import json

    from budgetplan.cli import cli

    root, _ = data
    plan_path, bare = tmp_path / "plan.json", tmp_path / "bare.json"
    plan_path.write_text(_plan(epochs=1).to_json())
    bare.write_text(_plan(epochs=1, rr_extra="validation_fraction = 0").to_json())
    common = ["--data", str(root / "train.parquet"), "--embedding-dim", "4", "--seed", "1"]
    out = runner.invoke(cli, ["train", str(plan_path), *common, "--out", str(tmp_path / "a"), "--rr-select", "auc",
                              "--rr-average", "0.5", "--json"])
    assert out.exit_code == 0, out.output
    rr = json.loads(out.stdout)["phases"][0]
    assert rr["validation_by"] == "auc" and len(rr["validation_averaged"]) == len(rr["validation_checks"])
    out = runner.invoke(cli, ["train", str(plan_path), *common, "--out", str(tmp_path / "b"), "--rr-select",
                              "log_loss", "--rr-average", "none", "--json"])
    assert out.exit_code == 0, out.output
    rr = json.loads(out.stdout)["phases"][0]
    assert rr["validation_by"] == "log_loss" and "validation_averaged" not in rr
    for args, where, name in (((bare, "--rr-select", "auc"), "held-out units", "--rr-select"),
                              ((plan_path, "--rr-average", "nan"), "rr-average", "--rr-average"),
                              ((plan_path, "--rr-average", "0"), "rr-average", "--rr-average"),
                              ((plan_path, "--rr-select", "brier"), "brier", "--rr-select")):
        bad = runner.invoke(cli, ["train", str(args[0]), *common, "--out", str(tmp_path / "x"), *args[1:]])
        assert bad.exit_code == 2 and name in bad.stderr and where in bad.stderr, bad.stderr
        assert bad.stderr.strip().count("\n") == 0 and not (tmp_path / "x").exists()


def test_the_cli_defaults_are_the_trainers():
    from budgetplan.cli.train_cmds import train

    defaults = TrainSettings()
    shown = {p.name: getattr(p, "show_default", None) for p in train.params}
    assert shown["rr_select"] == defaults.rr_select and shown["rr_average"] == str(defaults.rr_average).lower()
