"""The utility frontier per data shape: RR, DP-SGD, Hybrid and the alpha grid against epsilon.

For every data shape (``trainers.data.shapes`` and ``trainers.data.mixed``: where the signal
sits between the feature groups, and whether it crosses them) and every seed: synthesise
``--rows`` rows and hold out a fifth of the users; train the two non-private baselines with
the trainer's own entry point (``run_baseline``): all features (the reference of every loss)
and the non-sensitive features alone (the truncated model: the ceiling of any RR model);
then, for every total epsilon, plan and train (``execute_plan``) every arm of the Hybrid
plan family from the shipped template ``synthetic-hybrid`` with only its epsilon, N, split,
tower and ``[features]`` changed, as a user would: RR (alpha = 1: the truncated model on
randomised labels), DP-SGD (alpha = 0: all features), alpha = 0.25, 0.5, 0.75, the paper's
``paper-v1`` (eps1 = min(0.6 eps, 3)), ``fine-tune`` (alpha = 0.5 with the non-sensitive
tower fine-tuned in phase 2 instead of frozen) and ``units=0.75`` (the units split: RR on 75%
of the units, DP-SGD on the rest, each at the whole budget), all semi-sensitive DP (replace-one) per
impression with delta = 0.1/N and the template's default calibration. The arms are set in
one place (``ARMS``); training uses the library's defaults (``TrainSettings``,
``DPSGDSettings``) unless ``TRAINING``/``DPSGD_TRAINING`` or an option says otherwise. Every
setting is recorded (``settings()``) and checked against today's by
tests/test_benchmark_settings.py.

Reported per (shape, epsilon, arm): the relative AUC loss (%) against the baseline trained on
the same data (arXiv:2401.15246) and the calibration ratio mean(p) / mean(y), each as mean +-
std over the seeds. The Hybrid column is the library's default split rule
(``budgetplan.scenario.split_rules.DEFAULT_RULE``), read from the grid cell of the alpha it resolves to (the
same phases; only the rule's name in the plan differs). Then the regret table: for each
split rule, how far its alpha's loss is above the best alpha of the grid, per shape and
epsilon (``frontier_report.regret``), and the checks the issue asked of the defaults.

Resumable: every finished baseline pair and cell is written to the JSON at once, and a run
that finds a JSON made with the same settings continues where it stopped (one made with other
settings is refused, naming what differs; ``--fresh`` starts over; new shapes added to
``--shapes`` and new arms added to ``ARMS`` extend it). Writes
``<out>/<name>.json``, ``<name>.md`` and one ``<name>_<shape>.png`` per shape (``--out``
defaults to benchmarks/results).

Not a test: ``python benchmarks/utility_frontier.py --jobs 2`` (1,000,000 rows x 6 shapes x 3
seeds x 3 epsilons x 7 arms: hours on 2 CPU cores; the results' ``seconds`` say how many);
``--rows 250000 --name utility_frontier_250k`` the same at 200,000 training rows; ``--quick``
for a smoke run (20,000 rows, epsilons 1 and 8, one seed); ``--rows``, ``--shapes``,
``--seeds``, ``--epsilons``, ``--arms`` for a smaller one (``--name`` keeps it apart from the
default results); ``--jobs 2`` trains two (shape, seed) pairs at once in forked workers of
one torch thread each (on 2 cores about twice the throughput of one process: small models
gain little from a second intra-op thread).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import harness as h
from frontier_report import plot, render, summarise

__all__ = ["ARMS", "PLAN", "TRAINING", "DPSGD_TRAINING", "main", "parse_args", "plot", "render", "run", "settings",
           "summarise", "scenario", "TEMPLATE", "trainer_settings", "baseline_settings", "train_baselines"]

EPSILONS = (1.0, 3.0, 8.0)
# balanced first: the shape the README quotes; the mixed family: shapes the defaults were not fitted to
SHAPES = ("balanced", "nonsensitive", "sensitive", "mixed", "mixed-ns", "mixed-s")
TEMPLATE = "synthetic-hybrid"  # the shipped scenario every arm's plan is made from
# The arms and everything that sets them, in one place. ARMS: arm -> (the scenario's split, its tower).
ARMS = {"RR": ("alpha=1", None), "DP-SGD": ("alpha=0", None), "alpha=0.25": ("alpha=0.25", None),
        "alpha=0.5": ("alpha=0.5", None), "alpha=0.75": ("alpha=0.75", None), "paper-v1": ("paper-v1", None),
        "fine-tune": ("alpha=0.5", "fine-tune"),
        "units=0.75": ("units=0.75", None), "units=0.5": ("units=0.5", None)}


def _template_values() -> dict:
    """What the template sets that the arms share (read from the shipped file, so the two cannot drift)."""
    import tomllib

    from budgetplan.scenario import examples

    raw = tomllib.loads(Path(examples.path(TEMPLATE)).read_text())
    return {"delta": raw["budget"]["delta"], "adjacency": raw["privacy"]["adjacency"],
            "unit": raw["privacy"]["unit"], "tower": raw["algorithm"]["tower"],
            "calibration_share": raw.get("calibration", {}).get("share"),
            "rr": {"epochs": raw.get("rr", {}).get("epochs"), "batch_size": raw["rr"]["batch_size"]},
            "dpsgd": {k: raw["dpsgd"][k] for k in ("batch_size", "epochs", "clipping_norm")}}


# What every arm's plan shares: the template's values (the options of the same names override them).
PLAN = _template_values()
# Overrides of the trainer's defaults (TrainSettings, DPSGDSettings) for every run, baselines
# included; empty: the library's defaults, so that a better default reaches the frontier (and
# makes the committed results stale) without an edit here.
TRAINING: dict = {}
DPSGD_TRAINING: dict = {}
BASELINE: dict = {}  # overrides of trainers.baseline.BaselineSettings (early stopping)
HOLDOUT = h.HOLDOUT
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
    ap.add_argument("--rr-epochs", type=int, default=PLAN["rr"]["epochs"], help="default: the template's")
    ap.add_argument("--dpsgd-batch", default=PLAN["dpsgd"]["batch_size"], help='an integer or "N/<c>"')
    ap.add_argument("--dpsgd-epochs", type=float, default=PLAN["dpsgd"]["epochs"])
    ap.add_argument("--clipping-norm", type=float, default=PLAN["dpsgd"]["clipping_norm"])
    ap.add_argument("--dpsgd-lr", type=float, default=None, help="default: DPSGDSettings' default")
    ap.add_argument("--composition", choices=("auto", "basic", "pld"), default=None,
                    help="[accounting].composition of every plan (default: the template's, else the planner's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--jobs", type=int, default=1, help="(shape, seed) pairs trained at once, one torch thread each "
                    "(a speed setting: the results are the same)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['rows']:,} rows, epsilons {QUICK['epsilons']}, {QUICK['seeds']} seed (every shape)")
    ap.add_argument("--name", default=None, help="results file stem (default utility_frontier, _quick with --quick)")
    ap.add_argument("--out", type=Path, default=h.RESULTS, help="results folder (default benchmarks/results)")
    ap.add_argument("--fresh", action="store_true", help="discard finished cells of an earlier run")
    ap.add_argument("--cells-from", type=Path, default=None, metavar="FILE",
                    help="take the cells this run still lacks from another results file of this script made with "
                         "the same settings (its shapes, arms and epsilons may differ) on the same baselines")
    ap.add_argument("--render", action="store_true", help="rewrite the .md and PNGs from the existing .json")
    args = ap.parse_args(argv)
    args.argv = list(argv)
    h.apply_quick(args, argv, QUICK)
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
    for what, value in (("--rows", args.rows), ("--users", args.users), ("--seeds", args.seeds),
                        ("--jobs", args.jobs)):
        if value < 1:
            ap.error(f"{what} must be at least 1, got {value}")
    if not args.epsilon_list or not all(0 < e < float("inf") for e in args.epsilon_list):
        ap.error(f"--epsilons must be positive and finite, got {args.epsilons!r}")
    return args


def trainer_settings(args):
    """The trainer's settings for every run: its defaults, TRAINING's and the options' overrides."""
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import TrainSettings

    dp = dict(DPSGD_TRAINING, **({} if args.dpsgd_lr is None else {"lr": args.dpsgd_lr}))
    return TrainSettings(**dict(TRAINING, device=args.device)), DPSGDSettings(**dp)


