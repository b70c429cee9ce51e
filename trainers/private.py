"""A plan's DP-SGD phase as one step object for any torch ``nn.Module``, in the user's own loop.

``PrivateStep`` binds a model, a loss and an optimiser to a plan whose trained phase is
DP-SGD, and runs exactly what the plan accounted, one noisy step per call::

    step = PrivateStep(model, plan, loss_fn=loss, optimizer=opt, run_dir="runs/mine")
    for batch in step.batches(x, y):    # Poisson at the plan's q over its N, the plan's T steps
        step(batch)                     # clip to C, sum, one draw of N(0, sigma^2 C^2), / q N, opt.step()
    step.finish()                       # run.json beside the ledger: ``budgetplan audit runs/mine``

The step is ``trainers.dpsgd.DPSGDStep``, the object the built-in trainer's loop runs: per
example clipping (``trainers.clipping``: fast paths for Linear, Embedding, EmbeddingBag and
LayerNorm, ``torch.func`` for any other parametrised module; a BatchNorm that mixes examples is
refused by name), the write-ahead ledger told before each step (``trainers.session``), and a
refusal of step T + 1. What it cannot see stays the user's duty: the loop must not compute
other gradients of the private rows, nor release anything of them besides the model.

Batches come only from ``batches()``: each is taken once, in the order drawn, so the sampling
the accounting assumed is the one that ran. Data whose row count is not the plan's N is refused
(unless that N is a DP count: then every row there is is sampled at q, as the built-in trainer
does, and the true count stays in the private record).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import default_collate

from budgetplan.audit.verify import verify_plan
from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.plan.phases import CountPhase, DPSGDPhase
from budgetplan.record.parts import ModelInfo, json_table
from budgetplan.record.records import PRIVATE_DIR
from budgetplan.util.fileio import check_writable
from budgetplan.util.validate import non_negative_int
from trainers import dpsgd
from trainers.clipping import refuse_batch_statistics
from trainers.data.fingerprint import key_id, new_key, write_key
from trainers.dpsgd import DPSGDSettings, check_resume, check_rows, phase_sampler
from trainers.outputs import finish_run, save_model
from trainers.randomness import Randomness
from trainers.record import build_record, dpsgd_entry
from trainers.session import Checkpoint, Session

__all__ = ["PrivateStep", "PrivateBatch"]

# Rows per window of the data fingerprint (bounds its memory on a large dataset).
_FINGERPRINT_WINDOW = 1 << 16


@dataclass(frozen=True)
class PrivateBatch:
    """One Poisson batch drawn by ``PrivateStep.batches``; pass it to the step that drew it, once.

    Attributes:
        step: the index of the noisy step it is for (counted over every session of the run).
        size: how many real rows it holds (a draw from Binomial(rows, q): it depends on no data).
    """

    step: int
    size: int
    _owner: object
    _batch: object


class _Rows:
    """The user's data as ``rows(idx) -> (model inputs, target)``: tensors, or a map-style Dataset."""

    def __init__(self, data: tuple, device: torch.device):
        if len(data) == 1 and isinstance(data[0], torch.utils.data.Dataset):
            self.dataset, self.tensors, self.device = data[0], None, device
            self.rows = len(data[0])
            return
        if len(data) < 2 or not all(isinstance(t, torch.Tensor) for t in data):
            got = [type(t).__name__ for t in data]
            raise InvalidParameterError("batches() takes the model's input tensors then the target tensor (at least "
                                        f"two tensors), or one map-style Dataset; got {got}")
        lengths = {int(t.shape[0]) if t.dim() else -1 for t in data}
        if len(lengths) != 1 or -1 in lengths:
            raise InvalidParameterError(f"every tensor given to batches() must have one row per example; got dimension "
                                        f"0 of sizes {[list(t.shape)[:1] for t in data]}")
        self.dataset, self.tensors, self.device = None, data, data[0].device
        self.rows = lengths.pop()

    def __len__(self) -> int:
        return self.rows

    def __call__(self, idx: torch.Tensor):
        if self.tensors is not None:
            *inputs, target = (t[idx] for t in self.tensors)
            return tuple(inputs), target

        items = default_collate([self.dataset[i] for i in idx.tolist()])
        *inputs, target = (t.to(self.device) for t in items)
        return tuple(inputs), target

    def fingerprint(self, key: bytes) -> dict:
        """The keyed digest of every row's tensors (dtype, shape, bytes), window by window."""
        digest = hmac.new(key, digestmod=hashlib.sha256)
        for start in range(0, self.rows, _FINGERPRINT_WINDOW):
            inputs, target = self(torch.arange(start, min(self.rows, start + _FINGERPRINT_WINDOW), device=self.device))
            for t in (*inputs, target):
                t = t.detach().contiguous().cpu()
                digest.update(f"{t.dtype}{list(t.shape)}".encode("ascii"))
                digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return {"rows": self.rows, "hmac_sha256": digest.hexdigest(), "key_id": key_id(key),
                "columns": ["dataset items" if self.dataset is not None else f"{len(self.tensors or ())} tensors"]}


