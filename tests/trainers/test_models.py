"""Two-tower MLP and factorization machine: shapes, the truncated model, towers, layer types, training."""

from __future__ import annotations

import copy
import itertools
import json

import pytest
import torch
from torch import nn

from trainers.losses import bce
from trainers.models import (
    FactorizationMachine,
    TwoTowerMLP,
    auto_embedding_dim,
    build_model,
)

KINDS = ("mlp", "fm")
SMALL = {"mlp": {"embedding_dim": 4, "tower_hidden": 16, "common_hidden": (8, 8)}, "fm": {"embedding_dim": 4}}

FULL = {"ns_vocab": 30, "n_ns_cat": 3, "n_ns_num": 2, "s_vocab": 20, "n_s_cat": 2, "n_s_num": 2}
SHAPES = {
    "full": FULL,
    "no_sensitive": dict(FULL, n_s_cat=0, n_s_num=0),
    "no_numeric": dict(FULL, n_ns_num=0, n_s_num=0),
    "no_categorical": dict(FULL, n_ns_cat=0, n_s_cat=0),
    "sensitive_numeric_only": dict(FULL, n_s_cat=0),
    "no_nonsensitive": dict(FULL, n_ns_cat=0, n_ns_num=0),
    "one_column_each": dict(FULL, n_ns_cat=1, n_ns_num=0, n_s_cat=1, n_s_num=0),
}


def make(kind, shape=FULL, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model(kind, **shape, **{**SMALL[kind], **overrides})


def batch(shape=FULL, size=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, shape["ns_vocab"], (size, shape["n_ns_cat"]), generator=g),
            torch.randn(size, shape["n_ns_num"], generator=g),
            torch.randint(0, shape["s_vocab"], (size, shape["n_s_cat"]), generator=g),
            torch.randn(size, shape["n_s_num"], generator=g))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_output_shapes(kind, shape_name):
    shape = SHAPES[shape_name]
    model = make(kind, shape)
    x = batch(shape)
    for out in (model(*x), model.forward_truncated(*x[:2])):
        assert out.shape == (7,) and out.dtype == torch.float32 and torch.isfinite(out).all()
    assert model(*batch(shape, size=0)).shape == (0,)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_truncated_equals_full_model_with_sensitive_part_zeroed(kind, shape_name):
    """Zeroing every sensitive parameter and sensitive numeric input must give the truncated logits, bit for bit."""
    shape = SHAPES[shape_name]
    model = make(kind, shape)
    ns_cat, ns_num, s_cat, s_num = batch(shape)
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for p in zeroed.sensitive_parameters():
            p.zero_()
    full_zeroed = zeroed(ns_cat, ns_num, s_cat, torch.zeros_like(s_num))
    assert torch.equal(full_zeroed, model.forward_truncated(ns_cat, ns_num))
    assert torch.equal(zeroed.forward_truncated(ns_cat, ns_num), model.forward_truncated(ns_cat, ns_num))


def test_mlp_truncated_by_hand():
    """f(g ∘ 0) rebuilt from the weights: the first common layer sees only its non-sensitive columns."""
    model = make("mlp")
    ns_cat, ns_num, s_cat, s_num = batch()
    with torch.no_grad():
        x = torch.cat([model.ns_embedding(ns_cat).flatten(1), ns_num], dim=1)
        z = torch.relu(x @ model.ns_tower.weight.T + model.ns_tower.bias)
        first = model.common[0]
        z = torch.relu(z @ first.weight[:, :model.d_ns].T + first.bias)
        for layer in model.common[1:]:
            z = torch.relu(layer(z))
        expected = model.head(z).squeeze(-1)
    assert torch.allclose(model.forward_truncated(ns_cat, ns_num), expected, rtol=1e-5, atol=1e-6)
    # and the full model does use the sensitive inputs
    assert not torch.allclose(model(ns_cat, ns_num, s_cat, s_num), model(ns_cat, ns_num, s_cat, s_num + 1))


def _fm_by_enumeration(model: FactorizationMachine, ns_cat, ns_num, s_cat, s_num, *, truncated: bool):
    """b + sum_i w_i + sum_{i<j} <v_i, v_j>, enumerating the features and their pairs: O(n^2 k)."""
    out = []
    groups = [("ns", ns_cat, ns_num)] + ([] if truncated else [("s", s_cat, s_num)])
    for row in range(ns_cat.shape[0]):
        weights, vectors = [], []
        for prefix, cat, num in groups:
            for j in range(cat.shape[1]):
                weights.append(getattr(model, f"{prefix}_linear").weight[cat[row, j], 0])
                vectors.append(getattr(model, f"{prefix}_embedding").weight[cat[row, j]])
            for j in range(num.shape[1]):
                weights.append(getattr(model, f"{prefix}_num_linear").weight[0, j] * num[row, j])
                vectors.append(getattr(model, f"{prefix}_num_embedding").weight[j] * num[row, j])
        total = model.bias.weight[0, 0] + sum(weights, torch.tensor(0.0))
        for a, b in itertools.combinations(vectors, 2):
            total = total + a @ b
        out.append(total)
    return torch.stack(out)