def settings(args: argparse.Namespace) -> dict:
    """Every setting of the run: data, plans, training (the library's defaults resolved)."""
    from budgetplan.scenario.split_rules import ALPHA_BY_EPSILON, DEFAULT_RULE
    from trainers.data.synth import get_shape

    train, dp = trainer_settings(args)
    return h.settings_record("utility_frontier.py", args.argv, {
        "shapes": {s: get_shape(s).parameters() for s in args.shape_list},
        "rows": args.rows, "users": args.users, "data_seeds": [1000 + s for s in range(args.seeds)],
        "training_seed": "the data seed", "holdout": HOLDOUT, "epsilons": args.epsilon_list,
        "arms": {a: list(ARMS[a]) for a in args.arm_list},
        # the default rule is read from the grid, not trained: a new default re-renders, it does not re-train
        "scenario": _shared_scenario(args), "training": train.to_dict(), "dpsgd_settings": dp.to_dict(),
        "baselines": {"all": "run_baseline, all features", "nonsensitive": "run_baseline, truncated=True",
                      "settings": baseline_settings().to_dict()}}) | {"default_split": {
        "rule": DEFAULT_RULE, "alpha_by_epsilon": [{"from_epsilon": s.from_epsilon, "alpha": s.alpha}
                                                   for s in ALPHA_BY_EPSILON]}}


