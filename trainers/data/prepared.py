"""A prepared data directory: Parquet shards and the ``manifest.json`` that says what was done to them.

``budgetplan data cap`` and ``data split`` write one (split: one per side); the trainer reads
one in place of a data file and reconciles it with the plan (N, K). The manifest is written
last and atomically, so a directory without one is not a prepared directory, whatever
shards it holds: a run killed half-way leaves nothing a trainer would take for finished
work. The manifest lists every shard with its row count, checked against the shards'
Parquet footers when it is read (a shard swapped, truncated or added afterwards is refused).

The manifest never holds the key, only its public id (``trainers.data.fingerprint.key_id``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError
from budgetplan.util.fileio import check_writable, write_atomic
from trainers.data.loaders import list_shards

__all__ = ["MANIFEST", "FORMAT", "Output", "write_manifest", "read_manifest", "is_prepared", "shard_name", "reconcile",
           "verified_cap"]

MANIFEST = "manifest.json"
FORMAT = "budgetplan-prepared"
VERSION = 1
_REQUIRED = ("format", "version", "kind", "rows", "rows_in", "units", "cap", "rule", "unit_id", "key_id", "engine",
             "shards")


def shard_name(i: int) -> str:
    return f"part-{i:05d}.parquet"


def is_prepared(path) -> bool:
    """Whether ``path`` is a directory with a manifest (a finished prepared directory)."""
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


class Output:
    """The output directory of a preparation: refused unless new or empty; removed again on failure.

    ``with Output(out) as o:`` creates the directory; an exception inside removes everything
    this run put there (and the directory, when this run created it), so bad input found
    late leaves nothing behind.
    """

    def __init__(self, out, *, option: str = "--out"):
        if not str(out).strip():
            raise InvalidParameterError(f"{option} is empty: name the directory to create")
        self.path = Path(out)
        if self.path.exists():
            if not self.path.is_dir():
                raise InvalidParameterError(f"{option} {self.path} exists and is not a directory")
            if any(self.path.iterdir()):
                raise InvalidParameterError(f"{option} {self.path} is not empty: choose a new directory")
        check_writable(self.path)
        self._created = False

    def __enter__(self) -> Output:
        self._created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if kind is None:
            return
        if self._created:
            shutil.rmtree(self.path, ignore_errors=True)
        else:  # it was empty before us: empty it again
            for p in self.path.iterdir():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def write_manifest(directory, manifest: dict) -> dict:
    """Count the shards of ``directory`` from their footers, check them against ``manifest["rows"]``, write it last.

    ``manifest`` has every field but ``shards``; the shards are the directory's Parquet
    files, in name order. Returns the manifest as written.
    """
    directory = Path(directory)
    shards = [{"name": p.name, "rows": pq.ParquetFile(p).metadata.num_rows}
              for p in sorted(directory.glob("*.parquet"))]
    written = sum(s["rows"] for s in shards)
    if written != manifest["rows"]:
        raise RuntimeError(f"{directory}: {written} rows written, {manifest['rows']} expected")  # a bug, not input
    full = {"format": FORMAT, "version": VERSION, **manifest, "shards": shards}
    write_atomic(directory / MANIFEST, json.dumps(full, indent=2, sort_keys=True) + "\n")
    return full


def read_manifest(directory) -> dict:
    """The manifest of a prepared directory, checked against the shards it lists.

    Raises:
        InvalidParameterError: no manifest (not a prepared directory, or one whose writer
            did not finish), an unreadable or foreign manifest, a listed shard missing or
            of another row count, or a data file the manifest does not list.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        raise InvalidParameterError(f"{directory}: no {MANIFEST}, so not a prepared directory (or its preparation "
                                    "did not finish)")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidParameterError(f"{path}: cannot read: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise InvalidParameterError(f"{path}: not a {FORMAT} manifest of version {VERSION}")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise InvalidParameterError(f"{path}: the manifest lacks {missing[0]!r}")
    listed = {s["name"]: s["rows"] for s in manifest["shards"]}
    present = {p.name for p in list_shards(directory)} if listed else set()
    extra = sorted(present - set(listed))
    if extra:
        raise InvalidParameterError(f"{directory}: {extra[0]} is not in the manifest; a prepared directory holds "
                                    "only the shards it lists")
    for name, rows in listed.items():
        try:
            found = pq.ParquetFile(directory / name).metadata.num_rows
        except (OSError, pa.ArrowException):
            raise InvalidParameterError(f"{directory}: the shard {name} in the manifest is missing or not "
                                        "Parquet") from None
        if found != rows:
            raise InvalidParameterError(f"{directory}: the shard {name} has {found} rows, the manifest says {rows}")
    if sum(listed.values()) != manifest["rows"]:
        raise InvalidParameterError(f"{path}: its shards hold {sum(listed.values())} rows, it says "
                                    f"{manifest['rows']}")
    return manifest


def reconcile(path, *, cap: int, expected_rows: int | None) -> dict | None:
    """The manifest when ``path`` is a prepared directory, checked against the plan; None for plain data.

    Refuses a prepared directory whose N (the manifest's rows) is not the plan's N
    (``expected_rows``; None when N is a DP count, which a refusal would reveal), and one
    capped at another K than the plan's (for a plan with K > 1; under K = 1 each row is
    its own unit and a cap ahead of training only drops rows, which the N check sees).
    """
    if not is_prepared(path):
        return None
    manifest = read_manifest(path)
    if expected_rows is not None and manifest["rows"] != expected_rows:
        raise InvalidParameterError(f"the prepared data {path} holds N = {manifest['rows']} rows (its manifest); the "
                                    f"plan accounts N = {expected_rows}: plan with the prepared N or prepare again")
    if cap > 1 and manifest["cap"] is not None and manifest["cap"] != cap:
        raise InvalidParameterError(f"the prepared data {path} was capped at K = {manifest['cap']}; the plan caps "
                                    f"each unit at K = {cap}: cap the data at {cap} or plan with K = {manifest['cap']}")
    return manifest


def verified_cap(units, cap: int, manifest: dict, path) -> dict:
    """Capping info for data capped ahead of training, after checking that no unit has more than ``cap`` rows.

    The manifest's word is not taken for it: one ``np.unique`` over the unit ids proves the
    bound the accounting relies on.
    """
    ids = np.asarray(units)
    counts = np.unique(ids, return_counts=True)[1] if ids.size else np.zeros(0, dtype=np.int64)
    worst = int(counts.max()) if counts.size else 0
    if worst > cap:
        raise InvalidParameterError(f"the prepared data {path} has a unit with {worst} rows, more than the plan's "
                                    f"K = {cap}: its manifest's cap does not hold")
    return {"rows_in": int(ids.size), "rows_kept": int(ids.size), "rows_dropped": 0, "units": int(counts.size),
            "units_capped": 0, "cap": cap, "rule": manifest["rule"], "capped_ahead": True}
