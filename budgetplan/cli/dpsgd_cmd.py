"""``budgetplan dpsgd``: account, calibrate, or solve for epochs or rows.

Exactly one unknown is solved for:
- ``--noise-multiplier`` given, no ``--epsilon``: the epsilon it costs;
- ``--epsilon`` given, no ``--noise-multiplier``: the smallest noise multiplier;
- both given, no ``--epochs``/``--steps``: the most epochs (and steps) that fit;
- both given, no ``--dataset-size``: the fewest rows for which the epochs fit.

``--batch-selection allocation`` (each example in one random step of every epoch) and
``--batch-selection shuffle`` (fixed batches of B from a permutation per epoch) answer the
first two questions, over whole epochs of N // B steps, each with its own accounting
(``budgetplan.accounting.batch_selection``); the Poisson figure is shown beside them, labelled as what
Poisson sampling would give, and for shuffled batches Chua et al.'s lower bound too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, TypedDict

import click

from budgetplan.cli.release_cmds import accountant_row, guarantee_table, head_guarantee, result_dict, unit_of_cap
from budgetplan.cli.render import fmt, params_table, results_table
from budgetplan.cli.shell import (
    BATCH_SIZE,
    DATASET_SIZE,
    EPOCHS,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_INT,
    UNIT_CAP,
    console,
    emit_json,
    warn,
)
from budgetplan.errors import BudgetplanError, InvalidParameterError

if TYPE_CHECKING:
    from rich.table import Table

    from budgetplan.accounting.guarantee import Guarantee
    from budgetplan.cli.release_cmds import AccountantRow
    from budgetplan.cli.render import Cell
    from budgetplan.mechanisms import PoissonDPSGD, TruncatedPoissonDPSGD
    from budgetplan.planning.calibrate import Calibration
    from budgetplan.units import PrivacyUnit

__all__ = ["dpsgd"]

_ACCOUNTANTS = ("pld", "rdp", "prv")


class _Shape(TypedDict):
    """The run's shape as the JSON reports it (``_shape``)."""

    batch_size: int
    max_batch_size: int | None
    unit: PrivacyUnit
    unit_accounting: str
    discretization: float


class _Ctx(_Shape):
    """What every DP-SGD question shares: the shape, the delta and the adjacency."""

    delta: float
    adjacency: str


@click.command()
@click.option("--noise-multiplier", type=POSITIVE, help="sigma: noise std in units of the clipping norm.")
@click.option("--epsilon", type=POSITIVE, help="Target epsilon.")
@click.option("--delta", type=OPEN_UNIT, required=True)
@click.option("--dataset-size", type=DATASET_SIZE, help="N: rows (after capping).")
@click.option("--batch-size", type=BATCH_SIZE, required=True, help="B: expected batch size; q = B / N.")
@click.option("--epochs", type=EPOCHS, help="Passes over the data; steps = ceil(epochs N / B).")
@click.option("--steps", type=POSITIVE_INT, help="Noisy steps T (instead of --epochs).")
@click.option("--batch-selection", type=click.Choice(["poisson", "allocation", "shuffle"]), default="poisson",
              show_default=True, help="How batches are drawn: Poisson, random allocation (each example once per "
              "epoch, in a random step) or shuffled fixed-size batches (no amplification claimed).")
@click.option("--max-batch-size", type=BATCH_SIZE, default=None,
              help="Truncated Poisson: batches above this size are cut to it (accounted as such).")
@click.option("--unit-cap", type=UNIT_CAP, default=None, help="K: most examples per unit (user).")
@click.option("--unit-accounting", type=click.Choice(["tight", "group"]), default="tight", show_default=True,
              help="For --unit-cap: mixture of Gaussians (tight; the double mixture under replace-one) or generic "
                   "group privacy.")
@click.option("--adjacency", type=click.Choice(["add-remove", "replace-one"]), default="add-remove",
              show_default=True)
