"""DP-SGD's clipped gradient sum in one forward and one backward, without per-example gradients.

DP-SGD (Abadi et al., arXiv:1607.00133) needs ``sum_i c_i g_i`` with ``c_i = min(1, C / ||g_i||)``
for the per-example gradients ``g_i``. Materialising ``g_i`` costs a copy of the model per
example; the embedding tables alone make that impossible at useful batch sizes. Instead:

- *Ghost norms* (Goodfellow, arXiv:1510.01799; Li et al., arXiv:2110.05679): a Linear layer's
  per-example weight gradient is ``G_i^T a_i`` (output gradient times input activation), whose
  squared Frobenius norm is ``||G_i||^2 ||a_i||^2`` for one row per example and
  ``<a_i a_i^T, G_i G_i^T>`` (two T x T Gram matrices) for T rows per example. An Embedding's
  per-example gradient adds the output-gradient rows of each distinct id the example looked
  up, so its squared norm is ``sum_{l,l'} [id_l = id_l'] <G_il, G_il'>``: an L x L mask times a
  Gram matrix, which deduplicates ids shared by several columns of one table. An EmbeddingBag
  (sum or mean, per-sample weights, offsets) puts ``w_j G_b`` on each id of bag b: rows of
  equal (bag, id) are summed by a segment sum before the norm. A LayerNorm's per-example
  gradients are ``sum_t G_t * xhat_t`` and ``sum_t G_t``, from the normalised input
  recomputed from the stored input: the size of one activation row, so they are formed.
- *Book-keeping* (Bu, Mao, Xu, arXiv:2210.00038): the same stored activations and output
  gradients give the clipped sum directly, ``(c G)^T a`` for a weight, ``sum_i c_i G_i`` for a
  bias, an ``index_add`` of ``c_i G_il`` for a table. There is no second backward pass, and the
  one backward asks autograd for the layer *outputs'* gradients only, so it skips the
  weight-gradient matmuls that the book-keeping step then does once, already clipped.

User-level clipping (``unit_rows = K``, Charles et al., arXiv:2407.07737) clips the sum of a
unit's K example gradients instead: every piece above regroups its stored rows by unit (the
cross terms between a unit's rows are Gram entries or shared segment keys), and the clipped
sum is the same book-keeping with each row weighted by its unit's factor.

Parameters of any other module (a convolution, a bare ``nn.Parameter``, a Linear whose weight
is read directly rather than by calling the layer, a parameter shared by two layers) take
the fallback: per-example gradients from ``torch.func`` (``vmap`` of ``grad`` of a
``functional_call``), for those parameters only, folded into the same norms and sum. The
fallback does materialise one gradient per example for those parameters, and re-runs the
model's forward under ``vmap``; the two-tower models of ``trainers.models`` never need it.

Assumptions, all true of ``trainers.models``: dimension 0 of every layer input is the example;
example i's loss depends on the batch only through row i of the logits; a hooked layer's input
and output are not modified in place (checked); an Embedding does not scale gradients by
batch frequency (refused: that couples examples, so clipping would not bound sensitivity); no
BatchNorm in training mode, nor any norm layer updating running statistics (refused, with the
module's name: batch statistics couple examples, and running ones are un-noised releases).
"""

from __future__ import annotations

import numbers
import weakref
from collections import defaultdict
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.func import functional_call, grad, vmap

from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.util.validate import positive

__all__ = ["clipped_gradient_sum", "add_deferred", "refuse_batch_statistics"]

# Every example is scaled to at most C (1 - CLIP_MARGIN_ULPS eps), eps the machine epsilon of the
# dtype the norms are computed in (float32: 7.6e-6 relative; float64: 1.4e-14): the rounding of
# a norm summed over a model's layers, and of the scaled gradient itself, stays far inside it.
CLIP_MARGIN_ULPS = 64


class _Call(NamedTuple):
    """One forward call of a hooked layer, as the clipping step needs it after the forward.

    The output itself is not kept: the backward asks for the gradient at its autograd edge (the
    node that produced it), so a pre-activation output that nothing else reads is freed as in
    the non-private step; a weak reference is enough to check that it was not modified in place.
    """

    x: torch.Tensor
    edge: object  # torch.autograd.graph.GradientEdge of the output
    x_version: int
    out: weakref.ref
    out_version: int
    out_meta: tuple[torch.Size, torch.dtype, torch.device]
    extra: tuple  # (other positional arguments, keyword arguments)


