"""The clipped gradient sum against its definition: a loop of per-example backward passes.

Every check is in float64 against an independent reference (one ``autograd.grad`` per real
example, clipped and summed in Python), so the tolerances are rounding, not approximation.
"""

from __future__ import annotations

import functools
import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from budgetplan.errors import InvalidParameterError, UnsupportedError
from trainers.clipping import clipped_gradient_sum
from trainers.losses import bce, rr_unbiased_loss
from trainers.models import build_model

DT = torch.float64
LOSS = functools.partial(bce, reduction="none")
SMALL = {"mlp": {"embedding_dim": 3, "tower_hidden": 7, "common_hidden": (6, 5)}, "fm": {"embedding_dim": 3}}
SHAPE = {"ns_vocab": 11, "n_ns_cat": 3, "n_ns_num": 2, "s_vocab": 9, "n_s_cat": 2, "n_s_num": 2}
RTOL = 1e-9


def make(kind, shape=SHAPE, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model(kind, **shape, **{**SMALL[kind], **overrides}).to(DT)


def batch(shape=SHAPE, rows=10, real=7, seed=1):
    """(inputs, targets, mask) of ``rows`` rows, the last ``rows - real`` of them padding."""
    g = torch.Generator().manual_seed(seed)
    inputs = (torch.randint(0, shape["ns_vocab"], (rows, shape["n_ns_cat"]), generator=g),
              torch.randn(rows, shape["n_ns_num"], generator=g, dtype=DT),
              torch.randint(0, shape["s_vocab"], (rows, shape["n_s_cat"]), generator=g),
              torch.randn(rows, shape["n_s_num"], generator=g, dtype=DT))
    targets = torch.randint(0, 2, (rows,), generator=g).to(DT)
    mask = torch.zeros(rows, dtype=DT)
    mask[:real] = 1
    return inputs, targets, mask


def forward(model, xs, truncated):
    return model.forward_truncated(*xs[:2]) if truncated else model(*xs)


def loop(model, loss_fn, inputs, targets, mask, clipping_norm, params, truncated=False):
    """The definition: each real row's gradient by its own backward pass, clipped, summed."""
    total = [torch.zeros_like(p) for p in params]
    norms = torch.zeros(len(mask), dtype=DT)
    for i in range(len(mask)):
        if mask[i] == 0:
            continue
        loss = loss_fn(forward(model, tuple(x[i:i + 1] for x in inputs), truncated), targets[i:i + 1]).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        norms[i] = torch.sqrt(sum(g.square().sum() for g in grads))
        factor = mask[i] * min(1.0, clipping_norm / float(norms[i]))
        for t, g in zip(total, grads):
            t += factor * g
    return total, norms


def ours(model, inputs, targets, mask, clipping_norm, params=None, truncated=False, loss_fn=LOSS):
    for p in model.parameters():
        p.grad = None
    out = clipped_gradient_sum(model, loss_fn, inputs, targets, mask=mask, clipping_norm=clipping_norm,
                               parameters=params, truncated=truncated)
    return out, [p.grad for p in (params if params is not None else model.parameters())]


def assert_close_lists(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g is not None and g.shape == w.shape and g.dtype == w.dtype
        scale = max(float(w.abs().max()), 1e-12)
        assert torch.allclose(g, w, rtol=RTOL, atol=RTOL * scale), (g - w).abs().max()


def check_against_loop(model, inputs, targets, mask, params=None, truncated=False, quantile=0.5, loss_fn=LOSS):
    """Compare with the loop at C = the given quantile of the true norms (some rows clipped, some not)."""
    plist = params if params is not None else [p for p in model.parameters() if p.requires_grad]
    _, true_norms = loop(model, loss_fn, inputs, targets, mask, 1e300, plist, truncated)
    real = mask != 0
    # Just above a quantile, so that no norm sits on the boundary to within rounding.
    c = float(torch.quantile(true_norms[real], quantile)) * (1 + 1e-6)
    want, want_norms = loop(model, loss_fn, inputs, targets, mask, c, plist, truncated)
    out, _ = ours(model, inputs, targets, mask, c, params, truncated, loss_fn)
    assert_close_lists([p.grad for p in plist], want)
    assert torch.allclose(out["norms"], want_norms, rtol=RTOL, atol=0)
    assert int(out["clipped"]) == int((want_norms[real] > c).sum())
    losses = loss_fn(forward(model, inputs, truncated), targets)
    assert torch.allclose(out["loss_sum"], losses[real].sum(), rtol=RTOL)
    return out


@pytest.mark.parametrize("kind", ["mlp", "fm"])
@pytest.mark.parametrize("truncated", [False, True])
@pytest.mark.parametrize("quantile", [0.0, 0.5, 1.0])
def test_matches_per_example_loop(kind, truncated, quantile):
    model = make(kind)
    check_against_loop(model, *batch(), truncated=truncated, quantile=quantile)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_embedding_norms_in_blocks_of_rows_match_loop(kind, monkeypatch):
    """The masked Gram matrices are taken a block of rows at a time: blocks of 3 (the last one short) change nothing."""
    from trainers import clipping

    monkeypatch.setattr(clipping, "_GRAM_ROWS", 3)
    check_against_loop(make(kind), *batch(), quantile=0.5)


def test_repeating_rows_are_the_rows_holding_an_id_twice():
    """Against a set per row, on small vocabularies (repeats at every distance, the first and last column included)."""
    from trainers.clipping import _repeating_rows

    g = torch.Generator().manual_seed(3)
    for lookups, vocab in [(2, 3), (4, 9), (6, 40), (13, 60)]:
        ids = torch.randint(0, vocab, (300, lookups), generator=g)
        want = [i for i, row in enumerate(ids.tolist()) if len(set(row)) < lookups]
        assert 0 < len(want) < 300
        assert _repeating_rows(ids).tolist() == want
    ends = torch.tensor([[5, 1, 2, 5], [5, 1, 2, 3]])  # equal only at distance 3
    assert _repeating_rows(ends).tolist() == [0]


@pytest.mark.parametrize("gram_everywhere", [False, True])
def test_rows_with_distinct_ids_skip_the_gram_and_match_loop(gram_everywhere, monkeypatch):
    """On the CPU only the rows that repeat an id take the masked Gram matrix (the others are a norm of
    their lookups); the Gram for every row (the GPU route) gives the same norms and sums."""
    from trainers import clipping

    if gram_everywhere:
        monkeypatch.setattr(clipping, "_SKIP_DISTINCT_ROWS", frozenset())
    seen, real_gram = [], clipping._masked_gram_norms

    def spy(g, ids):
        seen.append(ids.clone())
        return real_gram(g, ids)

    monkeypatch.setattr(clipping, "_masked_gram_norms", spy)
    shape = {**SHAPE, "n_ns_cat": 4}
    inputs, targets, mask = batch(shape, rows=8, real=7)
    ns_cat = torch.tensor([[0, 1, 2, 3], [4, 4, 5, 6], [7, 8, 9, 7], [1, 1, 1, 2], [3, 5, 7, 9], [2, 6, 2, 6],
                           [10, 9, 8, 10], [0, 0, 0, 0]])
    s_cat = torch.tensor([[1, 2], [3, 3], [4, 5], [6, 7], [8, 8], [0, 1], [2, 3], [4, 4]])
    inputs = (ns_cat, inputs[1], s_cat, inputs[3])
    check_against_loop(make("mlp", shape), inputs, targets, mask, quantile=0.5)
    rows = sorted(tuple(row) for ids in seen for row in ids.tolist())
    if gram_everywhere:
        assert len(rows) == 2 * 8  # both tables, every row
    else:  # only the rows that repeat an id: ns rows 1, 2, 3, 5, 6, 7 and s rows 1, 4, 7
        assert rows == sorted(map(tuple, ns_cat[[1, 2, 3, 5, 6, 7]].tolist() + s_cat[[1, 4, 7]].tolist()))


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["mlp", "fm"]), truncated=st.booleans(), seed=st.integers(0, 10_000),
       n_ns_cat=st.integers(0, 4), n_ns_num=st.integers(0, 3), n_s_cat=st.integers(0, 4), n_s_num=st.integers(0, 3),
       vocab=st.integers(1, 6), rows=st.integers(1, 9))