@click.option("--accountant", type=click.Choice(list(_ACCOUNTANTS) + ["all"]), default="pld", show_default=True)
@click.option("--discretization", type=POSITIVE, default=1e-4, show_default=True, help="PLD grid spacing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
def dpsgd(noise_multiplier: float | None, epsilon: float | None, delta: float, dataset_size: int | None,
          batch_size: int, epochs: float | None, steps: int | None, batch_selection: str, max_batch_size: int | None,
          unit_cap: int | None, unit_accounting: str, adjacency: str, accountant: str, discretization: float,
          as_json: bool) -> None:
    """DP-SGD: epsilon, noise multiplier, most epochs or fewest rows; Poisson, allocation or shuffled batches."""
    if epochs is not None and steps is not None:
        raise click.UsageError("give at most one of --epochs or --steps")
    if batch_selection != "poisson":
        _check_accountant(batch_selection, accountant)
        _epoch_selection(batch_selection, noise_multiplier, epsilon, delta, dataset_size, batch_size, epochs, steps,
                         max_batch_size, unit_cap, unit_accounting, adjacency, accountant, discretization, as_json)
        return
    if noise_multiplier is None and epsilon is None:
        raise click.UsageError("give --noise-multiplier (to get epsilon) or --epsilon (to get the noise multiplier)")
    have_length = epochs is not None or steps is not None
    if dataset_size is None and (noise_multiplier is None or epsilon is None or not have_length):
        raise click.UsageError("--dataset-size is required unless solving for it (give --noise-multiplier, "
                               "--epsilon and --epochs)")
    if dataset_size is not None and batch_size > dataset_size:
        raise click.UsageError(f"--batch-size ({batch_size}) must not exceed --dataset-size ({dataset_size})")
    if max_batch_size is not None:
        _check_truncation(batch_size, max_batch_size, dataset_size, noise_multiplier, epsilon)
        if (unit_cap or 1) > 1 and unit_accounting == "tight":
            raise click.UsageError("truncated Poisson batches with --unit-cap need --unit-accounting group")
    if not have_length and not (noise_multiplier is not None and epsilon is not None):
        raise click.UsageError("give --epochs or --steps")
    from budgetplan.util.validate import delta_warning

    doubtful = delta_warning(delta, dataset_size) if dataset_size is not None else None
    if doubtful is not None:
        warn(doubtful)
    unit = unit_of_cap(unit_cap)
    ctx: _Ctx = dict(delta=delta, batch_size=batch_size, unit=unit, unit_accounting=unit_accounting,
               adjacency=adjacency, discretization=discretization, max_batch_size=max_batch_size)
    chosen = list(_ACCOUNTANTS) if accountant == "all" else [accountant]
    if noise_multiplier is not None and epsilon is not None:
        if have_length and dataset_size is not None:
            raise click.UsageError("everything is given: drop --epsilon to get it, or drop --epochs/--steps or "
                                   "--dataset-size to solve for it")
        if not have_length:
            assert dataset_size is not None  # required above when solving for epochs
            _solve_epochs(noise_multiplier, epsilon, dataset_size, chosen, ctx, as_json)
        else:
            _solve_rows(noise_multiplier, epsilon, epochs, steps, chosen, ctx, as_json)
        return
    assert dataset_size is not None  # required above unless solving for it
    if steps is None:
        assert epochs is not None  # --epochs or --steps, checked above
        steps = _steps(epochs, dataset_size, batch_size)
    q = batch_size / dataset_size
    if epsilon is not None:
        _calibrate(epsilon, q, steps, dataset_size, epochs, chosen, ctx, as_json)
    else:
        assert noise_multiplier is not None  # --noise-multiplier or --epsilon, checked above
        _forward(noise_multiplier, q, steps, dataset_size, epochs, chosen, ctx, as_json)


def _check_truncation(batch_size: int, max_batch_size: int, dataset_size: int | None, noise_multiplier: float | None,
                      epsilon: float | None) -> None:
    """The scenario's rule for truncated Poisson, and only the questions it can answer."""
    from budgetplan.scenario.model import check_max_batch_size

    if noise_multiplier is None or epsilon is not None or dataset_size is None:
        raise click.UsageError("--max-batch-size is accounted for a given --noise-multiplier, --dataset-size and "
                               "length only (no calibration or solving for epochs or rows)")
    try:
        check_max_batch_size(batch_size, max_batch_size, dataset_size,
                             names=("--batch-size", "--max-batch-size", "--dataset-size"))
    except InvalidParameterError as exc:
        raise click.UsageError(str(exc)) from None


def _check_accountant(batch_selection: str, accountant: str) -> None:
    """Refuse an --accountant the batch selection's mechanism has no accounting by (``account``'s one table)."""
    from budgetplan.accounting.account import supports
    from budgetplan.accounting.batch_selection import MECHANISM_TYPES

    if not supports(MECHANISM_TYPES[batch_selection], accountant):
        raise click.UsageError(f"--accountant {accountant} does not apply to --batch-selection {batch_selection} "
                               f"(allocation: pld or rdp; shuffle: its own exact accounting), got {accountant!r}")


def _steps(epochs: float, n: int, b: int) -> int:
    from budgetplan.planning.calibrate import steps_for_epochs

    return steps_for_epochs(epochs=epochs, dataset_size=n, batch_size=b)


def _mechanism(sigma: float, q: float, steps: int, n: int,
               max_batch_size: int | None) -> PoissonDPSGD | TruncatedPoissonDPSGD:
    from budgetplan.mechanisms import PoissonDPSGD, TruncatedPoissonDPSGD

    if max_batch_size is not None:
        return TruncatedPoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps, dataset_size=n,
                                     max_batch_size=max_batch_size)
    return PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps)


