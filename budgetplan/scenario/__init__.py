"""The scenario: what a privacy engineer signs off (budget, adjacency, unit, N, algorithm, shapes).

``model`` holds the frozen ``Scenario`` and its TOML reader, ``split_rules`` the language
of Hybrid budget splits, ``examples`` the shipped templates. The public names resolve lazily
(PEP 562), so that the CLI can read the split rules without importing numpy for ``--help``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {name: "budgetplan.scenario.model"
            for name in ("Scenario", "FeatureSpec", "load_scenario", "parse_scenario", "ALGORITHMS")}

__all__ = ["Scenario", "FeatureSpec", "load_scenario", "parse_scenario", "ALGORITHMS"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'budgetplan.scenario' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
