"""Training a units split: each phase reads its own part of the units only (poisoned-data tests), the record
says what each part held, and the audit recomputes the parts from the data."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from budgetplan.audit import audit_run as core_audit
from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.planning.planner import build_plan
from budgetplan.record.records import DPSGDRun, RRRun
from budgetplan.scenario.model import parse_scenario
from trainers.audit import audit_run
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.demo import demo_scenario
from trainers.inputs import units_part
from trainers.run import RunOptions, TrainSettings, execute_plan

FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=512)
ROWS, USERS, SHARE = 5000, 1250, 0.6


def units_plan(n: int):
    text = demo_scenario(epsilon=4.0, dataset_size=n, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', f'name = "hybrid"\nsplit = "units={SHARE}"\ntower = "frozen"').replace(
        "delta = 0.0", "delta = 1e-6")
    return build_plan(parse_scenario(text + "\n[dpsgd]\nbatch_size = 100\nepochs = 1\nclipping_norm = 1.0\n"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("units")
    table = synthesize(ROWS, USERS, 11)
    pq.write_table(table, root / "train.parquet")
    return root, table


def poisoned(table: pa.Table, rows: np.ndarray, *, labels: bool, sensitive: bool) -> pa.Table:
    """``table`` with the labels flipped and/or the sensitive features reversed on ``rows`` (a mask)."""
    cols = {}
    for name in table.column_names:
        values = table.column(name).to_numpy(zero_copy_only=False).copy()
        if (labels and name == SYNTH_FEATURES.label) or (sensitive and name in SYNTH_FEATURES.sensitive):
            values[rows] = 1 - values[rows] if name == SYNTH_FEATURES.label else values[rows][::-1]
        cols[name] = pa.array(values, type=table.column(name).type, from_pandas=True)  # NaN back to null
    return pa.table(cols)


def train(plan, table, path, out=None):
    pq.write_table(table, path)
    # one thread: "auto" takes the CPUs free now, and another thread count sums in another order
    return execute_plan(plan, path, RunOptions(settings=FAST, seed=7, out_dir=out, threads=1))


def weights(out) -> dict:
    """The saved model's parameters but the output bias (the calibration, over every row, moves it)."""
    state = torch.load(out / "model.pt", weights_only=True)
    return {k: v for k, v in state.items() if k != "head.bias"}


def test_each_phase_trains_on_its_part_and_the_record_says_how_many_rows(data, tmp_path):
    root, table = data
    plan = units_plan(ROWS)
    first = units_part(table, "user_id", SHARE)
    rec = execute_plan(plan, root / "train.parquet", RunOptions(settings=FAST, out_dir=tmp_path / "run"))
    rr, sgd = (next(p for p in rec.phases if isinstance(p, kind)) for kind in (RRRun, DPSGDRun))
    assert rr.labels == int(first.sum()) and sgd.part_rows == ROWS - int(first.sum())
    assert 0 < rr.labels < ROWS
    # the audit reads the parts' rows from the record, and with the data recomputes them
    assert core_audit(tmp_path / "run").passed
    report = audit_run(tmp_path / "run", data_path=root / "train.parquet")
    check = next(c for c in report.checks if c.name == "units split")
    assert check.passed, check.detail


def test_the_rr_phase_never_reads_the_dpsgd_part(data, tmp_path):
    root, table = data
    plan = units_plan(ROWS)
    rest = ~units_part(table, "user_id", SHARE)
    a = train(plan, table, tmp_path / "a.parquet")
    b = train(plan, poisoned(table, rest, labels=True, sensitive=True), tmp_path / "b.parquet")
    rr_a, rr_b = (next(p for p in r.phases if isinstance(p, RRRun)) for r in (a, b))
    assert rr_a.release_sha256 == rr_b.release_sha256  # the same labels randomised the same way
    assert rr_a.epoch_loss == rr_b.epoch_loss and rr_a.validation_log_loss == rr_b.validation_log_loss
    # and the test can fail: the first part's labels are what RR releases
    c = train(plan, poisoned(table, ~rest, labels=True, sensitive=False), tmp_path / "c.parquet")
    assert next(p for p in c.phases if isinstance(p, RRRun)).release_sha256 != rr_a.release_sha256


def test_the_dpsgd_phase_never_reads_the_rr_part_s_sensitive_features(data, tmp_path):
    # RR reads the first part's labels (and non-sensitive features) but never anyone's sensitive features;
    # DP-SGD reads everything of its own part only: poisoning the first part's sensitive features must leave
    # the trained weights as they were, and poisoning the second part's must not
    root, table = data
    plan = units_plan(ROWS)
    first = units_part(table, "user_id", SHARE)
    runs = {}
    for name, rows in (("clean", None), ("first", first), ("rest", ~first)):
        t = table if rows is None else poisoned(table, rows, labels=False, sensitive=True)
        train(plan, t, tmp_path / f"{name}.parquet", tmp_path / name)
        runs[name] = weights(tmp_path / name)
    assert all(torch.equal(runs["clean"][k], runs["first"][k]) for k in runs["clean"])
    assert not all(torch.equal(runs["clean"][k], runs["rest"][k]) for k in runs["clean"])


def test_the_audit_fails_a_record_whose_parts_do_not_add_up(data, tmp_path):
    from tests.forgeries import write_record

    root, _ = data
    out = tmp_path / "run"
    execute_plan(units_plan(ROWS), root / "train.parquet", RunOptions(settings=FAST, out_dir=out))
    import json

    content = json.loads((out / "run.json").read_text())
    content.pop("sha256")
    sgd = next(p for p in content["phases"] if p["name"] == "dpsgd")
    sgd["part_rows"] += 1
    write_record(out, content)
    report = core_audit(out)
    assert not report.passed
    assert any(c.name == "RR flips" and not c.passed and "must be their sum" in c.detail for c in report.checks)


def test_several_processes_are_refused_before_anything_is_spent(data, tmp_path):
    root, _ = data
    with pytest.raises(UnsupportedError, match="units split is not run over several processes"):
        execute_plan(units_plan(ROWS), root / "train.parquet",
                     RunOptions(settings=FAST, out_dir=tmp_path / "run", nproc=2))
    assert not (tmp_path / "run").exists()


def test_a_phase_is_refused_on_data_split_elsewhere_than_its_part():
    from types import SimpleNamespace

    from trainers.phases.parts import check_part, part_mask

    plan = units_plan(ROWS)
    mask = np.arange(10) % 2 == 0
    data = np.zeros(10)
    at = lambda share: SimpleNamespace(part=None if share is None else (share, mask), data=data)  # noqa: E731
    assert part_mask(plan.rr, at(SHARE)).tolist() == mask.tolist()
    assert part_mask(plan.dpsgd, at(SHARE)).tolist() == (~mask).tolist()
    assert part_mask(plan.calibration, at(None)) is None  # a phase on every unit
    for share in (None, 0.5):
        with pytest.raises(InvalidParameterError, match="but the data was split at"):
            check_part(plan.dpsgd, at(share))
