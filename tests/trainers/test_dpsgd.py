"""The DP-SGD phase: noise as planned, empty batches, step counting, the frozen tower."""

import functools

import numpy as np
import pytest
import torch
from scipy import stats

from budgetplan.errors import InvalidParameterError
from budgetplan.plan.phases import DPSGDParams
from trainers.data.encoded import EncodedData
from trainers.dpsgd import DPSGDSettings, encoded_rows, noisy_gradient, run_dpsgd
from trainers.losses import bce
from trainers.models import build_model
from trainers.randomness import Randomness
from trainers.sampling import Batch


def tiny_data(n=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    return EncodedData(
        ns_cat=torch.randint(0, 50, (n, 3), generator=g), ns_num=torch.randn(n, 2, generator=g),
        s_cat=torch.randint(0, 40, (n, 2), generator=g), s_num=torch.randn(n, 1, generator=g),
        label=(torch.rand(n, generator=g) < 0.3).float(), unit=None, ns_vocab=50, s_vocab=40)


def tiny_model(kind="mlp"):
    torch.manual_seed(0)
    extra = dict(tower_hidden=8, common_hidden=(8,)) if kind == "mlp" else {}
    return build_model(kind, ns_vocab=50, n_ns_cat=3, n_ns_num=2, s_vocab=40, n_s_cat=2, n_s_num=1,
                       embedding_dim=4, **extra)


def params(n, **kw):
    """DP-SGD phase parameters as a plan holds them (add-remove: sensitivity C)."""
    out = dict(dataset_size=n, sampling_rate=0.05, steps=20, clipping_norm=1.0, noise_multiplier=1.5,
               sampling="poisson", max_batch_size=None)
    out.update(kw)
    b = round(out["sampling_rate"] * n)
    return DPSGDParams(**out, noise_std=out["noise_multiplier"] * out["clipping_norm"],
                       sensitivity=out["clipping_norm"], batch_size=b, epochs=out["steps"] * b / n, cap=1,
                       capping=None, normalise_by="expected batch size q*N", model="full")


def empty_batch(p=8):
    return Batch(chunks=[(torch.zeros(p, dtype=torch.int64), torch.zeros(p))], size=0, drawn=0, truncated=False)


def test_empty_batch_adds_exactly_the_planned_noise():
    data, model = tiny_data(), tiny_model()
    trainable = list(model.parameters())
    gen = torch.Generator().manual_seed(3)
    sigma_c, expected = 2.0, 10.0
    noisy_gradient(model, encoded_rows(data), empty_batch(), trainable, clipping_norm=1.0, noise_std=sigma_c,
                   expected_batch=expected, noise_generator=gen, loss_fn=functools.partial(bce, reduction="none"))
    g = torch.cat([p.grad.flatten() for p in trainable]).numpy() * expected  # undo the division
    assert g.size > 500 and np.all(g != 0)
    # the empirical noise std equals sigma C: chi-square test on the sum of squares, false alarm 1e-6
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], g.size)
    assert lo < float((g ** 2).sum()) / sigma_c ** 2 < hi
    assert abs(g.mean()) < 6 * sigma_c / np.sqrt(g.size)


def test_noise_is_added_to_the_clipped_sum_once():
    from trainers.clipping import clipped_gradient_sum

    data, model = tiny_data(), tiny_model()
    trainable = list(model.parameters())
    idx = torch.arange(16)
    batch = Batch(chunks=[(idx[:8], torch.ones(8)), (idx[8:], torch.ones(8))], size=16, drawn=16, truncated=False)
    loss_fn = functools.partial(bce, reduction="none")
    noisy_gradient(model, encoded_rows(data), batch, trainable, clipping_norm=0.5, noise_std=0.0, expected_batch=4.0,
                   noise_generator=torch.Generator(), loss_fn=loss_fn)
    two_chunks = [p.grad.clone() for p in trainable]
    clipped_gradient_sum(model, loss_fn, (data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx]),
                         data.label[idx], mask=torch.ones(16), clipping_norm=0.5, parameters=trainable)
    for a, p in zip(two_chunks, trainable):
        torch.testing.assert_close(a, p.grad / 4.0, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["mlp", "fm"])
