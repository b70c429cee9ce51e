"""Free early stopping for the RR phase: held-out units scored on their own RR labels, debiased.

Every training label of an RR or Hybrid run is released once by randomized response, and the
truncated model reads only non-sensitive features, which the adjacency leaves public. So a
part of the units can be kept out of the RR phase's training and used to score it, from
their RR labels alone, at no privacy cost: everything here is a function of the release and
of public features (post-processing). No true label of a held-out row is ever read (a test
poisons them). The scores are debiased (:mod:`trainers.debiased`), so they estimate the
true-label log loss and AUC of the truncated model.

The decisions they drive: when the RR phase stops (after ``patience`` checks without a lower
debiased validation log loss, or at the plan's ``epochs``), and which of its states it keeps
(the one with the lowest debiased log loss). Scoring starts at the end of the first epoch:
within it the differences between states are smaller than the scores' noise on small data
(6,000 rows at eps 2 kept the state after a third of an epoch, 0.009 AUC below the end of
it), and on large data the first epoch's end is where CTR models on rare categorical
values do best. Log loss rather than AUC, as for the baseline:
a proper scoring rule, smooth, and what the forward-corrected loss trains.

What the held-out units cannot decide is anything about a model that reads sensitive
features (Hybrid's DP-SGD phase): its predictions on a held-out row depend on that row's
sensitive features, which semi-sensitive DP protects, so choosing among DP-SGD checkpoints by
them would spend privacy the plan does not account. Those choices are made by measurement
instead (CHANGELOG).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from trainers.debiased import debiased_auc
from trainers.fit import predict

__all__ = ["DebiasedStopping", "check_every", "FIRST_CHECK"]

FIRST_CHECK = 1.0  # epochs trained before the held-out units are first scored


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
        patience: checks without a lower debiased log loss before stopping.
        collective: with several processes, every rank holds its share of the held-out rows;
            the loss is summed over ranks (so every rank takes the same decision) and the
            AUC computed on rank 0 from the gathered scores.
    """

    def __init__(self, model, validation, noisy: np.ndarray, rho: np.ndarray, *, patience: int, collective=None):
        self.model, self.validation, self.patience, self.collective = model, validation, int(patience), collective
        self.noisy = np.asarray(noisy, dtype=np.float64)
        self.rho = np.asarray(rho, dtype=np.float64)
        self.u = (self.noisy - self.rho) / (1.0 - 2.0 * self.rho)
        self.checked_at: list[float] = []
        self.log_loss: list[float | None] = []
        self.auc: list[float | None] = []
        self.best: int | None = None
        self._best_loss = math.inf
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
        if pooled[2] or not pooled[1]:  # a rank's predictions are not finite (the model diverged)
            return None, None
        area = None
        if scores is not None and scores[0].size:
            area = debiased_auc(*scores)
        return pooled[0] / pooled[1], area

    def __call__(self, epochs_done: float, train_loss: float) -> bool:
        if epochs_done < FIRST_CHECK - 1e-9:
            return False  # not scored before the end of the first epoch (module docstring)
        loss, area = self._scores()
        self.checked_at.append(float(epochs_done))
        self.log_loss.append(loss)
        self.auc.append(area)
        index = len(self.checked_at) - 1
        if loss is not None and loss < self._best_loss:
            self._best_loss, self.best = loss, index
            self._state = copy.deepcopy(self.model.state_dict())
        return index - (self.best if self.best is not None else -1) >= self.patience

    def restore(self) -> None:
        """Leave the model in its best state (unchanged when no check had a finite loss: it diverged)."""
        if self._state is not None:
            self.model.load_state_dict(self._state)
