"""PrivateStep: a plan's DP-SGD phase in a user's own loop, on the built-in trainer's step object.

The README example runs as written and its record passes ``budgetplan audit``; the step is the
built-in engine (a seeded run equals ``run_dpsgd``'s model bit for bit, and a planted halved
noise in the shared engine shows in PrivateStep's updates); every refusal comes before anything
is written, or, past the plan's T steps, before anything is spent.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.planning.planner import build_plan
from budgetplan.scenario.model import parse_scenario
from tests.trainers.mutants import NOISE_HALVED
from tests.trainers.test_dpsgd import tiny_data, tiny_model
from trainers.dpsgd import DPSGDSettings, run_dpsgd
from trainers.losses import bce
from trainers.private import PrivateStep
from trainers.randomness import Randomness

SCENARIO = """name = "own-loop"
[budget]
epsilon = 4.0
delta = 1e-6
[privacy]
adjacency = "add-remove"
unit = "impression"
[data]
dataset_size = {n}
[algorithm]
name = "{algorithm}"
{extra}
[dpsgd]
batch_size = {batch}
epochs = {epochs}
clipping_norm = 1.0
[calibration]
share = 0
"""


def dpsgd_plan(n=2000, batch=100, epochs=2, algorithm="dpsgd", extra=""):
    return build_plan(parse_scenario(SCENARIO.format(n=n, batch=batch, epochs=epochs, algorithm=algorithm,
                                                     extra=extra)))


# The README's example, run exactly as printed there.
README_EXAMPLE = '''
import torch
from torch import nn

from budgetplan.plan import load_plan
from trainers.private import PrivateStep


class Ranker(nn.Module):
    """Ids and numbers in, one logit out: an Embedding, Linears, a LayerNorm and a raw gain."""

    def __init__(self, vocab=1000, dim=16):
        super().__init__()
        self.ids = nn.Embedding(vocab, dim)
        self.num = nn.Linear(4, dim)
        self.norm = nn.LayerNorm(dim)
        self.gain = nn.Parameter(torch.ones(dim))
        self.out = nn.Linear(dim, 1)

    def forward(self, ids, num):
        h = self.norm(self.ids(ids).mean(1) + self.num(num)) * self.gain
        return self.out(torch.relu(h)).squeeze(-1)


plan = load_plan("plan.json")             # a DP-SGD plan for N = 2,000 rows
ids = torch.randint(0, 1000, (2000, 3))   # your data: one row per example
num = torch.randn(2000, 4)
y = (num[:, 0] > 0).float()

model = Ranker()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
loss = nn.BCEWithLogitsLoss(reduction="none")  # one loss per example
step = PrivateStep(model, plan, loss_fn=loss, optimizer=opt, run_dir="runs/own-loop")
for batch in step.batches(ids, num, y):   # Poisson at the plan's q, the plan's T steps
    step(batch)                           # clip to C, sum, noise once, / q N, opt.step()
step.finish()                             # then: budgetplan audit runs/own-loop
'''


def test_the_readme_example_runs_and_its_record_passes_the_audit(tmp_path, monkeypatch, runner):
    plan = dpsgd_plan()
    (tmp_path / "plan.json").write_text(plan.to_json())
    monkeypatch.chdir(tmp_path)
    exec(compile(README_EXAMPLE, "README example", "exec"), {"__name__": "readme_example"})  # noqa: S102
    audited = runner.invoke(cli, ["audit", "runs/own-loop", "--json"])
    report = json.loads(audited.stdout)
    assert audited.exit_code == 0 and report["passed"], report["failing"]
    names = {c["name"] for c in report["checks"]}
    assert {"steps within plan", "DP-SGD noise", "ledger", "independent re-accounting"} <= names
    run = json.loads((tmp_path / "runs/own-loop/run.json").read_text())
    assert run["phases"][0]["steps_executed"] == plan.dpsgd.params.steps == 40
    assert (tmp_path / "runs/own-loop/model.pt").exists()


# --------------------------------------------------------------- one engine


def encoded_plan(n=200):
    return dpsgd_plan(n=n, batch=10, epochs=1)


def test_a_seeded_step_equals_the_built_in_trainer_bit_for_bit(tmp_path):
    plan = encoded_plan()
    data = tiny_data(200)
    built_in = tiny_model()
    run_dpsgd(built_in, data, plan.dpsgd.params, trainable=list(built_in.parameters()), randomness=Randomness(5),
              settings=DPSGDSettings(optimizer="sgd", lr=0.05))
    mine = tiny_model()
    opt = torch.optim.SGD(mine.parameters(), lr=0.05, momentum=0.9)  # DPSGDSettings' "sgd"
    step = PrivateStep(mine, plan, loss_fn=functools.partial(bce, reduction="none"), optimizer=opt,
                       run_dir=tmp_path / "run", seed=5)
    for batch in step.batches(data.ns_cat, data.ns_num, data.s_cat, data.s_num, data.label):
        step(batch)
    for (name, a), b in zip(built_in.state_dict().items(), mine.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_dataset_samples_like_its_tensors(tmp_path):
    plan = encoded_plan()
    data = tiny_data(200)
    tensors = (data.ns_cat, data.ns_num, data.s_cat, data.s_num, data.label)
    models = []
    for i, given in enumerate([tensors, (torch.utils.data.TensorDataset(*tensors),)]):
        model = tiny_model()
        step = PrivateStep(model, plan, loss_fn=functools.partial(bce, reduction="none"),
                           optimizer=torch.optim.Adam(model.parameters()), run_dir=tmp_path / f"run{i}", seed=3)
        for batch in step.batches(*given):
            step(batch)
        models.append(model)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def _pure_noise_update(tmp_path, name):
    """One step whose clipped sum is exactly 0: the update is the noise / q N (SGD, lr 1)."""
    plan = dpsgd_plan()
    model = nn.Linear(60, 40)
    before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    step = PrivateStep(model, plan, loss_fn=lambda out, y: (out * 0).sum(1), optimizer=torch.optim.SGD(
        model.parameters(), lr=1.0), run_dir=tmp_path / name)
    batch = next(step.batches(torch.randn(2000, 60), torch.zeros(2000)))
    step(batch)
    step.close()
    moved = before - torch.cat([p.detach().flatten() for p in model.parameters()])
    par = plan.dpsgd.params
    return moved.double().numpy() * par.sampling_rate * par.dataset_size / (par.noise_multiplier * par.clipping_norm)


def test_the_noise_is_sigma_c_once_and_a_halved_noise_in_the_shared_engine_is_caught(tmp_path, monkeypatch):
    z = _pure_noise_update(tmp_path, "honest")
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], z.size)       # false alarm 2e-6
    assert z.size == 60 * 40 + 40 and lo < float((z ** 2).sum()) < hi
    NOISE_HALVED.install(monkeypatch)
    half = _pure_noise_update(tmp_path, "mutant")
    assert float((half ** 2).sum()) < lo


# --------------------------------------------------------------- refusals


def _step(plan, tmp_path, model=None, **kw):
    model = model or nn.Linear(3, 1)
    return PrivateStep(model, plan, loss_fn=lambda out, y: (out.squeeze(-1) - y).square(),
                       optimizer=torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run", **kw)


def _data(n=2000):
    return torch.randn(n, 3), torch.randn(n)


def test_refuses_a_plan_without_a_dpsgd_phase_and_one_with_other_phases(tmp_path):
    rr = build_plan(parse_scenario(SCENARIO.format(n=2000, batch=100, epochs=1, algorithm="rr", extra="").replace(
        "[dpsgd]\nbatch_size = 100\nepochs = 1\nclipping_norm = 1.0\n", "[rr]\nepochs = 1\n").replace(
        'adjacency = "add-remove"', 'adjacency = "replace-one"').replace("delta = 1e-6", "delta = 0.0")))
    with pytest.raises(PlanMismatchError, match=r"no DP-SGD phase \(its phases are \['rr'\]\)"):
        _step(rr, tmp_path)
    hybrid = build_plan(parse_scenario(SCENARIO.format(
        n=2000, batch=100, epochs=1, algorithm="hybrid", extra='split = "alpha=0.5"\ntower = "fine-tune"\n[rr]\n'
        'epochs = 1\n').replace('adjacency = "add-remove"', 'adjacency = "replace-one"')))
    with pytest.raises(UnsupportedError, match=r"the plan's phases are \['rr', 'dpsgd'\]"):
        _step(hybrid, tmp_path)
    calibrated = build_plan(parse_scenario(SCENARIO.format(n=2000, batch=100, epochs=1, algorithm="dpsgd",
                                                           extra="").replace("share = 0\n", "")))
    with pytest.raises(UnsupportedError, match=r"plan it with \[calibration\] share = 0"):
        _step(calibrated, tmp_path)
    assert not (tmp_path / "run").exists()


def test_refuses_data_of_another_n_and_writes_nothing(tmp_path):
    step = _step(dpsgd_plan(), tmp_path)
    with pytest.raises(InvalidParameterError, match="has 1999 rows; the plan accounts N = 2000"):
        next(step.batches(*_data(1999)))
    assert not (tmp_path / "run").exists()


def test_refuses_batch_norm_by_name_before_anything_is_written(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with pytest.raises(UnsupportedError, match=r"module '1' \(BatchNorm1d\) normalises over the batch"):
        _step(dpsgd_plan(), tmp_path, model)
    assert not (tmp_path / "run").exists()


def test_refuses_an_optimizer_over_other_tensors(tmp_path):
    model, stray = nn.Linear(3, 1), nn.Parameter(torch.zeros(2))
    with pytest.raises(InvalidParameterError, match="not a trainable parameter of the Linear"):
        PrivateStep(model, dpsgd_plan(), loss_fn=None, optimizer=torch.optim.SGD([*model.parameters(), stray], lr=1),
                    run_dir=tmp_path / "run")


def test_refuses_a_step_more_than_the_plan_accounts(tmp_path):
    plan = dpsgd_plan(epochs=1)                                 # T = 20
    step, data = _step(plan, tmp_path), _data()
    taken = []
    for batch in step.batches(*data):
        step(batch)
        taken.append(batch)
    assert len(taken) == step.steps_taken == 20 and list(step.batches(*data)) == []
    with pytest.raises(PlanMismatchError, match="accounts 20 noisy steps and all 20 are taken"):
        step(taken[-1])
    ledger = [json.loads(line) for line in (tmp_path / "run/ledger.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "intent" for e in ledger) == 20
    step.close()


def test_batches_come_only_from_the_step_once_and_in_order(tmp_path):
    step = _step(dpsgd_plan(), tmp_path)
    other = _step(dpsgd_plan(), tmp_path / "other")
    data = _data()
    mine, theirs = step.batches(*data), other.batches(*data)
    first = next(mine)
    with pytest.raises(PlanMismatchError, match="only the batches its own batches"):
        step(next(theirs))
    step(first)
    with pytest.raises(PlanMismatchError, match="given at step 1"):
        step(first)
    next(mine)
    with pytest.raises(PlanMismatchError, match="the batch of step 1 was not taken"):
        next(mine)
    with pytest.raises(InvalidParameterError, match="other data"):
        next(step.batches(*_data()))
    step.close()
    other.close()


def test_finish_is_refused_before_the_last_step(tmp_path):
    step = _step(dpsgd_plan(), tmp_path)
    batches = step.batches(*_data())
    step(next(batches))
    with pytest.raises(PlanMismatchError, match="1 of the plan's 40 noisy steps are taken"):
        step.finish()
    step.close()
    assert not (tmp_path / "run/run.json").exists()


def test_a_resumed_seeded_loop_draws_afresh(tmp_path):
    """Killed after step 12 and resumed with the same seed: the resumed steps do not replay the first ones."""
    from budgetplan.record.ledger import read_ledger

    plan, data = dpsgd_plan(epochs=1), _data()
    first = _step(plan, tmp_path, checkpoint_every=5, seed=3)
    for i, batch in enumerate(first.batches(*data)):
        first(batch)
        if i == 11:
            break
    first.close()
    second = _step(plan, tmp_path, resume=True, checkpoint_every=5, seed=3)
    for batch in second.batches(*data):
        second(batch)
    second.finish()
    view = read_ledger(tmp_path / "run/ledger.jsonl")
    sizes = view.batch_sizes()
    assert sizes[12:20] != sizes[:8], sizes
    assert [e["session"] for e in view.events("seeds")] == [0, 1]
    assert not (tmp_path / "run/checkpoint.pt").exists()


def test_an_interrupted_run_resumes_from_its_ledger_and_audits(tmp_path, runner):
    plan, data = dpsgd_plan(epochs=1), _data()
    first = _step(plan, tmp_path, checkpoint_every=5)
    for i, batch in enumerate(first.batches(*data)):
        first(batch)
        if i == 11:  # killed after step 12: the checkpoint holds step 10, steps 11 and 12 are lost
            break
    first.close()
    second = _step(plan, tmp_path, resume=True, checkpoint_every=5)
    steps = []
    for batch in second.batches(*data):
        steps.append(batch.step)
        second(batch)
    assert steps == list(range(12, 20))
    second.finish()
    audited = runner.invoke(cli, ["audit", str(tmp_path / "run"), "--json"])
    report = json.loads(audited.stdout)
    assert audited.exit_code == 0 and report["passed"], report["failing"]
    entry = json.loads((tmp_path / "run/run.json").read_text())["phases"][0]
    assert (entry["steps_executed"], entry["sessions"], entry["steps_lost_to_interruptions"]) == (20, 2, 2)
    assert np.isclose(entry["noise_std"], plan.dpsgd.params.noise_std)
