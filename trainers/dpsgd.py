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
import resource
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.plan.phases import DPSGDParams
from trainers import clipping  # clipped_gradient_sum looked up at each call: tests swap it
from trainers.evidence import StepEvidence, merge
from trainers.losses import bce
from trainers.progress import bar
from trainers.sampling import (
    AllocationSampler,
    PoissonSampler,
    ShuffleSampler,
    UnitPoissonSampler,
    chunk_size,
    default_padded_size,
    fixed_chunk_size,
    unit_table,
)

__all__ = ["DPSGDSettings", "DPSGDResult", "DPSGDStep", "GLOBAL_SAMPLING", "add_noise", "check_resume",
           "check_rows", "check_unit_count", "count_units", "encoded_rows", "NoisyGradient", "noisy_gradient",
           "phase_sampler", "run_dpsgd", "peak_memory"]


# The largest chunk on a GPU: a pCTR-shaped batch of 65,536 rows in one chunk holds a few GiB
# of book-keeping state, far inside any data-centre GPU's memory.
GPU_MAX_CHUNK = 65_536
LR_SCALE = 0.12  # the DP-SGD phase's Adam step size is LR_SCALE / sqrt(its steps) unless one is given


@dataclass(frozen=True, kw_only=True)
class DPSGDSettings:
    """Optimisation settings of the DP-SGD phase; none of them touches privacy."""

    # Adam, constant, at LR_SCALE / sqrt(T) for a phase of T steps unless ``lr`` is given. With
    # noise on every coordinate Adam moves each by about lr a step, so the drift the noise causes
    # grows like lr sqrt(T): the step size that keeps it fixed falls like 1 / sqrt(T). Measured
    # (CHANGELOG): 0.12 / sqrt(T) was the best of 0.06, 0.12 and 0.25 on two shapes, at 200,000 and
    # 800,000 training rows and 146 to 1,000 steps; a fixed 0.01 (0.12 / sqrt(T) at T = 146, the
    # README example) lost up to 5 AUC points at 586 steps. SGD (momentum 0.9, as the Hybrid
    # paper) stays available with an explicit lr.
    optimizer: str = "adam"         # "adam", or "sgd" (momentum 0.9, as the Hybrid paper)
    lr: float | None = None
    cosine_decay: bool = False
    padded_size: int | None = None  # chunk size for static shapes; default E + 6 sqrt(E) in equal chunks <= max_chunk
    # A batch is clipped in chunks of at most this many rows whose clipped sums add before the
    # one noise draw: the book-keeping state (activations and output gradients) then covers a
    # chunk, not the batch. Measured on CPU (batch 16,384, one thread; dpsgd_step results): 4
    # chunks took 0.87x the time and 0.60x the memory of the non-private step at the pCTR shape,
    # 1.08x and 0.38x at attribution; one chunk 0.99x and 1.14x, 1.07x and 0.99x.
    # On a GPU small chunks waste it: see for_device.
    max_chunk: int | None = 4096

    def to_dict(self) -> dict:
        return asdict(self)

    def step_size(self, steps: int) -> float:
        """The learning rate of a phase of ``steps`` steps: ``lr``, or LR_SCALE / sqrt(steps)."""
        return self.lr if self.lr is not None else LR_SCALE / math.sqrt(max(1, int(steps)))

    @classmethod
    def for_device(cls, device, **overrides) -> DPSGDSettings:
        """The defaults for ``device`` (a ``torch.device``), with ``overrides`` applied.

        On CUDA a chunk holds up to :data:`GPU_MAX_CHUNK` rows. Measured on an H100 at the
        pCTR shape (batch 16,384), a DP-SGD step in one chunk took 1.17x the non-private
        step's time, and in four chunks 2.65x: each chunk launches the same small kernels
        again. On the CPU the default stays 4,096.
        """
        if torch.device(device).type == "cuda":
            overrides = {"max_chunk": GPU_MAX_CHUNK, **overrides}
        return cls(**overrides)


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
        clipped_per: ``"unit"`` when units were sampled and each unit's summed gradient was
            clipped once (``batch_sizes`` and ``clipped`` then count units), else ``"example"``.
        evidence: what each step of this session did, measured (``trainers.evidence.merge``):
            the noise each rank drew, allocation and shuffle participation, units kept whole.
            Rank 0's result holds every rank's; None on the other ranks.
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
    clipped_per: str = "example"
    evidence: dict | None = None

    @property
    def clipped_fraction(self) -> float:
        rows = sum(self.batch_sizes)
        return self.clipped / rows if rows else 0.0


