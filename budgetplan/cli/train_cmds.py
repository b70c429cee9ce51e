"""``budgetplan train`` and ``budgetplan demo``: plan-then-train from the command line.

Both import the torch trainer lazily: the rest of the CLI never loads torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn

import click

from budgetplan.cli.data_cmd import SHAPE_NAMES
from budgetplan.cli.render import fmt, results_table
from budgetplan.cli.shell import (
    BATCH_SIZE,
    EPOCHS_OR_NONE,
    LEARNING_RATE,
    LEARNING_RATE_OR_AUTO,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_INT,
    THREADS_OR_AUTO,
    bounded_int,
    bounded_non_negative,
    console,
    emit_json,
    warn,
)
from budgetplan.limits import (
    MAX_DATASET_SIZE,
    MAX_EMBEDDING_DIM,
    MAX_EPOCHS,
    MAX_HASH_BINS,
    MAX_PROCESSES,
    MAX_SYNTH_ROWS,
    MAX_WEIGHT_DECAY,
)
from trainers.settings import RR_SELECT, TrainSettings  # no torch: settings only

if TYPE_CHECKING:
    from pathlib import Path

    from budgetplan.plan import Plan
    from budgetplan.record.records import RunRecord
    from trainers.distributed import Collective

__all__ = ["train", "demo"]

_TRAIN = TrainSettings()  # the defaults the options below show

_THREADS = click.option(
    "--threads", type=THREADS_OR_AUTO, default="auto", show_default=True,
    help='CPU threads for torch: an integer, or "auto" (OMP_NUM_THREADS if set, else the CPUs this process may use '
    "less the threads other work runs now: never more threads than free cores).")


def _pairs(pairs: tuple[tuple[float, float], ...] | None) -> str:
    return "none" if not pairs else ", ".join(f"({r:g}, {d:g})" for r, d in pairs)


def _settings(**kw: Any) -> TrainSettings:  # the options as given: TrainSettings checks each
    return TrainSettings(**{k: v for k, v in kw.items() if v is not None})


@click.command()
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--data", "data_path", required=True, type=click.Path(),
              help="Training data: a file, or a directory of shards (a prepared one from `data cap`).")
@click.option("--eval", "eval_path", type=click.Path(), help="Held-out data for metrics (a file or a directory).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory to create.")
@click.option("--format", "data_format", default="auto", show_default=True,
              type=click.Choice(["auto", "parquet", "csv", "tsv", "criteo-attribution", "criteo-display",
                                 "criteo-search"]))
@click.option("--model", type=click.Choice(["mlp", "fm"]), default="mlp", show_default=True)
@click.option("--embedding-dim", default="8", show_default=True, help='An integer, or "auto" (int(2 V^0.25)).')
@click.option("--lr", type=LEARNING_RATE, default=1e-3, show_default=True,
              help="Adam step size of a --non-private baseline, and of an RR phase without held-out units "
              f"(with them it trains each (learning rate, L2) pair of {_pairs(_TRAIN.rr_candidates)} from the same "
              "start and keeps the one its held-out units score best: see --rr-select).")
@click.option("--dpsgd-optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True,
              help="DP-SGD phase optimiser (sgd: momentum 0.9). Post-processing: no privacy cost.")
@click.option("--dpsgd-lr", type=LEARNING_RATE_OR_AUTO, default="auto", show_default=True,
              help="DP-SGD phase learning rate; auto: 0.12 / sqrt(the phase's steps) for Adam.")
@click.option("--dpsgd-schedule", type=click.Choice(["constant", "cosine"]), default="constant", show_default=True,
              help="DP-SGD learning-rate schedule over the plan's steps.")
@click.option("--loss", type=click.Choice(["forward", "unbiased"]), default="forward", show_default=True,
              help="RR debiasing: the forward-corrected loss, or the Hybrid paper's unbiased loss (unbounded "
              "below: it can memorise flipped labels of rare values).")
@click.option("--rr-select", type=click.Choice(RR_SELECT), default=None, show_default=_TRAIN.rr_select,
              help="What the RR phase's held-out checks compare to stop, keep a state and choose a (learning rate, "
              "L2) pair: the debiased AUC (the log loss where the held-out rows hold too few positives) or the "
              "debiased log loss. Post-processing of the release: no privacy cost.")
@click.option("--rr-average", type=EPOCHS_OR_NONE, default=None, show_default=str(_TRAIN.rr_average).lower(),
              help='Epochs of the moving average of the RR weights that each held-out check scores beside the '
              'last weights, keeping the better; "none": the last weights alone.')
@click.option("--hybrid-start", type=click.Choice(["rr-model", "as-trained"]), default="rr-model", show_default=True,
              help="Hybrid: start DP-SGD from exactly the RR model, or leave the sensitive tower's outlet as "
              "initialised.")
@click.option("--batch-size", type=BATCH_SIZE, default=None, help="When the plan does not fix one.")
@click.option("--encoding", "nonsensitive_encoding", type=click.Choice(["auto", "vocab", "hash"]), default="auto",
              show_default=True, help="Non-sensitive categoricals: a vocabulary of values seen at least "
              "--vocab-threshold times, or hashed; auto: vocab where the plan leaves those columns unprotected, "
              "else hash (sensitive ones are always hashed: their counts are private).")
@click.option("--vocab-threshold", type=bounded_int("vocab_threshold", MAX_DATASET_SIZE), default=16, show_default=True)
@click.option("--hash-bins", type=bounded_int("hash_bins", MAX_HASH_BINS), default=2**16, show_default=True,
              help="Rows of each hashed embedding table (non-sensitive and sensitive).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N.")
@_THREADS
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Reproducible run (debugging only): privacy noise derived from this seed, recorded as such.")
@click.option("--non-private", is_flag=True, help="Train the non-private baseline on the plan's features instead, with "
              "early stopping on a validation split of --data.")
@click.option("--baseline-epochs", type=bounded_int("baseline_epochs", MAX_EPOCHS), default=20, show_default=True,
              help="--non-private: the most epochs.")
@click.option("--patience", type=bounded_int("patience", MAX_EPOCHS), default=5, show_default=True,
              help="--non-private: epochs without a lower validation log loss before stopping.")
@click.option("--validation-fraction", type=OPEN_UNIT, default=0.1, show_default=True,
              help="--non-private: the share of units (or rows, without a unit id) of --data held out for "
              "early stopping.")
@click.option("--weight-decay", type=bounded_non_negative("weight_decay", MAX_WEIGHT_DECAY), default=1e-4,
              show_default=True, help="--non-private: L2 penalty on every parameter.")
@click.option("--truncated", is_flag=True, help="--non-private: non-sensitive features only (the ceiling of RR, "
              "whose model may not use sensitive features).")
@click.option("--baseline", "baseline_run", type=click.Path(dir_okay=False),
              help="A --non-private run.json of the same model and encoding: the relative AUC loss against its "
              "eval AUC, and a flag if this run beats it by more than noise.")
@click.option("--resume", is_flag=True, help="Continue the interrupted run in --out (ledger count, fresh noise).")
@click.option("--checkpoint-every", type=POSITIVE_INT, default=200, show_default=True,
              help="DP-SGD steps between checkpoints.")
@click.option("--fingerprint-key", "key_path", type=click.Path(dir_okay=False),
              help="The data owner's key for the keyed data fingerprint (default: a fresh key, saved as "
              "private/fingerprint.key in the run directory).")
@click.option("--nproc", type=bounded_int("nproc", MAX_PROCESSES), default=1, show_default=True,
              help="Processes on this machine, each on its block of the rows (of whole units when units are sampled; "
                   "gloo), with one process's guarantee: Poisson sampling on every rank, one noise draw per step. "
                   "--threads is then per process. Under torchrun leave it at 1: the group comes from the environment.")
@click.option("--canaries", type=bounded_int("canaries", MAX_DATASET_SIZE), default=None,
              help="Replace this many rows by canaries (their labels secret coins) and record the one-run audit "
              "(does the model refute the plan's trade-off curve? arXiv:2410.22235) in the private record; "
              "`budgetplan audit` checks it.")
@click.option("--canary-confidence", type=OPEN_UNIT, default=0.95, show_default=True,
              help="--canaries: the confidence of the audit's test and bound.")
@click.option("--scenario", "signed", metavar="SCENARIO.toml",
              help="The scenario that was signed off: refuse the plan unless its embedded scenario is exactly it, "
                   "as `verify --scenario` does. A plan edited and re-hashed (a sensitive column moved to the "
                   "non-sensitive group, say) is consistent in itself; only this comparison shows it.")
@click.option("--json", "as_json", is_flag=True, help="Print the run record (public and private parts) on stdout.")
def train(plan_file: str, data_path: str, eval_path: str | None, out_dir: str, data_format: str, model: str,
          embedding_dim: str, lr: float, dpsgd_optimizer: str, dpsgd_lr: float | str, dpsgd_schedule: str, loss: str,
          rr_select: str | None, rr_average: float | str | None, hybrid_start: str, batch_size: int | None,
          nonsensitive_encoding: str, vocab_threshold: int, hash_bins: int,
          device: str, threads: int | str, seed: int | None, non_private: bool, baseline_epochs: int, patience: int,
          validation_fraction: float, weight_decay: float, truncated: bool, baseline_run: str | None, resume: bool,
          checkpoint_every: int, key_path: str | None, nproc: int, canaries: int | None, canary_confidence: float,
          signed: str | None, as_json: bool) -> None:
    """Execute PLAN.json on --data and write --out/run.json (or train the non-private baseline).

    Under torchrun (WORLD_SIZE > 1 in the environment) every process runs this command and
    joins the group; rank 0 keeps the ledger, writes --out and prints the record.
    """
    from budgetplan.plan import load_plan
    from trainers.allocator import tune_allocator
    from trainers.dpsgd import DPSGDSettings
    from trainers.run import RunOptions, execute_plan, resolve_device, run_baseline

    emb = "auto" if embedding_dim == "auto" else _int_option("--embedding-dim", embedding_dim, MAX_EMBEDDING_DIM)
    settings = _settings(model=model, embedding_dim=emb, lr=lr, loss=loss, batch_size=batch_size, device=device,
                         data_format=data_format, nonsensitive_encoding=nonsensitive_encoding,
                         vocab_threshold=vocab_threshold, hash_bins_nonsensitive=hash_bins,
                         hash_bins_sensitive=hash_bins, hybrid_start=hybrid_start, rr_select=rr_select)
    if rr_average is not None:
        settings = replace(settings, rr_average=None if rr_average == "none" else float(rr_average))
    plan = load_plan(plan_file)
    _refuse_unused(click.get_current_context(), plan, non_private)
    if signed is not None:
        _check_signed(plan, signed)
    key = None
    record: RunRecord | None
    if key_path is not None:
        from trainers.data.fingerprint import read_key

        key = read_key(key_path)
    tune_allocator()  # this process is ours: a training step's tensors reuse their memory (trainers.allocator)
    if non_private:
        from trainers.baseline import NOT_CONVERGED, BaselineSettings

        baseline = BaselineSettings(max_epochs=baseline_epochs, patience=patience,
                                    validation_fraction=validation_fraction, weight_decay=weight_decay)
        record = run_baseline(plan, data_path, eval_path=eval_path, out_dir=out_dir, settings=settings,
                              baseline=baseline, seed=seed, truncated=truncated, progress=not as_json,
                              fingerprint_key=key, threads=threads)
        for note in record.notes:
            if note.startswith(NOT_CONVERGED):
                warn(note)
    else:
        base_auc = tolerance = None
        if baseline_run:
            base_auc, tolerance = _baseline_reference(baseline_run, plan, settings)
        run_with: Callable[..., RunRecord | None] = execute_plan
        if canaries is not None:
            from functools import partial

            from trainers.canary import canary_audit

            run_with = partial(canary_audit, canaries=canaries, confidence=canary_confidence)
        collective = _torchrun_group(nproc)
        record = run_with(plan, data_path, RunOptions(
            eval_path=eval_path, out_dir=out_dir, settings=settings, seed=seed, baseline_auc=base_auc,
            baseline_tolerance=tolerance, progress=not as_json, resume=resume,
            dpsgd_settings=DPSGDSettings.for_device(resolve_device(device), optimizer=dpsgd_optimizer,
                                                    lr=None if dpsgd_lr == "auto" else dpsgd_lr,
                                                    cosine_decay=dpsgd_schedule == "cosine"),
            checkpoint_every=checkpoint_every, fingerprint_key=key, threads=threads, nproc=nproc,
            collective=collective))
        if record is None:
            return  # a rank other than 0 under torchrun: rank 0 reports
    if as_json:
        private = record.private_part
        emit_json(record.content() | {"sha256": record.sha256, "private_record": private.content() | {
            "sha256": private.sha256} if private is not None else None})
        return
    _print_record(record, out_dir)


def _check_signed(plan: Plan, signed: str) -> None:
    """Refuse a plan whose embedded scenario differs from the signed-off one (``verify --scenario``)."""
    from budgetplan.audit.verify import verify_plan
    from budgetplan.cli.plan_cmds import scenario_of
    from budgetplan.errors import PlanMismatchError

    report = verify_plan(plan, replan=False, signed=scenario_of(signed))
    if not report.ok:
        raise PlanMismatchError(f"the plan is not the signed-off scenario {signed}'s: {report.problems[0]}",
                                report.problems)


def _torchrun_group(nproc: int) -> Collective | None:
    """This process's place in the group torchrun describes, or None (one process, or --nproc here)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    if nproc != 1:
        raise click.UsageError(f"--nproc {nproc} under torchrun (WORLD_SIZE={os.environ['WORLD_SIZE']}): the group "
                               "comes from torchrun; leave --nproc at 1")
    from trainers.distributed import from_environment

    return from_environment()


