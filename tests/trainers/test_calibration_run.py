"""The calibration phase executed: the release, the shift it moves the intercept by, and its audit.

The audit must fail closed on it: each forgery of the release below (its noise, its size,
its values, its entry, a second draw) fails the ``intercept calibration`` or ``ledger``
check, and a run that lacks the release its plan accounts fails too.
"""

import dataclasses
import json
import shutil
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scipy.special import expit

from budgetplan import intercept
from budgetplan.errors import InvalidParameterError
from budgetplan.plan import load_plan
from budgetplan.planning.planner import build_plan
from budgetplan.record.ledger import digest, line
from budgetplan.record.records import CalibrationRun, CalibrationStats, PrivateRecord, RunRecord, load_record
from budgetplan.scenario.model import parse_scenario
from budgetplan.util.typed import to_json
from trainers.audit import audit_run
from trainers.calibration import exact_release, run_calibration
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.randomness import Randomness
from trainers.run import RunOptions, TrainSettings, execute_plan
from trainers.session import NullSession

N = 4000
FAST = TrainSettings(embedding_dim=4, tower_hidden=16, common_hidden=(16,), batch_size=512)


def plan_text(*, algorithm="dpsgd", calibration="[calibration]\nshare = 0.3\n", clipping=1.0, eps=8.0):
    algo = 'name = "dpsgd"' if algorithm == "dpsgd" else (
        'name = "hybrid"\nsplit = "alpha=0.4"\ntower = "frozen"\n[rr]\nepochs = 1\nbatch_size = 256')
    return f"""name = "calibrated-run"
[budget]
epsilon = {eps!r}
delta = 1e-5
[privacy]
adjacency = "replace-one"
[data]
dataset_size = {N}
[algorithm]
{algo}
[dpsgd]
batch_size = 400
steps = 40
clipping_norm = {clipping!r}
{calibration}
{SYNTH_FEATURES.to_toml()}
# the shares these tests state are of the budget itself; the default ("auto") would plan the phases
# to a larger epsilon whose PLD total is the budget (tests/test_pld_budget.py), at 3-10 times the time
[accounting]
composition = "basic"
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibration")
    table = synthesize(2 * N, 1500, 7)
    pq.write_table(table.slice(0, N), root / "train.parquet")
    pq.write_table(table.slice(N, N), root / "eval.parquet")
    return root


@pytest.fixture(scope="module")
def runs(root):
    """The same seed with and without the phase. Clipping at C = 1 and a small fixed step size
    (0.01 over 40 steps) bias the intercept; the release gets half of a large budget, so its
    noise is small beside the counts it measures."""
    from trainers.dpsgd import DPSGDSettings

    out = {}
    for name, cal in (("with", "[calibration]\nshare = 0.5\n"), ("without", "[calibration]\nshare = 0\n")):
        plan = build_plan(parse_scenario(plan_text(calibration=cal, eps=40.0)))
        out[name] = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet",
                                                                          out_dir=root / name, settings=FAST, seed=11,
                                                                          dpsgd_settings=DPSGDSettings(lr=0.01)))
    return out


def _train_sums(root, run_dir, record, *, truncated=False):
    """(sum_i s(z_i), sum_i y_i) of the saved model over the training rows, exactly."""
    from trainers.inputs import prepare_data
    from trainers.models import build_model

    plan = load_plan(run_dir / "plan.json")
    prep = prepare_data(root / "train.parquet", plan.scenario.features, FAST.for_plan(plan), torch.device("cpu"), cap=1,
                    capping=None, expected_rows=N, randomness=None)
    model = build_model("mlp", to_json(record.model.config))
    model.load_state_dict(torch.load(run_dir / "model.pt"))
    return exact_release(model, prep.data, (0.0,), truncated=truncated)


def _train_ratio(root, run_dir, record):
    sums = _train_sums(root, run_dir, record)
    return sums[0] / sums[1]


def test_the_shift_moves_the_mean_prediction_to_the_base_rate(root, runs):
    stats = runs["with"].private_part.phases[-1]
    assert isinstance(stats, CalibrationStats) and not stats.clamped and stats.shift != 0
    before = stats.mean_prediction_before * N / stats.target_positives  # of the noisy release
    assert abs(before - 1) > 0.3, before  # the bias is there to fix
    after = _train_ratio(root, root / "with", runs["with"])
    assert abs(after - 1) < 0.05, (before, after)
    # and the uncalibrated run of the same seed keeps its bias
    assert abs(_train_ratio(root, root / "without", runs["without"]) - 1) > 0.3


def test_the_release_file_is_the_private_record_s_release(root, runs):
    stats = runs["with"].private_part.phases[-1]
    release = np.load(root / "with" / "calibration_release.npy")
    assert tuple(release) == stats.release and release.size == len(intercept.SHIFTS) + 1
    assert stats.mean_prediction_before == pytest.approx(release[list(intercept.SHIFTS).index(0.0)] / N)


def test_hybrid_combines_the_rr_labels_into_the_target(root, runs):
    plan = build_plan(parse_scenario(plan_text(algorithm="hybrid", eps=40.0)))
    record = execute_plan(plan, root / "train.parquet", RunOptions(eval_path=root / "eval.parquet",
                                                                   out_dir=root / "hybrid", settings=FAST, seed=12))
    assert [p.name for p in record.phases] == ["rr", "dpsgd", "calibration"]
    stats = record.private_part.phases[-1]
    # inverse-variance weighting: the combined target is surer than the noisy count alone
    assert stats.target_variance < plan.calibration.params.noise_std ** 2
    assert abs(_train_ratio(root, root / "hybrid", record) - 1) < 0.1
    report = audit_run(root / "hybrid")
    assert report.passed, [c for c in report.checks if not c.passed]


def test_an_honest_calibrated_run_audits_clean(root, runs):
    report = audit_run(root / "with", data_path=root / "train.parquet")
    assert report.passed, [c for c in report.checks if not c.passed]
    names = {c.name: c for c in report.checks}
    assert names["intercept calibration"].passed and "calibration" in names["independent re-accounting"].detail
    # an uncalibrated plan's audit has no calibration row at all
    assert "intercept calibration" not in {c.name for c in audit_run(root / "without").checks}


def test_rr_alone_shifts_for_free_to_the_debiased_count(root):
    from trainers.demo import demo_scenario

    text = demo_scenario(epsilon=2.0, dataset_size=N, spec=SYNTH_FEATURES, epochs=2)  # calibrated by default
    plan = build_plan(parse_scenario(text))
    assert plan.free_calibration and plan.calibration is None
    record = execute_plan(plan, root / "train.parquet", RunOptions(out_dir=root / "rr", settings=FAST, seed=13))
    assert [p.name for p in record.phases] == ["rr"]  # nothing released, nothing public
    stats = record.private_part.phases[-1]
    assert isinstance(stats, CalibrationStats) and stats.release == () and not stats.clamped
    debiased, variance = intercept.rr_estimate(np.load(root / "rr" / "rr_labels.npy"),
                                               plan.rr.params.flip_probability)
    assert (stats.target_positives, stats.target_variance) == pytest.approx((debiased, variance))
    mean = _train_sums(root, root / "rr", record, truncated=True)[0]
    assert mean == pytest.approx(debiased, rel=1e-6)  # exact, not a noisy estimate
    # the RR phase starts at the debiased base rate, so training leaves it close; the shift still moves it
    assert stats.shift != 0 and abs(stats.mean_prediction_before * N - debiased) > 1e-4 * debiased
    report = audit_run(root / "rr")
    assert report.passed, [c for c in report.checks if not c.passed]


# ------------------------------------------------------------------------------ forgeries

def _copy(root, name):
    out = root / "forged" / name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(root / "with", out)
    return out


def _rehash(body: dict) -> str:
    import hashlib

    from budgetplan.plan import canonical_json

    return json.dumps({**body, "sha256": hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()},
                      sort_keys=True, indent=2)


def _write(out, content, private=None):
    if private is not None:
        (out / "private" / "record.json").write_text(private.to_json())
        content = {**content, "private_sha256": private.sha256}
    (out / "run.json").write_text(RunRecord.from_json(_rehash(content)).to_json())


def _cal(content):
    return next(p for p in content["phases"] if p["name"] == "calibration")


def _f_noise(out):
    c = load_record(out).content()
    _cal(c)["noise_std"] /= 10
    _write(out, c)


def _f_fewer_coordinates(out):
    c = load_record(out).content()
    _cal(c)["coordinates"] = _cal(c)["noise_draws"] = 2
    _write(out, c)


def _f_entry_removed(out):
    c = load_record(out).content()
    c["phases"] = [p for p in c["phases"] if p["name"] != "calibration"]
    priv = PrivateRecord.from_json((out / "private" / "record.json").read_text())
    _write(out, c, replace(priv, phases=priv.phases[:-1]))


def _f_private_release(out):
    priv = PrivateRecord.from_json((out / "private" / "record.json").read_text())
    stats = priv.phases[-1]
    forged = replace(stats, release=tuple(x * 1.01 for x in stats.release))
    _write(out, load_record(out).content(), replace(priv, phases=(*priv.phases[:-1], forged)))


def _f_release_file(out):
    release = np.load(out / "calibration_release.npy")
    np.save(out / "calibration_release.npy", release * 1.01)


def _f_second_release(out):
    path = out / "ledger.jsonl"
    entries = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rel = next(e for e in entries if e.get("event") == "released" and e.get("phase") == "calibration")
    i = entries.index(rel)
    entries = entries[:i + 1] + [{"event": "intent", "phase": "calibration", "step": 0}, dict(rel)] + entries[i + 1:]
    prev, lines = "0" * 64, []
    for k, e in enumerate(entries):
        e = {"seq": k, "prev": prev, **{x: v for x, v in e.items() if x not in ("hash", "prev", "seq")}}
        e["hash"] = prev = digest(e)
        lines.append(line(e))
    path.write_text("\n".join(lines) + "\n")
    c = load_record(out).content()
    c["ledger"] = {"head": prev, "lines": len(entries)}
    _write(out, c)


FORGERIES = [
    ("noise", _f_noise, "intercept calibration"),
    ("fewer coordinates", _f_fewer_coordinates, "intercept calibration"),
    ("entry removed", _f_entry_removed, "intercept calibration"),
    ("private release", _f_private_release, "intercept calibration"),
    ("release file", _f_release_file, "ledger"),
    ("second release", _f_second_release, "ledger"),
]


@pytest.mark.parametrize("name, forge, failing", FORGERIES, ids=[f[0] for f in FORGERIES])
def test_each_forged_release_fails_the_audit(root, runs, name, forge, failing):
    out = _copy(root, name.replace(" ", "-"))
    forge(out)
    report = audit_run(out)
    check = next((c for c in report.checks if c.name == failing), None)
    assert check is not None and not check.passed and not report.passed, report.to_dict()


def test_a_run_without_the_planned_release_fails(root, runs):
    """The calibrated plan against the uncalibrated run's record: the release it accounts is missing."""
    out = root / "forged" / "missing"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(root / "without", out)
    shutil.copy(root / "with" / "plan.json", out / "plan.json")
    report = audit_run(out)
    assert not report.passed


