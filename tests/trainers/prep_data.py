"""Shared test data for the preparation engines: several shards, units over K, a row id to compare kept rows by."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trainers.data.keyed import cap_priorities

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
SHARDS, ROWS_PER_SHARD, UNITS, CAP = 3, 4000, 400, 5


def write_shards(directory, *, seed: int = 0, string_ids: bool = False, labels_seed: int | None = None,
                 fmt: str = "parquet") -> list:
    """SHARDS files of ROWS_PER_SHARD rows; unit sizes are skewed so that many units exceed CAP, some do not."""
    rng = np.random.default_rng(seed)
    label_rng = np.random.default_rng(seed if labels_seed is None else labels_seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths, rid = [], 0
    for s in range(SHARDS):
        units = np.minimum(rng.zipf(1.5, ROWS_PER_SHARD), UNITS) - 1
        table = pa.table({
            "uid": pa.array([f"u{u:04d}" for u in units]) if string_ids else pa.array(units, pa.int64()),
            "rid": pa.array(np.arange(rid, rid + ROWS_PER_SHARD), pa.int64()),
            "label": pa.array(label_rng.integers(0, 2, ROWS_PER_SHARD), pa.int8()),
            "x": pa.array(label_rng.random(ROWS_PER_SHARD)),
        })
        rid += ROWS_PER_SHARD
        path = directory / f"shard-{s}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=1500)  # several row groups and batches per shard
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, path)
        paths.append(path)
    return paths


def reference_kept(paths, key: bytes, cap: int) -> set:
    """The keyed rule from its definition, all in memory: every row's priority, then K smallest per unit."""
    from trainers.data.loaders import read_table

    tables = [read_table(p, columns=["uid", "rid"]) for p in sorted(paths, key=str)]
    units = np.concatenate([t.column("uid").to_numpy(zero_copy_only=False) for t in tables])
    shards = np.concatenate([np.full(t.num_rows, i) for i, t in enumerate(tables)])
    rows = np.concatenate([np.arange(t.num_rows) for t in tables])
    rids = np.concatenate([t.column("rid").to_numpy() for t in tables])
    prio = cap_priorities(key, list(units), shards, rows)
    keep = np.zeros(units.size, dtype=bool)
    by_unit: dict = {}
    for i in range(units.size):  # a plain loop, independent of cap_units' vectorised ranks
        by_unit.setdefault(units[i], []).append((int(prio[i]), i))
    for members in by_unit.values():
        for _, i in sorted(members)[:cap]:
            keep[i] = True
    return set(rids[keep].tolist())


def kept_rids(directory) -> set:
    from trainers.data.loaders import read_table

    return set(read_table(directory, columns=["rid"]).column("rid").to_pylist())
