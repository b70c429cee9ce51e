"""The RR debiasing losses: closed forms, the unbiasedness identity, the forward loss's minimiser."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.losses import bce, rr_forward_loss, rr_unbiased_loss

DT = torch.float64


def _logits(n=64, scale=6.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=DT) * scale


def _labels(n=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g).to(DT)


def _plain_bce(z, y):
    """Per-example BCE from torch's own implementation, the independent reference."""
    return F.binary_cross_entropy_with_logits(z, y, reduction="none")


def test_bce_matches_torch():
    z, y = _logits(), _labels()
    assert torch.allclose(bce(z, y), F.binary_cross_entropy_with_logits(z, y), rtol=1e-12)
    assert torch.allclose(bce(z, y, reduction="none"), _plain_bce(z, y), rtol=1e-12)
    assert torch.allclose(bce(z, y, reduction="sum"), _plain_bce(z, y).sum(), rtol=1e-12)


@pytest.mark.parametrize("loss", [rr_unbiased_loss, rr_forward_loss])
def test_reduces_to_bce_at_rho_zero(loss):
    z, y = _logits(), _labels()
    assert torch.allclose(loss(z, y, 0.0, reduction="none"), _plain_bce(z, y), rtol=1e-12, atol=1e-12)
    assert torch.allclose(loss(z, y, 0), bce(z, y), rtol=1e-12)


@pytest.mark.parametrize("rho", [1e-6, 0.05, 0.2689414213699951, 0.4, 0.499])
def test_unbiased_loss_equals_paper_form(rho):
    """The stable form softplus(z) - t z against [L(1 - y^) - p (L(0) + L(1))] / (1 - 2p), p = 1 - rho."""
    z, y = _logits(scale=4.0), _labels()
    p = 1 - rho
    both = _plain_bce(z, torch.zeros_like(z)) + _plain_bce(z, torch.ones_like(z))
    paper = (_plain_bce(z, 1 - y) - p * both) / (1 - 2 * p)
    ours = rr_unbiased_loss(z, y, rho, reduction="none")
    assert torch.allclose(ours, paper, rtol=1e-9, atol=1e-9 / (1 - 2 * rho))


def _expectation_over_flip(loss, z, y, rho):
    """E over y^ = RR(y) of loss(z, y^) and of its gradient: two outcomes, weights 1 - rho and rho."""
    z = z.clone().requires_grad_(True)
    kept = loss(z, y, rho, reduction="none")
    flipped = loss(z, 1 - y, rho, reduction="none")
    expected = (1 - rho) * kept + rho * flipped
    (grad,) = torch.autograd.grad(expected.sum(), z)
    return expected.detach(), grad


def _clean(z, y):
    z = z.clone().requires_grad_(True)
    loss = _plain_bce(z, y)
    (grad,) = torch.autograd.grad(loss.sum(), z)
    return loss.detach(), grad


@settings(max_examples=200, deadline=None)
@given(z=st.floats(-30, 30), y=st.sampled_from([0.0, 1.0]), rho=st.floats(1e-4, 0.49))
def test_unbiased_loss_expectation_is_clean_bce(z, y, rho):
    zt, yt = torch.tensor([z], dtype=DT), torch.tensor([y], dtype=DT)
    expected, expected_grad = _expectation_over_flip(rr_unbiased_loss, zt, yt, rho)
    clean, clean_grad = _clean(zt, yt)
    scale = 1 / (1 - 2 * rho)  # the loss's terms grow like this; cancellation costs that many ulps
    assert torch.allclose(expected, clean, rtol=1e-9, atol=1e-12 * scale * (1 + abs(z)))
    assert torch.allclose(expected_grad, clean_grad, rtol=1e-9, atol=1e-12 * scale)


def test_unbiased_loss_expectation_vectorised():
    z, y = _logits(n=1000, scale=5.0), _labels(n=1000)
    for rho in (0.01, 0.1, 0.3, 0.45):
        expected, expected_grad = _expectation_over_flip(rr_unbiased_loss, z, y, rho)
        clean, clean_grad = _clean(z, y)
        assert torch.allclose(expected, clean, rtol=1e-9, atol=1e-9)
        assert torch.allclose(expected_grad, clean_grad, rtol=1e-9, atol=1e-9)