def test_several_chunks_defer_the_table_sums_and_give_the_same_gradient_bit_for_bit(kind, monkeypatch):
    """The tables' segment sums wait for the last chunk: the same index_add_ calls in the same order, so the
    gradient equals, bit for bit, that of adding each chunk's sums at once (the step before the deferral)."""
    from trainers import clipping

    data, model = tiny_data(), tiny_model(kind)
    trainable = list(model.parameters())
    idx = torch.randperm(48, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(48)
    mask[-5:] = 0  # padding rows in the last chunk
    batch = Batch(chunks=[(idx[i:i + 16], mask[i:i + 16]) for i in (0, 16, 32)], size=43, drawn=43, truncated=False)
    loss_fn = functools.partial(bce, reduction="none")
    deferred_lists = []
    real = clipping.clipped_gradient_sum

    def watch(*args, **kwargs):
        deferred_lists.append(kwargs["deferred"])
        return real(*args, **kwargs)

    def run(defer: bool):
        monkeypatch.setattr(clipping, "clipped_gradient_sum", watch if defer else
                            lambda *a, **k: real(*a, **{**k, "deferred": None}))
        noisy_gradient(model, encoded_rows(data), batch, trainable, clipping_norm=0.3, noise_std=0.7,
                       expected_batch=40.0, noise_generator=torch.Generator().manual_seed(5), loss_fn=loss_fn)
        return [p.grad.clone() for p in trainable]

    deferred, at_once = run(True), run(False)
    # one list shared by the three chunks, emptied by add_deferred
    assert len(deferred_lists) == 3 and deferred_lists[0] is deferred_lists[2] == []
    tables = [p for name, p in model.named_parameters() if "embedding" in name]
    assert tables
    for a, b in zip(deferred, at_once):
        assert torch.equal(a, b)
    assert all(bool((p.grad != 0).any()) for p in tables)


def test_one_chunk_defers_nothing(monkeypatch):
    from trainers import clipping

    data, model = tiny_data(), tiny_model()
    seen = []
    real = clipping.clipped_gradient_sum
    monkeypatch.setattr(clipping, "clipped_gradient_sum", lambda *a, **k: seen.append(k["deferred"]) or real(*a, **k))
    batch = Batch(chunks=[(torch.arange(16), torch.ones(16))], size=16, drawn=16, truncated=False)
    noisy_gradient(model, encoded_rows(data), batch, list(model.parameters()), clipping_norm=0.5, noise_std=0.7,
                   expected_batch=4.0, noise_generator=torch.Generator(),
                   loss_fn=functools.partial(bce, reduction="none"))
    assert seen == [None]


def test_deferred_sums_need_accumulate():
    from trainers.clipping import clipped_gradient_sum

    data, model = tiny_data(), tiny_model()
    idx = torch.arange(8)
    with pytest.raises(InvalidParameterError, match="deferred sums need accumulate=True"):
        clipped_gradient_sum(model, functools.partial(bce, reduction="none"),
                             (data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx]), data.label[idx],
                             mask=torch.ones(8), clipping_norm=0.5, deferred=[])


def test_the_noise_is_the_same_draws_added_to_the_same_clipped_sum():
    """Noise drawn into the gradient buffers first: the values of randn per parameter, in order, plus the sum."""
    from trainers.clipping import clipped_gradient_sum

    data, model = tiny_data(), tiny_model()
    trainable = list(model.parameters())
    idx = torch.arange(16)
    batch = Batch(chunks=[(idx[:8], torch.ones(8)), (idx[8:], torch.ones(8))], size=16, drawn=16, truncated=False)
    loss_fn = functools.partial(bce, reduction="none")
    noisy_gradient(model, encoded_rows(data), batch, trainable, clipping_norm=0.5, noise_std=0.7, expected_batch=4.0,
                   noise_generator=torch.Generator().manual_seed(5), loss_fn=loss_fn)
    got = [p.grad.clone() for p in trainable]
    gen = torch.Generator().manual_seed(5)
    noise = [torch.randn(p.shape, generator=gen) * 0.7 for p in trainable]
    clipped_gradient_sum(model, loss_fn, (data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx]),
                         data.label[idx], mask=torch.ones(16), clipping_norm=0.5, parameters=trainable)
    for a, n, p in zip(got, noise, trainable):
        torch.testing.assert_close(a, (p.grad + n) / 4.0, rtol=1e-5, atol=1e-6)
        # the noise is really there (not a zero or a different draw): far from the sum alone
        assert float((a - p.grad / 4.0).abs().max()) > 0.05