def _account(sigma: float, q: float, steps: int, n: int, method: str, ctx: _Ctx,
             unit_accounting: str | None = None) -> Guarantee:
    from budgetplan.accounting import account

    return account(_mechanism(sigma, q, steps, n, ctx["max_batch_size"]), delta=ctx["delta"],
                   adjacency=ctx["adjacency"], unit=ctx["unit"], method=method,
                   unit_accounting=unit_accounting or ctx["unit_accounting"], discretization=ctx["discretization"])


def _user_level_rows(sigma: float, q: float, steps: int, n: int, ctx: _Ctx) -> list[AccountantRow]:
    """What each way of bounding a unit's K examples costs, side by side."""
    rows = []
    if ctx["max_batch_size"] is None:
        tight = "mixture-of-gaussians" if ctx["adjacency"] == "add-remove" else "double-mixture-of-gaussians"
        rows.append(accountant_row(tight, lambda: _account(sigma, q, steps, n, "pld", ctx, "tight")))
    rows.append(accountant_row("group(pld)", lambda: _account(sigma, q, steps, n, "pld", ctx, "group")))
    if ctx["max_batch_size"] is None and ctx["adjacency"] == "add-remove":
        rows.append(accountant_row("group(rdp)", lambda: _account(sigma, q, steps, n, "rdp", ctx, "group")))
    if ctx["max_batch_size"] is None:
        # the other execution: units sampled at the same q, each unit's summed gradient clipped once
        rows.append(accountant_row("unit-sampling", lambda: _unit_sampled(sigma, q, steps, ctx)))
    return rows


def _unit_sampled(sigma: float, q: float, steps: int, ctx: _Ctx) -> Guarantee:
    from budgetplan.accounting import account
    from budgetplan.mechanisms import UnitPoissonDPSGD

    return account(UnitPoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps), delta=ctx["delta"],
                   adjacency=ctx["adjacency"], unit=ctx["unit"], discretization=ctx["discretization"])


def _shape(q: float, steps: int, n: int, epochs: float | None, ctx: _Shape) -> dict[str, object]:
    return {"sampling_rate": q, "steps": steps, "dataset_size": n, "batch_size": ctx["batch_size"],
            "epochs": epochs, "max_batch_size": ctx["max_batch_size"], "unit": ctx["unit"].to_dict(),
            "unit_accounting": ctx["unit_accounting"], "discretization": ctx["discretization"]}


