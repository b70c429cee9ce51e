"""Where a run's randomness comes from: the OS CSPRNG by default, a seed only when asked.

Privacy noise (RR label flips, Gaussian noise) must not be predictable, so by default
every random draw that touches privacy comes from ``os.urandom`` (the operating system's
CSPRNG) or from a generator seeded afresh from it. A seeded, reproducible mode exists for
debugging and tests; it is explicit (``seed=...``) and recorded in the run record, whose
statement then says the noise was reproducible.

Every session of a run draws from streams of its own: a resumed run (``for_session``)
never replays the draws of the sessions before it. Without a seed each session draws
afresh from the CSPRNG anyway; with one, session k > 0 of stream s draws from the seed's
stream ``(s, k)``, which the run directory's ledger records (``trainers.session``).
"""

from __future__ import annotations

import os
import secrets

import numpy as np

from budgetplan.record.parts import Seeds

__all__ = ["Randomness"]


class Randomness:
    """The run's random sources.

    Args:
        seed: None for the CSPRNG policy (the default), or an integer for a reproducible run.
        stream: which of the seed's independent streams (a rank of a distributed run: ranks
            that shared one stream would sample and flip their shards in lockstep). Stream 0
            is the seed's own stream, so a one-process run is unchanged. Ignored without a seed
            (every process draws afresh from its CSPRNG).
        session: which session of the run draws (0: the first; k: the k-th resume). A
            session other than the first draws from streams of its own, never the ones an
            earlier session drew from (``for_session``).
    """

    def __init__(self, seed: int | None = None, *, stream: int = 0, session: int = 0):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        if isinstance(session, bool) or not isinstance(session, int) or session < 0:
            raise ValueError(f"session must be a non-negative integer, got {session!r}")
        self.seed = seed
        self.stream = int(stream)
        self.session = session
        key = (self.stream,) if session == 0 else (self.stream, session)
        source = seed if key == (0,) else np.random.SeedSequence(seed, spawn_key=key)
        self._seeded = np.random.Generator(np.random.PCG64(source)) if seed is not None else None

    def for_session(self, session: int) -> Randomness:
        """The randomness of session ``session`` of this run: this one for the first, fresh streams for a resume."""
        return self if session == self.session else Randomness(self.seed, stream=self.stream, session=session)

    @property
    def policy(self) -> str:
        return "seeded" if self.seed is not None else "csprng"

    def ledger_note(self) -> dict:
        """What a session's ledger records of where its draws come from (``trainers.session``)."""
        return {"policy": self.policy, "seed": self.seed, "session": self.session}

    def record(self) -> Seeds:
        return Seeds(policy=self.policy, seed=self.seed,
                     note="privacy noise drawn from os.urandom" if self.seed is None else
                     "reproducible run: noise derived from an explicit seed, for debugging only")

    def uniform_u64(self, n: int) -> np.ndarray:
        """n independent uniform 64-bit integers (privacy-relevant draws)."""
        if self._seeded is not None:
            return self._seeded.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()

    def bernoulli(self, probabilities: np.ndarray | float, n: int) -> np.ndarray:
        """n independent coin flips, True with at least the given probability each.

        The threshold is ceil(p * 2^64) on a uniform 64-bit integer, so the realised
        probability is p rounded up to a multiple of 2^-64: never below the planned one
        (a flip probability below plan would weaken randomized response).
        """
        p = np.broadcast_to(np.asarray(probabilities, dtype=np.float64), (n,))
        if np.any((p < 0) | (p > 1)):
            raise ValueError("probabilities must lie in [0, 1]")
        # p * 2^64 computed exactly in two 32-bit halves, then rounded up.
        scaled_hi = np.floor(p * 2.0**32)
        rest = (p * 2.0**32 - scaled_hi) * 2.0**32
        threshold = scaled_hi.astype(np.uint64) << np.uint64(32)
        threshold += np.ceil(rest).astype(np.uint64)
        draws = self.uniform_u64(n)
        full = p >= 1.0
        return (draws < threshold) | full

    def generator(self) -> np.random.Generator:
        """A numpy Generator for non-privacy choices (capping, shuffling), seeded from the policy."""
        if self._seeded is not None:
            return np.random.Generator(np.random.PCG64(self._seeded.integers(0, 2**63)))
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def torch_seed(self) -> int:
        """A seed for torch's generators (model init, minibatch order)."""
        if self._seeded is not None:
            return int(self._seeded.integers(0, 2**63))
        return secrets.randbits(63)
