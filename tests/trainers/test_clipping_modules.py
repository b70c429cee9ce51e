"""Per-example clipping for module kinds a user's model brings: each against a brute-force loop.

The reference is the definition: one forward and backward per example (a batch of 1), its
gradient clipped to C and summed. Every fast path (Linear, Embedding, EmbeddingBag,
LayerNorm) and the ``torch.func`` fallback (Conv1d, a raw nn.Parameter) must give the same
norms and the same clipped sum to float64 rounding, alone and mixed in one model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from budgetplan.errors import UnsupportedError
from trainers import clipping
from trainers.clipping import clipped_gradient_sum

DT = torch.float64
RTOL = 1e-9


def mse(out, y):
    return (out - y).square().flatten(1).sum(1)


def brute_force(model, inputs, targets, mask, c, params):
    """Each real example alone (a batch of 1): its gradient, its norm, clipped to c and summed."""
    total = [torch.zeros_like(p) for p in params]
    norms = torch.zeros(len(mask), dtype=DT)
    for i in range(len(mask)):
        if mask[i] == 0:
            continue
        loss = mse(model(*(x[i:i + 1] for x in inputs)), targets[i:i + 1]).sum()
        grads = [torch.zeros_like(p) if g is None else g
                 for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))]
        norms[i] = torch.sqrt(sum(g.square().sum() for g in grads))
        for t, g in zip(total, grads):
            t += min(1.0, c / float(norms[i])) * g
    return total, norms


def check(model, inputs, targets, rows, real, *, fast_only=False, monkeypatch=None):
    """Ours against the loop at C = the median true norm (about half the rows clipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    mask = torch.zeros(rows, dtype=DT)
    mask[:real] = 1
    _, true = brute_force(model, inputs, targets, mask, 1e300, params)
    c = float(true[:real].median()) * (1 + 1e-6)
    want, want_norms = brute_force(model, inputs, targets, mask, c, params)
    if fast_only:  # the fast paths alone: the fallback must not be reached
        monkeypatch.setattr(clipping, "_fallback_gradients", lambda *a, **k: pytest.fail("fallback used"))
    out = clipped_gradient_sum(model, mse, inputs, targets, mask=mask, clipping_norm=c)
    torch.testing.assert_close(out["norms"], want_norms, rtol=RTOL, atol=0)
    assert 0 < int(out["clipped"]) < real
    for p, w in zip(params, want):
        torch.testing.assert_close(p.grad, w, rtol=RTOL, atol=RTOL * max(float(w.abs().max()), 1e-12))


def ids(rows, length, vocab, seed):
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_linear_on_sequences(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).to(DT)
    x = torch.randn(9, 3, 5, dtype=DT)                         # 3 rows per example
    check(model, (x,), torch.randn(9, 3, 2, dtype=DT), 9, 7, fast_only=True, monkeypatch=monkeypatch)


class Lookup(nn.Module):
    def __init__(self, bag: nn.EmbeddingBag | None = None):
        super().__init__()
        self.table = bag if bag is not None else nn.Embedding(7, 3, padding_idx=1)
        self.head = nn.Linear(3, 1)

    def forward(self, cat, *rest):
        h = self.table(cat, *rest) if isinstance(self.table, nn.EmbeddingBag) else self.table(cat).sum(1)
        return self.head(torch.tanh(h))


def test_embedding_with_repeated_ids(monkeypatch):
    torch.manual_seed(1)
    cat = ids(10, 4, 7, 1)
    cat[0] = torch.tensor([2, 2, 2, 1])                        # one id three times, and the padding id
    check(Lookup().to(DT), (cat,), torch.randn(10, 1, dtype=DT), 10, 8, fast_only=True, monkeypatch=monkeypatch)


@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_embedding_bag_fixed_length(monkeypatch, mode, weighted):
    torch.manual_seed(2)
    model = Lookup(nn.EmbeddingBag(7, 3, mode=mode, padding_idx=0)).to(DT)
    cat = ids(10, 5, 7, 2)
    cat[1] = torch.tensor([3, 3, 0, 3, 5])
    inputs = (cat, None, torch.rand(10, 5, dtype=DT)) if weighted else (cat,)
    if weighted:  # None offsets cannot be sliced per example: the loop gets a wrapper
        model, inputs = Weighted(model), (cat, inputs[2])
    check(model, inputs, torch.randn(10, 1, dtype=DT), 10, 7, fast_only=True, monkeypatch=monkeypatch)


class Weighted(nn.Module):
    """An EmbeddingBag with per-sample weights (None offsets cannot be sliced by the loop)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, cat, w):
        return self.inner(cat, None, w)


class Ragged(nn.Module):
    """Bags of different lengths, as a flat id list with offsets (built per call from lengths)."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(9, 4, mode="mean")
        self.head = nn.Linear(4, 1)

    def forward(self, cat, lengths):
        keep = torch.arange(cat.shape[1]) < lengths[:, None]
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
        return self.head(self.bag(cat[keep], offsets))


def test_embedding_bag_with_offsets(monkeypatch):
    torch.manual_seed(3)
    cat = ids(8, 6, 9, 3)
    lengths = torch.tensor([1, 6, 3, 0, 2, 6, 4, 5])           # an empty bag too
    check(Ragged().to(DT), (cat, lengths), torch.randn(8, 1, dtype=DT), 8, 7, fast_only=True,
          monkeypatch=monkeypatch)


def test_layer_norm_is_a_fast_path(monkeypatch):
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2), nn.LayerNorm((3, 2))).to(DT)
    x = torch.randn(9, 3, 4, dtype=DT)
    check(model, (x,), torch.randn(9, 3, 2, dtype=DT), 9, 7, fast_only=True, monkeypatch=monkeypatch)