def _dpsgd_phase(plan) -> DPSGDPhase:
    """The plan's DP-SGD phase, refusing a plan whose other phases this loop would not run."""
    phase = plan.dpsgd
    names = [p.name for p in plan.phases]
    if phase is None:
        raise PlanMismatchError(f"the plan has no DP-SGD phase (its phases are {names}): PrivateStep runs one")
    if plan.tuned:
        raise UnsupportedError("the plan selects among a grid of configurations: PrivateStep runs one plan's DP-SGD "
                               "phase; plan the chosen configuration alone")
    if phase.params.samples_units:
        raise UnsupportedError("the plan samples units: PrivateStep draws batches of rows, not of whole units; train "
                               "it with `budgetplan train`")
    others = [p.name for p in plan.phases if not isinstance(p, (DPSGDPhase, CountPhase))]
    if others == ["calibration"]:
        raise UnsupportedError("the plan ends with the intercept calibration's release, which PrivateStep does not "
                               "run (any model, not only one with an intercept): plan it with [calibration] share = 0, "
                               "or train it with `budgetplan train`")
    if others:
        raise UnsupportedError(f"the plan's phases are {names}: PrivateStep runs the DP-SGD phase alone, and the "
                               f"record of a run without the {others} phase(s) the plan accounts would not audit; "
                               "train it with `budgetplan train`, or plan DP-SGD alone")
    return phase