class _Layer:
    """A trainable Linear or Embedding: which of its parameters are trained, and its forward calls.

    ``calls`` holds one ``_Call`` per call of the module during the one forward; a module called
    twice is one layer whose example rows are the rows of both calls (its per-example gradient
    is the sum over calls, cross terms included).
    """

    __slots__ = ("bias", "calls", "module", "name", "weight")

    def __init__(self, name: str, module: nn.Module):
        self.name, self.module = name, module
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None
        self.calls: list[_Call] = []

    def parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.weight, self.bias) if p is not None]

    @property
    def label(self) -> str:
        return self.name or type(self.module).__name__

    def qualified(self, attr: str) -> str:
        """The ``named_parameters()`` name of this layer's ``attr``."""
        return f"{self.name}.{attr}" if self.name else attr

    def record(self, module, args, kwargs, output):
        x = args[0] if args else kwargs["input"]
        edge = get_gradient_edge(output) if output.requires_grad else None
        self.calls.append(_Call(x, edge, x._version, weakref.ref(output), output._version,
                                (output.shape, output.dtype, output.device), (args[1:], kwargs)))

    def check_unmodified(self) -> None:
        # The input is the activation of the book-keeping, so it must still hold what the layer
        # read. The output's gradient is taken at its autograd edge, which an in-place op after
        # the layer would leave correct, but such an op (ReLU(inplace=True)) is refused all the
        # same, as before the outputs were released: an output still alive must be unmodified.
        for call in self.calls:
            out = call.out()
            if call.x._version != call.x_version or (out is not None and out._version != call.out_version):
                raise UnsupportedError(
                    f"the input or output of layer {self.label!r} was modified in place after the layer ran; "
                    "per-example norms need the layer's own output (use out-of-place ops, e.g. ReLU(inplace=False))")


def _hookable(module: nn.Module) -> bool:
    """A Linear, Embedding, EmbeddingBag (sum or mean) or LayerNorm that computes exactly what the formulas assume."""
    kind = type(module)
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and kind.forward in (nn.Embedding.forward,
                                                                                   nn.EmbeddingBag.forward):
        if module.scale_grad_by_freq:
            raise UnsupportedError(f"an nn.{kind.__name__} with scale_grad_by_freq=True scales each example's "
                                   "gradient by id counts over the whole batch, so clipping would not bound one "
                                   "example's effect")
        return not isinstance(module, nn.EmbeddingBag) or module.mode in ("sum", "mean")
    if isinstance(module, nn.LayerNorm):
        return kind.forward is nn.LayerNorm.forward
    return isinstance(module, nn.Linear) and kind.forward is nn.Linear.forward


def refuse_batch_statistics(model: nn.Module) -> None:
    """Refuse a normalisation that reads or writes statistics over the batch: no clipping bounds it.

    A BatchNorm in training mode (or without running statistics) normalises each example by
    the batch's mean and variance, so one example's gradient depends on every other row and
    its own contribution reaches the others'; any norm layer updating running statistics in
    training mode writes un-noised statistics of the private rows into the model's buffers.
    """
    for name, module in model.named_modules():
        if not isinstance(module, nn.modules.batchnorm._NormBase):
            continue
        mixes = isinstance(module, nn.modules.batchnorm._BatchNorm) and (module.training or
                                                                         not module.track_running_stats)
        if mixes or (module.training and module.track_running_stats):
            raise UnsupportedError(
                f"module {name or type(model).__name__!r} ({type(module).__name__}) "
                + ("normalises over the batch, so one example's gradient depends on the others and clipping "
                   "cannot bound it" if mixes else "updates running statistics of the private rows") +
                ": use GroupNorm or LayerNorm, or put it in eval mode with running statistics (module.eval())")


def _select(model: nn.Module, parameters) -> tuple[list[_Layer], list[tuple[str, nn.Parameter]]]:
    """(hooked layers, fallback (name, parameter) pairs) of the trainable parameters."""
    names: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    if parameters is None:
        chosen = [p for p in model.parameters() if p.requires_grad]
    else:
        chosen = list({id(p): p for p in parameters}.values())
        for p in chosen:
            if id(p) not in names:
                raise InvalidParameterError(f"parameters holds a tensor of shape {list(p.shape)} that is not a "
                                            f"parameter of the {type(model).__name__}")
            if not p.requires_grad:
                raise InvalidParameterError(f"parameter {names[id(p)]!r} is listed as trainable but has "
                                            "requires_grad=False")
    if not chosen:
        raise InvalidParameterError(f"the {type(model).__name__} has no trainable parameters, got 0")
    refuse_batch_statistics(model)

    owners = defaultdict(list)
    for mname, module in model.named_modules():
        for attr, p in module.named_parameters(recurse=False):
            owners[id(p)].append((mname, module, attr))
    layers: dict[int, _Layer] = {}
    fallback = []
    for p in chosen:
        own = owners[id(p)]
        # A parameter owned by two modules (tied weights) has cross terms between them that
        # no single layer sees: the fallback handles it.
        if len(own) == 1 and own[0][2] in ("weight", "bias") and _hookable(own[0][1]):
            mname, module, attr = own[0]
            layer = layers.setdefault(id(module), _Layer(mname, module))
            setattr(layer, attr, p)
        else:
            fallback.append((names[id(p)], p))
    return list(layers.values()), fallback


class _Entry(nn.Module):
    """``model.forward`` or ``model.forward_truncated`` as a module's forward, for ``functional_call``."""

    def __init__(self, model: nn.Module, truncated: bool):
        super().__init__()
        self.model, self.truncated = model, truncated

    def forward(self, *xs):
        return self.model.forward_truncated(*xs) if self.truncated else self.model(*xs)