def test_random_shapes_match_loop(kind, truncated, seed, n_ns_cat, n_ns_num, n_s_cat, n_s_num, vocab, rows):
    """Tiny vocabularies make repeated ids within an example the common case."""
    shape = {"ns_vocab": vocab, "n_ns_cat": n_ns_cat, "n_ns_num": n_ns_num, "s_vocab": vocab + 1,
             "n_s_cat": n_s_cat, "n_s_num": n_s_num}
    if n_ns_cat + n_ns_num + n_s_cat + n_s_num == 0 or (truncated and n_ns_cat + n_ns_num == 0):
        shape["n_ns_num"] = 1
    model = make(kind, shape, seed=seed)
    inputs, targets, mask = batch(shape, rows=rows + 2, real=rows, seed=seed)
    check_against_loop(model, inputs, targets, mask, truncated=truncated)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
@pytest.mark.parametrize("truncated", [False, True])
def test_no_clipping_is_the_plain_gradient(kind, truncated):
    model = make(kind)
    inputs, targets, mask = batch()
    objective = torch.where(mask != 0, LOSS(forward(model, inputs, truncated), targets), 0).sum()
    params = list(model.parameters())
    plain = torch.autograd.grad(objective, params, allow_unused=True)
    # Parameters the truncated model never reaches: None in plain autograd, an exact zero here.
    plain = [torch.zeros_like(p) if g is None else g for p, g in zip(params, plain)]
    out, got = ours(model, inputs, targets, mask, 1e30, truncated=truncated)
    assert_close_lists(got, plain)
    assert int(out["clipped"]) == 0


