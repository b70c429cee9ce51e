"""``budgetplan split``: Hybrid's budget split, one rule or the paper's alpha grid."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from budgetplan.cli.render import fmt, results_table
from budgetplan.cli.shell import (
    BATCH_SIZE,
    DATASET_SIZE,
    EPOCHS,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_INT,
    THREADS_OR_AUTO,
    console,
    emit_json,
    warn,
)
from budgetplan.scenario.split_rules import DEFAULT_RULE

if TYPE_CHECKING:
    from budgetplan.planning.sweep import SweepCells, SweepShape  # accounting back-ends: not for --help
    from budgetplan.scenario.model import Scenario

__all__ = ["split"]


def _floats(option: str, text: str | None) -> tuple[float, ...] | None:
    from budgetplan.errors import InvalidParameterError
    from budgetplan.util import validate

    if text is None:
        return None
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise click.UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None
    try:
        return tuple(validate.positive(option, x) if option == "--epsilons" else
                     validate.probability(option, x, allow_zero=True, allow_one=True) for x in out)
    except InvalidParameterError as exc:
        raise click.UsageError(str(exc)) from None


@click.command()
@click.option("--epsilon", type=POSITIVE, help="Total epsilon (one rule).")
@click.option("--epsilons", help="Comma-separated total epsilons for --rule grid (default 1,3,5,10,20,30,50).")
@click.option("--alphas", help="Comma-separated alphas for --rule grid (default 0,0.25,0.5,0.75,1).")
@click.option("--delta", type=OPEN_UNIT)
@click.option("--dataset-size", type=DATASET_SIZE)
@click.option("--batch-size", type=BATCH_SIZE, help="DP-SGD expected batch size.")
@click.option("--epochs", type=EPOCHS, help="DP-SGD epochs.")
@click.option("--steps", type=POSITIVE_INT, help="DP-SGD steps (instead of --epochs).")
@click.option("--rule", default=DEFAULT_RULE, show_default=True,
              help='"alpha-by-eps" (alpha from the measured table by eps: the planner\'s default), "paper-v1" '
                   '(eps1 = min(0.6 eps, 3)), "alpha=<a>", "eps1=<e>", or "grid".')
@click.option("--adjacency", type=click.Choice(["replace-one", "add-remove"]), default="replace-one",
              show_default=True, help="Hybrid's semi-sensitive DP is replace-one.")
@click.option("--accountant", type=click.Choice(["pld", "rdp"]), default="pld", show_default=True)
@click.option("--jobs", type=THREADS_OR_AUTO, default="auto", show_default=True,
              help='Calibrations run at once, in separate processes: an integer, or "auto" (the CPUs free now). '
              "The results do not depend on it.")
@click.option("--proxy", type=click.Path(exists=True),
              help="Choose the split by training the alpha grid on this proxy data (free to use: not the private "
                   "data); needs --scenario. Parquet, CSV/TSV or a directory of shards.")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False),
              help="--proxy: the Hybrid scenario (with [features]) whose split is chosen.")
@click.option("--units", "units",
              help="--proxy: also try the units split at these shares of the units for RR, comma-separated (e.g. "
                   "0.75): each phase at the whole budget on its own units (needs replace-one and Poisson batches).")
@click.option("--proxy-eval", type=click.Path(exists=True),
              help="--proxy: held-out proxy rows (default: a fifth of the proxy's units, by a keyed hash).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="--proxy: the proxy runs, frontier.json and frontier.png go here (default: <scenario>-proxy/).")
@click.option("--write", "write_path", type=click.Path(dir_okay=False),
              help="--proxy: the scenario with the chosen split (default: <scenario>-proxy.toml beside it).")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="--proxy: seed the runs (debugging; the proxy is not private data).")
@click.option("--threads", type=THREADS_OR_AUTO, default="auto", show_default=True,
              help="--proxy: torch CPU threads.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def split(epsilon: float | None, epsilons: str | None, alphas: str | None, delta: float | None,
          dataset_size: int | None, batch_size: int | None, epochs: float | None, steps: int | None, rule: str,
          adjacency: str, accountant: str, jobs: int | str, proxy: str | None, scenario_path: str | None,
          units: str | None, proxy_eval: str | None, out_dir: str | None, write_path: str | None,
          seed: int | None, threads: int | str, as_json: bool) -> None:
    """Split a total budget between Hybrid's RR phase (eps1, 0) and DP-SGD phase (eps2, delta).

    With --proxy and --scenario: train the alpha grid (and with --units the units splits) on proxy
    data and write the scenario with the split that did best there (and where it came from, for
    the statement).
    """
    from budgetplan.errors import InvalidParameterError
    from budgetplan.planning.sweep import SweepShape, check_sweep_shape, sweep, sweep_warnings

    ctx = click.get_current_context()
    if proxy is not None or scenario_path is not None:
        _proxy(ctx, proxy, scenario_path, proxy_eval, out_dir, write_path, alphas, units, seed, threads, as_json)
        return
    _check_accounting_options(proxy_eval=proxy_eval, out_dir=out_dir, write_path=write_path, seed=seed, units=units,
                              delta=delta,
                              dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, steps=steps)
    # _check_accounting_options refused these missing
    assert delta is not None and dataset_size is not None and batch_size is not None
    try:
        check_sweep_shape(dataset_size=dataset_size, batch_size=batch_size, adjacency=adjacency, label=_option)
    except InvalidParameterError as exc:
        raise click.UsageError(str(exc)) from None
    for message in sweep_warnings(delta=delta, dataset_size=dataset_size):
        warn(message)
    shape = SweepShape.of(delta=delta, dataset_size=dataset_size, batch_size=batch_size, epochs=epochs, steps=steps,
                          adjacency=adjacency, accountant=accountant)
    todo = _cells(rule, epsilon, epsilons, alphas)
    cells = sweep(todo.epsilons, todo.rules, delta=shape.delta, sampling_rate=shape.sampling_rate, steps=shape.steps,
                  adjacency=shape.adjacency, method=shape.accountant, progress=not as_json and todo.size > 1,
                  jobs=jobs)
    if as_json:
        if rule == "grid":
            emit_json({"epsilon": None, **shape.to_dict(), "rule": "grid", "results": cells})
        else:
            emit_json({**cells[0], **shape.to_dict()})
        return
    _print_split(shape, rule, todo, cells)


def _option(name: str) -> str:
    """A core input's name as this command's option: ``batch_size`` is ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _check_accounting_options(*, proxy_eval: str | None, out_dir: str | None, write_path: str | None,
                              seed: int | None, units: str | None, delta: float | None, dataset_size: int | None,
                              batch_size: int | None, epochs: float | None, steps: int | None) -> None:
    """Without --proxy: no proxy options, and the DP-SGD shape given in full (exactly one of --epochs, --steps)."""
    value: object
    for option, value in (("--proxy-eval", proxy_eval), ("--out", out_dir), ("--write", write_path),
                          ("--seed", seed), ("--units", units)):
        if value is not None:
            raise click.UsageError(f"{option} goes with --proxy")
    for option, value in (("--delta", delta), ("--dataset-size", dataset_size), ("--batch-size", batch_size)):
        if value is None:
            raise click.UsageError(f"missing option {option} (or choose the split on proxy data: --proxy, --scenario)")
    if (epochs is None) == (steps is None):
        raise click.UsageError("give exactly one of --epochs or --steps")