def test_the_step_evidence_is_the_draws_sums_of_squares_read_once():
    """Each step's chi-square is the sum of the squares of the draws made, to float32 summation rounding.

    The sums stay device tensors through the steps (no host sync per step) and are read at the
    session's end; the values are those of the draws recomputed from the same seed, squared and
    summed exactly in float64, within 1e-6 relative (a sum of float32 squares in float32 is off
    by about 1e-7; another draw of these ~640 values by about 5%).
    """
    from trainers.dpsgd import DPSGDStep

    data, model = tiny_data(), tiny_model()
    trainable = list(model.parameters())
    par = params(200, steps=3)
    step = DPSGDStep(model, par, trainable=trainable, optimizer=torch.optim.SGD(trainable, lr=0.1),
                     loss_fn=functools.partial(bce, reduction="none"), noise_generator=torch.Generator().manual_seed(9))
    idx = torch.arange(8)
    for _ in range(3):
        step(Batch(chunks=[(idx, torch.ones(8))], size=8, drawn=8, truncated=False), encoded_rows(data))
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.float64 for s in step.evidence.sumsq)
    evidence = step.result(padded_size=8, settings={}, device=torch.device("cpu")).evidence
    gen, expected = torch.Generator().manual_seed(9), []
    for _ in range(3):
        draws = torch.cat([torch.randn(p.shape, generator=gen).flatten() for p in trainable])
        expected.append(float(draws.double().square().sum()))
    n = sum(p.numel() for p in trainable)
    assert evidence["noise_draws"] == [n] * 3
    assert evidence["noise_chi2"] == pytest.approx(expected, rel=1e-6, abs=0)
    assert evidence["noise_chi2"] != pytest.approx(expected[1:] + expected[:1], rel=1e-3)  # each step its own draws
    assert evidence["noise_ranks"] == [[0]] * 3 and len(set(expected)) == 3


@pytest.mark.parametrize("shapes", [[(5,)], [(40,)], [(37,), (3,)], [(4, 16), (16,), (81,), (2, 3, 7)]])
def test_noise_drawn_in_blocks_is_randn_of_each_parameter_bit_for_bit(monkeypatch, shapes):
    """Blocks of 16 draws (a tail under 16 joins the block before it): the values, the rounding of
    ``(a + sigma z) / E`` and the generator's state are those of one torch.randn per parameter."""
    from trainers import dpsgd

    monkeypatch.setattr(dpsgd, "NOISE_BLOCK", 16)
    g = torch.Generator().manual_seed(4)
    sums = [torch.randn(shape, generator=g) for shape in shapes]
    acc = [a.clone() for a in sums]
    gen = torch.Generator().manual_seed(21)
    draws, sumsq = dpsgd.add_noise(acc, 0.37, gen, divisor=3.0)
    ref_gen = torch.Generator().manual_seed(21)
    noise = [torch.randn(shape, generator=ref_gen) for shape in shapes]
    for got, a, z in zip(acc, sums, noise):
        assert torch.equal(got, a.clone().add_(z.clone().mul_(0.37)).div_(3.0))
    assert torch.equal(torch.randn(3, generator=gen), torch.randn(3, generator=ref_gen))  # the same draws consumed
    assert draws == sum(z.numel() for z in noise) and sumsq.dtype == torch.float64
    exact = float(sum(z.double().square().sum() for z in noise))
    assert float(sumsq) == pytest.approx(exact, rel=1e-6, abs=0)
    without = [a.clone() for a in sums]
    dpsgd.add_noise(without, 0.37, torch.Generator().manual_seed(21))  # no divisor: no division
    assert all(torch.equal(w, a.clone().add_(z.clone().mul_(0.37))) for w, a, z in zip(without, sums, noise))


def test_the_noise_is_drawn_after_the_backward_not_beside_it(monkeypatch):
    """No gradient buffer (noise or the last step's gradient) is held while a chunk is clipped, but the first."""
    from trainers import clipping

    data, model = tiny_data(), tiny_model()
    trainable = list(model.parameters())
    for p in trainable:
        p.grad = torch.ones_like(p)  # the last step's gradient
    held, real = [], clipping.clipped_gradient_sum

    def spy(*args, **kw):
        held.append(sum(p.grad is not None for p in trainable))
        return real(*args, **kw)

    monkeypatch.setattr(clipping, "clipped_gradient_sum", spy)
    idx = torch.arange(16)
    batch = Batch(chunks=[(idx[:8], torch.ones(8)), (idx[8:], torch.ones(8))], size=16, drawn=16, truncated=False)
    noisy_gradient(model, encoded_rows(data), batch, trainable, clipping_norm=0.5, noise_std=0.7, expected_batch=4.0,
                   noise_generator=torch.Generator().manual_seed(5), loss_fn=functools.partial(bce, reduction="none"))
    # the second chunk adds into the first one's sums; the tables' sums wait for the last chunk
    tables = sum(isinstance(m, torch.nn.Embedding) for m in model.modules())
    assert tables == 2 and held == [0, len(trainable) - tables]
    assert all(p.grad is not None and bool((p.grad != 1).all()) for p in trainable)


