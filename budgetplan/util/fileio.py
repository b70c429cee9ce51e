"""Atomic output: a file is either the old one or the whole new one, never half-written.

One mechanism for every file budgetplan and its trainers write (plans, statements, run
records, plots, synthetic data, checkpoints, models, persisted labels): a fresh temporary
name is created beside the target (same file system, so ``os.replace`` is atomic), the
writer fills it, the bytes are flushed to disk, and only then is the name swapped in. On
any failure, an interruption included, the temporary file is removed and the target is
untouched; a failure of the operating system (a read-only directory, a full disk, a name
too long) becomes one ``OutputError`` naming the path and the reason.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from budgetplan.errors import InvalidParameterError, OutputError

__all__ = ["atomic_output", "write_atomic", "check_writable", "check_not_input", "remove_stale_temporaries"]

_NAME_MAX = 255  # bytes in one path component on every common file system (ext4, xfs, APFS, NTFS)
_TMP_SUFFIX = ".tmp"


def _check_names(path: Path) -> None:
    """Refuse a path component the file system cannot hold (before ``stat`` trips over it)."""
    for part in path.parts:
        if len(os.fsencode(part)) > _NAME_MAX:
            raise InvalidParameterError(f"a name in the output path is longer than the file system allows "
                                        f"({_NAME_MAX} bytes): {part[:40]}...")


def _checked(path: str | os.PathLike[str]) -> Path:
    if not str(path).strip():
        raise InvalidParameterError("output path is empty")
    path = Path(path)
    _check_names(path)
    if path.is_dir():
        raise InvalidParameterError(f"output path is a directory: {path}")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidParameterError(f"output directory does not exist: {directory}")
    return path


_TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$")


def _temporary(path: Path) -> Path:
    # Short enough for any target name the file system accepts; hidden; unique per writer.
    return path.with_name(f".{path.name[:200]}.{secrets.token_hex(8)}{_TMP_SUFFIX}")


def _create(path: Path) -> None:
    """Create ``path`` empty and new (never another writer's), with the usual permissions."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def _commit(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to disk, then give it the name ``path`` in one step."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _failure(path: Path, exc: OSError) -> OutputError:
    reason = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    return OutputError(f"cannot write {path}: {reason}")


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new, empty temporary path for the writer; on success it replaces ``path``.

    Raises:
        InvalidParameterError: ``path`` is empty, a directory, in a directory that does not
            exist, or a name too long (checked before anything is written).
        OutputError: the operating system refused a write (the message names the path
            and the reason); nothing is left behind.
    """
    path = _checked(path)
    tmp = _temporary(path)
    try:
        _create(tmp)
    except OSError as exc:
        raise _failure(path, exc) from None
    try:
        yield tmp
        _commit(tmp, path)
    except OSError as exc:
        raise _failure(path, exc) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the directory was taken away meanwhile: nothing of ours is left to remove


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically, as UTF-8 (canonical JSON is ASCII, a subset)."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(text.encode("utf-8"))


def check_writable(directory: str | os.PathLike[str]) -> None:
    """Refuse, before any work, a directory that new files cannot be created in.

    ``directory`` need not exist yet: its nearest existing ancestor is probed, where it would
    be created. The probe is a real file created and removed through the same path as every
    output, so it meets the same refusals (permissions, a read-only or full file system).

    Raises:
        InvalidParameterError: ``directory`` is empty or names an existing file.
        OutputError: a file cannot be created there.
    """
    if not str(directory).strip():
        raise InvalidParameterError("output directory is empty")
    target = Path(directory)
    _check_names(target)
    if target.exists() and not target.is_dir():
        raise InvalidParameterError(f"{target} exists and is not a directory")
    probe_in = target
    while not probe_in.exists():
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        raise InvalidParameterError(f"{probe_in} is not a directory, so {target} cannot be created")
    probe = _temporary(probe_in / "probe")
    try:
        _create(probe)
    except OSError as exc:
        raise _failure(target, exc) from None
    probe.unlink(missing_ok=True)


def check_not_input(output: str | os.PathLike[str], *inputs: str | os.PathLike[str] | None) -> None:
    """Refuse an output that is one of the command's inputs: writing it would destroy the input.

    Raises:
        InvalidParameterError: ``output`` names the same file as one of ``inputs`` (links
            and relative spellings included).
    """
    for given in inputs:
        if given is None:
            continue
        try:
            same = os.path.samefile(output, given)
        except OSError:  # one of them does not exist (yet): not the same file
            continue
        if same:
            raise InvalidParameterError(f"the output {output} is the input {given}: writing it would destroy it")


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files a killed writer left in ``directory``; returns their names.

    Only for a directory one process owns (a locked run directory): another writer's
    temporary file there would be removed too.
    """
    removed = []
    for p in Path(directory).glob(f".*{_TMP_SUFFIX}"):
        if not _TEMPORARY.match(p.name):
            continue
        try:
            p.unlink()
            removed.append(p.name)
        except OSError:
            pass
    return removed
