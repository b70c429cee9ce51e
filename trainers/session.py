"""A run directory while a run writes it: lock, ledger, persisted releases, checkpoints.

Layout of ``runs/NAME/``:
    .lock            held by the one process writing the run
    plan.json        the executed plan, copied at the start
    ledger.jsonl     the write-ahead intent log (``ledger.py``)
    rr_labels.npy    the randomised labels: a release, kept so a resume never re-draws them
    walr_sum.npy     the WALR noisy aggregate, likewise
    calibration_release.npy  the intercept calibration's noisy sums and count, likewise
    checkpoint.pt    model and optimiser state, written after an fsync of the ledger
    private/ledger.jsonl  the DP-SGD batch sizes, when the plan's N is a DP count: they are
                     Binomial(true N, q) draws, so the public ledger holds the intents alone
    model.pt, run.json   written last; checkpoint.pt is removed once run.json is written

A one-shot release whose intent is in the ledger but whose result was never persisted
(the process died in between) cannot be resumed: drawing it again would be a second
release the plan does not account, so the session refuses (fails closed).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.plan import Plan, write_atomic
from budgetplan.record.ledger import RELEASE_FILES, LedgerView
from budgetplan.record.records import PRIVATE_DIR
from budgetplan.util.fileio import atomic_output, remove_stale_temporaries, torch_save
from budgetplan.util.validate import non_negative_int
from trainers.ledger import Ledger, LedgerError, RunLock
from trainers.randomness import Randomness

__all__ = ["Session", "NullSession", "Checkpoint"]

# draws a one-shot release: (the released array, what the ledger notes about it besides its digest)
MakeRelease = Callable[[], tuple[np.ndarray, dict[str, Any]]]


def _sha256(array: np.ndarray) -> str:
    """The digest of a persisted release (its bytes, C order): what the ledger records."""
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


_CHECKPOINT_PHASES = ("rr-done", "dpsgd")


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """What a run directory's ``checkpoint.pt`` holds, to resume an interrupted run from.

    ``phase`` is how far the run got: "rr-done" (a Hybrid's RR phase trained; ``rr_result``
    holds what it did) or "dpsgd" (``step`` DP-SGD steps done, with the ``optimizer`` state;
    a Hybrid's also carries its ``rr_result``). ``model`` is the model's state dict. The file
    holds :meth:`to_state`, the dict form checkpoints have always had, so a checkpoint written
    before this type resumes alike.
    """

    phase: str
    model: Mapping[str, Any]
    step: int | None = None
    optimizer: Mapping[str, Any] | None = None
    rr_result: Any = None

    def __post_init__(self) -> None:
        if self.phase not in _CHECKPOINT_PHASES:
            raise InvalidParameterError(f"checkpoint phase must be one of {list(_CHECKPOINT_PHASES)}, got "
                                        f"{self.phase!r}")
        if not isinstance(self.model, Mapping):
            raise InvalidParameterError(f"checkpoint model must be a state dict, got {type(self.model).__name__}")
        if self.phase == "dpsgd":
            non_negative_int("checkpoint step", self.step)
            if not isinstance(self.optimizer, Mapping):
                raise InvalidParameterError("a DP-SGD checkpoint holds the optimizer state")
        elif self.step is not None or self.optimizer is not None or self.rr_result is None:
            raise InvalidParameterError("an rr-done checkpoint holds the RR phase's result and no DP-SGD state")

    def to_state(self) -> dict[str, Any]:
        """The dict ``checkpoint.pt`` holds (fields that are None are left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_state(cls, state: object) -> Checkpoint:
        """A checkpoint from the dict a file holds, refusing an unknown or missing field by name."""
        if not isinstance(state, Mapping):
            raise InvalidParameterError(f"checkpoint must hold a dict, got {type(state).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise InvalidParameterError(f"checkpoint has an unknown field {unknown[0]!r}")
        for name in ("phase", "model"):
            if name not in state:
                raise InvalidParameterError(f"checkpoint is missing the field {name!r}")
        return cls(**state)

    @property
    def dpsgd_step(self) -> int:
        """The DP-SGD steps this checkpoint has done (0 before the DP-SGD phase)."""
        return (self.step or 0) if self.phase == "dpsgd" else 0


class Session:
    """The durable side of one run directory.

    Args:
        directory: the run directory.
        plan: the executed plan.
        resume: continue an interrupted run (its ledger must exist and name the plan).
        checkpoint_every: DP-SGD steps between checkpoints.
        rows: the rows the data has after capping; noted in the private batch-size ledger
            (each session) when the plan's N is a DP count, for the auditor's sampling test.
        randomness: the run's ``Randomness``. This session draws from ``self.randomness``,
            its streams for this session (``Randomness.for_session``: a resumed run never
            replays an earlier session's draws), and the ledger records its policy, seed and
            session index before any spending of the session (a ``seeds`` line).

    Attributes:
        index: which session of the run this is (0 for the first, k for the k-th resume).
    """

    def __init__(self, directory: str | Path, plan: Plan, *, randomness: Randomness, resume: bool = False,
                 checkpoint_every: int = 200, ledger_sync_every: int = 1, rows: int | None = None) -> None:
        self.dir = Path(directory)
        self._discarded = False
        ledger_path = self.dir / "ledger.jsonl"
        if resume and not ledger_path.exists():
            raise InvalidParameterError(f"nothing to resume in {self.dir}: it has no ledger")

        # Nothing is spent until the ledger says so: a failure up to there (a full disk, a
        # signal) removes what this session created, so a retry starts clean.
        top = self.dir
        while not top.parent.exists():
            top = top.parent
        created = None if self.dir.exists() else top
        self.dir.mkdir(parents=True, exist_ok=True)
        # The lock first: only the process holding it may judge what the directory holds (a
        # ledger another process is writing is not an interrupted run).
        try:
            self.lock = RunLock(self.dir)
        except BaseException:
            _remove(created)
            raise
        try:
            if not resume and (ledger_path.exists() or (self.dir / PRIVATE_DIR / "ledger.jsonl").exists()):
                raise InvalidParameterError(f"{self.dir} holds an interrupted run: resume it, or choose a new --out")
            # Held by us alone now: what a killed writer left half-written here can go.
            remove_stale_temporaries(self.dir)
            if plan.count is not None and rows is None:
                raise InvalidParameterError("a plan whose N is a DP count needs the true row count for its private "
                                            "ledger")
            write_atomic(self.dir / "plan.json", plan.to_json())
            self.ledger = Ledger(ledger_path, plan_sha256=plan.sha256, sync_every=ledger_sync_every)
            self.sizes: Ledger | None = None
            if plan.count is not None:
                assert rows is not None  # refused above
                (self.dir / PRIVATE_DIR).mkdir(exist_ok=True)
                self.sizes = Ledger(self.dir / PRIVATE_DIR / "ledger.jsonl", plan_sha256=plan.sha256,
                                    sync_every=ledger_sync_every)
                if any(e.get("rows") != int(rows) for e in self.sizes.events("rows")):
                    self.sizes.close()
                    self.ledger.close()
                    # said to the data owner only: the true counts are theirs
                    raise InvalidParameterError("the interrupted run sampled from data of another size: resume it "
                                                "on the same data")
                self.sizes.note("rows", rows=int(rows))
        except BaseException:
            self.lock.release()
            _remove(created)
            raise
        self.resumed = resume
        self._created = created
        if resume:
            self.ledger.note("resume")
        self.index = self.ledger.sessions - 1
        self.randomness = randomness.for_session(self.index)
        self.ledger.note("seeds", **self.randomness.ledger_note())
        self.checkpoint_every = max(1, int(checkpoint_every))

    # ------------------------------------------------------------- releases

    def _release(self, phase: str, name: str, make: MakeRelease) -> tuple[np.ndarray, dict[str, Any]]:
        """Load a persisted one-shot release, or intend it, draw it with ``make()`` and persist it."""
        path = self.dir / name
        released = self.ledger.events("released", phase)
        if released:
            data = np.load(path)
            if _sha256(data) != released[-1]["sha256"]:
                raise LedgerError(f"{path} does not match the digest the ledger recorded for it")
            return data, dict(released[-1])
        if self.ledger.count(phase):
            raise LedgerError(f"the {phase} release was interrupted after its intent was logged and before it "
                              "was saved: drawing it again would be a second release; start a new run")
        first = self.unspent()
        try:
            self.ledger.intend(0, phase=phase)
            data, info = make()
            _save_atomic(path, data)
        except Exception:
            # A clean failure (a full disk, a file-size limit) before the draw was saved: it never
            # left this process, so nothing was released. When it was the run's first spending,
            # the run leaves nothing (a signal, by contrast, leaves the ledger as evidence).
            if first:
                self.discard()
            raise
        note = {"phase": phase, "sha256": _sha256(data), **info}
        self.ledger.note("released", **note)
        self.ledger.sync()
        return data, note

    def released(self, phase: str) -> bool:
        """Whether the run has made ``phase``'s one-shot release already (a resumed run reloads it)."""
        return bool(self.ledger.events("released", phase))

    def release(self, phase: str, make: MakeRelease) -> tuple[np.ndarray, dict[str, Any]]:
        """(the release, its ledger note) of a one-shot phase (``RELEASE_FILES``): drawn once, reloaded on resume."""
        return self._release(phase, RELEASE_FILES[phase], make)

    # ---------------------------------------------------------- DP-SGD steps

    def dpsgd_steps_taken(self) -> int:
        """Noisy DP-SGD steps the ledger counts, including any lost to an interruption."""
        return self.ledger.count("dpsgd")

    def ledger_view(self) -> LedgerView:
        """The ledger as a reader sees it now (all sessions of the run)."""
        return self.ledger.view

    def sizes_view(self) -> LedgerView:
        """Where the batch sizes are: the private ledger when the plan's N is a DP count, else the ledger."""
        return self.sizes.view if self.sizes is not None else self.ledger.view

    def intend(self, step: int, batch_size: int | None = None,
               rank_batch_sizes: Sequence[int] | None = None) -> None:
        if self.sizes is None:
            self.ledger.intend(step, phase="dpsgd", batch_size=batch_size, rank_batch_sizes=rank_batch_sizes)
            return
        # The public intent first: it is what counts the step, so a kill between the two
        # lines leaves a size missing (as a torn line would), never a step uncounted.
        self.ledger.intend(step, phase="dpsgd")
        self.sizes.intend(step, phase="dpsgd", batch_size=batch_size, rank_batch_sizes=rank_batch_sizes)

    def note_ranks(self, counts: Sequence[int], what: str = "rows") -> None:
        """A DP-SGD session over several processes: what each rank samples from (its ``rows``, or
        its ``units`` when units are sampled), where the batch sizes are kept."""
        (self.sizes or self.ledger).note("ranks", world_size=len(counts), **{f"rank_{what}": [int(c) for c in counts]})

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.ledger.sync()  # every step the checkpoint reflects is on disk first
        if self.sizes is not None:
            self.sizes.sync()
        with atomic_output(self.dir / "checkpoint.pt") as tmp:
            torch_save(checkpoint.to_state(), tmp)
        self.ledger.note("checkpoint", phase=checkpoint.phase, step=checkpoint.step)

    def load_checkpoint(self) -> Checkpoint | None:
        path = self.dir / "checkpoint.pt"
        if not path.exists():
            return None
        try:
            return Checkpoint.from_state(torch.load(path, weights_only=False))
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"{path}: {exc}") from None

    def unspent(self) -> bool:
        """Whether this run has logged no spending at all (a fresh session before its first intent)."""
        return not self.resumed and not self.ledger.events("intent") and \
            (self.sizes is None or not self.sizes.events("intent"))

    def discard(self) -> None:
        """Remove everything this session wrote, for a run that failed cleanly before spending anything.

        The directory was new or empty (``trainers.outputs.check_out``): it is removed when the
        session created it, emptied otherwise.
        """
        if self._discarded:
            return
        self._discarded = True
        for ledger in (self.ledger, self.sizes):
            if ledger is not None:
                ledger.abandon()
        self.lock.release()
        if self._created is not None:
            _remove(self._created)
            return
        for p in self.dir.iterdir():
            _remove(p) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)

    def close(self) -> None:
        if self._discarded:
            return
        self.ledger.close()
        if self.sizes is not None:
            self.sizes.close()
        self.lock.release()


class NullSession:
    """No run directory (the Python API without ``out_dir``): nothing durable, nothing to resume."""

    resumed = False
    checkpoint_every = 0
    index = 0

    def __init__(self) -> None:
        self._dpsgd = 0

    def release(self, phase: str, make: MakeRelease) -> tuple[np.ndarray, dict[str, Any]]:
        data, info = make()
        return data, {"phase": phase, "sha256": _sha256(np.asarray(data)), **info}

    def dpsgd_steps_taken(self) -> int:
        return 0

    def ledger_view(self) -> None:
        return None

    sizes_view = ledger_view

    def released(self, phase: str) -> bool:
        return False

    def intend(self, step: int, batch_size: int | None = None,
               rank_batch_sizes: Sequence[int] | None = None) -> None:
        self._dpsgd += 1

    def note_ranks(self, counts: Sequence[int], what: str = "rows") -> None:
        pass

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        pass

    def load_checkpoint(self) -> Checkpoint | None:
        return None

    def unspent(self) -> bool:
        return True

    def discard(self) -> None:
        pass

    def close(self) -> None:
        pass


def _remove(directory: Path | None) -> None:
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _save_atomic(path: Path, array: np.ndarray) -> None:
    with atomic_output(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, array)
