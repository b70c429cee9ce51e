"""WALR's executor: one Gaussian release of sum y_i w_i x_i, then a logistic regression fitted on it.

WALR fits its own model (``trainers.walr``, or ``trainers.walr_onehot`` for the one-hot
encoding): no torch model is built for it, and what the run keeps is the fitted weights
(``FittedWALR``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from budgetplan.plan.phases import WALRPhase
from budgetplan.record.parts import ModelInfo, json_table
from trainers import distributed, walr, walr_onehot  # looked up at each call: tests swap them
from trainers.inputs import check_walr_columns
from trainers.metrics import evaluate_model
from trainers.phases.registry import PhaseContext, register_executor
from trainers.record import walr_entry
from trainers.settings import WALRSettings

__all__ = ["execute_walr", "FittedWALR"]


@dataclass
class FittedWALR:
    """What a WALR run keeps: the fitted weights, scored on held-out rows by ``scores(eval_prep)``."""

    weights: dict
    config: dict
    settings: dict
    scores: Callable
    vocabulary = None
    compares_baseline = False
    reports_sizes = False

    def state(self) -> dict:
        return self.weights

    def describe(self) -> ModelInfo:
        return ModelInfo(kind="logistic-regression", config=json_table("model.config", self.config), final="walr")

    def training(self) -> dict:
        return {"walr": self.settings}

    def evaluate(self, eval_prep, eval_path) -> tuple[dict, float]:
        t0 = time.perf_counter()
        metrics = evaluate_model(eval_prep.data.label.cpu().numpy(), self.scores(eval_prep).cpu().numpy())
        metrics["rows"] = len(eval_prep.data)
        return metrics, eval_prep.timings["eval_prepare_seconds"] + time.perf_counter() - t0


def _weights(context: PhaseContext):
    if context.spec.weight is None:
        return None
    column = context.prep.table.column(context.spec.weight).to_numpy(zero_copy_only=False)
    return torch.as_tensor(column, dtype=torch.float64, device=context.device)


def _check(phase: WALRPhase, context: PhaseContext) -> None:
    if phase.params.encoding is None:
        check_walr_columns(context.spec)


@register_executor(WALRPhase, follows=((),), torch_model=False, check=_check)
def execute_walr(phase: WALRPhase, context: PhaseContext) -> list:
    c = context
    fit = _numeric if phase.params.encoding is None else _one_hot
    res, c.final = fit(phase.params, c, _weights(c))
    c.timings["walr_fit_seconds"] = res.fit_seconds
    return [walr_entry(res, release_sha256=res.release_sha256)]


def _numeric(par, c: PhaseContext, weights):
    """WALR on the numeric columns as they are (``trainers.walr``)."""
    ws = c.walr_settings or WALRSettings()
    d = c.data

    def persist(draw):
        def as_array():
            drawn = draw()  # None on a rank other than 0: rank 0 noises the summed release
            return None if drawn is None else (drawn[0].cpu().numpy(), drawn[1])
        return distributed.release_once(c.collective, c.session, "walr", as_array)

    theta, res = walr.run_walr(torch.cat([d.ns_num, d.s_num], 1).double(), d.label.double(), weights, par,
                               c.randomness, steps=ws.steps, minibatch=ws.minibatch, lr=ws.lr, persist=persist,
                               collective=c.collective)

    def scores(ev):
        xe, _, _ = walr.prepare_rows(torch.cat([ev.data.ns_num, ev.data.s_num], 1).double(),
                                     row_norm_bound=par.row_norm_bound, expected_features=par.features)
        return walr.predict(theta, xe)

    return res, FittedWALR({"theta": theta.cpu()}, {"features": par.features}, ws.to_dict(), scores)


def _one_hot(par, c: PhaseContext, weights):
    """WALR on every feature column (``trainers.walr_onehot``): one-hot categoricals, scaled numerics."""

    def persist(draw):
        return distributed.release_once(c.collective, c.session, "walr", draw)

    ws = c.walr_settings or WALRSettings()
    model, res = walr_onehot.run_walr_onehot(c.data, c.data.label.double(), weights, par, c.randomness, persist=persist,
                                             collective=c.collective, fitted_weights=ws.column_weights == "fitted",
                                             prior=ws.prior)

    def scores(ev):
        rows, _ = walr_onehot.encode_rows(ev.data, model.lo, model.hi, row_norm_bound=par.row_norm_bound,
                                          weights=model.weights)
        return walr_onehot.predict(model.theta, rows)

    state = {"theta": model.theta.cpu(), "numeric_lo": torch.tensor(model.lo, dtype=torch.float64),
             "numeric_hi": torch.tensor(model.hi, dtype=torch.float64),
             "column_weights": torch.tensor([model.weights.intercept, *model.weights.categorical,
                                             *model.weights.numeric], dtype=torch.float64)}
    config = {"features": model.k, "encoding": "one-hot", "numeric_range": [model.lo, model.hi], "l2": model.l2,
              "prior": model.prior, "prior_precisions": list(model.precisions),
              "column_weights": model.weights.to_dict()}
    return res, FittedWALR(state, config, {"encoding": "one-hot", "fit": "L-BFGS", "l2": model.l2,
                                           "prior": ws.prior, "column_weights": ws.column_weights}, scores)
