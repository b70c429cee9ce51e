"""The canary audits' DP-SGD run, executed as the plan executes: its batch selection, its units, its processes.

Both canary audits (``canaries.dpsgd_lower_bound``, ``one_run.dpsgd_one_run``) run the real
``trainers.dpsgd.run_dpsgd`` on canary examples and read the model after every step. Here is
how that run takes the shape of the plan's execution:

- **Poisson** (truncated or not): every canary is sampled at the plan's q. A truncated
  Poisson phase is a Poisson phase whose batches are cut at a maximum size; its canary run
  is that Poisson run, uncut (the cut cannot be scaled down to the canaries as accounted,
  and it only removes participation, which the accounting covers), and its row says so
  (``truncation_note``).
- **Unit sampling**: every canary is a unit of one row (unit id = canary), so the real unit
  sampler draws it at the plan's q and the real per-unit clipping cuts its block to C.
- **Random allocation and shuffled batches**: the plan's epochs of T = N // B steps over
  T B' canaries in batches of B' (the real ``AllocationSampler`` or ``ShuffleSampler``),
  so that each canary takes part once per epoch, at the rate 1 / T of the plan's steps.
- **Several processes**: the run is launched over that many gloo ranks
  (``trainers.distributed.launch``), each holding its block of the canaries, sampling it
  from its own stream; rank 0 draws the noise and observes the table.

``canary_params`` gives the run's parameters and the canaries' inclusion rate per step;
``observed_run`` runs it and returns what the observer read.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from budgetplan.errors import UnsupportedError
from trainers import dpsgd
from trainers.data.encoded import EncodedData
from trainers.distributed import launch
from trainers.randomness import Randomness

__all__ = ["CanaryModel", "CanaryObserver", "SignObserver", "canary_data", "canary_params", "observed_run",
           "truncation_note", "EPOCH_SAMPLING"]

EPOCH_SAMPLING = ("allocation", "shuffle")


class CanaryModel(nn.Module):
    """logit_i = scale (e_i - e_i.detach()), e_i = table[id_i]: value 0, gradient scale / 2 on row id_i.

    At logit 0 with label 0 the BCE's derivative is 1/2, so every step, whatever the table
    holds, example i's gradient is scale / 2 = 4C on its own row: clipping cuts it to C.
    """

    def __init__(self, rows: int, scale: float):
        super().__init__()
        self.table = nn.Embedding(rows, 1)
        nn.init.zeros_(self.table.weight)
        self.scale = scale

    def forward(self, ns_cat, ns_num, s_cat, s_num):
        e = self.table(ns_cat[:, 0])[:, 0]
        return (e - e.detach()) * self.scale


def canary_data(rows: int, vocab: int, device):
    return EncodedData(
        ns_cat=torch.arange(rows, device=device)[:, None], ns_num=torch.zeros(rows, 0, device=device),
        s_cat=torch.zeros(rows, 0, dtype=torch.int64, device=device), s_num=torch.zeros(rows, 0, device=device),
        label=torch.zeros(rows, device=device), unit=None, ns_vocab=vocab, s_vocab=1)


class CanaryObserver:
    """Reads the table after each step; keeps each coordinate's statistic and the checks' sums."""

    def __init__(self, weight: torch.Tensor, present: int, *, q: float, c: float, sigma: float, expected: float):
        self.w, self.present = weight, present
        self.prev = weight.detach()[:, 0].clone()
        self.v_prev = torch.zeros_like(self.prev)
        self.to_x = expected / c  # gradient -> units of C per step
        self.sigma, self.q = sigma, q
        self.llr = torch.zeros_like(self.prev)
        # float32 sums of 147 N(0, sigma^2) terms: rounding ~1e-7 relative, far below the tests' resolution
        self.absent_sum = torch.zeros(self.prev.numel() - present, dtype=self.prev.dtype, device=self.prev.device)
        self.step_sumsq, self.present_total = [], 0.0
        self.momentum, self.lr = 0.0, None
        s2 = sigma * sigma
        self._scale, self._shift = 1.0 / s2, math.log(q) - 0.5 / s2
        self._stay = torch.tensor(math.log1p(-q), dtype=self.prev.dtype, device=self.prev.device)

    def checkpoint(self, step_done, optimizer_state) -> None:
        group = optimizer_state["optimizer"]["param_groups"][0]
        if group.get("nesterov") or group.get("dampening", 0) or group.get("weight_decay", 0):
            raise UnsupportedError("the canary audit undoes plain or heavy-ball SGD momentum only, got "
                                   f"{ {k: group.get(k) for k in ('nesterov', 'dampening', 'weight_decay')} }")
        self.momentum, self.lr = float(group["momentum"]), float(group["lr"])
        self.observe()

    def observe(self) -> None:
        """Recover the last step's noisy gradient from the weights, in units of C per step; add it."""
        cur = self.w.detach()[:, 0]
        v = torch.sub(self.prev, cur)
        if self.lr != 1.0:
            v.div_(self.lr)
        x = torch.sub(v, self.v_prev, alpha=self.momentum).mul_(self.to_x)
        self.prev.copy_(cur)
        self.v_prev = v
        self.add(x)

    def add(self, x: torch.Tensor) -> None:
        """Fold one step's x (consumed: overwritten in place) into the statistic and the checks' sums."""
        xa = x[self.present:]
        self.step_sumsq.append(float(torch.linalg.vector_norm(xa, dtype=torch.float64)) ** 2)
        self.present_total += float(x[:self.present].sum(dtype=torch.float64))
        self.absent_sum.add_(xa)
        a = x.mul_(self._scale).add_(self._shift)
        self.llr.add_(torch.logaddexp(a, self._stay, out=a))

    @property
    def absent_total(self) -> float:
        return float(self.absent_sum.sum(dtype=torch.float64))


