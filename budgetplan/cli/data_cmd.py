"""``budgetplan data``: data utilities for the trainers (the synthetic ads data, counts under a cap)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from budgetplan.cli.prep_cmds import ENGINE, SPARK_MASTER, cap, split
from budgetplan.cli.shell import POSITIVE, UNIT_CAP, bounded_int, console, emit_json, warn
from budgetplan.limits import MAX_DATASET_SIZE, MAX_SYNTH_ROWS

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from trainers.data.shapes import Shape

# The names of trainers.data.synth.SHAPES, spelled here so that `--help` imports no numpy
# (tests/trainers/test_data_cli.py checks that the two agree).
SHAPE_NAMES = ("legacy", "nonsensitive", "balanced", "sensitive", "mixed", "mixed-ns", "mixed-s", "pctr", "attribution")

__all__ = ["data"]


@click.group()
def data() -> None:
    """Data for the trainers: synthetic ads data, row counts under a cap, capping and splitting ahead of training."""


data.add_command(cap)
data.add_command(split)


def _format_for(out: Path, given: str | None) -> str:
    name = out.name.lower()
    implied = "csv" if name.endswith(".csv") else "parquet" if name.endswith((".parquet", ".pq")) else None
    if given is not None and implied is not None and given != implied:
        # a CSV called .parquet would be read back (format auto) as a broken Parquet file
        raise click.UsageError(f"--format {given} contradicts the --out name {out.name}")
    return given or implied or "parquet"


@data.command()
@click.option("--rows", type=bounded_int("rows", MAX_SYNTH_ROWS), required=True, help="Impressions to generate.")
@click.option("--users", type=bounded_int("users", MAX_SYNTH_ROWS), required=True,
              help="Users (privacy units); at most --rows.")
@click.option("--out", "out", type=click.Path(), required=True,
              help="Output file, written atomically; or, ending in /, a new (or empty) directory of Parquet shards "
                   "written chunk by chunk.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the data (the true model is fixed).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "csv"]),
              help="Output format (default: csv for a .csv name, else parquet; a directory is Parquet).")
@click.option("--shape", type=click.Choice(SHAPE_NAMES), default="legacy", show_default=True,
              help="Where the signal sits: legacy (the original generator), or the Criteo-like nonsensitive, "
                   "balanced (the non-sensitive features alone lose about 10% relative AUC) or sensitive; the mixed "
                   "family (interactions across the groups, users up to 3,000 rows, 4% conversions): mixed, mixed-ns "
                   "(signal mostly non-sensitive), mixed-s (mostly sensitive), each adjustable with the options "
                   "below; or the paper's layouts: pctr (Criteo Display: 13 numeric, 26 categorical) or attribution.")
@click.option("--shard-rows", type=bounded_int("shard-rows", MAX_SYNTH_ROWS), default=2_000_000, show_default=True,
              help="With a directory --out: the most rows a shard holds (and a chunk in memory).")
@click.option("--nonsensitive-share", type=float, default=None,
              help="Mixed shapes: the non-sensitive group's share of the within-group signal, in [0, 1].")
@click.option("--cross-share", type=float, default=None,
              help="Mixed shapes: the share of the signal in interactions across the groups, in [0, 1).")
@click.option("--signal-std", type=float, default=None,
              help="Mixed shapes: the standard deviation of the true logit (1.3 by default; at most 5).")
@click.option("--base-rate", type=float, default=None, help="Mixed shapes: the conversion rate, in (0, 0.5].")
@click.option("--user-sigma", type=float, default=None,
              help="Mixed shapes: the lognormal sigma of rows per user (2.2 by default; larger: heavier users).")
@click.option("--max-user-rows", type=bounded_int("max-user-rows", MAX_SYNTH_ROWS), default=None,
              help="Mixed shapes: the most rows a user has (3,000 by default).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def synth(rows: int, users: int, out: str, seed: int, fmt: str | None, shape: str, shard_rows: int,
          nonsensitive_share: float | None, cross_share: float | None, signal_std: float | None,
          base_rate: float | None, user_sigma: float | None, max_user_rows: int | None, as_json: bool) -> None:
    """Write the built-in synthetic ads data (user_id, label, non-sensitive and sensitive features).

    Conversions follow a known logistic model in which both feature groups carry signal;
    --shape picks how it splits between them and the columns; see trainers.data.synth,
    trainers.data.shapes and trainers.data.layouts. The rows depend on --seed, --rows,
    --users and --shape only, not on --shard-rows.
    """
    if users > rows:
        raise click.UsageError(f"--users ({users}) must not exceed --rows ({rows}): every user has a row")
    directory_out = out.endswith(("/", os.sep))
    out_path = Path(out)
    if directory_out:
        if fmt == "csv":
            raise click.UsageError("--format csv writes one file; a directory --out (ending in /) holds Parquet "
                                   "shards")
    else:
        directory = out_path.parent if str(out_path.parent) else Path(".")
        if out_path.is_dir():
            raise click.UsageError(f"--out is a directory: {out_path} (end it with / to write shards into it)")
        if not directory.is_dir():
            raise click.UsageError(f"--out directory does not exist: {directory}")
        fmt = _format_for(out_path, fmt)

    from rich.console import Console

    from trainers.data.synth import SHAPES, write_synthetic, write_synthetic_shards

    knobs = {"nonsensitive_share": nonsensitive_share, "cross_share": cross_share, "signal_std": signal_std,
             "base_rate": base_rate, "user_sigma": user_sigma, "max_user_rows": max_user_rows}
    given = [k for k, v in knobs.items() if v is not None]
    if given and not shape.startswith("mixed"):
        raise click.UsageError(f"--{given[0].replace('_', '-')} applies to the mixed shapes (--shape mixed, mixed-ns, "
                               f"mixed-s), not {shape}")
    chosen: str | Shape = shape
    if given:
        from trainers.data.mixed import MixedShape, adjusted

        base = SHAPES[shape]
        assert isinstance(base, MixedShape)  # --shape is one of the mixed shapes (checked above)
        chosen = adjusted(base, **knobs)
        if max_user_rows is not None and max_user_rows * users < rows:
            raise click.UsageError(f"--max-user-rows {max_user_rows} x --users {users} cannot hold --rows {rows}")
    spec = (SHAPES[chosen] if isinstance(chosen, str) else chosen).features
    if directory_out:
        summary = write_synthetic_shards(out_path, rows, users, seed, chosen, shard_rows=shard_rows,
                                         progress=not as_json)
    else:
        assert fmt is not None  # a file --out has its format (_format_for above)
        shown = chosen if isinstance(chosen, str) else chosen.name
        status = Console(stderr=True).status(f"synthesising {rows:,} rows for {users:,} users ({shown})") \
            if not as_json else None
        if status is not None:
            status.start()
        try:
            summary = write_synthetic(out_path, rows, users, seed, format=fmt, shape=chosen)
        finally:
            if status is not None:
                status.stop()
    summary["features"] = {
        "label": spec.label, "unit_id": spec.unit_id,
        "nonsensitive_categorical": list(spec.nonsensitive_categorical),
        "nonsensitive_numeric": list(spec.nonsensitive_numeric),
        "sensitive_categorical": list(spec.sensitive_categorical),
        "sensitive_numeric": list(spec.sensitive_numeric),
    }
    if as_json:
        emit_json(summary)
        return
    from budgetplan.cli.render import params_table

    shards = [("shards", f"{len(summary['shards'])} of at most {summary['shard_rows']:,} rows")] \
        if directory_out else []
    console().print(params_table(f"Synthetic data written to {summary['path']}", [
        ("format", summary["format"]), ("shape", summary["shape"]), ("rows", summary["rows"]),
        ("users", summary["users"]), *shards,
        ("seed", str(summary["seed"])), ("conversion rate", f"{summary['conversion_rate']:.4f}"),
        ("size", f"{summary['bytes'] / 1e6:.1f} MB"), ("seconds", f"{summary['seconds']:.1f}"),
        ("label", spec.label), ("unit id", spec.unit_id),
        ("non-sensitive", ", ".join(spec.nonsensitive)),
        ("sensitive", ", ".join(spec.sensitive)),
    ]))


@data.command()
@click.argument("data_path", metavar="DATA", type=click.Path())
@click.option("--unit-id", help="The unit (user) id column.")
@click.option("--unit-cap", "caps", type=UNIT_CAP, multiple=True,
              help="K, the most examples a unit keeps (repeat the option to compare caps; once with --dp-epsilon).")
@click.option("--dp-epsilon", type=POSITIVE,
              help="Release one DP count instead (add-remove plans): the count plus discrete Laplace noise of "
                   "scale K / epsilon. The exact count is never printed.")
@click.option("--seed", type=click.IntRange(min=0),
              help="With --dp-epsilon: a reproducible draw for debugging. NOT private: the seed undoes the noise.")
@click.option("--format", "data_format", default="auto", show_default=True,
              type=click.Choice(["auto", "parquet", "csv", "tsv", "criteo-attribution", "criteo-display",
                                 "criteo-search"]))
@ENGINE
@SPARK_MASTER
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def count(data_path: str, unit_id: str | None, caps: tuple[int, ...], dp_epsilon: float | None, seed: int | None,
          data_format: str, engine: str, spark_master: str | None, as_json: bool) -> None:
    """Rows left after capping each unit at K: the N a user-level scenario must state.

    The count is the same under the `first` and `random` capping rules. It is a statistic
    of the data: N is public under replace-one adjacency, and choosing K by looking at
    these counts is data-dependent preprocessing that no plan accounts for. DATA is a file or
    a directory of shards (a prepared directory, say). Under
    add-remove adjacency N is private: release it once with --dp-epsilon and state the
    noisy count and its epsilon in the scenario, which then accounts it.
    """
    spark = (engine, spark_master if engine == "spark" else None)
    if engine == "spark":
        if unit_id is None:
            raise click.UsageError("--engine spark counts the rows after capping: give --unit-id and --unit-cap")
        if data_format not in ("auto", "parquet"):
            raise click.UsageError(f"--engine spark reads Parquet only, got --format {data_format}")
    if dp_epsilon is None:
        if seed is not None:
            raise click.UsageError("--seed applies to --dp-epsilon only: the exact count has no noise")
        if unit_id is None or not caps:
            raise click.UsageError("--unit-id and --unit-cap are required without --dp-epsilon")
        return _exact_count(data_path, unit_id, caps, data_format, as_json, spark)
    if len(caps) > 1:
        raise click.UsageError(f"--dp-epsilon releases one count: give --unit-cap once, got {len(caps)}")
    if (unit_id is None) != (not caps):
        raise click.UsageError("--unit-id and --unit-cap go together (a capped count needs the unit ids)")
    from budgetplan.dpcount import min_epsilon

    k = caps[0] if caps else 1
    if dp_epsilon < min_epsilon(k):
        raise click.UsageError(f"--dp-epsilon must be at least K / {MAX_DATASET_SIZE:g} = {min_epsilon(k):.3g} "
                               f"(K = {k}), got {dp_epsilon!r}: noise of scale K / epsilon beyond the largest "
                               "dataset size a scenario accepts leaves a count that is all noise")
    return _dp_count(data_path, unit_id, k, dp_epsilon, seed, data_format, as_json, spark)


def _unit_ids(data_path: str, unit_id: str, data_format: str) -> NDArray[Any]:
    from trainers.data.capping import unit_ids
    from trainers.data.loaders import read_table

    return unit_ids(read_table(data_path, format=data_format, columns=[unit_id]), unit_id)


def _capped(data_path: str, unit_id: str, caps: Sequence[int], data_format: str,
            spark: tuple[str, str | None]) -> dict[str, Any]:
    """``capped_rows`` of the data; ``spark`` is (the engine, the Spark master or None)."""
    engine, master = spark
    if engine == "local":
        from trainers.data.capping import capped_rows

        return capped_rows(_unit_ids(data_path, unit_id, data_format), sorted(set(caps)))
    from trainers.data.prepare import count as engine_count

    return engine_count(data_path, unit_id=unit_id, caps=caps, engine=engine, spark_master=master)


def _exact_count(data_path: str, unit_id: str, caps: Sequence[int], data_format: str, as_json: bool,
                 spark: tuple[str, str | None]) -> None:
    result = {"path": str(data_path), "unit_id": unit_id} | _capped(data_path, unit_id, caps, data_format, spark)
    if as_json:
        emit_json(result)
        return
    from budgetplan.cli.render import results_table

    console().print(results_table(
        f"{data_path}: {result['rows']:,} rows, {result['units']:,} units (at most {result['max_per_unit']:,} rows "
        "each)", ["cap K", "rows after capping (N)", "rows dropped", "units over K"],
        [[c["cap"], c["rows"], c["rows_dropped"], c["units_capped"]] for c in result["caps"]]))
    console().print("State N as \\[data] dataset_size (and, to sample whole units, the units as \\[data] units: "
                    "capping keeps every unit); choosing K from these counts is data-dependent preprocessing (not "
                    "covered by a plan).")


def _dp_count(data_path: str, unit_id: str | None, cap: int, epsilon: float, seed: int | None, data_format: str,
             as_json: bool, spark: tuple[str, str | None]) -> None:
    """One release of N~ = N + Z; nothing else about the data (its N, units, drops) is printed."""
    from budgetplan.dpcount import release_count

    if unit_id is not None:
        n = _capped(data_path, unit_id, [cap], data_format, spark)["caps"][0]["rows"]
    else:
        from trainers.data.loaders import read_table

        n = read_table(data_path, format=data_format).num_rows
    released = release_count(n, epsilon=epsilon, sensitivity=cap, seed=seed)
    del n  # the one value this command protects: nothing below may read it
    private = seed is None
    lines = [f"dataset_size = {released['dataset_size']}", f"size_release_epsilon = {epsilon!r}"]
    notes = [f"this release costs (epsilon {epsilon:g}, delta 0) of the budget: plan with [data].size_release_epsilon "
             f"= {epsilon!r} and the plan accounts it as its count phase (add-remove adjacency only)",
             "release it once: every further release costs its epsilon again, and averaging them reveals N"]
    if cap > 1:
        notes.append(f"the count is of the rows after capping each unit at K = {cap}: the scenario's [privacy].cap "
                     f"must be {cap}")
    if released["noisy_count"] != released["dataset_size"]:
        notes.append(f"the noisy count {released['noisy_count']} is below 1; dataset_size states 1 (post-processing)")
    if not private:
        notes.append(f"SEEDED with {seed}: a reproducible draw for debugging, NOT private (the seed undoes the "
                     "noise); do not plan from it")
    if as_json:
        emit_json({"path": str(data_path), "unit_id": unit_id, "cap": cap, **released, "private": private,
                   "cost": {"epsilon": epsilon, "delta": 0.0},
                   "scenario": {"data": {"dataset_size": released["dataset_size"],
                                         "size_release_epsilon": epsilon}},
                   "notes": notes})
        return
    from budgetplan.cli.render import params_table

    console().print(params_table(f"{data_path}: a DP count of the rows" + (f" after capping at K = {cap}"
                                                                           if cap > 1 else ""), [
        ("noisy count N~", str(released["noisy_count"])), ("epsilon", f"{epsilon:g}"),
        ("sensitivity K", str(cap)), ("noise", f"discrete Laplace, std {released['noise_std']:.4g}"),
        ("randomness", "OS CSPRNG" if private else f"SEEDED ({seed}): NOT private")]))
    click.echo("Paste into the scenario:\n[data]\n" + "\n".join(lines))
    for note in notes:
        (warn if note.startswith("SEEDED") else lambda m: click.echo(f"note: {m}"))(note)
