"""Committed benchmark results cannot go stale: each records the settings that produced it,
and those must be what its script would use today.

Every ``benchmarks/results/*.json`` carries a ``settings`` object (benchmarks/harness.py);
the script named there re-parses the recorded command line and says, through its
``settings(args)``, what it would use now, library defaults included. A difference fails the
test with the command that regenerates the file. Nothing is run: only settings are compared.
There is no way to keep a stale file: regenerate it or delete it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
FILES = sorted(RESULTS.glob("*.json"))


def _harness():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import harness

    return harness


def _script(name: str):
    _harness()
    module = f"_benchmark_{Path(name).stem}"
    if module not in sys.modules:
        spec = importlib.util.spec_from_file_location(module, BENCH / name)
        sys.modules[module] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module])
    return sys.modules[module]


def todays_settings(recorded: dict) -> dict:
    script = _script(recorded["script"])
    return script.settings(script.parse_args(list(recorded["argv"])))


def differences(recorded: dict) -> list[str]:
    return _harness().settings_differences(recorded, todays_settings(recorded))


def _rerun(recorded: dict) -> str:
    return " ".join(["python", f"benchmarks/{recorded['script']}", *recorded["argv"]])


def test_there_are_results_to_check():
    names = {p.stem for p in FILES}
    assert {"calibration", "split_grid", "dpsgd_step", "epoch_throughput", "utility_frontier_quick"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_results_match_todays_settings(path):
    data = json.loads(path.read_text())
    assert "settings" in data, f"{path.name} records no settings: re-run its benchmark"
    recorded = data["settings"]
    diff = differences(recorded)
    assert not diff, (f"{path.name} is stale: these settings changed since it was made: {', '.join(diff)}; "
                      f"regenerate it with `{_rerun(recorded)}`")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_results_table_states_the_settings(path):
    recorded = json.loads(path.read_text()).get("settings")
    if recorded is None:
        pytest.skip("checked by test_results_match_todays_settings")
    table = path.with_suffix(".md")
    assert table.exists(), f"{path.name} has no {table.name}"
    assert _harness().settings_markdown(recorded) in table.read_text(), (
        f"{table.name} does not state the settings of {path.name}: re-render it")


# --------------------------------------------------------------------- the check can fail


def _quick_frontier() -> dict:
    return json.loads((RESULTS / "utility_frontier_quick.json").read_text())["settings"]


def _changed_default(monkeypatch, module, name: str, **defaults):
    """Replace ``module.name`` (a settings dataclass) by one whose defaults differ."""
    original = getattr(module, name)
    monkeypatch.setattr(module, name, functools.partial(original, **defaults))


def test_a_changed_trainer_default_makes_the_frontier_stale(monkeypatch):
    import trainers.run

    recorded = _quick_frontier()
    assert differences(recorded) == []
    lr = trainers.run.TrainSettings().lr
    _changed_default(monkeypatch, trainers.run, "TrainSettings", lr=lr * 2)
    assert differences(recorded) == ["training.lr"]


def test_a_changed_dpsgd_default_makes_the_frontier_stale(monkeypatch):
    import trainers.dpsgd

    default = trainers.dpsgd.DPSGDSettings()
    _changed_default(monkeypatch, trainers.dpsgd, "DPSGDSettings", cosine_decay=not default.cosine_decay)
    assert differences(_quick_frontier()) == ["dpsgd_settings.cosine_decay"]


def test_a_changed_data_shape_makes_the_frontier_stale(monkeypatch):
    from trainers.data import synth

    recorded = _quick_frontier()
    name = next(iter(recorded["values"]["shapes"]))
    shape = synth.SHAPES[name]
    monkeypatch.setitem(synth.SHAPES, name, dataclasses.replace(shape, intercept=shape.intercept - 0.5))
    assert differences(recorded) == [f"shapes.{name}.intercept"]


def test_a_changed_planner_default_makes_the_frontier_stale(monkeypatch):
    import budgetplan.scenario.model

    parse = budgetplan.scenario.model.parse_scenario
    monkeypatch.setattr(budgetplan.scenario.model, "parse_scenario",
                        lambda text: dataclasses.replace(parse(text), discretization=2e-4))
    assert differences(_quick_frontier()) == ["scenario.discretization"]


def test_a_changed_frontier_arm_setting_makes_it_stale(monkeypatch):
    from budgetplan.scenario.examples import set_key

    frontier = _script("utility_frontier.py")
    original = frontier.scenario  # every arm's scenario is the template as adapted there
    monkeypatch.setattr(frontier, "scenario", lambda *a, **k: set_key(original(*a, **k), "rr", "batch_size", 512))
    assert differences(_quick_frontier()) == ["scenario.rr.batch_size"]


def test_a_changed_accounting_default_makes_calibration_and_grid_stale(monkeypatch):
    account = importlib.import_module("budgetplan.accounting.account")  # the package re-exports a function so named
    monkeypatch.setattr(account, "DEFAULT_DISCRETIZATION", account.DEFAULT_DISCRETIZATION / 2)
    for name, key in (("calibration", "ours.discretization"), ("split_grid", "discretization")):
        recorded = json.loads((RESULTS / f"{name}.json").read_text())["settings"]
        assert differences(recorded) == [key]


def test_a_changed_script_constant_makes_its_results_stale(monkeypatch):
    recorded = json.loads((RESULTS / "dpsgd_step.json").read_text())["settings"]
    monkeypatch.setattr(_script("dpsgd_step.py"), "SIGMA", 2.0)
    assert differences(recorded) == ["noise_multiplier"]


def test_an_edited_results_file_is_stale(tmp_path):
    recorded = _quick_frontier()
    edited = json.loads(json.dumps(recorded))
    edited["values"]["epsilons"] = [1.0, 3.0]
    del edited["values"]["scenario"]["rr"]["epochs"]
    edited["values"]["training"]["loss"] = "unbiased"
    assert differences(edited) == ["epsilons", "scenario.rr.epochs", "training.loss"]


def test_differences_compare_values_not_provenance():
    h = _harness()
    a = {"script": "x.py", "argv": ["--a"], "commit": "1" * 40, "values": {"n": 3, "f": 1.0, "b": True, "z": None}}
    b = {"script": "x.py", "argv": [], "commit": "2" * 40, "values": {"n": 3.0, "f": 1, "b": True, "z": None}}
    assert h.settings_differences(a, b) == []  # the same settings, whatever command line and commit made them
    assert h.settings_differences(a, {**b, "values": {**b["values"], "b": 1}}) == ["b"]  # a flag is no number
    assert h.settings_differences(a, {**b, "values": {"n": 3, "f": 1.0, "b": True}}) == ["z"]  # absent is no None
    assert h.settings_differences(a, {**b, "script": "y.py"}) == ["script"]


def test_settings_survive_a_json_round_trip():
    recorded = _quick_frontier()
    today = todays_settings(recorded)
    assert json.loads(json.dumps(today))["values"] == today["values"]
    assert today["script"] == "utility_frontier.py" and today["argv"] == recorded["argv"]


def test_a_changed_split_table_re_renders_the_frontier_but_does_not_make_it_stale(monkeypatch):
    """The default rule's column is read from the alpha grid's cells: a new table changes what the
    report says (its ``default_split``), not what was trained."""
    from budgetplan.scenario import split_rules as split

    recorded = _quick_frontier()
    table = split.ALPHA_BY_EPSILON
    monkeypatch.setattr(split, "ALPHA_BY_EPSILON", (dataclasses.replace(table[0], alpha=1.0), *table[1:]))
    assert differences(recorded) == []
    assert todays_settings(recorded)["default_split"]["alpha_by_epsilon"][0]["alpha"] == 1.0