def _baseline_reference(path: str, plan: Plan, settings: TrainSettings) -> tuple[float, float]:
    """(eval AUC, tolerance) of the --baseline run, refused unless it is a ceiling for this plan's model."""
    from budgetplan.errors import InvalidParameterError
    from budgetplan.record.records import load_record
    from trainers.baseline import check_comparable, reference

    base = load_record(path, private=True)
    try:
        out = reference(base)
        if plan.walr is None:  # WALR's logistic regression is compared with the neural ceiling as it is
            check_comparable(base, settings.for_plan(plan), full_model=plan.dpsgd is not None)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"--baseline {path}: {exc}") from None
    return out


# Options that only some runs read: given explicitly to a run that ignores them, they are
# refused, so that a setting someone meant to change never silently changes nothing.
_DPSGD_ONLY = ("dpsgd_optimizer", "dpsgd_lr", "dpsgd_schedule", "checkpoint_every")
_PRIVATE_ONLY = ("loss", "hybrid_start", "rr_select", "rr_average", "resume", "baseline_run", "nproc", "canaries",
                 "canary_confidence")
_BASELINE_ONLY = ("baseline_epochs", "patience", "validation_fraction", "weight_decay", "truncated")
_NEURAL_ONLY = ("model", "embedding_dim", "lr", "nonsensitive_encoding", "vocab_threshold", "hash_bins")


