"""The DP-SGD phase, exactly as the plan accounted it.

For each of the plan's T steps: a Poisson sample at rate q (``sampling.py``), each real
row's gradient clipped to the plan's C and summed without per-example gradients
(``clipping.py``), Gaussian noise of std sigma C added once to the sum, the result divided
by the expected batch size q N (never the realised one), then an optimiser step, which
is post-processing. Steps are counted as noisy updates, not chunks: a batch spread over
several chunks is still one step. The engine refuses to run more steps than the plan
holds, and a ledger (when given) is told before each step so that an interrupted run can
never under-count.

Everything privacy-relevant (q, T, C, sigma, N, truncation) comes from the plan's phase
parameters; ``DPSGDSettings`` holds only what cannot change the guarantee. When the plan's
N is a DP count (``size_private``), the data may have another number of rows: every row is
still sampled at the plan's q and the sum divided by the plan's q N, which keeps the
accounting (it never assumed N) and reveals only the plan's N.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass

import torch

from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.phases import DPSGDParams
from trainers.progress import bar

__all__ = ["DPSGDSettings", "DPSGDResult", "noisy_gradient", "phase_sampler", "run_dpsgd", "peak_memory"]


@dataclass(frozen=True, kw_only=True)
class DPSGDSettings:
    """Optimisation settings of the DP-SGD phase; none of them touches privacy."""

    # Adam at 0.01, constant: on the synthetic data's README example (147 steps, eps 8) it
    # reached 0-1% relative AUC loss where SGD momentum 0.9 at 0.1 with cosine decay (the
    # Hybrid paper's choice for its 5,860-step pCTR runs) lost 20-23%. SGD stays available.
    optimizer: str = "adam"         # "adam", or "sgd" (momentum 0.9, as the Hybrid paper)
    lr: float = 0.01
    cosine_decay: bool = False
    padded_size: int | None = None  # chunk size for static shapes; default E + 6 sqrt(E) in equal chunks <= max_chunk
    # A batch is clipped in chunks of at most this many rows whose clipped sums add before the
    # one noise draw: the book-keeping state (activations and output gradients) then covers a
    # chunk, not the batch. Measured on CPU at the pCTR shape (batch 16,384): 4 chunks took
    # 0.93x the time and 0.74x the memory of the non-private step; one chunk 1.07x and 1.63x.
    max_chunk: int | None = 4096

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class DPSGDResult:
    """What one session of the DP-SGD phase did (the run record is built from it and the ledger).

    Attributes:
        start_step: steps already counted when this session began (a resumed run).
        steps_taken: noisy steps this session took.
        batch_sizes: this session's realised (post-truncation) batch sizes, in order.
        batches_truncated: this session's batches cut to the plan's maximum.
        clipped: real rows whose gradient was clipped (a data-dependent count: private).
        chunks, padded_size: how batches were laid out (static shapes).
        noise_std, noise_draws: the std of the noise added to each clipped sum, and how many
            Gaussian draws this session made (over all ranks: rank 0 draws them all).
        world_size, rank_batch_sizes: the processes that ran the phase together, and (with
            more than one) each rank's own batch sizes, in rank order; ``batch_sizes`` and
            ``clipped`` are then totals over the ranks.
        rank_steps: with more than one process, the steps each rank counted on its own
            (the auditor refuses a run whose ranks disagree).
    """

    steps_planned: int
    start_step: int
    steps_taken: int
    batch_sizes: tuple[int, ...]
    batches_truncated: int
    clipped: int
    chunks: int
    padded_size: int
    noise_std: float
    noise_draws: int
    clipping_norm: float
    noise_multiplier: float
    sampling_rate: float
    expected_batch_size: float
    truncated: bool
    model: str
    trainable_parameters: int
    settings: dict
    seconds: float
    peak_memory: dict
    world_size: int = 1
    rank_batch_sizes: tuple | None = None  # with several processes: each rank's batch sizes, in rank order
    rank_steps: tuple | None = None        # with several processes: the steps each rank counted itself

    @property
    def clipped_fraction(self) -> float:
        rows = sum(self.batch_sizes)
        return self.clipped / rows if rows else 0.0


def _optimizer(params, s: DPSGDSettings):
    if s.optimizer == "adam":
        return torch.optim.Adam(params, lr=s.lr)
    if s.optimizer == "sgd":
        return torch.optim.SGD(params, lr=s.lr, momentum=0.9)
    raise InvalidParameterError(f"optimizer must be sgd or adam, got {s.optimizer!r}")


def peak_memory(device) -> dict:
    """Peak memory of the process on ``device`` so far (CUDA allocator, or the process RSS on CPU)."""
    if torch.device(device).type == "cuda":
        return {"kind": "cuda max_memory_allocated", "bytes": int(torch.cuda.max_memory_allocated(device))}
    import resource

    return {"kind": "process max RSS", "bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def noisy_gradient(model, data, batch, trainable: list, *, clipping_norm: float, noise_std: float,
                   expected_batch: float, noise_generator, loss_fn, truncated: bool = False,
                   collective=None) -> int:
    """Set each trainable parameter's .grad to (clipped sum + N(0, noise_std^2)) / expected_batch.

    The batch's chunks are clipped and summed separately and added up before the noise,
    which is drawn once per parameter element: one noisy update however many chunks. An
    empty batch gets the noise alone. With a ``collective`` (``trainers.distributed``) the
    sum covers every rank's rows and the noise is drawn by rank 0 alone, once. Returns how
    many of this rank's real rows were clipped.
    """
    from trainers.clipping import clipped_gradient_sum

    acc = [torch.zeros_like(p) for p in trainable]
    clipped = 0
    for idx, mask in batch.chunks:
        inputs = (data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx])
        out = clipped_gradient_sum(model, loss_fn, inputs, data.label[idx], mask=mask, clipping_norm=clipping_norm,
                                   parameters=trainable, truncated=truncated)
        for a, p in zip(acc, trainable):
            a.add_(p.grad)
        clipped += int(out["clipped"])
    if collective is None or collective.draws_noise:
        for a in acc:
            a.add_(torch.randn(a.shape, generator=noise_generator, device=a.device, dtype=a.dtype), alpha=noise_std)
    if collective is not None:
        collective.sum_(acc)
    for a, p in zip(acc, trainable):
        p.grad = a / expected_batch
    return clipped


def phase_sampler(data, params: DPSGDParams, settings: DPSGDSettings, randomness, *, distributed: bool = False):
    """The phase's Poisson sampler over the rows of ``data`` (this rank's shard, ``distributed``).

    Every row the data has is sampled at the plan's q, from a generator seeded by this
    process's randomness; the chunk holds the plan's expected batch (q N), or this shard's
    share of it (q times its rows).
    """
    from trainers.sampling import PoissonSampler, chunk_size

    q = params.sampling_rate
    padded = settings.padded_size
    if padded is None:
        padded = chunk_size(q * (len(data) if distributed else params.dataset_size), settings.max_chunk)
    trunc = params.max_batch_size if params.sampling == "truncated-poisson" else None
    return PoissonSampler(len(data), q, padded_size=padded, max_batch_size=trunc, seed=randomness.torch_seed(),
                          device=data.label.device)


def run_dpsgd(model, data, params: DPSGDParams, *, trainable: list, randomness, settings: DPSGDSettings | None = None,
              truncated: bool = False, ledger=None, progress: str | None = None, start_step: int = 0,
              checkpoint=None, checkpoint_every: int = 0, optimizer_state: dict | None = None,
              size_private: bool = False, collective=None) -> DPSGDResult:
    """Run the plan's DP-SGD phase on ``model`` in place; returns what this session ran.

    Args:
        data: EncodedData with exactly the plan's N rows (any number when ``size_private``), on
            the model's device.
        params: the plan's DP-SGD phase parameters.
        trainable: the parameters DP-SGD updates (a frozen tower is left out).
        randomness: the run's Randomness (sampling and noise generators are seeded from it).
        ledger: optional object with ``intend(step, batch_size)`` called before each noisy step.
        start_step: steps already taken (a resumed run); only the rest are run.
        checkpoint: optional ``checkpoint(step_done, optimizer_state)`` called every
            ``checkpoint_every`` steps (after the update).
        optimizer_state: optimiser and schedule state from a checkpoint, to resume with.
        size_private: the plan's N is a DP count: do not refuse another row count (that
            refusal would reveal the true one); q, q N and the chunk size stay the plan's.
        collective: this rank's ``trainers.distributed.Collective`` when several processes
            run the phase together, each on its shard of the rows (``data``): the plan's N is
            then the rows of all ranks, the batch sizes are global, and only rank 0 should
            be given a ledger.
    """
    from trainers.losses import bce

    settings = settings or DPSGDSettings()
    if not isinstance(params, DPSGDParams):
        raise PlanMismatchError(f"run_dpsgd needs the plan's DPSGDParams, got {type(params).__name__}")
    n, q, steps = params.dataset_size, params.sampling_rate, params.steps
    c, sigma = params.clipping_norm, params.noise_multiplier
    if collective is not None and params.sampling == "truncated-poisson":
        raise UnsupportedError("truncated Poisson sampling cuts the global batch: it is not run over several "
                               "processes (plan Poisson sampling, or run one process)")
    rows = len(data) if collective is None else collective.total(len(data), like=data.label)
    if rows != n and not size_private:
        raise InvalidParameterError(f"the DP-SGD phase has {rows} rows; the plan accounts N = {n}")
    if params.sampling == "truncated-poisson" and size_private:
        raise PlanMismatchError("truncated-Poisson accounting needs the exact N; a plan with a DP count has none")
    if not 0 <= start_step <= steps:
        raise InvalidParameterError(f"start_step must be in [0, {steps}], got {start_step}")
    if collective is not None:
        collective.agree("the DP-SGD phase's steps", steps)
        collective.agree("the steps already taken", start_step)
        collective.broadcast_(model)  # identical replicas from the first step on
        rank_rows = [r[0] for r in collective.gather([len(data)])]
        if ledger is not None and hasattr(ledger, "note_ranks"):
            ledger.note_ranks(rank_rows)  # the auditor tests each rank's batches against its rows
    device = data.label.device
    trunc = params.max_batch_size if params.sampling == "truncated-poisson" else None
    sampler = phase_sampler(data, params, settings, randomness, distributed=collective is not None)
    noise_gen = torch.Generator(device=device).manual_seed(randomness.torch_seed())
    opt = _optimizer(trainable, settings)
    schedule = None
    if settings.cosine_decay:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps))
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state["optimizer"])
        if schedule is not None and optimizer_state.get("schedule") is not None:
            schedule.load_state_dict(optimizer_state["schedule"])
    loss_fn = functools.partial(bce, reduction="none")
    expected = q * n
    noise_std = sigma * c
    sizes, local_sizes, clipped, chunks_run, noise_draws, truncated_count = [], [], 0, 0, 0, 0
    model.train()
    pbar = bar(progress, steps - start_step)
    t0 = time.perf_counter()
    try:
        for step in range(start_step, steps):
            # Which rows a Poisson batch holds depends on no data, so its size may go into the
            # intent; the noisy gradient, which does, comes only after the intent is logged.
            batch = sampler.sample()
            parts = None if collective is None else [r[0] for r in collective.gather([batch.size])]
            size = batch.size if parts is None else sum(parts)
            if ledger is not None:
                if parts is None:
                    ledger.intend(step, size)
                else:
                    ledger.intend(step, size, rank_batch_sizes=parts)
            clipped += noisy_gradient(model, data, batch, trainable, clipping_norm=c, noise_std=noise_std,
                                      expected_batch=expected, noise_generator=noise_gen, loss_fn=loss_fn,
                                      truncated=truncated, collective=collective)
            chunks_run += len(batch.chunks)
            if collective is None or collective.draws_noise:
                noise_draws += sum(p.numel() for p in trainable)
            opt.step()
            if schedule is not None:
                schedule.step()
            sizes.append(size)
            local_sizes.append(parts)
            truncated_count += batch.truncated
            if checkpoint is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < steps:
                checkpoint(step + 1, {"optimizer": opt.state_dict(),
                                      "schedule": schedule.state_dict() if schedule is not None else None})
            if pbar is not None:
                pbar[0].advance(pbar[1])
    finally:
        if pbar is not None:
            pbar[0].stop()
        for p in trainable:
            p.grad = None
    per_rank = rank_steps = None
    if collective is not None:
        clipped = collective.total(clipped, like=data.label)
        chunks_run = collective.total(chunks_run, like=data.label)
        per_rank = tuple(zip(*local_sizes)) if local_sizes else tuple(() for _ in range(collective.world_size))
        rank_steps = tuple(r[0] for r in collective.gather([len(local_sizes)]))  # each rank's own count
    return DPSGDResult(
        steps_planned=steps, start_step=start_step, steps_taken=len(sizes), batch_sizes=tuple(sizes),
        batches_truncated=truncated_count, clipped=clipped, chunks=chunks_run, padded_size=sampler.padded_size,
        noise_std=noise_std, noise_draws=noise_draws, clipping_norm=c, noise_multiplier=sigma, sampling_rate=q,
        expected_batch_size=expected, truncated=bool(trunc), model="truncated" if truncated else "full",
        trainable_parameters=int(sum(p.numel() for p in trainable)), settings=settings.to_dict(),
        seconds=time.perf_counter() - t0, peak_memory=peak_memory(device),
        world_size=1 if collective is None else collective.world_size, rank_batch_sizes=per_rank,
        rank_steps=rank_steps)



def expected_chunks(n: int, q: float, padded_size: int) -> float:
    """Average chunks per step (for benchmarks): 1 unless batches overflow the padding."""
    return max(1.0, math.ceil(n * q / padded_size))
