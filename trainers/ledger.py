"""A write-ahead ledger of privacy spending, and the lock that keeps one writer per run.

Before each noisy DP-SGD step, and before each one-shot release (RR labels, the WALR
aggregate), the trainer appends an intent line to ``ledger.jsonl`` in the run directory
and flushes it to the operating system; before any checkpoint is written it is fsynced.
A run killed at any point therefore leaves a ledger that counts every step whose result
could have left the process, and a resumed run continues from its checkpoint with the
ledger's count (never fewer) and fresh randomness.

Every line is canonical JSON carrying the sha256 of the previous line, so an edited or
reordered ledger is detected and refused (fails closed). A torn last line (the process
died mid-write) is counted as one more intent of the phase it was writing: the count can
only go up, never down.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from budgetplan.errors import BudgetplanError

__all__ = ["Ledger", "LedgerError", "RunLock", "LockedError"]

_GENESIS = "0" * 64


class LedgerError(BudgetplanError):
    """The ledger was edited, reordered or belongs to another plan: the run cannot continue."""

    exit_code = 1


class LockedError(BudgetplanError):
    """Another process holds the run directory."""

    exit_code = 1


def _line(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _digest(entry: dict) -> str:
    return hashlib.sha256(_line({k: v for k, v in entry.items() if k != "hash"}).encode("ascii")).hexdigest()


class Ledger:
    """The append-only intent log of one run directory.

    Args:
        path: the ledger file (``<run>/ledger.jsonl``).
        plan_sha256: the plan this run executes; an existing ledger must name the same.
        sync_every: fsync after this many intents (1: every step); the ledger is always
            fsynced before a checkpoint and at the end.
    """

    def __init__(self, path: str | Path, *, plan_sha256: str, sync_every: int = 1):
        self.path = Path(path)
        self.sync_every = max(1, int(sync_every))
        self._unsynced = 0
        self.entries, self.torn = self._read() if self.path.exists() else ([], False)
        if self.entries and self.entries[0].get("plan_sha256") != plan_sha256:
            raise LedgerError(f"{self.path} belongs to plan {self.entries[0].get('plan_sha256')!r}, not "
                              f"{plan_sha256!r}")
        self._fh = open(self.path, "a", encoding="ascii")
        if self.torn:
            # Seal the torn line with a newline so that later lines stay parseable; it was counted.
            self._fh.write("\n")
        if not self.entries:
            self._append({"event": "open", "plan_sha256": plan_sha256})
            self.sync()

    # ------------------------------------------------------------------ reading

    def _read(self) -> tuple[list[dict], bool]:
        parts = self.path.read_bytes().split(b"\n")
        torn = parts[-1] != b""  # the last write did not finish its line
        entries, prev = [], _GENESIS
        for i, part in enumerate(parts[:-1] + ([parts[-1]] if torn else [])):
            if part == b"":
                continue
            try:
                entry = json.loads(part)
            except (json.JSONDecodeError, UnicodeDecodeError):
                # A torn write (sealed by a later session, or the tail): counted as an intent.
                # Garbage written over a real line is caught by the next line's hash chain.
                entries.append({"event": "torn"})
                continue
            if not isinstance(entry, dict) or entry.get("prev") != prev or entry.get("hash") != _digest(entry):
                raise LedgerError(f"{self.path}: line {i + 1} breaks the hash chain: the ledger was edited or "
                                  "reordered")
            prev = entry["hash"]
            entries.append(entry)
        return entries, torn

    @property
    def _prev(self) -> str:
        for entry in reversed(self.entries):
            if "hash" in entry:
                return entry["hash"]
        return _GENESIS

    def count(self, phase: str) -> int:
        """Intents recorded for ``phase``; a torn line counts for the phase written before it."""
        n, last_phase = 0, None
        for entry in self.entries:
            if entry.get("event") == "intent":
                last_phase = entry.get("phase")
                n += last_phase == phase
            elif entry.get("event") == "torn":
                n += last_phase == phase
        return n

    def events(self, event: str, phase: str | None = None) -> list[dict]:
        return [e for e in self.entries if e.get("event") == event and (phase is None or e.get("phase") == phase)]

    @property
    def sessions(self) -> int:
        return sum(e.get("event") in ("open", "resume") for e in self.entries)

    # ------------------------------------------------------------------ writing

    def _append(self, fields: dict) -> dict:
        entry = {"seq": len(self.entries), "prev": self._prev, **fields}
        entry["hash"] = _digest(entry)
        self._fh.write(_line(entry) + "\n")
        self._fh.flush()
        self.entries.append(entry)
        return entry

    def intend(self, step: int, phase: str = "dpsgd") -> None:
        """Record the intent to take noisy step ``step`` of ``phase`` (before taking it)."""
        self._append({"event": "intent", "phase": phase, "step": int(step)})
        self._unsynced += 1
        if self._unsynced >= self.sync_every:
            self.sync()

    def note(self, event: str, **fields) -> None:
        """Record a non-spending event (a resume, a release's digest, a checkpoint)."""
        self._append({"event": event, **fields})

    def sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._unsynced = 0

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()


class RunLock:
    """An exclusive, non-blocking lock on a run directory (released when the process ends)."""

    def __init__(self, directory: str | Path):
        import fcntl

        self.path = Path(directory) / ".lock"
        self._fh = open(self.path, "a+")
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise LockedError(f"another process is writing the run in {directory}") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()

    def release(self) -> None:
        import fcntl

        if not self._fh.closed:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
