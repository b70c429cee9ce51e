"""``budgetplan data cap`` and ``data split``: prepare data ahead of training, locally or on Spark.

Registered on the ``data`` group by ``data_cmd``. Both write a prepared directory (Parquet
shards and a manifest written last; ``trainers.data.prepared``) and take the secret key of
the keyed rule from a file (``--key``), or make one (``--new-key``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import click

from budgetplan.cli.shell import OPEN_UNIT, UNIT_CAP, console, emit_json

__all__ = ["cap", "split", "ENGINE", "SPARK_MASTER"]

_F = TypeVar("_F", bound=Callable[..., Any])

ENGINE = click.option("--engine", type=click.Choice(["local", "spark"]), default="local", show_default=True,
                      help="local: streamed on this machine; spark: PySpark (pip install 'budgetplan[spark]'). "
                           "Both give the same result.")
SPARK_MASTER = click.option("--spark-master", envvar="SPARK_MASTER", show_envvar=True,
                            help="With --engine spark: the master URL (default local[*]).")


class _OutDirectory(click.Path):
    """A directory to create: click's Path, but "" is refused (as a Path it would be ".", the current directory)."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            name = param.opts[0] if param is not None and param.opts else "--out"
            raise click.UsageError(f"{name} is empty: name the directory to create, got {value!r}", ctx)
        return super().convert(value, param, ctx)


def _key_options(f: _F) -> _F:
    f = click.option("--new-key", "new_key", type=click.Path(dir_okay=False, path_type=Path),
                     help="Make a fresh 32-byte key, save it here (owner-only), and use it.")(f)
    return click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path),
                        help="The secret key of the keyed rule (a file of at least 16 random bytes, as "
                             "--fingerprint-key).")(f)


class _Key:
    """The key read from ``--key``, or a fresh one for ``--new-key`` (saved now, removed again on failure)."""

    def __init__(self, key_path: Path | None, new_key: Path | None) -> None:
        from trainers.data.fingerprint import new_key as fresh
        from trainers.data.fingerprint import read_key

        if (key_path is None) == (new_key is None):
            raise click.UsageError("give the key: --key KEYFILE, or --new-key PATH to make one")
        self.saved: Path | None = None
        if key_path is not None:
            if not key_path.exists():
                raise click.UsageError(f"--key {key_path}: no such file; make a fresh key with --new-key {key_path}")
            self.key = read_key(key_path)
        elif new_key is not None:
            if new_key.exists():
                raise click.UsageError(f"--new-key {new_key} exists: it may be the key of earlier work; use --key")
            self.key, self.saved = fresh(), new_key

    def __enter__(self) -> bytes:
        if self.saved is not None:
            from trainers.data.fingerprint import write_key

            write_key(self.saved, self.key)
        return self.key

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is not None and self.saved is not None:
            self.saved.unlink(missing_ok=True)


def _show(title: str, manifest: dict[str, Any], out: Path) -> None:
    from budgetplan.cli.render import params_table

    rows = [("rows after (N)", f"{manifest['rows']:,}"), ("rows before", f"{manifest['rows_in']:,}"),
            ("units", f"{manifest['units']:,}")]
    if manifest.get("units_capped") is not None:
        rows.append(("units over K", f"{manifest['units_capped']:,}"))
    rows += [("cap K", str(manifest["cap"])), ("rule", str(manifest["rule"])), ("key id", manifest["key_id"]),
             ("engine", manifest["engine"]), ("shards", str(len(manifest["shards"]))), ("written to", str(out))]
    console().print(params_table(title, rows))


@click.command()
@click.argument("data_paths", metavar="DATA...", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--unit-id", required=True, help="The unit (user) id column: integer or string.")
@click.option("--unit-cap", "cap", type=UNIT_CAP, required=True, help="K, the most rows a unit keeps.")
@_key_options
@click.option("--out", type=_OutDirectory(), required=True,
              help="A new (or empty) directory for the Parquet shards and manifest.json.")
@ENGINE
@SPARK_MASTER
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as one JSON object on stdout.")
def cap(data_paths: tuple[str, ...], unit_id: str, cap: int, key_path: Path | None, new_key: Path | None, out: Path,
        engine: str, spark_master: str | None, as_json: bool) -> None:
    """Cap every unit at K rows by the keyed rule and write the result as a prepared directory.

    DATA is a file or a directory of Parquet (or, with --engine local, CSV/TSV) shards, or
    several. Each unit keeps its K rows of smallest keyed priority, HMAC-SHA256 under the
    key of the row's unit id and position (shard, row): the choice depends on ids,
    positions and the key only, never on labels or features, and is the same on both
    engines. Train on the directory with the plan whose N is the manifest's rows and whose
    cap is K; the trainer checks both.
    """
    from trainers.data.prepare import cap as run_cap

    with _Key(key_path, new_key) as key:
        manifest = run_cap(list(data_paths), unit_id=unit_id, cap=cap, key=key, out=out, engine=engine,
                           spark_master=spark_master if engine == "spark" else None, progress=not as_json)
    if as_json:
        emit_json(manifest)
        return
    _show(f"Capped at K = {cap}", manifest, out)
    click.echo(f"State N = {manifest['rows']} as [data] dataset_size and cap = {cap} in the scenario.")


@click.command()
@click.argument("data_paths", metavar="DATA...", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--unit-id", required=True, help="The unit (user) id column: integer or string.")
@click.option("--held-out", "held_out", type=OPEN_UNIT, required=True,
              help="The fraction of units held out, strictly between 0 and 1.")
@_key_options
@click.option("--out", type=_OutDirectory(), required=True,
              help="A new (or empty) directory; train/ and held_out/ are written in it.")
@ENGINE
@SPARK_MASTER
@click.option("--json", "as_json", is_flag=True, help="Print both manifests as one JSON object on stdout.")
def split(data_paths: tuple[str, ...], unit_id: str, held_out: float, key_path: Path | None, new_key: Path | None,
          out: Path, engine: str, spark_master: str | None, as_json: bool) -> None:
    """Split the data by unit into OUT/train and OUT/held_out, each a prepared directory.

    A unit goes to held_out when the keyed HMAC-SHA256 of its id, as a fraction of 2^64, is
    below --held-out: all its rows land on one side, and the side depends on its id and
    the key only. Split a capped directory to keep its cap on both sides.
    """
    from trainers.data.prepare import split as run_split

    with _Key(key_path, new_key) as key:
        sides = run_split(list(data_paths), unit_id=unit_id, held_out=held_out, key=key, out=out, engine=engine,
                          spark_master=spark_master if engine == "spark" else None, progress=not as_json)
    if as_json:
        emit_json(sides)
        return
    for side, manifest in sides.items():
        _show(f"{side}: {manifest['units']:,} units", manifest, out / side)
