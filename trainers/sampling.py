"""Batch selection as accounted, with static shapes: Poisson, random allocation, shuffled batches.

Every step includes each of the N rows independently with probability q (the plan's
sampling rate). The batch size B ~ Binomial(N, q) is drawn first and then a uniformly
random B-subset: the same distribution as N coin flips, at the cost of B rather than N
random numbers per step (a 40M-row dataset would otherwise need 40M draws per step).

Static shapes: each batch is laid out in chunks of a fixed ``padded_size`` with a mask, so
a compiled step sees one shape. A batch larger than one chunk is processed in several
chunks whose clipped sums add up before the noise (one noisy update, however many
chunks); under truncated Poisson sampling (declared in the plan and accounted as such)
a batch above the maximum is cut to a uniformly random subset of that size instead. An
empty batch is still a step: it gets its noise.

The randomness comes from a torch generator seeded from the run's policy (the OS CSPRNG by
default): the sampling must be unpredictable to an adversary for the amplification the
accounting relies on.

Two epoch-structured samplers run plans that choose them (``budgetplan.batch_selection``):

* ``AllocationSampler``: at the start of every epoch of T = N // B steps each row draws
  one step uniformly, independently of the others (random allocation, k = 1 per epoch, as
  accounted); the epoch's batches are the rows of each step, so every row is used exactly
  once per epoch and the sizes are multinomial (mean N / T, variance N (1/T)(1 - 1/T)).
* ``ShuffleSampler``: every epoch a uniformly random permutation cut into T batches of
  exactly B; the N - T B rows at its end sit that epoch out.

Both lay their batches out in chunks like the Poisson sampler, and the trainer divides every
noisy sum by the plan's B (``DPSGDParams.expected_batch_size``): exactly the batch of a
shuffled run, and the mean N / T of an allocated one when B divides N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["PoissonSampler", "AllocationSampler", "ShuffleSampler", "Batch", "chunk_size", "fixed_chunk_size",
           "default_padded_size"]


def default_padded_size(expected: float) -> int:
    """A chunk that holds a Poisson batch with overwhelming probability: E + 6 sqrt(E), rounded up to 8."""
    size = int(math.ceil(expected + 6.0 * math.sqrt(max(expected, 1.0)) + 8))
    return max(8, (size + 7) // 8 * 8)


def chunk_size(expected: float, max_chunk: int | None) -> int:
    """The chunk of a Poisson batch of mean ``expected`` when no chunk may exceed ``max_chunk``.

    The padded batch (``default_padded_size``) is split into the fewest chunks of at most
    ``max_chunk`` rows, of equal size (rounded up to 8): a batch of mean 4,096 under a cap of
    4,096 takes two chunks of 2,248 (1.10 rows processed per real row) where capping one chunk
    at 4,096 overflowed into a second, mostly padded one half the time (1.50).
    """
    full = default_padded_size(expected)
    return _fewest_equal(full, full, max_chunk)


def fixed_chunk_size(batch: int, max_chunk: int | None) -> int:
    """The chunk of batches of exactly ``batch`` rows: the batch itself rounded up to 8, or the
    fewest equal chunks of at most ``max_chunk`` rows."""
    return _fewest_equal(max(8, (batch + 7) // 8 * 8), batch, max_chunk)


def _fewest_equal(full: int, rows: int, max_chunk: int | None) -> int:
    """``full`` when it fits under ``max_chunk``; else ``rows`` in the fewest equal chunks of at
    most ``max_chunk``, each a multiple of 8."""
    if max_chunk is None or full <= max_chunk:
        return full
    if max_chunk < 8:
        raise ValueError(f"max_chunk must be at least 8, got {max_chunk!r}")
    pieces = math.ceil(rows / max_chunk)
    size = (math.ceil(rows / pieces) + 7) // 8 * 8
    return size if size <= max_chunk else max_chunk // 8 * 8


def _chunks(rows: torch.Tensor, size: int, padded: int, device) -> list:
    """``rows`` (the first ``size`` real) in chunks of ``padded`` indices with a mask; at least one chunk."""
    chunks = []
    for start in range(0, max(size, 1), padded):
        part = rows[start:start + padded]
        idx = torch.zeros(padded, dtype=torch.int64)
        mask = torch.zeros(padded, dtype=torch.float32)
        idx[:part.numel()] = part
        mask[:part.numel()] = 1.0
        chunks.append((idx.to(device, non_blocking=True), mask.to(device, non_blocking=True)))
    return chunks


@dataclass
class Batch:
    """One step's sample: the row indices in fixed-size chunks, and how many rows are real."""

    chunks: list          # list of (indices [P] int64, mask [P] float) on the device
    size: int             # realised batch size after any truncation
    drawn: int            # the Poisson draw before truncation
    truncated: bool