def baseline_settings():
    from trainers.baseline import BaselineSettings

    return BaselineSettings(**BASELINE)


def _shared_scenario(args) -> dict:
    """What every arm's scenario shares, the planner's defaults resolved (accountant,
    discretisation, sampling, RR's per-impression rule, ...): the name, epsilon, split, tower,
    N (and what follows from it) and features vary by cell and shape."""
    from budgetplan.planning.planner import resolve_composition
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape

    text = scenario(args, epsilon=max(args.epsilon_list), split="alpha=0.5", n=args.rows,
                    spec=get_shape(args.shape_list[0]).features)
    shared = resolve_composition(parse_scenario(text)).to_dict()  # how the phases meet the budget, as planned
    for key in ("name", "epsilon", "split", "tower", "dataset_size", "features"):
        shared.pop(key)
    shared["dpsgd"].pop("batch_size")  # "N/<c>" resolves with N
    shared["rr"].pop("validation_fraction", None)  # min(0.1, 200,000 / N)
    shared["dpsgd_batch_size"] = args.dpsgd_batch
    return shared


def scenario(args, *, epsilon: float, split: str, n: int, spec, tower: str | None = None) -> str:
    """The template's scenario with its epsilon, N, split, tower and [features] set (and the options
    that override its training shape, where given), as a user adapts it."""
    from budgetplan.scenario.examples import adapted, set_key

    text = adapted(TEMPLATE, epsilon=epsilon, dataset_size=n, split=split, tower=tower or PLAN["tower"],
                   features=spec, scenario_name=f"frontier-{split}-eps{epsilon:g}")
    if args.rr_epochs is not None:
        text = set_key(text, "rr", "epochs", int(args.rr_epochs))
    batch = args.dpsgd_batch
    text = set_key(text, "dpsgd", "batch_size", batch if str(batch).startswith("N/") else int(batch))
    text = set_key(text, "dpsgd", "epochs", args.dpsgd_epochs)
    text = set_key(text, "dpsgd", "clipping_norm", float(args.clipping_norm))
    if args.composition is not None:
        if "[accounting]" not in text:
            text += "\n[accounting]\n"
        text = set_key(text, "accounting", "composition", args.composition)
    return text


# ---------------------------------------------------------------------------------------- running


def _key(*parts) -> str:
    return "|".join(str(p) for p in parts)


