"""A fingerprint of the code that ran: sha256 over the sources of budgetplan and trainers.

A run record names it so that an auditor can tell whether the code it tests empirically
(``audit --empirical`` runs the installed trainer code) is the code that produced the run.
Files are read, not imported: fingerprinting never loads torch.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

__all__ = ["code_fingerprint", "PACKAGES"]

PACKAGES = ("budgetplan", "trainers")


@functools.cache
def _package_digest(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return "not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def code_fingerprint() -> dict[str, str]:
    """{package: sha256 of its .py files (relative paths, lengths and bytes, in path order)}."""
    return {name: _package_digest(name) for name in PACKAGES}
