"""Unit-level clipping (``unit_rows = K``) against its definition: one backward per unit.

The reference forwards a unit's real rows alone, takes the gradient of their mask-weighted
summed loss, clips its norm to C and adds the units up, all in float64: the tolerances are
rounding. Blocks are partly padded, one block is all padding, and several models put the
same id in two rows of one unit, so the cross terms between a unit's rows matter.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from budgetplan.errors import InvalidParameterError
from trainers import clipping
from trainers.clipping import clipped_gradient_sum
from trainers.losses import bce
from trainers.models import build_model

from .test_clipping_modules import Lookup, Ragged, Scaled, Weighted, ids, mse

DT = torch.float64
RTOL = 1e-9
BCE = functools.partial(bce, reduction="none")


def unit_mask(pattern, k):
    """A [len(pattern) * k] mask: block u has its first pattern[u] rows real."""
    mask = torch.zeros(len(pattern) * k, dtype=DT)
    for u, real in enumerate(pattern):
        mask[u * k:u * k + real] = 1
    return mask


def brute_force(model, loss_fn, inputs, targets, mask, k, c, params, forward=None):
    """Each unit alone: the gradient of its real rows' weighted summed loss, clipped to c, summed."""
    forward = forward or model
    total = [torch.zeros_like(p) for p in params]
    norms = torch.zeros(len(mask) // k, dtype=DT)
    for u in range(len(mask) // k):
        rows = torch.arange(u * k, (u + 1) * k)
        rows = rows[mask[rows] != 0]
        if not len(rows):
            continue
        loss = (loss_fn(forward(*(x[rows] for x in inputs)), targets[rows]) * mask[rows]).sum()
        grads = [torch.zeros_like(p) if g is None else g
                 for p, g in zip(params, torch.autograd.grad(loss, params, allow_unused=True))]
        norms[u] = torch.sqrt(sum(g.square().sum() for g in grads))
        for t, g in zip(total, grads):
            t += min(1.0, c / float(norms[u])) * g
    return total, norms


def check(model, inputs, targets, mask, k, *, loss_fn=mse, truncated=False, fast_only=False, monkeypatch=None):
    """Ours against the per-unit loop at C = the median true unit norm (about half the units clipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    forward = model.forward_truncated if truncated else model
    xs = inputs[:2] if truncated else inputs
    _, true = brute_force(model, loss_fn, xs, targets, mask, k, 1e300, params, forward)
    present = mask.reshape(-1, k).ne(0).any(1)
    c = float(true[present].median()) * (1 + 1e-6)
    want, want_norms = brute_force(model, loss_fn, xs, targets, mask, k, c, params, forward)
    if fast_only:  # the book-keeping pieces alone: the fallback must not be reached
        monkeypatch.setattr(clipping, "_fallback_gradients", lambda *a, **kw: pytest.fail("fallback used"))
    for p in model.parameters():
        p.grad = None
    out = clipped_gradient_sum(model, loss_fn, inputs, targets, mask=mask, clipping_norm=c, truncated=truncated,
                               unit_rows=k)
    assert out["norms"].shape == (len(mask) // k,)
    torch.testing.assert_close(out["norms"], want_norms, rtol=RTOL, atol=0)
    clipped = int((want_norms[present] > c).sum())
    assert int(out["clipped"]) == clipped and 0 < clipped < int(present.sum())
    losses = loss_fn(forward(*xs), targets)
    torch.testing.assert_close(out["loss_sum"], losses[mask != 0].sum(), rtol=RTOL, atol=0)
    for p, w in zip(params, want):
        torch.testing.assert_close(p.grad, w, rtol=RTOL, atol=RTOL * max(float(w.abs().max()), 1e-12))
    return out


# Six units of K = 3: full, one row, two rows, all padding, full, full.
K = 3
PATTERN = (3, 1, 2, 0, 3, 3)
ROWS = len(PATTERN) * K


def test_linear_mlp(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).to(DT)
    x = torch.randn(ROWS, 5, dtype=DT)
    check(model, (x,), torch.randn(ROWS, 2, dtype=DT), unit_mask(PATTERN, K), K, fast_only=True,
          monkeypatch=monkeypatch)


@pytest.mark.parametrize("width", [24, 1])
def test_linear_on_sequences_both_norm_routes(monkeypatch, width):
    """T = 4 rows per example, K T = 12: width 24 takes the Gram matrices, width 1 the gradient itself."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, width), nn.Tanh(), nn.Linear(width, 2)).to(DT)
    x = torch.randn(ROWS, 4, 5, dtype=DT)
    check(model, (x,), torch.randn(ROWS, 4, 2, dtype=DT), unit_mask(PATTERN, K), K, fast_only=True,
          monkeypatch=monkeypatch)


def test_weighted_rows():
    """A mask weight other than 1 weights the row inside its unit's sum, before the unit is clipped;
    unit 3's one real row sits between two padding rows."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)).to(DT)
    mask = unit_mask(PATTERN, K)
    mask[0], mask[13], mask[10] = 0.25, 3.0, 1.0
    check(model, (torch.randn(ROWS, 5, dtype=DT),), torch.randn(ROWS, 2, dtype=DT), mask, K)


def shared_ids(length, vocab, seed):
    """Ids where rows of one unit repeat each other's ids (a vocabulary of 7 makes it common anyway)."""
    cat = ids(ROWS, length, vocab, seed)
    cat[1] = cat[0]                                            # two rows of unit 0 look up the same ids
    cat[12, 0] = cat[13, length - 1] = cat[14, length // 2] = 4     # one id in every row of unit 4
    return cat


@pytest.mark.parametrize("length", [4, 8])
def test_embedding_with_ids_shared_across_rows_and_padding_idx(monkeypatch, length):
    """K L = 12 lookups per unit take the masked Gram matrix, 24 the (unit, id) segment sum."""
    torch.manual_seed(3)
    cat = shared_ids(length, 7, 3)
    cat[0, :2] = 1                                             # the padding id
    check(Lookup().to(DT), (cat,), torch.randn(ROWS, 1, dtype=DT), unit_mask(PATTERN, K), K, fast_only=True,
          monkeypatch=monkeypatch)


def test_embedding_one_column():
    """L = 1: one lookup per example, K per unit."""
    torch.manual_seed(4)
    model = Lookup(None).to(DT)
    cat = shared_ids(1, 7, 4)
    check(model, (cat,), torch.randn(ROWS, 1, dtype=DT), unit_mask(PATTERN, K), K)


@pytest.mark.parametrize("mode, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_embedding_bag(monkeypatch, mode, weighted):
    torch.manual_seed(5)
    model = Lookup(nn.EmbeddingBag(7, 3, mode=mode, padding_idx=0)).to(DT)
    cat = shared_ids(5, 7, 5)
    cat[1] = torch.tensor([3, 3, 0, 3, 5])
    inputs = (cat,)
    if weighted:
        model, inputs = Weighted(model), (cat, torch.rand(ROWS, 5, dtype=DT))
    check(model, inputs, torch.randn(ROWS, 1, dtype=DT), unit_mask(PATTERN, K), K, fast_only=True,
          monkeypatch=monkeypatch)


def test_embedding_bag_with_offsets(monkeypatch):
    torch.manual_seed(6)
    cat = shared_ids(6, 9, 6)
    lengths = torch.tensor([1, 6, 3, 0, 2, 6, 4, 5, 6, 2, 2, 2, 3, 3, 3, 1, 6, 4])
    check(Ragged().to(DT), (cat, lengths), torch.randn(ROWS, 1, dtype=DT), unit_mask(PATTERN, K), K,
          fast_only=True, monkeypatch=monkeypatch)


def test_layer_norm(monkeypatch):
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2), nn.LayerNorm((3, 2))).to(DT)
    check(model, (torch.randn(ROWS, 3, 4, dtype=DT),), torch.randn(ROWS, 3, 2, dtype=DT), unit_mask(PATTERN, K),
          K, fast_only=True, monkeypatch=monkeypatch)


def test_bare_parameter_fallback():
    torch.manual_seed(8)
    check(Scaled().to(DT), (torch.randn(ROWS, 4, dtype=DT),), torch.randn(ROWS, 1, dtype=DT),
          unit_mask(PATTERN, K), K)


def test_conv1d_fallback():
    torch.manual_seed(9)
    model = nn.Sequential(nn.Conv1d(2, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 6, 1)).to(DT)
    check(model, (torch.randn(ROWS, 2, 6, dtype=DT),), torch.randn(ROWS, 1, dtype=DT), unit_mask(PATTERN, K), K)


SHAPE = {"ns_vocab": 5, "n_ns_cat": 3, "n_ns_num": 2, "s_vocab": 4, "n_s_cat": 2, "n_s_num": 2}
SMALL = {"mlp": {"embedding_dim": 3, "tower_hidden": 7, "common_hidden": (6, 5)}, "fm": {"embedding_dim": 3}}


def tower_batch(rows, seed):
    """Tiny vocabularies: a unit's rows share ids in both tables."""
    g = torch.Generator().manual_seed(seed)
    inputs = (torch.randint(0, SHAPE["ns_vocab"], (rows, SHAPE["n_ns_cat"]), generator=g),
              torch.randn(rows, SHAPE["n_ns_num"], generator=g, dtype=DT),
              torch.randint(0, SHAPE["s_vocab"], (rows, SHAPE["n_s_cat"]), generator=g),
              torch.randn(rows, SHAPE["n_s_num"], generator=g, dtype=DT))
    return inputs, torch.randint(0, 2, (rows,), generator=g).to(DT)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("k", [2, 5])
@pytest.mark.parametrize("gram_max", [0, 10**6])
def test_tower_models(monkeypatch, kind, truncated, k, gram_max):
    """Both Embedding routes: every table through the segment sum (0), or through the Gram matrix."""
    monkeypatch.setattr(clipping, "_GRAM_MAX_LOOKUPS", gram_max)
    torch.manual_seed(10)
    model = build_model(kind, **SHAPE, **SMALL[kind]).to(DT)
    pattern = (k, 1, 0, k - 1, k, 2, k)
    inputs, targets = tower_batch(len(pattern) * k, seed=11 + k)
    check(model, inputs, targets, unit_mask(pattern, k), k, loss_fn=BCE, truncated=truncated, fast_only=True,
          monkeypatch=monkeypatch)


def test_padding_rows_contribute_exactly_zero():
    """Changing a padded row's features (even to a huge value) changes nothing, bit for bit."""
    torch.manual_seed(12)
    model = build_model("mlp", **SHAPE, **SMALL["mlp"]).to(DT)
    inputs, targets = tower_batch(ROWS, seed=13)
    mask = unit_mask(PATTERN, K)

    def run(inputs):
        out = clipped_gradient_sum(model, BCE, inputs, targets, mask=mask, clipping_norm=0.05, unit_rows=K)
        return out, [p.grad.clone() for p in model.parameters()]

    base, grads = run(inputs)
    changed = list(inputs)
    changed[1] = changed[1].clone()
    changed[1][mask == 0] = 1e6
    other, other_grads = run(tuple(changed))
    assert torch.equal(base["norms"], other["norms"])
    assert all(torch.equal(a, b) for a, b in zip(grads, other_grads))
    assert base["norms"][3] == 0  # the all-padding block


def test_all_padding_gives_zero_gradients():
    torch.manual_seed(14)
    model = build_model("fm", **SHAPE, **SMALL["fm"]).to(DT)
    inputs, targets = tower_batch(12, seed=15)
    out = clipped_gradient_sum(model, BCE, inputs, targets, mask=torch.zeros(12, dtype=DT), clipping_norm=1.0,
                               unit_rows=4)
    assert torch.equal(out["norms"], torch.zeros(3, dtype=DT)) and int(out["clipped"]) == 0
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())


def test_unit_of_one_real_row_is_that_example():
    """A block with a single real row is clipped exactly as that example alone (K = 1), to rounding."""
    torch.manual_seed(16)
    model = build_model("mlp", **SHAPE, **SMALL["mlp"]).to(DT)
    inputs, targets = tower_batch(6, seed=17)
    spread = tuple(torch.stack([x, x], 1).flatten(0, 1) for x in inputs)   # each row twice: [x0, x0, x1, x1, ...]
    mask = torch.tensor([1.0, 0.0] * 6, dtype=DT)
    one = clipped_gradient_sum(model, BCE, inputs, targets, mask=torch.ones(6, dtype=DT), clipping_norm=0.05)
    want = [p.grad.clone() for p in model.parameters()]
    two = clipped_gradient_sum(model, BCE, spread, targets.repeat_interleave(2), mask=mask, clipping_norm=0.05,
                               unit_rows=2)
    torch.testing.assert_close(two["norms"], one["norms"], rtol=RTOL, atol=0)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=RTOL, atol=1e-15)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_unit_rows_one_is_the_example_level_call_bit_for_bit(kind):
    """K = 1 takes the example-level code path: fractional weights, padding and the fallback included."""
    torch.manual_seed(18)
    model = build_model(kind, **SHAPE, **SMALL[kind]).to(torch.float32)
    inputs, targets = tower_batch(16, seed=19)
    inputs = tuple(x.float() if x.is_floating_point() else x for x in inputs)
    mask = torch.ones(16)
    mask[[3, 9]] = 0
    mask[5] = 0.5
    results = []
    for extra in ({}, {"unit_rows": 1}):
        out = clipped_gradient_sum(model, BCE, inputs, targets.float(), mask=mask, clipping_norm=0.02, **extra)
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = results
    assert all(torch.equal(a[key], b[key]) for key in ("norms", "clipped", "loss_sum"))
    assert all(torch.equal(x, y) for x, y in zip(ga, gb))


@pytest.mark.parametrize("value, message", [
    (0, "unit_rows must be an integer >= 1, got 0"),
    (-2, "unit_rows must be an integer >= 1, got -2"),
    (4, "unit_rows must divide the batch's 18 rows, got 4"),
    (3.0, "unit_rows must be an integer >= 1, got 3.0"),
    (True, "unit_rows must be an integer >= 1, got True"),
    ("3", "unit_rows must be an integer >= 1, got '3'"),
])
def test_bad_unit_rows(value, message):
    model = nn.Linear(2, 1).to(DT)
    with pytest.raises(InvalidParameterError) as err:
        clipped_gradient_sum(model, mse, (torch.randn(ROWS, 2, dtype=DT),), torch.randn(ROWS, 1, dtype=DT),
                             mask=torch.ones(ROWS, dtype=DT), clipping_norm=1.0, unit_rows=value)
    assert str(err.value) == message and "\n" not in str(err.value)
    assert model.weight.grad is None