@pytest.mark.parametrize("shape_name", ["full", "no_sensitive", "no_numeric", "no_categorical", "no_nonsensitive"])
def test_fm_equals_pairwise_enumeration(shape_name):
    shape = SHAPES[shape_name]
    model = make("fm", shape, embedding_dim=3)
    with torch.no_grad():  # N(0, 0.01) parameters make every interaction vanish next to the bias
        for p in model.parameters():
            p.normal_(0, 0.5)
    x = batch(shape, size=5)
    with torch.no_grad():
        for truncated in (False, True):
            got = model.forward_truncated(*x[:2]) if truncated else model(*x)
            assert torch.allclose(got, _fm_by_enumeration(model, *x, truncated=truncated), rtol=1e-5, atol=1e-5)


ALLOWED_LAYERS = (nn.Embedding, nn.Linear, nn.ReLU, nn.ModuleList, TwoTowerMLP, FactorizationMachine)


@pytest.mark.parametrize("kind", KINDS)
def test_only_layers_the_dpsgd_engine_supports(kind):
    model = make(kind)
    for name, module in model.named_modules():
        assert isinstance(module, ALLOWED_LAYERS), f"{name}: {type(module).__name__}"
        own = list(module.named_parameters(recurse=False))
        if own:  # every parameter sits directly in an Embedding or a Linear, nowhere else
            assert isinstance(module, (nn.Embedding, nn.Linear)), f"{name} owns {[n for n, _ in own]}"
    shared = list(model.named_parameters(remove_duplicate=False))
    assert len({id(p) for _, p in shared}) == len(shared), "a parameter is shared between layers"


EXPECTED_TOWERS = {
    "mlp": {
        "nonsensitive": ["ns_embedding.weight", "ns_tower.weight", "ns_tower.bias"],
        "sensitive": ["s_embedding.weight"],
        "common": ["common.0.weight", "common.0.bias", "common.1.weight", "common.1.bias", "head.weight", "head.bias"],
    },
    "fm": {
        "nonsensitive": ["ns_linear.weight", "ns_embedding.weight", "ns_num_linear.weight", "ns_num_embedding.weight"],
        "sensitive": ["s_linear.weight", "s_embedding.weight", "s_num_linear.weight", "s_num_embedding.weight"],
        "common": ["bias.weight"],
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_tower_partition_and_names(kind):
    model = make(kind)
    names = {tower: sorted(n for n, _ in model.named_tower_parameters(tower)) for tower in EXPECTED_TOWERS[kind]}
    assert names == {t: sorted(v) for t, v in EXPECTED_TOWERS[kind].items()}
    groups = [model.nonsensitive_parameters(), model.sensitive_parameters(), model.common_parameters()]
    ids = [id(p) for group in groups for p in group]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}  # no buffers in checkpoints


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape_name", list(SHAPES))
def test_gradients_reach_every_parameter_and_truncated_spares_sensitive(kind, shape_name):
    shape = SHAPES[shape_name]
    model = make(kind, shape)
    x = batch(shape, size=16)
    y = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(3)).float()
    bce(model(*x), y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        if shape_name == "full":
            assert p.grad.abs().sum() > 0, name
    model.zero_grad(set_to_none=True)
    bce(model.forward_truncated(*x[:2]), y).backward()
    sensitive = {id(p) for p in model.sensitive_parameters()}
    for name, p in model.named_parameters():
        if id(p) in sensitive:
            assert p.grad is None, name
        else:
            assert p.grad is not None, name


def _synthetic(n=256, seed=0):
    """Labels that depend on a categorical id of each group and on a numeric feature."""
    g = torch.Generator().manual_seed(seed)
    ns_cat, ns_num, s_cat, s_num = batch(FULL, size=n, seed=seed)
    score = (ns_cat[:, 0] % 2).float() * 2 - 1 + (s_cat[:, 0] % 3 == 0).float() * 2 - 1 + ns_num[:, 0]
    y = (torch.rand(n, generator=g) < torch.sigmoid(2 * score)).float()
    return (ns_cat, ns_num, s_cat, s_num), y


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("truncated", [False, True])
def test_adam_reduces_loss(kind, truncated):
    x, y = _synthetic()
    model = make(kind)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)

    def loss():
        return bce(model.forward_truncated(*x[:2]) if truncated else model(*x), y)

    with torch.no_grad():
        start = loss().item()
    for _ in range(60):
        opt.zero_grad()
        value = loss()
        value.backward()
        opt.step()
    with torch.no_grad():
        end = loss().item()
    assert end < 0.85 * start


