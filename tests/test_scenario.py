"""Scenario files: strict parsing, every bad input named by its key."""

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.scenario import examples
from budgetplan.scenario.model import Scenario, load_scenario, parse_scenario

BASE = """
[budget]
epsilon = 8.0
delta = 1e-9

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = 1000000

[algorithm]
name = "hybrid"

[rr]
epochs = 2

[dpsgd]
batch_size = 1000
epochs = 1
clipping_norm = 1.0
"""


def edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_every_example_parses():
    for name in examples.names():
        sc = load_scenario(examples.path(name))
        assert sc.name == name
    assert len(examples.names()) >= 8


def test_defaults_and_policy():
    sc = parse_scenario(edit(BASE, "delta = 1e-9", 'delta = "0.1/N"'))
    assert sc.split == "alpha-by-eps" and sc.tower == "frozen" and sc.cap == 1
    assert sc.resolved_delta == pytest.approx(1e-7)
    assert sc.warnings == ()


@pytest.mark.parametrize("old, new, message", [
    ("[budget]", "[budget", "malformed TOML"),
    ("epsilon = 8.0", "epsilon = 8.0\nepsilonn = 1", "unknown key [budget].epsilonn"),
    ("[data]", "colour = 1\n[data]", "unknown key [privacy].colour"),
    ("[data]\ndataset_size = 1000000", "[data]\ndataset_size = 1000000\n[extra]\nx = 1", "unknown key extra"),
    ("epsilon = 8.0", "", "missing required key [budget].epsilon"),
    ('adjacency = "replace-one"', "", "missing required key [privacy].adjacency"),
    ("dataset_size = 1000000", "", "missing required key [data].dataset_size"),
    ('name = "hybrid"', "", "missing required key [algorithm].name"),
    ("clipping_norm = 1.0", "", "missing required key [dpsgd].clipping_norm"),
    ("epsilon = 8.0", "epsilon = nan", "[budget].epsilon must be a finite number > 0, got nan"),
    ("epsilon = 8.0", "epsilon = inf", "[budget].epsilon must be a finite number > 0, got inf"),
    ("epsilon = 8.0", "epsilon = -1.0", "[budget].epsilon must be a finite number > 0, got -1.0"),
    ("delta = 1e-9", "delta = 1.5", "[budget].delta must be in [0, 1), got 1.5"),
    ("delta = 1e-9", 'delta = "N/2"', '[budget].delta must be a number in [0, 1) or "<c>/N"'),
    ("delta = 1e-9", 'delta = "1/N"\ndelta_policy = "strict"', 'which delta_policy = "strict" refuses'),
    ("delta = 1e-9", "delta = 0.0", "[budget].delta must be > 0"),
    ('unit = "impression"', 'unit = "user x time"', "needs [privacy].cap"),
    ('unit = "impression"', 'unit = "impression"\ncap = 4', "contradicts [privacy].unit"),
    ('unit = "impression"', 'unit = "user"\ncap = 0', "[privacy].cap must be an integer >= 1, got 0"),
    ('unit = "impression"', 'unit = "user"\ncap = 2.5', "[privacy].cap must be an integer >= 1, got 2.5"),
    ('adjacency = "replace-one"', 'adjacency = "add-remove"', "must be replace-one for algorithm 'hybrid'"),
    ('adjacency = "replace-one"', 'adjacency = "swap"', "[privacy].adjacency must be one of"),
    ('name = "hybrid"', 'name = "hybrid"\nsplit = "alpha=2"', "alpha must be in [0, 1], got 2.0"),
    ("epochs = 1", "epochs = 1\nsteps = 5", "[dpsgd] needs exactly one of epochs or steps"),
    ("epochs = 1", "epochs = 0", "[dpsgd].epochs must be a finite number > 0, got 0"),
    ("batch_size = 1000", "batch_size = 2000000", "must not exceed [data].dataset_size"),
    ("clipping_norm = 1.0", 'clipping_norm = 1.0\nsampling = "truncated-poisson"', "max_batch_size"),
    ("clipping_norm = 1.0", 'clipping_norm = 1.0\nsampling = "stratified"', "[dpsgd].sampling must be one of"),
    ("[rr]", "[walr]\nfeatures = 3\n[rr]", "[walr] does not apply to algorithm 'hybrid'"),
    ("epochs = 2", "epochs = 2\nvalidation_fraction = 0.6", "[rr].validation_fraction must be at most 0.5"),
    ("epochs = 2", "epochs = 2\nvalidation_fraction = -0.1", "[rr].validation_fraction must be in (0, 1)"),
    ("epochs = 2", "epochs = 2\nvalidation_fraction = nan", "[rr].validation_fraction must be"),
    ("epochs = 2", "epochs = 2\nvalidation_fraction = -0.0", "[rr].validation_fraction must be in (0, 1)"),
    ("epochs = 2", "epochs = 2\nvalidation_fraction = true", "[rr].validation_fraction must be"),
    ("epochs = 2", 'epochs = 2\nvalidation_fraction = 0.1\n[tuning]\nconfigurations = 2', "with a [tuning] table"),
])
def test_bad_scenarios_name_the_key(old, new, message):
    with pytest.raises(InvalidParameterError) as err:
        sc = parse_scenario(edit(BASE, old, new))
        from budgetplan.planning.planner import build_plan

        build_plan(sc)  # split rules and delta > 0 for DP-SGD are checked when planning
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_rr_phase_holds_out_a_tenth_of_the_units_unless_told_otherwise():
    assert parse_scenario(BASE).rr.validation_fraction == 0.1
    assert parse_scenario(edit(BASE, "epochs = 2", "epochs = 2\nvalidation_fraction = 0.25")).rr.validation_fraction \
        == 0.25
    off = parse_scenario(edit(BASE, "epochs = 2", "epochs = 2\nvalidation_fraction = 0"))
    assert off.rr.validation_fraction is None and "validation_fraction" not in off.to_dict()["rr"]
    # a plan's scenario (JSON) without the key is one made before it existed: no held-out part
    assert Scenario.from_dict(off.to_dict()) == off
    assert parse_scenario(edit(BASE, "epochs = 2", "epochs = 2\n[tuning]\nconfigurations = 2")).rr \
        .validation_fraction is None  # a tuned run scores its configurations on a part of its own


