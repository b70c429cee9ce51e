"""What each noisy DP-SGD step actually did, kept as evidence for the audit.

The step engine (``trainers.dpsgd.DPSGDStep``) reports here what it did, measured on the
tensors it used, not on what it meant to do:

- **noise**: at every step, how many Gaussian draws this rank made and the sum of their
  squares (standardised draws, so a chi-square with as many degrees of freedom): a claimed
  draw that was not made shows up as a step with no drawing rank or a sum of squares of 0;
- **participation** (allocation and shuffled batches): how many times each row took part in
  each epoch, as a histogram ``{times: rows}``, from the batches' own row indices;
- **units kept whole** (unit sampling): how many sampled unit blocks held anything but all
  the rows of one unit, or repeated a unit within the step.

Over several processes every rank keeps its own and rank 0 merges them (``merge``): each
step's noise then names the ranks that drew it. The merged evidence goes to the private
record (``budgetplan.record.evidence`` reads it; ``budgetplan.audit.step_evidence`` tests it): it
holds statistics of the secret noise and sampling, never of the data.
"""

from __future__ import annotations

from itertools import zip_longest

import torch

__all__ = ["StepEvidence", "merge"]


class StepEvidence:
    """One rank's evidence of one DP-SGD session.

    Args:
        params: the plan's ``DPSGDParams``.
        rows: the rows this rank samples from (participation is counted over them), or None.
        unit: this rank's rows' dense unit ids (a tensor) when the plan samples units, or None.
        start_step: steps already counted (epochs are counted in the run's step numbering).
    """

    def __init__(self, params, *, rows: int | None, unit: torch.Tensor | None = None, start_step: int = 0):
        self.steps_per_epoch = params.steps_per_epoch
        self.sampling = params.sampling
        self.k = params.cap if params.samples_units else 1
        # per step: draws made on this rank, and the sum of their squares as a 0-d float64 tensor on
        # the noise's device (None: no draw), read back once in ``local``: no host sync per step
        self.draws: list[int] = []
        self.sumsq: list[torch.Tensor | None] = []
        self.epochs: list[dict] = []                  # per epoch: {"whole", "counts": {times: rows}}
        self.step = start_step
        self._counts = (torch.zeros(int(rows), dtype=torch.int32) if rows is not None
                        and params.sampling in ("allocation", "shuffle") else None)
        self._unit = None if unit is None or not params.samples_units else unit.to(torch.int64)
        self._unit_rows = None if self._unit is None else torch.bincount(self._unit)
        self.unit_blocks = self.units_split = 0

    def batch(self, batch) -> None:
        """Count the rows (or check the unit blocks) of one step's batch, from its chunks."""
        if self._counts is not None:
            for idx, mask in batch.chunks:
                real = idx[mask > 0].to(self._counts.device)
                self._counts.index_add_(0, real, torch.ones_like(real, dtype=torch.int32))
        if self._unit is not None:
            self._unit_blocks(batch)

    def _unit_blocks(self, batch) -> None:
        assert self._unit is not None and self._unit_rows is not None
        unit = self._unit.to(batch.chunks[0][0].device)
        seen = []
        for idx, mask in batch.chunks:
            blocks, real = idx.view(-1, self.k), mask.view(-1, self.k) > 0
            used = real.any(1)
            u = unit[blocks]
            low = torch.where(real, u, torch.iinfo(torch.int64).max).min(1).values[used]
            high = torch.where(real, u, -1).max(1).values[used]
            held = real.sum(1)[used]
            whole = (low == high) & (held == self._unit_rows.to(u.device)[low])
            self.units_split += int((~whole).sum())
            self.unit_blocks += int(used.sum())
            seen.append(low)
        units = torch.cat(seen) if seen else torch.empty(0, dtype=torch.int64)
        self.units_split += int(units.numel() - torch.unique(units).numel())  # a unit in two blocks of the step

    def drew(self, draws: int, sumsq: torch.Tensor | None) -> None:
        """The noise this rank drew at this step (after ``batch``), which closes the step.

        ``sumsq``: the sum of the draws' squares, a 0-d tensor left on its device (or None
        for no draw); it is not read here, so a step costs no device sync.
        """
        self.draws.append(int(draws))
        self.sumsq.append(sumsq)
        self.step += 1
        if self._counts is not None and self.step % self.steps_per_epoch == 0:
            self._close_epoch(whole=True)

    def _close_epoch(self, *, whole: bool) -> None:
        assert self._counts is not None
        times, rows = torch.unique(self._counts, return_counts=True)
        self.epochs.append({"whole": whole, "counts": {str(int(t)): int(r) for t, r in zip(times, rows)}})
        self._counts.zero_()

    def _sums(self) -> list[float]:
        """Every step's sum of squares as floats: one stack and one read per device, not one per step."""
        out = [0.0] * len(self.sumsq)
        by_device: dict[torch.device, list[int]] = {}
        for i, s in enumerate(self.sumsq):
            if s is not None:
                by_device.setdefault(s.device, []).append(i)
        for steps in by_device.values():
            values = torch.stack([self.sumsq[i].to(torch.float64) for i in steps]).tolist()
            for i, v in zip(steps, values):
                out[i] = float(v)
        return out

    def local(self) -> dict:
        """This rank's evidence, to merge (an unfinished epoch closed as partial)."""
        if self._counts is not None and self.step % self.steps_per_epoch and bool(self._counts.any()):
            self._close_epoch(whole=False)
        out: dict = {"noise": list(zip(self.draws, self._sums()))}
        if self._counts is not None:
            out["participation"] = list(self.epochs)
        if self._unit is not None:
            out["unit_blocks"], out["units_split"] = self.unit_blocks, self.units_split
        return out


def merge(parts: list[dict]) -> dict:
    """The ranks' evidence (in rank order) as the private record holds it.

    ``noise_ranks``: per step, the ranks that drew noise; ``noise_draws`` and ``noise_chi2``:
    per step, the draws and their sum of squares over the ranks. Participation is one
    process's (allocation and shuffled batches run on one); unit counts add up.
    """
    steps = list(zip_longest(*(p["noise"] for p in parts), fillvalue=(0, 0.0)))
    out: dict = {
        "noise_ranks": [[r for r, (d, _) in enumerate(step) if d > 0] for step in steps],
        "noise_draws": [sum(d for d, _ in step) for step in steps],
        "noise_chi2": [float(sum(s for _, s in step)) for step in steps],
    }
    if "participation" in parts[0]:
        out["participation"] = parts[0]["participation"]
    if "unit_blocks" in parts[0]:
        out["unit_blocks"] = sum(p["unit_blocks"] for p in parts)
        out["units_split"] = sum(p["units_split"] for p in parts)
    return out
