"""Unit-sampled DP-SGD over several processes: whole units per rank, the guarantee of one process.

Each rank holds a block of whole units (``trainers.ranks.rank_rows``), samples them at q and
clips each sampled unit's summed gradient once; the sums are added, rank 0 draws the noise once,
and everything is divided by the plan's q M. Tested: the split itself (against a contiguous split
that cuts a unit), one noisy step that must equal the one-process step exactly, a run whose
record audits clean with global batch sizes in units, and the faults the checks must catch.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - every CPU build of torch has it
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from budgetplan.audit.ranks import rank_checks  # noqa: E402
from budgetplan.errors import InvalidParameterError  # noqa: E402
from budgetplan.planning.planner import build_plan  # noqa: E402
from budgetplan.record.records import load_record  # noqa: E402
from budgetplan.scenario.model import parse_scenario  # noqa: E402
from trainers.audit import audit_run  # noqa: E402
from trainers.data.capping import cap_units  # noqa: E402
from trainers.data.synth import SYNTH_FEATURES, synthesize  # noqa: E402
from trainers.distributed import launch  # noqa: E402
from trainers.inputs import new_model, prepare_data  # noqa: E402
from trainers.ranks import block, rank_rows  # noqa: E402
from trainers.run import RunOptions, TrainSettings, execute_plan  # noqa: E402

CAP = 3
FAST = TrainSettings(embedding_dim=2, tower_hidden=8, common_hidden=(8,), batch_size=256)
PREP = TrainSettings(embedding_dim=2, tower_hidden=8, common_hidden=(8,), nonsensitive_encoding="hash")


def prepare(path, n, **kw):
    """The training data as ``execute_plan`` prepares it (capping changes nothing: it is capped already)."""
    from trainers.randomness import Randomness

    return prepare_data(path, SYNTH_FEATURES, PREP, "cpu", cap=CAP, capping="first", expected_rows=n,
                    randomness=Randomness(0), **kw)


def scenario_text(n: int, m: int, *, hybrid: bool, batch: int = 200, epochs: int = 3, clip: float = 1.0) -> str:
    algorithm = 'name = "hybrid"\nsplit = "alpha=0.4"\ntower = "frozen"\n[rr]\nepochs = 1' if hybrid \
        else 'name = "dpsgd"'
    return f"""[budget]
epsilon = 8.0
delta = 1e-6
[privacy]
adjacency = "replace-one"
unit = "user"
cap = {CAP}
[data]
dataset_size = {n}
units = {m}
[algorithm]
{algorithm}
[dpsgd]
batch_size = {batch}
epochs = {epochs}
clipping_norm = {clip}
sample_by = "unit"
{SYNTH_FEATURES.to_toml()}"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Synthetic rows capped at 3 per user beforehand (so the plan's N and M are exact), users interleaved."""
    root = tmp_path_factory.mktemp("unit-ranks")
    table = synthesize(23_000, 8000, 11)
    train = table.slice(0, 20_000)
    users = train.column(SYNTH_FEATURES.unit_id).to_numpy()
    kept, _ = cap_units(users, CAP, rule="first")
    train = train.take(kept)
    pq.write_table(train, root / "train.parquet")
    pq.write_table(table.slice(20_000), root / "eval.parquet")
    return SimpleNamespace(root=root, n=train.num_rows, m=int(np.unique(users[kept]).size),
                           units=np.unique(users[kept], return_inverse=True)[1],
                           labels=train.column(SYNTH_FEATURES.label).to_numpy())


# ------------------------------------------------------------------ the split


def test_a_unit_that_a_contiguous_split_cuts_stays_whole():
    # rows 0-2 | 3-5 would cut unit 1 (rows 2, 3, 4) between the ranks
    units = np.array([0, 0, 1, 1, 1, 2])
    naive = [rank_rows(2, r, rows=units.size) for r in range(2)]
    assert set(units[naive[0]]) & set(units[naive[1]]) == {1}
    shares = [rank_rows(2, r, units=units) for r in range(2)]
    assert [s.tolist() for s in shares] == [[0, 1, 2, 3, 4], [5]]  # units {0, 1} and {2}: M split 2 + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, CAP), min_size=1, max_size=60), st.integers(1, 6), st.randoms(use_true_random=False))
def test_the_shares_partition_the_rows_into_whole_units(sizes, ranks, rnd):
    units = np.repeat(np.arange(len(sizes)), sizes)
    rnd.shuffle(units)  # a unit's rows anywhere in the data
    shares = [rank_rows(ranks, r, units=units) for r in range(ranks)]
    together = np.concatenate(shares)
    assert np.array_equal(np.sort(together), np.arange(units.size))  # every row once
    held = [set(units[s].tolist()) for s in shares]
    for r, s in enumerate(shares):
        assert np.all(np.diff(s) > 0)  # data order
        for other in range(r + 1, ranks):
            assert not held[r] & held[other]  # no unit on two ranks
        # each rank's unit count is a function of M alone: nothing about the rows leaks through it
        part = block(len(sizes), ranks, r)
        assert len(held[r]) == part.stop - part.start