def test_a_batch_policy_scales_with_n():
    sc = parse_scenario(edit(BASE, "batch_size = 1000", 'batch_size = "N/50"'))
    assert sc.dpsgd.batch_size == 20_000 and "N/50" not in str(sc.to_dict())  # the plan holds the number
    assert parse_scenario(edit(BASE, "batch_size = 1000", 'batch_size = "N/3e5"')).dpsgd.batch_size == 3
    assert parse_scenario(edit(BASE, "batch_size = 1000", 'batch_size = "N/1e9"')).dpsgd.batch_size == 1
    for bad, message in (('"N/0.5"', "needs c >= 1"), ('"N/-2"', 'an integer >= 1 or "N/<c>"'),
                         ('"n/50"', 'an integer >= 1 or "N/<c>"'), ('"N/50 "', 'an integer >= 1 or "N/<c>"'),
                         ('"N/inf"', 'an integer >= 1 or "N/<c>"')):
        with pytest.raises(InvalidParameterError, match=r"\[dpsgd\].batch_size") as err:
            parse_scenario(edit(BASE, "batch_size = 1000", f"batch_size = {bad}"))
        assert message in str(err.value)
    with pytest.raises(InvalidParameterError, match="counts units"):
        parse_scenario(edit(BASE, "batch_size = 1000", 'batch_size = "N/50"\nsample_by = "unit"'))


def test_split_only_for_hybrid():
    text = edit(edit(BASE, 'name = "hybrid"', 'name = "dpsgd"\nsplit = "paper-v1"'), "[rr]\nepochs = 2\n", "")
    with pytest.raises(InvalidParameterError, match=r"\[algorithm\].split applies to hybrid only"):
        parse_scenario(text)


