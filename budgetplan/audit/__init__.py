"""Audit a run: is the guarantee the plan promised true of what actually ran?

``run`` orchestrates the checks of a run directory (``audit_run``); each family of checks
lives in its own module. Checks that need the training data or torch (the keyed data
fingerprint, the empirical lower bounds) live with the trainers (``trainers.audit``).
"""

from budgetplan.audit.run import ALPHA, REACCOUNT_TOLERANCE, AuditReport, Check, audit_run

__all__ = ["Check", "AuditReport", "audit_run", "ALPHA", "REACCOUNT_TOLERANCE"]
