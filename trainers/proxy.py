"""Choose Hybrid's split on proxy data: the alpha grid trained where trying costs no privacy.

Which split is best moves with the data and with N (benchmarks/results/utility_frontier.md).
On the private data, trying several splits and keeping the best spends privacy (a
``[tuning]`` grid accounts for it). On data the user may use freely (historic data under
another policy, public data, synthetic data with the same schema), it does not. So:

1. the proxy's units are split by a keyed hash of the unit id (``trainers.baseline.
   validation_split``; by row without one) into a training part and a fifth held out for
   evaluation, unless an evaluation file is given;
2. the scenario is planned at the proxy's size as its analog: the same epsilon, delta policy
   and epochs, and the same sampling rate q (the DP-SGD batch is scaled to q times the proxy's
   rows), so that the noise each phase needs is what it would need on the private data;
3. for each alpha of the grid, that plan with ``split = "alpha=<a>"`` is trained with the
   trainer's defaults and evaluated; the non-private model on the same rows is the reference
   of every relative AUC loss; each units split asked for (``units``: shares r) likewise, with
   ``split = "units=<r>"`` and the sampling rate the private scenario would give it (its
   DP-SGD phase's q over its part of the units);
4. the split with the highest evaluation AUC is chosen, and the scenario is written back with
   that split and ``split_evidence`` saying where it came from, which the plan's statement
   quotes.

Nothing here reads the private data: the choice is free for it only if the proxy is not the
private data or a part of it, which the statement says.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq

from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.report.plots import agg_pyplot, save_png
from budgetplan.scenario.split_rules import dpsgd_rows
from budgetplan.util.fileio import atomic_output
from trainers.data.loaders import read_table

__all__ = ["proxy_grid", "proxy_scenario", "file_digest", "plot_alphas", "DEFAULT_ALPHAS"]

DEFAULT_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
EVAL_KEY = b"budgetplan proxy evaluation"


def file_digest(path: Path) -> str:
    """sha256 of a file, or of a directory's files (their names and bytes, in name order)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def proxy_scenario(scenario, rows: int, alpha: float | str):
    """The scenario's analog on ``rows`` proxy rows: same epsilon, delta policy, epochs and q.

    ``alpha``: a number (``split = "alpha=<a>"``) or a split rule. The DP-SGD phase keeps the
    sampling rate q that ``scenario`` gives it over the rows it samples from (N, or under a
    units split its part of the units): pass the scenario as the private plan would be, with the
    same split.
    """
    s = scenario
    rule = f"alpha={alpha:g}" if isinstance(alpha, (int, float)) else alpha
    dpsgd = s.dpsgd
    if dpsgd is not None:
        q = dpsgd.batch_size / dpsgd_rows(s.dataset_size, s.split)
        part = dpsgd_rows(rows, rule)
        dpsgd = replace(dpsgd, batch_size=max(1, min(part, round(q * part))))
    return replace(s, dataset_size=rows, split=rule, dpsgd=dpsgd, split_evidence=None,
                   name=f"{s.name}-proxy-{rule.replace('=', '')}")


def _check(scenario) -> None:
    if scenario.algorithm != "hybrid":
        raise InvalidParameterError(f"--proxy chooses a Hybrid split; the scenario's algorithm is "
                                    f"{scenario.algorithm!r}")
    if scenario.features is None:
        raise InvalidParameterError("the scenario has no [features] table: the proxy is read by its columns")
    if scenario.tuning is not None:
        raise InvalidParameterError("the scenario declares [tuning]: --proxy chooses the split outside it; drop "
                                    "one of them")


