"""Planted defects as real code changes to the trainer's modules.

A mutant is the module's own source with one exact snippet replaced (it must occur exactly
once: a refactor that removes it makes the test fail loudly instead of passing silently),
executed as a fresh module; the named functions of the real module are then patched with
the mutated ones, so every caller that looks them up on the module runs the defect.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """``old`` -> ``new`` in ``module``'s source; ``patch`` names the functions replaced on the module."""

    name: str
    module: str
    old: str
    new: str
    patch: tuple[str, ...]
    preamble: str = ""  # module-level code the mutated functions need (a counter)

    def build(self) -> types.ModuleType:
        real = importlib.import_module(self.module)
        source = inspect.getsource(real)
        count = source.count(self.old)
        assert count == 1, f"mutant {self.name!r}: the snippet occurs {count} times in {self.module}, not once"
        mutated = types.ModuleType(f"{self.module}__{self.name.replace(' ', '_')}")
        mutated.__file__ = real.__file__
        code = compile(source.replace(self.old, self.new) + "\n" + self.preamble, real.__file__, "exec")
        sys.modules[mutated.__name__] = mutated  # dataclasses look their module up while the class is built
        try:
            exec(code, mutated.__dict__)  # noqa: S102 - the trainer's own source, edited by the test
        finally:
            del sys.modules[mutated.__name__]
        return mutated

    def plant(self) -> None:
        """Install for good, in a process that ends with the test (a rank spawned by ``trainers.distributed``)."""
        mutated = self.build()
        real = importlib.import_module(self.module)
        for fn in self.patch:
            setattr(real, fn, getattr(mutated, fn))

    def install(self, monkeypatch) -> types.ModuleType:
        mutated = self.build()
        real = importlib.import_module(self.module)
        for fn in self.patch:
            monkeypatch.setattr(real, fn, getattr(mutated, fn))
        return mutated


NOISE_HALVED = Mutant(
    "noise halved", "trainers.dpsgd",
    "part.add_(z.mul_(noise_std))",
    "part.add_(z.mul_(noise_std / 2))", ("noisy_gradient",))

CLIPPING_OFF = Mutant(
    "clipping off", "trainers.clipping",
    "factor = (safe / norms).clamp(max=1.0)",
    "factor = torch.ones_like(norms)", ("clipped_gradient_sum",))

# 49 steps make an epoch of the README plan (ceil(N / B) = ceil(200,000 / 4,096)).
NOISE_ONCE_PER_EPOCH_IN_STEP = Mutant(
    "noise once per epoch in the step", "trainers.dpsgd",
    "    draws, sumsq = 0, None\n",
    "    global _CALLS\n    _CALLS += 1\n    if _CALLS % 49 != 1:\n        noise_std = 0.0\n"
    "    draws, sumsq = 0, None\n",
    ("noisy_gradient",), preamble="_CALLS = 0\n")

# DPSGDStep is the step object of every DP-SGD loop (run_dpsgd's and trainers.private's): its
# defects are planted in the class, which run_dpsgd looks up on the module at call time.
NOISE_ONCE_PER_EPOCH_IN_LOOP = Mutant(
    "noise once per epoch in the step object", "trainers.dpsgd",
    "clipping_norm=self.params.clipping_norm, noise_std=self.noise_std,",
    "clipping_norm=self.params.clipping_norm, noise_std=self.noise_std if self.step % "
    "math.ceil(1 / self.params.sampling_rate) == 0 else 0.0,", ("DPSGDStep",))

NOISE_REUSED_EVERY_STEP = Mutant(
    "noise generator reseeded every step", "trainers.dpsgd",
    "            batch = sampler.sample()\n",
    "            batch = sampler.sample()\n            noise_gen.manual_seed(12345)\n", ("run_dpsgd",))

