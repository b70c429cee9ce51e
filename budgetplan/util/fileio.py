"""Atomic output: a file is either the old one or the whole new one, never half-written.

One mechanism for every file budgetplan and its trainers write (plans, statements, run
records, plots, synthetic data, checkpoints, models, persisted labels): a fresh temporary
name is created beside the target (same file system, so ``os.replace`` is atomic), the
writer fills it, the bytes are flushed to disk, and only then is the name swapped in. On
any failure, an interruption included, the temporary file is removed and the target is
untouched; a failure of the operating system (a read-only directory, a full disk, a name
too long) becomes one ``OutputError`` naming the path and the reason.

A path that is not a plain file is never replaced:

- a device, a FIFO or a socket (``/dev/null``, ``/dev/stdout``, a named pipe), or an open
  descriptor (``/dev/fd/N``, ``/proc/self/fd/N``, however reached) is *written through*:
  the whole output is first written to a private temporary file, then copied into it
  (appended; a FIFO waits for its reader, as ``cat > fifo`` does). Only the copy can fail
  half-way (``/dev/full``: "No space left on device"), as any write to a device can;
- a symlink is followed: its target (a plain file, or a new one when the link dangles) is
  replaced atomically as above, and the link stays a link to it;
- a name ending in ``/`` names a directory, never a file: refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from budgetplan.errors import InvalidParameterError, OutputError

__all__ = ["atomic_output", "write_atomic", "check_writable", "check_not_input", "remove_stale_temporaries",
           "is_temporary", "torch_save", "file_sha256"]

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
    if str(path).endswith(("/", os.sep)) and not Path(path).is_dir():
        raise InvalidParameterError(f"output path ends in '/' (a directory), not a file name: {path}")
    path = Path(path)
    _check_names(path)
    if path.is_dir():
        raise InvalidParameterError(f"output path is a directory: {path}")
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InvalidParameterError(f"output directory does not exist: {directory}")
    return path


def _link_chain(path: Path) -> list[Path]:
    """``path`` and every name its symlinks lead to, in order (at most 40 hops, as the kernel)."""
    chain = [path]
    for _ in range(40):
        try:
            target = os.readlink(chain[-1])
        except OSError:  # not a link (or gone): the chain ends here
            break
        chain.append(Path(os.path.join(os.path.dirname(chain[-1]), target)))
    return chain


def _written_through(path: Path) -> bool:
    """True for a device, FIFO or socket, or an open descriptor (/dev/stdout, /dev/fd/N): never replaced."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # new, or a dangling link: a plain file will be created
        return False
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return True
    # /dev/stdout -> /proc/self/fd/1 -> a plain file the shell opened: write into it, never replace it
    return any(os.path.realpath(hop.parent).startswith("/proc/") for hop in _link_chain(path)[1:])


_DESCRIPTOR = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)|dev)/fd/(\d+)$")


def _descriptor(path: Path) -> int | None:
    """The number N when ``path`` leads to this process's /dev/fd/N or /proc/self/fd/N (/dev/stdout is 1)."""
    for hop in _link_chain(path):
        match = _DESCRIPTOR.match(os.path.normpath(hop))
        pid = hop.parts[2] if len(hop.parts) > 2 and hop.parts[1] == "proc" else "self"
        if match and pid in ("self", "thread-self", str(os.getpid())):
            return int(match.group(1))
    return None


def _write_through(source: Path, path: Path) -> None:
    """Append the bytes of ``source`` to the existing non-plain file ``path`` (no create, no truncate).

    One of this process's open descriptors (/dev/stdout) is written as it is, at its offset,
    so that the output lands where the shell's redirection points, in order with the rest.
    """
    own = _descriptor(path)
    if own is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND) if own is None else own
    try:
        with open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        if own is None:
            os.close(fd)


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
    if _written_through(path):
        with _through(path) as tmp:
            yield tmp
        return
    if path.is_symlink():  # replace the file it points to, keep the link
        path = _checked(os.path.realpath(path))
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


@contextmanager
def _through(path: Path) -> Iterator[Path]:
    """A private temporary file for the writer; once whole, its bytes go into ``path`` (see the module)."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix="budgetplan-"))
    except OSError as exc:
        raise _failure(path, exc) from None
    try:
        tmp = scratch / path.name[:200]
        _create(tmp)
        yield tmp
        _write_through(tmp, path)
    except OSError as exc:
        raise _failure(path, exc) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def torch_save(obj: object, tmp: Path) -> None:
    """``torch.save(obj, tmp)`` for a writer inside ``atomic_output``: a failed write is an ``OSError``.

    torch's zip writer reports a write the operating system refused (a full disk, a file-size
    limit) as a RuntimeError ("unexpected pos ..."), which no caller would take for an
    output failure; it becomes one here, so that atomic_output names the path.

    It writes through an open file: given a path, torch names the archive's folder after the
    file, here the temporary name, so two saves of one state differed in their bytes and a
    seeded run's ``model.pt`` digest changed from run to run.
    """
    import torch

    try:
        with open(tmp, "wb") as fh:
            torch.save(obj, fh)
    except RuntimeError as exc:
        detail = " ".join(str(exc).split())[:120]
        raise OSError(f"the write stopped short (a full disk or a file-size limit?): torch: {detail}") from None


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


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one of our writers' temporary files (left behind only by a killed writer)."""
    return bool(_TEMPORARY.match(name))


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


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, read a block at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