@pytest.mark.parametrize("kind", ["mlp", "fm"])
@pytest.mark.parametrize("truncated", [False, True])
def test_padded_rows_contribute_exactly_zero(kind, truncated):
    model = make(kind)
    inputs, targets, mask = batch(rows=12, real=8)
    out, grads = ours(model, inputs, targets, mask, 0.05, truncated=truncated)
    grads = [g.clone() for g in grads]
    assert torch.equal(out["norms"][8:], torch.zeros(4, dtype=DT))
    assert (out["norms"][:8] > 0).all()

    g = torch.Generator().manual_seed(99)
    changed = tuple(x.clone() for x in inputs)
    changed[0][8:] = torch.randint(0, SHAPE["ns_vocab"], changed[0][8:].shape, generator=g)
    changed[1][8:] = 1e3 * torch.randn(changed[1][8:].shape, generator=g, dtype=DT)
    changed[2][8:] = torch.randint(0, SHAPE["s_vocab"], changed[2][8:].shape, generator=g)
    changed[3][8:] = -1e3 * torch.randn(changed[3][8:].shape, generator=g, dtype=DT)
    targets2 = targets.clone()
    targets2[8:] = 1 - targets2[8:]
    out2, grads2 = ours(model, changed, targets2, mask, 0.05, truncated=truncated)
    for a, b in zip(grads, grads2):
        assert torch.equal(a, b)
    for key in ("norms", "clipped", "loss_sum"):
        assert torch.equal(out[key], out2[key])


def test_all_padding_gives_zero_gradients():
    model = make("mlp")
    inputs, targets, mask = batch(rows=5, real=0)
    out, grads = ours(model, inputs, targets, mask, 1.0)
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert float(out["loss_sum"]) == 0.0 and int(out["clipped"]) == 0


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_shared_table_ids_are_deduplicated(kind):
    """Example 0 looks up id 4 in all three non-sensitive columns; example 1 twice, plus a sensitive repeat."""
    model = make(kind)
    inputs, targets, mask = batch(rows=4, real=4)
    inputs[0][0] = torch.tensor([4, 4, 4])
    inputs[0][1] = torch.tensor([2, 7, 2])
    inputs[2][1] = torch.tensor([5, 5])
    check_against_loop(model, inputs, targets, mask, quantile=1.0)

    # The table alone: its gradient for example 0 is one row, the sum of three output-gradient
    # rows, whose norm is not the norm of the three rows side by side.
    table = model.ns_embedding
    _, want = loop(model, LOSS, inputs, targets, mask, 1e300, [table.weight])
    out, _ = ours(model, inputs, targets, mask, 1e30, params=[table.weight])
    assert torch.allclose(out["norms"], want, rtol=RTOL)
    seen = []
    handle = table.register_forward_hook(lambda m, a, o: seen.append(o))
    loss0 = LOSS(model(*(x[:1] for x in inputs)), targets[:1]).sum()
    handle.remove()
    (rows,) = torch.autograd.grad(loss0, seen)
    assert torch.allclose(want[0], rows[0].sum(0).norm(), rtol=RTOL)
    assert abs(float(rows.norm() - want[0])) > 1e-3 * float(want[0])


