"""Run one corpus case in-process and judge it.

A case runs ``budgetplan.cli.cli`` through click's ``CliRunner`` (the real ``Group.main``,
the CLI's one error boundary) with the working directory set to a fresh temporary
directory that holds only the case's inputs. Three outcomes are allowed:

- ``reject``: exit code 1 or 2; stderr is exactly one line starting with ``error:`` (after
  any ``warning:`` or ``progress:`` lines); no exception escaped (no traceback); the working directory is
  exactly as the inputs left it (no new, removed or changed file, no temporary file).
- ``accept``: exit code 0; no exception; every declared output exists and is complete
  (JSON parses, a PNG ends in its IEND chunk, Parquet and CSV read back, a run directory
  holds a loadable ``run.json`` and ``model.pt``); nothing else appeared but the declared
  outputs (and what they contain); no temporary file anywhere; ``--json`` output parses.
- ``interrupted``: a run stopped after it began spending privacy (a signal or a full disk
  while writing its results): exit 1 or 2 and one ``error:`` line as for ``reject``; what
  it leaves is evidence, not output: no temporary file, no ``run.json`` (the run is not
  complete), and every file it did write whole.
- ``clean``: either of ``accept`` or ``reject``, judged as the exit code says. Only for
  valid but extreme inputs whose answer belongs to another module to decide (can the
  accounting engine compute it in bounded memory, or must it refuse?): what is checked is
  that the outcome is clean, whichever it is.

Faults a case may inject (``Case.fault``) go through the one atomic-output path,
``budgetplan.util.fileio``, so what they test is that path and every command's handling of it:

- ``"enospc"``: the disk fills when the written file is committed (``_files._commit``);
- ``"enospc-create"``: the disk is full before the first byte (``_files._create``);
- ``"sigterm"``: SIGTERM arrives in the middle of a write;
- ``"interrupt"``: Ctrl-C (KeyboardInterrupt) in the middle of a write;
- ``"<fault>@<name>"``: that fault, only when the file being committed is called ``<name>``
  (e.g. ``"sigterm@model.pt"``: a run killed while saving its model).

A read-only directory is a ``Dir`` with a mode; when the tests run as root (who may write
anywhere) the refusal the kernel would give is emulated at ``_files._create`` for paths
under a directory whose mode denies writing, so the case tests the same code either way.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path

from click.testing import CliRunner

from trainers.progress import PREFIX as PROGRESS  # long work's lines in a log (stderr is not a terminal here)

__all__ = ["Case", "Text", "Bytes", "Dir", "Artefact", "run_case"]


@dataclass(frozen=True)
class Text:
    """A text file written before the case runs (``newline`` kept exactly as given)."""

    path: str
    text: str


@dataclass(frozen=True)
class Bytes:
    path: str
    data: bytes


@dataclass(frozen=True)
class Dir:
    """A directory, optionally with a mode (e.g. 0o555: read-only; 0o000: no access)."""

    path: str
    mode: int | None = None


@dataclass(frozen=True)
class Artefact:
    """A prebuilt input (see ``artefacts.py``) copied in, optionally edited first.

    ``edit`` maps the artefact's bytes to the bytes to write (for a directory artefact it is
    ``(relative path, edit)``: one file inside the copied directory is rewritten, or removed
    when the edit returns None; or a function of the copied directory, which edits it in place).
    """

    path: str
    name: str
    edit: object = None


@dataclass(frozen=True)
class Case:
    """One bad or extreme input.

    Attributes:
        id: unique, stable, readable (it is the pytest id).
        argv: the arguments after ``budgetplan``.
        expect: ``"reject"`` or ``"accept"``.
        inputs: files and directories to create first (``Text``, ``Bytes``, ``Dir``, ``Artefact``).
        outputs: for ``accept``, the paths the command must have written completely.
        fault: an injected fault (see the module docstring), or None.
        xfail: a reason when the case is known to fail until another branch lands.
        root_ok: False when the case relies on file permissions that root ignores and that
            cannot be emulated (a file we may not *read*): skipped when running as root.
    """

    id: str
    argv: tuple
    expect: str
    inputs: tuple = ()
    outputs: tuple = ()
    fault: str | None = None
    xfail: str | None = None
    root_ok: bool = True

    def __post_init__(self):
        if self.expect not in ("reject", "accept", "interrupted", "clean"):
            raise ValueError(f"{self.id}: expect must be reject, accept, interrupted or clean, got {self.expect!r}")
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))


@dataclass
class Outcome:
    exit_code: int
    stdout: str
    stderr: str
    exception: BaseException | None
    before: dict
    after: dict
    problems: list = field(default_factory=list)


# --------------------------------------------------------------------------- the tree


def _snapshot(root: Path) -> dict:
    """Every path under ``root`` (hidden ones included) -> a digest of its bytes, or "dir"."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = Path(dirpath, d)
            out[str(p.relative_to(root))] = "dir"
        for f in filenames:
            p = Path(dirpath, f)
            try:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                out[str(p.relative_to(root))] = "unreadable"
    return out


