"""The scenario: what a privacy engineer signs off (budget, adjacency, unit, N, algorithm, shapes).

``model`` holds the frozen ``Scenario`` and its TOML reader, ``split_rules`` the language
of Hybrid budget splits, ``examples`` the shipped templates. The public names resolve lazily
(PEP 562), so that the CLI can read the split rules without importing numpy for ``--help``.
"""

from __future__ import annotations

from budgetplan.util.lazy import lazy_exports

_EXPORTS = {name: "budgetplan.scenario.model"
            for name in ("Scenario", "FeatureSpec", "load_scenario", "parse_scenario", "ALGORITHMS")}

__all__ = ["Scenario", "FeatureSpec", "load_scenario", "parse_scenario", "ALGORITHMS"]


__getattr__, __dir__ = lazy_exports("budgetplan.scenario", _EXPORTS, globals(), __all__)