@pytest.mark.parametrize("kind", ["mlp", "fm"])
@pytest.mark.parametrize("how", ["requires_grad", "parameters"])
def test_frozen_parameters_get_nothing_and_do_not_count(kind, how):
    """Hybrid's second phase: the non-sensitive tower frozen, the rest trained."""
    model = make(kind)
    frozen = model.nonsensitive_parameters()
    trainable = [p for p in model.parameters() if all(p is not f for f in frozen)]
    if how == "requires_grad":
        for p in frozen:
            p.requires_grad_(False)
        params = None
    else:
        params = trainable
    inputs, targets, mask = batch()
    check_against_loop(model, inputs, targets, mask, params=trainable if params else None)
    assert all(p.grad is None for p in frozen)
    ours(model, inputs, targets, mask, 0.1, params=params)
    assert all(p.grad is None for p in frozen)


def test_no_reference_to_activations_survives():
    model = make("mlp")
    inputs, targets, mask = batch()
    kept = []
    handle = model.common[0].register_forward_hook(lambda m, a, o: kept.append(weakref.ref(a[0])))
    clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=0.1)
    handle.remove()
    gc.collect()
    assert len(kept) == 1 and kept[0]() is None


def test_grad_is_replaced_not_accumulated():
    model = make("mlp")
    inputs, targets, mask = batch()
    clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=0.1)
    first = [p.grad.clone() for p in model.parameters()]
    clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=0.1)
    assert all(torch.equal(a, p.grad) for a, p in zip(first, model.parameters()))


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_accumulate_adds_into_the_existing_buffers(kind):
    """accumulate=True: the same sum, added into each .grad in place (the DP-SGD noise buffers), no new tensor."""
    model = make(kind)
    inputs, targets, mask = batch()
    _, alone = ours(model, inputs, targets, mask, 0.1)
    alone = [g.clone() for g in alone]
    g = torch.Generator().manual_seed(7)
    start = [torch.randn(p.shape, generator=g, dtype=DT) for p in model.parameters()]
    buffers = [s.clone() for s in start]
    for p, b in zip(model.parameters(), buffers):
        p.grad = b
    clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=0.1, accumulate=True)
    for p, b, s, a in zip(model.parameters(), buffers, start, alone):
        assert p.grad is b
        assert torch.allclose(b, s + a, rtol=RTOL, atol=RTOL)


class SharedGradient(nn.Module):
    """Outputs whose gradients autograd shares: two layers summed (one tensor for both), a summed output (stride 0).

    In-place scaling of one layer's output gradient would then scale another's too: the
    book-keeping must copy those.
    """

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.left = nn.Linear(6, 4)
        self.right = nn.Linear(6, 4)
        self.wide = nn.Linear(6, 5)
        self.head = nn.Linear(4, 1)

    def forward(self, cat, num):
        z = self.emb(cat).flatten(1)
        h = torch.tanh(self.left(z) + self.right(z))           # one gradient tensor for both outputs
        return self.head(h).squeeze(-1) + self.wide(z).sum(1) + num[:, 0]  # wide: an expanded gradient