@pytest.mark.parametrize("kind", KINDS)
def test_config_round_trip(kind):
    model = make(kind, embedding_dim="auto")
    config = json.loads(json.dumps(model.config()))
    rebuilt = build_model(kind, config)
    assert rebuilt.config() == model.config()
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [(n, p.shape) for n, p in model.named_parameters()]
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    x = batch()
    assert torch.equal(rebuilt(*x), model(*x))
    assert model.kind == kind


@pytest.mark.parametrize("kind", KINDS)
def test_init_deterministic_under_manual_seed(kind):
    a, b, c = make(kind, seed=5), make(kind, seed=5), make(kind, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_embedding_init_is_small():
    for model in (make("mlp"), make("fm")):
        assert 0.005 < model.ns_embedding.weight.std().item() < 0.02


def test_defaults_follow_the_paper():
    model = TwoTowerMLP(**FULL)
    assert model.ns_embedding.embedding_dim == 32 and model.s_embedding.embedding_dim == 32
    assert model.ns_tower.out_features == 598
    assert [layer.out_features for layer in model.common] == [598, 598]
    assert model.common[0].in_features == 598 + 2 * 32 + 2
    assert FactorizationMachine(**FULL).k == 32


def test_auto_embedding_dim():
    assert auto_embedding_dim(1) == 2
    assert auto_embedding_dim(10_000) == 20
    assert auto_embedding_dim(100_000) == int(2 * 100_000 ** 0.25)
    mlp = build_model("mlp", **dict(FULL, ns_vocab=10_000, s_vocab=16), embedding_dim="auto",
                      tower_hidden=8, common_hidden=())
    assert (mlp.ns_embedding.embedding_dim, mlp.s_embedding.embedding_dim) == (20, 4)
    fm = build_model("fm", **dict(FULL, ns_vocab=10_000, s_vocab=16), embedding_dim="auto")
    assert fm.k == 20  # one k for both groups: their vectors meet in dot products


def test_mlp_without_common_hidden_layers():
    model = make("mlp", common_hidden=())
    assert len(model.common) == 0 and model.head.in_features == 16 + 2 * 4 + 2
    assert model(*batch()).shape == (7,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(FULL, embedding_dim="big"), "embedding_dim"),
    (dict(FULL, embedding_dim=0), "embedding_dim"),
    (dict(FULL, n_ns_cat=-1), "n_ns_cat"),
    (dict(FULL, s_vocab=0), "s_vocab"),
    (dict(FULL, n_ns_cat=0, n_ns_num=0, n_s_cat=0, n_s_num=0), "at least one feature"),
    (dict(FULL, colour="red"), "colour"),
])
@pytest.mark.parametrize("kind", KINDS)
def test_bad_constructor_arguments(kind, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_model(kind, **kwargs)


def test_bad_kind_and_mlp_widths():
    with pytest.raises(ValueError, match="kind"):
        build_model("gbdt", **FULL)
    with pytest.raises(ValueError, match="common_hidden"):
        build_model("mlp", **FULL, common_hidden=(8, 0))
    with pytest.raises(ValueError, match="tower_hidden"):
        build_model("mlp", **FULL, tower_hidden=0)


@pytest.mark.parametrize("kind", KINDS)
def test_inputs_with_wrong_columns_are_refused(kind):
    model = make(kind)
    ns_cat, ns_num, s_cat, s_num = batch()
    with pytest.raises(ValueError, match="s_num must have shape"):
        model(ns_cat, ns_num, s_cat, s_num[:, :1])
    with pytest.raises(ValueError, match="ns_cat must have shape"):
        model.forward_truncated(ns_cat[:, :2], ns_num)
    with pytest.raises(ValueError, match="rows"):
        model(ns_cat, ns_num[:3], s_cat, s_num)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_match_truncated_makes_the_full_model_the_truncated_one(kind):
    """Hybrid's DP-SGD phase starts from exactly the RR model; the sensitive tower still gets gradients."""
    torch.manual_seed(0)
    shape = dict(ns_vocab=20, n_ns_cat=2, n_ns_num=1, s_vocab=30, n_s_cat=2, n_s_num=2)
    model = build_model(kind, **shape, embedding_dim=4, **({"tower_hidden": 8, "common_hidden": (8,)}
                                                          if kind == "mlp" else {}))
    x = (torch.randint(0, 20, (16, 2)), torch.rand(16, 1), torch.randint(0, 30, (16, 2)), 3 * torch.rand(16, 2))
    assert not torch.allclose(model(*x), model.forward_truncated(*x[:2]))
    model.match_truncated()
    assert torch.equal(model(*x), model.forward_truncated(*x[:2]))
    model(*x).sum().backward()
    sensitive = [p.grad for _, p in model.named_tower_parameters("sensitive")]
    first = model.common[0].weight.grad[:, model.d_ns:] if kind == "mlp" else None
    assert any(g is not None and g.abs().sum() > 0 for g in sensitive + [first])