def test_layer_norm_gradients_equal_torch_func_per_example_gradients():
    """The fast path's norms and clipped sum from torch.func's per-example gradients of the LayerNorm alone."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(5)
    norm = nn.LayerNorm(5).to(DT)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x, y = torch.randn(12, 2, 5, dtype=DT), torch.randn(12, 2, 5, dtype=DT)
    theta = {k: v.detach() for k, v in norm.named_parameters()}

    def loss(params, xi, yi):
        return mse(functional_call(norm, params, (xi.unsqueeze(0),)), yi.unsqueeze(0)).sum()

    per = vmap(grad(loss), in_dims=(None, 0, 0))(theta, x, y)
    norms = torch.sqrt(per["weight"].square().sum(1) + per["bias"].square().sum(1))
    c = float(norms.median())
    factor = (c / norms).clamp(max=1.0)
    out = clipped_gradient_sum(norm, mse, (x,), y, mask=torch.ones(12, dtype=DT), clipping_norm=c)
    torch.testing.assert_close(out["norms"], norms, rtol=RTOL, atol=0)
    for name in ("weight", "bias"):
        torch.testing.assert_close(getattr(norm, name).grad, factor @ per[name], rtol=1e-6, atol=1e-12)


def test_conv1d_goes_through_the_fallback():
    torch.manual_seed(6)
    model = nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 6, 1)).to(DT)
    check(model, (torch.randn(9, 2, 6, dtype=DT),), torch.randn(9, 1, dtype=DT), 9, 7)


class Scaled(nn.Module):
    """A raw nn.Parameter used outside any layer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.gain = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return (self.lin(x) * self.gain).sum(1, keepdim=True)


def test_raw_parameter_goes_through_the_fallback():
    torch.manual_seed(7)
    check(Scaled().to(DT), (torch.randn(9, 4, dtype=DT),), torch.randn(9, 1, dtype=DT), 9, 7)


class Mixed(nn.Module):
    """Every kind at once: Embedding, EmbeddingBag, Linear (reused), LayerNorm, Conv1d, a raw parameter."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 4)
        self.bag = nn.EmbeddingBag(8, 4, mode="sum")
        self.conv = nn.Conv1d(1, 2, 3, padding=1)
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.gain = nn.Parameter(torch.ones(4))
        self.head = nn.Linear(4 + 2 * 4, 1)

    def forward(self, cat, num):
        h = self.norm(self.lin(torch.tanh(self.lin(self.emb(cat).mean(1) + self.bag(cat))))) * self.gain
        return self.head(torch.cat([h, torch.relu(self.conv(num.unsqueeze(1))).flatten(1)], 1))


def test_a_model_mixing_every_kind():
    torch.manual_seed(8)
    model = Mixed().to(DT)
    check(model, (ids(10, 3, 8, 8), torch.randn(10, 4, dtype=DT)), torch.randn(10, 1, dtype=DT), 10, 8)


def test_a_model_mixing_every_kind_with_frozen_parts():
    torch.manual_seed(9)
    model = Mixed().to(DT)
    for p in (model.bag.weight, model.norm.bias, model.conv.weight):
        p.requires_grad_(False)
    check(model, (ids(10, 3, 8, 9), torch.randn(10, 4, dtype=DT)), torch.randn(10, 1, dtype=DT), 10, 8)
    assert model.bag.weight.grad is None and model.conv.weight.grad is None


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(4), nn.BatchNorm1d(4, track_running_stats=False),
                                  nn.InstanceNorm1d(4, track_running_stats=True)])
def test_batch_statistics_are_refused_by_module_name(norm):
    model = nn.Sequential(nn.Linear(3, 4), norm, nn.Flatten(), nn.Linear(4, 1)).to(DT)
    x = torch.randn(6, 3, dtype=DT) if isinstance(norm, nn.BatchNorm1d) else torch.randn(6, 2, 3, dtype=DT)
    with pytest.raises(UnsupportedError, match=rf"module '1' \({type(norm).__name__}\)"):
        clipped_gradient_sum(model, mse, (x,), torch.randn(6, 1, dtype=DT), mask=torch.ones(6, dtype=DT),
                             clipping_norm=1.0)


def test_batch_norm_in_eval_mode_with_running_statistics_is_per_example():
    torch.manual_seed(10)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1)).to(DT)
    model[1].eval()  # a fixed affine map of each example: the fallback clips it
    check(model, (torch.randn(9, 3, dtype=DT),), torch.randn(9, 1, dtype=DT), 9, 7)