def _make_inputs(case: Case, root: Path, artefacts) -> list[tuple[Path, int]]:
    """Create the inputs; returns the (directory, mode) pairs still to apply."""
    modes = []
    for item in case.inputs:
        target = root / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(item, Text):
            target.write_bytes(item.text.encode("utf-8"))
        elif isinstance(item, Bytes):
            target.write_bytes(item.data)
        elif isinstance(item, Dir):
            target.mkdir(parents=True, exist_ok=True)
            if item.mode is not None:
                modes.append((target, item.mode))
        elif isinstance(item, Artefact):
            artefacts.copy(item.name, target, item.edit)
        else:
            raise TypeError(f"{case.id}: unknown input {item!r}")
    return sorted(modes, key=lambda m: -len(m[0].parts))


def _apply_modes(modes) -> None:
    # Deepest first, after everything is written: a read-only directory is filled first.
    for target, mode in modes:
        os.chmod(target, mode)


def _restore_modes(modes) -> None:
    for target, _ in modes:
        os.chmod(target, stat.S_IRWXU)


# ----------------------------------------------------------------------- the faults


def _denied(path: Path) -> bool:
    """Whether the kernel would refuse a non-root process creating ``path``."""
    directory = Path(os.path.abspath(path)).parent
    try:
        mode = directory.stat().st_mode
    except OSError:
        return False
    return not (mode & stat.S_IWUSR and mode & stat.S_IXUSR)