class SlicedEmbedding(nn.Module):
    """An Embedding whose output is concatenated with another tensor: its gradient is a non-contiguous slice."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.head = nn.Linear(2 + 3 * 2, 1)

    def forward(self, cat, num):
        return self.head(torch.tanh(torch.cat([num, self.emb(cat).flatten(1)], dim=1))).squeeze(-1)


@pytest.mark.parametrize("quantile", [0.3, 1.0])
def test_shared_output_gradients_are_not_scaled_twice(quantile):
    torch.manual_seed(0)
    model = SharedGradient().to(DT)
    (cat, num), targets, mask = custom_batch(seq=2)
    seen = []
    model.left.register_forward_hook(lambda m, a, o: seen.append(o))
    model.right.register_forward_hook(lambda m, a, o: seen.append(o))
    check_against_loop(model, (cat, num), targets, mask, quantile=quantile)
    # the premise: autograd hands the two outputs one gradient tensor
    g = torch.autograd.grad(model(cat, num).sum(), seen[-2:])
    assert g[0].data_ptr() == g[1].data_ptr()


@pytest.mark.parametrize("quantile", [0.3, 1.0])
def test_embedding_segment_sum_of_a_non_contiguous_gradient(quantile):
    """The table gradient from a sliced output gradient (added one lookup column at a time) against the loop."""
    torch.manual_seed(0)
    model = SlicedEmbedding().to(DT)
    (cat, num), targets, mask = custom_batch(seq=2)
    contiguous = []

    def record(module, args, out):
        if out.shape[0] > 1:  # our batch call, not the reference's one-row calls
            out.register_hook(lambda g: contiguous.append(g.is_contiguous()))

    model.emb.register_forward_hook(record)
    check_against_loop(model, (cat, num), targets, mask, quantile=quantile)
    assert contiguous and not any(contiguous)  # the premise: the per-column path ran


def test_per_example_loss_with_per_row_tensors():
    """A loss closing over a [P] tensor (per-example RR flip probabilities) is only ever called batched."""
    model = make("fm")
    inputs, targets, mask = batch()
    rho = torch.linspace(0.0, 0.3, len(mask), dtype=DT)
    loss_fn = functools.partial(rr_unbiased_loss, flip_probability=rho, reduction="none")

    def rows_loss(i):
        return functools.partial(rr_unbiased_loss, flip_probability=rho[i], reduction="none")

    params = list(model.parameters())
    want = [torch.zeros_like(p) for p in params]
    for i in range(int(mask.sum())):
        xs = tuple(x[i:i + 1] for x in inputs)
        gi = torch.autograd.grad(rows_loss(i)(model(*xs), targets[i:i + 1]).sum(), params)
        factor = min(1.0, 0.05 / float(torch.sqrt(sum(g.square().sum() for g in gi))))
        for w, g in zip(want, gi):
            w += factor * g
    _, got = ours(model, inputs, targets, mask, 0.05, loss_fn=loss_fn)
    assert_close_lists(got, want)


# Custom models: the fallback, 3-D Linear inputs, reused layers, padding_idx.

class BareParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.lin = nn.Linear(3 * 2 + 2, 4)
        self.scale = nn.Parameter(torch.randn(4))
        self.head = nn.Linear(4, 1)

    def forward(self, cat, num):
        z = torch.cat([self.emb(cat).flatten(1), num], dim=1)
        return self.head(torch.tanh(self.lin(z)) * self.scale).squeeze(-1)


class WithLayerNorm(BareParameter):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, cat, num):
        z = torch.cat([self.emb(cat).flatten(1), num], dim=1)
        return self.head(self.norm(self.lin(z))).squeeze(-1)


class Sequence(nn.Module):
    """A Linear on [B, T, d], called twice (T = 8 rows per example), and an Embedding with padding_idx.

    ``wide``: 3 x 24 >= T^2, so the Gram-matrix (ghost) norm; narrow: 3 x 1 < T^2, so the
    per-example gradient of that layer itself.
    """

    def __init__(self, wide: bool):
        super().__init__()
        self.emb = nn.Embedding(8, 3, padding_idx=0)
        self.proj = nn.Linear(3, 24 if wide else 1)
        self.head = nn.Linear(24 if wide else 1, 1)

    def forward(self, cat, num):
        h = torch.relu(self.proj(self.emb(cat)))               # [B, T, d]
        h = h + self.proj(self.emb(cat.flip(1)))               # the same two layers again
        return self.head(h.mean(1)).squeeze(-1) + self.head(num[:, :1].expand(-1, self.head.in_features)).squeeze(-1)


class DirectWeight(nn.Module):
    """A Linear whose weight is read with F.linear, never by calling the layer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3)
        self.lin = nn.Linear(3, 2)
        self.unused = nn.Linear(2, 2)
        self.ignored = nn.Linear(2, 2)
        self.head = nn.Linear(2, 1)

    def forward(self, cat, num):
        h = torch.tanh(F.linear(self.emb(cat).sum(1), self.lin.weight, self.lin.bias))
        self.ignored(h)                                        # called, output discarded
        return self.head(h + num[:, :2]).squeeze(-1)