def _forward(sigma: float, q: float, steps: int, n: int, epochs: float | None, chosen: list[str], ctx: _Ctx,
             as_json: bool) -> None:
    results = [accountant_row(m, lambda m=m: _account(sigma, q, steps, n, m, ctx)) for m in chosen]
    head = head_guarantee(results)
    payload = {"epsilon": head.epsilon, "delta": ctx["delta"], "accountant": chosen[0],
               "adjacency": ctx["adjacency"], "noise_multiplier": sigma, **_shape(q, steps, n, epochs, ctx),
               "guarantee": head.to_dict()}
    if len(chosen) > 1:
        payload["results"] = [result_dict(m, g, e) for m, g, e in results]
    user_rows = _user_level_rows(sigma, q, steps, n, ctx) if ctx["unit"].cap > 1 else []
    if user_rows:
        payload["unit_accounting_options"] = [result_dict(m, g, e) for m, g, e in user_rows]
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(_params(sigma, q, steps, n, epochs, ctx))
    if user_rows and len(chosen) == 1:
        out.print(guarantee_table(user_rows, f"Ways of bounding a unit of {ctx['unit'].cap} examples "
                                              f"(first: {results[0][1].method if results[0][1] else chosen[0]})"))
        return
    out.print(guarantee_table(results))
    if user_rows:
        out.print(guarantee_table(user_rows, f"Ways of bounding a unit of {ctx['unit'].cap} examples"))


def _calibrate(epsilon: float, q: float, steps: int, n: int, epochs: float | None, chosen: list[str], ctx: _Ctx,
               as_json: bool) -> None:
    from budgetplan.planning.calibrate import dpsgd_noise_multiplier

    cals: list[tuple[str, Calibration | None, BudgetplanError | None]] = []
    for m in chosen:
        try:
            cal = dpsgd_noise_multiplier(epsilon=epsilon, delta=ctx["delta"], sampling_rate=q, steps=steps,
                                         adjacency=ctx["adjacency"], unit=ctx["unit"], method=m,
                                         unit_accounting=ctx["unit_accounting"],
                                         discretization=ctx["discretization"])
            cals.append((m, cal, None))
        except BudgetplanError as exc:
            if len(chosen) == 1:
                raise
            cals.append((m, None, exc))
    head = next((c for _, c, _ in cals if c is not None), None)
    if head is None:
        error = cals[0][2]
        assert error is not None  # a calibration that failed holds its error
        raise error
    payload = {"epsilon": head.guarantee.epsilon, "target_epsilon": epsilon, "delta": ctx["delta"],
               "accountant": chosen[0], "adjacency": ctx["adjacency"], "noise_multiplier": head.value,
               "verified_epsilon": head.verified_epsilon, **_shape(q, steps, n, epochs, ctx),
               "guarantee": head.guarantee.to_dict()}
    if len(chosen) > 1:
        payload["results"] = [
            {"accountant": m, "noise_multiplier": c.value, **result_dict(m, c.guarantee, None)} if c else
            {"accountant": m, "noise_multiplier": None, "error": str(e)} for m, c, e in cals]
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(_params(head.value, q, steps, n, epochs, ctx, target=epsilon))
    rows = [[m, c.value, c.guarantee.epsilon, c.verified_epsilon, c.evaluations] if c else
            [m, "-", "-", "-", f"n/a: {e}"] for m, c, e in cals]
    out.print(results_table(f"Smallest noise multiplier for epsilon <= {fmt(epsilon)}",
                            ["accountant", "noise multiplier", "epsilon", "epsilon at half the grid", "evaluations"],
                            rows))


