"""``budgetplan rr``, ``budgetplan gaussian`` and ``budgetplan group``: one-shot releases."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

import click

from budgetplan.cli.render import fmt, params_table, results_table
from budgetplan.cli.shell import OPEN_UNIT, POSITIVE, PROBABILITY, UNIT_CAP, console, emit_json
from budgetplan.errors import BudgetplanError, UnsupportedError

if TYPE_CHECKING:
    from rich.console import Group as RichGroup

    from budgetplan.accounting.guarantee import Guarantee
    from budgetplan.cli.render import Cell
    from budgetplan.units import PrivacyUnit

__all__ = ["rr", "gaussian", "group"]

# Rows of the per-count table (eps / K_i) listed before it skips to K: a table of K rows
# would not fit in memory for the unit caps users give.
_PER_COUNT_ROWS = 100

_JSON = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")

# One accountant's answer: its name, and its guarantee or why it has none.
AccountantRow: TypeAlias = "tuple[str, Guarantee | None, BudgetplanError | None]"


def unit_of_cap(cap: int | None) -> PrivacyUnit:
    from budgetplan.units import PrivacyUnit

    return PrivacyUnit.example() if not cap or cap == 1 else PrivacyUnit.capped(cap)


def accountant_row(accountant: str, fn: Callable[..., Guarantee]) -> AccountantRow:
    """Run one accountant; an unsupported or failing one becomes a row that says why."""
    try:
        return accountant, fn(), None
    except BudgetplanError as exc:
        return accountant, None, exc


def head_guarantee(results: Sequence[AccountantRow]) -> Guarantee:
    """The first guarantee; if every accountant failed, the first failure, re-raised as is."""
    for _, g, _ in results:
        if g is not None:
            return g
    error = results[0][2]
    assert error is not None  # a row without a guarantee holds its error
    raise error


# --------------------------------------------------------------------------- rr


@click.command()
@click.option("--epsilon", type=POSITIVE, help="Budget: per impression, or per unit with --unit-cap.")
@click.option("--flip-probability", type=OPEN_UNIT, help="Flip probability in (0, 0.5); gives epsilon.")
@click.option("--unit-cap", type=UNIT_CAP, default=None, help="K: most examples per unit (user).")
@click.option("--delta", type=PROBABILITY, default=0.0, show_default=True,
              help="With --unit-cap, a delta > 0 allows a larger per-impression budget.")
@click.option("--accountant", type=click.Choice(["exact", "pld", "rdp", "all"]), default="exact",
              show_default=True, help="How the unit-level guarantee is (re-)accounted.")
@_JSON
def rr(epsilon: float | None, flip_probability: float | None, unit_cap: int | None, delta: float, accountant: str,
       as_json: bool) -> None:
    """Randomized response on a binary label (label DP, replace-one adjacency)."""
    from budgetplan.accounting import account
    from budgetplan.accounting import rr as rr_math
    from budgetplan.mechanisms import RandomizedResponse
    from budgetplan.planning.calibrate import rr_per_example_epsilon

    if (epsilon is None) == (flip_probability is None):
        raise click.UsageError("give exactly one of --epsilon or --flip-probability")
    if flip_probability is not None:
        if flip_probability >= 0.5:
            raise click.UsageError(f"--flip-probability must be < 0.5, got {flip_probability!r}")
        if unit_cap and unit_cap > 1:
            raise click.UsageError("--flip-probability describes one impression; use --epsilon with --unit-cap")
        epsilon = rr_math.epsilon_from_flip_probability(flip_probability)
    assert epsilon is not None  # given, or derived from --flip-probability above
    cap = unit_cap or 1
    unit = unit_of_cap(cap)
    splits = rr_per_example_epsilon(epsilon=epsilon, cap=cap, delta=delta)
    rule = "tight" if cap > 1 and delta > 0 else "eps/K"
    per = splits[rule]
    mech = RandomizedResponse(epsilon=per)
    chosen = ["exact", "pld", "rdp"] if accountant == "all" else [accountant]
    results: list[AccountantRow] = []
    for name in chosen:
        if name == "rdp" and delta == 0:
            results.append((name, None, UnsupportedError("rdp gives no pure-DP bound; pass --delta > 0")))
            continue
        results.append(accountant_row(name, lambda n=name: account(mech, delta=delta, adjacency="replace-one",
                                                          unit=unit, method=n)))
    head = head_guarantee(results)
    split_rows: list[dict[str, str | float]] = [
        {"rule": r, "per_impression_epsilon": e, "flip_probability": rr_math.flip_probability(e),
         "unit_epsilon": rr_math.composed_epsilon(e, cap, delta)}
        for r, e in splits.items() if cap > 1 and (r == "eps/K" or delta > 0)
    ]
    payload = {
        "epsilon": head.epsilon, "delta": delta, "accountant": results[0][0], "adjacency": "replace-one",
        "flip_probability": rr_math.flip_probability(per), "per_impression_epsilon": per,
        "unit": unit.to_dict(), "guarantee": head.to_dict(),
    }
    if cap > 1 and as_json:  # the human output names the rule only: no table of K rows to build
        # eps / K_i for the counts K_i a unit may have: the first _PER_COUNT_ROWS, then K itself.
        counts = list(range(1, min(cap, _PER_COUNT_ROWS) + 1)) + ([cap] if cap > _PER_COUNT_ROWS else [])
        by_count = [{"count": k, "per_impression_epsilon": epsilon / k,
                     "flip_probability": rr_math.flip_probability(epsilon / k)} for k in counts]
        payload.update(split_rule=rule, splits=split_rows, per_count=by_count)
    if accountant == "all":
        payload["results"] = [result_dict(n, g, err) for n, g, err in results]
    if as_json:
        emit_json(payload)
        return
    out = console()
    rows: list[tuple[str, Cell]] = [("unit", unit.describe()), ("adjacency", "replace-one (label DP)")]
    flip = rr_math.flip_probability(per) if flip_probability is None else flip_probability
    rows += [("per-impression epsilon", per), ("flip probability", flip), ("keep probability", 1 - flip)]
    out.print(params_table("Randomized response", rows))
    if split_rows:
        out.print(results_table(
            f"Per-impression budget for a unit of at most {cap} impressions, total ({fmt(epsilon)}, {fmt(delta)})",
            ["rule", "per-impression eps", "flip prob", "unit eps at delta"],
            [[s["rule"], s["per_impression_epsilon"], s["flip_probability"], s["unit_epsilon"]]
             for s in split_rows]))
        out.print(f"A unit with K_i < {cap} impressions may use eps/K_i instead "
                  f"(K_i=1: {fmt(epsilon)}, K_i=2: {fmt(epsilon / 2)}, ...); the unit stays at eps.")
    out.print(guarantee_table(results))


def result_dict(name: str, g: Guarantee | None, err: BudgetplanError | None) -> dict[str, object]:
    if g is None:
        return {"accountant": name, "epsilon": None, "error": str(err)}
    return {"accountant": name, "epsilon": g.epsilon, "delta": g.delta, "adjacency": g.adjacency.value,
            "method": g.method, "bound": g.bound, "guarantee": g.to_dict()}


def guarantee_table(results: Sequence[AccountantRow], title: str = "Guarantee") -> RichGroup:
    """The guarantees as a table, their notes once each underneath."""
    from rich.console import Group as RichGroup
    from rich.text import Text

    rows: list[list[Cell]] = []
    notes: list[str] = []
    for name, g, err in results:
        if g is None:
            rows.append([name, "-", "-", f"n/a: {err}"])
            continue
        band = f" in [{fmt(g.epsilon_range[0], 4)}, {fmt(g.epsilon_range[1], 4)}]" if g.epsilon_range else ""
        marks = []
        for note in g.notes + ((g.conversion,) if g.conversion else ()):
            if note not in notes:
                notes.append(note)
            marks.append(str(notes.index(note) + 1))
        rows.append([g.method + (f" [{','.join(marks)}]" if marks else ""), g.epsilon, g.delta, g.bound + band])
    table = results_table(title, ["accountant", "epsilon", "delta", "bound"], rows)
    return RichGroup(table, *[Text(f"[{i}] {n}", style="dim") for i, n in enumerate(notes, 1)])


# --------------------------------------------------------------------- gaussian


@click.command()
@click.option("--epsilon", type=POSITIVE, help="Target epsilon: gives the noise std.")
@click.option("--noise-std", type=POSITIVE, help="Noise std: gives epsilon.")
@click.option("--delta", type=OPEN_UNIT, required=True)
@click.option("--sensitivity", type=POSITIVE, required=True,
              help="L2 sensitivity per example under the adjacency (WALR label change: max ||w x||).")
@click.option("--unit-cap", type=UNIT_CAP, default=None, help="K: the unit sensitivity is K x sensitivity.")
@click.option("--adjacency", type=click.Choice(["replace-one", "add-remove"]), default="replace-one",
              show_default=True)
@click.option("--accountant", type=click.Choice(["exact", "pld", "rdp", "all"]), default="exact",
              show_default=True)
@_JSON
def gaussian(epsilon: float | None, noise_std: float | None, delta: float, sensitivity: float, unit_cap: int | None,
             adjacency: str, accountant: str, as_json: bool) -> None:
    """One Gaussian release (the WALR noisy dot product), exact analytic Gaussian accounting."""
    from budgetplan.accounting import account
    from budgetplan.accounting import gaussian as gauss
    from budgetplan.mechanisms import GaussianRelease
    from budgetplan.planning.calibrate import gaussian_noise_std

    if (epsilon is None) == (noise_std is None):
        raise click.UsageError("give exactly one of --epsilon or --noise-std")
    cap = unit_cap or 1
    unit = unit_of_cap(cap)
    if epsilon is not None:
        noise_std = gaussian_noise_std(epsilon=epsilon, delta=delta, sensitivity=sensitivity, cap=cap).value
        classical_std = gauss.classical_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity * cap)
        classical = {"noise_std": classical_std, "valid": epsilon < gauss.CLASSICAL_VALID_BELOW}
    assert noise_std is not None  # given, or calibrated from --epsilon above
    mech = GaussianRelease(noise_std=noise_std, sensitivity=sensitivity)
    chosen = ["exact", "pld", "rdp"] if accountant == "all" else [accountant]
    results = [accountant_row(n, lambda n=n: account(mech, delta=delta, adjacency=adjacency, unit=unit, method=n))
               for n in chosen]
    head = head_guarantee(results)
    if epsilon is None:
        cl = account(mech, delta=delta, adjacency=adjacency, unit=unit, method="classical")
        classical = {"epsilon": cl.epsilon, "valid": cl.bound != "invalid"}
    payload = {"epsilon": head.epsilon, "delta": delta, "accountant": results[0][0], "adjacency": adjacency,
               "noise_std": noise_std, "sensitivity": sensitivity, "unit_sensitivity": sensitivity * cap,
               "unit": unit.to_dict(), "classical": classical, "guarantee": head.to_dict()}
    if accountant == "all":
        payload["results"] = [result_dict(n, g, err) for n, g, err in results]
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(params_table("Gaussian release", [
        ("unit", unit.describe()), ("adjacency", adjacency), ("sensitivity", sensitivity),
        ("unit sensitivity", sensitivity * cap), ("noise std", noise_std),
        ("noise std / unit sensitivity", noise_std / (sensitivity * cap))]))
    out.print(guarantee_table(results))
    if "noise_std" in classical:
        verdict = "valid (eps < 1), over-noised" if classical["valid"] else "OUTSIDE its validity (eps >= 1)"
        out.print(f"classical formula, for comparison only: noise std {fmt(classical['noise_std'])} - {verdict}")
    else:
        verdict = "valid (eps < 1)" if classical["valid"] else "OUTSIDE its validity (eps >= 1): not a guarantee"
        out.print(f"classical formula, for comparison only: epsilon {fmt(classical['epsilon'])} - {verdict}")


# ------------------------------------------------------------------------ group


@click.command()
@click.option("--epsilon", type=POSITIVE, required=True, help="Example-level epsilon.")
@click.option("--delta", type=PROBABILITY, required=True, help="Example-level delta.")
@click.option("--group-size", type=UNIT_CAP, required=True, help="K: examples per group.")
@_JSON
def group(epsilon: float, delta: float, group_size: int, as_json: bool) -> None:
    """Generic group privacy: (K eps, delta (e^{K eps} - 1) / (e^eps - 1)) for any mechanism."""
    from budgetplan.accounting.group import group_privacy

    eps_k, delta_k = group_privacy(epsilon=epsilon, delta=delta, group_size=group_size)
    payload = {"epsilon": eps_k, "delta": delta_k, "accountant": "group-privacy", "adjacency": None,
               "group_size": group_size, "example_epsilon": epsilon, "example_delta": delta,
               "vacuous": delta_k >= 1 or not math.isfinite(eps_k)}
    if as_json:
        emit_json(payload)
        return
    out = console()
    out.print(params_table(f"Group privacy, K = {group_size}", [
        ("example-level", f"({fmt(epsilon)}, {fmt(delta)})"),
        ("group-level", f"({fmt(eps_k)}, {fmt(delta_k)})"),
        ("formula", "(K eps, delta (e^{K eps} - 1) / (e^eps - 1)), Vadhan 2017 Lemma 2.2")]))
    if payload["vacuous"]:
        out.print("warning: the group-level delta reaches 1: this bound says nothing", style="bold red")