def custom_batch(rows=9, real=6, seq=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    cat = torch.randint(0, 6, (rows, seq), generator=g)
    cat[0, :2] = 0                                             # the padding_idx of Sequence
    num = torch.randn(rows, 2, generator=g, dtype=DT)
    targets = torch.randint(0, 2, (rows,), generator=g).to(DT)
    mask = torch.zeros(rows, dtype=DT)
    mask[:real] = 1
    return (cat, num), targets, mask


@pytest.mark.parametrize("model_cls", [BareParameter, WithLayerNorm, DirectWeight,
                                       functools.partial(Sequence, wide=True), functools.partial(Sequence, wide=False)])
@pytest.mark.parametrize("quantile", [0.3, 1.0])
def test_custom_models_match_loop(model_cls, quantile):
    torch.manual_seed(0)
    model = model_cls().to(DT)
    (cat, num), targets, mask = custom_batch(seq=2 if model_cls in (BareParameter, WithLayerNorm) else 4)
    check_against_loop(model, (cat, num), targets, mask, quantile=quantile)
    if isinstance(model, DirectWeight):
        for p in (*model.unused.parameters(), *model.ignored.parameters()):
            assert torch.equal(p.grad, torch.zeros_like(p))


def test_fallback_with_frozen_layers():
    torch.manual_seed(0)
    model = WithLayerNorm().to(DT)
    params = [model.scale, model.norm.weight, model.head.bias]
    check_against_loop(model, *custom_batch(seq=2), params=params)
    assert model.lin.weight.grad is None and model.emb.weight.grad is None


def test_unreached_parameters_get_exact_zeros():
    """Nothing trainable on the loss's path: the truncated model with only the sensitive table trained."""
    model = make("mlp")
    for p in model.parameters():
        p.requires_grad_(p is model.s_embedding.weight)
    model.register_parameter("extra", nn.Parameter(torch.ones(3, dtype=DT)))   # a never-used fallback parameter
    inputs, targets, mask = batch()
    out = clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0, truncated=True)
    assert torch.equal(model.s_embedding.weight.grad, torch.zeros_like(model.s_embedding.weight))
    assert torch.equal(model.extra.grad, torch.zeros(3, dtype=DT))
    assert torch.equal(out["norms"], torch.zeros(len(mask), dtype=DT))


