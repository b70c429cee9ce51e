"""Read a training table from Parquet, CSV/TSV, or one of the three public Criteo layouts.

``read_table(path, format=..., columns=...)`` returns a ``pyarrow.Table`` holding only the
requested columns, in the requested order. Every failure a user can cause (a missing file, an
unknown format, a column the file lacks, a file that does not parse) is one
``InvalidParameterError`` naming the path and the problem.

Formats:

- ``parquet``; ``csv`` and ``tsv`` with a header row (``.gz`` and other compressions are
  detected from the file name). ``auto`` picks one of these three from the extension.
- ``criteo-attribution``: the Criteo Attribution Modeling for Bidding dataset
  (``criteo_attribution_dataset.tsv.gz``; Diemert, Meynet et al., AdKDD 2017). Tab-separated
  with a header row. The columns, as documented in the dataset's README (Hugging Face
  ``criteo/criteo-attribution-dataset``), are :data:`CRITEO_ATTRIBUTION_COLUMNS`; the header
  must contain them all.
- ``criteo-display``: the Criteo Display Advertising Challenge (Kaggle, 2014) ``train.txt``:
  tab-separated, no header, ``<label> <13 integer features> <26 categorical features>``,
  categorical values are 32-bit hashes written as hex strings, a missing value is an empty
  field (the dataset's readme.txt by O. Chapelle). Named ``label, I1..I13, C1..C26`` as is
  customary (:data:`CRITEO_DISPLAY_COLUMNS`).
- ``criteo-search``: the Criteo Sponsored Search Conversion Log (``CriteoSearchData``; Tallis
  and Yadav, arXiv:1806.08211): tab-separated, no header, 23 columns, ``-1`` for a missing or
  not-applicable value. Column order from the dataset description on
  ailab.criteo.com/criteo-sponsored-search-conversion-log-dataset, as also used by
  columbia/cookiemonster (``data/criteo/creators/base_creator.py``); the seven
  ``product_category(1-7)`` columns are named ``product_category1..7``
  (:data:`CRITEO_SEARCH_COLUMNS`). ``-1`` is read as null in every column, so a
  missing feature reaches the encoder as missing (``Sale`` is 0 or 1 and never -1).

Only the requested columns are parsed (Parquet column projection, CSV ``include_columns``).
This module imports pyarrow, never torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError

__all__ = [
    "read_table",
    "iter_batches",
    "list_shards",
    "FORMATS",
    "CRITEO_ATTRIBUTION_COLUMNS",
    "CRITEO_DISPLAY_COLUMNS",
    "CRITEO_SEARCH_COLUMNS",
    "detect_format",
]

FORMATS = ("auto", "parquet", "csv", "tsv", "criteo-attribution", "criteo-display", "criteo-search")

CRITEO_ATTRIBUTION_COLUMNS = (
    "timestamp", "uid", "campaign", "conversion", "conversion_timestamp", "conversion_id",
    "attribution", "click", "click_pos", "click_nb", "cost", "cpo", "time_since_last_click",
    *(f"cat{i}" for i in range(1, 10)),
)
CRITEO_DISPLAY_COLUMNS = (
    "label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)),
)
CRITEO_SEARCH_COLUMNS = (
    "Sale", "SalesAmountInEuro", "time_delay_for_conversion", "click_timestamp", "nb_clicks_1week",
    "product_price", "product_age_group", "device_type", "audience_id", "product_gender",
    "product_brand", *(f"product_category{i}" for i in range(1, 8)), "product_country",
    "product_id", "product_title", "partner_id", "user_id",
)

# Compression suffixes pyarrow's CSV reader detects from the file name.
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_BLOCK_SIZE = 16 << 20  # larger blocks: fewer, larger chunks and steadier type inference


def _types(fmt: str) -> dict:
    """Column types fixed by a Criteo layout; inference would guess differently per block."""
    if fmt == "criteo-display":
        return {"label": pa.int64(), **{f"I{i}": pa.int64() for i in range(1, 14)},
                **{f"C{i}": pa.string() for i in range(1, 27)}}
    if fmt == "criteo-search":
        numeric = {"Sale": pa.int64(), "SalesAmountInEuro": pa.float64(),
                   "time_delay_for_conversion": pa.int64(), "click_timestamp": pa.int64(),
                   "nb_clicks_1week": pa.int64(), "product_price": pa.float64()}
        return {c: numeric.get(c, pa.string()) for c in CRITEO_SEARCH_COLUMNS}
    if fmt == "criteo-attribution":
        # The cat columns are hashed category ids: categorical, never arithmetic.
        return {f"cat{i}": pa.string() for i in range(1, 10)}
    return {}


def detect_format(path: Path) -> str:
    name = path.name.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".tsv", ".tab")):
        return "tsv"
    raise InvalidParameterError(
        f"{path}: cannot tell the format from the file name; give format= one of "
        f"{', '.join(FORMATS[1:])}")


def _wanted(path: Path, columns, available) -> list[str]:
    """The requested columns without repeats, each checked against the file's columns.

    A file that names a column twice is refused outright: which of the two a reader takes
    is an accident of the reader, and training on the wrong ``label`` is silent.
    """
    seen, twice = set(), []
    for name in available:
        if name in seen and name not in twice:
            twice.append(name)
        seen.add(name)
    if twice:
        raise InvalidParameterError(f"{path}: the file names column {twice[0]!r} twice; column names must be unique")
    if columns is None:
        return list(available)
    if isinstance(columns, str):
        columns = [columns]
    wanted = list(dict.fromkeys(columns))
    present = set(available)
    for name in wanted:
        if name not in present:
            raise InvalidParameterError(f"{path}: no column {name!r} (the file has {len(present)} columns)")
    return wanted


def _header(path: Path, parse) -> list[str]:
    """The column names in the header row, parsed (quotes, compression) as the reader will."""
    # A small first block: only the header is needed, the rest is read again below.
    with pacsv.open_csv(str(path), read_options=pacsv.ReadOptions(block_size=1 << 20),
                        parse_options=parse,
                        convert_options=pacsv.ConvertOptions(strings_can_be_null=True)) as reader:
        return list(reader.schema.names)


def _read_parquet(path: Path, columns):
    schema = pq.read_schema(str(path))
    wanted = _wanted(path, columns, schema.names)
    return pq.read_table(str(path), columns=wanted)


def _delimited_options(path: Path, fmt: str, columns):
    """(the columns wanted, read, parse and convert options) for a delimited file of layout ``fmt``."""
    delimiter = "," if fmt == "csv" else "\t"
    # The Criteo dumps never quote; turning quoting off keeps a stray quote from
    # swallowing a line.
    parse = pacsv.ParseOptions(delimiter=delimiter, quote_char=False if fmt.startswith("criteo") else '"')
    headerless = fmt in ("criteo-display", "criteo-search")
    if headerless:
        names = list(CRITEO_DISPLAY_COLUMNS if fmt == "criteo-display" else CRITEO_SEARCH_COLUMNS)
    else:
        names = _header(path, parse)
        if fmt == "criteo-attribution":
            missing = [c for c in CRITEO_ATTRIBUTION_COLUMNS if c not in names]
            if missing:
                raise InvalidParameterError(
                    f"{path}: not the criteo-attribution layout, its header lacks {missing[0]!r}")
    wanted = _wanted(path, columns, names)
    types = {c: t for c, t in _types(fmt).items() if c in wanted}
    read = pacsv.ReadOptions(column_names=names if headerless else None, block_size=_BLOCK_SIZE)
    if fmt == "criteo-search":
        nulls = ["-1", ""]
    elif fmt == "criteo-display":
        nulls = [""]
    else:
        nulls = ["", "NULL", "null", "NaN", "nan", "NA", "N/A"]
    convert = pacsv.ConvertOptions(include_columns=wanted, column_types=types, null_values=nulls,
                                   strings_can_be_null=True, quoted_strings_can_be_null=True)
    return wanted, read, parse, convert


def _read_delimited(path: Path, fmt: str, columns):
    wanted, read, parse, convert = _delimited_options(path, fmt, columns)
    table = pacsv.read_csv(str(path), read_options=read, parse_options=parse, convert_options=convert)
    return table.select(wanted) if table.column_names != wanted else table


def _is_shard(p: Path) -> bool:
    """A data file in a directory of shards: not hidden, not ``_``-prefixed (``_SUCCESS``), of a known format."""
    if p.name.startswith((".", "_")) or not p.is_file():
        return False
    try:
        detect_format(p)
    except InvalidParameterError:
        return False
    return True


def list_shards(paths) -> list[Path]:
    """The data files behind ``paths`` (a file, a directory of shards, or a list of them), in shard order.

    A directory contributes the data files directly inside it (``.parquet``, ``.pq``,
    ``.csv``, ``.tsv``, compressed or not), skipping hidden and ``_``-prefixed names as Spark
    does; a manifest or a ``_SUCCESS`` marker beside the shards is ignored. Shard order, on
    which row positions (and so keyed capping) depend, is the sorted order of the absolute
    paths: the same however the paths were listed.

    Raises:
        InvalidParameterError: a path is missing, a directory holds no data file, or one
            file is named twice.
    """
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise InvalidParameterError("no data path given")
    shards: list[Path] = []
    for p in map(Path, given):
        if not p.exists():
            raise InvalidParameterError(f"{p}: no such file or directory")
        if p.is_dir():
            found = [q for q in p.iterdir() if _is_shard(q)]
            if not found:
                raise InvalidParameterError(f"{p}: the directory holds no .parquet, .csv or .tsv file")
            shards += found
        else:
            shards.append(p)
    absolute = [Path(a) for a in sorted(os.path.abspath(s) for s in shards)]  # as strings, as Spark sorts
    for a, b in zip(absolute, absolute[1:]):
        if a == b:
            raise InvalidParameterError(f"{a}: the data file is named twice")
    return absolute


def iter_batches(path: str | os.PathLike, *, format: str = "auto", columns=None, batch_rows: int = 1 << 16):
    """Stream ``columns`` of one file as ``pyarrow.RecordBatch`` es of at most about ``batch_rows`` rows.

    Never holds the whole file: Parquet is read row group by row group, delimited text block
    by block. Same formats, column checks and errors as :func:`read_table`.
    """
    path = Path(path)
    fmt = detect_format(path) if format == "auto" else format
    if fmt not in FORMATS[1:]:
        raise InvalidParameterError(f"{path}: unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    try:
        if fmt == "parquet":
            # No pre-buffering: it would read whole row groups (a million rows, say) at once.
            handle = pq.ParquetFile(str(path), pre_buffer=False, buffer_size=1 << 20)
            wanted = _wanted(path, columns, handle.schema_arrow.names)
            yield from handle.iter_batches(batch_size=batch_rows, columns=wanted)
            return

        wanted, read, parse, convert = _delimited_options(path, fmt, columns)
        with pacsv.open_csv(str(path), read_options=read, parse_options=parse, convert_options=convert) as reader:
            for batch in reader:
                yield batch.select(wanted) if batch.schema.names != wanted else batch
    except InvalidParameterError:
        raise
    except (pa.ArrowException, OSError, ValueError, UnicodeError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidParameterError(f"{path}: cannot read as {fmt}: {message[:300]}") from None


def read_table(path: str | os.PathLike, *, format: str = "auto", columns=None):
    """Read ``columns`` of the file at ``path`` into a ``pyarrow.Table``.

    Args:
        path: the file, or a directory of shards (:func:`list_shards`: a prepared
            directory's Parquet shards, say), read in shard order as one table. Text
            formats may be compressed (``.gz``, ``.bz2``, ``.zst``, ``.lz4``).
        format: one of :data:`FORMATS`. ``auto`` picks parquet, csv or tsv from the
            extension; the Criteo layouts are never guessed.
        columns: the column names to read, in the order wanted (repeats dropped); ``None``
            reads every column.

    Returns:
        A table with exactly the requested columns in the requested order.

    Raises:
        InvalidParameterError: the file is missing or unreadable, the format is unknown or
            cannot be guessed, or a requested column is not in the file.
    """
    path = Path(path)
    if format not in FORMATS:
        raise InvalidParameterError(f"{path}: unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if not path.exists():
        raise InvalidParameterError(f"{path}: no such file")
    if path.is_dir():
        shards = list_shards(path)
        tables = [read_table(s, format=format, columns=columns) for s in shards]
        try:
            return pa.concat_tables(tables)
        except pa.ArrowInvalid:
            raise InvalidParameterError(f"{path}: its shards do not share one schema ({shards[0].name} and "
                                        "another differ)") from None
    fmt = detect_format(path) if format == "auto" else format
    try:
        if fmt == "parquet":
            return _read_parquet(path, columns)
        return _read_delimited(path, fmt, columns)
    except InvalidParameterError:
        raise
    except (pa.ArrowException, OSError, ValueError, UnicodeError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidParameterError(f"{path}: cannot read as {fmt}: {message[:300]}") from None
