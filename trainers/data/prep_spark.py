"""The Spark preparation engine: the same keyed capping, split and counts as ``prep_local``, in Spark SQL.

Row for row the same result as the local engine. A row's position is its shard's index in
sorted shard order (``_metadata.file_path`` mapped through the sorted input files) and its
``_metadata.row_index`` in that Parquet file; both are exact, which is why only Parquet is
read (a CSV row has no index Spark reports). The keyed priority is HMAC-SHA256 computed with
Spark's own ``sha2`` (``trainers.data.keyed``): no Python worker touches a row. Capping is a
window, ``row_number() over (partition by unit order by priority, shard, row) <= K``.

Spark writes into a staging directory inside the output; its part files are then renamed
``part-<j>.parquet`` beside where the manifest will go, so the output directory must be a
path the driver sees (a local or shared file system). Spark's logs go to a file, never to
stdout (:func:`session`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from budgetplan.errors import InvalidParameterError, UnsupportedError
from trainers.data.keyed import CAP_DOMAIN, SPLIT_DOMAIN, held_out_threshold, hmac_pads
from trainers.data.loaders import detect_format
from trainers.data.prep_local import refuse_empty_side
from trainers.data.prepared import shard_name

__all__ = ["session", "unit_count_summary", "cap_into", "split_into"]

_STAGING = "_staging"
_INTEGER = ("ByteType", "ShortType", "IntegerType", "LongType")


def session(master: str | None, conf: dict | None = None):
    """(a SparkSession, whether it was started here): the active one, or a new one whose logs go to a file.

    A new session's JVM is started with stdout and stderr pointing at a log file in the
    temporary directory (its startup banner and warnings never reach the user's terminal);
    the Python process's own streams are restored at once.
    """
    try:
        from pyspark.sql import SparkSession  # heavy: pyspark, optional (the spark extra)
    except ImportError:
        raise UnsupportedError("--engine spark needs pyspark: pip install 'budgetplan[spark]'") from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False

    fd, log = tempfile.mkstemp(prefix="budgetplan-spark-", suffix=".log")
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        builder = (SparkSession.builder.appName("budgetplan-data").master(master or "local[*]")
                   .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
        for name, value in (conf or {}).items():
            builder = builder.config(name, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)
    return spark, True


def _read(spark, paths, unit_id: str):
    """(the data with its unit text, shard and row index, the data's own columns)."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    local = [p for p in paths if "://" not in str(p)]
    for p in local:
        if detect_format(Path(p)) != "parquet":
            raise UnsupportedError(f"{p}: the spark engine reads Parquet only (a row's position must be exact, and "
                                   "Spark gives no row index for CSV): convert it, or use --engine local")
    df = spark.read.parquet(*[str(p) for p in paths])
    if unit_id not in df.columns:
        raise InvalidParameterError(f"the data has no unit id column {unit_id!r}")
    kind = type(df.schema[unit_id].dataType).__name__
    if kind not in (*_INTEGER, "StringType"):
        raise InvalidParameterError(f"unit id column {unit_id!r} has type {kind}; keyed capping and splitting need "
                                    "integer (at most int64) or string ids: cast the column first")
    # Shard order is the order of the decoded paths, as the local engine sorts them. Spark
    # spells one file "file:/x" in _metadata and "file:///x" in inputFiles(), so both sides
    # are matched on the (still encoded) path after the scheme and authority.
    files = sorted((urlparse(u).path for u in df.inputFiles()), key=unquote)
    index = F.create_map(*[x for i, f in enumerate(files) for x in (F.lit(f), F.lit(i))])
    path = F.regexp_replace(F.col("_metadata.file_path"), r"^[A-Za-z][A-Za-z0-9+.-]*:(//[^/]*)?", "")
    columns = list(df.columns)
    df = df.select("*", F.col(unit_id).cast("string").alias("_unit"),
                   F.element_at(index, path).alias("_shard"),
                   F.col("_metadata.row_index").alias("_row"))
    return df, columns


def _hmac_hex(key: bytes, message):
    """HMAC-SHA256(key, message) as 64 lowercase hex digits, from Spark's sha2 (RFC 2104)."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    ipad, opad = hmac_pads(key)
    inner = F.unhex(F.sha2(F.concat(F.lit(ipad), message), 256))
    return F.sha2(F.concat(F.lit(opad), inner), 256)


def _be8(column):
    """A non-negative long as 8 big-endian bytes (hex, padded, unhexed: no arithmetic, so nothing overflows)."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    return F.unhex(F.lpad(F.hex(column), 16, "0"))


def _per_unit(df, *functions_of_unit):
    """One row per unit: its text, row count (and the columns named, functions of the unit); refuses missing ids."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    units = df.groupBy("_unit", *functions_of_unit).agg(
        F.count(F.lit(1)).alias("n"), F.sum(F.col("_shard").isNull().cast("long")).alias("unplaced")).cache()
    check = units.agg(F.sum("unplaced").alias("unplaced"),
                      F.sum(F.when(F.col("_unit").isNull(), F.col("n")).otherwise(0)).alias("missing")).collect()[0]
    if check["unplaced"]:  # a file Spark read that is not among the shards: positions would be wrong
        raise RuntimeError(f"{check['unplaced']} rows come from a file outside the listed shards")
    missing = [{"n": check["missing"]}] if check["missing"] else []
    if missing:
        raise InvalidParameterError(f"the unit id column has {missing[0]['n']} missing values: every row needs its "
                                    "unit to be capped or split")
    return units


def unit_count_summary(spark, paths, unit_id: str, caps) -> dict:
    """``trainers.data.capping.rows_per_cap`` computed by Spark (nothing per unit comes back to the driver)."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    df, _ = _read(spark, paths, unit_id)
    units = _per_unit(df)
    aggs = [F.sum("n").alias("rows"), F.count(F.lit(1)).alias("units"), F.max("n").alias("max")]
    for j, k in enumerate(caps):
        aggs += [F.sum(F.least(F.col("n"), F.lit(k))).alias(f"kept{j}"),
                 F.sum(F.when(F.col("n") > k, 1).otherwise(0)).alias(f"over{j}")]
    row = units.agg(*aggs).collect()[0]
    rows = int(row["rows"] or 0)
    return {"rows": rows, "units": int(row["units"]), "max_per_unit": int(row["max"] or 0),
            "caps": [{"cap": k, "rows": int(row[f"kept{j}"] or 0), "rows_dropped": rows - int(row[f"kept{j}"] or 0),
                      "units_capped": int(row[f"over{j}"] or 0)} for j, k in enumerate(caps)]}


def _write(frame, out: Path) -> None:
    """Write ``frame`` through a staging directory, then rename its part files ``part-<j>.parquet`` in ``out``."""
    staging = out / _STAGING
    frame.write.mode("errorifexists").parquet(str(staging))
    parts = sorted(p for p in staging.iterdir() if p.name.startswith("part-") and p.name.endswith(".parquet"))
    for j, p in enumerate(parts):
        os.replace(p, out / shard_name(j))
    shutil.rmtree(staging)


def cap_into(spark, paths, unit_id: str, cap: int, key: bytes, out) -> dict:
    """Keep each unit's ``cap`` rows of smallest keyed priority (ties by position); write them under ``out``."""
    from pyspark.sql import Window  # heavy: pyspark, only on the Spark engine
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    df, columns = _read(spark, paths, unit_id)
    stats = _per_unit(df).agg(F.sum("n").alias("rows"), F.count(F.lit(1)).alias("units"),
                              F.sum(F.least(F.col("n"), F.lit(cap))).alias("kept"),
                              F.sum(F.when(F.col("n") > cap, 1).otherwise(0)).alias("over")).collect()[0]
    message = F.concat(F.lit(CAP_DOMAIN), _be8(F.col("_shard")), _be8(F.col("_row")), F.col("_unit").cast("binary"))
    priority = F.substring(_hmac_hex(key, message), 1, 16)  # the first 8 bytes: hex order is numeric order
    window = Window.partitionBy("_unit").orderBy(priority, F.col("_shard"), F.col("_row"))
    kept = df.withColumn("_rank", F.row_number().over(window)).filter(F.col("_rank") <= cap).select(*columns)
    _write(kept, Path(out))
    return {"rows_in": int(stats["rows"] or 0), "rows": int(stats["kept"] or 0), "units": int(stats["units"]),
            "units_capped": int(stats["over"] or 0)}


def split_into(spark, paths, unit_id: str, fraction: float, key: bytes, train, held_out) -> dict:
    """Hold out each unit whose keyed score is below ``fraction`` (all its rows); the rest is train."""
    from pyspark.sql import functions as F  # heavy: pyspark, only on the Spark engine

    df, columns = _read(spark, paths, unit_id)
    score = F.substring(_hmac_hex(key, F.concat(F.lit(SPLIT_DOMAIN), F.col("_unit").cast("binary"))), 1, 16)
    held = score < F.lit(f"{held_out_threshold(fraction):016x}")
    df = df.withColumn("_held", held)
    sides = (_per_unit(df, "_held").groupBy("_held")
             .agg(F.sum("n").alias("rows"), F.count(F.lit(1)).alias("units")).collect())
    by = {bool(r["_held"]): {"rows": int(r["rows"]), "units": int(r["units"])} for r in sides}
    empty = {"rows": 0, "units": 0}
    stats = {"train": by.get(False, empty), "held_out": by.get(True, empty)}
    stats["rows_in"] = stats["train"]["rows"] + stats["held_out"]["rows"]
    stats["units"] = stats["train"]["units"] + stats["held_out"]["units"]
    refuse_empty_side(fraction, stats)
    _write(df.filter(~F.col("_held")).select(*columns), Path(train))
    _write(df.filter(F.col("_held")).select(*columns), Path(held_out))
    return stats