def _load_state(path: Path, today: dict, fresh: bool) -> dict:
    """The finished baselines and cells of an earlier run with today's settings, or a new state."""
    if path.exists() and not fresh:
        state = json.loads(path.read_text())
        recorded = state.get("settings", {})
        old_shapes = recorded.get("values", {}).get("shapes", {})
        old_arms = recorded.get("values", {}).get("arms", {})
        # a shape or an arm the earlier run did not have extends it (its cells are trained, the others kept)
        diff = [d for d in h.settings_differences(recorded, today)
                if not (d.startswith("shapes.") and d.split(".")[1] not in old_shapes)
                and not (d.startswith("arms.") and d[len("arms."):] not in old_arms)]
        if diff and all(d.startswith("training.") and d.split(".")[1] in h.RR_TRAINING for d in diff):
            return _carry_unaffected(state, today, [d.split(".", 1)[1] for d in diff], alpha=0, arm="DP-SGD",
                                     phase="RR")
        if diff and all(_dpsgd_only(d) for d in diff):
            return _carry_unaffected(state, today, diff, alpha=1, arm="RR", phase="DP-SGD")
        if diff and all(d.startswith("baselines.settings.") for d in diff):
            return _new_baselines(state, today, diff)
        if diff == ["scenario.rr.epochs"]:
            caps = [run["values"]["scenario"]["rr"]["epochs"] for run in (recorded, today)]
            if all(isinstance(c, int) for c in caps):  # a cap on both sides (None: the plan's own epochs)
                return _new_rr_cap(state, *caps, today)
        if diff:
            raise SystemExit(f"{path} was made with other settings (these differ: {', '.join(diff[:5])}): pass "
                             "--fresh to start over, or --name to keep both")
        state["commits"] = sorted({*state.get("commits", []), recorded.get("commit") or "unknown"})
        state["settings"] = today
        return state
    return _new_state(today)


def _dpsgd_only(setting: str) -> bool:
    """Whether a setting is read by the DP-SGD phase alone: the template's ``[dpsgd]`` table, the batch
    rule and the DP-SGD optimiser's settings; and how the phases meet the budget (``[accounting].composition``:
    one phase has nothing to compose). An RR-only plan (alpha 1) has the same phases whatever they are
    (only the scenario it embeds differs), and the baselines read none of them."""
    return (setting.startswith(("scenario.dpsgd.", "dpsgd_settings."))
            or setting in ("scenario.dpsgd_batch_size", "scenario.composition"))


def _carried(state: dict, today: dict, keep, *, baselines: dict, arms: list[str], why: str,
             earlier: tuple[str, ...] = ()) -> dict:
    """A new state with today's settings that carries the earlier run's cells for which ``keep(cell)``
    holds, each marked with the commit it was trained at (``carried_from``), and ``baselines``;
    ``carried`` says which commits they came from (``earlier``: those of baselines carried too),
    which ``arms`` and ``why``."""
    commit = state["settings"].get("commit") or "unknown"
    cells = {key: {**cell, "carried_from": cell.get("carried_from", commit)}
             for key, cell in state["cells"].items() if keep(cell)}
    commits = sorted({*earlier, *(c["carried_from"] for c in cells.values())} or {commit})
    fresh = _new_state(today)
    fresh.update(baselines=baselines, cells=cells, carried={
        "from_commit": " and ".join(c[:12] for c in commits), "commits": commits, "arms": arms, "why": why})
    return fresh


def _carry_unaffected(state: dict, today: dict, changed: list[str], *, alpha: float, arm: str, phase: str) -> dict:
    """A new state for a run whose settings differ from the earlier one's only in ``phase``'s (the RR
    phase's ``harness.RR_TRAINING``, or the DP-SGD phase's, ``_dpsgd_only``): the cells of the arm
    without that phase (plain DP-SGD, alpha 0; or RR alone, alpha 1) and the non-private baselines
    read none of those settings, so they are carried; every other cell is trained again."""
    changed = ", ".join(changed)
    kept = sum(1 for cell in state["cells"].values() if cell.get("alpha") == alpha)
    print(f"carrying {kept} {arm} cell(s) and {len(state['baselines'])} baseline pair(s): only the "
          f"{phase} phase's settings changed ({changed})", file=sys.stderr)
    return _carried(state, today, lambda cell: cell.get("alpha") == alpha, baselines=state["baselines"],
                    arms=[arm, "the non-private baselines"],
                    why=f"neither reads a setting that changed (the {phase} phase's {changed})",
                    earlier=_carried_commits(state))