def _solve_epochs(sigma: float, epsilon: float, n: int, chosen: list[str], ctx: _Ctx, as_json: bool) -> None:
    from budgetplan.planning.calibrate import dpsgd_max_steps

    q = ctx["batch_size"] / n
    m = chosen[0]
    cal = dpsgd_max_steps(noise_multiplier=sigma, sampling_rate=q, epsilon=epsilon, delta=ctx["delta"],
                          adjacency=ctx["adjacency"], unit=ctx["unit"], method=m,
                          unit_accounting=ctx["unit_accounting"], discretization=ctx["discretization"])
    steps = int(cal.value)
    epochs = steps * ctx["batch_size"] / n
    payload = {"epsilon": cal.guarantee.epsilon, "target_epsilon": epsilon, "delta": ctx["delta"],
               "accountant": m, "adjacency": ctx["adjacency"], "noise_multiplier": sigma,
               "max_steps": steps, "max_epochs": epochs, "max_whole_epochs": math.floor(epochs + 1e-12),
               **_shape(q, steps, n, epochs, ctx), "guarantee": cal.guarantee.to_dict()}
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(_params(sigma, q, steps, n, epochs, ctx, target=epsilon))
    out.print(f"at most {fmt(steps)} steps = {fmt(epochs, 5)} epochs "
              f"({math.floor(epochs + 1e-12)} whole) fit epsilon <= {fmt(epsilon)}; at that length epsilon = "
              f"{fmt(cal.guarantee.epsilon)} ({cal.guarantee.method})")


def _solve_rows(sigma: float, epsilon: float, epochs: float | None, steps: int | None, chosen: list[str], ctx: _Ctx,
                as_json: bool) -> None:
    from budgetplan.planning.calibrate import dpsgd_min_dataset_size

    if epochs is None:
        raise click.UsageError("solving for --dataset-size needs --epochs (steps grow with the data)")
    m = chosen[0]
    cal = dpsgd_min_dataset_size(noise_multiplier=sigma, batch_size=ctx["batch_size"], epochs=epochs,
                                 epsilon=epsilon, delta=ctx["delta"], adjacency=ctx["adjacency"],
                                 unit=ctx["unit"], method=m, unit_accounting=ctx["unit_accounting"],
                                 discretization=ctx["discretization"])
    n = int(cal.value)
    q, t = ctx["batch_size"] / n, _steps(epochs, n, ctx["batch_size"])
    payload = {"epsilon": cal.guarantee.epsilon, "target_epsilon": epsilon, "delta": ctx["delta"],
               "accountant": m, "adjacency": ctx["adjacency"], "noise_multiplier": sigma,
               "min_dataset_size": n, **_shape(q, t, n, epochs, ctx), "guarantee": cal.guarantee.to_dict()}
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(_params(sigma, q, t, n, epochs, ctx, target=epsilon))
    out.print(f"at least {fmt(n)} rows are needed for {fmt(epochs)} epochs within epsilon <= {fmt(epsilon)}; "
              f"there epsilon = {fmt(cal.guarantee.epsilon)} ({cal.guarantee.method})")


def _params(sigma: float, q: float, steps: int, n: int, epochs: float | None, ctx: _Ctx,
            target: float | None = None) -> Table:
    rows: list[tuple[str, Cell]] = [
            ("unit", ctx["unit"].describe()), ("adjacency", ctx["adjacency"]), ("noise multiplier", sigma),
            ("sampling rate q", q), ("steps", steps), ("dataset size", n), ("batch size", ctx["batch_size"])]
    if epochs is not None:
        rows.append(("epochs", epochs))
    if ctx["max_batch_size"] is not None:
        rows.append(("max batch size (truncated)", ctx["max_batch_size"]))
    rows.append(("delta", ctx["delta"]))
    if target is not None:
        rows.append(("target epsilon", target))
    return params_table("DP-SGD, Poisson sampling", rows)


