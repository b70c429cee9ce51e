"""``budgetplan split``: Hybrid's budget split, one rule or the paper's alpha grid."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from budgetplan.cli._render import fmt, results_table
from budgetplan.cli._shell import (
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
from budgetplan.limits import MAX_GRID_CELLS
from budgetplan.split import DEFAULT_RULE

if TYPE_CHECKING:
    from budgetplan.scenario import Scenario

__all__ = ["split"]


def _floats(option: str, text: str | None) -> tuple[float, ...] | None:
    from budgetplan import _validate
    from budgetplan.errors import InvalidParameterError

    if text is None:
        return None
    out = []
    for part in text.split(","):
        try:
            out.append(float(part))
        except ValueError:
            raise click.UsageError(f"{option} must be comma-separated numbers, got {text!r}") from None
    try:
        return tuple(_validate.positive(option, x) if option == "--epsilons" else
                     _validate.probability(option, x, allow_zero=True, allow_one=True) for x in out)
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
def split(epsilon, epsilons, alphas, delta, dataset_size, batch_size, epochs, steps, rule, adjacency, accountant,
          jobs, proxy, scenario_path, proxy_eval, out_dir, write_path, seed, threads, as_json):
    """Split a total budget between Hybrid's RR phase (eps1, 0) and DP-SGD phase (eps2, delta).

    With --proxy and --scenario: train the alpha grid on proxy data and write the scenario with the
    split that did best there (and where it came from, for the statement).
    """
    from budgetplan.calibrate import steps_for_epochs
    from budgetplan.split import PAPER_ALPHAS, PAPER_EPSILONS, parse_rule
    from budgetplan.sweep import sweep

    ctx = click.get_current_context()
    if proxy is not None or scenario_path is not None:
        _proxy(ctx, proxy, scenario_path, proxy_eval, out_dir, write_path, alphas, seed, threads, as_json)
        return
    for option, value in (("--proxy-eval", proxy_eval), ("--out", out_dir), ("--write", write_path),
                          ("--seed", seed)):
        if value is not None:
            raise click.UsageError(f"{option} goes with --proxy")
    for option, value in (("--delta", delta), ("--dataset-size", dataset_size), ("--batch-size", batch_size)):
        if value is None:
            raise click.UsageError(f"missing option {option} (or choose the split on proxy data: --proxy, --scenario)")
    if (epochs is None) == (steps is None):
        raise click.UsageError("give exactly one of --epochs or --steps")
    if batch_size > dataset_size:
        raise click.UsageError(f"--batch-size ({batch_size}) must not exceed --dataset-size ({dataset_size})")
    if adjacency != "replace-one":
        raise click.UsageError("--adjacency add-remove cannot account Hybrid's RR phase: randomized response "
                               "protects labels, a replace-one relation")
    if delta >= 1.0 / dataset_size:
        warn(f"delta={delta:g} is not below 1/N={1.0 / dataset_size:.6g}: prefer delta << 1/N")
    if steps is None:
        steps = steps_for_epochs(epochs=epochs, dataset_size=dataset_size, batch_size=batch_size)
    if rule == "grid":
        eps_list = _floats("--epsilons", epsilons) or ((epsilon,) if epsilon else PAPER_EPSILONS)
        rules = [f"alpha={a:g}" for a in (_floats("--alphas", alphas) or PAPER_ALPHAS)]
        if len(eps_list) * len(rules) > MAX_GRID_CELLS:
            raise click.UsageError(f"--rule grid of {len(eps_list)} epsilons x {len(rules)} alphas is "
                                   f"{len(eps_list) * len(rules)} calibrations: at most {MAX_GRID_CELLS} "
                                   "(budgetplan's stated limit)")
    else:
        if epsilons or alphas:
            raise click.UsageError("--epsilons and --alphas go with --rule grid")
        if epsilon is None:
            raise click.UsageError("give --epsilon (or --rule grid)")
        parse_rule(rule, "--rule")
        eps_list, rules = (epsilon,), [rule]
    cells = sweep(eps_list, rules, delta=delta, sampling_rate=batch_size / dataset_size, steps=steps,
                  adjacency=adjacency, method=accountant, progress=not as_json and len(eps_list) * len(rules) > 1,
                  jobs=jobs)
    shape = {"delta": delta, "dataset_size": dataset_size, "batch_size": batch_size, "steps": steps,
             "epochs": epochs, "sampling_rate": batch_size / dataset_size, "adjacency": adjacency,
             "accountant": accountant}
    if as_json:
        if rule == "grid":
            emit_json({"epsilon": None, **shape, "rule": "grid", "results": cells})
        else:
            emit_json({**cells[0], **shape})
        return
    out = console()
    rows = [[c["epsilon"], c["rule"], c["epsilon1"], c["flip_probability"], c["epsilon2"], c["noise_multiplier"],
             c["dpsgd_epsilon"]] for c in cells]
    out.print(results_table(
        f"Hybrid split, delta={fmt(delta)}, N={fmt(dataset_size)}, batch {fmt(batch_size)}, {fmt(steps)} steps "
        f"({adjacency}, {accountant})",
        ["epsilon", "rule", "eps1 (RR)", "flip prob", "eps2 (DP-SGD)", "noise multiplier", "DP-SGD eps"], rows))
    if rule != "grid" and parse_rule(rule).kind == "alpha-by-eps":
        from budgetplan.split import choose_split

        out.print(choose_split(epsilon, rule).reason)
    if rule == "grid":
        table = {}
        for c in cells:
            table.setdefault(c["epsilon"], {})[c["rule"]] = c["noise_multiplier"]
        out.print(results_table("Noise multiplier by total epsilon (rows) and alpha (columns); - : no DP-SGD phase",
                                ["epsilon"] + rules,
                                [[e] + [fmt(table[e][r]) if table[e][r] is not None else "-" for r in rules]
                                 for e in table]))


_ACCOUNTING_ONLY = ("epsilon", "epsilons", "delta", "dataset_size", "batch_size", "epochs", "steps", "rule",
                    "adjacency", "accountant", "jobs")


def _proxy(ctx: click.Context, proxy: str | None, scenario_path: str | None, proxy_eval: str | None,
           out_dir: str | None, write_path: str | None, alphas: str | None, seed: int | None, threads: int | str,
           as_json: bool) -> None:
    """``split --proxy``: the alpha grid on proxy data, the frontier written, the scenario written with the best."""
    from pathlib import Path

    from click.core import ParameterSource

    from budgetplan._files import write_atomic
    from budgetplan.examples import set_key
    from budgetplan.scenario import load_scenario

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

    from trainers.proxy import proxy_grid

    result = proxy_grid(scenario, Path(proxy), eval_path=None if proxy_eval is None else Path(proxy_eval),
                        alphas=grid, out=out, seed=seed, threads=threads,
                        progress=None if as_json else lambda line: click.echo(line, err=True))
    best = result["best_alpha"]
    text = source.read_text(encoding="utf-8")
    text = set_key(text, "algorithm", "split", f"alpha={best:g}")
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
    rows: list[list[str]] = [[fmt(c["alpha"]), fmt(c["auc"], 4),
             "-" if c["relative_auc_loss"] is None else fmt(c["relative_auc_loss"], 3),
             fmt(c["calibration_ratio"], 3), fmt(c["seconds"], 3)] for c in result["cells"]]
    console().print(results_table(
        f"Split chosen on proxy {result['proxy']} ({fmt(result['train_rows'])} rows; non-private AUC "
        f"{fmt(result['baseline_auc'], 4)})", ["alpha", "AUC", "rel. AUC loss %", "calib.", "s"], rows))
    console().print(f"alpha = {best:g} did best; written to {target} with split_evidence. Frontier: {out}")


def load_scenario_text(text: str, name: str) -> Scenario:
    from budgetplan.scenario import parse_scenario

    return parse_scenario(text, default_name=name)
