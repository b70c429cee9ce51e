"""The utility frontier per data shape: RR, DP-SGD, Hybrid and the alpha grid against epsilon.

For every data shape (``trainers.data.shapes``: where the signal sits between the feature
groups) and every seed: synthesise ``--rows`` rows and hold out a fifth of the users; train
the two non-private baselines with the trainer's own entry point (``run_baseline``): all
features (the reference of every loss) and the non-sensitive features alone (the truncated
model: the ceiling of any RR model); then, for every total epsilon, plan and train
(``execute_plan``) every arm of the Hybrid plan family: RR (alpha = 1: the truncated model
on randomised labels), DP-SGD (alpha = 0: all features), Hybrid (paper-v1: eps1 = min(0.6
eps, 3)) and alpha = 0.25, 0.5, 0.75, all semi-sensitive DP (replace-one) per impression
with delta = 0.1/N. The arms and their plans are set in one place (``ARMS``, ``PLAN``);
training uses the library's defaults (``TrainSettings``, ``DPSGDSettings``) unless
``TRAINING``/``DPSGD_TRAINING`` or an option says otherwise. Every setting is recorded
(``settings()``) and checked against today's by tests/test_benchmark_settings.py.

Reported per (shape, epsilon, arm): the relative AUC loss (%) against the baseline trained on
the same data (arXiv:2401.15246) and the calibration ratio mean(p) / mean(y), each as mean +-
std over the seeds. A cell is marked ``~`` where the seeds cannot order it against some other
arm of its table (|mean difference| < the larger std of the two); a private model that beats
the baseline is called out (the baseline is then no ceiling: under-trained). Two tables per
shape and metric: the three arms, and the alpha grid (alpha 0 and 1 are the DP-SGD and RR
runs).

Resumable: every finished baseline pair and cell is written to the JSON at once, and a run
that finds a JSON made with the same settings continues where it stopped (one made with other
settings is refused, naming what differs; ``--fresh`` starts over; one marked stale is
replaced). Writes ``<out>/<name>.json``, ``<name>.md`` and one ``<name>_<shape>.png`` per
shape (``--out`` defaults to benchmarks/results).

Not a test: ``python benchmarks/utility_frontier.py`` (1,000,000 rows x 3 shapes x 3 seeds x
6 epsilons x 6 arms: many hours on 2 CPU cores; the results' ``seconds`` say how many);
``--quick`` for a smoke run (20,000 rows, epsilons 1 and 8, one seed); ``--rows``,
``--shapes``, ``--seeds``, ``--epsilons``, ``--arms`` for a smaller one (``--name`` keeps it
apart from the default results).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _harness as h

EPSILONS = (1.0, 3.0, 5.0, 8.0, 12.0, 20.0)
SHAPES = ("nonsensitive", "balanced", "sensitive")
# The arms and everything that sets them, in one place. ARMS: arm -> the scenario's split.
ARMS = {"RR": "alpha=1", "DP-SGD": "alpha=0", "Hybrid": "paper-v1", "alpha=0.25": "alpha=0.25",
        "alpha=0.5": "alpha=0.5", "alpha=0.75": "alpha=0.75"}
MAIN = ("RR", "DP-SGD", "Hybrid")
GRID = ("DP-SGD", "alpha=0.25", "alpha=0.5", "alpha=0.75", "RR")  # alpha 0 .. 1
# What every arm's plan shares (the command-line options of the same names override the phases').
PLAN = {"delta": "0.1/N", "adjacency": "replace-one", "unit": "impression", "tower": "fine-tune",
        "rr": {"epochs": 3, "batch_size": 1024},
        "dpsgd": {"batch_size": 2048, "epochs": 3, "clipping_norm": 1.0}}
# Overrides of the trainer's defaults (TrainSettings, DPSGDSettings) for every run, baselines
# included; empty: the library's defaults, so that a better default reaches the frontier (and
# makes the committed results stale) without an edit here.
TRAINING: dict = {}
DPSGD_TRAINING: dict = {}
HOLDOUT = "users whose id * 0x9E3779B97F4A7C15 (mod 2^64) is 0 mod 5"
QUICK = {"rows": 20_000, "seeds": 1, "epsilons": "1,8"}


def parse_args(argv: list[str]) -> argparse.Namespace:
    from trainers.data.synth import SHAPES as KNOWN

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per shape and seed")
    ap.add_argument("--users", type=int, default=None, help="default: a fifth of the rows")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--shapes", "--shape", default=",".join(SHAPES), help=f"comma-separated; of {', '.join(KNOWN)}")
    ap.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--rr-epochs", type=int, default=PLAN["rr"]["epochs"])
    ap.add_argument("--dpsgd-batch", type=int, default=PLAN["dpsgd"]["batch_size"])
    ap.add_argument("--dpsgd-epochs", type=int, default=PLAN["dpsgd"]["epochs"])
    ap.add_argument("--clipping-norm", type=float, default=PLAN["dpsgd"]["clipping_norm"])
    ap.add_argument("--dpsgd-lr", type=float, default=None, help="default: DPSGDSettings' default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['rows']:,} rows, epsilons {QUICK['epsilons']}, {QUICK['seeds']} seed (every shape)")
    ap.add_argument("--name", default=None, help="results file stem (default utility_frontier, _quick with --quick)")
    ap.add_argument("--out", type=Path, default=h.RESULTS, help="results folder (default benchmarks/results)")
    ap.add_argument("--fresh", action="store_true", help="discard finished cells of an earlier run")
    ap.add_argument("--render", action="store_true", help="rewrite the .md and PNGs from the existing .json")
    args = ap.parse_args(argv)
    args.argv = list(argv)
    if args.quick:
        given = {a.split("=")[0] for a in argv}
        for key, value in QUICK.items():
            if f"--{key}" not in given:
                setattr(args, key, value)
    args.users = args.users or max(1, args.rows // 5)
    args.name = args.name or ("utility_frontier_quick" if args.quick else "utility_frontier")
    args.shape_list = [s for s in args.shapes.split(",") if s]
    args.arm_list = [a for a in args.arms.split(",") if a]
    try:
        args.epsilon_list = [float(e) for e in args.epsilons.split(",") if e]
    except ValueError:
        ap.error(f"--epsilons: not a comma-separated list of numbers: {args.epsilons!r}")
    for what, given, known in (("--shapes", args.shape_list, KNOWN), ("--arms", args.arm_list, ARMS)):
        bad = [x for x in given if x not in known] or ([] if given else ["(none)"])
        if bad:
            ap.error(f"{what}: unknown {bad[0]!r}; known: {', '.join(known)}")
    for what, value in (("--rows", args.rows), ("--users", args.users), ("--seeds", args.seeds)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not args.epsilon_list or not all(0 < e < float("inf") for e in args.epsilon_list):
        ap.error(f"--epsilons must be positive and finite, got {args.epsilons!r}")
    return args


def _train_settings(args):
    """The trainer's settings for every run: its defaults, TRAINING's and the options' overrides."""
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    dp = dict(DPSGD_TRAINING, **({} if args.dpsgd_lr is None else {"lr": args.dpsgd_lr}))
    return TrainSettings(**dict(TRAINING, device=args.device)), DPSGDSettings(**dp)


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the run: data, plans, training (the library's defaults resolved)."""
    from trainers.data.synth import get_shape

    train, dp = _train_settings(args)
    return h.settings_record("utility_frontier.py", args.argv, {
        "shapes": {s: get_shape(s).parameters() for s in args.shape_list},
        "rows": args.rows, "users": args.users, "data_seeds": [1000 + s for s in range(args.seeds)],
        "training_seed": "the data seed", "holdout": HOLDOUT, "epsilons": args.epsilon_list,
        "arms": {a: ARMS[a] for a in args.arm_list},
        "privacy": {k: PLAN[k] for k in ("delta", "adjacency", "unit")},
        "rr": {"epochs": args.rr_epochs, "batch_size": PLAN["rr"]["batch_size"]},
        "dpsgd": {"batch_size": args.dpsgd_batch, "epochs": args.dpsgd_epochs, "clipping_norm": args.clipping_norm,
                  "tower": PLAN["tower"]},
        "training": train.to_dict(), "dpsgd_settings": dp.to_dict(),
        "baselines": {"all": "run_baseline, all features", "nonsensitive": "run_baseline, truncated=True"}})


def scenario(args, *, epsilon: float, split: str, n: int, spec) -> str:
    return f"""name = "frontier-{split}-eps{epsilon:g}"
[budget]
epsilon = {epsilon!r}
delta = "{PLAN['delta']}"
[privacy]
adjacency = "{PLAN['adjacency']}"
unit = "{PLAN['unit']}"
[data]
dataset_size = {n}
[algorithm]
name = "hybrid"
split = "{split}"
tower = "{PLAN['tower']}"
[rr]
epochs = {args.rr_epochs}
batch_size = {PLAN['rr']['batch_size']}
[dpsgd]
batch_size = {args.dpsgd_batch}
epochs = {args.dpsgd_epochs}
clipping_norm = {args.clipping_norm!r}
{spec.to_toml()}"""


# ---------------------------------------------------------------------------------------- running


def _key(*parts) -> str:
    return "|".join(str(p) for p in parts)


def _load_state(path: Path, today: dict, fresh: bool) -> dict:
    """The finished baselines and cells of an earlier run with today's settings, or a new state."""
    if path.exists() and not fresh:
        state = json.loads(path.read_text())
        recorded = state.get("settings", {})
        if recorded.get("stale"):  # a file kept only until this run replaces it: nothing to resume
            return _new_state(today)
        diff = h.settings_differences(recorded, today)
        if diff:
            raise SystemExit(f"{path} was made with other settings (these differ: {', '.join(diff[:5])}): pass "
                             "--fresh to start over, or --name to keep both")
        state["commits"] = sorted({*state.get("commits", []), recorded.get("commit") or "unknown"})
        state["settings"] = today
        return state
    return _new_state(today)


def _new_state(today: dict) -> dict:
    return {"settings": today, "baselines": {}, "cells": {}, "seconds": 0.0, "complete": False}


def _save(path: Path, state: dict) -> None:
    from budgetplan._files import write_atomic

    write_atomic(path, json.dumps(state, indent=2) + "\n")


def _data(shape: str, seed: int, args, work: Path):
    """Train and eval files of one (shape, seed); the training N."""
    import numpy as np
    import pyarrow.parquet as pq

    from trainers.data.synth import get_shape, synthesize

    spec = get_shape(shape).features
    table = synthesize(args.rows, args.users, 1000 + seed, shape=shape)
    users = table.column(spec.unit_id).to_numpy().astype(np.uint64)
    held = (users * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(5) == 0
    root = work / f"{shape}-{seed}"
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.filter(~held), root / "train.parquet")
    pq.write_table(table.filter(held), root / "eval.parquet")
    return root / "train.parquet", root / "eval.parquet", int((~held).sum())


def _metrics(record) -> dict:
    ev = record.metrics["eval"]
    return {k: ev.get(k) for k in ("auc", "log_loss", "calibration_ratio", "relative_auc_loss")}


def _baselines(plan, train, evaluation, settings, seed: int) -> dict:
    """The non-private models on the same data: all features (the reference of every loss) and
    the non-sensitive features alone (the truncated model: the ceiling of RR)."""
    from trainers.metrics import relative_auc_loss
    from trainers.run import run_baseline

    out = {}
    for label, truncated in (("all", False), ("nonsensitive", True)):
        t0 = time.perf_counter()
        rec = run_baseline(plan, train, eval_path=evaluation, settings=settings, seed=seed, truncated=truncated)
        out[label] = {**_metrics(rec), "seconds": time.perf_counter() - t0}
    if out["nonsensitive"]["auc"] is not None and out["all"]["auc"] is not None:
        out["nonsensitive"]["relative_auc_loss"] = relative_auc_loss(out["nonsensitive"]["auc"], out["all"]["auc"])
    return out


def run(args) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from budgetplan.planner import build_plan
    from budgetplan.plots import arm_of
    from budgetplan.scenario import parse_scenario
    from trainers.data.synth import get_shape
    from trainers.run import execute_plan

    path = args.out / f"{args.name}.json"
    state = _load_state(path, settings(args), args.fresh)
    train_settings, dp = _train_settings(args)
    todo = [(s, seed, e, a) for s in args.shape_list for seed in range(args.seeds) for e in args.epsilon_list
            for a in args.arm_list if _key(s, seed, e, a) not in state["cells"]]
    bases = [(s, seed) for s in args.shape_list for seed in range(args.seeds)
             if _key(s, seed) not in state["baselines"]]
    work = Path(tempfile.mkdtemp(prefix="frontier-"))
    args.out.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=Console(stderr=True)) as bar:
            task = bar.add_task("utility frontier", total=len(todo) + len(bases))
            for shape in args.shape_list:
                spec = get_shape(shape).features
                for seed in range(args.seeds):
                    mine = [c for c in todo if c[:2] == (shape, seed)]
                    if not mine and _key(shape, seed) in state["baselines"]:
                        continue
                    bar.update(task, description=f"{shape} seed {seed}: data")
                    train, evaluation, n = _data(shape, seed, args, work)
                    if _key(shape, seed) not in state["baselines"]:
                        bar.update(task, description=f"{shape} seed {seed}: non-private baselines")
                        first = build_plan(parse_scenario(scenario(args, epsilon=args.epsilon_list[0],
                                                                   split=ARMS["Hybrid"], n=n, spec=spec)))
                        base = _baselines(first, train, evaluation, train_settings, 1000 + seed)
                        state["baselines"][_key(shape, seed)] = {**base, "dataset_size": n}
                        state["seconds"] += sum(b["seconds"] for b in base.values())
                        _save(path, state)
                        bar.advance(task)
                    base_auc = state["baselines"][_key(shape, seed)]["all"]["auc"]
                    for _, _, eps, arm in mine:
                        bar.update(task, description=f"{shape} seed {seed}: {arm} eps {eps:g}")
                        t0 = time.perf_counter()
                        plan = build_plan(parse_scenario(scenario(args, epsilon=eps, split=ARMS[arm], n=n,
                                                                  spec=spec)))
                        rec = execute_plan(plan, train, eval_path=evaluation, settings=train_settings,
                                           dpsgd_settings=dp, seed=1000 + seed, baseline_auc=base_auc)
                        seconds = time.perf_counter() - t0
                        state["cells"][_key(shape, seed, eps, arm)] = {
                            "shape": shape, "seed": seed, "epsilon": eps, "arm": arm, "split": ARMS[arm],
                            "alpha": arm_of(plan)[1], "delta": plan.delta, "dataset_size": plan.dataset_size,
                            "flip_probability": plan.rr.params.flip_probability if plan.rr else None,
                            "noise_multiplier": plan.dpsgd.params.noise_multiplier if plan.dpsgd else None,
                            "dpsgd_steps": plan.dpsgd.params.steps if plan.dpsgd else None,
                            **_metrics(rec), "seconds": seconds, "plan_sha256": plan.sha256}
                        state["seconds"] += seconds
                        _save(path, state)
                        bar.advance(task)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    state["complete"] = True
    state["machine"] = {**h.machine(), "device": train_settings.device}
    _save(path, state)
    return state


