"""DP-SGD over several processes (torch.distributed), with the guarantee of one.

Each rank holds a shard of the rows; together they run the plan's DP-SGD phase exactly as a
single process would:

- **Sampling.** Poisson sampling includes every example independently with probability q,
  so each rank sampling its own shard at q (from its own unpredictable generator) is the
  accounted sample of the whole dataset, whatever the sharding. The global batch size (the
  sum over ranks) is what the ledger and the record hold. When units are sampled the same
  holds of units, provided each unit's rows are all on one rank (``trainers.ranks.rank_rows``):
  its summed gradient is then clipped once, whole, by that rank, and the ranks' unit
  counts must add up to the plan's M (a unit split between ranks would count on each).
- **One sum.** Each rank clips its rows per example and sums them (``trainers.clipping``);
  the sums are added across ranks with one all-reduce over one flat buffer.
- **One noise draw.** Gaussian noise of std sigma C is drawn by rank 0 alone and added to
  its sum before the all-reduce: the reduced sum holds it exactly once (never once per
  rank, which would be sigma C sqrt(ranks): more noise than planned, or, if each rank drew
  sigma C / sqrt(ranks) from generators an adversary could align, less).
- **Division by the plan's q N**, never the realised batch, on every rank.
- **Identical replicas.** Rank 0's parameters are broadcast before the first step; every
  rank then applies the same reduced noisy gradient with the same optimiser.

A rank that dies makes the collective calls of the others fail (gloo reports the closed
connection; a timeout catches the rest), so the run stops instead of taking a step with a
missing shard. Ranks that disagree on the plan, the step count or the rows refuse to start.

Only rank 0 keeps the ledger and writes the record. Truncated Poisson sampling (a cap on the
global batch) is not distributed: its truncation needs the global batch before the sample is
cut, and is refused rather than approximated.
"""

from __future__ import annotations

import ctypes
import datetime
import importlib
import os
import queue as queues
import signal
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from budgetplan.errors import BudgetplanError, PlanMismatchError

__all__ = ["Collective", "RankFailed", "block", "launch", "release_once", "from_environment"]


def block(count: int, parts: int, index: int) -> slice:
    """The ``index``-th of ``parts`` contiguous blocks of ``count`` items: in order, sizes differing by at most one."""
    base, extra = divmod(int(count), int(parts))
    start = index * base + min(index, extra)
    return slice(start, start + base + (index < extra))


class RankFailed(BudgetplanError, RuntimeError):
    """A rank of a distributed run died or raised: the run stops, and no rank's result is used (exit code 1)."""


class Collective:
    """This process's place in the torch.distributed group that runs one DP-SGD phase.

    Args:
        group: the process group (default: the world, which ``dist.init_process_group``
            must have set up).
    """

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group first")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._nccl = dist.get_backend(group) == "nccl"

    @property
    def draws_noise(self) -> bool:
        """Whether this rank draws the step's noise (rank 0 only: one draw per step)."""
        return self.rank == 0

    def _device(self, like: torch.Tensor | None = None):
        if like is not None:
            return like.device
        return torch.device("cuda", torch.cuda.current_device()) if self._nccl else torch.device("cpu")

    def total(self, value: int, like: torch.Tensor | None = None) -> int:
        """The sum of an integer over ranks (rows, a batch size, a count)."""
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._device(like))
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        return int(t.item())

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's list of integers (the same length on every rank), in rank order."""
        t = torch.tensor(list(values), dtype=torch.int64, device=self._device())
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self.group)
        return [o.tolist() for o in out]

    def agree(self, what: str, value: int) -> None:
        """Refuse to go on unless every rank holds the same ``value`` (a step count, a hash prefix)."""
        seen = self.gather([int(value)])
        if any(v != seen[0] for v in seen):
            raise PlanMismatchError(f"the ranks disagree on {what}: {[v[0] for v in seen]}")

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Add ``tensors`` across ranks in place, with one all-reduce over one flat buffer."""
        if not tensors:
            return
        # NCCL reduces device tensors only: a host-side sum (a loss, the calibration's
        # float64 vector) makes the trip to the device and back.
        flat = torch.cat([t.reshape(-1) for t in tensors]).to(self._device() if self._nccl else tensors[0].device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.group)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    def broadcast_(self, module: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers rank 0's."""
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0, group=self.group)

    def broadcast_object(self, value):
        """Rank 0's ``value`` (any picklable object) on every rank; what other ranks pass is ignored."""
        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_object(self, value) -> list | None:
        """Every rank's ``value`` on rank 0, in rank order; None on the other ranks."""
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(value, out, dst=0, group=self.group)
        return out

    def shard(self, rows: int) -> slice:
        """This rank's contiguous block of ``rows`` rows: ranks in order, sizes differing by at most one."""
        return block(rows, self.world_size, self.rank)