def _carried_commits(state: dict) -> tuple[str, ...]:
    """The commits the earlier run's own carried cells and baselines came from."""
    return tuple((state.get("carried") or {}).get("commits", []))


def _in_arm_order(arms) -> list[str]:
    """``arms`` in the order of ARMS (others last)."""
    return sorted(arms, key=lambda a: list(ARMS).index(a) if a in ARMS else len(ARMS))


def _new_baselines(state: dict, today: dict, changed: list[str]) -> dict:
    """A new state for a run whose settings differ from the earlier one's only in how the non-private
    baselines are trained (``baselines.settings``): no cell reads those, so every cell is carried,
    the baselines are trained again and every cell's relative loss is scored against them
    (``rescore_carried``)."""
    arms = _in_arm_order({c["arm"] for c in state["cells"].values()})
    changed = ", ".join(d[len("baselines.settings."):] for d in changed)
    print(f"carrying {len(state['cells'])} cell(s): only the non-private baselines' settings changed ({changed}); "
          "training the baselines again", file=sys.stderr)
    return _carried(state, today, lambda cell: True, baselines={}, arms=arms,
                    why=f"no cell reads a setting that changed (the non-private baselines' {changed}; the baselines "
                        "were trained again in this run)")


def _new_rr_cap(state: dict, before: int, after: int, today: dict) -> dict:
    """A new state for a run whose settings differ from the earlier one's only in the RR phase's cap
    (``[rr].epochs``, ``before`` then ``after``): a cell without an RR phase, or whose RR phase stopped
    itself at its held-out units before epoch min(before, after), trained exactly what it would train
    under either cap (the loop, its checks and every draw up to the stop are the same; the cap only
    ends a phase that has not stopped), so it is carried with the baselines; every other cell is
    trained again."""
    cap = min(before, after)

    def unaffected(cell: dict) -> bool:
        return cell.get("rr") is None or cell["rr"]["epochs_run"] < cap - 1e-9

    kept = [c for c in state["cells"].values() if unaffected(c)]
    arms = _in_arm_order({c["arm"] for c in kept})
    print(f"carrying {len(kept)} of {len(state['cells'])} cell(s) and {len(state['baselines'])} baseline pair(s): "
          f"only the RR phase's cap changed ({before} to {after} epochs), and those never reached epoch {cap}",
          file=sys.stderr)
    return _carried(state, today, unaffected, baselines=state["baselines"], arms=arms,
                    why=f"each has no RR phase or one that stopped itself at its held-out units before epoch {cap}, "
                        f"which the RR phase's new cap ([rr] epochs {after}, was {before}) leaves as it was; the "
                        "cells whose RR phase ran to the old cap were trained again",
                    earlier=_carried_commits(state))