def proxy_grid(scenario, proxy: Path, *, eval_path: Path | None = None, alphas=DEFAULT_ALPHAS, out: Path,
               seed: int | None = None, threads: int | str = "auto", data_format: str = "auto",
               progress=None, units: dict | None = None) -> dict:
    """Train the alpha grid of ``scenario`` on ``proxy`` (module docstring); returns the frontier.

    Args:
        progress: called with one line of text as each step starts and ends (stderr, a log).
        units: {share r: the private scenario with ``split = "units=<r>"``} for each units split
            to try beside the alphas (its q is read from that scenario).

    Returns:
        {"proxy", "proxy_sha256", "train_rows", "eval_rows", "baseline_auc", "cells": [{rule,
        alpha (None for a units split), auc, relative_auc_loss, calibration_ratio, seconds}],
        "best_rule", "best_alpha" (None when a units split won), "evidence"}.
    """
    # torch: proxy_scenario and plot_alphas run without it
    from trainers.baseline import reference, validation_split
    from trainers.run import RunOptions, TrainSettings, execute_plan, run_baseline

    _check(scenario)
    say = progress or (lambda line: None)
    spec = scenario.features
    proxy, out = Path(proxy), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = TrainSettings(data_format=data_format)
    say(f"proxy: reading {proxy}")
    table = read_table(proxy, format=data_format, columns=list(spec.columns))
    if eval_path is None:
        # a key of its own: the baseline's and the RR phase's held-out units (the default key) must
        # fall on both sides of this split, not all in its evaluation part
        held, _, _ = validation_split(table, spec.unit_id, 0.2, what="the proxy's evaluation share", key=EVAL_KEY)
        train_table, eval_table = table.filter(~held), table.filter(held)
        train_path, eval_file = out / "proxy-train.parquet", out / "proxy-eval.parquet"
        for path, part in ((train_path, train_table), (eval_file, eval_table)):
            with atomic_output(path) as tmp:
                pq.write_table(part, str(tmp))
    else:
        train_path, eval_file = proxy, Path(eval_path)
        train_table, eval_table = table, read_table(eval_file, format=data_format, columns=list(spec.columns))
    rows = train_table.num_rows
    plans = {f"alpha={a:g}": (a, build_plan(proxy_scenario(scenario, rows, a))) for a in alphas}
    for share, private in sorted((units or {}).items()):
        plans[f"units={share:g}"] = (None, build_plan(proxy_scenario(private, rows, f"units={share:g}")))
    t0 = time.perf_counter()
    say(f"proxy: the non-private model on {rows:,} rows")
    base = run_baseline(next(iter(plans.values()))[1], train_path, eval_path=eval_file, settings=settings, seed=seed,
                        threads=threads)
    base_auc, tolerance = reference(base)
    say(f"proxy: non-private AUC {base_auc:.4f} ({time.perf_counter() - t0:.0f} s)")
    cells = []
    for rule, (a, plan) in plans.items():
        t0 = time.perf_counter()
        say(f"proxy: {rule}")
        rec = execute_plan(plan, train_path, RunOptions(eval_path=eval_file, settings=settings, seed=seed,
                                                        baseline_auc=base_auc, baseline_tolerance=tolerance,
                                                        threads=threads))
        ev = rec.metrics["eval"]
        cells.append({"rule": rule, "alpha": a, "auc": ev["auc"], "relative_auc_loss": ev.get("relative_auc_loss"),
                      "calibration_ratio": ev["calibration_ratio"], "seconds": time.perf_counter() - t0,
                      "plan_sha256": plan.sha256})
        say(f"proxy: {rule}: AUC {ev['auc']:.4f}, relative AUC loss {ev.get('relative_auc_loss', 0):.2f}% "
            f"({cells[-1]['seconds']:.0f} s)")
    scored = [c for c in cells if c["auc"] is not None]
    if not scored:
        raise InvalidParameterError("no split tried gave a model with finite predictions on the proxy")
    best = max(scored, key=lambda c: c["auc"])
    digest = file_digest(proxy)
    losses = ", ".join(f"{c['rule']}: {c['relative_auc_loss']:.2f}%" for c in scored
                       if c["relative_auc_loss"] is not None)
    evidence = (f"budgetplan split --proxy on {proxy.name} (sha256 {digest[:16]}, {rows:,} training rows, "
                f"{eval_table.num_rows:,} evaluation rows, planned at epsilon {scenario.epsilon:g} with the "
                f"scenario's q and epochs): relative AUC loss by split {losses}; {best['rule']} lost least")
    return {"proxy": str(proxy), "proxy_sha256": digest, "train_rows": rows, "eval_rows": eval_table.num_rows,
            "epsilon": scenario.epsilon, "baseline_auc": base_auc, "cells": cells, "best_rule": best["rule"],
            "best_alpha": best["alpha"], "evidence": evidence}


def plot_alphas(result: dict, path: Path) -> Path:
    """The proxy's frontier as a PNG: relative AUC loss against alpha, each units split a level, the choice marked."""
    plt = agg_pyplot()
    cells = [c for c in result["cells"] if c["relative_auc_loss"] is not None]
    grid = [c for c in cells if c.get("alpha") is not None]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot([c["alpha"] for c in grid], [c["relative_auc_loss"] for c in grid], marker="o", label="alpha grid")
    for c in cells:
        if c.get("alpha") is None:
            ax.axhline(c["relative_auc_loss"], linestyle="--", color="tab:green", label=c["rule"])
    best = next((c for c in cells if c.get("rule", f"alpha={c['alpha']:g}") == result.get("best_rule")), None)
    if best is not None and best.get("alpha") is not None:
        ax.plot([best["alpha"]], [best["relative_auc_loss"]], marker="*", markersize=14, linestyle="none",
                label=f"chosen: {best['rule']}")
    elif best is not None:
        ax.set_title(f"chosen: {best['rule']}", loc="right", fontsize=9)
    ax.legend()
    ax.set_xlabel("alpha = eps1 / eps (0: DP-SGD alone, 1: RR alone)")
    ax.set_ylabel("relative AUC loss (%)")
    ax.set_title(f"proxy {Path(result['proxy']).name}: epsilon {result['epsilon']:g}")
    ax.grid(alpha=0.3)
    return save_png(fig, path)
