"""The scenario: what a privacy engineer signs off (budget, adjacency, unit, N, algorithm, shapes).

``model`` holds the frozen ``Scenario`` and its TOML reader, ``split_rules`` the language
of Hybrid budget splits, ``examples`` the shipped templates.
"""

from budgetplan.scenario.model import ALGORITHMS, FeatureSpec, Scenario, load_scenario, parse_scenario

__all__ = ["Scenario", "FeatureSpec", "load_scenario", "parse_scenario", "ALGORITHMS"]