def _epoch_selection(selection: str, sigma: float | None, epsilon: float | None, delta: float, n: int | None,
                     batch_size: int, epochs: float | None, steps: int | None, max_batch_size: int | None,
                     unit_cap: int | None, unit_accounting: str, adjacency: str, accountant: str, discretization: float,
                     as_json: bool) -> None:
    """Allocation or shuffled batches: epsilon at a noise multiplier, or the noise multiplier for an epsilon."""
    from budgetplan.accounting import account
    from budgetplan.accounting import batch_selection as bs
    from budgetplan.accounting.shuffle import lower_epsilon
    from budgetplan.planning.calibrate import solve_noise_multiplier

    if max_batch_size is not None:
        raise click.UsageError("--max-batch-size applies to --batch-selection poisson only")
    if (sigma is None) == (epsilon is None):
        raise click.UsageError(f"--batch-selection {selection} answers one question: give --noise-multiplier (to "
                               "get epsilon) or --epsilon (to get the noise multiplier), not both")
    if n is None or (epochs is None and steps is None):
        raise click.UsageError(f"--batch-selection {selection} needs --dataset-size and --epochs or --steps")
    if batch_size > n:
        raise click.UsageError(f"--batch-size ({batch_size}) must not exceed --dataset-size ({n})")
    t, whole = bs.epoch_steps(dataset_size=n, batch_size=batch_size, epochs=epochs, steps=steps,
                              names=("--epochs", "--steps"))
    unit = unit_of_cap(unit_cap)
    q = batch_size / n

    def guarantee(x: float, sampling: str = selection) -> Guarantee:
        mech = bs.mechanism(sampling, x, dataset_size=n, batch_size=batch_size, steps=t)
        method = bs.method_for(sampling, accountant if sampling == selection else "pld")
        return account(mech, delta=delta, adjacency=adjacency, unit=unit, method=method,
                       unit_accounting=unit_accounting if unit.cap > 1 else "tight", discretization=discretization)

    if sigma is None:
        assert epsilon is not None  # exactly one of the two, checked above
        sigma = solve_noise_multiplier(lambda x: guarantee(x).epsilon, epsilon=epsilon)
    head = guarantee(sigma)
    poisson = accountant_row("poisson", lambda: guarantee(sigma, "poisson"))
    lower = lower_epsilon(noise_multiplier=sigma, steps_per_epoch=t // whole, epochs=whole, delta=delta) \
        if selection == "shuffle" and unit.cap == 1 else None
    payload = {"batch_selection": selection, "epsilon": head.epsilon, "target_epsilon": epsilon, "delta": delta,
               "adjacency": adjacency, "noise_multiplier": sigma, "steps_per_epoch": t // whole, "epochs": whole,
               **_shape(q, t, n, whole, {"batch_size": batch_size, "max_batch_size": None, "unit": unit,
                                         "unit_accounting": unit_accounting, "discretization": discretization}),
               "guarantee": head.to_dict(),
               "poisson_epsilon": poisson[1].epsilon if poisson[1] is not None else None,
               "poisson_is_guarantee": False, "shuffle_lower_bound": lower}
    if as_json:
        emit_json(payload)
        return
    out = console()
    rows: list[tuple[str, Cell]] = [("batch selection", selection), ("unit", unit.describe()), ("adjacency", adjacency),
            ("noise multiplier", sigma), ("steps per epoch (N // B)", t // whole), ("epochs", whole),
            ("steps", t), ("dataset size", n), ("batch size", batch_size), ("delta", delta)]
    if epsilon is not None:
        rows.append(("target epsilon", epsilon))
    out.print(params_table(f"DP-SGD, {selection} batches", rows))
    table: list[list[Cell]] = [[f"{selection}: the guarantee", head.epsilon, delta, head.bound, head.method]]
    if lower is not None:
        table.append(["shuffle: lower bound (Chua et al.)", lower, delta, "lower", "arXiv:2403.17673"])
    if poisson[1] is not None:
        table.append(["Poisson at q = B/N: NOT a guarantee here", poisson[1].epsilon, delta, "what Poisson would give",
                      poisson[1].method])
    out.print(results_table(f"DP-SGD with {selection} batches", ["", "epsilon", "delta", "bound", "method"], table))
    for i, note in enumerate(head.notes + ((head.conversion,) if head.conversion else ()), 1):
        out.print(f"[{i}] {note}", style="dim", markup=False, highlight=False)
