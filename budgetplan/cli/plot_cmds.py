"""``budgetplan plot curve | frontier``: PNG figures (and their data with --json)."""

from __future__ import annotations

import click

from budgetplan.cli.shell import BATCH_SIZE, DATASET_SIZE, EPOCHS, OPEN_UNIT, POSITIVE, bounded_int, console, emit_json
from budgetplan.limits import MAX_CURVES, MAX_PLOT_POINTS

__all__ = ["plot"]


@click.group()
def plot() -> None:
    """Figures: epsilon against epochs, utility against epsilon."""


@plot.command()
@click.option("--noise-multiplier", "sigmas", type=POSITIVE, multiple=True, required=True,
              help="One curve per value (repeat the option).")
@click.option("--dataset-size", type=DATASET_SIZE, required=True)
@click.option("--batch-size", type=BATCH_SIZE, required=True)
@click.option("--max-epochs", type=EPOCHS, required=True)
@click.option("--points", type=bounded_int("points", MAX_PLOT_POINTS), default=12, show_default=True,
              help="Epoch values along the curve.")
@click.option("--delta", type=OPEN_UNIT, required=True)
@click.option("--accountant", "accountants", type=click.Choice(["pld", "rdp", "prv"]), multiple=True,
              help="Default: all three.")
@click.option("--adjacency", type=click.Choice(["add-remove", "replace-one"]), default="add-remove",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="The PNG to write.")
@click.option("--json", "as_json", is_flag=True, help="Also print the curve's data as JSON.")
def curve(sigmas: tuple[float, ...], dataset_size: int, batch_size: int, max_epochs: float, points: int, delta: float,
          accountants: tuple[str, ...], adjacency: str, output: str, as_json: bool) -> None:
    """Epsilon against epochs for several noise multipliers, per accountant."""
    from budgetplan.report.plots import epsilon_curve, plot_epsilon_curve

    if len(sigmas) > MAX_CURVES:
        raise click.UsageError(f"--noise-multiplier is given {len(sigmas)} times: at most {MAX_CURVES} curves "
                               "(budgetplan's stated limit)")
    if batch_size > dataset_size:
        raise click.UsageError(f"--batch-size ({batch_size}) must not exceed --dataset-size ({dataset_size})")
    epochs = [max_epochs * (i + 1) / points for i in range(points)]
    rows = epsilon_curve(noise_multipliers=sigmas, sampling_rate=batch_size / dataset_size,
                         steps_per_epoch=max(1, round(dataset_size / batch_size)), epochs=epochs, delta=delta,
                         accountants=accountants or ("pld", "rdp", "prv"), adjacency=adjacency)
    plot_epsilon_curve(rows, output, title=f"epsilon at delta={delta:g}, q={batch_size / dataset_size:.3g}")
    if as_json:
        emit_json({"output": output, "delta": delta, "adjacency": adjacency, "rows": rows})
    else:
        console().print(f"wrote {output}")


@plot.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--baseline", "baseline_run", type=click.Path(dir_okay=False),
              help="A non-private run.json whose eval AUC the relative loss is measured against.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="The PNG to write.")
@click.option("--json", "as_json", is_flag=True, help="Also print the points as JSON.")
def frontier(runs: tuple[str, ...], baseline_run: str | None, output: str, as_json: bool) -> None:
    """Relative AUC loss against epsilon per algorithm (RR, DP-SGD, Hybrid) from run records."""
    from budgetplan.record.records import load_record
    from budgetplan.report.plots import frontier as frontier_rows
    from budgetplan.report.plots import plot_frontier

    base = None
    if baseline_run:
        _check_baseline_is_not_a_run(baseline_run, runs)
        record = load_record(baseline_run, private=True)
        if record.private:
            raise click.UsageError(f"--baseline {baseline_run} is a private ({record.algorithm}) run: give the "
                                   "non-private baseline's run.json (budgetplan train --non-private)")
        base = (record.metrics.get("eval") or {}).get("auc")
        if base is None:
            raise click.UsageError(f"--baseline {baseline_run} has no eval AUC")
    rows = frontier_rows(runs, baseline_auc=base)
    if not rows:
        raise click.UsageError("no private runs among the given records")
    plot_frontier(rows, output)
    if as_json:
        emit_json({"output": output, "rows": rows})
    else:
        console().print(f"wrote {output} ({len(rows)} runs)")


def _check_baseline_is_not_a_run(baseline_run: str, runs: tuple[str, ...]) -> None:
    """The baseline is the reference the runs are measured against, never one of them."""
    import os

    for run in runs:
        record = os.path.join(run, "run.json") if os.path.isdir(run) else run
        try:
            same = os.path.samefile(baseline_run, record)
        except OSError:  # one of them does not exist: load_record says which
            continue
        if same:
            raise click.UsageError(f"--baseline {baseline_run} is also one of the RUNS ({run}): the baseline is the "
                                   "non-private reference the runs are measured against")