def _cell_plan(args, cell: dict):
    """The plan this run makes for ``cell`` (its shape, epsilon, arm and training rows N)."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape

    split, tower = ARMS[cell["arm"]]
    return build_plan(parse_scenario(scenario(args, epsilon=cell["epsilon"], split=split, n=cell["dataset_size"],
                                              spec=get_shape(cell["shape"]).features, tower=tower)))


def take_cells(state: dict, other_path: Path, args) -> int:
    """Copy into ``state`` the cells it lacks from another results file of this script (``--cells-from``):
    one made with today's settings but for its shapes, arms and epsilons (a shape or arm both runs have
    must be the same), whose baselines for the cell's (shape, seed) are this run's, and whose plan is
    the one this run makes, byte for byte (its ``plan_sha256``: a planner changed since plans some
    cells otherwise even where no setting changed). Same settings, same data, same seeds and the same
    plan give the same training, so a cell taken is the cell this run would train. Each is marked
    with the commit it was trained at (``carried_from``); returns how many."""
    try:
        other = json.loads(Path(other_path).read_text())
        recorded = other["settings"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"--cells-from {other_path}: not a results file of this script ({exc})") from None
    today = state["settings"]
    mine, theirs = today.get("values", {}), recorded.get("values", {})

    def extends(setting: str) -> bool:  # a shape or arm that only one of the two runs has
        top, _, rest = setting.partition(".")
        name = rest.split(".")[0] if top == "shapes" else rest
        return top in ("shapes", "arms") and (name not in mine.get(top, {}) or name not in theirs.get(top, {}))

    diff = [d for d in h.settings_differences(recorded, today) if d != "epsilons" and not extends(d)]
    if diff:
        raise SystemExit(f"--cells-from {other_path}: made with other settings (these differ: "
                         f"{', '.join(diff[:5])}); only its shapes, arms and epsilons may differ")
    commit = recorded.get("commit") or "unknown"
    taken, replanned = {}, 0
    for key, cell in other.get("cells", {}).items():
        unit = _key(cell["shape"], cell["seed"])
        if (key in state["cells"] or cell["shape"] not in args.shape_list or cell["arm"] not in args.arm_list
                or cell["epsilon"] not in args.epsilon_list or cell["seed"] >= args.seeds
                or unit not in state["baselines"] or other["baselines"].get(unit) != state["baselines"][unit]):
            continue
        if cell.get("plan_sha256") != _cell_plan(args, cell).sha256:
            replanned += 1  # today's plan of the cell differs (the planner changed since): trained again
            continue
        taken[key] = {**cell, "carried_from": cell.get("carried_from", commit)}
    if replanned:
        print(f"{replanned} cell(s) of {other_path} plan differently today: trained here", file=sys.stderr)
    if taken:
        state["cells"].update(taken)
        carried = state.setdefault("carried", {"arms": [], "commits": [], "why": ""})
        arms = sorted({c["arm"] for c in taken.values()}, key=list(ARMS).index)
        carried["arms"] = list(dict.fromkeys([*carried["arms"], *arms]))
        carried["commits"] = sorted({*carried["commits"], *(c["carried_from"] for c in taken.values())})
        carried["from_commit"] = " and ".join(c[:12] for c in carried["commits"])
        why = f"{', '.join(arms)} from {Path(other_path).name}, made with the same settings on the same baselines"
        carried["why"] = f"{carried['why']}; {why}" if carried["why"] else why
    print(f"took {len(taken)} cell(s) from {other_path}", file=sys.stderr)
    return len(taken)


def _new_state(today: dict) -> dict:
    return {"settings": today, "baselines": {}, "cells": {}, "seconds": 0.0, "complete": False}


def _save(path: Path, state: dict) -> None:
    from budgetplan.util.fileio import write_atomic

    write_atomic(path, json.dumps(state, indent=2) + "\n")


def _rr_summary(record) -> dict | None:
    """Where the RR phase's held-out units stopped it (None without an RR phase)."""
    rr = next((p for p in record.phases if p.name == "rr"), None)
    if rr is None:
        return None
    kept = rr.validation_kept
    return {"epochs_run": rr.validation_checks[-1] if rr.validation_checks else rr.epochs,
            "kept_epoch": rr.validation_checks[kept] if kept is not None else None,
            "validation_auc": rr.validation_auc[kept] if kept is not None else None}


def train_baselines(plan, train, evaluation, settings, baseline, seed: int, threads) -> dict:
    """The non-private models on the same data: all features (the reference of every loss) and
    the non-sensitive features alone (the truncated model: the ceiling of RR)."""
    from trainers.baseline import reference
    from trainers.metrics import relative_auc_loss
    from trainers.run import run_baseline

    out = {}
    for label, truncated in (("all", False), ("nonsensitive", True)):
        t0 = time.perf_counter()
        rec = run_baseline(plan, train, eval_path=evaluation, settings=settings, baseline=baseline, seed=seed,
                           truncated=truncated, threads=threads)
        out[label] = {**h.eval_metrics(rec), "seconds": time.perf_counter() - t0,
                      "auc_tolerance": reference(rec)[1] if rec.metrics["eval"].get("auc") is not None else None}
    if out["nonsensitive"]["auc"] is not None and out["all"]["auc"] is not None:
        out["nonsensitive"]["relative_auc_loss"] = relative_auc_loss(out["nonsensitive"]["auc"], out["all"]["auc"])
    return out


