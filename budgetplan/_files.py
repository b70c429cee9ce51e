"""Atomic output: a file is either the old one or the whole new one, never half-written.

One mechanism for every file budgetplan and its trainers write (plans, statements, run
records, plots, synthetic data, checkpoints, persisted labels): the writer fills a fresh
name beside the target (same file system, so ``os.replace`` is atomic), the bytes are
flushed to disk, and only then is the name swapped in. On any failure the temporary file is
removed and the target is untouched.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from budgetplan.errors import InvalidParameterError

__all__ = ["atomic_output", "write_atomic"]


def _checked(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        raise InvalidParameterError(f"output path is a directory: {path}")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidParameterError(f"output directory does not exist: {directory}")
    return path


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path for the writer; on success it replaces ``path``.

    The temporary file is created by the writer itself, so it gets the usual permissions
    (not ``mkstemp``'s 0600).

    Raises:
        InvalidParameterError: ``path`` is a directory, or its directory does not exist
            (checked before anything is written).
    """
    path = _checked(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (ASCII: canonical JSON, statements) to ``path`` atomically."""
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="ascii")