def _cells(rule: str, epsilon: float | None, epsilons: str | None, alphas: str | None) -> SweepCells:
    """The cells the options ask for: the alpha grid for --rule grid, else the one --rule at --epsilon."""
    from budgetplan.errors import InvalidParameterError
    from budgetplan.planning.sweep import alpha_grid, one_rule

    if rule == "grid":
        eps_list, alpha_list = _floats("--epsilons", epsilons), _floats("--alphas", alphas)
        try:
            return alpha_grid(eps_list, alpha_list, epsilon, label=_option)
        except InvalidParameterError as exc:
            raise click.UsageError(str(exc)) from None
    if epsilons or alphas:
        raise click.UsageError("--epsilons and --alphas go with --rule grid")
    if epsilon is None:
        raise click.UsageError("give --epsilon (or --rule grid)")
    return one_rule(epsilon, rule, label=_option)


def _print_split(shape: SweepShape, rule: str, todo: SweepCells, cells: list[dict[str, Any]]) -> None:
    """The human output: the cells' table, then the table rule's reason or the grid's noise by epsilon and alpha."""
    from budgetplan.scenario.split_rules import choose_split, parse_rule

    out = console()
    rows = [[c["epsilon"], c["rule"], c["epsilon1"], c["flip_probability"], c["epsilon2"], c["noise_multiplier"],
             c["dpsgd_epsilon"]] for c in cells]
    out.print(results_table(
        f"Hybrid split, delta={fmt(shape.delta)}, N={fmt(shape.dataset_size)}, batch {fmt(shape.batch_size)}, "
        f"{fmt(shape.steps)} steps ({shape.adjacency}, {shape.accountant})",
        ["epsilon", "rule", "eps1 (RR)", "flip prob", "eps2 (DP-SGD)", "noise multiplier", "DP-SGD eps"], rows))
    if rule != "grid" and parse_rule(rule).kind == "alpha-by-eps":
        out.print(choose_split(todo.epsilons[0], rule).reason)
    if rule == "grid":
        rules = list(todo.rules)
        table: dict[float, dict[str, float | None]] = {}
        for c in cells:
            table.setdefault(c["epsilon"], {})[c["rule"]] = c["noise_multiplier"]
        out.print(results_table("Noise multiplier by total epsilon (rows) and alpha (columns); - : no DP-SGD phase",
                                ["epsilon"] + rules,
                                [[e] + [fmt(table[e][r]) if table[e][r] is not None else "-" for r in rules]
                                 for e in table]))