REALISED_BATCH = Mutant(
    "normalised by the realised batch size", "trainers.dpsgd",
    "expected_batch=self.expected_batch, noise_generator=self.noise_generator",
    "expected_batch=max(batch.size, 1), noise_generator=self.noise_generator", ("DPSGDStep",))

RR_FLIP_08_IN_PHASE = Mutant(
    "RR flip probability 0.8x in the phase", "trainers.rr_phase",
    "rho = flip_probabilities(phase, unit_counts, labels.size)",
    "rho = 0.8 * flip_probabilities(phase, unit_counts, labels.size)", ("run_rr_phase",))

RR_FLIP_08_IN_RANDOMIZE = Mutant(
    "RR flip probability 0.8x in randomize_labels", "trainers.rr_phase",
    "flips = randomness.bernoulli(flip_probability, labels.size)",
    "flips = randomness.bernoulli(0.8 * flip_probability, labels.size)", ("randomize_labels",))

WALR_NOISE_HALVED_IN_RUN = Mutant(
    "WALR noise halved in run_walr", "trainers.walr",
    "noise_std=params.noise_std, randomness=randomness, sensitivity=sens",
    "noise_std=params.noise_std / 2, randomness=randomness, sensitivity=sens", ("run_walr",))

WALR_NOISE_HALVED_IN_RELEASE = Mutant(
    "WALR noise halved in release", "trainers.walr",
    "dtype=torch.float64) * sigma\n",
    "dtype=torch.float64) * sigma / 2\n", ("release",))

# Defects of the executions the plain audit must see from the evidence a run leaves.
SAME_SEED_RANKS = Mutant(
    "every rank on the seed's stream 0", "trainers.run",
    "    rnd = Randomness(seed, stream=0 if collective is None else collective.rank)\n",
    "    rnd = Randomness(seed, stream=0)\n", ("_prepare",))

NO_NOISE_ON_ANY_RANK = Mutant(
    "noise drawn by no rank", "trainers.dpsgd",
    "    if collective is None or collective.draws_noise:\n",
    "    if collective is None:\n", ("noisy_gradient",))

# the draws counted and "added", but every one of them zero: the noise claimed at every step was never added
NOISE_NOT_ADDED = Mutant(
    "noise counted but not added", "trainers.dpsgd",
    "            z.normal_(generator=generator)  # the values of randn(...), this block of them\n",
    "            z.zero_()\n", ("noisy_gradient",))

# the last row of each epoch's allocation is replaced by the first: one row takes part twice, one not at all
ALLOCATED_TWICE = Mutant(
    "an example allocated twice per epoch", "trainers.sampling",
    "        order = torch.argsort(step, stable=True)\n",
    "        order = torch.argsort(step, stable=True)\n        order[-1] = order[0]\n", ())

# the first 20 units with more than one row are cut in two table entries, sampled (and clipped) apart
UNIT_SPLIT = Mutant(
    "units split across batches", "trainers.dpsgd",
    "        table = unit_table(data.unit.cpu(), params.cap)\n",
    "        table = unit_table(data.unit.cpu(), params.cap)\n"
    "        cut = (table[:, 1] >= 0).nonzero()[:20, 0]\n"
    "        tail = torch.full((len(cut), k), -1, dtype=torch.int64)\n"
    "        tail[:, :k - 1] = table[cut, 1:]\n"
    "        table[cut, 1:] = -1\n"
    "        table = torch.cat([table, tail])\n", ("phase_sampler",))

DPSGD_MUTANTS = (NOISE_HALVED, CLIPPING_OFF, NOISE_ONCE_PER_EPOCH_IN_STEP, NOISE_ONCE_PER_EPOCH_IN_LOOP,
                 NOISE_REUSED_EVERY_STEP, REALISED_BATCH)
RR_MUTANTS = (RR_FLIP_08_IN_PHASE, RR_FLIP_08_IN_RANDOMIZE)
WALR_MUTANTS = (WALR_NOISE_HALVED_IN_RUN, WALR_NOISE_HALVED_IN_RELEASE)
