"""Plan files: canonical, hashed, versioned; any edit is caught, nothing is half-written."""

import json

import pytest

from budgetplan.audit.verify import verify_file, verify_plan
from budgetplan.errors import OutputError, PlanMismatchError
from budgetplan.plan import Plan, canonical_json, load_plan, write_atomic
from budgetplan.planning.planner import build_plan
from budgetplan.scenario import examples, load_scenario


@pytest.fixture(scope="module")
def small_plan():
    return build_plan(load_scenario(examples.path("rr-impression")))


@pytest.fixture(scope="module")
def hybrid_plan():
    return build_plan(load_scenario(examples.path("criteo-pctr-hybrid")))


def test_hash_is_sha256_of_canonical_content(small_plan):
    import hashlib

    data = json.loads(small_plan.to_json())
    stored = data.pop("sha256")
    assert stored == hashlib.sha256(canonical_json(data).encode()).hexdigest()
    assert data["schema_version"] == 1
    assert data["versions"]["dp-accounting"] == "0.6.0"


def test_every_single_byte_flip_is_detected(small_plan):
    text = small_plan.to_json()
    raw = text.encode("ascii")
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        try:
            edited = flipped.decode("ascii")
        except UnicodeDecodeError:
            continue
        with pytest.raises(PlanMismatchError):
            Plan.from_json(edited)


def test_whitespace_and_key_order_edits_are_detected(small_plan):
    data = json.loads(small_plan.to_json())
    with pytest.raises(PlanMismatchError, match="not in canonical form"):
        Plan.from_json(json.dumps(data, indent=4, sort_keys=True) + "\n")
    with pytest.raises(PlanMismatchError, match="not in canonical form"):
        Plan.from_json(small_plan.to_json().replace("\n", "\r\n"))


def test_edited_numbers_with_a_recomputed_hash_fail_verify(hybrid_plan, tmp_path):
    import hashlib

    data = json.loads(hybrid_plan.to_json())
    data.pop("sha256")
    data["phases"][1]["parameters"]["noise_multiplier"] *= 0.9          # less noise than planned
    data["phases"][1]["mechanism"]["noise_multiplier"] *= 0.9
    data["phases"][1]["parameters"]["noise_std"] *= 0.9
    data["sha256"] = hashlib.sha256(canonical_json(data).encode()).hexdigest()
    path = tmp_path / "forged.json"
    path.write_text(json.dumps(data, sort_keys=True, indent=2) + "\n")
    load_plan(path)  # integrity holds: the forger recomputed the hash
    report = verify_file(path)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "phases[1] (dpsgd).guarantee.epsilon" in text  # recomputed epsilon differs from the stated one
    assert "exceeds its target" in text or "vs its scenario" in text


def test_inconsistent_parameters_are_named(small_plan):
    import dataclasses

    p = small_plan
    rr = p.phases[0]
    bad = dataclasses.replace(rr, params=dataclasses.replace(rr.params, flip_probability=0.3))
    report = verify_plan(dataclasses.replace(p, phases=(bad,)))
    assert any("parameters.flip_probability" in x for x in report.problems)


def test_unknown_schema_is_refused(small_plan):
    data = json.loads(small_plan.to_json())
    data["schema_version"] = 99
    with pytest.raises(PlanMismatchError, match="schema_version 99 is not one this budgetplan reads"):
        Plan.from_json(json.dumps(data))


def test_not_json(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{not json")
    with pytest.raises(PlanMismatchError, match="p.json: plan is not valid JSON"):
        load_plan(path)


def test_write_atomic_never_leaves_a_half_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")
    import os

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OutputError, match="cannot write .*plan.json: No space left on device"):
        write_atomic(target, "new content")
    monkeypatch.undo()
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left behind
    write_atomic(target, "new content")
    assert target.read_text() == "new content"


def test_atomic_output_writer_failure_leaves_the_old_file(tmp_path):
    from budgetplan.util.fileio import atomic_output

    target = tmp_path / "data.parquet"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_output(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["data.parquet"]


def test_round_trip_every_kind(small_plan, hybrid_plan):
    for p in (small_plan, hybrid_plan, build_plan(load_scenario(examples.path("walr"))),
              build_plan(load_scenario(examples.path("criteo-attribution-user-k10")))):
        assert Plan.from_json(p.to_json()) == p
        assert Plan.from_json(p.to_json()).to_json() == p.to_json()


def test_verify_against_the_signed_off_scenario(tmp_path, runner):
    """A forger moves a sensitive column into the non-sensitive group and re-hashes.

    Only the signed-off scenario shows it.
    """
    import hashlib

    from budgetplan.cli import cli
    from budgetplan.plan import canonical_json
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario import examples, load_scenario

    scenario_path = examples.path("synthetic-hybrid")
    plan = build_plan(load_scenario(scenario_path))
    data = json.loads(plan.to_json())
    features = data["scenario"]["features"]
    features["nonsensitive_categorical"].append(features["sensitive_categorical"].pop(0))
    body = {k: v for k, v in data.items() if k != "sha256"}
    body["sha256"] = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n")
    alone = runner.invoke(cli, ["verify", str(forged)])
    assert alone.exit_code == 0  # internally consistent: no number depends on the column groups
    signed = runner.invoke(cli, ["verify", str(forged), "--scenario", str(scenario_path)])
    assert signed.exit_code == 1 and "scenario.features.sensitive_categorical" in signed.stderr
    honest = tmp_path / "plan.json"
    honest.write_text(plan.to_json())
    assert runner.invoke(cli, ["verify", str(honest), "--scenario", str(scenario_path)]).exit_code == 0
