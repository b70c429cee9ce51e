"""The plan: a frozen, hashed document of phases, each with its mechanism and guarantee.

``document`` holds the ``Plan`` type and its file form (canonical JSON, SHA-256, atomic
writes), ``phases`` one typed phase class per kind, ``schema`` the JSON schema of the file.
"""

from budgetplan.plan.document import (
    SCHEMA_VERSION,
    Phase,
    Plan,
    canonical_json,
    current_versions,
    load_plan,
    parse_json,
    write_atomic,
)

__all__ = ["SCHEMA_VERSION", "Phase", "Plan", "load_plan", "write_atomic", "canonical_json", "parse_json",
           "current_versions"]
