"""The run's own evidence beside its record: the model file is the run's, every session's seed policy is the record's.

- ``model file``: ``model.pt`` is there and is the file the record names by its digest
  (``model.sha256``): a model deleted, or swapped for another (a non-private one), fails.
- ``vocabulary file``: ``vocabulary.json`` (the non-sensitive values each row of the model's
  tables stands for, needed to encode new data as the run did) is the file the record names
  by its digest (``model.vocabulary_sha256``): one edited, deleted, or added beside a record
  that names none fails. A record of schema 2 predates the digest: its vocabulary is "not
  recorded", reported and not failed. In a record of schema 3 the digest's absence says the
  run wrote no vocabulary, so a vocabulary here, or a private record whose encoding says the
  non-sensitive columns were counted into one (any model but WALR's, which keeps none), fails.
- ``seed policy``: the write-ahead ledger records, at the start of every session and before
  any of its spending, where that session's draws came from (``seeds``: policy, seed and
  session index, ``trainers.session``). Every session's policy and seed must be the
  record's, each session must draw from its own streams (its index is its place in the
  ledger: a resumed run never replays an earlier session's draws), and a session that spent
  anything must have said so first. A record whose seed policy was edited after the run
  therefore fails, whichever way it was edited.

What the files cannot show is where the draws really came from: records and ledgers are not
signed, so a seeded run whose ledger and record were both rewritten (and re-hashed, re-chained)
to say ``csprng`` reads exactly as a CSPRNG run does. The check's detail says so; only the
process that trained, not its files, can vouch for the CSPRNG.

A seeded run passes ``seed policy`` when its evidence agrees (the seeded mode exists so
that tests and benchmarks reproduce, and what they audit is the mechanics), but it is never
certified as private: its seed is in the public record, so anyone holding the record can
redraw every flip and every noise vector. The check's detail says so and the report
carries ``seeded`` (``AuditReport.seeded``), which the CLI prints beside the verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from budgetplan.audit.report import Check
from budgetplan.errors import BudgetplanError
from budgetplan.plan import Plan
from budgetplan.record.ledger import LedgerView, read_ledger
from budgetplan.record.parts import VOCABULARY_FILE
from budgetplan.record.records import RunRecord
from budgetplan.util.fileio import file_sha256

__all__ = ["model_check", "vocabulary_check", "seeds_check", "ledger_view", "session_problems", "recorded_seeds"]

MODEL_FILE = "model.pt"


def ledger_view(run_dir: Path, plan: Plan) -> LedgerView | None:
    """The run's ledger, or None when it is missing or does not verify (the ``ledger`` check says why)."""
    try:
        return read_ledger(run_dir / "ledger.jsonl", plan_sha256=plan.sha256)
    except BudgetplanError:
        return None


def recorded_seeds(record: RunRecord) -> tuple[Any, Any]:
    """(policy, seed) as the record states them: the one place the audit reads ``seeds``."""
    return record.seeds.policy, record.seeds.seed


def model_check(record: RunRecord, run_dir: Path) -> Check:
    name, path = "model file", run_dir / MODEL_FILE
    named = record.model.sha256
    if not path.is_file():
        return Check(name, False, f"{path} is not here: the run's model, which the guarantee covers, is missing")
    if not isinstance(named, str):
        return Check(name, False, f"the record names no digest of {MODEL_FILE}: the model here cannot be tied to "
                                  "this run (records written before budgetplan named it cannot be audited; re-run)")
    if file_sha256(path) != named:
        return Check(name, False, f"{MODEL_FILE} is not the model the record names (sha256 {named[:12]}...): it was "
                                  "replaced or edited after the run")
    return Check(name, True, f"{MODEL_FILE} is the model the record names (sha256 {named[:12]}...)")