# ------------------------------------------------------------------------ the module alone

class _Data:
    """Rows whose logits are known: the model below returns them."""

    def __init__(self, z, y):
        self.z = torch.as_tensor(z, dtype=torch.float64)
        self.label = torch.as_tensor(y, dtype=torch.float32)
        self.ns_cat = self.ns_num = self.s_cat = self.s_num = torch.arange(len(z))

    def __len__(self):
        return self.z.numel()


class _Known(torch.nn.Module):
    def __init__(self, data):
        super().__init__()
        self.data = data
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    def forward(self, ns_cat, ns_num, s_cat, s_num):
        return self.data.z[ns_cat] + self.bias

    def output_bias(self):
        return self.bias


def _phase(n, noise_std, target="positives"):
    plan = build_plan(parse_scenario(plan_text(eps=8.0)))
    par = replace(plan.calibration.params, dataset_size=n, noise_std=noise_std, target=target)
    return dataclasses.replace(plan.calibration, params=par)


def test_exact_release_counts_a_non_finite_logit_as_a_half():
    z = np.array([0.0, np.nan, np.inf, -np.inf])
    data = _Data(z, [1, 0, 1, 0])
    got = exact_release(_Known(data), data, intercept.SHIFTS)
    want = [expit(d) + 0.5 + 1 + 0 for d in intercept.SHIFTS] + [2]
    assert np.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("noise_std", [1e-6, 1.0])