def test_unbiased_loss_gradient_bounded_loss_unbounded_below():
    rho = 0.3
    bound = (1 - rho) / (1 - 2 * rho)
    z = torch.linspace(-200, 200, 401, dtype=DT, requires_grad=True)
    for label in (0.0, 1.0):
        y = torch.full_like(z, label)
        (grad,) = torch.autograd.grad(rr_unbiased_loss(z, y, rho, reduction="sum"), z)
        assert grad.abs().max() <= bound + 1e-12
    # y^ = 1: target (1 - rho) / (1 - 2 rho) > 1, so the loss decreases without bound in z.
    far = rr_unbiased_loss(torch.tensor([1e3], dtype=DT), torch.tensor([1.0], dtype=DT), rho)
    assert far < -100


def test_forward_loss_equals_naive_form_where_naive_is_accurate():
    z, y = _logits(scale=3.0), _labels()
    for rho in (0.01, 0.2, 0.45):
        q = rho + (1 - 2 * rho) * torch.sigmoid(z)
        naive = -(y * torch.log(q) + (1 - y) * torch.log(1 - q))
        assert torch.allclose(rr_forward_loss(z, y, rho, reduction="none"), naive, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rho", [0.0, 1e-12, 0.1, 0.49])
def test_forward_loss_finite_everywhere(dtype, rho):
    z = torch.tensor([-1e30, -1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, 1e30], dtype=dtype, requires_grad=True)
    for label in (0.0, 1.0):
        y = torch.full_like(z, label)
        loss = rr_forward_loss(z, y, rho, reduction="none")
        (grad,) = torch.autograd.grad(loss.sum(), z)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
        assert (loss >= 0).all()
        if rho > 0:  # bounded by -log rho: a confidently wrong prediction costs at most that
            assert (loss <= -math.log(rho) + 1e-6).all()


@pytest.mark.parametrize("rho", [0.05, 0.25, 0.45])
@pytest.mark.parametrize("p_star", [0.02, 0.3, 0.5, 0.9])
def test_forward_loss_expected_minimiser_is_clean_probability(rho, p_star):
    """With y ~ Bernoulli(p*) and y^ = RR(y), E[forward loss] is minimised at sigmoid(z) = p*."""
    q_star = rho + (1 - 2 * rho) * p_star  # P(y^ = 1)

    def expected(z):
        ones, zeros = torch.ones_like(z), torch.zeros_like(z)
        return (q_star * rr_forward_loss(z, ones, rho, reduction="none")
                + (1 - q_star) * rr_forward_loss(z, zeros, rho, reduction="none"))

    z_star = torch.tensor([math.log(p_star / (1 - p_star))], dtype=DT, requires_grad=True)
    (grad,) = torch.autograd.grad(expected(z_star).sum(), z_star)
    assert abs(grad.item()) < 1e-12
    grid = torch.linspace(-12, 12, 240001, dtype=DT)
    z_min = grid[torch.argmin(expected(grid))].item()
    assert z_min == pytest.approx(z_star.item(), abs=2e-4)


def test_per_example_flip_probability_tensor():
    z, y = _logits(n=8), _labels(n=8)
    rho = torch.tensor([0.0, 0.01, 0.1, 0.2, 0.3, 0.4, 0.45, 0.49], dtype=DT)
    for loss in (rr_unbiased_loss, rr_forward_loss):
        per = loss(z, y, rho, reduction="none")
        one_by_one = torch.stack([loss(z[i:i + 1], y[i:i + 1], float(rho[i]), reduction="none")[0] for i in range(8)])
        assert torch.allclose(per, one_by_one, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss", [rr_unbiased_loss, rr_forward_loss])
@pytest.mark.parametrize("rho", [0.5, 0.7, -0.01, float("nan"), float("inf"), "0.1", True, None])
def test_flip_probability_validated(loss, rho):
    with pytest.raises(ValueError, match="flip_probability must be in \\[0, 0.5\\)"):
        loss(_logits(n=4), _labels(n=4), rho)


@pytest.mark.parametrize("loss", [rr_unbiased_loss, rr_forward_loss])
def test_flip_probability_tensor_validated(loss):
    with pytest.raises(ValueError, match="flip_probability"):
        loss(_logits(n=3), _labels(n=3), torch.tensor([0.1, 0.5, 0.2]))
    with pytest.raises(ValueError, match="flip_probability"):
        loss(_logits(n=3), _labels(n=3), torch.tensor([0.1, float("nan"), 0.2]))


def test_reduction_validated():
    with pytest.raises(ValueError, match="reduction"):
        bce(_logits(n=3), _labels(n=3), reduction="avg")


def test_float32_inputs_keep_dtype():
    z, y = _logits(n=5).float(), _labels(n=5).float()
    for value in (bce(z, y), rr_unbiased_loss(z, y, 0.2), rr_forward_loss(z, y, 0.2)):
        assert value.dtype == torch.float32 and value.dim() == 0