def _refuse_unused(ctx: click.Context, plan: Plan, non_private: bool) -> None:
    from click.core import ParameterSource

    given = {p.name: p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None)}
    names = [ph.name for ph in plan.phases]

    def refuse(param: str, why: str) -> NoReturn:
        raise click.UsageError(f"{given[param].opts[-1]} {why}")

    for param in _PRIVATE_ONLY + _DPSGD_ONLY:
        if param in given and non_private:
            refuse(param, "does not apply to --non-private (the baseline trains on clean labels)")
    for param in _BASELINE_ONLY:
        if param in given and not non_private:
            refuse(param, "applies to the non-private baseline (--non-private) only")
    for param in _DPSGD_ONLY:
        if param in given and plan.dpsgd is None:
            refuse(param, f"applies to a DP-SGD phase; this plan has {' + '.join(names)}")
    for param in _NEURAL_ONLY:
        if param in given and plan.walr is not None and not non_private:
            refuse(param, "configures a neural model; a WALR plan fits a logistic regression on its release")
    if "loss" in given and plan.rr is None:
        refuse("loss", f"is the RR phase's debiasing; this plan has {' + '.join(names)}")
    if "hybrid_start" in given and (plan.rr is None or plan.dpsgd is None):
        refuse("hybrid_start", f"applies to a Hybrid plan (RR then DP-SGD); this plan has {' + '.join(names)}")
    _refuse_rr_checks(given, plan, non_private, refuse)
    if "canary_confidence" in given and "canaries" not in given:
        refuse("canary_confidence", "applies to a run with --canaries")
    rr = plan.rr
    if "batch_size" in given and not non_private and (rr is None or rr.params.batch_size):
        refuse("batch_size", "is used by --non-private and by an RR phase whose plan fixes none; this plan "
               + ("fixes the RR batch size" if rr is not None else "has no RR phase"))


