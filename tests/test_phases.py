"""Typed plan phases: strict JSON both ways, validation at construction, dispatch by type."""

import dataclasses
import hashlib
import json

import pytest

from budgetplan.errors import InvalidParameterError, PlanMismatchError
from budgetplan.mechanisms import GaussianRelease
from budgetplan.plan import Plan, canonical_json
from budgetplan.plan.phases import (
    CalibrationPhase,
    DPSGDParams,
    DPSGDPhase,
    RRParams,
    RRPhase,
    WALRPhase,
    phase_from_dict,
    phase_to_dict,
)
from budgetplan.planning.planner import build_plan
from budgetplan.scenario import examples, load_scenario


@pytest.fixture(scope="module")
def plans():
    names = ["synthetic-hybrid", "walr", "rr-impression", "criteo-attribution-user-k5"]
    return {name: build_plan(load_scenario(examples.path(name))) for name in names}


def rehash(data: dict) -> str:
    """A plan file as a forger who knows the format would write it: the hash recomputed."""
    body = {k: v for k, v in data.items() if k != "sha256"}
    body["sha256"] = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    return json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def test_every_phase_round_trips(plans):
    for plan in plans.values():
        for phase in plan.phases:
            assert phase_from_dict(phase_to_dict(phase)) == phase
        assert Plan.from_json(plan.to_json()) == plan


def test_phase_kinds_are_types(plans):
    hybrid = plans["synthetic-hybrid"]
    assert [type(p) for p in hybrid.phases] == [RRPhase, DPSGDPhase, CalibrationPhase]
    assert hybrid.rr is hybrid.phases[0] and hybrid.dpsgd is hybrid.phases[1] and hybrid.walr is None
    assert hybrid.calibration is hybrid.phases[2]
    assert isinstance(plans["walr"].walr, WALRPhase)


@pytest.mark.parametrize("edit, message", [
    (lambda ph: ph["parameters"].update(surprise=1), "unknown field 'surprise'"),
    (lambda ph: ph["parameters"].pop("steps"), "missing the field 'steps'"),
    (lambda ph: ph.pop("guarantee"), "lacks 'guarantee'"),
    (lambda ph: ph.update(extra=True), "unknown key 'extra'"),
    (lambda ph: ph.update(name="dp-sgd"), "name must be one of"),
    (lambda ph: ph["parameters"].update(sampling="stratified"), "sampling must be one of"),
    (lambda ph: ph["parameters"].update(clipping_norm=-1.0), "clipping_norm must be a finite number > 0"),
    (lambda ph: ph["parameters"].update(steps=2.5), "steps must be an integer"),
    (lambda ph: ph["parameters"].update(warm_start=None), "warm_start and nonsensitive_tower go together"),
    (lambda ph: ph.update(mechanism={"type": "GaussianRelease", "noise_std": 1.0, "sensitivity": 1.0}),
     "cannot be accounted as GaussianRelease"),
])
def test_a_forged_phase_is_refused_naming_the_field(plans, edit, message):
    data = json.loads(plans["synthetic-hybrid"].to_json())
    edit(data["phases"][1])
    with pytest.raises(PlanMismatchError, match=message):
        Plan.from_json(rehash(data))


def test_nan_and_infinity_are_refused_in_parameters():
    base = dict(noise_multiplier=1.0, noise_std=5.0, clipping_norm=5.0, sensitivity=10.0, sampling_rate=0.02,
                steps=147, batch_size=4096, epochs=3.0, dataset_size=200000, sampling="poisson", max_batch_size=None,
                cap=1, capping=None, normalise_by="q*N", model="full")
    DPSGDParams(**base)
    for key in ("noise_multiplier", "clipping_norm", "sampling_rate", "epochs"):
        for bad in (float("nan"), float("inf")):
            with pytest.raises(InvalidParameterError, match=key):
                DPSGDParams(**base | {key: bad})


def test_per_count_tables_belong_to_eps_over_k_i_only(plans):
    rr = plans["rr-impression"].rr
    with pytest.raises(InvalidParameterError, match="per-count tables apply to the eps/K_i rule only"):
        dataclasses.replace(rr.params, per_impression_epsilon_by_count=(1.0,), flip_probability_by_count=(0.2,))
    with pytest.raises(InvalidParameterError, match="flip_probability must be at most 0.5"):
        dataclasses.replace(rr.params, flip_probability=0.6)
    with pytest.raises(InvalidParameterError, match="RRParams"):
        dataclasses.replace(rr, params=plans["synthetic-hybrid"].dpsgd.params)
    with pytest.raises(InvalidParameterError, match="cannot be accounted as GaussianRelease"):
        dataclasses.replace(rr, mechanism=GaussianRelease(noise_std=1.0, sensitivity=1.0))
    assert isinstance(rr.params, RRParams)