def _optimizer(params, s: DPSGDSettings, steps: int):
    if s.optimizer == "adam":
        return torch.optim.Adam(params, lr=s.step_size(steps))
    if s.optimizer == "sgd":
        return torch.optim.SGD(params, lr=s.step_size(steps), momentum=0.9)
    raise InvalidParameterError(f"optimizer must be sgd or adam, got {s.optimizer!r}")


def peak_memory(device) -> dict:
    """Peak memory of the process on ``device`` so far (CUDA allocator, or the process RSS on CPU)."""
    if torch.device(device).type == "cuda":
        return {"kind": "cuda max_memory_allocated", "bytes": int(torch.cuda.max_memory_allocated(device))}

    return {"kind": "process max RSS", "bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}


def encoded_rows(data):
    """``rows(idx) -> (model inputs, targets)`` over EncodedData, for ``noisy_gradient`` and ``DPSGDStep``."""
    return lambda idx: ((data.ns_cat[idx], data.ns_num[idx], data.s_cat[idx], data.s_num[idx]), data.label[idx])


class NoisyGradient(NamedTuple):
    """What ``noisy_gradient`` did on this rank: rows (units) clipped, noise draws made, their sum of squares.

    ``clipped`` (int64) and ``noise_sumsq`` (float64, None when no draw was made) are 0-d tensors
    on the gradients' device: reading them is a host sync, which a step leaves to the session's end.
    """

    clipped: torch.Tensor
    noise_draws: int
    noise_sumsq: torch.Tensor | None


def noisy_gradient(model, rows, batch, trainable: list, *, clipping_norm: float, noise_std: float,
                   expected_batch: float, noise_generator, loss_fn, truncated: bool = False,
                   collective=None, unit_rows: int = 1) -> NoisyGradient:
    """Set each trainable parameter's .grad to (clipped sum + N(0, noise_std^2)) / expected_batch.

    The batch's chunks are clipped and summed into the gradient buffers, then the noise is
    drawn once per parameter element and added to them: one noisy update however many
    chunks. An empty batch gets the noise alone. With a ``collective`` (``trainers.distributed``) the
    sum covers every rank's rows and the noise is drawn by rank 0 alone, once. Returns how
    many of this rank's real rows were clipped, and the noise this rank drew: how many
    standard normal draws (scaled by ``noise_std`` when added) and the sum of their squares,
    measured on the draws added (``trainers.evidence``).

    Args:
        rows: ``rows(idx)`` -> ``(inputs, targets)``, the model's positional inputs and the
            loss's targets at the row indices ``idx`` (``encoded_rows(data)`` for EncodedData).
        unit_rows: K when units are sampled: the chunks hold each unit's rows in a block of K,
            and each block's summed gradient is clipped once (``clipped_gradient_sum``); the
            count returned is then of clipped units.
    """

    # Every chunk's clipped sum is added into the gradient buffers (clipped_gradient_sum(accumulate=True)):
    # no zeroed accumulator. The noise is added after the last chunk, once the activations are gone: buffers
    # drawn before the backward would sit beside the activations and every layer's output gradients, at
    # the step's peak. The draws are those of one torch.randn per parameter, in parameter order, drawn a
    # block at a time into one scratch block (add_noise): no temporary the size of a parameter.
    # With several chunks the embedding tables' segment sums wait for the last chunk (clipping.add_deferred):
    # bit for bit the same sums, made while the table's gradient is in the cache.
    for p in trainable:
        p.grad = None
    clipped = torch.zeros((), dtype=torch.int64, device=trainable[0].device if trainable else None)
    deferred = [] if len(batch.chunks) > 1 else None
    for idx, mask in batch.chunks:
        inputs, targets = rows(idx)
        out = clipping.clipped_gradient_sum(model, loss_fn, inputs, targets, mask=mask, clipping_norm=clipping_norm,
                                   parameters=trainable, truncated=truncated, unit_rows=unit_rows,
                                   accumulate=True, deferred=deferred)
        clipped = clipped + out["clipped"]  # on the device: no host sync per chunk
    if deferred:
        clipping.add_deferred(deferred)
    acc = [torch.zeros_like(p, memory_format=torch.contiguous_format) if p.grad is None else p.grad.contiguous()
           for p in trainable]
    draws, sumsq = 0, None
    if collective is None or collective.draws_noise:
        # With no all-reduce to come, the division by q N is done with the noise, block by block.
        draws, sumsq = add_noise(acc, noise_std, noise_generator,
                                 divisor=expected_batch if collective is None else None)
    if collective is not None:
        collective.sum_(acc)
        for a in acc:
            a.div_(expected_batch)
    for a, p in zip(acc, trainable):
        p.grad = a
    return NoisyGradient(clipped, draws, sumsq)


# Draws per block of the noise on the CPU: each block is drawn, its squares summed and added
# into the gradient while it is in the cache (2^18 float32 = 1 MiB, half of one core's L2 here).
# Blocks are whole groups of 16 draws, so they reproduce torch.randn of the whole parameter
# bit for bit (its CPU kernel transforms 16 uniforms at a time and redraws a short tail).
NOISE_BLOCK = 1 << 18


def _blocks(n: int, block: int) -> list[tuple[int, int]]:
    """[start, end) of each block of n draws: whole blocks, the last one taking a tail of under 16."""
    starts = list(range(0, n, block))
    if len(starts) > 1 and n - starts[-1] < 16:
        starts.pop()
    return list(zip(starts, starts[1:] + [n]))


def add_noise(acc: list[torch.Tensor], noise_std: float, generator, *, divisor: float | None = None):
    """Add ``noise_std`` times one standard normal draw per element to each contiguous buffer of ``acc``.

    The draws are those of ``torch.randn`` of each buffer's shape, in order, with
    ``generator``; each buffer becomes ``(a + noise_std z) / divisor`` (no division when
    ``divisor`` is None), element by element with the rounding of ``a.add_(z.mul_(noise_std))``
    then ``a.div_(divisor)``. On the CPU the draws are made NOISE_BLOCK at a time into one
    scratch block, whose squares are summed and which is added while it is in the cache; on
    a GPU a block is a whole parameter.

    Returns ``(draws, sum of squares)``: the number of draws and the sum of their squares,
    a float64 0-d tensor on the buffers' device (None when ``acc`` is empty). A block's
    squares are summed in its dtype by ``torch.sum`` (cascade summation: for float32, 5e-8
    relative, unbiased, measured over 100 blocks of 2^18 draws, where one float32 ``torch.dot``
    was 1e-7 low on average), the blocks in float64; the chi-square test that reads the sum
    resolves sqrt(2 / draws), over 1e-6 for up to 10^12 draws.
    """
    if not acc:
        return 0, None
    largest = max(a.numel() for a in acc)
    block = NOISE_BLOCK if acc[0].device.type == "cpu" else largest
    # per dtype: a block of draws and a block of their squares (a block and a tail of under 16)
    scratch: dict[torch.dtype, torch.Tensor] = {}
    squares = []
    for a in acc:
        if a.dtype not in scratch:
            scratch[a.dtype] = a.new_empty(2, min(largest, block + 15))
        flat = a.view(-1)
        for start, end in _blocks(flat.numel(), block):
            z, sq = scratch[a.dtype][:, :end - start]
            z.normal_(generator=generator)  # the values of randn(...), this block of them
            # the commitment to the draws actually added: the sum of their squares
            squares.append(torch.square(z, out=sq).sum().to(torch.float64))
            part = flat[start:end]
            part.add_(z.mul_(noise_std))
            if divisor is not None:
                part.div_(divisor)
    total = torch.stack(squares).sum() if squares else acc[0].new_zeros((), dtype=torch.float64)
    return sum(a.numel() for a in acc), total


class DPSGDStep:
    """The plan's DP-SGD phase, one noisy step per call: what every DP-SGD loop here runs.

    A call takes one Poisson batch: logs the intent (with the batch size, which depends on
    no data) before any gradient is touched, sets the noisy gradient (``noisy_gradient``:
    clipped sum, one noise draw of std sigma C, divided by q N) and steps the optimiser. A
    call beyond the plan's T steps is refused. ``run_dpsgd`` and ``trainers.private``'s
    user-facing step are both loops over it.

    Args:
        params: the plan's DP-SGD phase parameters.
        trainable: the parameters the noise is drawn for and the optimiser updates.
        optimizer: a torch optimiser over (a subset of) ``trainable``.
        loss_fn: ``loss_fn(outputs, targets)`` -> per-example losses.
        noise_generator: the torch generator of the noise (seeded from the run's randomness).
        ledger: optional object with ``intend(step, batch_size)``.
        start_step: steps already counted (a resumed run).
        truncated: clip through ``model.forward_truncated``.
        collective: this rank's ``trainers.distributed.Collective``, or None.
        rows: the rows this rank samples from, to count each one's participation in every
            epoch of allocation or shuffled batches (``trainers.evidence``); None: not counted.
        unit: this rank's rows' dense unit ids when the plan samples units, to check that
            every sampled unit is whole in its block; None: not checked.
    """

    def __init__(self, model, params: DPSGDParams, *, trainable: list, optimizer, loss_fn, noise_generator,
                 ledger=None, start_step: int = 0, truncated: bool = False, collective=None,
                 rows: int | None = None, unit=None):
        if not isinstance(params, DPSGDParams):
            raise PlanMismatchError(f"the DP-SGD step needs the plan's DPSGDParams, got {type(params).__name__}")
        if not 0 <= start_step <= params.steps:
            raise InvalidParameterError(f"start_step must be in [0, {params.steps}], got {start_step}")
        self.model, self.params, self.trainable, self.optimizer = model, params, list(trainable), optimizer
        self.loss_fn, self.noise_generator, self.ledger = loss_fn, noise_generator, ledger
        self.truncated, self.collective = truncated, collective
        self.noise_std = params.noise_multiplier * params.clipping_norm
        self.expected_batch = params.expected_batch_size
        self.unit_rows = params.cap if params.samples_units else 1
        self.start_step = self.step = start_step  # the next step's index
        self.sizes: list[int] = []        # global batch sizes, as the ledger holds them
        self.local_sizes: list = []       # with a collective: every rank's part of each step
        self.chunks = self.noise_draws = self.batches_truncated = 0
        self.clipped: torch.Tensor | int = 0  # a device tensor once a step ran: read in ``result``
        self.evidence = StepEvidence(params, rows=rows, unit=unit, start_step=start_step)
        self.t0 = time.perf_counter()

    @property
    def remaining(self) -> int:
        return self.params.steps - self.step

    def __call__(self, batch, rows) -> None:
        """Take one noisy step on ``batch`` (a ``sampling.Batch``) of ``rows`` (see ``noisy_gradient``)."""
        steps, coll = self.params.steps, self.collective
        if self.step >= steps:
            raise PlanMismatchError(f"the plan's DP-SGD phase accounts {steps} noisy steps and all {steps} are "
                                    "taken: one more would spend budget the plan does not hold")
        parts = None if coll is None else [r[0] for r in coll.gather([batch.size])]
        size = batch.size if parts is None else sum(parts)
        # Which rows a Poisson batch holds depends on no data, so its size may go into the
        # intent; the noisy gradient, which does, comes only after the intent is logged.
        if self.ledger is not None:
            if parts is None:
                self.ledger.intend(self.step, size)
            else:
                self.ledger.intend(self.step, size, rank_batch_sizes=parts)
        self.evidence.batch(batch)
        done = noisy_gradient(self.model, rows, batch, self.trainable,
                              clipping_norm=self.params.clipping_norm, noise_std=self.noise_std,
                              expected_batch=self.expected_batch, noise_generator=self.noise_generator,
                              loss_fn=self.loss_fn, truncated=self.truncated, collective=coll,
                              unit_rows=self.unit_rows)
        self.clipped += done.clipped
        self.chunks += len(batch.chunks)
        self.noise_draws += done.noise_draws  # the draws made, not the draws meant (a rank that drew none adds 0)
        self.evidence.drew(done.noise_draws, done.noise_sumsq)
        self.optimizer.step()
        self.step += 1
        self.sizes.append(size)
        self.local_sizes.append(parts)
        self.batches_truncated += batch.truncated

    def result(self, *, padded_size: int, settings: dict, device) -> DPSGDResult:
        """What this session ran (totals over the ranks with a collective: call it on every rank)."""
        par, coll = self.params, self.collective
        clipped, chunks, per_rank, rank_steps = int(self.clipped), self.chunks, None, None
        mine = self.evidence.local()
        draws, evidence = self.noise_draws, merge([mine])
        if coll is not None:
            like = self.trainable[0] if self.trainable else None
            clipped, chunks = coll.total(clipped, like=like), coll.total(chunks, like=like)
            draws = coll.total(draws, like=like)  # every rank's draws: rank 0's alone when honest
            parts = coll.gather_object(mine)
            evidence = None if parts is None else merge(parts)
            per_rank = tuple(zip(*self.local_sizes)) if self.local_sizes else tuple(() for _ in range(coll.world_size))
            rank_steps = tuple(r[0] for r in coll.gather([len(self.local_sizes)]))  # each rank's own count
        return DPSGDResult(
            steps_planned=par.steps, start_step=self.start_step, steps_taken=len(self.sizes),
            batch_sizes=tuple(self.sizes), batches_truncated=self.batches_truncated, clipped=clipped, chunks=chunks,
            padded_size=padded_size, noise_std=self.noise_std, noise_draws=draws,
            clipping_norm=par.clipping_norm, noise_multiplier=par.noise_multiplier, sampling_rate=par.sampling_rate,
            expected_batch_size=self.expected_batch, truncated=par.sampling == "truncated-poisson",
            model="truncated" if self.truncated else "full",
            trainable_parameters=int(sum(p.numel() for p in self.trainable)), settings=settings,
            seconds=time.perf_counter() - self.t0, peak_memory=peak_memory(device),
            world_size=1 if coll is None else coll.world_size, rank_batch_sizes=per_rank, rank_steps=rank_steps,
            clipped_per="unit" if par.samples_units else "example", evidence=evidence)


def phase_sampler(data, params: DPSGDParams, settings: DPSGDSettings, randomness, *, distributed: bool = False,
                  device=None):
    """The phase's sampler over the rows of ``data`` (this rank's shard, ``distributed``), as the plan chose.

    Poisson (truncated or not): every row the data has (every unit, when units are sampled)
    is sampled at the plan's q, from a generator seeded by this process's randomness; the
    chunk holds the plan's expected batch (q N or q M), or this shard's share of it (q times
    its rows or units). Allocation and shuffled batches
    (one process only): whole epochs of the plan's N // B steps over the N rows, chunked for
    their mean batch N / (N // B) or exactly B. The indices live on ``device`` (default the
    labels').
    """

    device = data.label.device if device is None else device
    padded = settings.padded_size
    if params.samples_units:
        # Chunks of whole units of K rows: padded_size and max_chunk count rows. By default a
        # chunk holds E + 6 sqrt(E) units (E = q M, or q times this shard's units), split into
        # the fewest equal chunks of at most max_chunk rows.
        k = params.cap
        table = unit_table(data.unit.cpu(), params.cap)
        if padded is not None:
            units = max(1, padded // k)
        else:
            units = default_padded_size(params.sampling_rate * len(table) if distributed
                                        else params.expected_batch_size)
            if settings.max_chunk is not None and units * k > settings.max_chunk:
                units = max(1, math.ceil(units / math.ceil(units * k / settings.max_chunk)))
        return UnitPoissonSampler(table, params.sampling_rate, padded_units=units, seed=randomness.torch_seed(),
                                  device=device)
    if params.sampling == "allocation":
        t = params.steps_per_epoch
        return AllocationSampler(len(data), t, padded_size=padded or chunk_size(len(data) / t, settings.max_chunk),
                                 seed=randomness.torch_seed(), device=device)
    if params.sampling == "shuffle":
        return ShuffleSampler(len(data), params.batch_size,
                              padded_size=padded or fixed_chunk_size(params.batch_size, settings.max_chunk),
                              seed=randomness.torch_seed(), device=device)
    q = params.sampling_rate
    if padded is None:
        padded = chunk_size(q * (len(data) if distributed else params.dataset_size), settings.max_chunk)
    trunc = params.max_batch_size if params.sampling == "truncated-poisson" else None
    return PoissonSampler(len(data), q, padded_size=padded, max_batch_size=trunc, seed=randomness.torch_seed(),
                          device=device)


# Why each non-Poisson sampling needs one process: it draws over all N rows at once.
GLOBAL_SAMPLING = {
    "truncated-poisson": "truncated Poisson sampling cuts the global batch",
    "allocation": "random allocation assigns every row of the global data to a step of each epoch",
    "shuffle": "shuffled batches cut one permutation of the global rows",
}


def check_resume(params: DPSGDParams, start_step: int) -> None:
    """Allocation and shuffled batches resume only at an epoch boundary.

    Their accounting counts one batch per example per epoch; a session that resumed mid-epoch
    would draw a fresh epoch for the rest of it, and an example could be used twice in one.
    """
    if params.sampling in ("allocation", "shuffle") and start_step % params.steps_per_epoch:
        raise UnsupportedError(
            f"{params.sampling} batches resume only at an epoch boundary (every {params.steps_per_epoch} steps); the "
            f"run stopped at step {start_step}, inside an epoch, and its remaining steps are not covered by the plan")


def check_rows(params: DPSGDParams, rows: int, *, size_private: bool, units: int | None = None) -> None:
    """Refuse data the phase was not accounted for: another N (unless N is a DP count), or
    another number of units M when units are sampled (``units``: the data's, None if it has no ids)."""
    if rows != params.dataset_size and not size_private:
        raise InvalidParameterError(f"the DP-SGD phase has {rows} rows; the plan accounts N = {params.dataset_size}")
    check_unit_count(params, units)
    if params.sampling != "poisson" and size_private:
        raise PlanMismatchError(f"{params.sampling} batches are accounted for the exact N; a plan with a DP count "
                                "has none")


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
            be given a ledger. When units are sampled every unit's rows must be on one rank
            (``trainers.ranks.rank_rows``), and the plan's M is the units of all ranks.
    """

    settings = settings or DPSGDSettings.for_device(data.label.device)
    if not isinstance(params, DPSGDParams):
        raise PlanMismatchError(f"run_dpsgd needs the plan's DPSGDParams, got {type(params).__name__}")
    steps = params.steps
    if collective is not None and params.sampling != "poisson":
        raise UnsupportedError(f"{GLOBAL_SAMPLING[params.sampling]}: it is not run over several processes "
                               "(plan Poisson sampling, or run one process)")
    units, rank_units = count_units(params, data, collective)
    check_rows(params, len(data) if collective is None else collective.total(len(data), like=data.label),
               size_private=size_private, units=units)
    if not 0 <= start_step <= steps:
        raise InvalidParameterError(f"start_step must be in [0, {steps}], got {start_step}")
    check_resume(params, start_step)
    if collective is not None:
        _join_ranks(collective, model, data, ledger, steps=steps, start_step=start_step, rank_units=rank_units)
    device = data.label.device
    sampler = phase_sampler(data, params, settings, randomness, distributed=collective is not None)
    noise_gen = torch.Generator(device=device).manual_seed(randomness.torch_seed())
    opt = _optimizer(trainable, settings, steps)
    schedule = None
    if settings.cosine_decay:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, steps))
    if optimizer_state is not None:
        opt.load_state_dict(optimizer_state["optimizer"])
        if schedule is not None and optimizer_state.get("schedule") is not None:
            schedule.load_state_dict(optimizer_state["schedule"])
    engine = DPSGDStep(model, params, trainable=trainable, optimizer=opt,
                       loss_fn=functools.partial(bce, reduction="none"), noise_generator=noise_gen, ledger=ledger,
                       start_step=start_step, truncated=truncated, collective=collective, rows=len(data),
                       unit=data.unit if params.samples_units else None)
    rows = encoded_rows(data)
    model.train()
    pbar = bar(progress, steps - start_step)
    try:
        for step in range(start_step, steps):
            batch = sampler.sample()
            engine(batch, rows)
            if schedule is not None:
                schedule.step()
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
    used = {**settings.to_dict(), "lr": settings.step_size(steps)}  # the step size that ran, not "auto"
    return engine.result(padded_size=sampler.padded_size, settings=used, device=device)


def _join_ranks(collective, model, data, ledger, *, steps: int, start_step: int, rank_units) -> None:
    """The ranks agree on the phase, start from rank 0's parameters, and rank 0's ledger notes their shares."""
    collective.agree("the DP-SGD phase's steps", steps)
    collective.agree("the steps already taken", start_step)
    collective.broadcast_(model)  # identical replicas from the first step on
    if ledger is not None and hasattr(ledger, "note_ranks"):
        # the auditor tests each rank's batches against what it sampled from: its rows, or its units
        if rank_units is not None:
            ledger.note_ranks(rank_units, what="units")
        else:
            ledger.note_ranks([r[0] for r in collective.gather([len(data)])])


def check_unit_count(params: DPSGDParams, units: int | None) -> None:
    """Refuse another number of units M when the phase samples units (``units``: the data's, None without ids)."""
    if params.samples_units and units != params.units:
        have = "no unit ids" if units is None else f"{units} units"
        raise InvalidParameterError(f"the DP-SGD phase samples units and the data has {have} after capping; the plan "
                                    f"accounts M = {params.units}")


def count_units(params: DPSGDParams, data, collective=None) -> tuple[int | None, list[int] | None]:
    """(the units of all ranks, each rank's units) when ``params`` samples units, else (None, None).

    Over several processes, refused unless the ranks' counts add up to the plan's M (see
    ``_rank_units``); ``check_unit_count`` then refuses another M. ``execute_plan`` calls both before
    anything is spent or written, and ``run_dpsgd`` again.
    """
    if not params.samples_units:
        return None, None
    units = None if data.unit is None else int(torch.unique(data.unit).numel())
    if collective is None:
        return units, None
    rank_units = _rank_units(collective, units, params.units)
    return sum(rank_units), rank_units


def _rank_units(collective, units: int | None, planned: int) -> list[int]:
    """Every rank's units, in rank order, refused unless each rank has some and they add up to the plan's M.

    A unit whose rows were split between ranks is counted once on each (and each part would be
    clipped to C on its own: the unit would weigh up to C per rank), so the sum exceeds the
    true M and the run stops before any step.
    """
    parts = [r[0] for r in collective.gather([-1 if units is None else units])]
    if min(parts) < 0:
        raise InvalidParameterError("the DP-SGD phase samples units and a rank's data has no unit ids")
    if sum(parts) != planned or min(parts) == 0:
        raise InvalidParameterError(
            f"the DP-SGD phase samples units and the ranks hold {parts} units, {sum(parts)} in all; the plan accounts "
            f"M = {planned}, each unit whole on one rank and at least one on each rank")
    return parts


def expected_chunks(n: int, q: float, padded_size: int) -> float:
    """Average chunks per step (for benchmarks): 1 unless batches overflow the padding."""
    return max(1.0, math.ceil(n * q / padded_size))
