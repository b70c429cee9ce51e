"""A plan executed by several processes (``--nproc``): the guarantee of one process, audited.

The 2-process runs use gloo on CPU, as CI has. Equivalences are tested exactly where the
distributed computation must equal the single-process one (a full-batch fit, the
calibration's noisy vector from the same seed), statistically where it samples.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - every CPU build of torch has it
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from budgetplan.audit.ranks import rank_checks  # noqa: E402
from budgetplan.cli import cli  # noqa: E402
from budgetplan.planning.planner import build_plan  # noqa: E402
from budgetplan.record.records import load_record  # noqa: E402
from budgetplan.scenario.model import parse_scenario  # noqa: E402
from tests.trainers.test_run import WALR_SCENARIO  # noqa: E402
from trainers.audit import audit_run  # noqa: E402
from trainers.data.synth import SYNTH_FEATURES, synthesize  # noqa: E402
from trainers.distributed import launch  # noqa: E402
from trainers.run import RunOptions, TrainSettings, execute_plan  # noqa: E402

N = 6000
FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=512)


def hybrid_text(n: int = N) -> str:
    return f"""name = "two-processes"
[budget]
epsilon = 8.0
delta = 1e-5
[privacy]
adjacency = "replace-one"
[data]
dataset_size = {n}
[algorithm]
name = "hybrid"
split = "alpha=0.4"
tower = "frozen"
[rr]
epochs = 1
batch_size = 256
[dpsgd]
batch_size = 300
steps = 30
clipping_norm = 1.0
[calibration]
share = 0.3
{SYNTH_FEATURES.to_toml()}"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("nproc")
    table = synthesize(N + 3000, 2000, 7)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    pq.write_table(table.slice(N), root / "eval.parquet")
    plan = build_plan(parse_scenario(hybrid_text()))
    (root / "plan.json").write_text(plan.to_json())
    return root


@pytest.fixture(scope="module")
def two(root):
    """One Hybrid run by two processes, through the CLI as a user would start it."""
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["train", str(root / "plan.json"), "--data", str(root / "train.parquet"),
                                      "--eval", str(root / "eval.parquet"), "--out", str(root / "run2"),
                                      "--nproc", "2", "--threads", "1", "--embedding-dim", "4", "--seed", "5",
                                      "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_two_process_hybrid_run_audits_clean(root, two):
    report = audit_run(root / "run2", data_path=root / "train.parquet")
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]
    names = {c.name for c in report.checks}
    assert {"Poisson batch sizes per rank", "Rank samples independent", "DP-SGD noise evidence"} <= names


def test_the_empirical_audits_run_the_canaries_over_the_runs_processes(root, two, monkeypatch):
    """`audit --empirical` and `--one-run` run the DP-SGD canaries over as many gloo ranks as the run had (the
    two-rank canary run itself: tests/trainers/test_empirical.py); here, that the run's count reaches them."""
    import trainers.empirical as empirical
    from trainers.empirical import canaries, one_run

    asked = []
    # the RR phase comes first and has no processes to run over: not measured here
    monkeypatch.setattr(empirical, "rr_lower_bound", lambda **kw: SimpleNamespace(to_row=lambda name: {}))

    def lower_bound(params, **kw):
        asked.append(("empirical", kw["processes"]))
        raise SystemExit  # stop before the canaries run: the count is what is tested here

    def one(phase, **kw):
        asked.append(("one-run", kw["processes"]))
        raise SystemExit

    monkeypatch.setattr(canaries, "dpsgd_lower_bound", lower_bound)
    monkeypatch.setattr(one_run, "dpsgd_one_run", one)
    for flags in ({"empirical": True}, {"one_run": True}):
        with pytest.raises(SystemExit):
            audit_run(root / "run2", **flags)
    assert asked == [("empirical", 2), ("one-run", 2)]


