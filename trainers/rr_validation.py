"""Free early stopping for the RR phase: held-out units scored on their own RR labels, debiased.

Every training label of an RR or Hybrid run is released once by randomized response, and the
truncated model reads only non-sensitive features, which the adjacency leaves public. So a
part of the units can be kept out of the RR phase's training and used to score it, from
their RR labels alone, at no privacy cost: everything here is a function of the release and
of public features (post-processing). No true label of a held-out row is ever read (a test
poisons them). The scores are debiased (:mod:`trainers.debiased`), so they estimate the
true-label log loss and AUC of the truncated model.

The decisions they drive: when the RR phase stops (after ``patience`` checks without a better
score, or at the plan's ``epochs``), which of its states it keeps (the best-scoring one) and,
with a weight average (``TrainSettings.rr_average``), whether the kept state is the last
weights or their moving average (each check scores both and keeps the better). Scoring starts
at the end of the first epoch: within it the differences between states are smaller than the
scores' noise on small data (6,000 rows at eps 2 kept the state after a third of an epoch,
0.009 AUC below the end of it), and on large data the first epoch's end is where CTR models on
rare categorical values do best.

The score is the debiased log loss (``by="log_loss"``) or the debiased AUC (``by="auc"``,
higher is better). The RR phase hands on a ranking: its calibration is set afterwards (the
intercept from the debiased count of positives, or the calibration release), and in every
1M-row RR run where the two scores kept different states, the state with the higher held-out
AUC had the higher test AUC (CHANGELOG). The debiased AUC is a ratio of two estimates and is
only usable where its denominator B~ (an estimate of n1 n0 from the labels alone) is positive
and the held-out rows hold enough positives once the flips are discounted: at least
``AUC_MIN_POSITIVES`` of sum u (1 - 2 rho)^2 (u the debiased label). Below that the log loss
decides. Both conditions read the RR labels only, so the score is fixed for the whole phase
and every rank takes the same one.

What the held-out units cannot decide is anything about a model that reads sensitive
features (Hybrid's DP-SGD phase): its predictions on a held-out row depend on that row's
sensitive features, which semi-sensitive DP protects, so choosing among DP-SGD checkpoints by
them would spend privacy the plan does not account. Those choices are made by measurement
instead (CHANGELOG).
"""

from __future__ import annotations

import copy
import math
from contextlib import nullcontext

import numpy as np
import torch

from trainers.debiased import debiased_auc
from trainers.fit import predict
from trainers.settings import RR_SELECT

__all__ = ["DebiasedStopping", "check_every", "FIRST_CHECK", "AUC_MIN_POSITIVES"]

FIRST_CHECK = 1.0  # epochs trained before the held-out units are first scored
# The least flip-discounted count of held-out positives, sum u (1 - 2 rho)^2, at which the
# debiased AUC decides (module docstring). Chosen between two groups of 200k-row runs: at eps 1
# those with fewer held-out positives than this did worse by AUC than by the log loss, those
# with more did better (CHANGELOG).
AUC_MIN_POSITIVES = 350.0


def check_every(rows: int, batch_size: int, checks_per_epoch: int) -> int:
    """Batches between validation checks: ``checks_per_epoch`` per epoch of ``rows`` rows (at least 1 batch)."""
    batches = max(1, math.ceil(rows / batch_size))
    return max(1, math.ceil(batches / checks_per_epoch))