class SignObserver(CanaryObserver):
    """The canary observer with each coordinate's statistic the log-likelihood ratio of label 1 to label 0
    (the one-run audit's: a canary's secret label is the sign of its gradient)."""

    def add(self, x: torch.Tensor) -> None:
        self.step_sumsq.append(0.0)  # counts the steps observed
        a = x.mul_(self._scale)
        up = torch.logaddexp(a + self._shift, self._stay)     # ln(1 - q + q e^{(2x - 1) / 2 sigma^2}): label 0
        down = torch.logaddexp(self._shift - a, self._stay)   # ln(1 - q + q e^{(-2x - 1) / 2 sigma^2}): label 1
        self.llr.add_(down - up)


def canary_params(params, present: int, steps: int):
    """(the plan's DP-SGD parameters on the canaries, the canaries used) for ``present`` canaries and ``steps``.

    Poisson (and truncated Poisson, run as Poisson) keeps q over ``present`` canaries, units
    included (every canary its own unit). Allocation and shuffled batches keep the plan's
    T = N // B steps per epoch over T B' canaries, B' = ``present`` // T (at least 1), so the
    canaries used may be a few fewer than asked.
    """
    if params.sampling in EPOCH_SAMPLING:
        per_epoch = params.steps_per_epoch
        batch = max(1, present // per_epoch)
        used = batch * per_epoch
        return replace(params, dataset_size=used, batch_size=batch, sampling_rate=batch / used, steps=steps,
                       epochs=steps / per_epoch), used
    units = present if params.samples_units else None
    return replace(params, dataset_size=present, steps=steps, sampling="poisson", max_batch_size=None,
                   units=units), present


def truncation_note(params) -> str:
    """How a truncated Poisson phase's canaries ran, for its row's text ("" for any other phase)."""
    if params.sampling != "truncated-poisson":
        return ""
    return (f"; the truncated Poisson phase run as Poisson at the plan's q = {params.sampling_rate:g}, its batches "
            f"not cut at {params.max_batch_size} (the cut only removes participation, which the accounting covers)")


def observed_run(run_par, *, present: int, absent: int, labels: np.ndarray | None = None, signs: bool = False,
                 randomness=None, processes: int = 1, progress: str | None = None, device="cpu") -> dict:
    """Run ``run_par`` on ``present`` canaries (+ ``absent`` table rows no example reads), observed at every step.

    Args:
        labels: the canaries' labels (the one-run audit's secret coins), default all 0.
        signs: observe with ``SignObserver`` (the one-run audit), else ``CanaryObserver``.
        randomness: one process's ``Randomness``; with several processes its seed (None: the
            CSPRNG) gives each rank its own stream.
        processes: the ranks to run over (gloo, one thread each).

    Returns:
        {"step_sumsq", "present_total", "absent_sum" (numpy), "llr" (numpy), "executed"} as rank 0 observed.
    """
    if processes <= 1:
        alone = _observe(None, run_par, present, absent, labels, signs, randomness or Randomness(), progress,
                         str(device))
        assert alone is not None  # one process observes for itself
        return alone
    seed = None if randomness is None else randomness.seed
    observed: dict = launch(_rank, processes, run_par, present, absent, labels, signs, seed, timeout_s=600.0)[0]
    return observed


def _rank(coll, run_par, present, absent, labels, signs, seed):
    return _observe(coll, run_par, present, absent, labels, signs, Randomness(seed, stream=coll.rank), None, "cpu")


def _observe(coll, run_par, present, absent, labels, signs, rnd, progress, device) -> dict | None:
    c, sigma = run_par.clipping_norm, run_par.noise_multiplier
    model = CanaryModel(present + absent, scale=8.0 * c).to(device)
    data = canary_data(present, present + absent, device)
    if labels is not None:
        data = replace(data, label=torch.as_tensor(labels, dtype=torch.float32, device=device))
    if coll is not None:
        block = coll.shard(present)
        data = data.take(torch.arange(block.start, block.stop, device=device))
    if run_par.samples_units:  # every canary a unit of one row, numbered densely on its rank
        data = replace(data, unit=torch.arange(len(data), device=device))
    kind = SignObserver if signs else CanaryObserver
    obs = kind(model.table.weight, present, q=run_par.sampling_rate, c=c, sigma=sigma,
               expected=run_par.expected_batch_size)
    ran = dpsgd.run_dpsgd(model, data, run_par, trainable=[model.table.weight], randomness=rnd,
                          settings=dpsgd.DPSGDSettings(optimizer="sgd", lr=1.0), progress=progress,
                          checkpoint=obs.checkpoint, checkpoint_every=1, collective=coll)
    if obs.lr is None:  # one step: no checkpoint ran; the first step has no momentum to undo
        obs.lr = 1.0
    obs.observe()
    if coll is not None and coll.rank != 0:
        return None  # rank 0 observed the same replicas
    return {"step_sumsq": list(obs.step_sumsq), "present_total": obs.present_total,
            "absent_sum": obs.absent_sum.double().cpu().numpy(), "llr": obs.llr.double().cpu().numpy(),
            "executed": ran.start_step + ran.steps_taken}
