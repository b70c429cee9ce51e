"""Binary cross-entropy and its two corrections for labels released by randomized response.

RR with budget eps flips each label with probability ``rho = 1 / (1 + e^eps)``. Training
with plain BCE on the flipped labels biases every prediction towards 1/2; two published
corrections undo it:

- the *unbiased* (backward-corrected) loss of Chua et al. (arXiv:2401.15246, section 4,
  label-DP phase), whose expectation over the flip equals the clean loss, gradient included;
- the *forward-corrected* loss of Li et al. 2024 ("Privacy Preserving Conversion Modeling in
  Data Clean Room", section 2), BCE of the noisy label against the model's prediction pushed
  through the flip channel, ``rho + (1 - 2 rho) sigmoid(z)``: bounded below, and its expected
  minimiser is the clean probability.

Every function takes logits (never probabilities) and computes in a form that is finite for
every finite logit. ``flip_probability`` may be a float or a tensor broadcastable to the
logits (per-example budgets, e.g. eps / K_i for a unit with K_i examples).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from budgetplan.errors import InvalidParameterError

__all__ = ["bce", "rr_forward_loss", "rr_unbiased_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise InvalidParameterError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _flip_probability(rho: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``rho`` as a tensor of ``like``'s dtype and device, after checking it lies in [0, 0.5).

    At rho = 1/2 the noisy label carries no information and both corrections divide by
    ``1 - 2 rho = 0``; NaN fails both comparisons and is refused too.
    """
    if isinstance(rho, torch.Tensor):
        r = rho.detach()
        if r.numel() and not bool(((r >= 0) & (r < 0.5)).all()):
            raise InvalidParameterError(
                f"flip_probability must be in [0, 0.5), got values in [{r.min().item()!r}, {r.max().item()!r}]")
        return rho.to(dtype=like.dtype, device=like.device)
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not 0 <= rho < 0.5:
        raise InvalidParameterError(f"flip_probability must be in [0, 0.5), got {rho!r}")
    return torch.tensor(float(rho), dtype=like.dtype, device=like.device)


def _bce_against(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-example ``-(t log sigmoid(z) + (1 - t) log sigmoid(-z)) = softplus(z) - t z``.

    Written out rather than via ``binary_cross_entropy_with_logits`` because the unbiased
    loss needs targets outside [0, 1], which that function does not promise to support.
    ``-logsigmoid(-z)`` rather than ``F.softplus(z)``: softplus returns z itself above its
    threshold of 20, an error of e^-20 (8e-10) that float64 checks of the identities see.
    """
    return -F.logsigmoid(-logits) - target * logits


def bce(logits: torch.Tensor, labels: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy with logits, against labels in {0, 1} (or soft labels in [0, 1]).

    Args:
        logits: [B] real scores z, ``P(y = 1) = sigmoid(z)``.
        labels: [B] targets.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (per example, for DP-SGD).
    """
    return _reduce(_bce_against(logits, labels.to(logits.dtype)), reduction)


def rr_unbiased_loss(logits: torch.Tensor, noisy_labels: torch.Tensor, flip_probability: float | torch.Tensor,
                     *, reduction: str = "mean") -> torch.Tensor:
    """The unbiased loss for RR labels of arXiv:2401.15246 (section 4), in its stable BCE form.

    With keep probability ``p = 1 - rho`` the paper's loss is
    ``[L(z, 1 - y^) - p (L(z, 0) + L(z, 1))] / (1 - 2p)``; for BCE, since
    ``L(z, 0) - L(z, 1) = z``, this is BCE against the target ``t = (y^ - rho) / (1 - 2 rho)``,
    i.e. ``softplus(z) - t z``. Its expectation over the randomized label equals the clean
    BCE, and so does the expectation of its gradient ``sigmoid(z) - t``.

    ``t`` lies outside [0, 1] (``-rho / (1 - 2 rho)`` or ``(1 - rho) / (1 - 2 rho)``), so the
    loss is unbounded below: a single example can drive its logit to infinity. The gradient
    stays bounded by ``(1 - rho) / (1 - 2 rho)``, which DP-SGD clipping relies on.

    Args:
        logits: [B] logits z.
        noisy_labels: [B] labels y^ in {0, 1} after randomized response.
        flip_probability: rho in [0, 0.5), a float or a tensor broadcastable to ``logits``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
    """
    rho = _flip_probability(flip_probability, logits)
    target = (noisy_labels.to(logits.dtype) - rho) / (1 - 2 * rho)
    return _reduce(_bce_against(logits, target), reduction)


def rr_forward_loss(logits: torch.Tensor, noisy_labels: torch.Tensor, flip_probability: float | torch.Tensor,
                    *, reduction: str = "mean") -> torch.Tensor:
    """The forward-corrected loss of Li et al. 2024 (clean-room paper): ``BCE(rho + (1 - 2 rho) sigmoid(z), y^)``.

    The model's clean probability ``sigmoid(z)`` is pushed through the flip channel and
    compared with the noisy label, so the expected loss over the flip is minimised at the
    clean probability and predictions stay calibrated. In log space,
    ``log q = logaddexp(log rho, log(1 - 2 rho) + logsigmoid(z))`` and
    ``log(1 - q) = logaddexp(log rho, log(1 - 2 rho) + logsigmoid(-z))``, finite for every
    finite z (at rho = 0 this is exactly BCE).

    Args:
        logits: [B] logits z of the clean label.
        noisy_labels: [B] labels y^ in {0, 1} after randomized response.
        flip_probability: rho in [0, 0.5), a float or a tensor broadcastable to ``logits``.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
    """
    rho = _flip_probability(flip_probability, logits)
    log_rho = torch.log(rho)          # -inf at rho = 0: logaddexp then returns its other argument
    log_keep = torch.log1p(-2 * rho)
    log_q = torch.logaddexp(log_rho, log_keep + F.logsigmoid(logits))
    log_not_q = torch.logaddexp(log_rho, log_keep + F.logsigmoid(-logits))
    y = noisy_labels.to(logits.dtype)
    return _reduce(-(y * log_q + (1 - y) * log_not_q), reduction)
