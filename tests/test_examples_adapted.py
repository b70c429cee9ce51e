"""An example adapted as a user would: only what is asked changes, and the result plans."""

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.scenario import examples
from budgetplan.scenario.model import FeatureSpec, parse_scenario


def test_adapting_sets_only_what_is_asked_and_plans():
    spec = FeatureSpec(label="y", unit_id="u", nonsensitive_categorical=("a",), sensitive_numeric=("b",))
    text = examples.adapted("synthetic-hybrid", epsilon=3, dataset_size=123_456, split="alpha=0.25",
                            tower="fine-tune", features=spec, scenario_name="mine")
    s = parse_scenario(text)
    assert (s.name, s.epsilon, s.dataset_size, s.split, s.tower, s.features) == \
        ("mine", 3.0, 123_456, "alpha=0.25", "fine-tune", spec)
    shipped = parse_scenario(examples.text("synthetic-hybrid"))
    assert s.rr.batch_size == shipped.rr.batch_size and s.dpsgd.epochs == shipped.dpsgd.epochs
    assert s.dpsgd.batch_size == round(123_456 / 50)  # the template's "N/50" follows the new N
    assert build_plan(s).dataset_size == 123_456
    assert examples.adapted("walr") == examples.text("walr")


def test_set_key_adds_a_missing_key_and_refuses_a_missing_table():
    text = examples.set_key("[rr]\nbatch_size = 1\n[dpsgd]\nepochs = 2\n", "rr", "epochs", 7)
    assert text.splitlines()[:3] == ["[rr]", "epochs = 7", "batch_size = 1"]
    with pytest.raises(InvalidParameterError, match=r"no \[walr\] table"):
        examples.set_key(text, "walr", "features", 3)


def test_set_key_drops_the_replaced_lines_comment_with_its_continuation():
    text = ('[algorithm]\nsplit = "alpha-by-eps"   # the default: alpha 0.5 from eps 5, so\n'
            '                         # eps1 = 3.8; below eps 5 plain DP-SGD\n'
            '# a note about the table, not the value\ntower = "frozen"  # kept\n[rr]\nepochs = 5\n')
    out = examples.set_key(text, "algorithm", "split", "alpha=0.75")
    assert out.splitlines()[:4] == ['[algorithm]', 'split = "alpha=0.75"',
                                    '# a note about the table, not the value', 'tower = "frozen"  # kept']
    hashed = examples.set_key('[a]\nname = "x # not a comment"\n   # not under a comment\n', "a", "name", "y")
    assert hashed.splitlines() == ["[a]", 'name = "y"', "   # not under a comment"]


def test_an_adapted_template_has_no_orphaned_comment_lines():
    text = examples.adapted("synthetic-hybrid", split="alpha=0.75")
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("split = "))
    assert lines[at] == 'split = "alpha=0.75"' and not lines[at + 1].lstrip().startswith("#")
