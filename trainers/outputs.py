"""What a run writes and scores at its end: the run directory, the evaluation, the model and record files.

Shared by every way into training (``trainers.run``, ``trainers.tune``, the baseline, the
canary audit), so that none of them imports another's helpers.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

from budgetplan.errors import InvalidParameterError
from budgetplan.record.parts import VOCABULARY_FILE
from budgetplan.record.records import PRIVATE_DIR, RunRecord
from budgetplan.util.fileio import atomic_output, check_writable, file_sha256, is_temporary, torch_save, write_atomic
from trainers.data.fingerprint import new_key, write_key
from trainers.fit import predict
from trainers.metrics import evaluate_model

__all__ = ["INITIAL_MODEL", "CANARY_DATA", "check_out", "fingerprint_keys", "evaluate", "write_run", "save_initial",
           "save_model", "finish_run"]

INITIAL_MODEL = "initial_model.pt"  # under private/, with keep_initial
# a canary run's training data (the owner's rows and the canaries), written before training
CANARY_DATA = Path(PRIVATE_DIR) / "canary_data.parquet"


def check_out(out_dir, *, resume: bool = False) -> Path | None:
    """The run directory, refused if it already holds a record or cannot be written; None without one.

    A new run needs a new or empty directory (a run's failure may empty it again); only
    ``resume`` continues in one that holds an interrupted run. A killed writer's temporary
    files and lock do not count: the session removes them.
    """
    if out_dir is None:
        return None
    if not str(out_dir).strip():
        raise InvalidParameterError("--out is empty: name the run directory to create")
    out = Path(out_dir)
    if (out / "run.json").exists():
        raise InvalidParameterError(f"{out} already holds a run record; choose a new --out")
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out {out} exists and is not a directory")
    if not resume and out.is_dir():
        if (out / "ledger.jsonl").exists() or (out / PRIVATE_DIR / "ledger.jsonl").exists():
            raise InvalidParameterError(f"{out} holds an interrupted run: resume it, or choose a new --out")
        held = sorted(p.name for p in out.iterdir() if not _ours(p))
        if held:
            raise InvalidParameterError(f"--out {out} is not empty (it holds {held[0]!r}): choose a new or empty "
                                        "directory, or --resume the run there")
    check_writable(out)
    return out


def _ours(entry: Path) -> bool:
    """What a new run's directory may already hold: the lock, a killed writer's temporary files, and the
    private directory holding only a canary run's data (``trainers.canary`` writes it before training)."""
    if entry.name == ".lock" or is_temporary(entry.name):
        return True
    return (entry.name == PRIVATE_DIR and entry.is_dir()
            and {q.name for q in entry.iterdir()} <= {CANARY_DATA.name})


def fingerprint_keys(fingerprint_key: bytes | None) -> tuple[bytes, bytes | None]:
    """(the data owner's fingerprint key, the same key if it was made here and must be saved)."""
    if fingerprint_key is not None:
        return fingerprint_key, None
    key = new_key()
    return key, key


def evaluate(model, prep, path, *, truncated: bool) -> tuple[dict, float]:
    """The model's metrics on the held-out data ``prep`` (read from ``path``), and the seconds they took."""
    t0 = time.perf_counter()
    p = predict(model, prep.data, truncated=truncated)
    y = prep.data.label.cpu().numpy()
    metrics = evaluate_model(y, p)
    metrics["rows"] = int(y.size)
    metrics["path"] = str(path)
    return metrics, prep.timings["eval_prepare_seconds"] + time.perf_counter() - t0


def write_run(record: RunRecord, state: dict, out: Path | None, vocabulary: dict | None = None,
              new_key: bytes | None = None) -> RunRecord:
    """Write the model, the key, the private then the public record (last): a directory with run.json is complete.

    The record written (and returned) names the model file by its digest (``model.sha256``),
    and the vocabulary beside it, when there is one, by its own (``model.vocabulary_sha256``).
    """
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        record = save_model(record, state, out)
        if vocabulary is not None:  # non-sensitive values only: needed to encode new data alike
            write_atomic(out / VOCABULARY_FILE, json.dumps(vocabulary, sort_keys=True) + "\n")
            record = replace(record, model=replace(record.model,
                                                   vocabulary_sha256=file_sha256(out / VOCABULARY_FILE)))
        if new_key is not None:
            (out / PRIVATE_DIR).mkdir(exist_ok=True)
            write_key(out / PRIVATE_DIR / "fingerprint.key", new_key)
        finish_run(record, out)
    return record


def save_model(record: RunRecord, state: dict, out: Path) -> RunRecord:
    """Write ``model.pt``; the record, naming it by its digest, so that the audit can tell it is this run's model."""
    with atomic_output(out / "model.pt") as tmp:
        torch_save(state, tmp)
    return replace(record, model=replace(record.model, sha256=file_sha256(out / "model.pt")))


def finish_run(record: RunRecord, out: Path) -> None:
    """Write the records (``run.json`` last), then remove the checkpoint: it exists only while the run is unfinished.

    Removed after run.json is written (an unlink is atomic): a run killed in between keeps a
    checkpoint beside a complete record, never a record-less directory without one.
    """
    record.write(out)
    (out / "checkpoint.pt").unlink(missing_ok=True)


def save_initial(model, out: Path) -> None:
    """The model as initialised, before any phase: ``private/initial_model.pt`` (``trainers.canary``)."""
    (out / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
    with atomic_output(out / PRIVATE_DIR / INITIAL_MODEL) as tmp:
        torch_save(model.state_dict(), tmp)
