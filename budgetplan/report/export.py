"""A plan's DP-SGD phase as another library's settings: Opacus, for people with their own loop.

``opacus_settings(plan)`` says what to pass to ``PrivacyEngine().make_private`` (noise
multiplier sigma, max_grad_norm C, Poisson sampling) and how long to train (at most the
plan's T optimiser steps), and what the plan's guarantee then needs from the run. Opacus
samples at ``1 / len(data_loader)`` = 1 / ceil(N / B): never above the plan's q = B / N, so
with the plan's sigma, C and at most T steps the run is at least as private as planned (at
a slightly smaller expected batch when B does not divide N).

Refused, because Opacus cannot execute what the plan accounted: a plan without a DP-SGD
phase, truncated Poisson sampling (Opacus does not cut batches), a plan whose N is a DP
count (Opacus reads the true ``len(dataset)``), a units split (likewise, its part's true size), and a
``[tuning]`` plan (several
configurations; export the chosen one's plan).
"""

from __future__ import annotations

import math
from typing import Any

from budgetplan.errors import UnsupportedError
from budgetplan.plan import Plan

__all__ = ["opacus_settings"]


def opacus_settings(plan: Plan) -> dict[str, Any]:
    """The Opacus settings and the caveats of ``plan``'s DP-SGD phase (module docstring)."""
    phase = plan.dpsgd
    if phase is None:
        raise UnsupportedError(f"the plan {plan.scenario.name!r} has no DP-SGD phase: nothing to export to Opacus")
    p = phase.params
    if p.sampling != "poisson":
        raise UnsupportedError(f"the plan samples by {p.sampling}: Opacus draws plain Poisson batches and cannot cut "
                               "them as accounted (plan sampling = \"poisson\")")
    if plan.count is not None:
        raise UnsupportedError("the plan's N is a DP count: Opacus samples at 1 / len(data_loader), which reads the "
                               "true N; train with budgetplan, which keeps it private")
    if p.unit_part is not None:
        raise UnsupportedError("the plan splits the units: its DP-SGD phase samples at q = B / (the part's expected "
                               "rows), and Opacus samples at 1 / len(data_loader) of the part's true rows, which may "
                               "be fewer; train with budgetplan, which keeps the plan's q")
    if plan.tuning is not None:
        raise UnsupportedError("a [tuning] plan runs several configurations and a selection: export the plan of "
                               "the configuration you train")
    loader_batches = math.ceil(p.dataset_size / p.batch_size)
    sample_rate = 1.0 / loader_batches
    frozen = p.nonsensitive_tower == "frozen"
    caveats = [
        "Poisson sampling is required: make_private(..., poisson_sampling=True), the default; a shuffled "
        "fixed-size loader is not what the plan accounted.",
        f"Take at most {p.steps:,} optimiser steps (one per Poisson batch, no gradient accumulation across "
        f"batches): {p.steps / loader_batches:.4g} epochs of {loader_batches:,} batches.",
        f"The data has exactly N = {p.dataset_size:,} rows" + (
            f", after capping every unit at K = {p.cap} rows by the plan's rule ({p.capping}), a rule that "
            "looks only at the unit's own rows and a secret key, never at labels." if p.cap > 1 else "."),
        "Noise: PrivacyEngine(secure_mode=True) draws it from a cryptographically secure generator; the "
        "default generator is predictable to anyone who knows its seed.",
        "Opacus's own accountant reports an epsilon for example-level add-remove adjacency at its sample "
        f"rate; the guarantee is the plan's ({phase.guarantee.epsilon:.6g}, {phase.guarantee.delta:.3g}) for "
        f"this phase, {plan.adjacency.value} adjacency.",
    ]
    if sample_rate < p.sampling_rate * (1 - 1e-12):
        caveats.append(f"Opacus will sample at 1/{loader_batches:,} = {sample_rate:.6g}, below the plan's "
                       f"q = {p.sampling_rate:.6g} (B = {p.batch_size:,} does not divide N): at least as private "
                       "as planned, with a slightly smaller expected batch.")
    if frozen:
        caveats.append("The plan freezes the non-sensitive tower: only the other parameters may require grad "
                       "(set requires_grad=False on the tower before make_private).")
    if plan.rr is not None:
        caveats.append(f"This is phase 2 of Hybrid: the plan's RR phase (eps {plan.rr.guarantee.epsilon:.6g}) "
                       "comes first and Opacus cannot run it; the DP-SGD phase starts from the RR model.")
    others = [ph.name for ph in plan.phases if ph.name not in ("rr", "dpsgd")]
    if others:
        caveats.append(f"The plan also accounts {' and '.join(others)}, which Opacus does not run: without "
                       f"{'it' if len(others) == 1 else 'them'} the run spends less than the plan's total.")
    return {
        "library": "opacus",
        "plan": plan.scenario.name,
        "make_private": {"noise_multiplier": p.noise_multiplier, "max_grad_norm": p.clipping_norm,
                         "poisson_sampling": True},
        "data_loader": {"batch_size": p.batch_size, "dataset_size": p.dataset_size,
                        "batches_per_epoch": loader_batches},
        "max_steps": p.steps,
        "epochs": p.steps / loader_batches,
        "plan_sampling_rate": p.sampling_rate,
        "opacus_sample_rate": sample_rate,
        "trainable": "all but the non-sensitive tower" if frozen else "every parameter",
        "phase_guarantee": {"epsilon": phase.guarantee.epsilon, "delta": phase.guarantee.delta},
        "plan_guarantee": {"epsilon": plan.guarantee.epsilon, "delta": plan.guarantee.delta},
        "adjacency": plan.adjacency.value,
        "caveats": caveats,
    }