def test_the_record_names_both_processes_and_their_steps(root, two):
    record = load_record(root / "run2")
    dpsgd = next(p for p in record.phases if p.name == "dpsgd")
    assert dpsgd.processes == 2 and dpsgd.rank_steps == (30, 30)
    assert [p.name for p in record.phases] == ["rr", "dpsgd", "calibration"]
    assert record.phases[0].labels == N  # every label randomised, once, over both ranks
    ledger = [json.loads(line) for line in (root / "run2" / "ledger.jsonl").read_text().splitlines()]
    ranks = [e for e in ledger if e.get("event") == "ranks"]
    assert ranks and ranks[0]["rank_rows"] == [N // 2, N // 2]
    intents = [e for e in ledger if e.get("event") == "intent" and e.get("phase") == "dpsgd"]
    assert len(intents) == 30 and all(sum(e["rank_batch_sizes"]) == e["batch_size"] for e in intents)
    assert len([e for e in ledger if e.get("event") == "released"]) == 2  # RR labels, calibration: once each


def test_it_matches_the_single_process_run(root, two):
    """Same plan, so the same guarantee; the accuracy within what seeds move it by at this size."""
    one = execute_plan(build_plan(parse_scenario(hybrid_text())), root / "train.parquet",
                       RunOptions(eval_path=root / "eval.parquet", settings=FAST, seed=5, threads=1))
    assert two["plan_sha256"] == one.plan_sha256
    metrics = two["private_record"]["metrics"]["eval"]
    assert abs(metrics["auc"] - one.metrics["eval"]["auc"]) < 0.05
    assert abs(metrics["calibration_ratio"] - 1) < 0.25


# ------------------------------------------------------------------ exact equivalences


class _Linear(torch.nn.Module):
    """A logistic regression on the numeric columns, shaped as fit() expects a truncated model."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def forward_truncated(self, cat, num):
        return self.layer(num).squeeze(-1)


class _Rows:
    def __init__(self, x):
        self.ns_cat, self.ns_num, self.label = x, x, x[:, 0]

    def __len__(self):
        return self.ns_num.shape[0]


def _full_batch_fit(coll, data, targets, steps):
    from trainers.fit import FitSettings, fit
    from trainers.losses import bce

    torch.manual_seed(0 if coll is None else coll.rank)  # rank 1's own start is replaced by rank 0's
    model = _Linear()
    if coll is not None:
        block = coll.shard(len(data))
        data, targets = data[block], targets[block]
    history = fit(model, _Rows(data), targets, bce, FitSettings(epochs=steps, batch_size=10**6, lr=0.1,
                                                                optimizer="sgd"),
                  truncated=True, generator=torch.Generator().manual_seed(1), collective=coll)
    return [p.detach().numpy().tolist() for p in model.parameters()], history["epoch_loss"]


def _fit_rank(coll, data, targets, steps):
    return _full_batch_fit(coll, data, targets, steps)


def test_a_full_batch_fit_over_two_ranks_is_the_one_process_fit():
    g = torch.Generator().manual_seed(3)
    data = torch.randn(101, 3, generator=g)  # an odd count: the blocks differ by one row
    targets = (torch.rand(101, generator=g) < torch.sigmoid(data[:, 0])).float()
    alone, loss = _full_batch_fit(None, data, targets, 5)
    ranks = launch(_fit_rank, 2, data, targets, 5, timeout_s=60)
    for weights, losses in ranks:
        for a, b in zip(weights, alone):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(losses, loss, rtol=1e-6)


RR_COUNT = SimpleNamespace(debiased_positives=(300.0, 900.0))  # what a Hybrid run's RR phase would give


def _calibrate_rank(coll, plan_json, rows_path, seed):
    from trainers.calibration import run_calibration
    from trainers.randomness import Randomness
    from trainers.session import NullSession

    plan, data, model = _calibration_inputs(plan_json, rows_path)
    block = coll.shard(len(data))
    mine = data.take(torch.arange(block.start, block.stop))
    result = run_calibration(model, mine, plan.calibration, randomness=Randomness(seed, stream=coll.rank),
                             session=NullSession(), collective=coll, rr_result=RR_COUNT)
    return result.release, result.shift


def _calibration_inputs(plan_json, rows_path):
    from budgetplan.plan import Plan
    from trainers.data.encode import encode
    from trainers.models import build_model

    plan = Plan.from_json(plan_json)
    data, _ = encode(pq.read_table(rows_path), plan.scenario.features)
    torch.manual_seed(0)
    model = build_model("mlp", ns_vocab=data.ns_vocab, n_ns_cat=data.ns_cat.shape[1], n_ns_num=data.ns_num.shape[1],
                        s_vocab=data.s_vocab, n_s_cat=data.s_cat.shape[1], n_s_num=data.s_num.shape[1],
                        embedding_dim=4, tower_hidden=8, common_hidden=(8,))
    return plan, data, model


def test_the_calibration_release_sums_the_ranks_and_draws_its_noise_once(root):
    """From the same seed, rank 0's noise is the one process's: the noisy vectors agree exactly."""
    from trainers.calibration import run_calibration
    from trainers.randomness import Randomness
    from trainers.session import NullSession

    plan_json = (root / "plan.json").read_text()
    plan, data, model = _calibration_inputs(plan_json, root / "train.parquet")
    alone = run_calibration(model, data, plan.calibration, randomness=Randomness(9), session=NullSession(),
                            rr_result=RR_COUNT)
    ranks = launch(_calibrate_rank, 2, plan_json, root / "train.parquet", 9, timeout_s=60)
    for release, shift in ranks:
        np.testing.assert_allclose(release, alone.release, rtol=1e-9)  # sigma C noise once, not once per rank
        assert shift == pytest.approx(alone.shift, rel=1e-9)


# ------------------------------------------------------------------ refusals


WALR_TEXT = WALR_SCENARIO.replace("dataset_size = 5000", f"dataset_size = {N}")


def test_walr_over_two_processes_is_the_one_process_release_and_fit(root, tmp_path):
    """Rank 0's noise from the same seed: the same released vector, the same theta, an audit that passes."""
    plan = build_plan(parse_scenario(WALR_TEXT))
    alone = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", seed=4, threads=1,
                                                                  out_dir=tmp_path / "one"))
    two = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet", seed=4, threads=1,
                                                                nproc=2, out_dir=tmp_path / "two"))
    a, b = np.load(tmp_path / "one" / "walr_sum.npy"), np.load(tmp_path / "two" / "walr_sum.npy")
    np.testing.assert_allclose(b, a, rtol=1e-9)  # summed over ranks, noised once
    theta_a = torch.load(tmp_path / "one" / "model.pt")["theta"]
    theta_b = torch.load(tmp_path / "two" / "model.pt")["theta"]
    np.testing.assert_allclose(theta_b.numpy(), theta_a.numpy(), rtol=1e-6, atol=1e-9)
    assert two.phases[0].rows == N and two.phases[0].releases == 1
    assert two.private_part.phases[0].max_contribution == alone.private_part.phases[0].max_contribution
    report = audit_run(tmp_path / "two")
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]