class DebiasedStopping:
    """The ``check`` of ``trainers.fit.fit``: score, keep the best state, say when to stop.

    Args:
        model: the model being trained (its truncated forward is scored).
        validation: ``EncodedData`` of the held-out rows (this rank's, with several processes).
        noisy, rho: their RR labels and flip probabilities (numpy arrays).
        patience: checks without a better score before stopping.
        collective: with several processes, every rank holds its share of the held-out rows;
            the loss and the label sums are added over ranks, the AUC computed on rank 0 from
            the gathered scores and broadcast, so every rank takes the same decision.
        views: ``(name, context)`` pairs: each check scores the model inside each
            ``context()`` (one that swaps the averaged weights in, say) and keeps the better;
            by default the model as it is (``"last"``). A view named ``"average"`` is recorded
            as such in ``averaged``.
        by: ``"log_loss"`` or ``"auc"`` (module docstring); ``self.by`` is the one used.
    """

    def __init__(self, model, validation, noisy: np.ndarray, rho: np.ndarray, *, patience: int, collective=None,
                 views=None, by: str = "log_loss"):
        if by not in RR_SELECT:
            raise ValueError(f"by must be one of {RR_SELECT}, got {by!r}")
        self.model, self.validation, self.patience, self.collective = model, validation, int(patience), collective
        self.views = tuple(views) if views else (("last", nullcontext),)
        self.noisy = np.asarray(noisy, dtype=np.float64)
        self.rho = np.asarray(rho, dtype=np.float64)
        self.u = (self.noisy - self.rho) / (1.0 - 2.0 * self.rho)
        sums = [float(self.u.sum()), float((1.0 - self.u).sum()), float(np.dot(self.u, 1.0 - self.u)),
                float(np.dot(self.u, (1.0 - 2.0 * self.rho) ** 2))]
        if collective is not None:
            t = torch.tensor(sums, dtype=torch.float64)
            collective.sum_([t])
            sums = t.tolist()
        self.positives = sums[3]  # the held-out positives, discounted by the flips
        usable = sums[0] * sums[1] - sums[2] > 0 and self.positives >= AUC_MIN_POSITIVES  # B~ > 0, enough positives
        self.by = "auc" if by == "auc" and usable else "log_loss"
        self.checked_at: list[float] = []
        self.log_loss: list[float | None] = []
        self.auc: list[float | None] = []
        self.averaged: list[bool] = []
        self.best: int | None = None
        self._best_value = -math.inf
        self._state = None

    def _scores(self) -> tuple[float | None, float | None]:
        p = predict(self.model, self.validation, truncated=True) if len(self.validation) else np.zeros(0)
        p = np.clip(p.astype(np.float64), 1e-7, 1 - 1e-7)
        finite = bool(np.all(np.isfinite(p)))
        part = -(self.u * np.log(p) + (1.0 - self.u) * np.log1p(-p)) if finite else np.zeros(0)
        pooled = [float(part.sum()), float(self.u.size), 0.0 if finite else 1.0]
        scores = (p, self.noisy, self.rho)
        if self.collective is not None:
            t = torch.tensor(pooled, dtype=torch.float64)
            self.collective.sum_([t])
            pooled = t.tolist()
            shares = self.collective.gather_object(scores)
            scores = None if shares is None else tuple(np.concatenate([s[i] for s in shares]) for i in range(3))
        area = None
        if not pooled[2] and scores is not None and scores[0].size:
            area = debiased_auc(*scores)
        if self.collective is not None and self.by == "auc":
            area = self.collective.broadcast_object(area)  # every rank decides on rank 0's AUC
        if pooled[2] or not pooled[1]:  # a rank's predictions are not finite (the model diverged)
            return None, None
        return pooled[0] / pooled[1], area

    def _value(self, loss: float | None, area: float | None) -> float:
        """The score to maximise: the AUC, or minus the log loss; -inf where there is none."""
        value = area if self.by == "auc" else (None if loss is None else -loss)
        return -math.inf if value is None else value

    def __call__(self, epochs_done: float, train_loss: float) -> bool:
        if epochs_done < FIRST_CHECK - 1e-9:
            return False  # not scored before the end of the first epoch (module docstring)
        best_view, best = 0, (-math.inf, None, None)
        for i, (_, context) in enumerate(self.views):
            with context():
                loss, area = self._scores()
            value = self._value(loss, area)
            if i == 0 or value > best[0]:
                best_view, best = i, (value, loss, area)
        value, loss, area = best
        self.checked_at.append(float(epochs_done))
        self.log_loss.append(loss)
        self.auc.append(area)
        self.averaged.append(self.views[best_view][0] == "average")
        index = len(self.checked_at) - 1
        if value > self._best_value:
            self._best_value, self.best = value, index
            with self.views[best_view][1]():
                self._state = copy.deepcopy(self.model.state_dict())
        return index - (self.best if self.best is not None else -1) >= self.patience

    def best_score(self) -> float | None:
        """The kept state's score (``by``: its AUC, or minus its log loss); None where no check scored."""
        return None if self.best is None else self._best_value

    def restore(self) -> None:
        """Leave the model in its best state (unchanged when no check had a finite score: it diverged)."""
        if self._state is not None:
            self.model.load_state_dict(self._state)