class PoissonSampler:
    """Draws Poisson batches over ``n`` rows at rate ``q``.

    Args:
        n: rows (or units, when units are sampled).
        q: the plan's sampling rate.
        padded_size: the fixed chunk size (default: E + 6 sqrt(E)).
        max_batch_size: truncated Poisson: cut larger batches to this size (the plan's).
        seed: the generator's seed (from the run's randomness policy).
        device: where indices live.
    """

    def __init__(self, n: int, q: float, *, padded_size: int | None = None, max_batch_size: int | None = None,
                 seed: int, device="cpu"):
        if not 0 < q <= 1:
            raise ValueError(f"sampling rate must be in (0, 1], got {q!r}")
        self.n, self.q = int(n), float(q)
        self.max_batch_size = max_batch_size
        expected = self.n * self.q
        self.padded_size = int(padded_size or default_padded_size(expected))
        if max_batch_size is not None:
            self.padded_size = min(self.padded_size, int(max_batch_size))
        self.device = torch.device(device)
        self._gen = torch.Generator(device="cpu").manual_seed(int(seed))
        self._count = torch.tensor(float(self.n))
        self._rate = torch.tensor(self.q, dtype=torch.float64)

    def _batch_size(self) -> int:
        return int(torch.binomial(self._count.double(), self._rate, generator=self._gen).item())

    def _subset(self, size: int) -> torch.Tensor:
        """A uniformly random ``size``-subset of range(n), as a tensor in random order."""
        if size == 0:
            return torch.empty(0, dtype=torch.int64)
        if size * 4 > self.n:
            return torch.randperm(self.n, generator=self._gen)[:size]
        # Draw with replacement until enough distinct values, then a random subset of them:
        # exchangeability makes the result a uniform size-subset.
        found = torch.empty(0, dtype=torch.int64)
        while found.numel() < size:
            extra = torch.randint(self.n, (int((size - found.numel()) * 1.05) + 16,), generator=self._gen)
            found = torch.unique(torch.cat([found, extra]))
        return found[torch.randperm(found.numel(), generator=self._gen)[:size]]

    def sample(self) -> Batch:
        drawn = self._batch_size()
        size, truncated = drawn, False
        if self.max_batch_size is not None and drawn > self.max_batch_size:
            size, truncated = self.max_batch_size, True  # a uniformly random subset, as accounted
        rows = self._subset(size)
        return Batch(chunks=_chunks(rows, size, self.padded_size, self.device), size=size, drawn=drawn,
                     truncated=truncated)


class _EpochSampler:
    """Batches laid out per epoch of ``steps_per_epoch`` steps; a new epoch is drawn when one ends."""

    def __init__(self, n: int, steps_per_epoch: int, *, padded_size: int, seed: int, device="cpu"):
        if n < 1 or steps_per_epoch < 1:
            raise ValueError(f"rows and steps per epoch must be positive, got {n!r} and {steps_per_epoch!r}")
        self.n, self.steps_per_epoch = int(n), int(steps_per_epoch)
        self.padded_size = int(padded_size)
        self.device = torch.device(device)
        self._gen = torch.Generator(device="cpu").manual_seed(int(seed))
        self._rows = torch.empty(0, dtype=torch.int64)
        self._starts: list[int] = []
        self._step = self.steps_per_epoch  # no epoch drawn yet

    def _epoch(self) -> tuple[torch.Tensor, list[int]]:
        """The epoch's rows, grouped by step, and the T + 1 offsets of the steps' groups."""
        raise NotImplementedError

    def sample(self) -> Batch:
        if self._step == self.steps_per_epoch:
            self._rows, self._starts = self._epoch()
            self._step = 0
        lo, hi = self._starts[self._step], self._starts[self._step + 1]
        self._step += 1
        rows = self._rows[lo:hi]
        size = hi - lo
        return Batch(chunks=_chunks(rows, size, self.padded_size, self.device), size=size, drawn=size,
                     truncated=False)


class AllocationSampler(_EpochSampler):
    """Random allocation: every epoch each of ``n`` rows joins one uniformly random step of ``steps_per_epoch``.

    Args:
        n: rows.
        steps_per_epoch: T = N // B (the plan's).
        padded_size: the fixed chunk size (default: for a batch of mean n / T).
        seed: the generator's seed (from the run's randomness policy).
        device: where indices live.
    """

    def __init__(self, n: int, steps_per_epoch: int, *, padded_size: int | None = None, seed: int, device="cpu"):
        super().__init__(n, steps_per_epoch, padded_size=padded_size or default_padded_size(n / steps_per_epoch),
                         seed=seed, device=device)

    def _epoch(self) -> tuple[torch.Tensor, list[int]]:
        step = torch.randint(self.steps_per_epoch, (self.n,), generator=self._gen)
        order = torch.argsort(step, stable=True)
        counts = torch.bincount(step, minlength=self.steps_per_epoch)
        starts = [0] + torch.cumsum(counts, 0).tolist()
        return order, starts


class ShuffleSampler(_EpochSampler):
    """Shuffled fixed-size batches: every epoch a random permutation of ``n`` rows cut into batches of ``batch_size``.

    Args:
        n: rows.
        batch_size: B; an epoch is n // B batches (the rest of the permutation sits it out).
        padded_size: the fixed chunk size (default: B rounded up to 8).
        seed: the generator's seed (from the run's randomness policy).
        device: where indices live.
    """

    def __init__(self, n: int, batch_size: int, *, padded_size: int | None = None, seed: int, device="cpu"):
        if not 1 <= batch_size <= n:
            raise ValueError(f"batch size must be in [1, {n}], got {batch_size!r}")
        self.batch_size = int(batch_size)
        super().__init__(n, n // batch_size, padded_size=padded_size or fixed_chunk_size(batch_size, None),
                         seed=seed, device=device)

    def _epoch(self) -> tuple[torch.Tensor, list[int]]:
        perm = torch.randperm(self.n, generator=self._gen)
        return perm, [i * self.batch_size for i in range(self.steps_per_epoch + 1)]