_ACCOUNTING_ONLY = ("epsilon", "epsilons", "delta", "dataset_size", "batch_size", "epochs", "steps", "rule",
                    "adjacency", "accountant", "jobs")


def _proxy(ctx: click.Context, proxy: str | None, scenario_path: str | None, proxy_eval: str | None,
           out_dir: str | None, write_path: str | None, alphas: str | None, units: str | None, seed: int | None,
           threads: int | str, as_json: bool) -> None:
    """``split --proxy``: the alpha grid on proxy data, the frontier written, the scenario written with the best."""
    from pathlib import Path

    from click.core import ParameterSource

    from budgetplan.scenario.examples import set_key
    from budgetplan.scenario.model import load_scenario
    from budgetplan.util.fileio import write_atomic

    given = [p for p in _ACCOUNTING_ONLY if ctx.get_parameter_source(p) not in (ParameterSource.DEFAULT, None)]
    if given:
        raise click.UsageError(f"--{given[0].replace('_', '-')} does not go with --proxy: the scenario says it")
    if proxy is None or scenario_path is None:
        raise click.UsageError("--proxy and --scenario go together")
    grid = _floats("--alphas", alphas) or (0.0, 0.25, 0.5, 0.75, 1.0)
    scenario = load_scenario(scenario_path)
    source = Path(scenario_path)
    out = Path(out_dir) if out_dir is not None else source.with_name(source.stem + "-proxy")
    target = Path(write_path) if write_path is not None else source.with_name(source.stem + "-proxy.toml")
    if target.resolve() == source.resolve():
        raise click.UsageError(f"--write {target} would overwrite the scenario it reads; name another file")
    text = source.read_text(encoding="utf-8")
    shares = _floats("--units", units) or ()
    if any(not 0 < r < 1 for r in shares):
        raise click.UsageError(f"--units shares must be strictly between 0 and 1, got {units!r}")
    # each units split as the private plan would have it (its q over its part): the scenario's own text re-read
    private = {r: load_scenario_text(set_key(text, "algorithm", "split", f"units={r:g}"), source.name)
               for r in shares}

    from trainers.allocator import tune_allocator
    from trainers.proxy import proxy_grid

    tune_allocator()  # this process is ours: a training step's tensors reuse their memory (trainers.allocator)
    result = proxy_grid(scenario, Path(proxy), eval_path=None if proxy_eval is None else Path(proxy_eval),
                        alphas=grid, out=out, seed=seed, threads=threads, units=private,
                        progress=None if as_json else lambda line: click.echo(line, err=True))
    best = result["best_rule"]
    text = set_key(text, "algorithm", "split", best)
    text = set_key(text, "algorithm", "split_evidence", result["evidence"])
    load_scenario_text(text, source.name)  # what is written parses
    write_atomic(target, text)
    result["scenario"] = str(target)
    import json

    write_atomic(out / "frontier.json", json.dumps(result, indent=2) + "\n")
    from trainers.proxy import plot_alphas

    result["plot"] = str(plot_alphas(result, out / "frontier.png"))
    if as_json:
        emit_json({"epsilon": result["epsilon"], **result})
        return
    rows: list[list[str]] = [[c["rule"], fmt(c["auc"], 4),
             "-" if c["relative_auc_loss"] is None else fmt(c["relative_auc_loss"], 3),
             fmt(c["calibration_ratio"], 3), fmt(c["seconds"], 3)] for c in result["cells"]]
    console().print(results_table(
        f"Split chosen on proxy {result['proxy']} ({fmt(result['train_rows'])} rows; non-private AUC "
        f"{fmt(result['baseline_auc'], 4)})", ["split", "AUC", "rel. AUC loss %", "calib.", "s"], rows))
    console().print(f"{best} did best; written to {target} with split_evidence. Frontier: {out}")


def load_scenario_text(text: str, name: str) -> Scenario:
    from budgetplan.scenario.model import parse_scenario

    return parse_scenario(text, default_name=name)
