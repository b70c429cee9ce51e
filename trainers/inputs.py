"""What a run reads before anything is spent: the device, the data (capped, shared out, encoded), the model.

Shared by every way into training (``trainers.run``, ``trainers.tune``, the baseline), so that
none of them imports another's helpers. Every privacy-relevant number (cap, N, the RR
hold-out fraction) is passed in from the plan.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.plan.phases import UNITS_SPLIT_KEY
from trainers.baseline import validation_split
from trainers.data.capping import cap_units, unit_ids
from trainers.data.columns import parquet_source
from trainers.data.encode import build_vocabulary, encode
from trainers.data.encoded import EncodedData
from trainers.data.fingerprint import fingerprint
from trainers.data.loaders import read_table
from trainers.data.prepared import reconcile, verified_cap
from trainers.models import build_model
from trainers.ranks import rank_rows

__all__ = ["Prepared", "units_part", "resolve_device", "reproducible_kernels", "device_name", "prepare_data",
           "prepare_eval", "new_model", "check_walr_columns"]


@dataclass
class Prepared:
    """The data as a phase reads it, with what the record says of it."""

    data: EncodedData
    data_info: dict
    encoding: dict
    unit_counts: np.ndarray | None
    timings: dict = field(default_factory=dict)
    table: object = None
    vocabulary: dict | None = None
    rows: np.ndarray | None = None  # with several processes: this rank's row numbers in the capped data
    holdout: np.ndarray | None = None  # the RR phase's held-out rows (a mask over this rank's rows), if any
    part: tuple[float, np.ndarray] | None = None  # a units split: (its share r, the mask of its first part's rows)


_DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


def resolve_device(name: str):
    if not isinstance(name, str) or not _DEVICE.match(name):
        raise InvalidParameterError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidParameterError(f"--device {name!r} requested but no CUDA device is available")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise InvalidParameterError(f"--device {name!r}: there are {torch.cuda.device_count()} CUDA devices "
                                    f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return device


@contextlib.contextmanager
def reproducible_kernels(device, seeded: bool):
    """A seeded run on CUDA with torch's deterministic kernels; the caller's mode restored after.

    CUDA's default kernels add in whatever order the threads finish (index_add_, the sums of
    a scatter), so two runs from one seed drift apart in the last bits and then in the model.
    cuBLAS needs its workspace fixed for the same reason (``CUBLAS_WORKSPACE_CONFIG``, set
    here only when the user has not set it). CPU kernels are already deterministic, and a
    CSPRNG run is not meant to repeat: both are left as they are.
    """
    if not seeded or device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def device_name(device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def _cap(table, spec, cap: int, capping, manifest, path, randomness):
    """(the capped table, the capping note, each row's dense unit, each row's unit count, the units)."""
    if spec.unit_id is None or spec.unit_id not in table.column_names:
        raise InvalidParameterError(f"the plan caps each unit at {cap} examples but the data has no unit id "
                                    f"column {spec.unit_id!r}")
    units = unit_ids(table, spec.unit_id)
    if manifest is not None and manifest["cap"] is not None:  # capped ahead of training: verified, not again
        kept, cap_info = np.arange(table.num_rows), verified_cap(units, cap, manifest, path)
    else:
        kept, cap_info = cap_units(np.asarray(units), cap, rule=capping, rng=randomness.generator())
        table = table.take(kept)
    _, unit_index, counts = np.unique(np.asarray(units)[kept], return_inverse=True, return_counts=True)
    return table, cap_info, unit_index, counts[unit_index], int(counts.size)


def _check_rows(rows: int, rows_in: int, cap: int, expected_rows) -> None:
    if expected_rows is not None and rows != expected_rows:
        dropped = rows_in - rows
        raise InvalidParameterError(
            f"the data has {rows} rows" + (f" after capping ({rows_in} before, {dropped} dropped)" if cap > 1 else "")
            + f"; the plan accounts N = {expected_rows}: re-plan with this N or supply the planned data")


def _check_both_classes(table, name: str) -> None:
    """Refuse training labels of one class: the run would spend its budget and learn a constant.

    Only a column of one valid label (0 or 1, no nulls) is refused here; any other bad label
    is the encoder's to refuse, in its words.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table.column(name)
    if table.num_rows == 0 or column.null_count:
        return
    kind = column.type
    if not (pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return
    values = pc.unique(column).to_pylist()
    if len(values) == 1 and values[0] in (0, 1):
        raise InvalidParameterError(f"label column {name!r} holds the single value {values[0]!r} in all "
                                    f"{table.num_rows} training rows: a model needs both classes (0 and 1)")


def prepare_data(path, spec, settings, device, *, cap: int, capping: str | None, expected_rows, randomness,
                 vocabulary: dict | None = None, key: bytes | None = None, collective=None,
                 whole_units: bool = False, holdout: float | None = None, units_split: float | None = None,
                 training: bool = True) -> Prepared:
    """Read, cap and encode the data; with ``key``, fingerprint the data as read (before capping).

    ``collective``: this rank's place in a run over several processes: the rows are capped
    and counted whole, then only this rank's share is encoded (``trainers.ranks.rank_rows``:
    a contiguous block, or with ``whole_units`` the rows of a block of whole units; a
    vocabulary is still built from every rank's rows, so that all ranks encode alike).

    ``holdout``: the RR phase's validation fraction: the units held out are chosen on the
    capped rows, before they are shared out, by ``trainers.baseline.validation_split`` (a
    keyed hash of the unit id, or of the row number without one: never the labels).

    ``units_split``: a units split's share r: the rows of the units whose keyed hash position
    (``UnitPart``) is below r, the first part, as a mask (``Prepared.part``: (r, the mask));
    chosen like the held-out units, with the units split's own key.

    ``training``: labels of one class are refused (``prepare_eval`` says so in its words).
    """
    t0 = time.perf_counter()
    manifest = reconcile(path, cap=cap, expected_rows=expected_rows)  # None unless a prepared directory
    # Parquet is read a column at a time (never the whole table); other formats whole.
    table = parquet_source(path, settings.data_format, list(spec.columns))
    if table is None:
        table = read_table(path, format=settings.data_format, columns=list(spec.columns))
    rows_in = table.num_rows
    info: dict = {"path": str(path), "format": settings.data_format, "rows_in": rows_in, "capping": None}
    if manifest is not None:
        info["prepared"] = {k: manifest[k] for k in ("kind", "rows", "rows_in", "cap", "rule", "key_id", "engine")}
    if key is not None:
        # The file as given, before capping: the auditor can recompute it whatever rows capping kept.
        info["fingerprint"] = fingerprint(table, list(spec.columns), key)
    unit_counts = unit_index = None
    units_in_all = 0
    if cap > 1:
        table, info["capping"], unit_index, unit_counts, units_in_all = _cap(table, spec, cap, capping, manifest,
                                                                              path, randomness)
    info["rows_used"] = table.num_rows
    _check_rows(table.num_rows, rows_in, cap, expected_rows)
    if training:
        _check_both_classes(table, spec.label)
    held = None
    if holdout is not None:
        held, _, _ = validation_split(table, spec.unit_id, holdout, what="[rr].validation_fraction")
    first = None if units_split is None else units_part(table, spec.unit_id, units_split)
    mine = None
    if collective is not None:
        if settings.nonsensitive_encoding == "vocab" and vocabulary is None:
            vocabulary = build_vocabulary(table, spec, settings.vocab_threshold)
        mine = rank_rows(collective.world_size, collective.rank, rows=table.num_rows,
                         units=unit_index if whole_units else None)
        table = table.take(mine)
        unit_counts = None if unit_counts is None else unit_counts[mine]
        held = None if held is None else held[mine]
        first = None if first is None else first[mine]
    t1 = time.perf_counter()
    data, encoding = encode(table, spec, nonsensitive_encoding=settings.nonsensitive_encoding,
                            hash_bins_nonsensitive=settings.hash_bins_nonsensitive,
                            hash_bins_sensitive=settings.hash_bins_sensitive, vocab_threshold=settings.vocab_threshold,
                            vocabulary=vocabulary, device=device)
    t2 = time.perf_counter()
    if mine is not None and unit_index is not None:
        encoding["units"] = units_in_all  # every rank's (its own share's count is local)
    vocab = encoding.pop("vocabulary", None)  # kept beside the model, not in the record
    return Prepared(data, info, encoding, unit_counts, {"load_seconds": t1 - t0, "encode_seconds": t2 - t1}, table,
                    vocab, mine, held, None if first is None else (units_split, first))


def units_part(table, unit_column: str | None, share: float) -> np.ndarray:
    """The mask of ``table``'s rows whose unit's position (``UnitPart``) is below ``share``: a units split's first part.

    Raises:
        InvalidParameterError: either part is empty.
    """
    try:
        first, _, _ = validation_split(table, unit_column, share, key=UNITS_SPLIT_KEY.encode())
    except InvalidParameterError:
        raise InvalidParameterError(f"[algorithm].split = \"units={share:g}\" puts every unit of the training data "
                                    f"({table.num_rows} rows) in one part: each phase needs units of its own; use an "
                                    "alpha rule") from None
    return first


def prepare_eval(path, spec, settings, device, vocabulary=None) -> Prepared | None:
    """The held-out data read and encoded up front: a bad eval file fails before any privacy is spent."""
    if path is None:
        return None
    t0 = time.perf_counter()
    prep = prepare_data(path, spec, settings, device, cap=1, capping=None, expected_rows=None, randomness=None,
                        vocabulary=vocabulary, training=False)
    positives = int(prep.data.label.sum().item())
    if not 0 < positives < len(prep.data):
        raise InvalidParameterError(f"eval data {path}: {positives} positives of {len(prep.data)} rows; AUC and "
                                    "calibration need both classes")
    prep.timings = {"eval_prepare_seconds": time.perf_counter() - t0}
    return prep


def new_model(prep: Prepared, settings, seed: int):
    """The model ``settings`` name for ``prep``'s encoded shapes, initialised from ``seed``."""
    torch.manual_seed(seed)
    d = prep.data
    shape = dict(ns_vocab=d.ns_vocab, n_ns_cat=d.ns_cat.shape[1], n_ns_num=d.ns_num.shape[1], s_vocab=d.s_vocab,
                 n_s_cat=d.s_cat.shape[1], n_s_num=d.s_num.shape[1], embedding_dim=settings.embedding_dim)
    if settings.model == "mlp":
        shape.update(tower_hidden=settings.tower_hidden, common_hidden=tuple(settings.common_hidden))
    return build_model(settings.model, **shape)


def check_walr_columns(spec) -> None:
    """Numeric WALR reads numeric columns only: refuse categorical ones before anything is spent."""
    if spec.nonsensitive_categorical or spec.sensitive_categorical:
        raise InvalidParameterError("WALR is a logistic regression on numeric features: drop the categorical "
                                    "columns from [features]")