def release_once(collective: Collective | None, session, phase: str, make):
    """A one-shot release (RR labels, a noisy sum) made once for all ranks, persisted by rank 0.

    ``make()`` draws the release; it is called on every rank when the release is fresh and
    may run collectives (gather the ranks' randomised labels, sum their exact vectors), but
    only rank 0's return value is kept: rank 0's session logs the intent first, then calls
    it, persists the result and logs its digest, exactly as one process does. A resumed run
    reloads rank 0's saved release instead. Every rank returns ``(array, note)`` from rank 0.

    ``phase`` is any one-shot release the ledger knows (``budgetplan.record.ledger.RELEASE_FILES``:
    rr, walr, calibration, or a kind added with ``register_one_shot_release``); it goes through
    the session's generic ``release(phase, make)``.
    """
    if collective is None:
        return session.release(phase, make)
    fresh = collective.broadcast_object(not session.released(phase) if collective.rank == 0 else None)
    if collective.rank == 0:
        result = session.release(phase, make)  # make() runs inside, after the intent is logged
    else:
        if fresh:
            make()  # the other ranks' side of make's collectives
        result = None
    return collective.broadcast_object(result)


def from_environment(backend: str | None = None) -> Collective | None:
    """Join the group a launcher such as ``torchrun`` describes (RANK, WORLD_SIZE, MASTER_ADDR...), or None.

    Returns None when the environment names no group of more than one process. The backend
    is NCCL when CUDA is available, else gloo, unless given.
    """
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return None
    if not dist.is_initialized():
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if chosen == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(chosen, init_method="env://")
    return Collective()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """Have the kernel kill this process when the launcher dies (Linux), so that no orphan rank goes on
    spending steps of a run nobody will finish; elsewhere the collectives' timeout ends it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _rank_main(rank, nproc, address, backend, timeout_s, threads, results, fn, args):
    try:
        _die_with_parent()
        torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=nproc,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            results.put((rank, "ok", fn(Collective(), *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # the parent reports it; the exit code says it failed

        own = f"{type(exc).__module__}:{type(exc).__qualname__}" if isinstance(exc, BudgetplanError) else None
        results.put((rank, "error", (f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}", own,
                                     str(exc))))
        raise SystemExit(1) from None


def _own_error(where: str, message: str) -> Exception:
    """budgetplan's error class ``module:name`` with ``message`` (its base class if it cannot be rebuilt)."""
    module, _, name = where.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
        error = cls(message)
    except Exception:  # a class whose constructor wants more than the message
        error = BudgetplanError(message)
    return error if isinstance(error, BudgetplanError) else BudgetplanError(message)


def launch(fn, nproc: int, *args, backend: str = "gloo", timeout_s: float = 300.0, threads: int = 1) -> list:
    """Run ``fn(collective, *args)`` in ``nproc`` fresh processes of one group; their results in rank order.

    Each process starts clean (``spawn``), sets ``threads`` torch threads, and joins a group
    on a free local port (``backend`` gloo on CPU, nccl on GPUs). ``fn`` and ``args`` must be
    picklable (a module-level function). A rank that raises or dies fails the whole run with
    ``RankFailed``: the other ranks' collective calls fail too (or time out after
    ``timeout_s``), and nothing any rank returned is used. When the first rank to fail
    raised one of budgetplan's own errors (a refusal: bad input, a plan mismatch), the same
    error is raised here with its message, so a caller sees one refusal, not a crash.
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
    context = mp.get_context("spawn")
    results = context.Queue()
    address = f"tcp://127.0.0.1:{_free_port()}"
    procs = [context.Process(target=_rank_main, args=(r, nproc, address, backend, timeout_s, threads, results, fn,
                                                      args), daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    got: dict[int, tuple] = {}
    first_error: tuple | None = None
    failed_since: float | None = None  # the run has no deadline; a failed one gets timeout_s to wind down

    def take(rank, status, value):
        nonlocal first_error
        got[rank] = (status, value)
        if status == "error" and first_error is None:
            first_error = value

    try:
        while len(got) < nproc:
            try:
                take(*results.get(timeout=0.5))
                continue
            except queues.Empty:
                pass
            if all(p.exitcode is not None for p in procs):
                _drain(results, take)  # what the last processes put before they exited
                break
            if failed_since is None and (first_error is not None or any(p.exitcode not in (None, 0) for p in procs)):
                failed_since = time.monotonic()
            if failed_since is not None and time.monotonic() - failed_since > timeout_s + 60.0:
                break
    finally:
        _join(procs)
    return _results(got, procs, first_error)


def _drain(results, take) -> None:
    """``take`` every result still in the queue."""
    while True:
        try:
            take(*results.get(timeout=1.0))
        except queues.Empty:
            return


def _join(procs) -> None:
    """Wait for every process a little, then end those still running."""
    for p in procs:
        p.join(timeout=5.0)
        if p.is_alive():
            p.terminate()
            p.join()


def _results(got: dict, procs, first_error: tuple | None) -> list:
    """Every rank's result in rank order, or the first rank's own error, or ``RankFailed``."""
    if first_error is not None and first_error[1] is not None:
        raise _own_error(*first_error[1:])
    failed = [f"rank {r}: {v[1][0].splitlines()[0]}" for r, v in sorted(got.items()) if v[0] == "error"]
    failed += [f"rank {r}: exited with code {p.exitcode} before reporting" for r, p in enumerate(procs)
               if r not in got]
    if failed:
        raise RankFailed("the distributed run failed, no result is used: " + "; ".join(failed))
    return [got[r][1] for r in range(len(procs))]