def test_the_trainer_recovers_the_base_rate_on_known_logits(noise_std):
    rng = np.random.default_rng(5)
    z = rng.normal(-3.0, 1.2, 50_000)
    y = (rng.random(z.size) < expit(z + 0.8)).astype(np.float32)  # the model under-predicts by ~e^0.8
    data = _Data(z, y)
    model = _Known(data)
    r = run_calibration(model, data, _phase(z.size, noise_std), randomness=Randomness(1), session=NullSession())
    mean_after = expit(z + float(model.bias.detach())).mean()
    assert r.shift == pytest.approx(float(model.bias.detach())) and not r.clamped
    assert mean_after / y.mean() == pytest.approx(1.0, abs=0.01 if noise_std < 1 else 0.02)


def test_hybrid_target_needs_the_rr_count():
    data = _Data(np.zeros(10), np.ones(10))
    with pytest.raises(InvalidParameterError, match="RR result") as exc:
        run_calibration(_Known(data), data, _phase(10, 1.0, "positives and rr labels"), randomness=Randomness(1),
                        session=NullSession())
    assert "\n" not in str(exc.value)


def test_public_entry_refuses_bad_values():
    good = dict(rows=10, releases=1, release_sha256="a" * 64, coordinates=14, noise_std=1.0, noise_draws=14,
                sensitivity=3.7, seconds=0.0)
    CalibrationRun(**good)
    for key, bad in (("noise_std", float("nan")), ("releases", 0), ("release_sha256", "xyz")):
        with pytest.raises(InvalidParameterError, match=key):
            CalibrationRun(**{**good, key: bad})