def test_prepare_gives_each_rank_whole_units_and_the_one_process_rows(data):
    """``prepare_data`` as ranks 0 and 1 see it: disjoint units covering all M, rows as one process encodes them."""
    alone = prepare(data.root / "train.parquet", data.n)

    def shares(whole_units):
        return [prepare(data.root / "train.parquet", data.n, collective=SimpleNamespace(world_size=2, rank=r),
                        whole_units=whole_units) for r in range(2)]

    naive = [set(data.units[p.rows].tolist()) for p in shares(False)]
    assert naive[0] & naive[1], "the data must have units a contiguous split cuts"
    preps = shares(True)
    held = [set(data.units[p.rows].tolist()) for p in preps]
    assert not held[0] & held[1] and len(held[0] | held[1]) == data.m
    assert [len(h) for h in held] == [data.m - data.m // 2, data.m // 2]
    for p, units in zip(preps, held):
        assert p.encoding["units"] == data.m  # the record's count is every rank's
        np.testing.assert_array_equal(p.data.s_num.numpy(), alone.data.s_num.numpy()[p.rows])
        np.testing.assert_array_equal(p.unit_counts, alone.unit_counts[p.rows])
        assert int(torch.unique(p.data.unit).numel()) == len(units)


# ------------------------------------------------------------------ one step, exactly


def _one_step(coll, plan_json, path, whole_units):
    """One noisy SGD step at q = 1 (every unit sampled: the only randomness is rank 0's noise)."""
    from budgetplan.plan import Plan
    from trainers.dpsgd import DPSGDSettings, run_dpsgd
    from trainers.randomness import Randomness

    plan = Plan.from_json(plan_json)
    prep = prepare(path, plan.dataset_size, collective=coll, whole_units=whole_units)
    model = new_model(prep, PREP, 0)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    try:
        result = run_dpsgd(model, prep.data, plan.dpsgd.params, trainable=list(model.parameters()),
                           randomness=Randomness(17, stream=0 if coll is None else coll.rank),
                           settings=DPSGDSettings(optimizer="sgd", lr=1.0), collective=coll)
    except InvalidParameterError as exc:
        return str(exc)
    # the update itself (SGD at lr 1: minus the noisy gradient), rounding-free of the weights' scale
    update = [p.detach().numpy() - b for p, b in zip(model.parameters(), before)]
    return update, result.batch_sizes, result.clipped


def _steps(coll, plan_json, path):
    return _one_step(coll, plan_json, path, True), _one_step(coll, plan_json, path, False)


def test_one_noisy_step_over_two_ranks_is_the_one_process_step(data):
    """Clipped per unit on the rank that holds it, summed, noised once by rank 0, divided by q M: the same
    update as one process from the same noise seed. A contiguous split that cuts units is refused."""
    text = scenario_text(data.n, data.m, hybrid=False, batch=data.m, epochs=1, clip=0.05)
    plan = build_plan(parse_scenario(text))
    assert plan.dpsgd.params.sampling_rate == 1.0 and plan.dpsgd.params.steps == 1
    par = plan.dpsgd.params
    noise = par.noise_multiplier * par.clipping_norm / par.expected_batch_size  # the noise's std in the update
    update, sizes, clipped = _one_step(None, plan.to_json(), data.root / "train.parquet", True)
    assert sizes == (data.m,) and clipped == data.m  # every unit sampled, every unit clipped at C = 0.05
    ranks = launch(_steps, 2, plan.to_json(), data.root / "train.parquet", timeout_s=120)
    for (whole, cut) in ranks:
        got, got_sizes, got_clipped = whole
        assert got_sizes == (data.m,) and got_clipped == data.m
        for a, b in zip(got, update):
            # float32 rounding of a sum in another order; a second noise draw would be off by ~noise
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3 * noise)
        # the planted fault: rows in contiguous blocks, a cut unit counted (and clipped) on both ranks
        assert "units" in cut and f"in all; the plan accounts M = {data.m}" in cut


# ------------------------------------------------------------------ a whole run, audited


@pytest.fixture(scope="module")
def runs(data):
    """The same Hybrid plan (RR, then DP-SGD sampling units) and seed, trained by one and by two processes."""
    plan = build_plan(parse_scenario(scenario_text(data.n, data.m, hybrid=True)))
    out = {}
    for nproc in (1, 2):
        out[nproc] = execute_plan(plan, data.root / "train.parquet", RunOptions(eval_path=data.root / "eval.parquet",
                                                                                out_dir=data.root / f"run{nproc}",
                                                                                settings=FAST, seed=5, threads=1,
                                                                                nproc=nproc))
    return plan, out


