"""The evaluation metrics the Hybrid papers report: AUC, relative AUC loss, log loss, calibration.

Chua et al. (arXiv:2401.15246) report the AUC loss ``1 - AUC`` and the *relative* AUC loss
against the non-private model, ``100 (AUCloss - AUCloss_np) / AUCloss_np`` in percent; the
clean-room paper (Li et al. 2024) reports the calibration ratio ``mean(p) / mean(y)``.

Numpy only: evaluation runs on arrays already moved off the device, and importing this
module must not import torch.
"""

from __future__ import annotations

import numbers

import numpy as np

from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

__all__ = ["auc", "auc_standard_error", "calibration_ratio", "evaluate", "log_loss", "relative_auc_loss"]

LOG_LOSS_EPS = 1e-15


def _labels_and_values(y_true, values, what: str, *, probabilities: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Flat float64 copies of ``y_true`` (checked to be 0/1) and ``values`` (checked finite).

    With ``probabilities``, values must also lie in [0, 1]: logits passed by mistake would
    otherwise be clipped into a plausible-looking log loss.
    """
    y = np.asarray(y_true).ravel()
    v = np.asarray(values, dtype=np.float64).ravel()
    if y.shape[0] != v.shape[0]:
        raise InvalidParameterError(f"y_true and {what} must have the same length, got {y.shape[0]} and {v.shape[0]}")
    if y.shape[0] == 0:
        raise InvalidParameterError("y_true is empty")
    y = y.astype(np.float64, copy=False)
    if not np.all((y == 0) | (y == 1)):
        raise InvalidParameterError("y_true must contain only 0 and 1")
    if not np.all(np.isfinite(v)):
        raise InvalidParameterError(f"{what} must be finite, got NaN or infinity")
    if probabilities and not np.all((v >= 0) & (v <= 1)):
        raise InvalidParameterError(
            f"{what} must be probabilities in [0, 1], got values in [{float(v.min())!r}, {float(v.max())!r}]")
    return y, v


def auc(y_true, scores) -> float:
    """Exact ROC AUC: the Mann-Whitney U statistic over positive/negative pairs, ties counting 1/2.

    One sort, O(n log n): after sorting by score, each group of tied scores contributes
    ``pos_g * (negatives in lower groups) + pos_g * neg_g / 2``. The sum is kept in int64 as
    twice U, so the result is exact up to the final division (10M points take about a second).

    Args:
        y_true: [n] labels in {0, 1} (bool, int or float).
        scores: [n] finite scores; only their order matters.

    Raises:
        InvalidParameterError (a ValueError): lengths differ, labels not 0/1, a score is not
            finite, or only one class is present (the AUC is undefined).
    """
    y, s = _labels_and_values(y_true, scores, "scores")
    n = y.shape[0]
    positives = int(np.count_nonzero(y))
    negatives = n - positives
    if positives == 0 or negatives == 0:
        raise InvalidParameterError(
            f"AUC needs both classes, got {positives} positives and {negatives} negatives")
    order = np.argsort(s)  # any sort: tied scores are grouped below, whatever their order
    s_sorted = s[order]
    y_sorted = y[order].astype(np.int64)
    starts = np.concatenate(([0], np.flatnonzero(s_sorted[1:] != s_sorted[:-1]) + 1))
    pos_g = np.add.reduceat(y_sorted, starts)
    neg_g = np.diff(np.append(starts, n)) - pos_g
    neg_below = np.cumsum(neg_g) - neg_g
    twice_u = 2 * int(np.dot(pos_g, neg_below)) + int(np.dot(pos_g, neg_g))
    return twice_u / (2 * positives * negatives)


def auc_standard_error(area: float, positives: int, negatives: int) -> float:
    """Hanley and McNeil's standard error of an AUC estimated on ``positives`` and ``negatives`` examples.

    ``SE^2 = (A(1-A) + (n1-1)(Q1-A^2) + (n2-1)(Q2-A^2)) / (n1 n2)`` with ``Q1 = A/(2-A)``
    (two positives both above one negative) and ``Q2 = 2A^2/(1+A)`` (one positive above two
    negatives): the exact variance of the Mann-Whitney estimate when the scores of each class
    are exponential, and close to it for other smooth score distributions (Hanley and
    McNeil, Radiology 143:29-36, 1982).

    Args:
        area: the AUC, in [0, 1].
        positives, negatives: n1 and n2, each at least 1.
    """
    a = validate.probability("auc", area, allow_zero=True, allow_one=True)
    n1 = validate.positive_int("positives", positives)
    n2 = validate.positive_int("negatives", negatives)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    variance = (a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n2 - 1) * (q2 - a * a)) / (n1 * n2)
    return float(np.sqrt(variance))  # both Q - A^2 terms are >= 0: A(1-A)^2/(2-A) and A^2(1-A)/(1+A)


def log_loss(y_true, p) -> float:
    """Mean binary cross-entropy of probabilities ``p``, clipped to [1e-15, 1 - 1e-15]."""
    y, q = _labels_and_values(y_true, p, "p", probabilities=True)
    q = np.clip(q, LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))


def calibration_ratio(y_true, p) -> float:
    """``mean(p) / mean(y)``: 1 for a calibrated model, above 1 when it over-predicts."""
    y, q = _labels_and_values(y_true, p, "p", probabilities=True)
    mean_y = float(np.mean(y))
    if mean_y == 0:
        raise InvalidParameterError("calibration ratio needs at least one positive label, got 0")
    return float(np.mean(q)) / mean_y


def relative_auc_loss(auc_private: float, auc_baseline: float) -> float:
    """The relative AUC loss of arXiv:2401.15246 in percent: ``100 ((1 - a) - (1 - a_np)) / (1 - a_np)``.

    Args:
        auc_private: AUC of the private model.
        auc_baseline: AUC of the non-private baseline; must be below 1.
    """
    for name, value in (("auc_private", auc_private), ("auc_baseline", auc_baseline)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
            raise InvalidParameterError(f"{name} must be a number in [0, 1], got {value!r}")
    baseline_loss = 1.0 - float(auc_baseline)
    if baseline_loss == 0:
        raise InvalidParameterError(
            "auc_baseline must be below 1 (a relative loss against AUC loss 0 is undefined), got 1.0")
    return 100.0 * ((1.0 - float(auc_private)) - baseline_loss) / baseline_loss


def evaluate_model(y_true, p) -> dict:
    """``evaluate``, or, for a model whose predictions are not finite (it diverged), null metrics saying so.

    A trained model is evaluated after its privacy was spent: its record must still be
    written, so a diverged model gets ``"diverged"`` and null metrics instead of an error.
    """
    p = np.asarray(p, dtype=np.float64).ravel()
    if np.all(np.isfinite(p)):
        return evaluate(y_true, p)
    y = np.asarray(y_true).ravel()
    return {"auc": None, "auc_loss": None, "log_loss": None, "calibration_ratio": None, "n": int(y.shape[0]),
            "positives": int(np.count_nonzero(y)),
            "diverged": f"{int(np.count_nonzero(~np.isfinite(p)))} of {p.size} predictions are not finite"}


def evaluate(y_true, p, *, auc_baseline: float | None = None) -> dict:
    """All metrics of one model on one evaluation set, as a JSON-ready dict.

    Args:
        y_true: [n] labels in {0, 1}.
        p: [n] predicted probabilities.
        auc_baseline: the non-private model's AUC; when given, ``relative_auc_loss`` is added.

    Returns:
        ``{"auc", "auc_loss", "log_loss", "calibration_ratio", "n", "positives"}`` (plus
        ``"relative_auc_loss"`` with a baseline); floats and ints only.
    """
    y, q = _labels_and_values(y_true, p, "p", probabilities=True)
    a = auc(y, q)
    out = {
        "auc": a,
        "auc_loss": 1.0 - a,
        "log_loss": log_loss(y, q),
        "calibration_ratio": calibration_ratio(y, q),
        "n": int(y.shape[0]),
        "positives": int(np.count_nonzero(y)),
    }
    if auc_baseline is not None:
        out["relative_auc_loss"] = relative_auc_loss(a, auc_baseline)
    return out