class SharedRow(nn.Module):
    """A Linear applied to one row shared by the whole batch: not a per-example computation."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        return (x + self.lin(torch.ones(1, 2, dtype=x.dtype))).squeeze(-1)


def test_layer_without_example_dimension_is_refused():
    model = SharedRow().to(DT)
    x = torch.randn(4, 1, dtype=DT)
    with pytest.raises(UnsupportedError, match="dimension 0"):
        clipped_gradient_sum(model, LOSS, (x,), torch.ones(4, dtype=DT), mask=torch.ones(4, dtype=DT),
                             clipping_norm=1.0)
    assert hook_count(model) == 0


# Hooks, errors, validation.

def hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_hooks_are_removed_and_user_hooks_kept():
    model = make("mlp")
    seen = []
    model.head.register_forward_hook(lambda m, a, o: seen.append(o.shape))
    before = hook_count(model)
    inputs, targets, mask = batch()
    clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0)
    assert hook_count(model) == before == 1 and len(seen) == 1


def test_user_hook_replacing_a_layer_output():
    """The gradient that matters is the layer's own output's, not the hook's replacement's."""
    model = make("mlp")
    model.common[0].register_forward_hook(lambda m, a, o: 3 * o)
    check_against_loop(model, *batch())


def test_hooks_are_removed_when_loss_fn_raises():
    model = make("fm")
    inputs, targets, mask = batch()

    def broken(logits, targets):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        clipped_gradient_sum(model, broken, inputs, targets, mask=mask, clipping_norm=1.0)
    assert hook_count(model) == 0
    assert all(p.grad is None for p in model.parameters())


def test_hooks_are_removed_when_forward_raises():
    model = make("mlp")
    inputs, targets, mask = batch()
    bad = (inputs[0][:, :1], *inputs[1:])                     # wrong column count
    with pytest.raises(InvalidParameterError):
        clipped_gradient_sum(model, LOSS, bad, targets, mask=mask, clipping_norm=1.0)
    assert hook_count(model) == 0


def test_in_place_op_on_a_layer_output_is_refused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 1), nn.Flatten(0)).to(DT)
    x = torch.randn(5, 3, dtype=DT)
    with pytest.raises(UnsupportedError, match="in place"):
        clipped_gradient_sum(model, LOSS, (x,), torch.ones(5, dtype=DT), mask=torch.ones(5, dtype=DT),
                             clipping_norm=1.0)
    assert hook_count(model) == 0


def test_sequential_model_without_in_place_ops():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1), nn.Flatten(0)).to(DT)
    x = torch.randn(6, 3, dtype=DT)
    targets = torch.tensor([0, 1, 1, 0, 1, 0], dtype=DT)
    check_against_loop(model, (x,), targets, torch.tensor([1, 1, 1, 1, 0, 0], dtype=DT))


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "1"])
def test_bad_clipping_norm(value):
    model = make("mlp")
    inputs, targets, mask = batch()
    with pytest.raises(InvalidParameterError, match="clipping_norm"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=value)


def test_bad_parameters_and_loss_shape():
    model = make("mlp")
    inputs, targets, mask = batch()
    with pytest.raises(InvalidParameterError, match="not a parameter"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0,
                             parameters=[nn.Parameter(torch.zeros(2))])
    model.head.bias.requires_grad_(False)
    with pytest.raises(InvalidParameterError, match="head.bias"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0,
                             parameters=[model.head.bias])
    with pytest.raises(InvalidParameterError, match="one loss per row"):
        clipped_gradient_sum(model, bce, inputs, targets, mask=mask, clipping_norm=1.0)
    with pytest.raises(InvalidParameterError, match="mask"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask[None], clipping_norm=1.0)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(InvalidParameterError, match="no trainable"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0)


def test_autograd_disabled_is_refused():
    model = make("mlp")
    inputs, targets, mask = batch()
    with torch.no_grad(), pytest.raises(UnsupportedError, match="autograd"):
        clipped_gradient_sum(model, LOSS, inputs, targets, mask=mask, clipping_norm=1.0)


def test_scale_grad_by_freq_is_refused():
    model = nn.Sequential(nn.Embedding(5, 1, scale_grad_by_freq=True), nn.Flatten(0))
    with pytest.raises(UnsupportedError, match="scale_grad_by_freq"):
        clipped_gradient_sum(model, LOSS, (torch.arange(3),), torch.ones(3), mask=torch.ones(3), clipping_norm=1.0)


def test_float32_default():
    model = build_model("mlp", **SHAPE, **SMALL["mlp"])
    inputs, targets, mask = batch()
    inputs = (inputs[0], inputs[1].float(), inputs[2], inputs[3].float())
    out = clipped_gradient_sum(model, LOSS, inputs, targets.float(), mask=mask.float(), clipping_norm=0.1)
    assert out["norms"].dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 and p.grad.shape == p.shape for p in model.parameters())


def _contribution_norms(model, inputs, targets, c):
    """Each row alone through the clipping code (float32); its contribution's norm measured in float64."""
    out = []
    for i in range(targets.shape[0]):
        row = tuple(x[i:i + 1] for x in inputs)
        clipped_gradient_sum(model, LOSS, row, targets[i:i + 1], mask=torch.ones(1), clipping_norm=float(c[i]))
        out.append(float(torch.sqrt(sum(p.grad.double().square().sum() for p in model.parameters()))))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("margin_ulps, holds", [(None, True), (0, False)])
def test_float32_contributions_never_exceed_c(monkeypatch, margin_ulps, holds):
    """At C equal to the computed norm (the boundary), float32 rounding must not push a contribution past C.

    With the margin switched off the same measurement finds contributions above C: the test
    can fail, and the margin is what makes it pass.
    """
    import trainers.clipping as clipping

    if margin_ulps is not None:
        monkeypatch.setattr(clipping, "CLIP_MARGIN_ULPS", margin_ulps)
    model = build_model("mlp", **SHAPE, **SMALL["mlp"])
    inputs, targets, _ = batch(rows=64, real=64, seed=3)
    inputs = (inputs[0], inputs[1].float(), inputs[2], inputs[3].float())
    targets = targets.float()
    norms = clipped_gradient_sum(model, LOSS, inputs, targets, mask=torch.ones(64), clipping_norm=1e30)["norms"]
    worst = 0.0
    for scale in (1.0, 1 - 2**-24, 1 + 2**-24, 0.5):
        c = (norms.double() * scale).float().double()  # C exactly representable, on or next to the boundary
        worst = max(worst, float((_contribution_norms(model, inputs, targets, c) / c).max()))
    assert (worst <= 1.0) == holds, worst