# ---------------------------------------------------------------------------------------- summary


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
            for table, arms in (("main", MAIN), ("grid", GRID)):
                for metric in ("loss", "cal"):
                    _readable(by_arm, [a for a in arms if a in by_arm], table, metric)
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
    return f"{mean:.{digits}f}" + ("" if std is None else f" +- {std:.{digits}f}")


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
        for title, arms, table in (("Arms", MAIN, "main"), ("Alpha grid (eps1 = alpha eps)", GRID, "grid")):
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
    cells = list(state["cells"].values())
    if cells:
        median = statistics.median(c["seconds"] for c in cells)
        lines += [f"{len(cells)} cells and {len(state['baselines'])} baseline pairs in "
                  f"{state['seconds'] / 3600:.2f} h of training (median {median:.0f} s a cell).", ""]
    lines.append(h.settings_markdown(state["settings"]))
    return "\n".join(lines) + "\n"


def plot(state: dict, name: str, out: Path) -> list[Path]:
    from budgetplan.plots import _pyplot, _save

    plt = _pyplot()
    written = []
    n = len(state["settings"]["values"]["data_seeds"])
    for shape, summ in summarise(state).items():
        by_eps, bl = summ["cells"], summ["baselines"]
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
        for arm in ARMS:
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
            ax.set_xlabel("total epsilon")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
        left.axhline(0.0, color="black", linewidth=0.8)
        right.axhline(1.0, color="black", linewidth=0.8)
        left.legend(fontsize=7)
        fig.suptitle(f"{shape}: {state['settings']['values']['rows']:,} rows, mean +- std over {n} seed(s)")
        written.append(_save(fig, out / f"{name}_{shape}.png"))
    return written


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    path = args.out / f"{args.name}.json"
    state = json.loads(path.read_text()) if args.render else run(args)
    from budgetplan._files import write_atomic

    text = render(state, args.name)
    write_atomic(args.out / f"{args.name}.md", text)
    plot(state, args.name, args.out)
    print(text)
    return state


if __name__ == "__main__":
    main(sys.argv[1:])
