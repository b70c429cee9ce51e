"""Prepare data ahead of training, on this machine or on Spark: keyed capping, a keyed split by unit, counts.

One entry point per operation, whatever the engine (``local``: ``prep_local``, streamed in
Arrow batches; ``spark``: ``prep_spark``). Both engines keep the same rows: the rule is
``trainers.data.keyed``'s, computed from unit ids, row positions and the key alone. Every
check a user can fail (the cap, the fraction, the engine, pyspark, the output directory,
the data's columns and ids) runs before the first shard is written; a failure after that
removes what was written (``prepared.Output``), and the manifest goes last.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from budgetplan import limits
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate
from trainers.data import prep_local, prep_spark
from trainers.data.capping import rows_per_cap
from trainers.data.fingerprint import key_id
from trainers.data.keyed import hmac_pads
from trainers.data.loaders import list_shards
from trainers.data.prepared import Output, is_prepared, read_manifest, write_manifest

__all__ = ["ENGINES", "cap", "split", "count"]

ENGINES = ("local", "spark")


def _engine(engine: str, spark_master: str | None):
    """(the engine module, a Spark session or None, whether the session was started here)."""
    if engine not in ENGINES:
        raise InvalidParameterError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "local":
        if spark_master is not None:
            raise InvalidParameterError("--spark-master applies to --engine spark only")

        return prep_local, None, False

    spark, owned = prep_spark.session(spark_master)
    return prep_spark, spark, owned


def _shards(data, engine: str) -> list:
    given = [data] if isinstance(data, (str, Path)) else list(data)
    if engine == "spark" and all("://" in str(p) for p in given):
        return sorted(map(str, given))  # a cluster's file system: Spark lists it
    return list_shards(given)


def _source_manifest(data) -> dict | None:
    """The manifest of a prepared directory given as the data, else None."""
    given = [data] if isinstance(data, (str, Path)) else list(data)
    if len(given) == 1 and is_prepared(given[0]):
        return read_manifest(given[0])
    return None


def _status(label: str | None):
    if label is None:
        return None

    status = Console(stderr=True).status(label)
    status.start()
    return status


def cap(data, *, unit_id: str, cap: int, key: bytes, out, engine: str = "local", spark_master: str | None = None,
        progress: bool = False) -> dict:
    """Cap every unit of ``data`` at ``cap`` rows by the keyed rule; write Parquet shards and the manifest to ``out``.

    Returns the manifest: ``rows`` (N after capping), ``rows_in``, ``units``,
    ``units_capped``, ``cap``, ``rule``, ``unit_id``, ``key_id``, ``engine``, ``source``,
    ``shards`` (name and rows of each).
    """
    cap = validate.at_most("--unit-cap", validate.positive_int("--unit-cap", cap), limits.MAX_UNIT_CAP)
    hmac_pads(key)  # refuses a short key
    shards = _shards(data, engine)
    output = Output(out)
    module, spark, owned = _engine(engine, spark_master)
    try:
        with output:
            if spark is None:
                stats = module.cap_into(shards, unit_id, cap, key, output.path,
                                        progress_label="capping" if progress else None)
            else:
                status = _status(f"spark: capping {len(shards)} shards" if progress else None)
                try:
                    stats = module.cap_into(spark, shards, unit_id, cap, key, output.path)
                finally:
                    if status is not None:
                        status.stop()
            return write_manifest(output.path, {
                "kind": "cap", **stats, "cap": cap, "rule": "keyed", "unit_id": unit_id, "key_id": key_id(key),
                "engine": engine, "source": [str(s) for s in shards]})
    finally:
        if owned:
            spark.stop()


def split(data, *, unit_id: str, held_out: float, key: bytes, out, engine: str = "local",
          spark_master: str | None = None, progress: bool = False) -> dict:
    """Split ``data`` by unit into ``out/train`` and ``out/held_out``, each a prepared directory.

    A unit is held out when its keyed score (``trainers.data.keyed.split_scores``) is below
    ``held_out`` (as a fraction of 2^64): every row of a unit lands on one side, and which
    side is a pseudo-random function of its id alone. When ``data`` is a prepared
    directory its cap carries over to both sides (a split drops no row of a unit). Returns
    ``{"train": manifest, "held_out": manifest}``.
    """
    fraction = validate.open_unit("--held-out", held_out)
    hmac_pads(key)
    shards = _shards(data, engine)
    source = _source_manifest(data)
    output = Output(out)
    module, spark, owned = _engine(engine, spark_master)
    try:
        with output:
            train, held = output.path / "train", output.path / "held_out"
            train.mkdir()
            held.mkdir()
            if spark is None:
                stats = module.split_into(shards, unit_id, fraction, key, train, held,
                                          progress_label="splitting" if progress else None)
            else:
                status = _status(f"spark: splitting {len(shards)} shards" if progress else None)
                try:
                    stats = module.split_into(spark, shards, unit_id, fraction, key, train, held)
                finally:
                    if status is not None:
                        status.stop()
            common = {"kind": "split", "rows_in": stats["rows_in"], "units_capped": None,
                      "cap": source["cap"] if source else None, "rule": source["rule"] if source else None,
                      "unit_id": unit_id, "key_id": key_id(key), "engine": engine,
                      "source": [str(s) for s in shards], "held_out_fraction": fraction}
            return {side: write_manifest(directory, {**common, "side": side, **stats[side]})
                    for side, directory in (("train", train), ("held_out", held))}
    finally:
        if owned:
            spark.stop()


def count(data, *, unit_id: str, caps, engine: str = "local", spark_master: str | None = None) -> dict:
    """Rows after capping at each K in ``caps``, as ``trainers.data.capping.capped_rows`` returns them."""
    caps = sorted({validate.at_most("--unit-cap", validate.positive_int("--unit-cap", k), limits.MAX_UNIT_CAP)
                   for k in caps})
    shards = _shards(data, engine)
    module, spark, owned = _engine(engine, spark_master)
    try:
        if spark is None:
            return rows_per_cap(module.unit_counts(shards, unit_id)[1], caps)
        return module.unit_count_summary(spark, shards, unit_id, caps)
    finally:
        if owned:
            spark.stop()