def _install_fault(case: Case, monkeypatch) -> None:
    from budgetplan.util import fileio as _files

    real_create, real_commit = _files._create, _files._commit
    if os.geteuid() == 0:
        def create(path):
            if _denied(path):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real_create(path)
        monkeypatch.setattr(_files, "_create", create)
    if case.fault is None:
        return
    fault, _, only = case.fault.partition("@")

    def hit(path) -> bool:
        return not only or Path(path).name == only

    if fault == "enospc":
        def commit(tmp, path):
            if hit(path):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
            return real_commit(tmp, path)
        monkeypatch.setattr(_files, "_commit", commit)
    elif fault == "enospc-create":
        def create_full(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        monkeypatch.setattr(_files, "_create", create_full)
    elif fault in ("sigterm", "interrupt"):
        def commit_interrupted(tmp, path):
            if hit(path):
                if fault == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                else:
                    raise KeyboardInterrupt
            return real_commit(tmp, path)
        monkeypatch.setattr(_files, "_commit", commit_interrupted)
    else:
        raise ValueError(f"{case.id}: unknown fault {case.fault!r}")


# ------------------------------------------------------------------------ judging

_PNG_END = b"IEND\xaeB`\x82"


def _complete(path: Path) -> str | None:
    """None when the output at ``path`` is whole; else what is wrong with it."""
    if not path.exists():
        return f"declared output {path.name} was not written"
    if path.is_dir():
        if (path / "run.json").exists() or (path / "model.pt").exists():
            from budgetplan.record.records import load_record

            try:
                load_record(path)
            except Exception as exc:  # noqa: BLE001 - any failure means incomplete
                return f"{path.name}/run.json does not load: {exc}"
            import torch

            try:
                torch.load(path / "model.pt", weights_only=False)
            except Exception as exc:  # noqa: BLE001
                return f"{path.name}/model.pt does not load: {exc}"
        return None
    data = path.read_bytes()
    name = path.name.lower()
    try:
        if name.endswith(".json"):
            json.loads(data.decode("ascii"), parse_constant=_no_constants)
        elif name.endswith(".png"):
            if not (data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(_PNG_END)):
                return f"{path.name} is not a whole PNG"
        elif name.endswith((".parquet", ".csv")):
            from trainers.data.loaders import read_table

            read_table(path)
        elif not data:
            return f"{path.name} is empty"
    except Exception as exc:  # noqa: BLE001
        return f"{path.name} does not read back: {exc}"
    return None


def _no_constants(name):
    raise ValueError(f"non-JSON constant {name}")


def _judge(case: Case, out: Outcome, root: Path) -> list[str]:
    if case.expect == "clean":
        from dataclasses import replace

        case = replace(case, expect="accept" if out.exit_code == 0 else "reject")
    problems = _general_problems(out)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    if case.expect in ("reject", "interrupted"):
        problems += _refusal_problems(out, lines)
    if case.expect == "interrupted":
        problems += _interrupted_problems(out, root)
    elif case.expect == "reject":
        problems += _rejected_problems(out)
    else:
        problems += _accepted_problems(case, out, root, lines)
    return problems


def _general_problems(out: Outcome) -> list[str]:
    """What no outcome may show: a traceback, temporary files."""
    problems = []
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        problems.append(f"traceback: {type(out.exception).__name__}: {out.exception}")
    if "Traceback" in out.stderr or "Traceback" in out.stdout:
        problems.append("a traceback was printed")
    temps = [p for p in out.after if p.endswith(".tmp")]
    if temps:
        problems.append(f"temporary files left: {temps}")
    return problems


def _refusal_problems(out: Outcome, lines: list[str]) -> list[str]:
    """A refusal (or an interruption) exits 1 or 2 with exactly one 'error:' line, last."""
    problems = []
    if out.exit_code not in (1, 2):
        problems.append(f"silently accepted: exit {out.exit_code}, expected 1 or 2")
    errors = [line for line in lines if line.startswith("error:")]
    others = [line for line in lines if not line.startswith(("error:", "warning:", PROGRESS))]
    if len(errors) != 1 or others or (lines and not lines[-1].startswith("error:")):
        problems.append(f"stderr is not one 'error:' line: {out.stderr!r}")
    return problems


def _interrupted_problems(out: Outcome, root: Path) -> list[str]:
    """An interrupted run leaves no run.json and only complete files."""
    problems = []
    new = sorted(set(out.after) - set(out.before))
    if any(Path(p).name == "run.json" for p in new):
        problems.append("an interrupted run left a run.json: it reads as complete")
    for rel in new:
        if out.after[rel] != "dir" and rel.endswith((".json", ".pt", ".png", ".parquet")):
            why = _complete(root / rel)
            if why:
                problems.append(why)
    return problems


def _rejected_problems(out: Outcome) -> list[str]:
    """A refusal leaves the directory as it found it."""
    if out.after == out.before:
        return []
    new = sorted(set(out.after) - set(out.before))
    gone = sorted(set(out.before) - set(out.after))
    changed = sorted(p for p in set(out.after) & set(out.before) if out.after[p] != out.before[p])
    return [f"files left behind: new {new}, removed {gone}, changed {changed}"]


def _accepted_problems(case: Case, out: Outcome, root: Path, lines: list[str]) -> list[str]:
    """An accepted input exits 0, writes its declared outputs complete and nothing else, and warns at most."""
    if out.exit_code != 0:
        return [f"refused a valid input: exit {out.exit_code}, stderr {out.stderr.strip()!r}"]
    problems = []
    for rel in case.outputs:
        why = _complete(root / rel)
        if why:
            problems.append(why)
    allowed = set(out.before) | {p for p in out.after
                                 if any(p == o or p.startswith(o.rstrip("/") + "/") for o in case.outputs)}
    extra = sorted(set(out.after) - allowed)
    if extra:
        problems.append(f"undeclared files written: {extra}")
    if "--json" in case.argv or (case.argv[:1] == ("plan",) and not {"-o", "--output"} & set(case.argv)):
        try:
            json.loads(out.stdout, parse_constant=_no_constants)
        except ValueError as exc:
            problems.append(f"--json output is not one JSON object: {exc}")
    if any(not line.startswith(("warning:", PROGRESS)) for line in lines):
        problems.append(f"stderr carries more than warnings: {out.stderr!r}")
    return problems


def run_case(case: Case, root: Path, artefacts, monkeypatch) -> Outcome:
    """Run ``case`` in the empty directory ``root``; the outcome lists every problem found."""
    from budgetplan.cli import cli

    modes = _make_inputs(case, root, artefacts)
    before = _snapshot(root)
    monkeypatch.chdir(root)
    _install_fault(case, monkeypatch)
    unhandled = []
    # Should the CLI not take SIGTERM over, this records it instead of killing the tests.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    try:
        _apply_modes(modes)
        result = CliRunner().invoke(cli, list(case.argv), catch_exceptions=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _restore_modes(modes)
    after = _snapshot(root)
    out = Outcome(result.exit_code, result.stdout, result.stderr, result.exception, before, after)
    out.problems = _judge(case, out, root)
    if unhandled:
        out.problems.append("SIGTERM reached no handler of the CLI")
    return out
