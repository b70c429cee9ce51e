"""The typed parts of a plan: unit alternatives and the split choice read strictly and write back unchanged."""

import dataclasses
import json

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.plan.parts import UnitAlternative, unit_alternatives
from budgetplan.scenario.split_rules import SplitChoice, choose_split
from budgetplan.util.typed import from_json_object, to_json, to_json_object

CASES = [
    (UnitAlternative, {"applies": True, "bounding": "eps/K", "flip_probability": 0.4, "note": "pure composition",
                       "per_impression_epsilon": 0.4, "phase": "rr", "unit_delta": 0.0, "unit_epsilon": 4.0}),
    (UnitAlternative, {"applies": True, "bounding": "unit sampling (clip per unit)", "execution": "unit sampling",
                       "expected_contributions": 4096.0, "noise_multiplier": 0.69, "noise_per_contribution": 1.7e-4,
                       "note": "pld", "phase": "dpsgd", "recommendation": "the least noise", "recommended": True,
                       "unit_delta": 3e-9, "unit_epsilon": 1.9}),
    (UnitAlternative, {"applies": False, "bounding": "group privacy (rdp)", "note": "add-remove only",
                       "phase": "dpsgd"}),
    (UnitAlternative, {"applies": True, "bounding": "sensitivity K x Delta", "noise_std": 3.5, "note": "exact",
                       "phase": "walr", "unit_delta": 1e-6, "unit_epsilon": 1.0}),
    (SplitChoice, {"alpha": 0.5, "epsilon": 7.6, "epsilon1": 3.8, "epsilon2": 3.8, "reason": "the table",
                   "rule": "alpha-by-eps"}),
]
IDS = [f"{cls.__name__}-{i}" for i, (cls, _) in enumerate(CASES)]


@pytest.mark.parametrize(("cls", "data"), CASES, ids=IDS)
def test_json_to_type_to_json_is_identical(cls, data):
    value = from_json_object(cls, data, "x")
    assert json.dumps(to_json_object(value), sort_keys=True) == json.dumps(data, sort_keys=True)


@pytest.mark.parametrize(("cls", "data"), CASES, ids=IDS)
def test_unknown_and_missing_fields_are_refused_by_name(cls, data):
    with pytest.raises(InvalidParameterError, match="x has an unknown field 'surplus'"):
        from_json_object(cls, {**data, "surplus": 1}, "x")
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    for name in required:
        with pytest.raises(InvalidParameterError, match=f"x is missing the field '{name}'"):
            from_json_object(cls, {k: v for k, v in data.items() if k != name}, "x")


def test_an_alternative_that_applies_names_exactly_one_knob():
    rr = CASES[0][1]
    with pytest.raises(InvalidParameterError, match=r"names one knob .* has \['per_impression_epsilon', "
                                                    r"'noise_multiplier'\]"):
        from_json_object(UnitAlternative, {**rr, "noise_multiplier": 1.0}, "x")
    with pytest.raises(InvalidParameterError, match="does not apply names no knob"):
        from_json_object(UnitAlternative, {**rr, "applies": False}, "x")
    with pytest.raises(InvalidParameterError, match=r"unit_alternatives\[1\]: applies must be true or false"):
        unit_alternatives("unit_alternatives", [rr, {**rr, "applies": "yes"}])
    assert from_json_object(UnitAlternative, rr, "x").knob == ("per_impression_epsilon", 0.4)


def test_the_split_choice_is_the_rules_and_refuses_an_alpha_outside_0_1():
    choice = choose_split(7.6, "alpha-by-eps")
    assert from_json_object(SplitChoice, to_json(choice), "split") == choice
    with pytest.raises(InvalidParameterError, match="split.alpha"):
        dataclasses.replace(choice, alpha=1.5)


def test_a_plans_tuning_reads_and_writes_back_identically():
    """The tuning accounting of a declared grid (configurations with their phases, the selection) and of plain
    naive tuning: JSON -> TuningAccounting -> JSON, identical; a malformed configuration is refused by name."""
    from budgetplan.plan.tuning import GridEntry, NoisyMax, TuningAccounting, read_tuning
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from tests.test_planner import DPSGD

    for tuning in ("[tuning]\nclipping_norm = [0.5, 2.0]", "[tuning]\nconfigurations = 4"):
        plan = build_plan(parse_scenario(DPSGD.format(unit="impression", cap="", extra="", tuning=tuning)))
        data = plan.content()["tuning"]
        value = read_tuning("tuning", data)
        assert isinstance(value, TuningAccounting) and value == plan.tuning
        assert json.dumps(to_json(value), sort_keys=True) == json.dumps(data, sort_keys=True)
    assert plan.tuning.grid is None and plan.tuning.noisy_max is None
    grid_data = read_tuning("tuning", build_plan(parse_scenario(DPSGD.format(
        unit="impression", cap="", extra="", tuning="[tuning]\nclipping_norm = [0.5, 2.0]"))).content()["tuning"])
    assert isinstance(grid_data.grid[1], GridEntry) and isinstance(grid_data.noisy_max, NoisyMax)
    entry = to_json(grid_data.grid[1])
    with pytest.raises(InvalidParameterError, match=r"tuning\.grid\[1\] is missing the field 'total'"):
        read_tuning("tuning", {**to_json(grid_data), "grid": [to_json(grid_data.grid[0]),
                                                             {k: v for k, v in entry.items() if k != "total"}]})
    with pytest.raises(InvalidParameterError, match=r"tuning\.grid\[0\]\.phases must be a non-empty list"):
        read_tuning("tuning", {**to_json(grid_data), "grid": [{**entry, "phases": []}]})