def _fallback_gradients(model, named: list[tuple[str, nn.Parameter]], xs: tuple, dlogits: torch.Tensor,
                        truncated: bool) -> list[torch.Tensor]:
    """Per-example gradients [P, *shape] of the ``named`` parameters (materialised: fallback only).

    Example i's gradient is the vector-Jacobian product of its logits with ``dlogits[i]``, the
    loss gradient the main backward already computed, so ``loss_fn`` is never run under vmap
    (it may close over per-batch tensors that vmap would misalign).
    """
    entry = _Entry(model, truncated)
    theta = {"model." + name: p.detach() for name, p in named}

    def weighted_logits(params, u, *x):
        out = functional_call(entry, params, tuple(t.unsqueeze(0) for t in x))
        return (out * u.unsqueeze(0)).sum()

    # Outside autograd: vmap(grad) differentiates only theta, and the outer graph would only
    # hold on to memory.
    with torch.no_grad():
        per = vmap(grad(weighted_logits), in_dims=(None, 0) + (0,) * len(xs))(theta, dlogits, *xs)
    return [per["model." + name] for name, _ in named]


def _rows(t: torch.Tensor, batch: int, trailing: int, layer: _Layer) -> torch.Tensor:
    """``t`` as [P, T, *trailing dims]: the rows each example fed through the layer."""
    if t.dim() < 1 + trailing or t.shape[0] != batch:
        raise UnsupportedError(f"layer {layer.label!r} ran on a tensor of shape {list(t.shape)}; per-example "
                               f"gradients need dimension 0 to be the example (batch of {batch})")
    return t.reshape(batch, -1, *t.shape[t.dim() - trailing:]) if trailing else t.reshape(batch, -1)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """The rows of all calls of a layer side by side; no copy for the usual single call."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class _LinearPieces:
    """A Linear layer's activations a [P, T, d_in] and output gradients G [P, T, d_out]."""

    def __init__(self, layer: _Layer, grads: list[torch.Tensor], batch: int, dtype: torch.dtype, owned):
        self.layer = layer
        xs = [x for x, *_ in layer.calls]
        if len(xs) == 1 and xs[0].dim() == 2 and xs[0].shape[0] == batch:
            self.a, self.g = xs[0].to(dtype), grads[0].to(dtype)
        else:
            self.a = _cat([_rows(x, batch, 1, layer) for x in xs]).to(dtype)
            self.g = _cat([_rows(g, batch, 1, layer) for g in grads]).to(dtype)
        self.owned = owned(self.g)

    def squared_norms(self, unit_rows: int = 1) -> torch.Tensor:
        a, g, layer = self.a, self.g, self.layer
        if unit_rows > 1:
            # A unit's gradient is G_u^T a_u over all its examples' rows: the T-row formula on
            # K T rows (consecutive examples are consecutive rows).
            a = a.reshape(a.shape[0] // unit_rows, -1, a.shape[-1])
            g = g.reshape(g.shape[0] // unit_rows, -1, g.shape[-1])
        if a.dim() == 2:
            # vector_norm reduces without a [P, d] temporary, which at P = 16384 costs more
            # than the reduction itself.
            gg = torch.linalg.vector_norm(g, dim=1).square()
            sq = gg * torch.linalg.vector_norm(a, dim=1).square() if layer.weight is not None else 0
            return sq + gg if layer.bias is not None else sq
        sq = 0
        if layer.weight is not None:
            t, d_in, d_out = a.shape[1], a.shape[2], g.shape[2]
            if t * t <= d_in * d_out:
                # Ghost norm: ||G^T a||_F^2 = <a a^T, G G^T>, O(T^2 (d_in + d_out)) per example.
                sq = (a @ a.mT).mul_(g @ g.mT).sum((1, 2))
            else:
                # Long sequences through a narrow layer: the gradient itself is the smaller object.
                sq = torch.linalg.vector_norm(g.mT @ a, dim=(1, 2)).square()
        if layer.bias is not None:
            sq = sq + torch.linalg.vector_norm(g.sum(1), dim=1).square()
        return sq

    def set_grads(self, c: torch.Tensor, accumulate: bool, deferred: list | None = None) -> None:
        a, g, layer = self.a, self.g, self.layer
        scale = c[:, None, None] if g.dim() == 3 else c[:, None]
        if layer.bias is not None:  # before G is scaled in place
            _deposit(layer.bias, c @ (g.sum(1) if g.dim() == 3 else g), accumulate)
        if layer.weight is None:
            return
        if self.owned:
            g = g.mul_(scale)  # the output gradient is ours and read for the last time: no copy
        elif a.shape[-1] < g.shape[-1]:
            a = a * scale  # scale whichever side is narrower: one pass over P T min(d_in, d_out) numbers
        else:
            g = g * scale
        g2, a2 = g.reshape(-1, g.shape[-1]), a.reshape(-1, a.shape[-1])
        self.g = self.a = None
        if accumulate and layer.weight.grad is not None:
            layer.weight.grad.addmm_(g2.mT, a2)  # straight into the buffer: no [d_out, d_in] temporary
        else:
            layer.weight.grad = g2.mT @ a2


def _deposit(p: torch.Tensor, value: torch.Tensor, accumulate: bool) -> None:
    """``p.grad`` := ``value`` (as p's shape and dtype), or ``p.grad += value`` when accumulating into a buffer."""
    value = value.reshape(p.shape)
    if accumulate and p.grad is not None:
        p.grad.add_(value)
    else:
        p.grad = value.to(p.dtype)


def _index_add(weight: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, accumulate: bool,
               deferred: list | None = None) -> None:
    """``weight.grad`` (+)= the table gradient that puts ``rows[j]`` on row ``ids[j]``: a segment sum, never a copy.

    Accumulating adds into the existing buffer (an earlier chunk's sum), so no zeroed table is made.
    ``ids`` [..., L] and ``rows`` [..., L, dim], contiguous (the pieces make them so): one ``index_add_``.
    With a ``deferred`` list (``clipped_gradient_sum`` allows one only when accumulating) the sum
    is appended to it instead, for :func:`add_deferred` to make after the batch's last chunk.
    """
    if deferred is not None:
        deferred.append((weight, ids, rows))
        return
    if accumulate and weight.grad is not None:
        out = weight.grad
    else:
        out = weight.grad = torch.zeros_like(weight, memory_format=torch.contiguous_format)
    out.index_add_(0, ids.reshape(-1), rows.reshape(-1, rows.shape[-1]))


def add_deferred(deferred: list) -> None:
    """Make the segment sums ``clipped_gradient_sum(deferred=...)`` put aside, in order, and empty the list."""
    for weight, ids, rows in deferred:
        _index_add(weight, ids, rows, accumulate=True)
    deferred.clear()


# Above this many lookups per unit, a unit's Embedding norm is a segment sum over (unit, id)
# rather than a masked Gram matrix: the Gram costs (K L)^2 (dim + 1) per unit, the segment sum
# about K L (dim + a sort's log). On one CPU thread (24k lookups, dim 8 and 32) the Gram was the
# faster up to K L = 16 and 2-5x slower from 32 to 64.
_GRAM_MAX_LOOKUPS = 16
# Rows per block of an Embedding's masked Gram matrices (see _masked_gram_norms).
_GRAM_ROWS = 2048
# Devices on which an Embedding's rows with distinct ids skip the Gram matrix (their norm is one
# pass over G). Measured on one CPU thread: the Gram of every row took 1.1 ms at the attribution
# shape (4,096 rows, 6 lookups of dim 8) and 12.7 ms at pCTR (16,384 rows, 13 lookups of dim 32);
# the norms plus the search for repeated ids 0.2 ms and 3.4 ms. On a GPU the search's host sync
# would stall the queue, and the batched Gram is cheap there: every row keeps it.
_SKIP_DISTINCT_ROWS = frozenset({"cpu"})


def _segment_squared_norms(owner: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, vocab: int,
                           count: int) -> torch.Tensor:
    """[count] squared norms of each owner's table gradient: its rows of equal id summed, then squared.

    ``rows[j]`` is the gradient lookup j puts on table row ``ids[j]`` for owner ``owner[j]``
    (an example or a unit); never [count, vocabulary, dim].
    """
    keys, inverse = torch.unique(owner * vocab + ids, return_inverse=True)
    groups = rows.new_zeros(keys.shape[0], rows.shape[1]).index_add_(0, inverse, rows)
    return rows.new_zeros(count).index_add_(0, keys // vocab, groups.square().sum(1))


def _masked_gram_norms(g: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[rows] squared norms of each row's table gradient from its lookups' gradients g [rows, L, dim] at ``ids``.

    Rows that looked up the same id add up before the norm is taken: keep the cross terms of
    equal ids only. [rows, L, L], never [rows, vocabulary, dim]; the Gram matrix is ours, so
    it is masked in place (a fill, not a product: no float copy of the mask). A block of
    _GRAM_ROWS rows at a time: the norms are taken while every layer's output gradients are
    held, the step's peak, where the whole [P, L, L] Gram and its mask would add 13 MiB at the
    pCTR shape (P = 16,384, L = 13).
    """
    out = g.new_empty(g.shape[0])
    for start in range(0, g.shape[0], _GRAM_ROWS):
        gs, ib = g[start:start + _GRAM_ROWS], ids[start:start + _GRAM_ROWS]
        out[start:start + _GRAM_ROWS] = (gs @ gs.mT).masked_fill_(ib.unsqueeze(2) != ib.unsqueeze(1), 0).sum((1, 2))
    return out


def _repeating_rows(ids: torch.Tensor) -> torch.Tensor:
    """The indices of the rows of ``ids`` [rows, L] that hold some id more than once, ascending.

    Column pairs at each distance s (l and l + s) compared on the transposed ids, whose rows
    are contiguous: L (L - 1) / 2 comparisons of contiguous columns, no [rows, L, L] mask.
    """
    t = ids.mT.contiguous()
    repeat = torch.cat([t[s:] == t[:-s] for s in range(1, t.shape[0])]).any(0)
    return repeat.nonzero().view(-1)


class _EmbeddingPieces:
    """An Embedding's looked-up ids [P, L] and output gradients G [P, L, dim]."""

    def __init__(self, layer: _Layer, grads: list[torch.Tensor], batch: int, dtype: torch.dtype, owned):
        self.layer = layer
        self.ids = _cat([_rows(x, batch, 0, layer) for x, *_ in layer.calls])
        g = _cat([_rows(g, batch, 1, layer) for g in grads]).to(dtype)
        pad = layer.module.padding_idx
        if pad is not None:
            # The padding row gets no gradient in torch's own embedding backward either.
            g = torch.where((self.ids == pad).unsqueeze(-1), 0, g)
        if not g.is_contiguous():
            # A lookup's gradient is often a slice of a wider one (the table's output concatenated
            # with other features): one copy of the slice frees the wide buffer, and the norms and
            # the segment sum then read contiguous rows (one index_add, not one per lookup column).
            g = g.contiguous()
        self.g = g
        self.owned = owned(g)

    def squared_norms(self, unit_rows: int = 1) -> torch.Tensor:
        g, ids = self.g, self.ids
        if unit_rows > 1:  # a unit's lookups side by side: equal ids of two of its examples add up too
            ids = ids.reshape(ids.shape[0] // unit_rows, -1)
            g = g.reshape(g.shape[0] // unit_rows, -1, g.shape[-1])
            if ids.shape[1] > _GRAM_MAX_LOOKUPS:
                owner = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(ids.shape[1])
                return _segment_squared_norms(owner, ids.reshape(-1), g.reshape(-1, g.shape[-1]),
                                              self.layer.module.num_embeddings, ids.shape[0])
        if ids.shape[1] == 1:
            return torch.linalg.vector_norm(g, dim=(1, 2)).square()
        if g.device.type not in _SKIP_DISTINCT_ROWS:
            return _masked_gram_norms(g, ids)
        # A row whose ids are all distinct has no cross terms: its norm is that of its rows
        # (one pass over G, as for a single lookup); only the rows that repeat an id take
        # the masked Gram matrix. Finding them is a host sync, free on the CPU.
        out = torch.linalg.vector_norm(g, dim=(1, 2)).square()
        rows = _repeating_rows(ids)
        if rows.numel():
            out[rows] = _masked_gram_norms(g[rows], ids[rows])
        return out

    def set_grads(self, c: torch.Tensor, accumulate: bool, deferred: list | None = None) -> None:
        scale = c[:, None, None]
        rows = self.g.mul_(scale) if self.owned else self.g * scale
        self.g = None
        _index_add(self.layer.weight, self.ids, rows, accumulate, deferred)


class _BagPieces:
    """An EmbeddingBag's looked-up ids, the bag (example) of each, and each id's gradient row ``w G_bag``.

    A bag's output is ``sum_j w_j E[id_j]`` (w = 1, the per-sample weight, or 1 / bag length
    for ``mean``; 0 for ``padding_idx``), so example b's gradient puts ``sum_{j in b, id_j = r}
    w_j G_b`` on row r: rows of equal (bag, id) add up before the norm is taken, as for an
    Embedding, here by a segment sum over the looked-up ids (never [P, vocabulary, dim]).
    """

    def __init__(self, layer: _Layer, grads: list[torch.Tensor], batch: int, dtype: torch.dtype, owned):
        self.layer, self.batch = layer, batch
        module = layer.module
        ids, bags, rows = [], [], []
        for call, g in zip(layer.calls, grads):
            x, (rest, kw) = call.x, call.extra
            offsets = rest[0] if rest else kw.get("offsets")
            weights = rest[1] if len(rest) > 1 else kw.get("per_sample_weights")
            if x.dim() == 2:
                count = x.shape[0]
                bag = torch.arange(count, device=x.device).repeat_interleave(x.shape[1])
            else:
                starts = (offsets[:-1] if module.include_last_offset else offsets).to(torch.int64)
                count = starts.shape[0]
                bag = torch.searchsorted(starts, torch.arange(x.shape[0], device=x.device), right=True) - 1
            if count != batch:
                raise UnsupportedError(f"layer {layer.label!r} formed {count} bags from a batch of {batch}; "
                                       "per-example gradients need one bag per example")
            flat = x.reshape(-1)
            w = torch.ones(flat.shape, dtype=dtype, device=x.device) if weights is None else \
                weights.reshape(-1).to(dtype)
            if module.padding_idx is not None:
                w = torch.where(flat == module.padding_idx, 0, w)  # torch skips it, in the mean's count too
            if module.mode == "mean":
                length = torch.zeros(batch, dtype=dtype, device=x.device).index_add_(0, bag, (w != 0).to(dtype))
                w = w / length.clamp_min(1)[bag]
            ids.append(flat)
            bags.append(bag)
            rows.append(g.to(dtype)[bag] * w[:, None])
        self.ids, self.bag, self.g = torch.cat(ids), torch.cat(bags), torch.cat(rows)

    def squared_norms(self, unit_rows: int = 1) -> torch.Tensor:
        # The segment key is (unit, id): with unit_rows = 1 the unit is the bag.
        owner = self.bag // unit_rows if unit_rows > 1 else self.bag
        return _segment_squared_norms(owner, self.ids, self.g, self.layer.module.num_embeddings,
                                      self.batch // unit_rows)

    def set_grads(self, c: torch.Tensor, accumulate: bool, deferred: list | None = None) -> None:
        rows, self.g = self.g.mul_(c[self.bag, None]), None  # the rows were formed here: ours to scale
        _index_add(self.layer.weight, self.ids, rows, accumulate, deferred)


class _NormPieces:
    """A LayerNorm's per-example gradients: ``sum_t G_t * xhat_t`` (weight) and ``sum_t G_t`` (bias).

    ``xhat`` is the normalised input, recomputed from the stored input without the affine
    part; each example's gradient has the size of the normalised shape, so materialising it
    costs no more than one activation row.
    """

    def __init__(self, layer: _Layer, grads: list[torch.Tensor], batch: int, dtype: torch.dtype, owned):
        self.layer = layer
        module = layer.module
        trailing = len(module.normalized_shape)
        self.gw: torch.Tensor | None = None
        self.gb: torch.Tensor | None = None
        for (x, *_), g in zip(layer.calls, grads):
            g = _rows(g, batch, trailing, layer).to(dtype)
            if layer.weight is not None:
                xhat = F.layer_norm(_rows(x, batch, trailing, layer).to(dtype), module.normalized_shape,
                                    eps=module.eps)
                w = (g * xhat).sum(1)
                self.gw = w if self.gw is None else self.gw + w
            if layer.bias is not None:
                self.gb = g.sum(1) if self.gb is None else self.gb + g.sum(1)
        self.g = g

    def _parts(self):
        return [(p, g) for p, g in ((self.layer.weight, self.gw), (self.layer.bias, self.gb)) if g is not None]

    def squared_norms(self, unit_rows: int = 1) -> torch.Tensor:
        return sum(torch.linalg.vector_norm(_unit_sums(g, unit_rows), dim=1).square() for _, g in self._parts())

    def set_grads(self, c: torch.Tensor, accumulate: bool, deferred: list | None = None) -> None:
        for p, g in self._parts():
            _deposit(p, c @ g.flatten(1), accumulate)


def _unit_sums(g: torch.Tensor, unit_rows: int) -> torch.Tensor:
    """Per-example gradients [P, ...] as [P / unit_rows, numel]: summed over each unit's rows."""
    flat = g.flatten(1)
    return flat if unit_rows == 1 else flat.reshape(-1, unit_rows, flat.shape[1]).sum(1)


def _pieces(layer: _Layer, grads: list[torch.Tensor], batch: int, owned):
    """The book-keeping of one hooked layer, by its kind."""
    module = layer.module
    kind = (_EmbeddingPieces if isinstance(module, nn.Embedding) else _BagPieces
            if isinstance(module, nn.EmbeddingBag) else _NormPieces if isinstance(module, nn.LayerNorm)
            else _LinearPieces)
    return kind(layer, grads, batch, layer.parameters()[0].dtype, owned)


def clipped_gradient_sum(model: nn.Module, loss_fn, inputs: tuple, targets, *, mask: torch.Tensor,
                         clipping_norm: float, parameters=None, truncated: bool = False,
                         unit_rows: int = 1, accumulate: bool = False, deferred: list | None = None) -> dict:
    """Set each trainable parameter's ``.grad`` to the clipped sum ``sum_i c_i g_i`` of one padded batch.

    ``g_i`` is example i's gradient of its own loss with respect to the trainable parameters
    only, and ``c_i = mask_i min(1, C / ||g_i||_2)``; rows with ``mask_i = 0`` contribute
    exactly 0.0. Costs one forward and one backward (through layer outputs only) plus
    the weight-gradient matmuls, done once and already clipped (Bu et al., arXiv:2210.00038);
    only parameters outside nn.Linear / nn.Embedding get materialised per-example gradients
    (``torch.func``). A trainable parameter the forward never reached gets a zero gradient.
    Every ``.grad`` is replaced (``accumulate=False``) or added into, and dense (also for
    sparse Embeddings).

    Memory: the layer outputs are not kept (their gradients are taken at their autograd
    edges), each layer's output gradients are released as soon as its sums are in, they are
    scaled in place when no other tensor shares them, and with ``accumulate=True`` the sums go
    straight into the existing ``.grad`` buffers (``addmm_``, ``index_add_``): no dense zeroed
    copy of an embedding table, no weight-sized temporary.

    With ``unit_rows = K > 1`` the clipped object is a unit (a user), not an example: the P
    rows are P / K consecutive blocks of K, one unit each, and the result is
    ``sum_u c_u sum_{i in u} mask_i g_i`` with ``c_u = min(1, C / ||sum_{i in u} mask_i g_i||)``,
    the user-level DP-SGD of Charles et al. (arXiv:2407.07737, unit sampling). A unit's norm
    needs the cross terms between its rows; each book-keeping piece gets them by regrouping
    what it already stores (a Linear's K rows as the K T rows of one example, an Embedding's
    K L lookups as one example's, an EmbeddingBag's segments keyed by (unit, id), summed
    per-example gradients of a LayerNorm or the fallback), so the cost stays one forward and
    one backward; the clipped sum is linear in the per-row factors, so each row takes its
    unit's factor.

    Args:
        model: a module whose forward takes ``inputs`` (e.g. ``TwoTowerMLP``,
            ``FactorizationMachine``), under the assumptions in the module docstring.
        loss_fn: ``loss_fn(logits, targets)`` -> per-example losses [P], e.g.
            ``functools.partial(losses.bce, reduction="none")``.
        inputs: ``(ns_cat, ns_num, s_cat, s_num)``, each with P rows; ``truncated`` uses the
            first two.
        targets: passed to ``loss_fn`` unchanged.
        mask: [P] float, 1 for a real row and 0 for padding (a nonzero value other than 1
            weights the clipped gradient of that row).
        clipping_norm: C, a finite number > 0.
        parameters: the trainable parameters (default: every parameter with
            ``requires_grad``). Others are frozen: no ``.grad`` is written for them and they
            do not count in the norms.
        truncated: run ``model.forward_truncated(ns_cat, ns_num)`` instead of ``model(*inputs)``.
        unit_rows: K, the rows of one unit (an integer >= 1 dividing P); padding rows inside
            a block have mask 0. 1 clips each example, as in plain DP-SGD.
        accumulate: add the clipped sum into each trainable parameter's existing dense
            ``.grad`` (one of the parameter's shape and dtype, e.g. the noise already drawn
            there, or an earlier chunk's sum); a parameter without one gets it set. False:
            replace every ``.grad``.
        deferred: with ``accumulate``, a list to which each embedding table's segment sum
            is appended as ``(weight, ids, rows)`` instead of being added, for
            :func:`add_deferred` after the batch's last chunk. The sums are the same
            ``index_add_`` calls in the same order, so the gradients are bit for bit those
            of adding them at once; what changes is when. A chunk's forward and backward
            evict a table's gradient from the caches, so each chunk's scattered adds into it
            would miss again; after the last chunk the adds run back to back on a table
            already in the cache. The rows stay alive until then (P L dim numbers per
            table and chunk, the size of the table's output gradient).

    Returns:
        ``{"norms": [P / K] per-unit gradient norms (0.0 for an all-padding unit), "clipped":
        int64 tensor, the number of units with a real row and norm > C, "loss_sum": the loss
        summed over real rows}``, all detached tensors on the model's device (no host sync
        here).

    Raises:
        InvalidParameterError: bad ``clipping_norm``, ``mask``, ``unit_rows``, ``parameters``
            or loss shape.
        UnsupportedError: a hooked layer whose input or output was modified in place, whose
            dimension 0 is not the example, an Embedding with ``scale_grad_by_freq``, or a
            call with autograd disabled.
    """
    bound = _check_call(clipping_norm, mask)
    if deferred is not None and not accumulate:
        raise InvalidParameterError("deferred sums need accumulate=True (they are added into the buffers later)")
    batch = mask.shape[0]
    k = _unit_rows(unit_rows, batch)
    units = batch // k
    layers, fallback = _select(model, parameters)
    xs = tuple(inputs[:2]) if truncated else tuple(inputs)
    logits = _hooked_forward(model, layers, xs, truncated)

    pieces: list = []
    try:
        losses = loss_fn(logits, targets)
        if not isinstance(losses, torch.Tensor) or losses.shape != (batch,):
            shape = list(losses.shape) if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise InvalidParameterError(f"loss_fn must return one loss per row, shape [{batch}], got {shape}")
        real = mask != 0
        # where, not a product with the mask: a padded row's loss (even inf or nan) then sends
        # an exact 0 into the backward.
        objective = torch.where(real, losses, 0).sum()
        # A unit's norm is that of its rows' weighted sum, so the weights go into the backward;
        # each example's own weight stays outside its norm (the factor below).
        weighted = objective if k == 1 else torch.where(real, losses * mask.to(losses.dtype), 0).sum()
        dlogits, layer_grads, unreached, owned = _backward(weighted, logits, layers)

        # Everything below is book-keeping on stored tensors: no graph to record.
        with torch.no_grad():
            dtype = torch.promote_types(losses.dtype, torch.float32)
            sq = torch.zeros(units, dtype=dtype, device=mask.device)
            for i, layer in enumerate(layers):
                # The piece keeps what its sums need; the raw gradients go with the list's slot.
                grads, layer_grads[i] = layer_grads[i], []
                if layer.calls:
                    pieces.append(_pieces(layer, grads, batch, owned))
                    sq = sq + pieces[-1].squared_norms(k)
                del grads

            # A hooked layer the forward never called is either unused (its gradient is zero)
            # or read directly (e.g. F.linear(x, layer.weight)): only the second needs the fallback.
            fallback = fallback + [(name, p) for name, p, g in unreached if g is not None]
            per_example = []
            if fallback:
                if dlogits is None:
                    per_example = [p.new_zeros(batch, *p.shape) for _, p in fallback]
                else:
                    per_example = _fallback_gradients(model, fallback, xs, dlogits, truncated)
                for g in per_example:
                    sq = sq + torch.linalg.vector_norm(_unit_sums(g, k), dim=1).square()

            # A unit counts when any of its rows is real.
            present = real if k == 1 else real.reshape(units, k).any(1)
            # Gram-matrix norms can round a true 0 to a tiny negative number.
            norms = torch.where(present, sq.clamp_min(0).sqrt(), 0)
            # C / 0 = inf: a zero gradient keeps factor 1 with no epsilon in the denominator.
            # The norms are computed in floating point, so an example scaled to exactly C could
            # contribute C (1 + a few units of rounding); scaling to C (1 - CLIP_MARGIN_ULPS eps)
            # keeps every contribution at most C (tests measure it in float64).
            safe = bound * (1.0 - CLIP_MARGIN_ULPS * torch.finfo(dtype).eps)
            factor = (safe / norms).clamp(max=1.0)
            if k == 1:
                c = torch.where(real, mask.to(dtype) * factor, 0)
            else:  # the weights are already inside the unit's gradient
                c = torch.where(real, factor.repeat_interleave(k), 0)
            _set_grads(c, pieces, fallback, per_example, unreached, batch, accumulate, deferred)
            return {"norms": norms, "clipped": (present & (norms > bound)).sum(), "loss_sum": objective.detach()}
    finally:
        # The activations must not outlive the call, not even through a traceback.
        for layer in layers:
            layer.calls.clear()
        pieces.clear()


def _check_call(clipping_norm: float, mask) -> float:
    """C, checked, once autograd is on and ``mask`` is one entry per row."""
    bound = positive("clipping_norm", clipping_norm)
    if not torch.is_grad_enabled():
        # Every output would come back without a gradient, and the sum would be silently zero.
        raise UnsupportedError("clipped_gradient_sum needs autograd; it was called under torch.no_grad() "
                               "or torch.inference_mode()")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 1:
        raise InvalidParameterError(f"mask must be a 1-D tensor, one entry per row, got {mask!r:.80}")
    return bound


def _hooked_forward(model: nn.Module, layers: list[_Layer], xs: tuple, truncated: bool) -> torch.Tensor:
    """The logits, every hooked layer's calls recorded (the hooks removed again whatever happens)."""
    handles = []
    try:
        for layer in layers:
            # prepend: capture the layer's own output, before any user hook could replace it.
            handles.append(layer.module.register_forward_hook(layer.record, with_kwargs=True, prepend=True))
        return model.forward_truncated(*xs) if truncated else model(*xs)
    finally:
        for handle in handles:
            handle.remove()


def _set_grads(c: torch.Tensor, pieces: list, fallback: list, per_example: list, unreached: list,
               batch: int, accumulate: bool, deferred: list | None = None) -> None:
    """Every trainable ``.grad`` (+)= its clipped sum with the rows' factors ``c`` (zero where never reached).

    Layer by layer: each piece's output gradients are released as soon as its sums are in.
    """
    while pieces:
        piece = pieces.pop()
        piece.set_grads(c.to(piece.g.dtype), accumulate, deferred)
        del piece
    for (_, p), g in zip(fallback, per_example):
        _deposit(p, c.to(g.dtype) @ g.reshape(batch, -1), accumulate)
    for _, p, g in unreached:
        if g is None and not (accumulate and p.grad is not None):
            p.grad = torch.zeros_like(p)


def _unit_rows(value: object, batch: int) -> int:
    """K, checked: an integer >= 1 (not a bool, not a float) that divides the batch's rows."""
    # A float, even a whole one, is refused: K comes from the sampler's table, never from arithmetic.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidParameterError(f"unit_rows must be an integer >= 1, got {value!r}")
    if batch % value:
        raise InvalidParameterError(f"unit_rows must divide the batch's {batch} rows, got {value}")
    return int(value)


def _backward(objective: torch.Tensor, logits: torch.Tensor, layers: list[_Layer]):
    """The one backward pass, to the logits and the hooked layers' outputs only.

    Returns ``(dlogits, per-layer lists of output gradients, [(name, parameter, gradient or
    None)] for hooked parameters whose layer was never called, owned)``, where ``owned(t)``
    says whether ``t`` shares its memory with no other returned gradient (so it may be scaled
    in place). Asking for outputs rather than weights is what lets autograd skip the
    weight-gradient matmuls; asking at the outputs' autograd edges, not the output tensors,
    is what lets the outputs be freed after the forward.
    """
    for layer in layers:
        layer.check_unmodified()
    calls = [call for layer in layers for call in layer.calls]
    edges = [call.edge for call in calls if call.edge is not None]
    unreached = [(layer.qualified(attr), p) for layer in layers if not layer.calls
                 for attr, p in (("weight", layer.weight), ("bias", layer.bias)) if p is not None]
    wrt = [logits, *edges, *(p for _, p in unreached)]
    if objective.requires_grad and logits.requires_grad:
        grads = list(torch.autograd.grad(objective, wrt, allow_unused=True))
    else:  # nothing trainable on the loss's path
        grads = [None] * len(wrt)
    dlogits, found, rest = grads[0], iter(grads[1:1 + len(edges)]), grads[1 + len(edges):]
    # None: a layer output the loss does not depend on.
    per_call = [next(found) if call.edge is not None else None for call in calls]
    per_call = [torch.zeros(call.out_meta[0], dtype=call.out_meta[1], device=call.out_meta[2]) if g is None else g
                for call, g in zip(calls, per_call)]
    del grads
    layer_grads, k = [], 0
    for layer in layers:
        n = len(layer.calls)
        layer_grads.append(per_call[k:k + n])
        k += n
    return dlogits, layer_grads, [(name, p, g) for (name, p), g in zip(unreached, rest)], \
        _Owned([dlogits, *per_call, *rest])


class _Owned:
    """Whether a tensor may be scaled in place: no other returned gradient shares its memory, no stride 0.

    Autograd may hand the same gradient (or views of one buffer) to two outputs, e.g. both
    terms of a sum, and a gradient of a sum may be an expanded scalar; those are copied.
    """

    def __init__(self, tensors: list):
        self.count: dict[int, int] = defaultdict(int)
        for t in tensors:
            if t is not None:
                self.count[t.untyped_storage().data_ptr()] += 1

    def __call__(self, t: torch.Tensor) -> bool:
        ptr = t.untyped_storage().data_ptr()
        return ptr != 0 and self.count[ptr] <= 1 and all(st != 0 or n == 1 for st, n in zip(t.stride(), t.shape))
