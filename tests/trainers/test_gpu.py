"""On a CUDA device: the trainer's parts give the CPU's numbers, and the README's plan trains there.

CI has no GPU, so every test here skips without one (marker ``gpu``). On a GPU machine the
rest of the suite runs on CUDA too, since the trainers' default device is ``auto``; these
tests add what only a side-by-side or an explicit ``--device cuda`` shows.
"""

from __future__ import annotations

import functools
import json

import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.cli import cli
from trainers.clipping import clipped_gradient_sum
from trainers.losses import bce
from trainers.models import build_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SHAPE = {"ns_vocab": 50, "n_ns_cat": 3, "n_ns_num": 2, "s_vocab": 40, "n_s_cat": 2, "n_s_num": 2}
LOSS = functools.partial(bce, reduction="none")


def _batch(rows: int, real: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    inputs = (torch.randint(0, SHAPE["ns_vocab"], (rows, SHAPE["n_ns_cat"]), generator=g),
              torch.randn(rows, SHAPE["n_ns_num"], generator=g, dtype=torch.float64),
              torch.randint(0, SHAPE["s_vocab"], (rows, SHAPE["n_s_cat"]), generator=g),
              torch.randn(rows, SHAPE["n_s_num"], generator=g, dtype=torch.float64))
    targets = torch.randint(0, 2, (rows,), generator=g).to(torch.float64)
    mask = torch.zeros(rows, dtype=torch.float64)
    mask[:real] = 1
    return inputs, targets, mask


def _clipped(model, inputs, targets, mask, unit_rows):
    for p in model.parameters():
        p.grad = None
    out = clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=0.5, unit_rows=unit_rows)
    return out, [p.grad.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("unit_rows", [1, 3])
@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_the_clipped_sum_on_cuda_is_the_cpus(kind, unit_rows):
    torch.manual_seed(0)
    cpu = build_model(kind, **SHAPE, embedding_dim=4).to(torch.float64)
    gpu = build_model(kind, **SHAPE, embedding_dim=4).to(torch.float64)
    gpu.load_state_dict(cpu.state_dict())
    gpu = gpu.to("cuda")
    inputs, targets, mask = _batch(rows=96, real=80)
    want, want_grads = _clipped(cpu, inputs, targets, mask, unit_rows)
    got, got_grads = _clipped(gpu, tuple(x.cuda() for x in inputs), targets.cuda(), mask.cuda(), unit_rows)
    assert got["norms"].device.type == "cuda"
    torch.testing.assert_close(got["norms"].cpu(), want["norms"], rtol=1e-9, atol=1e-12)
    assert int(got["clipped"]) == int(want["clipped"]) > 0  # C = 0.5 clips some rows, not all
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def readme_run_on_cuda(tmp_path_factory):
    """The README's plan-then-train walk-through, with ``--device cuda``."""
    from click.testing import CliRunner

    from trainers.data.synth import synthesize

    root = tmp_path_factory.mktemp("cuda")
    pq.write_table(synthesize(200_000, 40_000, 1), root / "train.parquet")
    pq.write_table(synthesize(50_000, 10_000, 2), root / "eval.parquet")
    runner = CliRunner()
    made = runner.invoke(cli, ["plan", "example:synthetic-hybrid", "-o", str(root / "plan.json")])
    assert made.exit_code == 0, made.output
    trained = runner.invoke(cli, ["train", str(root / "plan.json"), "--data", str(root / "train.parquet"),
                                  "--eval", str(root / "eval.parquet"), "--out", str(root / "run"),
                                  "--device", "cuda"])
    assert trained.exit_code == 0, trained.output
    return root / "run", runner


def test_the_readme_plan_trains_on_cuda_and_audits_clean(readme_run_on_cuda):
    from budgetplan.record.records import load_record

    run, runner = readme_run_on_cuda
    record = load_record(run)
    assert record.device.startswith("cuda") and torch.cuda.get_device_name() in record.device
    from trainers.dpsgd import GPU_MAX_CHUNK

    assert record.training["dpsgd"]["max_chunk"] == GPU_MAX_CHUNK  # the GPU's chunk, not the CPU's 4,096
    audited = runner.invoke(cli, ["audit", str(run), "--empirical", "--json"])
    assert audited.exit_code == 0, audited.output
    assert json.loads(audited.stdout)["passed"]
    assert 0.6 < record.metrics["eval"]["auc"] < 1  # the synthetic data's signal is learnt, not noise


def test_seeded_runs_on_cuda_reproduce(tmp_path):
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import load_scenario
    from trainers.data.synth import synthesize
    from trainers.run import RunOptions, TrainSettings, execute_plan

    pq.write_table(synthesize(20_000, 5_000, 3), tmp_path / "train.parquet")
    text = load_scenario_text().replace("dataset_size = 200000", "dataset_size = 20000")
    (tmp_path / "s.toml").write_text(text)
    plan = build_plan(load_scenario(tmp_path / "s.toml"))
    settings = TrainSettings(device="cuda", embedding_dim=4)
    models = []
    for name in ("a", "b"):
        execute_plan(plan, tmp_path / "train.parquet", RunOptions(out_dir=tmp_path / name, settings=settings, seed=7))
        models.append(torch.load(tmp_path / name / "model.pt", map_location="cpu", weights_only=False))
    assert _same(*models)
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's mode, given back


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def load_scenario_text() -> str:
    from budgetplan.scenario import examples

    return examples.path("synthetic-hybrid").read_text()
