"""Accounting: the (epsilon, delta) a mechanism costs under an adjacency and a privacy unit.

``account`` is the entry point; the closed forms (``rr``, ``gaussian``, ``group``), the fast
PLD engine (``fastpld``) and the guarded peer back-ends (``backends``) sit behind it.
"""

from budgetplan.accounting.account import DEFAULT_DISCRETIZATION, METHODS, account, account_phases
from budgetplan.accounting.guarantee import Guarantee, library_versions

__all__ = ["account", "account_phases", "Guarantee", "library_versions", "METHODS", "DEFAULT_DISCRETIZATION"]