class PrivateStep:
    """The plan's DP-SGD phase on ``model``, one noisy step per call (see the module docstring).

    Args:
        model: any ``nn.Module``; its forward takes the input tensors of a batch, dimension 0
            the example. Every parameter with ``requires_grad`` is trained (and noised).
        plan: a ``budgetplan.plan.Plan`` (``load_plan(path)``) whose trained phase is DP-SGD.
        loss_fn: ``loss_fn(outputs, targets)`` -> one loss per example, shape [batch].
        optimizer: a torch optimiser over trainable parameters of ``model`` only.
        run_dir: the run directory: the ledger, checkpoints and, at ``finish()``, the record.
        resume: continue the interrupted run in ``run_dir``: its ledger's count of steps (never
            fewer) and its last checkpoint of model and optimiser, if any.
        seed: a seed for reproducible sampling and noise (debugging only; recorded as such);
            default the operating system's CSPRNG.
        checkpoint_every: save model and optimiser state every this many steps (0: never).
        max_chunk, padded_size: how a batch is laid out in fixed-shape chunks (no privacy
            effect; ``trainers.dpsgd.DPSGDSettings``).

    Raises:
        PlanMismatchError: the plan does not verify, or has no DP-SGD phase.
        UnsupportedError: the plan has phases besides DP-SGD (and a DP count of N); the model
            has a BatchNorm that mixes examples (named).
        InvalidParameterError: no trainable parameter, an optimiser over other tensors, a
            run directory holding a record, or a resume without a ledger.
    """

    def __init__(self, model: torch.nn.Module, plan, *, loss_fn, optimizer: torch.optim.Optimizer, run_dir,
                 resume: bool = False, seed: int | None = None, checkpoint_every: int = 0, max_chunk: int | None = 4096,
                 padded_size: int | None = None):
        report = verify_plan(plan)
        if not report.ok:
            raise PlanMismatchError(f"the plan does not verify: {report.problems[0]}", report.problems)
        self.phase = _dpsgd_phase(plan)
        refuse_batch_statistics(model)  # again at every step; here before anything is written
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        if not self.trainable:
            raise InvalidParameterError(f"the {type(model).__name__} has no trainable parameters, got 0")
        mine = {id(p) for p in self.trainable}
        for group in optimizer.param_groups:
            if any(id(p) not in mine for p in group["params"]):
                raise InvalidParameterError("optimizer updates a tensor that is not a trainable parameter of the "
                                            f"{type(model).__name__}: its gradient would not be the noisy one")
        self.run_dir = Path(run_dir)
        if (self.run_dir / "run.json").exists():
            raise InvalidParameterError(f"{self.run_dir} already holds a run record; choose a new run_dir")
        if resume and not (self.run_dir / "ledger.jsonl").exists():
            raise InvalidParameterError(f"nothing to resume in {self.run_dir}: it has no ledger")
        check_writable(self.run_dir)
        self.model, self.plan, self.loss_fn, self.optimizer = model, plan, loss_fn, optimizer
        self.resume = resume
        self.checkpoint_every = non_negative_int("checkpoint_every", checkpoint_every)
        self.settings = DPSGDSettings(max_chunk=max_chunk, padded_size=padded_size)
        self.randomness = Randomness(seed)
        self._rows: _Rows | None = None
        self._data_ids: list[int] = []
        self._session = None
        self._engine = None
        self._sampler = None
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ the loop

    @property
    def steps_planned(self) -> int:
        return self.phase.params.steps

    @property
    def steps_taken(self) -> int:
        """Noisy steps counted so far, over every session of the run (0 before ``batches()``)."""
        return self._engine.step if self._engine is not None else 0

    def batches(self, *data) -> Iterator[PrivateBatch]:
        """The remaining steps' Poisson batches over ``data``, at the plan's q, one per step.

        ``data``: the model's input tensors then the target tensor, each with one row per
        example (on the model's device), or one map-style ``torch.utils.data.Dataset`` whose
        items are ``(inputs..., target)``. It must have the plan's N rows, unless N is a DP
        count. The first call opens the run directory; a later call must pass the same data.
        """
        if self._rows is None:
            self._open(data)
        elif [id(d) for d in data] != self._data_ids:
            raise InvalidParameterError("batches() was given other data than at its first call: the plan's N and "
                                        "the run's sampling are of that data")
        engine, sampler = self._engine, self._sampler
        assert engine is not None and sampler is not None
        while engine.step < self.steps_planned:
            step = engine.step
            batch = sampler.sample()
            yield PrivateBatch(step=step, size=batch.size, _owner=self, _batch=batch)
            if engine.step == step:
                raise PlanMismatchError(f"the batch of step {step} was not taken: every batch drawn must be passed to "
                                        "the step, in order (skipping one would change the sampling accounted)")

    def __call__(self, batch: PrivateBatch) -> None:
        """Take the noisy step on ``batch``: clipped sum, one noise draw, / q N, ``optimizer.step()``."""
        engine = self._engine
        if not isinstance(batch, PrivateBatch) or batch._owner is not self or engine is None:
            raise PlanMismatchError("the step takes only the batches its own batches() draws: Poisson sampling at "
                                    "the plan's q is what the plan accounted")
        if batch.step != engine.step and engine.step < self.steps_planned:  # past T: the engine refuses
            raise PlanMismatchError(f"a batch for step {batch.step} given at step {engine.step}: each batch is "
                                    "taken once, in the order drawn")
        try:
            engine(batch._batch, self._rows)
        finally:
            for p in self.trainable:
                p.grad = None  # the noisy gradient is spent; nothing of the private rows stays behind
        done = engine.step
        if self.checkpoint_every and done % self.checkpoint_every == 0 and done < self.steps_planned:
            assert self._session is not None
            self._session.save_checkpoint(Checkpoint(phase="dpsgd", step=done, model=self.model.state_dict(),
                                                     optimizer=self.optimizer.state_dict()))

    def _open(self, data: tuple) -> None:
        """Check the data against the plan, then open the run directory and the engine (in this order)."""
        params = self.phase.params
        rows = _Rows(data, self.trainable[0].device)
        size_private = self.plan.count is not None
        check_rows(params, len(rows), size_private=size_private)
        session = Session(self.run_dir, self.plan, randomness=self.randomness, resume=self.resume,
                          checkpoint_every=max(1, self.checkpoint_every), rows=len(rows))
        self.randomness = session.randomness  # this session's streams: a resume replays no earlier draws
        try:
            start = session.dpsgd_steps_taken()
            check_resume(params, start)
            ckpt = session.load_checkpoint() if self.resume else None
            if ckpt is not None and ckpt.phase == "dpsgd":
                self.model.load_state_dict(ckpt.model)
                self.optimizer.load_state_dict(ckpt.optimizer)
            # sampler, then noise: the order run_dpsgd seeds them in
            self._sampler = phase_sampler(rows, params, self.settings, self.randomness, device=rows.device)
            noise = torch.Generator(device=self.trainable[0].device).manual_seed(self.randomness.torch_seed())
            self._engine = dpsgd.DPSGDStep(self.model, params, trainable=self.trainable, optimizer=self.optimizer,
                                           loss_fn=self.loss_fn, noise_generator=noise, ledger=session,
                                           start_step=start, rows=len(rows))
        except BaseException:
            session.close()
            raise
        self._rows, self._data_ids, self._session = rows, [id(d) for d in data], session

    # ---------------------------------------------------------------- the record

    def finish(self, *, metrics: dict | None = None):
        """Write ``model.pt`` and the run record (``run.json`` last) into the run directory; returns the record.

        Refused until the plan's T steps are taken: a completed record of fewer would not
        audit (an unfinished run directory is audited as interrupted, on its ledger).

        Args:
            metrics: the user's evaluation metrics, kept in the private record.
        """
        engine, session, rows = self._engine, self._session, self._rows
        if engine is None or session is None or rows is None or engine.step < self.steps_planned:
            raise PlanMismatchError(f"{self.steps_taken} of the plan's {self.steps_planned} noisy steps are taken: "
                                    "finish() writes the record of a completed run")
        device = self.trainable[0].device
        result = engine.result(padded_size=self._sampler.padded_size, device=device,
                               settings={**self.settings.to_dict(), "loop": "trainers.private.PrivateStep",
                                         "optimizer": type(self.optimizer).__name__})
        size_private = self.plan.count is not None
        key = new_key()
        data = {"path": None, "format": "tensors" if rows.dataset is None else "dataset", "rows_in": len(rows),
                "rows_used": len(rows), "capping": None, "fingerprint": rows.fingerprint(key)}
        timings = {"dpsgd_phase_seconds": result.seconds, "total_seconds": time.perf_counter() - self._t0}
        record = build_record(
            plan=self.plan, entries=[dpsgd_entry(result, session.ledger_view(), nonsensitive_tower=None,
                                                 sizes_ledger=session.sizes_view() if size_private else None,
                                                 withhold=size_private)],
            data=data, metrics=dict(metrics or {}), encoding={}, seeds=self.randomness.record(),
            model=ModelInfo(kind=type(self.model).__name__,
                            config=json_table("model.config", {"trainable_parameters": result.trainable_parameters}),
                            final="full"),
            training={"dpsgd": result.settings}, ledger=session.ledger_view(), timings=timings,
            device=str(device), sizes_ledger=session.sizes_view() if size_private else None)
        try:
            record = save_model(record, self.model.state_dict(), self.run_dir)
            (self.run_dir / PRIVATE_DIR).mkdir(exist_ok=True)
            write_key(self.run_dir / PRIVATE_DIR / "fingerprint.key", key)
            finish_run(record, self.run_dir)
        finally:
            self.close()
        return record

    def close(self) -> None:
        """Release the run directory (its ledger stays: an unfinished run can be resumed or audited)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> PrivateStep:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
