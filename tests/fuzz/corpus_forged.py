"""Forged run records (``tests/forgeries.py``), each fed to ``budgetplan audit``: every one must be refused.

Each forgery edits a copy of a completed Hybrid run (the ``run-hybrid`` artefact: RR, then
Poisson DP-SGD, drawn from the CSPRNG) as a forger who knows the formats would, re-hashing
and re-chaining what it edits; the plain audit must fail it (exit 1, one ``error:`` line,
nothing written). Forgeries whose check needs more than the run directory are left out,
with the reason.
"""

from __future__ import annotations

from tests.forgeries import FORGERIES
from tests.fuzz.harness import Artefact, Case

__all__ = ["forged_cases"]

# checks that run only with --empirical (the canaries take minutes), so the plain audit does not see them
NEEDS_MORE = {"code that ran"}


def forged_cases() -> list[Case]:
    cases, seen = [], set()
    for name, forge, failing in FORGERIES:
        if failing in NEEDS_MORE or forge in seen:  # one case per forgery (some fail two checks)
            continue
        seen.add(forge)
        case_id = "forged-" + name.replace(" ", "-").replace(":", "")
        cases.append(Case(case_id, ("audit", "run"), "reject", inputs=(Artefact("run", "run-hybrid", forge),)))
    cases.append(Case("forged-none-audit", ("audit", "run", "--json"), "accept",
                      inputs=(Artefact("run", "run-hybrid"),)))
    return cases
