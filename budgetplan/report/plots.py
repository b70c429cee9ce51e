"""Figures people would rather look at than read: epsilon curves and utility frontiers.

Data and drawing are separate: ``epsilon_curve`` and ``frontier`` return plain rows (also
what ``--json`` prints); ``plot_epsilon_curve`` and ``plot_frontier`` draw them to a PNG
with matplotlib (imported lazily, Agg backend: no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from budgetplan.accounting import account
from budgetplan.audit.run import find_plan
from budgetplan.errors import AccountingError, BudgetplanError, InvalidParameterError
from budgetplan.mechanisms import PoissonDPSGD
from budgetplan.plan import Plan
from budgetplan.record.records import load_record
from budgetplan.util import validate
from budgetplan.util.fileio import atomic_output

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["epsilon_curve", "plot_epsilon_curve", "frontier", "plot_frontier", "arm_of", "agg_pyplot", "save_png"]

_STYLE = {"pld": "-", "rdp": "--", "prv": ":"}


def epsilon_curve(*, noise_multipliers: Iterable[float], sampling_rate: float, steps_per_epoch: int,
                  epochs: Iterable[float], delta: float, accountants: Sequence[str] = ("pld", "rdp", "prv"),
                  adjacency: str = "add-remove", prv_points: int = 6) -> list[dict[str, Any]]:
    """Epsilon after each number of epochs, per noise multiplier and accountant.

    PLD reuses one single-step distribution per noise multiplier and only re-composes, so a
    long curve costs little; RDP is cheap anyway; PRV (slow, an estimate with an error
    band) is evaluated at ``prv_points`` epochs spread over the range.

    Returns:
        rows of {"accountant", "noise_multiplier", "epochs", "steps", "epsilon",
        "epsilon_low", "epsilon_high"} (the last two for PRV's band, else equal).
    """
    q = validate.probability("sampling_rate", sampling_rate, allow_one=True)
    per_epoch = validate.positive_int("steps_per_epoch", steps_per_epoch)
    delta = validate.open_unit("delta", delta)
    points_all = [validate.positive("epochs", e) for e in epochs]
    sigmas = [validate.positive("noise_multiplier", s) for s in noise_multipliers]
    unknown = set(accountants) - set(_STYLE)
    if unknown:
        raise InvalidParameterError(f"accountants must be among pld, rdp, prv, got {sorted(unknown)}")
    rows: list[dict[str, Any]] = []
    for sigma in sigmas:
        for acc in accountants:
            points = points_all
            if acc == "prv" and len(points_all) > prv_points:
                idx = sorted({round(i * (len(points_all) - 1) / (prv_points - 1)) for i in range(prv_points)})
                points = [points_all[i] for i in idx]
            for e in points:
                steps = max(1, math.ceil(e * per_epoch - 1e-9))
                mech = PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps)
                try:
                    g = account(mech, delta=delta, adjacency=adjacency, method=acc)
                except BudgetplanError as exc:
                    rows.append({"accountant": acc, "noise_multiplier": sigma, "epochs": e, "steps": steps,
                                 "epsilon": None, "error": str(exc)})
                    continue
                low, high = g.epsilon_range if g.epsilon_range else (g.epsilon, g.epsilon)
                rows.append({"accountant": acc, "noise_multiplier": sigma, "epochs": e, "steps": steps,
                             "epsilon": g.epsilon, "epsilon_low": low, "epsilon_high": high})
    return rows


def agg_pyplot() -> ModuleType:
    # matplotlib is optional (the ``train`` extra): imported only to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_epsilon_curve(rows: list[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Epsilon against epochs: one colour per noise multiplier, one line style per accountant."""
    drawable = [r for r in rows if r.get("epsilon") is not None and math.isfinite(r["epsilon"])]
    if not drawable:
        why = next((r["error"] for r in rows if r.get("error")), "every epsilon is infinite")
        raise AccountingError(f"nothing to draw: no point of the curve has a finite epsilon ({why})")
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    sigmas = sorted({r["noise_multiplier"] for r in drawable})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, sigma in enumerate(sigmas):
        for acc in ("pld", "rdp", "prv"):
            pts = [r for r in drawable if r["noise_multiplier"] == sigma and r["accountant"] == acc]
            if not pts:
                continue
            xs, ys = [p["epochs"] for p in pts], [p["epsilon"] for p in pts]
            ax.plot(xs, ys, _STYLE[acc], color=colours[i % len(colours)], marker="o" if acc == "prv" else None,
                    label=f"sigma={sigma:g}, {acc}")
            if acc == "prv":
                ax.fill_between(xs, [p["epsilon_low"] for p in pts], [p["epsilon_high"] for p in pts],
                                color=colours[i % len(colours)], alpha=0.15)
    ax.set_xlabel("epochs")
    ax.set_ylabel("epsilon")
    ax.set_title(title or "epsilon against epochs (PLD solid, RDP dashed, PRV dotted with its band)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_png(fig, path)


def arm_of(plan: Plan) -> tuple[str, float | None]:
    """The paper's arm of a plan: ("RR" | "DP-SGD" | "Hybrid" | algorithm, alpha or None)."""
    # a DP count of N and an intercept calibration are no arm; alpha is the RR share of the
    # training phases' epsilon (a calibration release takes its share before the split)
    names = [p.name for p in plan.phases if p.name not in ("count", "calibration")]
    parts = plan.rr is not None and plan.rr.params.unit_part is not None
    if plan.scenario.algorithm == "hybrid" and not parts:  # a units split has no alpha: each phase has it all
        eps1 = plan.rr.target_epsilon if plan.rr is not None else 0.0
        eps2 = plan.dpsgd.target_epsilon if plan.dpsgd is not None else 0.0
        alpha = eps1 / (eps1 + eps2) if eps1 + eps2 > 0 else None
    else:
        alpha = None
    if names == ["rr"]:
        return "RR", alpha
    if names == ["dpsgd"]:
        return "DP-SGD", alpha
    if names == ["rr", "dpsgd"]:
        return "Hybrid", alpha
    return plan.scenario.algorithm.upper(), alpha


def frontier(run_paths: Iterable[str | Path], *, baseline_auc: float | None = None) -> list[dict[str, Any]]:
    """One row per run: its arm, the plan's guarantee (epsilon, delta, adjacency, unit), AUC and relative AUC loss.

    Each run directory must hold its ``plan.json`` (trainers copy it there) and its private
    record (the metrics are computed on private labels). The relative AUC loss is the one
    in the record, or computed against ``baseline_auc``.
    """
    rows: list[dict[str, Any]] = []
    for raw in run_paths:
        path = Path(raw)
        record = load_record(path, private=True)
        if not record.private:
            continue
        plan = find_plan(path, None)
        if record.plan_sha256 != plan.sha256:
            raise InvalidParameterError(f"{path}: the record names plan {record.plan_sha256}, not the plan beside it")
        ev = record.metrics.get("eval") or {}
        if "auc" not in ev:
            raise InvalidParameterError(f"{path}: the run has no eval metrics (train it with --eval)")
        if ev["auc"] is None:
            raise InvalidParameterError(f"{path}: the run's model diverged ({ev.get('diverged')}): it has no AUC")
        rel = ev.get("relative_auc_loss")
        if baseline_auc is not None:
            rel = 100.0 * ((1 - ev["auc"]) - (1 - baseline_auc)) / (1 - baseline_auc)
        if rel is None:
            raise InvalidParameterError(f"{path}: no relative AUC loss (train it with --baseline, or pass one)")
        arm, alpha = arm_of(plan)
        rows.append({"run": str(path), "arm": arm, "alpha": alpha, "epsilon": plan.epsilon, "delta": plan.delta,
                     "adjacency": plan.adjacency.value, "unit": plan.unit.describe(), "auc": ev["auc"],
                     "calibration_ratio": ev.get("calibration_ratio"), "relative_auc_loss": rel,
                     "plan_sha256": plan.sha256})
    return sorted(rows, key=lambda r: (r["arm"], r["unit"], r["adjacency"], r["epsilon"], r["delta"]))


def _guarantee_of(row: dict[str, Any]) -> tuple[str, str, float]:
    """What a point's guarantee protects: runs are only pooled when all of it agrees."""
    return row["unit"], row["adjacency"], row["delta"]


def plot_frontier(rows: list[dict[str, Any]], path: str | Path, *, title: str | None = None) -> Path:
    """Relative AUC loss against epsilon, one series per arm and guarantee.

    Runs are pooled (mean, and half the range as the error bar) only when they share the
    arm, the epsilon and everything else the guarantee protects: the privacy unit, the
    adjacency and delta. Runs that differ in any of these are separate series, labelled by
    what differs, never averaged into one point.
    """
    plt = agg_pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    guarantees = sorted({_guarantee_of(r) for r in rows})
    for arm, g in sorted({(r["arm"], _guarantee_of(r)) for r in rows}):
        by_eps: dict[float, list[float]] = {}
        for r in rows:
            if r["arm"] == arm and _guarantee_of(r) == g:
                by_eps.setdefault(r["epsilon"], []).append(r["relative_auc_loss"])
        xs = sorted(by_eps)
        means = [sum(by_eps[x]) / len(by_eps[x]) for x in xs]
        spread = [(max(by_eps[x]) - min(by_eps[x])) / 2 for x in xs]
        label = arm if len(guarantees) == 1 else f"{arm}, {g[0]}, {g[1]}, delta {g[2]:.2g}"
        ax.errorbar(xs, means, yerr=spread, marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("total epsilon")
    ax.set_ylabel("relative AUC loss (%)")
    ax.set_title(title or "utility against privacy (lower is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return save_png(fig, path)


def save_png(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    try:
        if path.suffix.lower() != ".png":
            raise InvalidParameterError(f"plots are written as PNG: the output must end in .png, got {path.name}")
        with atomic_output(path) as tmp:
            fig.tight_layout()
            fig.savefig(tmp, format="png")
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return path
