"""The write-ahead ledger, the run lock, and resuming a killed run without under-counting."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from budgetplan.planning.planner import build_plan
from budgetplan.record.records import load_record
from budgetplan.scenario.model import parse_scenario
from trainers.data.synth import SYNTH_FEATURES, synthesize
from trainers.demo import demo_scenario
from trainers.ledger import Ledger, LedgerError, LockedError, RunLock
from trainers.run import RunOptions, TrainSettings, execute_plan

PLAN = "a" * 64


def test_chain_counts_and_reopen(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path, plan_sha256=PLAN)
    for step in range(5):
        led.intend(step)
    led.intend(0, phase="rr")
    led.close()
    again = Ledger(path, plan_sha256=PLAN)
    assert again.count("dpsgd") == 5 and again.count("rr") == 1 and again.sessions == 1
    again.close()


def test_torn_tail_counts_as_one_more_intent(tmp_path):
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path, plan_sha256=PLAN)
    led.intend(0)
    led.close()
    with open(path, "a") as fh:
        fh.write('{"event":"intent","pha')  # the process died mid-write
    again = Ledger(path, plan_sha256=PLAN)
    assert again.torn and again.count("dpsgd") == 2
    again.intend(2)  # later lines stay valid after the torn one is sealed
    again.close()
    third = Ledger(path, plan_sha256=PLAN)
    assert third.count("dpsgd") == 3
    third.close()


@pytest.mark.parametrize("edit", ["delete", "swap", "change"])
def test_edited_ledger_fails_closed(tmp_path, edit):
    path = tmp_path / "ledger.jsonl"
    led = Ledger(path, plan_sha256=PLAN)
    for step in range(4):
        led.intend(step)
    led.close()
    lines = path.read_text().splitlines(keepends=True)
    if edit == "delete":
        del lines[2]
    elif edit == "swap":
        lines[2], lines[3] = lines[3], lines[2]
    else:
        entry = json.loads(lines[2])
        entry["step"] = 99
        lines[2] = json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n"
    path.write_text("".join(lines))
    with pytest.raises(LedgerError, match="hash chain"):
        Ledger(path, plan_sha256=PLAN)


def test_ledger_of_another_plan_is_refused(tmp_path):
    Ledger(tmp_path / "l.jsonl", plan_sha256=PLAN).close()
    with pytest.raises(LedgerError, match="belongs to plan"):
        Ledger(tmp_path / "l.jsonl", plan_sha256="b" * 64)


def test_second_writer_is_refused(tmp_path):
    first = RunLock(tmp_path)
    with pytest.raises(LockedError, match="another process"):
        RunLock(tmp_path)
    first.release()
    RunLock(tmp_path).release()


# ----------------------------------------------------------- kill and resume

N_ROWS = 3000


@pytest.fixture(scope="module")
def dp_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    pq.write_table(synthesize(N_ROWS, 600, 2), root / "train.parquet")
    text = demo_scenario(epsilon=3.0, dataset_size=N_ROWS, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', 'name = "hybrid"\nsplit = "alpha=0.5"').replace("delta = 0.0", "delta = 1e-6")
    text += "\n[dpsgd]\nbatch_size = 30\nsteps = 400\nclipping_norm = 1.0\n"
    plan = build_plan(parse_scenario(text))
    (root / "plan.json").write_text(plan.to_json())
    return root, plan


def _intents(path):
    try:
        return sum('"event":"intent"' in line and '"phase":"dpsgd"' in line for line in open(path))
    except FileNotFoundError:
        return 0


def test_killed_run_resumes_with_the_ledger_count(dp_setup, tmp_path):
    root, plan = dp_setup
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "budgetplan", "train", str(root / "plan.json"), "--data",
           str(root / "train.parquet"), "--out", str(out), "--embedding-dim", "4", "--checkpoint-every", "10",
           "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.time() + 120
    while _intents(out / "ledger.jsonl") < 37 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _intents(out / "ledger.jsonl")
    assert 0 < before < 400 and not (out / "run.json").exists()
    counted = Ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)  # a torn last line counts too
    taken = counted.count("dpsgd")
    counted.close()
    assert taken >= before
    rec = execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=4),
                                                                resume=True))
    dp = next(p for p in rec.phases if p.name == "dpsgd")
    led = Ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)
    assert led.count("dpsgd") == dp.steps_executed == 400  # never more than planned, never fewer counted
    assert dp.steps_this_session == 400 - taken  # fresh steps only for what the ledger had not counted
    assert dp.sessions == 2 and dp.steps_lost_to_interruptions >= 0
    assert rec.phases[0].name == "rr"  # the RR labels were not drawn again
    assert len(led.events("released", "rr")) == 1
    led.close()
    assert load_record(out).sha256 == rec.sha256


def _train(root, out, *, resume):
    cmd = [sys.executable, "-m", "budgetplan", "train", str(root / "plan.json"), "--data",
           str(root / "train.parquet"), "--out", str(out), "--embedding-dim", "4", "--checkpoint-every", "10",
           "--json"] + (["--resume"] if resume else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_ten_kills_at_random_points_then_the_audit_passes(dp_setup, tmp_path):
    """kill -9 at random points of the DP-SGD phase, ten times; every state audits clean, and so does the end."""
    import random

    from budgetplan.audit import audit_run
    from budgetplan.record.ledger import read_ledger

    root, plan = dp_setup
    out = tmp_path / "run"
    rng = random.Random(20261122)
    for round_ in range(10):
        proc = _train(root, out, resume=round_ > 0)
        target = _intents(out / "ledger.jsonl") + rng.randint(3, 30)
        deadline = time.time() + 120
        while _intents(out / "ledger.jsonl") < target and time.time() < deadline and proc.poll() is None:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.02))  # anywhere within a step: sampling, clipping, a checkpoint write
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not (out / "run.json").exists()
        interrupted = audit_run(out)
        assert interrupted.status == "interrupted" and interrupted.nothing_to_certify, interrupted.to_dict()
    rec = execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=4),
                                                                resume=True))
    assert not list(out.glob(".*.tmp"))
    view = read_ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)
    dp = next(p for p in rec.phases if p.name == "dpsgd")
    assert dp.sessions == view.sessions == 11 and dp.steps_executed == 400
    assert dp.steps_lost_to_interruptions == view.steps_lost() > 0
    assert dp.batch_sizes_observed >= 400 - 11  # at most one torn intent per session lacks its size
    report = audit_run(out)
    assert report.passed, [c for c in report.checks if not c.passed]


def test_concurrent_writer_is_refused(dp_setup, tmp_path):
    root, plan = dp_setup
    out = tmp_path / "run"
    out.mkdir()
    held = RunLock(out)
    try:
        with pytest.raises(LockedError):
            execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out,
                                                                  settings=TrainSettings(embedding_dim=4)))
    finally:
        held.release()


def test_interrupted_release_fails_closed(dp_setup, tmp_path):
    root, plan = dp_setup
    out = tmp_path / "run"
    out.mkdir()
    led = Ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)
    led.intend(0, phase="rr")  # intent logged, then the process died before saving the labels
    led.close()
    with pytest.raises(LedgerError, match="second release"):
        execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=4),
                                                              resume=True))


def test_fresh_run_refuses_an_interrupted_directory(dp_setup, tmp_path):
    from budgetplan.errors import InvalidParameterError

    root, plan = dp_setup
    out = tmp_path / "run"
    out.mkdir()
    Ledger(out / "ledger.jsonl", plan_sha256=plan.sha256).close()
    with pytest.raises(InvalidParameterError, match="interrupted run"):
        execute_plan(plan, root / "train.parquet", RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=4)))


def test_a_released_lock_leaves_no_file_and_a_removed_one_is_not_taken(tmp_path):
    from trainers.ledger import LockedError, RunLock

    lock = RunLock(tmp_path)
    assert (tmp_path / ".lock").exists()
    with pytest.raises(LockedError):
        RunLock(tmp_path)
    lock.release()
    assert not (tmp_path / ".lock").exists()  # never stale
    again = RunLock(tmp_path)  # and free to take
    again.release()


def test_each_session_of_a_seeded_run_draws_from_its_own_streams():
    from trainers.randomness import Randomness

    first = Randomness(7)
    assert first.for_session(0) is first  # a run never resumed draws exactly as before
    draws = [Randomness(7, stream=s).for_session(k).uniform_u64(4).tolist() for s in (0, 1) for k in (0, 1, 2)]
    assert len({tuple(d) for d in draws}) == 6  # every (rank, session) pair its own stream
    assert Randomness(7).for_session(2).uniform_u64(4).tolist() == Randomness(7, session=2).uniform_u64(4).tolist()


def test_a_resumed_seeded_run_does_not_replay_its_draws(dp_setup, tmp_path, monkeypatch):
    """Interrupted after 12 steps and resumed: steps 12-23 once drew exactly the batch sizes of steps 0-11."""
    import re

    from budgetplan.audit import audit_run
    from budgetplan.record.ledger import read_ledger
    from trainers import session as session_mod

    root, _ = dp_setup
    text = demo_scenario(epsilon=3.0, dataset_size=N_ROWS, spec=SYNTH_FEATURES, epochs=1).replace(
        'name = "rr"', 'name = "dpsgd"').replace("delta = 0.0", "delta = 1e-6")
    text = re.sub(r"\[rr\]\n(.+\n)*?\n", "[dpsgd]\nbatch_size = 30\nsteps = 40\nclipping_norm = 1.0\n\n", text)
    plan = build_plan(parse_scenario(text))  # DP-SGD alone: a replayed stream replays its batch sizes exactly
    out = tmp_path / "run"
    original = session_mod.Session.intend

    def dying(self, step, batch_size=None, rank_batch_sizes=None):
        original(self, step, batch_size, rank_batch_sizes)
        if step == 11:
            raise KeyboardInterrupt  # killed after the intent of step 12 was logged

    options = RunOptions(out_dir=out, settings=TrainSettings(embedding_dim=4), seed=7, checkpoint_every=6)
    monkeypatch.setattr(session_mod.Session, "intend", dying)
    with pytest.raises(KeyboardInterrupt):
        execute_plan(plan, root / "train.parquet", options)
    monkeypatch.setattr(session_mod.Session, "intend", original)
    assert (out / "checkpoint.pt").exists()
    execute_plan(plan, root / "train.parquet", RunOptions(**{**options.__dict__, "resume": True}))
    view = read_ledger(out / "ledger.jsonl", plan_sha256=plan.sha256)
    sizes = view.batch_sizes()
    assert len(sizes) == 40 and sizes[12:24] != sizes[:12]
    assert [(e["policy"], e["seed"], e["session"]) for e in view.events("seeds")] == [("seeded", 7, 0),
                                                                                        ("seeded", 7, 1)]
    assert not (out / "checkpoint.pt").exists()  # it exists only while the run is unfinished
    report = audit_run(out)
    assert report.passed and report.seeded, report.failing()
    seeds = next(c for c in report.checks if c.name == "seed policy")
    assert "2 session(s) before any spending, each on streams of its own" in seeds.detail
    assert "not certifiable" in seeds.detail