def _refuse_rr_checks(given: Mapping[str, Any], plan: Plan, non_private: bool,
                      refuse: Callable[[str, str], Any]) -> None:
    """The RR phase's held-out checks' options, refused where the plan holds no units out of an RR phase."""
    for param in ("rr_select", "rr_average"):
        if param in given and not non_private and (plan.rr is None or plan.rr.params.validation_fraction is None):
            refuse(param, "applies to an RR phase with held-out units; this plan "
                   + ("has no RR phase" if plan.rr is None else "holds none ([rr].validation_fraction = 0)"))


def _int_option(name: str, text: str, limit: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise click.UsageError(f'{name} must be an integer or "auto", got {text!r}') from None
    if not 1 <= value <= limit:
        raise click.UsageError(f"{name} must be between 1 and {limit} (budgetplan's stated limit), got {value}")
    return value


def _fresh_directory(name: str, path: str) -> Path | None:
    """``path`` if it is to be created here (returned, for clean-up), None if it exists empty."""
    from pathlib import Path

    from budgetplan.util.fileio import check_writable

    if not path.strip():
        raise click.UsageError(f"{name} is empty: name the directory to create")
    target = Path(path)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise click.UsageError(f"{name} {path} exists and is not an empty directory")
    check_writable(target)
    if target.exists():
        return None
    while not target.parent.exists():
        target = target.parent
    return target


def _print_record(record: RunRecord, out_dir: str) -> None:
    out = console()
    from budgetplan.record.records import BaselineStats, RRRun

    rows = [["algorithm", record.algorithm], ["rows used", fmt(record.rows_used)],
            ["device", record.device], ["seeds", record.seeds.policy]]
    if record.tuning is not None:
        rows.append(["tuning: selected (noisy max)", f"configuration {record.tuning.selection.selected} of "
                                                     f"{len(record.tuning.runs)}"])
    for ph in record.phases:
        if isinstance(ph, RRRun) and ph.labels_flipped is not None:
            rows.append(["rr: labels flipped", f"{ph.labels_flipped:,} of {ph.labels:,}"])
    ev = record.metrics.get("eval")
    if ev:
        rows += [["eval AUC", fmt(ev["auc"])], ["eval log loss", fmt(ev["log_loss"])],
                 ["calibration mean(p)/mean(y)", fmt(ev["calibration_ratio"])]]
        if "relative_auc_loss" in ev:
            rows.append(["relative AUC loss (%)", fmt(ev["relative_auc_loss"], 4)])
        if ev.get("beats_baseline"):
            warn(f"this run's eval AUC exceeds the baseline's ({fmt(ev['baseline_auc'])}) by more than "
                 f"{fmt(ev['baseline_auc_tolerance'])}, more than noise: the baseline is probably "
                 "undertrained, or not comparable")
    stats = next((s for s in record.private_part.phases if isinstance(s, BaselineStats)), None) \
        if record.private_part is not None else None
    if stats is not None:
        best = "none (diverged)" if stats.best is None else fmt(stats.checked_at[stats.best])
        rows += [["baseline: epochs trained", fmt(stats.checked_at[-1]) if stats.checked_at else "0"],
                 ["baseline: kept epoch", best], ["baseline: stopped by", stats.stopped]]
    # A plan whose N is a DP count keeps its timings private (they grow with the true count).
    timings: Mapping[str, int | float] = (record.timings or (record.private_part.data.timings
                                                             if record.private_part else None) or {})
    if "total_seconds" in timings:
        rows.append(["seconds", fmt(timings["total_seconds"], 3)])
    one_run = record.private_part.one_run if record.private_part is not None else None
    if one_run is not None:
        verdict = ("plan refuted, " if one_run["refutes_plan"] else "plan not refuted, ") if "method" in one_run else ""
        divisor = f"noise / {fmt(one_run['noise_divisor'], 3)}; " if "method" in one_run else ""
        rows.append(["one-run audit: epsilon lower bound",
                     f"{fmt(one_run['epsilon_lower_bound'], 4)} ({verdict}plan {fmt(one_run['planned_epsilon'], 4)}; "
                     f"{divisor}{one_run['correct']:,} of {one_run['guesses']:,} guesses on "
                     f"{one_run['canaries']:,} canaries, confidence {one_run['confidence']:g})"])
    out.print(results_table(f"Run {out_dir}", ["", "value"], rows))


MIN_DEMO_ROWS = 2_000  # below it the held-out fifth may have no conversion at a 4% base rate


@click.command()
@click.option("--rows", type=bounded_int("rows", MAX_SYNTH_ROWS), default=250_000, show_default=True,
              help=f"Synthetic rows, at least {MIN_DEMO_ROWS:,} (a fifth of the users is held out for evaluation).")
@click.option("--users", type=bounded_int("users", MAX_SYNTH_ROWS), default=None, help="Users (default: rows / 5).")
@click.option("--epsilon", type=POSITIVE, default=8.0, show_default=True,
              help="The one budget every arm gets (below 5 the default split is plain DP-SGD: Hybrid = DP-SGD).")
@click.option("--shape", type=click.Choice(SHAPE_NAMES), default="mixed", show_default=True,
              help="The synthetic data (budgetplan data synth --help).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Keep data, plans and runs here.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Synthetic data seed.")
@_THREADS
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def demo(rows: int, users: int | None, epsilon: float, shape: str, out_dir: str | None, seed: int, threads: int | str,
         as_json: bool) -> None:
    """RR, DP-SGD and Hybrid at one budget on synthetic data, against the non-private model.

    Plans the shipped synthetic-hybrid template three ways (RR alone, DP-SGD alone, Hybrid with
    the default split), trains each and the non-private baselines, and prints AUC, relative AUC
    loss, calibration and the split with its reason (about 30 s on 2 idle cores at the defaults).
    """
    from trainers.allocator import tune_allocator
    from trainers.demo import run_demo

    if rows < MIN_DEMO_ROWS:
        raise click.UsageError(f"--rows must be at least {MIN_DEMO_ROWS:,} for the demo, got {rows:,}: its held-out "
                               "fifth needs both classes at the synthetic base rate (4%)")
    users = users or max(1, rows // 5)
    if users > rows:
        raise click.UsageError(f"--users ({users}) must not exceed --rows ({rows}): every user has a row")
    tune_allocator()  # this process is ours: a training step's tensors reuse their memory (trainers.allocator)
    created = _fresh_directory("--out", out_dir) if out_dir is not None else None
    try:
        result = run_demo(rows=rows, users=users, epsilon=epsilon, shape=shape, out_dir=out_dir, seed=seed,
                          progress=not as_json, threads=threads)
    except BaseException:
        if created is not None:  # the directory is ours alone: a failed demo leaves nothing behind
            import shutil

            shutil.rmtree(created, ignore_errors=True)
        raise
    if as_json:
        emit_json(result)
        return
    out = console()

    def phases(r: dict[str, Any]) -> str:
        got = r.get("phases")
        short = {"calibration": "cal"}
        return "-" if not got else " + ".join(f"{short.get(k, k)} {fmt(v, 3)}" for k, v in got.items())

    def heldout(r: dict[str, Any]) -> str:
        return "-" if r.get("rr_heldout_auc") is None else \
            f"{fmt(r['rr_heldout_auc'], 4)} (epoch {fmt(r['rr_kept_epoch'], 3)})"

    table = [[r["name"], phases(r), fmt(r["auc"], 4),
              "-" if r["relative_auc_loss"] is None else fmt(r["relative_auc_loss"], 3),
              fmt(r["calibration_ratio"], 3), heldout(r), fmt(r["seconds"], 3)] for r in result["runs"]]
    out.print(results_table(
        f"budgetplan demo: eps {fmt(result['epsilon'])}, {result['shape']} data, {fmt(result['train_rows'])} training "
        f"rows, {fmt(result['eval_rows'])} held out",
        ["run", "eps by phase", "AUC", "rel. loss %", "calib.", "RR held-out AUC", "s"], table))
    split = result["split"]
    out.print(f"Hybrid's split: {split['rule']} gave alpha = {fmt(split['alpha'], 3)} of the "
              f"{fmt(1 - split['calibration_share'], 3)} of the budget the calibration release leaves: "
              f"{split['reason']}.")
    out.print("calib. = mean(p) / mean(y) (1 is calibrated); rel. AUC loss against the non-private model with all "
              "features. RR protects labels only, so its model uses non-sensitive features alone: the second row is "
              "its ceiling. RR held-out AUC: the RR phase scored on held-out users' randomised labels (debiased, "
              "free), and the epoch it kept.")
    out.print(f"plans, run records and statements: {result['out_dir']}")