def test_run_counts_steps_and_records_batch_statistics():
    data, model = tiny_data(), tiny_model("fm")
    rec = run_dpsgd(model, data, params(200), trainable=list(model.parameters()), randomness=Randomness(1))
    assert rec.start_step + rec.steps_taken == rec.steps_planned == 20 and len(rec.batch_sizes) == 20
    assert rec.expected_batch_size == 10.0
    assert rec.noise_draws == 20 * sum(p.numel() for p in model.parameters())
    assert rec.noise_std == 1.5 and 0 <= rec.clipped_fraction <= 1 and rec.clipped <= sum(rec.batch_sizes)
    assert rec.peak_memory["bytes"] > 0


def test_resume_runs_only_the_remaining_steps_and_never_more():
    data, model = tiny_data(), tiny_model()
    calls = []

    class Ledger:
        def intend(self, step, batch_size=None):
            calls.append(step)

    rec = run_dpsgd(model, data, params(200), trainable=list(model.parameters()), randomness=Randomness(1),
                    start_step=15, ledger=Ledger())
    assert calls == [15, 16, 17, 18, 19] and rec.start_step + rec.steps_taken == 20
    with pytest.raises(InvalidParameterError, match="start_step"):
        run_dpsgd(model, data, params(200), trainable=list(model.parameters()), randomness=Randomness(1),
                  start_step=21)


def test_refuses_data_of_another_size():
    data, model = tiny_data(), tiny_model()
    with pytest.raises(InvalidParameterError, match="plan accounts N = 201"):
        run_dpsgd(model, data, params(201), trainable=list(model.parameters()), randomness=Randomness(1))


def test_frozen_tower_is_untouched():
    data, model = tiny_data(), tiny_model()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if model.tower_of(n) == "nonsensitive"}
    for n, p in model.named_parameters():
        p.requires_grad_(model.tower_of(n) != "nonsensitive")
    trainable = [p for p in model.parameters() if p.requires_grad]
    run_dpsgd(model, data, params(200), trainable=trainable, randomness=Randomness(2),
              settings=DPSGDSettings(optimizer="adam", lr=0.01))
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n


def test_truncated_poisson_batches_never_exceed_the_maximum():
    data, model = tiny_data(), tiny_model()
    rec = run_dpsgd(model, data, params(200, sampling_rate=0.5, sampling="truncated-poisson", max_batch_size=60),
                    trainable=list(model.parameters()), randomness=Randomness(4))
    assert max(rec.batch_sizes) <= 60 and rec.truncated and rec.batches_truncated > 0


def test_the_chunk_default_follows_the_device_and_yields_to_the_caller():
    from trainers.dpsgd import GPU_MAX_CHUNK, DPSGDSettings

    assert DPSGDSettings.for_device("cpu") == DPSGDSettings() and DPSGDSettings().max_chunk == 4096
    assert DPSGDSettings.for_device(torch.device("cuda")).max_chunk == GPU_MAX_CHUNK == 65_536
    assert DPSGDSettings.for_device("cuda:0", lr=0.5) == DPSGDSettings(lr=0.5, max_chunk=GPU_MAX_CHUNK)
    assert DPSGDSettings.for_device("cuda", max_chunk=1024).max_chunk == 1024  # an explicit choice stays


def test_the_default_step_size_falls_like_one_over_the_root_of_the_steps(monkeypatch):
    from trainers import dpsgd

    assert DPSGDSettings().step_size(144) == pytest.approx(dpsgd.LR_SCALE / 12)
    assert DPSGDSettings().step_size(576) == pytest.approx(DPSGDSettings().step_size(144) / 2)
    assert DPSGDSettings(lr=0.3).step_size(576) == 0.3
    seen = []
    original = torch.optim.Adam

    def adam(params, lr):
        seen.append(lr)
        return original(params, lr=lr)

    monkeypatch.setattr(torch.optim, "Adam", adam)
    data, model = tiny_data(), tiny_model("fm")
    run_dpsgd(model, data, params(200, steps=25), trainable=list(model.parameters()), randomness=Randomness(1))
    assert seen == [pytest.approx(dpsgd.LR_SCALE / 5)]
