"""The utility frontier's tables and plots (benchmarks/utility_frontier.py writes the results).

Per shape: the two non-private baselines, then, per table (the three arms; the alpha grid)
and metric (relative AUC loss; calibration ratio), epsilon against arm, each cell the mean
+- std over the seeds. A cell is marked ``~`` where the seeds cannot order it against some
other arm of its table: for some pair, |mean difference| < the larger of the two stds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import harness as h

MAIN = ("RR", "DP-SGD", "Hybrid")
GRID = ("DP-SGD", "alpha=0.25", "alpha=0.5", "alpha=0.75", "RR")  # alpha 0 .. 1
OTHER = ("paper-v1", "fine-tune")  # and every units split measured (``_units_arms``)
_GRID_ALPHA = {0.0: "DP-SGD", 0.25: "alpha=0.25", 0.5: "alpha=0.5", 0.75: "alpha=0.75", 1.0: "RR"}
# The table alpha-by-eps had before these shapes were measured (for the regret table).
_OLD_TABLE = ((0.0, 0.0), (2.0, 0.75), (10.0, 0.5))


def rule_arm(rule: str, epsilon: float, share: float | None) -> str | None:
    """The arm of the grid (or the paper-v1 arm) that a split rule's plan at ``epsilon`` is: the rule
    splits what the calibration release leaves. None where its alpha is not on the grid."""
    from budgetplan.scenario.split_rules import choose_split

    if rule in ("paper-v1", "fine-tune") or rule.startswith("units="):  # arms of their own
        return rule
    train = epsilon * (1 - (share or 0.0))
    if rule == "alpha-by-eps (before)":
        alpha = [a for start, a in _OLD_TABLE if start <= train][-1]
    else:
        alpha = choose_split(train, rule).alpha
    return next((arm for a, arm in _GRID_ALPHA.items() if abs(a - alpha) < 1e-9), None)


def _mean_std(values: list) -> tuple[float | None, float | None]:
    xs = [v for v in values if v is not None]
    return (statistics.fmean(xs) if xs else None), (statistics.stdev(xs) if len(xs) > 1 else None)


def summarise(state: dict) -> dict:
    """Per shape: ``baselines`` (mean, std of the two non-private models) and ``cells``
    {epsilon: {arm: {n, diverged, loss_mean, loss_std, cal_mean, cal_std, beat_baseline,
    readable: {(table, metric): bool | None}}}}."""
    out: dict = {}
    for key, b in state["baselines"].items():
        mine = out.setdefault(key.split("|")[0], {"baselines": {}, "cells": {}})["baselines"]
        for label in ("all", "nonsensitive"):
            for metric in ("auc", "relative_auc_loss", "calibration_ratio"):
                mine.setdefault(label, {}).setdefault(metric, []).append(b[label][metric])
    for shape in out.values():
        shape["baselines"] = {label: {m: _mean_std(v) for m, v in by.items()}
                              for label, by in shape["baselines"].items()}
    for c in state["cells"].values():
        by_eps = out.setdefault(c["shape"], {"baselines": {}, "cells": {}})["cells"]
        by_eps.setdefault(c["epsilon"], {}).setdefault(c["arm"], []).append(c)
    for shape in out.values():
        for by_arm in shape["cells"].values():
            for arm, cells in by_arm.items():
                loss = [c["relative_auc_loss"] for c in cells]
                lm, ls = _mean_std(loss)
                cm, cs = _mean_std([c["calibration_ratio"] for c in cells])
                by_arm[arm] = {"n": len(cells), "diverged": sum(v is None for v in loss), "loss_mean": lm,
                               "loss_std": ls, "cal_mean": cm, "cal_std": cs,
                               "beat_baseline": sum(v is not None and v < 0 for v in loss), "readable": {}}
    rule, share = _default(state)
    for shape in out.values():
        for eps, by_arm in shape["cells"].items():
            arm = rule_arm(rule, eps, share)
            if arm is not None and arm in by_arm:
                by_arm["Hybrid"] = dict(by_arm[arm], readable={}, read_from=arm)
            for table, arms in (("main", MAIN), ("grid", GRID)):
                for metric in ("loss", "cal"):
                    _readable(by_arm, [a for a in arms if a in by_arm], table, metric)
    return out


def _default(state: dict) -> tuple[str, float | None]:
    """(the default split rule the results are read with, the calibration share the plans had)."""
    from budgetplan.scenario.split_rules import DEFAULT_RULE

    rule = state["settings"].get("default_split", {}).get("rule", DEFAULT_RULE)
    share = state["settings"]["values"].get("scenario", {}).get("calibration") or {}
    return rule, share.get("share")


def regret(summary: dict, rules: list[str], share: float | None) -> dict:
    """{rule: {shape: {epsilon: loss of the rule's arm - the least loss of the alpha grid}}} (None: not run)."""
    out: dict = {r: {} for r in rules}
    for shape, summ in summary.items():
        for eps, by_arm in summ["cells"].items():
            losses = [by_arm[a]["loss_mean"] for a in GRID if a in by_arm and by_arm[a]["loss_mean"] is not None]
            best = min(losses) if losses else None
            for r in rules:
                arm = rule_arm(r, eps, share)
                mine = by_arm.get(arm, {}).get("loss_mean") if arm else None
                out[r].setdefault(shape, {})[eps] = None if best is None or mine is None else mine - best
    return out


def _readable(by_arm: dict, arms: list[str], table: str, metric: str) -> None:
    """Whether the seeds order an arm against every other arm of its table: for each pair,
    |mean difference| >= the larger of the two stds. None where there is no spread (one seed)
    or nothing to compare."""
    for arm in arms:
        me = by_arm[arm]
        others = [by_arm[a] for a in arms if a != arm and by_arm[a][f"{metric}_mean"] is not None]
        if me[f"{metric}_mean"] is None or me[f"{metric}_std"] is None or not others:
            me["readable"][f"{table}/{metric}"] = None
            continue
        me["readable"][f"{table}/{metric}"] = all(
            abs(me[f"{metric}_mean"] - o[f"{metric}_mean"]) >= max(me[f"{metric}_std"], o[f"{metric}_std"] or 0.0)
            for o in others)


def _pm(mean, std, digits: int) -> str:
    if mean is None:
        return "-"

    def num(x):  # a calibration ratio of 4e-8 (a model that predicts no conversion) must not read 0.000
        return f"{x:.{digits}f}" if x == 0 or abs(x) >= 10 ** -digits else f"{x:.1e}"

    return num(mean) + ("" if std is None else f" +- {num(std)}")


def _cell(s: dict | None, table: str, metric: str) -> str:
    if s is None:
        return "-"
    if s[f"{metric}_mean"] is None:
        return "diverged"
    mark = "~" if s["readable"].get(f"{table}/{metric}") is False else ""
    digits = 2 if metric == "loss" else 3
    text = mark + _pm(s[f"{metric}_mean"], s[f"{metric}_std"], digits)
    if s["diverged"]:
        text += f" ({s['diverged']} of {s['n']} diverged)"
    return text


def render(state: dict, name: str) -> str:
    st = state["settings"]["values"]
    summary = summarise(state)
    other = OTHER + _units_arms(summary)
    seeds = len(st["data_seeds"])
    lines = [f"# Utility frontier by data shape{'' if state.get('complete') else ' (INCOMPLETE: a run in progress)'}",
             "", f"{st['rows']:,} synthetic rows per shape and seed ({st['users']:,} users, a fifth held out), "
             f"{seeds} seed{'s' if seeds > 1 else ''}; semi-sensitive DP per impression, delta = 0.1/N (N: each "
             "seed's training rows). Each cell: mean +- std over the seeds. Relative AUC loss (%) is against the "
             "non-private model with all features trained on the same data (arXiv:2401.15246); the calibration "
             "ratio is mean(p) / mean(y) on the held-out users. `~` marks a cell whose order against another arm "
             "of its table the seeds cannot tell: their mean difference is smaller than the larger of their two "
             "stds." + (" **One seed: no spread, so no cell can be judged readable or not.**" if seeds == 1 else ""),
             ""]
    if state.get("carried"):
        carried = state["carried"]
        runs = "runs at commits" if " and " in carried["from_commit"] else "run at commit"
        cells = state.get("cells", {})
        taken = sum(1 for c in cells.values() if c.get("carried_from"))
        # a run that extended an earlier one (a new arm or shape) keeps the earlier run's commit in "commits"
        own = [c for c in state.get("commits", []) if c != "unknown"]
        by = f"by this file's own runs (the earlier ones at commits {' and '.join(c[:12] for c in own)})" if own \
            else "in this run"
        trained = (f" {len(cells) - taken} of the {len(cells)} cells were trained {by}."
                   if taken < len(cells) else "")
        lines += [f"The {', '.join(carried['arms'])} cells were carried from the {runs} "
                  f"{carried['from_commit']}, because {carried['why']}; their relative losses are against this "
                  f"run's baselines.{trained}", ""]
    for shape, summ in summary.items():
        by_eps, bl = summ["cells"], summ["baselines"]
        par = st["shapes"][shape]
        lines += [f"## {shape}", "",
                  f"Shape parameters: {', '.join(f'{k} {v}' for k, v in par.items() if k != 'cardinalities')}.", ""]
        if bl:
            lines += ["| non-private model | AUC | relative AUC loss (%) | calibration ratio |", "|---|---|---|---|",
                      f"| all features (the reference) | {_pm(*bl['all']['auc'], 4)} | 0 | "
                      f"{_pm(*bl['all']['calibration_ratio'], 3)} |",
                      f"| non-sensitive features only (the RR ceiling) | {_pm(*bl['nonsensitive']['auc'], 4)} | "
                      f"{_pm(*bl['nonsensitive']['relative_auc_loss'], 2)} | "
                      f"{_pm(*bl['nonsensitive']['calibration_ratio'], 3)} |", ""]
        for title, arms, table in (("Arms", MAIN, "main"), ("Alpha grid (eps1 = alpha eps)", GRID, "grid"),
                                   ("Other rules: the paper's v1 split, alpha 0.5 with the non-sensitive tower "
                                    "fine-tuned, and the units splits (units=r: RR on a share r of the units, DP-SGD "
                                    "on the rest, each at the whole budget)", other, "other")):
            arms = [a for a in arms if any(a in v for v in by_eps.values())]
            if not arms:
                continue
            for metric, label in (("loss", "relative AUC loss (%)"), ("cal", "calibration ratio")):
                lines += [f"{title}: {label}", "", "| epsilon | " + " | ".join(arms) + " |",
                          "|---" * (len(arms) + 1) + "|"]
                for eps in sorted(by_eps):
                    lines.append(f"| {eps:g} | " + " | ".join(_cell(by_eps[eps].get(a), table, metric)
                                                              for a in arms) + " |")
                lines.append("")
        unreadable = [f"{eps:g}" for eps in sorted(by_eps)
                      if any(v["readable"].get("main/loss") is False for a, v in by_eps[eps].items() if a in MAIN)]
        if seeds > 1:
            lines += [("The order of RR, DP-SGD and Hybrid (relative AUC loss) is not readable from these seeds at "
                       "epsilon " + ", ".join(unreadable) + "." if unreadable else
                       "The order of RR, DP-SGD and Hybrid (relative AUC loss) is readable at every epsilon."), ""]
        beat = [f"{a} at {eps:g} ({v['beat_baseline']} of {v['n']})" for eps in sorted(by_eps)
                for a, v in by_eps[eps].items() if v["beat_baseline"]]
        if beat:
            lines += ["**The non-private baseline is no ceiling here**: a private model beat it on the same data "
                      "(negative loss) for " + ", ".join(beat) + ". The baseline is under-trained at these settings, "
                      "and every loss in this section is measured against it.", ""]
        lines += [f"![{shape}]({name}_{shape}.png)", ""]
    if len(_measured(summary) & set(GRID)) > 1:
        lines += _regret_section(summary, state) + _checks_section(summary, state)
    else:  # one arm of the grid (an experiment on one arm's settings): no split to weigh against another
        lines += ["One arm of the alpha grid only: no split to compare, so neither the regret table nor the "
                  "defaults' checks (the full frontier, utility_frontier.md, has both).", ""]
    cells = list(state["cells"].values())
    if cells:
        median = statistics.median(c["seconds"] for c in cells)
        carried = sum(1 for c in cells if c.get("carried_from"))
        carried_text = f", {carried} of the cells carried from earlier runs" if carried else ""
        lines += [f"{len(cells)} cells and {len(state['baselines'])} baseline pairs; what this run trained took "
                  f"{state['seconds'] / 3600:.2f} h{carried_text} (median {median:.0f} s a cell, as each was "
                  "trained).", ""]
    lines.append(h.settings_markdown(state["settings"]))
    return "\n".join(lines) + "\n"


def _units_arms(summary: dict) -> tuple[str, ...]:
    """The units splits measured, by their RR share, largest first."""
    return tuple(sorted((a for a in _measured(summary) if a.startswith("units=")),
                        key=lambda a: -float(a.partition("=")[2])))


def _measured(summary: dict) -> set[str]:
    """The arms with at least one cell, over every shape and epsilon."""
    return {a for s in summary.values() for by_arm in s["cells"].values() for a in by_arm}


RULES = ("alpha=0.25", "alpha=0.5", "alpha=0.75", "fine-tune", "paper-v1", "alpha-by-eps (before)")


def _regret_section(summary: dict, state: dict) -> list[str]:
    """Each rule's regret (its loss above the best alpha of the grid) per shape and epsilon, and its worst."""
    rule, share = _default(state)
    rules = list(dict.fromkeys((*RULES, *_units_arms(summary), rule)))
    table = regret(summary, rules, share)
    eps_list = sorted({e for s in summary.values() for e in s["cells"]})
    shapes = list(summary)
    rules = [r for r in rules if any(v is not None for shape in shapes for v in table[r].get(shape, {}).values())]
    measured = _measured(summary)
    grid = ", ".join(f"{alpha:g}" for alpha, arm in _GRID_ALPHA.items() if arm in measured)
    lines = ["## Which split: regret of each rule", "",
             f"Relative AUC loss (points) of the rule's arm above the best alpha of the grid {{{grid}}} "
             "on the same shape and epsilon (means over the seeds); `worst` is the largest over the shapes, `mean` "
             f"their mean. The default rule is `{rule}`. `alpha-by-eps (before)` is the table this project used "
             "before these shapes were measured (alpha 0 below eps 2, 0.75 to 10, then 0.5).", "",
             "| rule | epsilon | " + " | ".join(shapes) + " | worst | mean |", "|---" * (len(shapes) + 4) + "|"]
    for r in rules:
        for eps in eps_list:
            vals = [table[r].get(s, {}).get(eps) for s in shapes]
            known = [v for v in vals if v is not None]
            worst = f"{max(known):.2f}" if known else "-"
            mean = f"{sum(known) / len(known):.2f}" if known else "-"
            label = f"**{r}** (default)" if r == rule else r
            lines.append(f"| {label} | {eps:g} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals)
                         + f" | {worst} | {mean} |")
    best = ["| epsilon | " + " | ".join(shapes) + " |", "|---" * (len(shapes) + 1) + "|"]
    for eps in eps_list:
        row = []
        for s in shapes:
            by_arm = summary[s]["cells"].get(eps, {})
            arms = [(by_arm[a]["loss_mean"], a) for a in GRID if a in by_arm and by_arm[a]["loss_mean"] is not None]
            row.append(min(arms)[1] if arms else "-")
        best.append(f"| {eps:g} | " + " | ".join(row) + " |")
    return lines + ["", "The best alpha of the grid per shape and epsilon:", ""] + best + [""]


def _checks_section(summary: dict, state: dict) -> list[str]:
    """What the defaults are held to, per shape (means over the seeds)."""
    rule, share = _default(state)
    lines = ["## The defaults against their targets", "",
             "At every epsilon >= 3: the default split within 1 point of the best alpha; Hybrid (the default rule) "
             "strictly below both RR and DP-SGD; RR within 3 points of the non-sensitive-only model at epsilon 3 and "
             "1 point from epsilon 8; every arm's mean calibration ratio within 0.1 of 1.", "",
             "| shape | epsilon | default regret | Hybrid < RR and DP-SGD | RR - its ceiling | calibration ratios "
             "| all met |", "|---|---|---|---|---|---|---|"]
    table = regret(summary, [rule], share)[rule]
    for shape, summ in summary.items():
        ceiling = summ["baselines"].get("nonsensitive", {}).get("relative_auc_loss", (None, None))[0]
        for eps in sorted(e for e in summ["cells"] if e >= 3):
            by_arm = summ["cells"][eps]
            reg = table.get(shape, {}).get(eps)
            hyb, rr, sgd = (by_arm.get(a, {}).get("loss_mean") for a in ("Hybrid", "RR", "DP-SGD"))
            below = None if None in (hyb, rr, sgd) else hyb < rr and hyb < sgd
            gap = None if rr is None or ceiling is None else rr - ceiling
            cals = [v["cal_mean"] for v in by_arm.values() if v.get("cal_mean") is not None]
            cal_ok = bool(cals) and all(abs(c - 1) <= 0.1 for c in cals)
            ok = [reg is not None and reg <= 1.0, below is True,
                  gap is not None and gap <= (3.0 if eps < 8 else 1.0), cal_ok]
            lines.append(f"| {shape} | {eps:g} | {'-' if reg is None else f'{reg:.2f}'} | "
                         f"{'-' if below is None else ('yes' if below else 'no')} | "
                         f"{'-' if gap is None else f'{gap:+.2f}'} | "
                         f"{f'{min(cals):.3f}-{max(cals):.3f}' if cals else '-'} | {'yes' if all(ok) else 'no'} |")
    return lines + [""]


def plot(state: dict, name: str, out: Path) -> list[Path]:
    from budgetplan.report.plots import agg_pyplot, save_png

    plt = agg_pyplot()
    written = []
    n = len(state["settings"]["values"]["data_seeds"])
    summary = summarise(state)
    units = _units_arms(summary)
    for shape, summ in summary.items():
        by_eps, bl = summ["cells"], summ["baselines"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
        for arm in dict.fromkeys(MAIN + GRID + units):
            xs = [e for e in sorted(by_eps) if arm in by_eps[e] and by_eps[e][arm]["loss_mean"] is not None]
            if not xs:
                continue
            style = {"marker": "o", "capsize": 3, "label": arm} if arm in MAIN else \
                {"marker": ".", "capsize": 2, "label": arm, "linestyle": "--", "alpha": 0.6}
            for ax, m, s in ((left, "loss_mean", "loss_std"), (right, "cal_mean", "cal_std")):
                ax.errorbar(xs, [by_eps[e][arm][m] for e in xs], yerr=[by_eps[e][arm][s] or 0.0 for e in xs],
                            **style)
        if bl and bl["nonsensitive"]["relative_auc_loss"][0] is not None:
            left.axhline(bl["nonsensitive"]["relative_auc_loss"][0], color="grey", linestyle=":", linewidth=1,
                         label="non-private, non-sensitive only")
        for ax, ylabel in ((left, "relative AUC loss (%)"), (right, "calibration ratio mean(p) / mean(y)")):
            ax.set_xscale("log")
            ax.set_xticks(sorted(by_eps), [f"{e:g}" for e in sorted(by_eps)])
            ax.minorticks_off()
            ax.set_xlabel("total epsilon")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
        left.axhline(0.0, color="black", linewidth=0.8)
        right.axhline(1.0, color="black", linewidth=0.8)
        left.legend(fontsize=7)
        fig.suptitle(f"{shape}: {state['settings']['values']['rows']:,} rows, mean +- std over {n} seed(s)")
        written.append(save_png(fig, out / f"{name}_{shape}.png"))
    return written