def vocabulary_check(record: RunRecord, run_dir: Path) -> Check:
    """``vocabulary.json`` is the file the record names by its digest, or absent where the record says none was
    written."""
    name, path = "vocabulary file", run_dir / VOCABULARY_FILE
    named = record.model.vocabulary_sha256
    if named is not None:
        if not path.is_file():
            return Check(name, False, f"{path} is not here: the vocabulary the record names (sha256 {named[:12]}...) "
                                      "was deleted, so the model's rows cannot be tied to the values they stand for")
        if file_sha256(path) != named:
            return Check(name, False, f"{VOCABULARY_FILE} is not the vocabulary the record names (sha256 "
                                      f"{named[:12]}...): it was replaced or edited after the run")
        return Check(name, True, f"{VOCABULARY_FILE} is the vocabulary the record names (sha256 {named[:12]}...)")
    if record.schema_version < 3:
        return Check(name, True, f"not recorded: a record of schema {record.schema_version} names no digest of "
                                 f"{VOCABULARY_FILE}" + (", so the one here is not checked" if path.exists() else ""))
    if path.exists():
        return Check(name, False, f"{VOCABULARY_FILE} is here but the record names none: it was added after the run, "
                                  "or the record's digest of it was removed")
    if _counted_vocabulary(record):
        return Check(name, False, f"the private record says the non-sensitive columns were encoded with a "
                                  f"vocabulary, but the record names no {VOCABULARY_FILE} and none is here: it was "
                                  "deleted and the record's digest of it removed")
    return Check(name, True, "the run wrote no vocabulary (hashed or one-hot columns), and none is here")


def _counted_vocabulary(record: RunRecord) -> bool:
    """Whether the private record says the trainer built a vocabulary that it keeps beside the model."""
    if record.private_part is None or record.model.final == "walr":
        return False
    nonsensitive = record.private_part.encoding.get("nonsensitive")
    return isinstance(nonsensitive, Mapping) and nonsensitive.get("encoding") == "vocab"


def session_problems(view: LedgerView, policy: Any = None, seed: Any = None) -> tuple[list[str], set[Any]]:
    """What is wrong with the ledger's per-session seed notes (against ``policy``/``seed`` when given), and the
    policies it records."""
    problems: list[str] = []
    policies: set[Any] = set()
    index, spent = -1, False
    notes: list[dict[str, Any]] = []
    for entry in [*view.entries, {"event": "open"}]:  # a sentinel closes the last session
        event = entry.get("event")
        if event in ("open", "resume"):
            if index >= 0:
                problems += _one_session(index, notes, spent)
            index, notes, spent = index + 1, [], False
        elif event == "seeds":
            notes.append(entry)
            policies.add(entry.get("policy"))
            if policy is not None and (entry.get("policy"), entry.get("seed")) != (policy, seed):
                problems.append(f"session {index} drew under policy {entry.get('policy')!r} with seed "
                                f"{entry.get('seed')!r}; the record says {policy!r} with seed {seed!r}")
        elif event in ("intent", "torn") and not notes:
            spent = True
    if len(policies) > 1:
        problems.append(f"the sessions drew under different policies ({', '.join(sorted(map(str, policies)))})")
    return problems, policies


def _one_session(index: int, notes: list[dict[str, Any]], spent: bool) -> list[str]:
    if spent:
        return [f"session {index} spent privacy before the ledger recorded where its draws came from"]
    if len(notes) > 1:
        return [f"session {index} records its seed policy {len(notes)} times; once is what the trainer writes"]
    if notes and notes[0].get("session") != index:
        return [f"session {index} drew from the streams of session {notes[0].get('session')!r}: a resumed run must "
                "draw from streams of its own, never replay an earlier session's"]
    return []


def seeds_check(record: RunRecord, view: LedgerView | None) -> Check:
    """The record's seed policy is the one every session of the ledger drew under, each from its own streams."""
    name = "seed policy"
    policy, seed = recorded_seeds(record)
    if view is None:
        return Check(name, False, "no readable ledger: the seed policy the sessions drew under cannot be confirmed")
    problems, policies = session_problems(view, policy, seed)
    if not policies:
        problems.append("the ledger records no seed policy: the record's cannot be confirmed")
    sessions = view.sessions
    if problems:
        return Check(name, False, "; ".join(problems))
    if policy == "seeded":
        return Check(name, True, f"seeded (seed {seed}): checked that the ledger records this seed for each of its "
                                 f"{sessions} session(s) before any spending, each on streams of its own; not "
                                 "checked: that the run's draws are the ones this seed makes (the audit does not "
                                 "redraw them). Every draw is reproducible from the seed the record publishes, so "
                                 "this run is not certifiable as private (a debugging run)")
    return Check(name, True, f"csprng: the ledger records, for each of its {sessions} session(s) and before any "
                             "spending, draws from the operating system's CSPRNG, as the record says; what the files "
                             "cannot show is where the draws really came from: records and ledgers are not signed, "
                             "so a seeded run whose ledger and record were both rewritten to say csprng reads the "
                             "same")
