"""The two model classes of the Hybrid paper: a two-tower MLP and a factorization machine.

Chua et al., "Training Differentially Private Ad Prediction Models with Semi-Sensitive
Features" (arXiv:2401.15246), write every model as ``F_w(x°, x•) = f_wc(g_w°(x°) ∘ h_w•(x•))``:
a non-sensitive tower ``g``, a sensitive tower ``h`` and a common tower ``f`` on their
concatenation. The *truncated* model ``f_wc(g_w°(x°) ∘ 0)`` uses the same parameters with
the sensitive tower's output replaced by zeros; Hybrid trains it on randomized-response
labels first (label DP), then warm-starts the full model with DP-SGD.

Both classes are built only from ``nn.Embedding``, ``nn.Linear``, ReLU and plain tensor
ops, because the DP-SGD engine computes per-example gradient norms for exactly these layer
types (a Linear from its input activations and output gradients, an Embedding from the
output gradients of the rows it looked up). For the same reason there is no LayerNorm, no
dropout, no parameter shared between layers, and no bare ``nn.Parameter``: even the FM's
global bias is a one-row Embedding.

Parameter names are stable and say which tower they belong to (``ns_*``: non-sensitive,
``s_*``: sensitive, everything else: common); ``TOWER_PREFIXES`` on each class is the
mapping the DP-SGD engine and the Hybrid phases rely on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import ClassVar

import torch
from torch import nn

from budgetplan.errors import InvalidParameterError
from budgetplan.util.validate import non_negative_int, positive_int

__all__ = ["MODEL_KINDS", "FactorizationMachine", "TwoTowerMLP", "auto_embedding_dim", "build_model"]

TOWERS = ("nonsensitive", "sensitive", "common")

# The FM paper's initialisation (arXiv:2401.15246, appendix A: "we settled on sigma = 1e-2");
# also used for the MLP's embedding tables, whose Linear layers keep torch's default init.
INIT_STD = 0.01


def auto_embedding_dim(vocab: int) -> int:
    """The embedding-size heuristic ``int(2 V^0.25)`` of arXiv:2401.15246 (appendix A), at least 1."""
    return max(1, int(2 * positive_int("vocab", vocab) ** 0.25))


def _embedding_dim(value: object, vocab: int, name: str = "embedding_dim") -> int:
    if value == "auto":
        return auto_embedding_dim(vocab)
    return positive_int(name, value)


def _check_embedding_dim(value: object) -> object:
    if isinstance(value, str):
        if value != "auto":
            raise InvalidParameterError(f"embedding_dim must be a positive integer or 'auto', got {value!r}")
        return value
    return positive_int("embedding_dim", value)


class _Shape:
    """Column counts and vocabularies shared by both models, validated once."""

    def __init__(self, *, ns_vocab, n_ns_cat, n_ns_num, s_vocab, n_s_cat, n_s_num):
        self.ns_vocab = positive_int("ns_vocab", ns_vocab)
        self.n_ns_cat = non_negative_int("n_ns_cat", n_ns_cat)
        self.n_ns_num = non_negative_int("n_ns_num", n_ns_num)
        self.s_vocab = positive_int("s_vocab", s_vocab)
        self.n_s_cat = non_negative_int("n_s_cat", n_s_cat)
        self.n_s_num = non_negative_int("n_s_num", n_s_num)
        if self.n_ns_cat + self.n_ns_num + self.n_s_cat + self.n_s_num == 0:
            raise InvalidParameterError("a model needs at least one feature column, got 0 in every group")

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("ns_vocab", "n_ns_cat", "n_ns_num", "s_vocab", "n_s_cat", "n_s_num")}


def _check_inputs(shape: _Shape, **tensors: torch.Tensor) -> int:
    """The batch size, after checking each group has the declared number of columns.

    A mismatch would otherwise surface as an opaque matmul error deep in a tower, or worse,
    not at all (an Embedding happily looks up fewer columns).
    """
    batch = None
    for name, t in tensors.items():
        want = getattr(shape, "n_" + name)
        if t.dim() != 2 or t.shape[1] != want:
            raise InvalidParameterError(f"{name} must have shape [B, {want}], got {list(t.shape)}")
        if batch is None:
            batch = t.shape[0]
        elif t.shape[0] != batch:
            raise InvalidParameterError(f"{name} has {t.shape[0]} rows, expected {batch} like the other inputs")
    return int(batch)


class _TowerModel(nn.Module):
    """Tower bookkeeping shared by both models: parameter groups and the config round trip."""

    kind: ClassVar[str] = ""
    # Top-level child-module names per tower; a parameter belongs to the tower of its prefix.
    TOWER_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {}

    def tower_of(self, parameter_name: str) -> str:
        """``"nonsensitive"``, ``"sensitive"`` or ``"common"`` for a name of ``named_parameters()``."""
        head = parameter_name.split(".", 1)[0]
        for tower, prefixes in self.TOWER_PREFIXES.items():
            if head in prefixes:
                return tower
        raise KeyError(f"{parameter_name!r} is not a parameter of {type(self).__name__}")

    def named_tower_parameters(self, tower: str) -> Iterator[tuple[str, nn.Parameter]]:
        """The ``(name, parameter)`` pairs of one tower, in ``named_parameters()`` order."""
        if tower not in TOWERS:
            raise InvalidParameterError(f"tower must be one of {TOWERS}, got {tower!r}")
        for name, p in self.named_parameters():
            if self.tower_of(name) == tower:
                yield name, p

    def nonsensitive_parameters(self) -> list[nn.Parameter]:
        """w°: the non-sensitive tower, frozen or fine-tuned in Hybrid's DP-SGD phase."""
        return [p for _, p in self.named_tower_parameters("nonsensitive")]

    def sensitive_parameters(self) -> list[nn.Parameter]:
        """w•: the sensitive tower, untouched by the truncated model."""
        return [p for _, p in self.named_tower_parameters("sensitive")]

    def common_parameters(self) -> list[nn.Parameter]:
        """w^c: the common tower (the combiner)."""
        return [p for _, p in self.named_tower_parameters("common")]

    def config(self) -> dict:
        """JSON-ready keyword arguments that rebuild this model: ``build_model(model.kind, model.config())``."""
        raise NotImplementedError


