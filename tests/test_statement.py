"""Privacy statements: one golden text per shipped example, and the facts each must state.

The goldens mask only what legitimately varies between installs: the plan hash (it covers
library versions) and the numpy/scipy version numbers, set to a placeholder before rendering.
Regenerate them after an intended wording change with
``BUDGETPLAN_REGEN_GOLDEN=1 python -m pytest tests/test_statement.py`` and review the diff.
"""

import dataclasses
import os
import re
from pathlib import Path

import pytest

from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario import examples, load_scenario, parse_scenario

GOLDEN = Path(__file__).parent / "golden" / "statements"


def mask(text: str) -> str:
    return re.sub(r"Plan sha256: [0-9a-f]{64}", "Plan sha256: <hash>", text)


def _unpinned_as_placeholders(plan):
    # numpy and scipy are not pinned: their versions are set to a placeholder before the
    # statement is wrapped (masking them after wrapping fails when a longer version moves a
    # line break)
    versions = {**plan.versions, "numpy": "<version>", "scipy": "<version>"}
    return dataclasses.replace(plan, versions=versions)


@pytest.mark.parametrize("name", examples.names())
def test_golden_statement(name):
    plan = _unpinned_as_placeholders(build_plan(load_scenario(examples.path(name))))
    text = render_statement(plan)
    assert f"Plan sha256: {plan.sha256}\n" in text
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("BUDGETPLAN_REGEN_GOLDEN"):
        golden.write_text(mask(text))
    assert mask(text) == golden.read_text()


def test_statement_states_what_the_issue_requires():
    plan = build_plan(load_scenario(examples.path("criteo-pctr-hybrid")))
    text = render_statement(plan)
    for needle in ["Privacy unit: impression", "Adjacency: replace-one", "randomized response", "DP-SGD",
                   "basic composition", "dp-accounting 0.6.0", "pessimistic", "Poisson sampling",
                   "Shuffled or fixed-size batches", "intermediate checkpoints", "Hyperparameter tuning: none is",
                   "Data-dependent preprocessing", "Floating point", "CSPRNG", "Plan sha256"]:
        assert needle in text, needle
    assert max(len(line) for line in text.splitlines()) <= 88


def test_declared_tuning_is_named_and_not_listed_as_uncovered():
    text = load_scenario(examples.path("dpsgd-user-level"))
    from dataclasses import replace

    from budgetplan.scenario.model import Tuning

    plan = build_plan(replace(text, tuning=Tuning(configurations=4)))
    out = render_statement(plan)
    assert "Hyperparameter tuning is declared: 4 configurations" in out and "naive" in out
    assert "none is declared" not in out


def test_statement_is_deterministic():
    sc = parse_scenario(examples.text("walr"))
    assert render_statement(build_plan(sc)) == render_statement(build_plan(sc))
