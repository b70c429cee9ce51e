"""Execute a plan with a grid of configurations: train each, score each, keep the noisy-max pick.

The plan (``budgetplan.planning.grid``) accounts n runs and one selection; this runs exactly those:

1. the units are divided once into a training part and a validation part of the plan's
   ``validation_fraction`` of the units, each unit by a coin flip from the run's
   randomness (never from the data; the evaluation file is never used);
2. every configuration, in grid order, trains a fresh model on the training part with its
   phases exactly as planned (q and the division by q N are the plan's, whatever the
   part's size) and its DP-SGD learning rate; the ledger logs its phases as ``c<i>/rr``
   (one release) and ``c<i>/dpsgd`` (an intent per noisy step), after a
   ``configuration`` line naming it;
3. each model is scored on the validation part by u = - sum of log losses with
   predictions clipped to [p, 1 - p], and the configuration maximising u + Gumbel(2 Delta /
   eps_sel) is selected: the ledger logs the selection's intent and its one release (the
   index), and only the selected model is kept.

The public record lists every configuration's phase entries, the training part's row count
(its RR entries and batch sizes show it anyway) and the selected index; the scores, the
noise and the validation metrics are statistics of private labels and go to the private
record. A tuned run cannot be resumed: an interrupted one has spent what its
ledger shows, and a new run is a new plan's budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.planning import grid
from budgetplan.record.ledger import RELEASE_FILES
from budgetplan.record.records import Selection, TunedRun, TuningRecord
from budgetplan.util.typed import to_json_object
from trainers.dpsgd import DPSGDSettings
from trainers.executors import PhaseContext, check_executable, run_phases
from trainers.fit import predict
from trainers.inputs import device_name, new_model, prepare_data, prepare_eval, resolve_device
from trainers.metrics import relative_auc_loss
from trainers.outputs import evaluate, fingerprint_keys, write_run
from trainers.randomness import Randomness
from trainers.record import build_record
from trainers.session import Checkpoint, NullSession, Session

__all__ = ["execute_grid", "gumbel", "noisy_max", "split_units", "clipped_log_loss_sum"]


class _ConfigSession:
    """The run's session as one configuration's phases see it: their ledger lines carry its index."""

    def __init__(self, session, index: int):
        self.session, self.index = session, index

    def release(self, phase: str, make):
        """A one-shot release of this configuration (any kind in ``RELEASE_FILES``), as ``c<i>/<phase>``."""
        if not hasattr(self.session, "ledger"):  # no run directory: nothing durable
            return self.session.release(phase, make)
        return self.session._release(f"c{self.index}/{phase}", f"c{self.index}_{RELEASE_FILES[phase]}", make)

    def released(self, phase: str) -> bool:
        return bool(self.session.released(f"c{self.index}/{phase}"))

    def intend(self, step: int, batch_size: int | None = None) -> None:
        if hasattr(self.session, "ledger"):
            self.session.ledger.intend(step, phase=f"c{self.index}/dpsgd", batch_size=batch_size)

    # A tuned run is never resumed: no checkpoint, no steps taken before, and its entries count
    # this session's steps (the ledger's lines are per configuration).
    checkpoint_every = 0

    def dpsgd_steps_taken(self) -> int:
        return 0

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        pass

    def ledger_view(self):
        return None

    sizes_view = ledger_view


def split_units(units: np.ndarray, fraction: float, generator: np.random.Generator) -> np.ndarray:
    """A boolean mask of the rows in the validation part: each unit in it with probability ``fraction``.

    Args:
        units: dense unit ids per row (0..U-1), or each row its own unit.
    """
    coins = generator.random(int(units.max()) + 1 if units.size else 0) < fraction
    return coins[units]


def clipped_log_loss_sum(y: np.ndarray, p: np.ndarray, clip: float) -> float:
    """sum_i log loss(y_i, p_i) with p clipped to [clip, 1 - clip]: each term at most log(1 / clip)."""
    p = np.clip(np.asarray(p, dtype=np.float64), clip, 1.0 - clip)
    y = np.asarray(y, dtype=np.float64)
    return float(-np.sum(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def gumbel(n: int, scale: float, randomness) -> list[float]:
    """n draws of Gumbel(0, scale) = -scale log(-log U), U uniform from the run's randomness (the OS CSPRNG
    by default): U = (k + 0.5) / 2^53 for a uniform 53-bit k, never 0 or 1."""
    k = randomness.uniform_u64(n) >> np.uint64(11)
    u = (k.astype(np.float64) + 0.5) / 2.0**53
    return [float(-scale * math.log(-math.log(x))) for x in u]


def noisy_max(scores, noise) -> int:
    """argmax_i (scores_i + noise_i): with Gumbel(2 Delta / eps) noise, the exponential mechanism's choice,
    P(i) proportional to exp(eps scores_i / (2 Delta))."""
    return int(np.argmax([s + g for s, g in zip(scores, noise)]))


def execute_grid(plan, data_path, options, *, settings, out):
    """Run every configuration of ``plan``'s grid and keep the selected model; returns the run record.

    ``options`` is ``execute_plan``'s ``RunOptions`` (read: ``eval_path``, ``dpsgd_settings``,
    ``seed``, ``progress``, ``fingerprint_key``, ``baseline_auc``, ``resume``); ``settings`` are
    its resolved ``TrainSettings`` and ``out`` its checked run directory. Each configuration's
    phases run through the same executors as ``execute_plan``'s (``trainers.executors``).
    """
    if options.resume:
        raise UnsupportedError("a tuned run cannot be resumed: its ledger shows what it spent; start a new run under "
                               "a new plan")
    runs = grid.runs_of(plan)
    for c, phases in runs:
        check_executable(phases, f"configuration {c.label}'s phases", torch_model_only=True)
    sel = plan.tuning.noisy_max
    spec = plan.scenario.features
    rnd = Randomness(options.seed)
    device = resolve_device(settings.device)
    t0 = time.perf_counter()
    key, new_key = fingerprint_keys(options.fingerprint_key)
    prep = prepare_data(data_path, spec, settings, device, cap=plan.unit.cap, capping=plan.unit.capping,
                        expected_rows=plan.dataset_size, randomness=rnd, key=key)
    eval_prep = prepare_eval(options.eval_path, spec, settings, device, prep.vocabulary)
    data = prep.data
    # The privacy unit: a capped unit's rows stay together; otherwise each row is its own unit.
    units = data.unit.cpu().numpy() if plan.unit.cap > 1 else np.arange(len(data))
    held = split_units(units, sel.validation_fraction, rnd.generator())
    train_idx = torch.as_tensor(np.flatnonzero(~held), device=data.label.device)
    val_idx = torch.as_tensor(np.flatnonzero(held), device=data.label.device)
    if len(train_idx) == 0 or len(val_idx) == 0:
        raise InvalidParameterError(f"the data's {len(np.unique(units))} units leave the "
                                    f"{'training' if len(train_idx) == 0 else 'validation'} part empty at "
                                    f"validation_fraction {sel.validation_fraction:g}")
    part = _Part(data.take(train_idx), data.take(val_idx), prep.unit_counts[~held] if prep.unit_counts is not None
                 else None)
    session = Session(out, plan, randomness=rnd, rows=prep.data_info["rows_used"]) if out else NullSession()
    base = options.dpsgd_settings or DPSGDSettings.for_device(device)
    timings = dict(prep.timings)
    try:
        # The noise is drawn before any model is trained (it depends on nothing), so only the model
        # with the best noisy score so far need be held: the argmax is the same as after the fact.
        noise = _intend_selection(session, len(runs), sel.gumbel_scale, rnd)
        public_runs, private_runs, best = _train_all(runs, noise, part, prep, session, settings, base, rnd, device,
                                                     sel.prediction_clip, options.progress)
        _, selected, final, entries = best
        assert selected == noisy_max([r["score"] for r in private_runs], noise)
        _release_selection(session, selected, len(runs))
        y_val = part.validation.label
        metrics: dict = {"tuning": {"validation_rows": len(y_val), "training_rows": len(train_idx),
                                    "runs": private_runs, "selected": selected}}
        if eval_prep is not None:
            metrics["eval"], timings["eval_seconds"] = evaluate(final.model, eval_prep, options.eval_path,
                                                                truncated=final.truncated)
            if options.baseline_auc is not None:
                metrics["eval"]["baseline_auc"] = options.baseline_auc
                auc = metrics["eval"]["auc"]
                metrics["eval"]["relative_auc_loss"] = (None if auc is None
                                                        else relative_auc_loss(auc, options.baseline_auc))
        timings["total_seconds"] = time.perf_counter() - t0
        record = build_record(
            plan=plan, entries=entries, data=prep.data_info, metrics=metrics, encoding=prep.encoding,
            seeds=rnd.record(), model=final.describe(), training={**settings.to_dict(), "dpsgd": base.to_dict()},
            ledger=session.ledger_view(), timings=timings, device=device_name(device),
            notes=(f"tuned: {len(runs)} configurations trained on the training part, configuration {selected} "
                   "selected by report-noisy-max on the validation part",))
        record = replace(record, tuning=TuningRecord(
            configurations=plan.tuning.configurations, runs=tuple(public_runs), training_rows=len(train_idx),
            selection=Selection(phase="selection", mechanism=sel.mechanism, noise=sel.noise,
                                epsilon=sel.epsilon, gumbel_scale=sel.gumbel_scale, candidates=len(runs),
                                selected=selected)))
        return write_run(record, final.state(), out, prep.vocabulary, new_key=new_key if out else None)
    finally:
        session.close()


class _Part:
    """The training part (with its rows' unit counts) and the validation part of a tuned run's data."""

    def __init__(self, train, validation, train_counts):
        self.train, self.validation, self.train_counts = train, validation, train_counts


def _train_all(runs, noise, part: _Part, prep, session, settings, base, rnd, device, clip: float, progress: bool):
    """Train and score every configuration in grid order; (public runs, private runs, the best noisy score's
    (noisy score, index, kept model, entries))."""
    y_val = part.validation.label.cpu().numpy()
    public_runs, private_runs = [], []
    best: tuple | None = None
    for c, phases in runs:
        if hasattr(session, "ledger"):
            session.ledger.note("configuration", index=c.index, phases=[p.name for p in phases])
        model = new_model(prep, settings, rnd.torch_seed()).to(device)
        sgd_settings = base if c.dpsgd_learning_rate is None else replace(base, lr=c.dpsgd_learning_rate)
        # The training part is not N rows: every row of it is sampled at the plan's q and the sum
        # divided by the plan's q N, as for a DP-count N (the accounting never assumed N).
        context = PhaseContext(phases=phases, prep=prep, data=part.train, unit_counts=part.train_counts,
                               randomness=rnd, session=_ConfigSession(session, c.index), settings=settings,
                               device=device, model=model, dpsgd_settings=sgd_settings,
                               progress=f"#{c.index} " if progress else None, size_private=True)
        entries = run_phases(context)
        final = context.final
        assert final is not None  # a configuration has a training phase
        loss_sum = clipped_log_loss_sum(y_val, predict(model, part.validation, truncated=final.truncated), clip)
        public_runs.append(TunedRun(index=c.index, phases=tuple(e for e, _ in entries),
                                    dpsgd_learning_rate=sgd_settings.lr if final.dpsgd_settings is not None else None))
        private_runs.append({"index": c.index, "validation_log_loss_sum": loss_sum,
                             "validation_log_loss": loss_sum / len(y_val), "score": -loss_sum,
                             "gumbel_noise": noise[c.index], "noisy_score": -loss_sum + noise[c.index],
                             "phases": [{"name": st.name, **_stats(st)} for _, st in entries]})
        if best is None or -loss_sum + noise[c.index] > best[0]:
            best = (-loss_sum + noise[c.index], c.index, final, entries)
        del model, context
    assert best is not None  # a grid has at least two configurations
    return public_runs, private_runs, best


def _stats(stats) -> dict:
    return to_json_object(stats)


def _intend_selection(session, n: int, scale: float, randomness) -> list[float]:
    """The selection's intent in the ledger, then its noise (one Gumbel draw per configuration)."""
    if hasattr(session, "ledger"):
        if session.ledger.count("selection"):
            raise InvalidParameterError("the ledger already holds a selection: a second one is not planned")
        session.ledger.intend(0, phase="selection")
    return gumbel(n, scale, randomness)


def _release_selection(session, selected: int, candidates: int) -> None:
    """The selection's one release, the index, logged and synced."""
    if hasattr(session, "ledger"):
        session.ledger.note("released", phase="selection", selected=selected, candidates=candidates)
        session.ledger.sync()