def _unit(args, shape: str, seed: int, cells: list, baseline: dict | None, report) -> None:
    """Train one (shape, seed): its data, its baselines unless given, then ``cells`` ((eps, arm)
    pairs); ``report(kind, key, value)`` after each ("status", "baseline", "cell")."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.report.plots import arm_of
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape
    from trainers.run import RunOptions, execute_plan

    train_settings, dp = trainer_settings(args)
    threads = 1 if args.jobs > 1 else "auto"  # a worker's siblings hold the other cores
    spec = get_shape(shape).features
    work = Path(tempfile.mkdtemp(prefix="frontier-"))
    try:
        report("status", None, f"{shape} seed {seed}: data")
        train, evaluation, n = h.holdout_data(shape, seed, args.rows, args.users, work)
        if baseline is None:
            report("status", None, f"{shape} seed {seed}: non-private baselines")
            first = build_plan(parse_scenario(scenario(args, epsilon=args.epsilon_list[0], split="alpha=0.5", n=n,
                                                       spec=spec)))
            baseline = {**train_baselines(first, train, evaluation, train_settings, baseline_settings(), 1000 + seed,
                                     threads), "dataset_size": n}
            report("baseline", _key(shape, seed), baseline)
        for eps, arm in cells:
            report("status", None, f"{shape} seed {seed}: {arm} eps {eps:g}")
            t0 = time.perf_counter()
            split, tower = ARMS[arm]
            plan = build_plan(parse_scenario(scenario(args, epsilon=eps, split=split, n=n, spec=spec, tower=tower)))
            rec = execute_plan(plan, train, RunOptions(eval_path=evaluation, settings=train_settings,
                                                       dpsgd_settings=dp, seed=1000 + seed,
                                                       baseline_auc=baseline["all"]["auc"],
                                                       baseline_tolerance=baseline["all"]["auc_tolerance"],
                                                       threads=threads))
            report("cell", _key(shape, seed, eps, arm), {
                "shape": shape, "seed": seed, "epsilon": eps, "arm": arm, "split": split,
                "tower": plan.dpsgd.params.nonsensitive_tower if plan.dpsgd else None,
                "alpha": arm_of(plan)[1], "delta": plan.delta, "dataset_size": plan.dataset_size,
                "flip_probability": plan.rr.params.flip_probability if plan.rr else None,
                "noise_multiplier": plan.dpsgd.params.noise_multiplier if plan.dpsgd else None,
                "dpsgd_steps": plan.dpsgd.params.steps if plan.dpsgd else None,
                "dpsgd_batch_size": plan.dpsgd.params.batch_size if plan.dpsgd else None,
                "rr": _rr_summary(rec), **h.eval_metrics(rec), "seconds": time.perf_counter() - t0,
                "plan_sha256": plan.sha256})
    finally:
        shutil.rmtree(work, ignore_errors=True)


_QUEUE = None  # a worker's channel to the parent (--jobs > 1)


def _start_worker(queue) -> None:
    global _QUEUE
    _QUEUE = queue


def _queued_unit(args, shape, seed, cells, baseline) -> None:
    _unit(args, shape, seed, cells, baseline, lambda *message: _QUEUE.put(message))


def run(args) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    path = args.out / f"{args.name}.json"
    state = _load_state(path, settings(args), args.fresh)
    if args.cells_from is not None:
        take_cells(state, args.cells_from, args)
    units = []  # (shape, seed, cells still to train, its baselines if already trained)
    for shape in args.shape_list:
        for seed in range(args.seeds):
            cells = [(e, a) for e in args.epsilon_list for a in args.arm_list
                     if _key(shape, seed, e, a) not in state["cells"]]
            known = state["baselines"].get(_key(shape, seed))
            if cells or known is None:
                units.append((shape, seed, cells, known))
    total = sum(len(u[2]) + (u[3] is None) for u in units)
    args.out.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with h.progress(*columns) as bar:
        task = bar.add_task("utility frontier", total=total)

        def report(kind, key, value):
            if kind == "status":
                bar.update(task, description=value)
                return
            (state["baselines"] if kind == "baseline" else state["cells"])[key] = value
            state["seconds"] += (sum(value[b]["seconds"] for b in ("all", "nonsensitive")) if kind == "baseline"
                                 else value["seconds"])
            _save(path, state)
            bar.advance(task)

        if args.jobs == 1 or len(units) <= 1:
            for unit in units:
                _unit(args, *unit, report)
        else:
            _run_parallel(args, units, report)
    rescore_carried(state)
    state["complete"] = True
    state["machine"] = {**h.machine(), "device": args.device, "jobs": args.jobs}
    _save(path, state)
    return state


def rescore_carried(state: dict) -> None:
    """Score the cells carried from an earlier run (``carried_from``) against this run's baselines:
    their AUC is what their training gave, their relative loss and beats-baseline flag are not."""
    from trainers.metrics import relative_auc_loss

    for cell in state["cells"].values():
        base = state["baselines"].get(_key(cell["shape"], cell["seed"])) if "carried_from" in cell else None
        if base is not None and cell.get("auc") is not None:
            cell["relative_auc_loss"] = relative_auc_loss(cell["auc"], base["all"]["auc"])
            tolerance = base["all"].get("auc_tolerance")
            cell["beats_baseline"] = tolerance is not None and cell["auc"] - base["all"]["auc"] > tolerance


def _run_parallel(args, units, report) -> None:
    """Each (shape, seed) in a forked worker of one torch thread, at most ``--jobs`` at once;
    the parent saves every result as it arrives, so a stop loses only cells in flight."""
    import multiprocessing
    import queue as queues
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    context = multiprocessing.get_context("fork")  # the workers inherit this module's settings as they are
    channel = context.Queue()
    with ProcessPoolExecutor(max_workers=min(args.jobs, len(units)), mp_context=context,
                             initializer=_start_worker, initargs=(channel,)) as pool:
        pending = {pool.submit(_queued_unit, args, *unit) for unit in units}
        while pending:
            try:
                report(*channel.get(timeout=1.0))
                continue
            except queues.Empty:
                pass
            done, pending = wait(pending, timeout=0, return_when=FIRST_COMPLETED)
            for future in done:
                future.result()  # a worker's error stops the run here (what arrived is saved)
        while True:  # what the last workers sent just before they finished
            try:
                report(*channel.get(timeout=0.5))
            except queues.Empty:
                break


def main(argv: list[str]) -> dict:
    args = parse_args(argv)
    path = args.out / f"{args.name}.json"
    from budgetplan.util.fileio import write_atomic

    if args.render:  # read with today's default split rule: the cells do not depend on it
        state = json.loads(path.read_text())
        state["settings"]["default_split"] = settings(args)["default_split"]
        _save(path, state)
    else:
        state = run(args)

    text = render(state, args.name)
    write_atomic(args.out / f"{args.name}.md", text)
    plot(state, args.name, args.out)
    print(text)
    check_ceiling(state)
    return state


def check_ceiling(state: dict) -> None:
    """Fail the benchmark (exit 1, after its results are written) when a DP arm beat its baseline
    by more than the baseline's AUC tolerance (2 Hanley-McNeil standard errors): the ceiling is
    under-trained there, and no relative loss against it means anything."""
    flagged = sorted(k for k, c in state["cells"].items() if c.get("beats_baseline"))
    if flagged:
        raise SystemExit(f"a DP arm beat its non-private baseline beyond the AUC tolerance in {len(flagged)} cells "
                         f"({', '.join(flagged[:4])}{', ...' if len(flagged) > 4 else ''}): the baseline is no "
                         "ceiling there")


if __name__ == "__main__":
    main(sys.argv[1:])
