"""Minibatch training where no privacy is spent per step: the RR phase and the baseline.

Training on randomized-response labels is post-processing (the labels were randomised
once), and the non-private baseline spends nothing by definition, so any batching works
here: shuffled minibatches drawn from a seeded torch generator. DP-SGD, whose sampling is
part of its guarantee, has its own engine.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from trainers.progress import bar

__all__ = ["FitSettings", "fit", "predict", "model_logits"]


class FitSettings:
    """Optimisation settings (never privacy): epochs, batch size, optimiser, learning rate."""

    def __init__(self, *, epochs: int, batch_size: int, lr: float = 1e-3, optimizer: str = "adam",
                 weight_decay: float = 0.0):
        if optimizer not in ("adam", "sgd", "adagrad"):
            raise ValueError(f"optimizer must be adam, sgd or adagrad, got {optimizer!r}")
        self.epochs, self.batch_size, self.lr = int(epochs), int(batch_size), float(lr)
        self.optimizer, self.weight_decay = optimizer, float(weight_decay)

    def to_dict(self) -> dict:
        return {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "optimizer": self.optimizer,
                "weight_decay": self.weight_decay}


def _optimizer(params, s: FitSettings):
    if s.optimizer == "adam":
        return torch.optim.Adam(params, lr=s.lr, weight_decay=s.weight_decay)
    if s.optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=s.lr, weight_decay=s.weight_decay)
    return torch.optim.SGD(params, lr=s.lr, momentum=0.9, weight_decay=s.weight_decay)


def model_logits(model, data, idx, truncated: bool):
    """The logits of ``model`` on rows ``idx`` of ``data``; ``truncated``: its non-sensitive features alone."""
    if truncated:
        return model.forward_truncated(data.ns_cat[idx], data.ns_num[idx])
    return model(data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx])


def fit(model, data, targets: torch.Tensor, loss_fn, settings: FitSettings, *, truncated: bool,
        generator: torch.Generator, progress: str | None = None, check=None, check_every: int | None = None,
        collective=None, on_step=None) -> dict:
    """Train ``model`` on (data, targets) with ``loss_fn(logits, targets)``; returns a history.

    Args:
        truncated: train the truncated model (non-sensitive features only).
        progress: a label to show a rich progress bar on stderr, or None.
        check: called as ``check(epochs_done, train_loss)`` at the end of every epoch, or
            every ``check_every`` batches (and at the end of the last epoch); ``epochs_done``
            counts batches as fractions of an epoch, ``train_loss`` is the mean loss since the
            previous call. Training stops when it returns True: early stopping.
        collective: this rank's ``trainers.distributed.Collective`` when several processes
            train together, each on its shard of the rows (``data``, ``targets``): every
            epoch has the batches one process would have over all the rows, each rank
            contributing an equal share of its shuffled shard to each, and the gradients
            are added across ranks weighted by rows, so every step is the mean over the
            global batch and the replicas stay identical (rank 0's parameters are broadcast
            first). The loss history is over all ranks. A ``check`` is called on every rank
            at the same batches and must return the same decision on each (it must pool
            what it scores across ranks, as ``trainers.rr_validation`` does).
        on_step: called with no arguments after every optimiser step (a weight average's
            ``update``), before that batch's ``check``.

    Returns:
        ``{"epoch_loss": mean loss per epoch (the last one over the batches it ran),
        "batches", "seconds", "stopped_early"}``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(params, settings)
    n = len(data)
    batches = math.ceil(n / settings.batch_size)
    shares = None
    if collective is not None:
        collective.broadcast_(model)
        shards = [r[0] for r in collective.gather([n])]
        batches = max(1, math.ceil(sum(shards) / settings.batch_size))
        # Batch b holds the b-th of `batches` near-equal parts of each rank's shuffled shard
        # (torch.tensor_split's sizes); its global size weighs this rank's mean loss.
        shares = [sum(m // batches + (b < m % batches) for m in shards) for b in range(batches)]
    history = {"epoch_loss": [], "seconds": 0.0, "batches": 0, "stopped_early": False}
    pbar = bar(progress, settings.epochs * batches)
    t0 = time.perf_counter()
    model.train()
    since_check, rows_since_check = 0.0, 0
    try:
        for epoch in range(settings.epochs):
            order = torch.randperm(n, generator=generator, device="cpu").to(data.label.device)
            total, rows = 0.0, 0
            parts = torch.tensor_split(order, batches) if shares is not None else None
            for b in range(batches):
                if parts is None:
                    idx = order[b * settings.batch_size:(b + 1) * settings.batch_size]
                    loss = loss_fn(model_logits(model, data, idx, truncated), targets[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                else:
                    idx = parts[b]
                    loss = _shared_backward(model, data, targets, loss_fn, idx, shares[b], opt, truncated, collective)
                opt.step()
                if on_step is not None:
                    on_step()
                batch_loss = float(loss.detach()) * idx.numel()
                total, rows = total + batch_loss, rows + idx.numel()
                since_check, rows_since_check = since_check + batch_loss, rows_since_check + idx.numel()
                history["batches"] += 1
                if pbar is not None:
                    pbar[0].advance(pbar[1])
                due = b == batches - 1 if check_every is None else (
                    history["batches"] % check_every == 0 or (b == batches - 1 and epoch == settings.epochs - 1))
                if check is not None and due:
                    stop = check(epoch + (b + 1) / batches, since_check / rows_since_check)
                    model.train()  # the check may have evaluated the model
                    since_check, rows_since_check = 0.0, 0
                    if stop:
                        history["stopped_early"] = True
                        break
            if collective is not None:
                pooled = torch.tensor([total, float(rows)], dtype=torch.float64)
                collective.sum_([pooled])
                total, rows = float(pooled[0]), int(pooled[1])
            history["epoch_loss"].append(total / rows)
            if history["stopped_early"]:
                break
    finally:
        if pbar is not None:
            pbar[0].stop()
    history["seconds"] = time.perf_counter() - t0
    return history


def _shared_backward(model, data, targets, loss_fn, idx, share: int, opt, truncated: bool, collective):
    """This rank's part of one global batch: its mean loss weighed by its rows, gradients added over ranks.

    Returns the local mean loss (for the history). A rank with no rows in this batch takes
    one row at weight 0, so that every rank's gradients exist for the same parameters.
    """
    rows = idx.numel()
    pick = idx if rows else torch.zeros(1, dtype=idx.dtype, device=idx.device)
    loss = loss_fn(model_logits(model, data, pick, truncated), targets[pick])
    opt.zero_grad(set_to_none=True)
    (loss * (rows / share)).backward()
    collective.sum_([p.grad for p in model.parameters() if p.grad is not None])
    return loss if rows else loss.detach() * 0.0


@torch.no_grad()
def predict(model, data, *, truncated: bool, batch_size: int = 65536) -> np.ndarray:
    """Predicted probabilities for every row."""
    model.eval()
    out = []
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(len(data), start + batch_size), device=data.label.device)
        out.append(torch.sigmoid(model_logits(model, data, idx, truncated)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


