"""Reading a run's write-ahead ledger: one reader for the resuming trainer and the auditor.

Before each noisy DP-SGD step and each one-shot release (RR labels, the WALR aggregate),
the trainer appends an *intent* line to ``ledger.jsonl`` and flushes it; so a run killed at
any point leaves a ledger that counts every step whose result could have left the process.
This module only reads (it never writes, repairs or locks): the writer lives with the
trainer (``trainers.ledger``) and builds on this reader, so both count the same way.

Format: one canonical JSON object per line, each carrying ``seq``, ``prev`` (the previous
line's ``hash``) and its own ``hash`` (sha256 of the line without ``hash``), so an edited,
deleted or reordered line breaks the chain and the ledger is refused. Events:

    open        {plan_sha256}                   first line
    resume      {}                              a later session began
    seeds       {policy, seed, session}         where this session's draws come from, before it spends
    intent      {phase, step[, batch_size]}     before a noisy step or a release
    released    {phase, sha256, ...}            a one-shot release was persisted
    checkpoint  {phase, step}                   model state saved after ``step`` steps

A torn line (the process died mid-write; a later session seals it with a newline) counts
as one more intent of the phase of the last intent before it: the count may only err up.
Garbage written over a complete line is not a torn line: the next line's ``prev`` no longer
matches, so it is caught by the chain. What the chain cannot show is a tail cut off by
someone who also rewrites the record; the record therefore names the ledger's last hash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from budgetplan.errors import BudgetplanError

__all__ = ["GENESIS", "LedgerError", "LedgerView", "digest", "line", "read_ledger", "RELEASE_FILES",
           "register_one_shot_release"]

# The one-shot releases a run directory persists (drawn once, reloaded on resume, checked by
# the audit against the digest the ledger noted), by the ledger's phase name.
RELEASE_FILES: dict[str, str] = {"rr": "rr_labels.npy", "walr": "walr_sum.npy",
                                 "calibration": "calibration_release.npy"}


def register_one_shot_release(phase: str) -> str:
    """Make ``phase`` (a phase kind's name) a one-shot release; returns the file a run directory keeps it in."""
    if not isinstance(phase, str) or not phase.replace("-", "").replace("_", "").isalnum() or phase in RELEASE_FILES:
        raise ValueError(f"one-shot release {phase!r} is not a plain name or is already registered")
    RELEASE_FILES[phase] = f"{phase}_release.npy"
    return RELEASE_FILES[phase]

GENESIS = "0" * 64


class LedgerError(BudgetplanError):
    """The ledger was edited, reordered, is unreadable, or belongs to another plan."""

    exit_code = 1


def line(entry: dict[str, Any]) -> str:
    """The canonical text of a ledger line (without its newline)."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest(entry: dict[str, Any]) -> str:
    """The hash a line carries: sha256 of its canonical text without the ``hash`` field."""
    return hashlib.sha256(line({k: v for k, v in entry.items() if k != "hash"}).encode("ascii")).hexdigest()


@dataclass(frozen=True)
class LedgerView:
    """A verified, read-only view of one ledger.

    Attributes:
        path: the file it was read from.
        entries: the parsed lines in order; a torn line is ``{"event": "torn"}``.
        torn: whether the file ends in an unfinished line (not yet sealed by a later session).
    """

    path: Path
    entries: tuple[dict[str, Any], ...]
    torn: bool

    @property
    def complete(self) -> list[dict[str, Any]]:
        """The lines that parsed (torn ones left out)."""
        return [e for e in self.entries if "hash" in e]

    @property
    def plan_sha256(self) -> str | None:
        first = self.complete[0] if self.complete else {}
        return first.get("plan_sha256") if first.get("event") == "open" else None

    @property
    def head(self) -> str:
        """The hash of the last complete line (``GENESIS`` for an empty ledger)."""
        for entry in reversed(self.entries):
            if "hash" in entry:
                head: str = entry["hash"]  # a verified line's hash (read_ledger checked it)
                return head
        return GENESIS

    def count(self, phase: str) -> int:
        """Intents recorded for ``phase``; a torn line counts for the phase of the intent before it."""
        n, last_phase = 0, None
        for entry in self.entries:
            if entry.get("event") == "intent":
                last_phase = entry.get("phase")
                n += last_phase == phase
            elif entry.get("event") == "torn":
                n += last_phase == phase
        return n

    def events(self, event: str, phase: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("event") == event and (phase is None or e.get("phase") == phase)]

    @property
    def sessions(self) -> int:
        """Sessions that wrote to this ledger: the first, and one per resume."""
        return sum(e.get("event") in ("open", "resume") for e in self.entries)

    def batch_sizes(self, phase: str = "dpsgd") -> list[int]:
        """The batch sizes the intents of ``phase`` recorded (torn lines and older ledgers have none)."""
        return [e["batch_size"] for e in self.events("intent", phase) if isinstance(e.get("batch_size"), int)]

    def steps_lost(self, phase: str = "dpsgd") -> int:
        """Counted steps whose results no later session built on, summed over every interruption.

        At each resume the model restarts from the last checkpoint of ``phase`` (its
        ``step`` counts steps in the run's one numbering) while the count goes on from the
        ledger's: the steps counted since that checkpoint were spent (their noise may have
        left the process) for nothing. Steps already counted as lost at an earlier resume,
        when no checkpoint came after it, are not counted twice.
        """
        lost, counted, saved, floor, last_phase = 0, 0, 0, 0, None
        for entry in self.entries:
            event = entry.get("event")
            if event == "intent":
                last_phase = entry.get("phase")
                counted += last_phase == phase
            elif event == "torn":
                counted += last_phase == phase
            elif event == "checkpoint" and entry.get("phase") == phase and isinstance(entry.get("step"), int):
                saved = entry["step"]
            elif event == "resume":
                lost += counted - max(saved, floor)
                floor = counted
        return lost


def read_ledger(path: str | Path, *, plan_sha256: str | None = None) -> LedgerView:
    """Read and verify ``path``; refuse a broken chain or, given ``plan_sha256``, another plan's ledger.

    Raises:
        LedgerError: the file cannot be read, a line breaks the hash chain, or the ledger
            belongs to another plan.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or exc}") from None
    parts = raw.split(b"\n")
    torn = parts[-1] != b""  # the last write did not finish its line
    entries: list[dict[str, Any]] = []
    prev = GENESIS
    body = parts[:-1] + ([parts[-1]] if torn else [])
    for i, part in enumerate(body):
        if part == b"":
            continue
        try:
            entry = json.loads(part)
        except (json.JSONDecodeError, UnicodeDecodeError):
            # A torn write (sealed by a later session, or the tail). Garbage over a complete
            # line is caught below, by the next line's prev.
            entries.append({"event": "torn"})
            continue
        if not isinstance(entry, dict) or entry.get("prev") != prev or entry.get("hash") != digest(entry):
            raise LedgerError(f"{path}: line {i + 1} breaks the hash chain: the ledger was edited or reordered")
        prev = entry["hash"]
        entries.append(entry)
    view = LedgerView(path=path, entries=tuple(entries), torn=torn)
    if view.complete and view.complete[0].get("event") != "open":
        raise LedgerError(f"{path}: the first line is not the ledger's opening line")
    if plan_sha256 is not None and view.complete and view.plan_sha256 != plan_sha256:
        raise LedgerError(f"{path} belongs to plan {view.plan_sha256!r}, not {plan_sha256!r}")
    return view
