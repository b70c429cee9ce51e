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

Two epoch-structured samplers run plans that choose them (``budgetplan.accounting.batch_selection``):

* ``AllocationSampler``: at the start of every epoch of T = N // B steps each row draws
  one step uniformly, independently of the others (random allocation, k = 1 per epoch, as
  accounted); the epoch's batches are the rows of each step, so every row is used exactly
  once per epoch and the sizes are multinomial (mean N / T, variance N (1/T)(1 - 1/T)).
* ``ShuffleSampler``: every epoch a uniformly random permutation cut into T batches of
  exactly B; the N - T B rows at its end sit that epoch out.

Both lay their batches out in chunks like the Poisson sampler, and the trainer divides every
noisy sum by the plan's B (``DPSGDParams.expected_batch_size``): exactly the batch of a
shuffled run, and the mean N / T of an allocated one when B divides N.

``UnitPoissonSampler`` samples units (users) instead of rows, for user-level DP-SGD by unit
sampling (Charles et al., arXiv:2407.07737): each of M units joins a batch with probability
q, drawn exactly as the Poisson sampler draws rows, and brings its (at most K, after
capping) rows in one block of K, padded, so the trainer clips each block's summed gradient
once (``clipped_gradient_sum(unit_rows=K)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from budgetplan.errors import InvalidParameterError
from budgetplan.util.validate import positive_int, probability

__all__ = ["PoissonSampler", "AllocationSampler", "ShuffleSampler", "UnitPoissonSampler", "Batch", "chunk_size",
           "fixed_chunk_size", "default_padded_size", "unit_table"]


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
    """One step's sample: the row indices in fixed-size chunks, and how many rows (or units) are real."""

    chunks: list          # list of (indices [P] int64, mask [P] float) on the device
    size: int             # realised batch size after any truncation: rows, or units when units are sampled
    drawn: int            # the Poisson draw before truncation
    truncated: bool
    rows: int | None = None  # real rows when units are sampled (size counts units); None: size is rows


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


def unit_table(unit_index, k: int) -> torch.Tensor:
    """The [M, K] table of each unit's row indices, in data order, -1 after a unit's last row.

    Args:
        unit_index: [N] integers, the dense unit (0..M-1) of each row; numpy or torch.
        k: K, the most rows a unit may have (the plan's cap, already applied to the data).

    Raises:
        InvalidParameterError: ``unit_index`` not a 1-D array of integers numbering the units
            0..M-1 with none empty, or a unit with more than ``k`` rows.
    """
    k = positive_int("k", k)
    idx = torch.as_tensor(np.asarray(unit_index) if not isinstance(unit_index, torch.Tensor) else unit_index)
    if idx.dim() != 1 or idx.numel() == 0 or idx.dtype.is_floating_point or idx.dtype.is_complex \
            or idx.dtype == torch.bool:
        raise InvalidParameterError(f"unit_index must be a non-empty 1-D array of integers, got dtype {idx.dtype} "
                                    f"and shape {list(idx.shape)}")
    idx = idx.to(torch.int64).cpu()
    if int(idx.min()) < 0:
        raise InvalidParameterError(f"unit_index must be >= 0, got {int(idx.min())}")
    counts = torch.bincount(idx)
    if bool((counts == 0).any()):
        raise InvalidParameterError(f"unit_index must number the units 0..M-1 densely; unit "
                                    f"{int((counts == 0).nonzero()[0])} has no row")
    if int(counts.max()) > k:
        unit = int(counts.argmax())
        raise InvalidParameterError(f"unit {unit} has {int(counts[unit])} rows, more than k = {k}: cap the units first")
    order = torch.argsort(idx, stable=True)                  # rows grouped by unit, in data order within each
    starts = torch.cumsum(counts, 0) - counts
    sorted_units = idx[order]
    table = torch.full((counts.numel(), k), -1, dtype=torch.int64)
    table[sorted_units, torch.arange(idx.numel()) - starts[sorted_units]] = order
    return table


class UnitPoissonSampler:
    """Draws Poisson batches of units: each of M units joins a batch independently with probability q.

    ``sample()`` returns a ``Batch`` whose ``size`` is the number of sampled units (Binomial(M,
    q): what the ledger records and the audit tests), ``rows`` the real rows among them, and
    whose chunks hold ``padded_units`` blocks of K rows each: a unit's rows in one block, in
    table order, padding rows (index 0, mask 0) after them, and unused blocks all padding.

    Args:
        unit_table: int64 [M, K] row indices per unit, -1 after a unit's last row
            (``unit_table()``); every unit has a row, and no row belongs to two units.
        q: the plan's unit sampling rate, in (0, 1].
        padded_units: units per chunk (default: E + 6 sqrt(E) for E = q M).
        seed: the generator's seed (from the run's randomness policy).
        device: where indices live.
    """

    def __init__(self, unit_table: torch.Tensor, q: float, *, padded_units: int | None = None, seed: int,
                 device="cpu"):
        table = _check_table(unit_table)
        q = probability("q", q, allow_one=True)
        self.table = table
        self.units, self.k = table.shape
        # The units are drawn exactly as rows are: Binomial count, then a uniform subset.
        self._units = PoissonSampler(self.units, q, seed=seed)
        self.q = q
        self.padded_units = positive_int("padded_units", padded_units) if padded_units is not None \
            else default_padded_size(q * self.units)
        self.padded_size = self.padded_units * self.k      # rows per chunk: the trainer's static shape
        self.device = torch.device(device)

    def sample(self) -> Batch:
        size = self._units._batch_size()
        rows = self.table[self._units._subset(size)]          # [U, K], -1 for padding
        chunks = []
        for start in range(0, max(size, 1), self.padded_units):
            block = torch.full((self.padded_units, self.k), -1, dtype=torch.int64)
            part = rows[start:start + self.padded_units]
            block[:part.shape[0]] = part
            flat = block.reshape(-1)
            chunks.append((flat.clamp_min(0).to(self.device, non_blocking=True),
                           (flat >= 0).to(torch.float32).to(self.device, non_blocking=True)))
        return Batch(chunks=chunks, size=size, drawn=size, truncated=False, rows=int((rows >= 0).sum()))


def _check_table(table) -> torch.Tensor:
    """The unit table, checked: a unit's rows first, then -1s, at least one row, no row shared."""
    if not isinstance(table, torch.Tensor) or table.dtype != torch.int64 or table.dim() != 2 or table.numel() == 0:
        shown = f"dtype {table.dtype} and shape {list(table.shape)}" if isinstance(table, torch.Tensor) \
            else type(table).__name__
        raise InvalidParameterError(f"unit_table must be a non-empty int64 tensor [M, K], got {shown}")
    table = table.cpu()
    if int(table.min()) < -1:
        raise InvalidParameterError(f"unit_table must hold row indices >= 0 or -1, got {int(table.min())}")
    real = table >= 0
    bad = ~real[:, 0] | (real[:, 1:] & ~real[:, :-1]).any(1)
    if bool(bad.any()):
        unit = int(bad.nonzero()[0])
        raise InvalidParameterError(f"unit_table row {unit} must list at least one row index and then only -1s, "
                                    f"got {table[unit].tolist()}")
    rows = table[real]
    if torch.unique(rows).numel() != rows.numel():
        raise InvalidParameterError("unit_table lists a row index in more than one place: each row belongs to "
                                    "one unit")
    return table