class TwoTowerMLP(_TowerModel):
    """The two-tower MLP of arXiv:2401.15246 (section 5.1 and appendix A).

    Non-sensitive tower ``g``: the non-sensitive embeddings (one shared table) flattened and
    concatenated with the non-sensitive numeric features, then one Linear + ReLU of width
    ``tower_hidden``. Sensitive tower ``h``: the embedding lookup itself, concatenated with
    the sensitive numeric features (as in the paper, where only the sensitive embedding
    tables are sensitive parameters). Common tower ``f``: Linear + ReLU layers of widths
    ``common_hidden`` on ``g ∘ h``, then a Linear to one logit.

    Parameters: ``ns_embedding``, ``ns_tower`` (non-sensitive); ``s_embedding`` (sensitive);
    ``common.<i>``, ``head`` (common). A group without categorical columns has no table; a
    non-sensitive group without any column has no tower (``d° = 0``).

    Args:
        ns_vocab, s_vocab: rows of the non-sensitive / sensitive embedding table (>= 1).
        n_ns_cat, n_ns_num, n_s_cat, n_s_num: column counts per group (>= 0, not all 0).
        embedding_dim: width of every embedding, or ``"auto"`` for ``int(2 V^0.25)`` per
            table (V its vocabulary), the paper's heuristic.
        tower_hidden: width of the non-sensitive tower (598 on Criteo pCTR in the paper).
        common_hidden: widths of the common tower's hidden layers.
    """

    kind = "mlp"
    TOWER_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "nonsensitive": ("ns_embedding", "ns_tower"),
        "sensitive": ("s_embedding",),
        "common": ("common", "head"),
    }

    def __init__(self, *, ns_vocab: int, n_ns_cat: int, n_ns_num: int, s_vocab: int, n_s_cat: int,
                 n_s_num: int, embedding_dim: int | str = 32, tower_hidden: int = 598,
                 common_hidden: Sequence[int] = (598, 598)):
        super().__init__()
        self.shape = _Shape(ns_vocab=ns_vocab, n_ns_cat=n_ns_cat, n_ns_num=n_ns_num,
                            s_vocab=s_vocab, n_s_cat=n_s_cat, n_s_num=n_s_num)
        self._embedding_dim = _check_embedding_dim(embedding_dim)
        self.tower_hidden = positive_int("tower_hidden", tower_hidden)
        if isinstance(common_hidden, (str, bytes)) or not isinstance(common_hidden, Sequence):
            raise InvalidParameterError(f"common_hidden must be a sequence of positive integers, got {common_hidden!r}")
        self.common_hidden = tuple(positive_int("common_hidden", w) for w in common_hidden)
        sh = self.shape

        self.ns_embedding_dim = _embedding_dim(self._embedding_dim, sh.ns_vocab)
        self.s_embedding_dim = _embedding_dim(self._embedding_dim, sh.s_vocab)
        # Tables only exist for groups with categorical columns: an unused table would get no
        # gradient and would still count towards DP-SGD's parameter set.
        if sh.n_ns_cat:
            self.ns_embedding = nn.Embedding(sh.ns_vocab, self.ns_embedding_dim)
        if sh.n_s_cat:
            self.s_embedding = nn.Embedding(sh.s_vocab, self.s_embedding_dim)

        ns_in = sh.n_ns_cat * self.ns_embedding_dim + sh.n_ns_num
        self.d_ns = self.tower_hidden if ns_in else 0
        if ns_in:
            self.ns_tower = nn.Linear(ns_in, self.tower_hidden)
        self.d_s = sh.n_s_cat * self.s_embedding_dim + sh.n_s_num

        widths = [self.d_ns + self.d_s, *self.common_hidden]
        self.common = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))
        self.head = nn.Linear(widths[-1], 1)
        for table in (getattr(self, "ns_embedding", None), getattr(self, "s_embedding", None)):
            if table is not None:
                nn.init.normal_(table.weight, std=INIT_STD)

    def config(self) -> dict:
        return {**self.shape.as_dict(), "embedding_dim": self._embedding_dim,
                "tower_hidden": self.tower_hidden, "common_hidden": list(self.common_hidden)}

    @torch.no_grad()
    def match_truncated(self) -> None:
        """Make the full model compute the truncated one: the common tower's first layer reads h = 0.

        The weights that read the sensitive tower's output are zeroed, so ``forward`` equals
        ``forward_truncated`` exactly; the sensitive embeddings keep their values, so those
        weights get gradients at once and the sensitive tower learns from there (Hybrid's
        DP-SGD phase starts from the RR model rather than from a random perturbation of it).
        """
        first = self.common[0] if len(self.common) else self.head
        first.weight[:, self.d_ns:].zero_()

    def output_bias(self) -> torch.Tensor:
        """The one number added to every logit, full and truncated (the head's bias)."""
        return self.head.bias

    def _nonsensitive(self, ns_cat: torch.Tensor, ns_num: torch.Tensor) -> torch.Tensor:
        """g(x°): [B, d°]."""
        parts = []
        if self.shape.n_ns_cat:
            parts.append(self.ns_embedding(ns_cat).flatten(1))
        if self.shape.n_ns_num:
            parts.append(ns_num.to(self.head.weight.dtype))
        if not parts:
            return self.head.weight.new_zeros(ns_cat.shape[0], 0)
        return torch.relu(self.ns_tower(torch.cat(parts, dim=1)))

    def _sensitive(self, s_cat: torch.Tensor, s_num: torch.Tensor) -> torch.Tensor:
        """h(x•): [B, d•]."""
        parts = [self.head.weight.new_zeros(s_cat.shape[0], 0)]
        if self.shape.n_s_cat:
            parts.append(self.s_embedding(s_cat).flatten(1))
        if self.shape.n_s_num:
            parts.append(s_num.to(self.head.weight.dtype))
        return torch.cat(parts, dim=1)

    def _combine(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """f(g ∘ h): logits [B]."""
        z = torch.cat([g, h], dim=1)
        for layer in self.common:
            z = torch.relu(layer(z))
        return self.head(z).squeeze(-1)

    def forward(self, ns_cat: torch.Tensor, ns_num: torch.Tensor, s_cat: torch.Tensor,
                s_num: torch.Tensor) -> torch.Tensor:
        """Logits [B] of the full model F_w(x°, x•)."""
        _check_inputs(self.shape, ns_cat=ns_cat, ns_num=ns_num, s_cat=s_cat, s_num=s_num)
        return self._combine(self._nonsensitive(ns_cat, ns_num), self._sensitive(s_cat, s_num))

    def forward_truncated(self, ns_cat: torch.Tensor, ns_num: torch.Tensor) -> torch.Tensor:
        """Logits [B] of the truncated model f(g(x°) ∘ 0); never touches a sensitive parameter."""
        batch = _check_inputs(self.shape, ns_cat=ns_cat, ns_num=ns_num)
        g = self._nonsensitive(ns_cat, ns_num)
        # Zeros of the sensitive width through the same first common Linear (rather than a
        # slice of its weight) keep the arithmetic identical to the full model with h = 0, and
        # keep the layer a plain nn.Linear call for the DP-SGD engine's hooks.
        return self._combine(g, g.new_zeros(batch, self.d_s))


class FactorizationMachine(_TowerModel):
    """A factorization machine (Rendle, ICDM 2010) split into towers as in arXiv:2401.15246, section 5.1.

    Every feature i has a k-dimensional vector ``v_i`` and a first-order weight ``w_i``; a
    categorical feature looks both up by its id, a numeric feature has its own pair scaled by
    its value. The logit is ``b + sum_i w_i + sum_{i<j} <v_i, v_j>`` over all features of
    both groups. As in the paper, each tower returns ``(t_1, t_2..)`` with ``t_1`` its
    first-order terms plus its within-group interactions and ``t_2..`` the sum of its
    vectors, and the combiner is ``b + g_1 + h_1 + <g_2.., h_2..>``; the cross-group
    interactions are that last dot product. Within-group interactions use the O(n k) identity
    ``sum_{i<j} <v_i, v_j> = (|sum_i v_i|^2 - sum_i |v_i|^2) / 2``.

    The truncated model sets ``h = 0``: it drops the sensitive first-order terms, the
    sensitive-sensitive and the cross interactions.

    Parameters: ``ns_linear``, ``ns_embedding``, ``ns_num_linear``, ``ns_num_embedding``
    (non-sensitive); ``s_linear``, ``s_embedding``, ``s_num_linear``, ``s_num_embedding``
    (sensitive); ``bias`` (common, a one-row Embedding so that the DP-SGD engine sees it as
    a layer). All initialised N(0, 0.01^2) as in the paper's appendix A, the bias at 0.

    Args:
        ns_vocab, s_vocab: rows of the non-sensitive / sensitive tables (>= 1).
        n_ns_cat, n_ns_num, n_s_cat, n_s_num: column counts per group (>= 0, not all 0).
        embedding_dim: k, shared by both groups (their vectors meet in dot products), or
            ``"auto"``: ``int(2 V^0.25)`` of the largest vocabulary among the groups that
            have categorical columns.
    """

    kind = "fm"
    TOWER_PREFIXES: ClassVar[dict[str, tuple[str, ...]]] = {
        "nonsensitive": ("ns_linear", "ns_embedding", "ns_num_linear", "ns_num_embedding"),
        "sensitive": ("s_linear", "s_embedding", "s_num_linear", "s_num_embedding"),
        "common": ("bias",),
    }

    def __init__(self, *, ns_vocab: int, n_ns_cat: int, n_ns_num: int, s_vocab: int, n_s_cat: int,
                 n_s_num: int, embedding_dim: int | str = 32):
        super().__init__()
        self.shape = _Shape(ns_vocab=ns_vocab, n_ns_cat=n_ns_cat, n_ns_num=n_ns_num,
                            s_vocab=s_vocab, n_s_cat=n_s_cat, n_s_num=n_s_num)
        self._embedding_dim = _check_embedding_dim(embedding_dim)
        sh = self.shape
        vocabs = [v for v, n in ((sh.ns_vocab, sh.n_ns_cat), (sh.s_vocab, sh.n_s_cat)) if n] or [1]
        self.k = _embedding_dim(self._embedding_dim, max(vocabs))

        self.bias = nn.Embedding(1, 1)
        nn.init.zeros_(self.bias.weight)
        for prefix, vocab, n_cat, n_num in (("ns", sh.ns_vocab, sh.n_ns_cat, sh.n_ns_num),
                                            ("s", sh.s_vocab, sh.n_s_cat, sh.n_s_num)):
            if n_cat:
                self.add_module(f"{prefix}_linear", nn.Embedding(vocab, 1))
                self.add_module(f"{prefix}_embedding", nn.Embedding(vocab, self.k))
            if n_num:
                self.add_module(f"{prefix}_num_linear", nn.Linear(n_num, 1, bias=False))
                # One row per numeric column, looked up by column index: an Embedding rather
                # than a bare Parameter so that per-example gradients come from output gradients.
                self.add_module(f"{prefix}_num_embedding", nn.Embedding(n_num, self.k))
                self.register_buffer(f"_{prefix}_num_ids", torch.arange(n_num), persistent=False)
        for name, p in self.named_parameters():
            if name != "bias.weight":
                nn.init.normal_(p, std=INIT_STD)

    def config(self) -> dict:
        return {**self.shape.as_dict(), "embedding_dim": self._embedding_dim}

    @torch.no_grad()
    def match_truncated(self) -> None:
        """Make the full model compute the truncated one: every sensitive parameter set to 0.

        Then h = 0 exactly; the gradients of the sensitive vectors are their interactions
        with the non-sensitive ones, so they learn from the first DP-SGD step.
        """
        for _name, p in self.named_tower_parameters("sensitive"):
            p.zero_()

    def output_bias(self) -> torch.Tensor:
        """The one number added to every logit, full and truncated (the global bias b)."""
        return self.bias.weight

    def _tower(self, prefix: str, cat: torch.Tensor, num: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(t_1 [B], t_2.. [B, k]) of one group."""
        n_cat = getattr(self.shape, f"n_{prefix}_cat")
        n_num = getattr(self.shape, f"n_{prefix}_num")
        batch = cat.shape[0]
        zeros = self.bias.weight.new_zeros
        first = zeros(batch)
        vectors = [zeros(batch, 0, self.k)]
        if n_cat:
            first = first + getattr(self, f"{prefix}_linear")(cat).sum(dim=(1, 2))
            vectors.append(getattr(self, f"{prefix}_embedding")(cat))
        if n_num:
            num = num.to(self.bias.weight.dtype)
            first = first + getattr(self, f"{prefix}_num_linear")(num).squeeze(-1)
            ids = getattr(self, f"_{prefix}_num_ids").expand(batch, n_num)
            vectors.append(getattr(self, f"{prefix}_num_embedding")(ids) * num.unsqueeze(-1))
        v = torch.cat(vectors, dim=1)                      # [B, n, k]
        total = v.sum(dim=1)                               # [B, k]
        within = 0.5 * (total.pow(2).sum(-1) - v.pow(2).sum(dim=(1, 2)))
        return first + within, total

    def _combine(self, g: tuple[torch.Tensor, torch.Tensor], h: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        bias = self.bias(torch.zeros_like(g[0], dtype=torch.long)).squeeze(-1)
        return bias + g[0] + h[0] + (g[1] * h[1]).sum(-1)

    def forward(self, ns_cat: torch.Tensor, ns_num: torch.Tensor, s_cat: torch.Tensor,
                s_num: torch.Tensor) -> torch.Tensor:
        """Logits [B] of the full FM over both groups."""
        _check_inputs(self.shape, ns_cat=ns_cat, ns_num=ns_num, s_cat=s_cat, s_num=s_num)
        return self._combine(self._tower("ns", ns_cat, ns_num), self._tower("s", s_cat, s_num))

    def forward_truncated(self, ns_cat: torch.Tensor, ns_num: torch.Tensor) -> torch.Tensor:
        """Logits [B] with the sensitive tower's output (h_1, h_2..) replaced by zeros."""
        _check_inputs(self.shape, ns_cat=ns_cat, ns_num=ns_num)
        g = self._tower("ns", ns_cat, ns_num)
        return self._combine(g, (torch.zeros_like(g[0]), torch.zeros_like(g[1])))


MODEL_KINDS: dict[str, type[_TowerModel]] = {"mlp": TwoTowerMLP, "fm": FactorizationMachine}


def build_model(kind: str, config: dict | None = None, /, **kwargs) -> TwoTowerMLP | FactorizationMachine:
    """A model from its kind and keyword arguments: ``build_model(m.kind, m.config())`` rebuilds ``m``.

    Args:
        kind: ``"mlp"`` (TwoTowerMLP) or ``"fm"`` (FactorizationMachine).
        config: a dict of constructor arguments, e.g. from ``model.config()``.
        **kwargs: constructor arguments; they override entries of ``config``.
    """
    if kind not in MODEL_KINDS:
        raise InvalidParameterError(f"kind must be one of {sorted(MODEL_KINDS)}, got {kind!r}")
    args = {**(config or {}), **kwargs}
    cls = MODEL_KINDS[kind]
    try:
        return cls(**args)
    except TypeError as exc:  # an unknown or missing keyword: say so as a parameter error
        raise InvalidParameterError(f"bad arguments for a {kind!r} model: {exc}") from None