@pytest.mark.parametrize("args, message", [
    (["--nproc", "0"], "nproc"),
    (["--nproc", "2", "--non-private"], "--nproc does not apply to --non-private"),
])
def test_bad_nproc_is_one_line(root, runner, tmp_path, args, message):
    result = runner.invoke(cli, ["train", str(root / "plan.json"), "--data", str(root / "train.parquet"),
                                 "--out", str(tmp_path / "run"), *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_nproc_under_torchrun_is_refused(root, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = runner.invoke(cli, ["train", str(root / "plan.json"), "--data", str(root / "train.parquet"),
                                 "--out", str(tmp_path / "run"), "--nproc", "2"])
    assert result.exit_code == 2 and "leave --nproc at 1" in result.output


def test_a_refusal_on_the_ranks_reaches_the_caller_as_itself(root, tmp_path):
    plan = build_plan(parse_scenario(hybrid_text(N + 1)))  # the data has N rows
    with pytest.raises(Exception, match=f"plan accounts N = {N + 1}") as exc:
        execute_plan(plan, root / "train.parquet", RunOptions(out_dir=tmp_path / "run", nproc=2, threads=1))
    assert type(exc.value).__name__ == "InvalidParameterError"
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the audit's per-rank check


def _view(sizes_per_step, rows=(100, 100)):
    entries = [{"event": "ranks", "world_size": len(rows), "rank_rows": list(rows)}]
    entries += [{"event": "intent", "phase": "dpsgd", "step": i, "batch_size": sum(s), "rank_batch_sizes": list(s)}
                for i, s in enumerate(sizes_per_step)]
    return SimpleNamespace(entries=entries)


def _binomial(k, n, p):
    from scipy import stats

    return float(stats.binomtest(int(k), int(n), p).pvalue)


def _honest(steps, q=0.1, rows=(100, 100), seed=0):
    rng = np.random.default_rng(seed)
    return [[int(rng.binomial(r, q)) for r in rows] for _ in range(steps)]


def _check(view, ran, rows=200, q=0.1):
    check, _independent = rank_checks(view, ran, rows=rows, q=q, alpha=1e-6, two_sided_binomial=_binomial)
    return check


def test_the_rank_check_passes_an_honest_run_and_names_each_rank():
    sizes = _honest(400)
    check = _check(_view(sizes), SimpleNamespace(processes=2, rank_steps=(400, 400), steps_this_session=400))
    assert check.passed and "rank 0" in check.detail and "rank 1" in check.detail


def test_the_rank_check_refuses_ranks_that_disagree_on_the_steps():
    sizes = _honest(400)
    check = _check(_view(sizes), SimpleNamespace(processes=2, rank_steps=(400, 399), steps_this_session=400))
    assert not check.passed and "disagree on the step count" in check.detail


def test_the_rank_check_catches_a_rank_sampling_at_twice_q():
    rng = np.random.default_rng(1)
    sizes = [[int(rng.binomial(100, 0.1)), int(rng.binomial(100, 0.2))] for _ in range(400)]
    check = _check(_view(sizes), SimpleNamespace(processes=2, rank_steps=(400, 400), steps_this_session=400))
    assert not check.passed


def test_the_rank_check_refuses_sizes_that_do_not_add_up_and_rows_that_are_not_n():
    view = _view(_honest(10))
    view.entries[3]["batch_size"] += 1
    ran = SimpleNamespace(processes=2, rank_steps=(10, 10), steps_this_session=10)
    assert "add up to" in _check(view, ran).detail
    assert "rows in all" in _check(_view(_honest(10), rows=(100, 90)), ran).detail


def test_tie_probability_is_the_closed_form():
    from scipy import stats

    from budgetplan.audit.ranks import tie_probability

    q = 0.2
    assert tie_probability(1, 1, 0.3) == pytest.approx(0.3 ** 2 + 0.7 ** 2, rel=1e-12)
    assert tie_probability(2, 2, q) == pytest.approx((1 - q) ** 4 + 4 * q * q * (1 - q) ** 2 + q ** 4, rel=1e-12)
    k = np.arange(0, 2501)  # the window it sums over at large n, against the whole support
    full = float(np.sum(stats.binom.pmf(k, 3000, 0.05) * stats.binom.pmf(k, 2500, 0.05)))
    assert tie_probability(3000, 2500, 0.05) == pytest.approx(full, rel=1e-9)


def _independence(sizes, rows=(100, 100), q=0.1):
    ran = SimpleNamespace(processes=2, rank_steps=(len(sizes),) * 2, steps_this_session=len(sizes))
    per_rank, independent = rank_checks(_view(sizes, rows), ran, rows=sum(rows), q=q, alpha=1e-6,
                                        two_sided_binomial=_binomial)
    return per_rank, independent


def test_the_independence_check_passes_independent_ranks():
    # 20 honest runs of 400 steps: at a false-alarm rate of 1e-6 each, none may fail
    for seed in range(20):
        per_rank, independent = _independence(_honest(400, seed=seed))
        assert per_rank.passed and independent.passed, independent.detail
    assert "tied" in independent.detail and "correlation" in independent.detail


def test_the_independence_check_catches_ranks_in_lockstep_and_antithetic_ranks():
    honest = _honest(60)
    # ranks seeded alike: each rank's batches are Poisson (the per-rank check passes), but they tie every step
    per_rank, independent = _independence([[a, a] for a, _ in honest])
    assert per_rank.passed and not independent.passed
    assert "60 of 60 steps tied" in independent.detail and "not independent" in independent.detail
    # ranks whose draws move against each other (rank 1 mirrors rank 0 about q n): never equal more than
    # chance allows, caught by the correlation of their sizes
    rng = np.random.default_rng(3)
    mirrored = [[int(a), 20 - int(a)] for a in rng.binomial(100, 0.1, size=400)]
    per_rank, independent = _independence(mirrored)
    assert per_rank.passed and not independent.passed and "correlation of their sizes -1.000" in independent.detail


def _planted(coll, mutant, plan, data_path, options):
    """One rank of a run with a planted defect: the spawned process plants it in its own trainer modules."""
    from dataclasses import replace

    from tests.trainers import mutants

    getattr(mutants, mutant).plant()
    execute_plan(plan, data_path, replace(options, collective=coll))


@pytest.mark.parametrize("mutant, failing, says", [
    ("SAME_SEED_RANKS", {"Rank samples independent"}, "30 of 30 steps tied"),
    ("NO_NOISE_ON_ANY_RANK", {"DP-SGD noise evidence", "DP-SGD noise"}, "30 of 30 steps did not have their noise "
                                                                         "drawn by rank 0 alone (step 0: no rank"),
])
def test_a_defect_planted_in_a_two_process_run_fails_the_audit(root, tmp_path, mutant, failing, says):
    """Ranks on one seed stream draw the same Poisson sample (each rank's batches alone look right); noise
    drawn by no rank (the count of draws once said otherwise). Each fails the plain audit of the run."""
    from budgetplan.plan import load_plan

    out = tmp_path / "run"
    launch(_planted, 2, mutant, load_plan(root / "plan.json"), root / "train.parquet",
           RunOptions(out_dir=out, settings=FAST, seed=5, threads=1), timeout_s=300)
    report = audit_run(out)
    failed = {c.name: c.detail for c in report.checks if not c.passed}
    assert set(failed) == failing
    assert says in failed[sorted(failing)[-1]]


def test_a_one_process_run_gets_no_rank_check():
    assert rank_checks(SimpleNamespace(entries=[]), SimpleNamespace(processes=None, rank_steps=None), rows=10, q=0.1,
                       alpha=1e-6, two_sided_binomial=_binomial) == []


# ------------------------------------------------------------------ kill and resume


def _intents(path):
    try:
        return sum('"event":"intent"' in line and '"phase":"dpsgd"' in line for line in open(path))
    except FileNotFoundError:
        return 0


def test_a_killed_two_process_run_stops_and_resumes_with_the_ledger_count(root, tmp_path):
    """kill -9 of the launcher takes its ranks with it; --resume --nproc 2 finishes the plan, and it audits clean."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from budgetplan.record.ledger import read_ledger

    plan = build_plan(parse_scenario(hybrid_text().replace("batch_size = 300\nsteps = 30", "batch_size = 30\n"
                                                                                            "steps = 300")))
    (tmp_path / "plan.json").write_text(plan.to_json())
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "budgetplan", "train", str(tmp_path / "plan.json"), "--data",
           str(root / "train.parquet"), "--out", str(out), "--embedding-dim", "4", "--checkpoint-every", "10",
           "--nproc", "2", "--threads", "1", "--json"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 180
    while _intents(out / "ledger.jsonl") < 40 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    before = _intents(out / "ledger.jsonl")
    time.sleep(2.0)
    assert _intents(out / "ledger.jsonl") == before, "a rank went on after its launcher died"
    assert 0 < before < 300 and not (out / "run.json").exists()
    taken = read_ledger(out / "ledger.jsonl", plan_sha256=plan.sha256).count("dpsgd")  # a torn line counts too
    assert taken >= before
    done = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = load_record(out)
    dpsgd = next(p for p in record.phases if p.name == "dpsgd")
    assert dpsgd.steps_executed == 300 and dpsgd.sessions == 2 and dpsgd.processes == 2
    assert dpsgd.steps_this_session == 300 - taken  # only what the ledger had not counted
    assert dpsgd.rank_steps == (300 - taken, 300 - taken)
    assert len(read_ledger(out / "ledger.jsonl", plan_sha256=plan.sha256).events("released", "rr")) == 1
    report = audit_run(out)
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]


# ------------------------------------------------------------------ each rank encodes its block


def _prepare_rank(coll, path, encoding):
    from trainers.inputs import prepare_data

    settings = TrainSettings(nonsensitive_encoding=encoding, vocab_threshold=3)
    from trainers.randomness import Randomness

    prep = prepare_data(path, SYNTH_FEATURES, settings, "cpu", cap=2, capping="first", expected_rows=None,
                    randomness=Randomness(0), collective=coll)
    d = prep.data
    return [t.numpy() for t in (d.ns_cat, d.ns_num, d.s_cat, d.s_num, d.label)], prep.unit_counts


@pytest.mark.parametrize("encoding", ["vocab", "hash"])
def test_the_ranks_blocks_are_the_one_process_encoding(root, encoding):
    """Capped whole, encoded by block: the blocks in rank order are the one-process tensors (a
    vocabulary counted over every rank's rows)."""
    from trainers.inputs import prepare_data
    from trainers.randomness import Randomness

    settings = TrainSettings(nonsensitive_encoding=encoding, vocab_threshold=3)
    alone = prepare_data(root / "train.parquet", SYNTH_FEATURES, settings, "cpu", cap=2, capping="first",
                     expected_rows=None, randomness=Randomness(0))
    ranks = launch(_prepare_rank, 2, root / "train.parquet", encoding, timeout_s=60)
    d = alone.data
    for i, whole in enumerate((d.ns_cat, d.ns_num, d.s_cat, d.s_num, d.label)):
        np.testing.assert_array_equal(np.concatenate([r[0][i] for r in ranks]), whole.numpy())
    np.testing.assert_array_equal(np.concatenate([r[1] for r in ranks]), alone.unit_counts)