def test_delta_at_one_over_n_warns():
    sc = parse_scenario(edit(BASE, "delta = 1e-9", 'delta = "1/N"'))
    assert sc.warnings and "not below 1/N" in sc.warnings[0]


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(InvalidParameterError, match="scenario file not found"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[budget]\nepsilon = \n")
    with pytest.raises(InvalidParameterError, match="bad.toml: malformed TOML"):
        load_scenario(bad)


def test_round_trip_dict():
    from budgetplan.scenario.model import Scenario

    sc = parse_scenario(BASE)
    assert Scenario.from_dict(sc.to_dict()) == sc


def test_feature_spec_toml_round_trips():
    from budgetplan.scenario.model import FeatureSpec

    specs = [FeatureSpec(label="y", unit_id="user", nonsensitive_categorical=("a", "b"), sensitive_numeric=("s",)),
             FeatureSpec(label="conv", sensitive_categorical=('odd "name"', "caf\u00e9"))]
    for spec in specs:
        assert parse_scenario_text_with_features(spec.to_toml()) == spec
    assert 'weight = "w"' in FeatureSpec(label="y", weight="w", nonsensitive_numeric=("x",)).to_toml().splitlines()


def parse_scenario_text_with_features(features_toml: str):
    from budgetplan.scenario.model import parse_scenario

    base = """name = "t"
[budget]
epsilon = 1.0
delta = 0.0
[privacy]
adjacency = "replace-one"
unit = "impression"
[data]
dataset_size = 1000
[algorithm]
name = "rr"
[rr]
epochs = 1
batch_size = 10
"""
    return parse_scenario(base + features_toml).features


def test_walr_is_refused_under_add_remove(runner):
    """WALR's descent reads every row's features without noise: only label changes are protected."""
    from budgetplan.cli import cli

    text = edit(examples.text("walr"), 'adjacency = "replace-one"', 'adjacency = "add-remove"')
    with pytest.raises(InvalidParameterError, match="must be replace-one for algorithm 'walr'.*presence"):
        parse_scenario(text)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "walr.toml"
        path.write_text(text)
        out = runner.invoke(cli, ["plan", str(path), "-o", str(Path(tmp) / "plan.json")])
        assert out.exit_code == 2 and "replace-one" in out.stderr and not (Path(tmp) / "plan.json").exists()


def test_a_scenario_validates_itself_whatever_built_it():
    """Python construction goes through the same rules as TOML: dataclasses.replace included."""
    from dataclasses import replace

    from budgetplan.scenario.model import RRShape, Scenario

    s = load_scenario(examples.path("synthetic-hybrid"))
    with pytest.raises(InvalidParameterError, match=r"\[privacy\].cap = 4 contradicts \[privacy\].unit"):
        replace(s, cap=4)
    with pytest.raises(InvalidParameterError, match="algorithm 'rr' needs its \\[rr\\] table"):
        replace(s, algorithm="rr", dpsgd=None, split=None, tower=None, rr=None)
    with pytest.raises(InvalidParameterError, match=r"\[dpsgd\] does not apply to algorithm 'rr'"):
        replace(s, algorithm="rr", split=None, tower=None)
    with pytest.raises(InvalidParameterError, match=r"\[budget\].epsilon must be a finite number > 0, got nan"):
        replace(s, epsilon=float("nan"))
    with pytest.raises(InvalidParameterError, match=r"\[data\].dataset_size must be at most"):
        replace(s, dataset_size=10**18)
    with pytest.raises(InvalidParameterError, match=r"\[dpsgd\].batch_size \(4000\) must not exceed"):
        replace(s, dataset_size=1000)
    with pytest.raises(InvalidParameterError, match=r"\[rr\].epochs must be at most 10,000"):
        RRShape(epochs=10**9)
    with pytest.raises(InvalidParameterError, match="must be replace-one for algorithm 'hybrid'"):
        replace(s, adjacency="add-remove")
    again = Scenario.from_dict(s.to_dict())
    assert again == s and again.warnings == s.warnings
    assert replace(s, split=None).split == "alpha-by-eps"  # hybrid's defaults hold however it is built