def test_a_two_process_unit_run_audits_clean_with_batch_sizes_in_units(data, runs):
    plan, _ = runs
    run = data.root / "run2"
    report = audit_run(run, data_path=data.root / "train.parquet")
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]
    checks = {c.name: c.detail for c in report.checks}
    assert " units over " in checks["Poisson batch sizes: total"]
    assert "units over" in checks["Poisson batch sizes per rank"]
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    (ranks,) = [e for e in ledger if e.get("event") == "ranks"]
    # each rank's units, a function of M alone; no rank's rows (they would sum the units' row counts)
    assert ranks["rank_units"] == [data.m - data.m // 2, data.m // 2] and "rank_rows" not in ranks
    intents = [e for e in ledger if e.get("event") == "intent" and e.get("phase") == "dpsgd"]
    assert len(intents) == plan.dpsgd.params.steps
    assert all(sum(e["rank_batch_sizes"]) == e["batch_size"] for e in intents)
    record = load_record(run)
    dpsgd = next(p for p in record.phases if p.name == "dpsgd")
    assert dpsgd.processes == 2 and dpsgd.clipped_per == "unit"
    assert dpsgd.batch_size_sum == sum(e["batch_size"] for e in intents)
    assert record.private_part.data.rank_rows and sum(record.private_part.data.rank_rows) == data.n
    assert record.private_part.encoding["units"] == data.m


def test_the_rr_release_is_in_data_order(data, runs):
    """The ranks' shares are not contiguous rows; rank 0 puts each label back at its row, so the release
    differs from the data's labels at exactly the flipped rows (a resume with another --nproc reads it alike)."""
    _, out = runs
    for nproc in (1, 2):
        release = np.load(data.root / f"run{nproc}" / "rr_labels.npy")
        rr = next(p for p in out[nproc].phases if p.name == "rr")
        flipped = rr.labels_flipped if rr.labels_flipped is not None else next(
            s for s in out[nproc].private_part.phases if hasattr(s, "labels_flipped")).labels_flipped
        assert release.size == data.n and int((release != data.labels).sum()) == flipped


def test_one_and_two_processes_train_alike(data, runs):
    """The same plan and seed: not the same samples (each rank draws its own), so the same quality within
    what seeds move it by: over seeds 1-12 one process reached eval AUC 0.555-0.600 (mean 0.580, sd
    0.013), two processes 0.566-0.584 over seeds 1-9 (mean 0.573, sd 0.008); the bound is about 4 sd of
    a difference."""
    plan, out = runs
    one, two = (out[k].metrics["eval"]["auc"] for k in (1, 2))
    assert out[1].plan_sha256 == out[2].plan_sha256 == plan.sha256
    assert one > 0.5 and two > 0.5 and abs(one - two) < 0.06
    report = audit_run(data.root / "run1", data_path=data.root / "train.parquet")
    assert report.passed, [(c.name, c.detail) for c in report.checks if not c.passed]


# ------------------------------------------------------------------ what the audit catches


def _binomial(k, n, p):
    from scipy import stats

    return float(stats.binomtest(int(k), int(n), p).pvalue)


def _view(per_step, counts, key="rank_units"):
    entries = [{"event": "ranks", "world_size": len(counts), key: list(counts)}]
    entries += [{"event": "intent", "phase": "dpsgd", "step": i, "batch_size": sum(s), "rank_batch_sizes": list(s)}
                for i, s in enumerate(per_step)]
    return SimpleNamespace(entries=entries)


def _check(view, steps, m=600, q=0.05):
    ran = SimpleNamespace(processes=2, rank_steps=(steps, steps), steps_this_session=steps)
    check, _independent = rank_checks(view, ran, rows=m, q=q, alpha=1e-6, two_sided_binomial=_binomial,
                                      what="units")
    return check


def test_the_rank_check_over_units_passes_an_honest_run_and_catches_per_rank_m():
    rng = np.random.default_rng(0)
    honest = [[int(rng.binomial(300, 0.05)) for _ in range(2)] for _ in range(400)]
    assert _check(_view(honest, [300, 300]), 400).passed
    # each rank sampling as if it held all M units: twice the units per step, caught per rank
    per_rank_m = [[int(rng.binomial(600, 0.05)) for _ in range(2)] for _ in range(400)]
    check = _check(_view(per_rank_m, [300, 300]), 400)
    assert not check.passed and "rank 0" in check.detail
    # a unit counted on two ranks: the ranks hold M + 1
    assert "601 units in all" in _check(_view(honest, [301, 300]), 400).detail
    # a unit-sampled session that noted rows, not units
    assert "their units" in _check(_view(honest, [1100, 1100], key="rank_rows"), 400).detail
