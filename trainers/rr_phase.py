"""The randomized-response phase: randomise each label once, then train on the noisy labels.

Labels are flipped exactly once, before training, with the plan's flip probability per
example (the same for every row, or, under the eps/K_i rule, the one for the row's unit
size K_i after capping); every epoch reuses them, which is post-processing. The model
trained here sees non-sensitive features only (``forward_truncated``): RR protects the
label, not the features. The loss corrects for the flips (the Hybrid paper's unbiased
loss, or the forward-corrected loss).

With the plan's ``validation_fraction`` the rows of a share of the units (``holdout``) are
kept out of this phase's training and score it on their RR labels, debiased
(:mod:`trainers.rr_validation`): the phase stops when their debiased score (the log loss, or
the AUC: ``TrainSettings.rr_select``) no longer improves and keeps its best state, the last
weights or their moving average (``TrainSettings.rr_average``). Their labels are randomised and released with all
the others; only their RR labels are read.
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.intercept import rr_estimate
from trainers import distributed, losses, rr_validation  # looked up at each call: tests swap their functions
from trainers.fit import FitSettings, fit
from trainers.session import NullSession
from trainers.weight_average import WeightAverage

__all__ = ["RRResult", "flip_probabilities", "randomize_labels", "run_rr_phase"]


@dataclass(frozen=True, kw_only=True)
class RRResult:
    """What the RR phase did.

    Attributes:
        labels, labels_flipped: rows randomised and how many labels flipped.
        flip_probability: the one flip probability every row used, or None (eps/K_i).
        flip_probability_mean: the mean over rows (eps/K_i: depends on the unit sizes).
        release_sha256: the digest of the noisy labels (the release), as the ledger records it.
        epoch_loss: training loss per epoch, on the noisy labels.
        debiased_positives: (the debiased count of positives from the noisy labels, its
            variance), post-processing of the release, for the intercept calibration.
        validation_*: with a held-out part: its rows (all ranks'), the epochs done at each
            check, the debiased log loss and AUC there, the index of the check whose state
            was kept (None: no finite score, the last state stayed); ``stopped`` is
            "patience" or "epochs"; ``validation_by`` the score compared ("log_loss" or
            "auc"); ``validation_averaged`` (with a weight average) whether each check's
            better view was the moving average.
        candidates, candidate_log_loss, candidate_auc, chosen: with a held-out part and more
            than one (learning rate, weight decay) pair: the pairs trained, the debiased
            validation log loss and AUC of each one's kept state, and the index of the pair
            kept (the ``validation_*`` fields are its own).
    """

    labels: int
    labels_flipped: int
    flip_probability: float | None
    flip_probability_mean: float
    per_impression_rule: str
    release_sha256: str
    epochs: int
    batch_size: int
    batches: int
    loss: str
    epoch_loss: tuple[float, ...]
    seconds: float
    debiased_positives: tuple[float, float] | None = None
    validation_rows: int | None = None
    validation_checks: tuple[float, ...] | None = None
    validation_log_loss: tuple[float | None, ...] | None = None
    validation_auc: tuple[float | None, ...] | None = None
    validation_kept: int | None = None
    stopped: str | None = None
    validation_by: str | None = None
    validation_averaged: tuple[bool, ...] | None = None
    candidates: tuple[tuple[float, float], ...] | None = None
    candidate_log_loss: tuple[float | None, ...] | None = None
    candidate_auc: tuple[float | None, ...] | None = None
    chosen: int | None = None


def flip_probabilities(plan_phase, unit_counts: np.ndarray | None, n: int) -> np.ndarray:
    """Per-row flip probability from the plan's RR phase parameters.

    Args:
        plan_phase: the plan's RRPhase.
        unit_counts: for each row, how many rows its unit keeps after capping (K_i), or None.
        n: the number of rows.
    """
    par = plan_phase.params
    if par.flip_probability_by_count is None:
        return np.full(n, par.flip_probability, dtype=np.float64)
    if unit_counts is None:
        raise InvalidParameterError("the eps/K_i rule needs unit ids to count each unit's examples")
    table = np.asarray(par.flip_probability_by_count, dtype=np.float64)
    if unit_counts.min() < 1 or unit_counts.max() > table.size:
        raise InvalidParameterError(f"a unit keeps {int(unit_counts.max())} examples, more than the plan's cap "
                                    f"{table.size}")
    return table[unit_counts - 1]


def randomize_labels(labels: np.ndarray, flip_probability: np.ndarray, randomness) -> tuple[np.ndarray, int]:
    """(noisy labels, number flipped): each label flipped once, independently.

    The flip decisions do not depend on the labels, so the count of flips reveals nothing
    about them and can go into the run record.
    """
    labels = np.asarray(labels)
    flips = randomness.bernoulli(flip_probability, labels.size)
    noisy = np.where(flips, 1 - labels, labels).astype(labels.dtype, copy=False)
    return noisy, int(flips.sum())


def _start_at_base_rate(model, targets) -> None:
    """Set the output bias to the logit of the debiased rate of positives among the training rows.

    A fresh model predicts 1/2 for every row; with a few percent positives its first
    hundreds of steps only move the intercept down. Starting there is post-processing of the
    release (the debiased rate of the noisy labels), so it costs nothing.
    """

    noisy, rho = targets[:, 0].double(), targets[:, 1].double()
    rate = float(((noisy - rho) / (1 - 2 * rho)).mean()) if len(noisy) else 0.5
    rate = min(max(rate, 1e-4), 1 - 1e-4)
    with torch.no_grad():
        model.output_bias().fill_(float(np.log(rate / (1 - rate))))


def _kept(stopping, values: list) -> float | None:
    """``values`` (a stopping rule's log losses or AUCs) at the state it kept (None: no check scored)."""
    return None if stopping is None or stopping.best is None else values[stopping.best]


def _best_pair(runs) -> int:
    """The index of the pair whose kept state scored best (the score its checks compared: every pair
    has the same held-out rows, so the same one); the first pair where none scored (the scores are
    pooled over every rank's held-out rows, so every rank picks the same pair)."""
    scored = [(score, -i) for i, run in enumerate(runs)
              if run[2] is not None and (score := run[2].best_score()) is not None]
    return -max(scored)[1] if scored else 0


def _compact(rows: np.ndarray):
    """A rank's row numbers as a slice when they are one contiguous block (what rank 0 is sent)."""
    if rows.size and rows[-1] - rows[0] + 1 == rows.size:
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def _train(model, data, targets, noisy, rho, holdout, pairs, plain: FitSettings, *, loss_fn, shuffle_seed: int,
           patience: int, checks_per_epoch: int, init_bias: bool, progress, collective, average: float | None,
           select: str):
    """Train the truncated model once per (learning rate, L2) pair from the same start and the same
    row order (``shuffle_seed``), keep the pair whose kept state scored best on the held-out rows;
    (its FitSettings, its fit history, the seconds of every pair, the record's validation
    fields). ``average``: epochs of the weight average the checks also score (None: none)."""
    if holdout is not None:
        mask = torch.as_tensor(np.asarray(holdout, dtype=bool), device=targets.device)
        data, targets, held = data.take(~mask), targets[~mask], data.take(mask)
    if init_bias:
        _start_at_base_rate(model, targets)
    start = copy.deepcopy(model.state_dict()) if len(pairs) > 1 else None
    runs = []
    for rate, decay in pairs:
        if start is not None:
            model.load_state_dict(start)
        gen = torch.Generator().manual_seed(shuffle_seed)
        settings = FitSettings(epochs=plain.epochs, batch_size=plain.batch_size, lr=rate, optimizer=plain.optimizer,
                               weight_decay=decay)
        stopping = every = averaged = None
        if holdout is not None:
            train_rows = len(data) if collective is None else collective.total(len(data))
            views: list = [("last", nullcontext)]
            if average is not None:
                averaged = WeightAverage(model, max(1.0, average * math.ceil(train_rows / settings.batch_size)))
                views.append(("average", averaged.swapped))
            stopping = rr_validation.DebiasedStopping(model, held, noisy[holdout], rho[holdout], patience=patience,
                                                      collective=collective, views=views, by=select)
            every = rr_validation.check_every(train_rows, settings.batch_size, checks_per_epoch)
        history = fit(model, data, targets, lambda logits, t: loss_fn(logits, t[:, 0], t[:, 1]), settings,
                      truncated=True, generator=gen, progress=progress, collective=collective, check=stopping,
                      check_every=every, on_step=None if averaged is None else averaged.update)
        if stopping is not None:
            stopping.restore()
        runs.append((settings, history, stopping, copy.deepcopy(model.state_dict()) if start else None))
    chosen = _best_pair(runs)
    settings, history, stopping, state = runs[chosen]
    if state is not None:
        model.load_state_dict(state)
    validation: dict = {}
    if stopping is not None:
        held_rows = int(np.count_nonzero(holdout))
        validation = dict(
            validation_rows=held_rows if collective is None else collective.total(held_rows),
            validation_checks=tuple(stopping.checked_at), validation_log_loss=tuple(stopping.log_loss),
            validation_auc=tuple(stopping.auc), validation_kept=stopping.best,
            stopped="patience" if history["stopped_early"] else "epochs", validation_by=stopping.by,
            validation_averaged=tuple(stopping.averaged) if average is not None else None)
        if len(runs) > 1:  # the held-out units chose the pair
            validation.update(candidates=tuple((float(r), float(d)) for r, d in pairs), chosen=chosen,
                              candidate_log_loss=tuple(_kept(run[2], run[2].log_loss) for run in runs),
                              candidate_auc=tuple(_kept(run[2], run[2].auc) for run in runs))
    return settings, history, sum(run[1]["seconds"] for run in runs), validation


def run_rr_phase(model, data, phase, *, unit_counts, loss: str, lr: float, optimizer: str, batch_size: int,
                 randomness, session=None, progress: str | None = None, collective=None, rows=None,
                 holdout: np.ndarray | None = None, patience: int = 4, checks_per_epoch: int = 4,
                 init_bias: bool = True, weight_decay: float = 0.0,
                 candidates: tuple[tuple[float, float], ...] | None = None, average: float | None = None,
                 select: str = "log_loss") -> RRResult:
    """Randomise the labels once and train the truncated model on them; returns what ran.

    With a ``session`` the noisy labels are a logged, persisted release: a resumed run
    reloads them instead of drawing new ones.

    With a ``collective`` (several processes, ``data`` this rank's share of the rows, whose
    row numbers in the whole data are ``rows``, by default its contiguous block): each rank
    flips its own rows from its own generator, so every label is randomised exactly once
    whatever the sharding; rank 0 gathers the shares into the one release, in data order,
    that its session persists (only rank 0 has a session; a run resumed with another number
    of processes reads the same labels), every rank trains on its share of that release
    (``trainers.fit`` adds the gradients across ranks), and the counts and the debiased
    estimate cover all rows.

    With held-out units (``holdout``): ``average`` (epochs, or None) adds a moving average of
    the weights for the checks to score beside the last weights, and ``select`` ("log_loss"
    or "auc") is the score they compare (``trainers.rr_validation``).
    """

    session = session or NullSession()
    device = data.label.device
    labels = data.label.cpu().numpy().astype(np.int8)
    rho = flip_probabilities(phase, unit_counts, labels.size)
    total = labels.size if collective is None else collective.total(labels.size)
    if collective is not None and rows is None:
        rows = np.arange(*collective.shard(total).indices(total))

    def draw():
        noisy, flipped = randomize_labels(labels, rho, randomness)
        noisy = noisy.astype(np.int8)
        if collective is None:
            return noisy, {"labels_flipped": flipped, "labels": int(labels.size)}
        shares = collective.gather_object((_compact(rows), noisy, flipped))
        if shares is None:
            return None
        release = np.full(total, -1, dtype=np.int8)
        for where, part, _ in shares:
            release[where] = part
        if (release < 0).any():  # the shares must cover every row: a hole would be released as a label
            raise RuntimeError("the ranks' shares of the rows do not cover every row")
        return release, {"labels_flipped": sum(s[2] for s in shares), "labels": sum(s[1].size for s in shares)}

    noisy, note = distributed.release_once(collective, session, "rr", draw)
    if noisy.size != total:
        raise InvalidParameterError(f"the run's saved RR labels have {noisy.size} rows, the data {total}")
    if collective is not None:
        noisy = noisy[rows]
    flipped = int(note["labels_flipped"])
    targets = torch.stack([torch.as_tensor(noisy, dtype=torch.float32, device=device),
                           torch.as_tensor(rho, dtype=torch.float32, device=device)], 1)
    loss_fn = losses.rr_unbiased_loss if loss == "unbiased" else losses.rr_forward_loss
    # several pairs only where held-out units can choose among them; else (lr, weight_decay)
    pairs = tuple(candidates) if candidates and holdout is not None else ((lr, weight_decay),)
    plain = FitSettings(epochs=phase.params.epochs, batch_size=phase.params.batch_size or batch_size, lr=lr,
                        optimizer=optimizer)
    settings, history, seconds, validation = _train(
        model, data, targets, noisy, rho, holdout, pairs, plain, loss_fn=loss_fn, shuffle_seed=randomness.torch_seed(),
        patience=patience, checks_per_epoch=checks_per_epoch, init_bias=init_bias, progress=progress,
        collective=collective, average=average, select=select)
    debiased, rho_sum = rr_estimate(noisy, rho), float(rho.sum())
    if collective is not None:
        pooled = torch.tensor([*debiased, rho_sum], dtype=torch.float64)
        collective.sum_([pooled])
        debiased, rho_sum = (float(pooled[0]), float(pooled[1])), float(pooled[2])
    return RRResult(
        labels=int(total), labels_flipped=flipped,
        flip_probability=phase.params.flip_probability if phase.params.flip_probability_by_count is None else None,
        flip_probability_mean=rho_sum / total, per_impression_rule=phase.params.per_impression_rule,
        release_sha256=note["sha256"], epochs=settings.epochs,
        batch_size=settings.batch_size, batches=history["batches"], loss=loss,
        epoch_loss=tuple(history["epoch_loss"]), seconds=seconds,
        debiased_positives=debiased, **validation)
