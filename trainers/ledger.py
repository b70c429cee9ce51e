"""Writing the write-ahead ledger of privacy spending, and the lock that keeps one writer per run.

The format, its hash chain and how intents are counted are ``budgetplan.record.ledger``'s: this
writer reads an existing ledger through that same reader (so the resuming trainer and the
auditor count alike), then appends. Before each noisy DP-SGD step (with the step's
Poisson batch size, drawn before any gradient is touched) and before each one-shot
release, an intent line is appended and flushed to the operating system; before any
checkpoint the file is fsynced. A run killed at any point therefore leaves a ledger that
counts every step whose result could have left the process, and a resumed run continues
from its checkpoint with the ledger's count (never fewer) and fresh randomness.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from budgetplan.errors import BudgetplanError
from budgetplan.record.ledger import GENESIS, LedgerError, LedgerView, digest, line, read_ledger

__all__ = ["Ledger", "LedgerError", "RunLock", "LockedError"]


class LockedError(BudgetplanError):
    """Another process holds the run directory."""

    exit_code = 1


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
        existing = read_ledger(self.path, plan_sha256=plan_sha256) if self.path.exists() else None
        self.entries = list(existing.entries) if existing else []
        self.torn = existing.torn if existing else False
        self._head = existing.head if existing else GENESIS
        self._fh = open(self.path, "a", encoding="ascii")  # noqa: SIM115 - held open for the run
        if self.torn:
            # Seal the torn line with a newline so that later lines stay parseable; it was counted.
            self._fh.write("\n")
        if existing is None or not existing.complete:
            self._append({"event": "open", "plan_sha256": plan_sha256})
            self.sync()

    @property
    def view(self) -> LedgerView:
        """What a reader of the file would see now (the lines written so far)."""
        return LedgerView(path=self.path, entries=tuple(self.entries), torn=False)

    def count(self, phase: str) -> int:
        return self.view.count(phase)

    def events(self, event: str, phase: str | None = None) -> list[dict]:
        return self.view.events(event, phase)

    @property
    def sessions(self) -> int:
        return self.view.sessions

    # ------------------------------------------------------------------ writing

    def _append(self, fields: dict) -> dict:
        entry = {"seq": len(self.entries), "prev": self._head, **fields}
        entry["hash"] = self._head = digest(entry)
        self._fh.write(line(entry) + "\n")
        self._fh.flush()
        self.entries.append(entry)
        return entry

    def intend(self, step: int, phase: str = "dpsgd", batch_size: int | None = None,
               rank_batch_sizes=None) -> None:
        """Record the intent to take noisy step ``step`` of ``phase`` (before taking it).

        ``rank_batch_sizes``: in a run over several processes, each rank's part of the
        batch, in rank order (they add up to ``batch_size``).
        """
        fields: dict = {"event": "intent", "phase": phase, "step": int(step)}
        if batch_size is not None:
            fields["batch_size"] = int(batch_size)
        if rank_batch_sizes is not None:
            fields["rank_batch_sizes"] = [int(b) for b in rank_batch_sizes]
        self._append(fields)
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

    def abandon(self) -> None:
        """Close without syncing, for a ledger about to be removed (a full disk's errors are moot then)."""
        try:
            self._fh.close()
        except OSError:
            pass  # the buffered tail could not be written; the file is closed all the same


class RunLock:
    """An exclusive, non-blocking lock on a run directory (released when the process ends)."""

    def __init__(self, directory: str | Path):
        self.path = Path(directory) / ".lock"
        self._fh = open(self.path, "a+")
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.close()
            raise LockedError(f"another process is writing the run in {directory}") from None
        try:
            same = os.path.samestat(os.fstat(self._fh.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it as we opened it (see release): that holder was there first
            self._fh.close()
            raise LockedError(f"another process is writing the run in {directory}") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(str(os.getpid()))
        self._fh.flush()

    def release(self) -> None:
        """Unlock, and remove the lock file first, so that no failure leaves a stale one behind.

        Removed while still held: a process that opened the old file meanwhile finds, once it
        gets the lock, that the name no longer leads to it, and refuses (``__init__``).
        """
        if not self._fh.closed:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass  # a read-only directory by now: the lock is released all the same
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
