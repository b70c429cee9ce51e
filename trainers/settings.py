"""What a run is told besides its plan: the model and optimisation settings, and the run's options.

The plan (``budgetplan``) is frozen and holds every number that touches privacy; these are
kept apart from it, as jax_privacy keeps its ``PerformanceFlags`` apart from its frozen
``DPExecutionPlan``: nothing here can change a guarantee.

- ``TrainSettings``: the model, its encoding and its (non-private) optimisation;
- ``WALRSettings``: WALR's gradient descent after its one release;
- ``RunOptions``: everything else ``execute_plan`` is told (where the data to evaluate on
  is, the run directory, the seed, threads and processes, resumption...).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from budgetplan import limits
from budgetplan.errors import InvalidParameterError
from budgetplan.util import validate

if TYPE_CHECKING:
    from trainers.distributed import Collective
    from trainers.dpsgd import DPSGDSettings

__all__ = ["TrainSettings", "WALRSettings", "RunOptions", "RR_SELECT"]

# What the RR phase's held-out checks compare (``TrainSettings.rr_select``).
RR_SELECT = ("auc", "log_loss")


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Model and optimisation settings: nothing here can change a privacy guarantee."""

    model: str = "mlp"
    embedding_dim: int | str = 8
    tower_hidden: int = 128
    common_hidden: tuple = (128, 64)
    lr: float = 1e-3
    optimizer: str = "adam"
    loss: str = "forward"        # bounded below; the unbiased loss is not (see CHANGELOG)
    batch_size: int = 1024
    hash_bins_nonsensitive: int = 2**16
    hash_bins_sensitive: int = 2**16
    # "vocab": non-sensitive values seen >= vocab_threshold times; "hash"; "auto" (the default):
    # vocab where the plan leaves the non-sensitive columns unprotected, else hash.
    nonsensitive_encoding: str = "auto"
    vocab_threshold: int = 16
    device: str = "auto"
    data_format: str = "auto"
    # Hybrid: "rr-model" starts DP-SGD from exactly the RR model (the weights reading the
    # sensitive tower zeroed, as arXiv:2401.15246 warm-starts); "as-trained" leaves them at
    # their initial values.
    hybrid_start: str = "rr-model"
    # The RR phase's stopping rule on its held-out units (a plan with [rr].validation_fraction):
    # scored this many times an epoch, stopped after rr_patience checks without a lower loss.
    rr_checks_per_epoch: int = 4
    rr_patience: int = 4
    rr_weight_decay: float = 0.0
    # (learning rate, L2) pairs the RR phase trains when it has held-out units, keeping the one
    # the held-out checks score best (free: post-processing of the release); None, or a plan
    # without held-out units: (lr, rr_weight_decay) alone. The L2 pair closed most of RR's gap to
    # its ceiling at eps 3 and 8 on the 1M-row frontier; the plain pair is the safe one at eps 1
    # and 1.5, where an L2 pair at a smaller step collapsed to a constant model (CHANGELOG).
    rr_candidates: tuple | None = ((1e-3, 0.0), (1e-3, 1e-4))
    # With held-out units: None scores the last weights at each check; a number of epochs also
    # scores a moving average of the weights over about that many epochs (an exponential average
    # updated after every step), and each check keeps the better of the two. 0.7 smooths the
    # held-out score's jumps from check to check (CHANGELOG: the 1M-row frontier, RR at eps 8
    # better on all five shapes).
    rr_average: float | None = 0.7
    # What the held-out checks compare, to stop, keep a state and choose a pair: "log_loss" (the
    # debiased log loss) or "auc" (the debiased AUC: the RR phase hands on a ranking, its
    # calibration is set afterwards). "auc" falls back to the log loss where the held-out rows
    # are too few to estimate an AUC (trainers.rr_validation.AUC_MIN_POSITIVES).
    rr_select: str = "auc"

    def __post_init__(self):
        if self.model not in ("mlp", "fm"):
            raise InvalidParameterError(f"model must be mlp or fm, got {self.model!r}")
        if self.loss not in ("unbiased", "forward"):
            raise InvalidParameterError(f"loss must be unbiased or forward, got {self.loss!r}")
        if self.nonsensitive_encoding not in ("auto", "vocab", "hash"):
            raise InvalidParameterError(f"nonsensitive_encoding must be auto, vocab or hash, got "
                                        f"{self.nonsensitive_encoding!r}")
        if self.hybrid_start not in ("rr-model", "as-trained"):
            raise InvalidParameterError(f"hybrid_start must be rr-model or as-trained, got {self.hybrid_start!r}")
        for name in ("rr_checks_per_epoch", "rr_patience"):
            validate.at_most(name, validate.positive_int(name, getattr(self, name)), limits.MAX_EPOCHS)
        validate.non_negative("rr_weight_decay", self.rr_weight_decay)
        if self.rr_average is not None:
            validate.at_most("rr_average", validate.positive("rr_average", self.rr_average), limits.MAX_EPOCHS)
        if self.rr_select not in RR_SELECT:
            raise InvalidParameterError(f"rr_select must be {' or '.join(RR_SELECT)}, got {self.rr_select!r}")
        if self.rr_candidates is not None:
            if not self.rr_candidates:
                raise InvalidParameterError("rr_candidates must name at least one (learning rate, L2) pair, or be None")
            for pair in self.rr_candidates:
                if not isinstance(pair, tuple | list) or len(pair) != 2:
                    raise InvalidParameterError(f"rr_candidates: each entry must be a (learning rate, L2) pair, "
                                                f"got {pair!r}")
                validate.positive("rr_candidates learning rate", pair[0])
                validate.non_negative("rr_candidates L2", pair[1])

    def to_dict(self) -> dict:
        out = asdict(self)
        out["common_hidden"] = list(self.common_hidden)
        return out

    def for_plan(self, plan) -> TrainSettings:
        """These settings with ``"auto"`` resolved for ``plan``: a vocabulary over the non-sensitive
        columns where its adjacency leaves them unprotected (vocab beat hashing by 0.2-4.7 AUC
        points on the synthetic shapes, see CHANGELOG), hashing where a vocabulary would leak."""
        if self.nonsensitive_encoding != "auto":
            return self
        return replace(self, nonsensitive_encoding="vocab" if plan.nonsensitive_fixed else "hash")


@dataclass(frozen=True, kw_only=True)
class WALRSettings:
    """WALR's gradient descent after the release: post-processing, so nothing here costs privacy."""

    steps: int = 2000
    minibatch: int = 4096
    lr: float = 0.5
    # The one-hot encoding's column weights: "fitted" (``trainers.walr_onehot.column_weights``,
    # from the features' counts) or "uniform" (every column's coordinate 1, as before they were
    # fitted). The numeric encoding has none.
    column_weights: str = "fitted"
    # The one-hot fit's prior: "empirical-bayes" (each column's precision estimated from the release,
    # ``trainers.walr_onehot.fit_empirical_bayes``) or "fixed" (one precision, L2_BASE, for every
    # column, as before it was estimated).
    prior: str = "empirical-bayes"

    def __post_init__(self):
        if self.column_weights not in ("fitted", "uniform"):
            raise InvalidParameterError(f"column_weights must be fitted or uniform, got {self.column_weights!r}")
        if self.prior not in ("empirical-bayes", "fixed"):
            raise InvalidParameterError(f"prior must be empirical-bayes or fixed, got {self.prior!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to run a plan: every option of ``execute_plan`` but the plan and the training data.

    Attributes:
        eval_path: held-out data, read and encoded before anything is spent; its metrics go
            in the record.
        out_dir: the run directory (record, model, ledger, checkpoints); None: nothing written.
        settings: the model's settings (``TrainSettings()`` by default, ``"auto"`` resolved
            for the plan).
        dpsgd_settings: the DP-SGD phase's optimisation (``DPSGDSettings.for_device`` by default).
        walr_settings: WALR's fit after its release (``WALRSettings()`` by default).
        seed: a seeded run (reproducible, for tests and benchmarks); None: the OS CSPRNG.
        baseline_auc, baseline_tolerance: the non-private baseline's eval AUC (adds the
            relative AUC loss) and the tolerance of ``trainers.baseline.reference`` (adds
            ``beats_baseline``).
        progress: show progress bars.
        resume: continue the interrupted run in ``out_dir`` with its ledger's step count.
        checkpoint_every: DP-SGD steps between checkpoints.
        fingerprint_key: the data owner's key for the data fingerprint (None: a fresh key,
            saved as ``private/fingerprint.key``).
        threads: torch's CPU threads (``trainers.threads``), per process.
        nproc: run in that many local processes (``trainers.ranks``).
        collective: this process's place in a group already formed (``torchrun``).
        keep_initial: also keep the model as initialised (``private/initial_model.pt``).
    """

    eval_path: str | Path | None = None
    out_dir: str | Path | None = None
    settings: TrainSettings | None = None
    dpsgd_settings: DPSGDSettings | None = None
    walr_settings: WALRSettings | None = None
    seed: int | None = None
    baseline_auc: float | None = None
    baseline_tolerance: float | None = None
    progress: bool = False
    resume: bool = False
    checkpoint_every: int = 200
    fingerprint_key: bytes | None = None
    threads: int | str = "auto"
    nproc: int = 1
    collective: Collective | Any | None = None
    keep_initial: bool = False

    def with_(self, **changes) -> RunOptions:
        """These options with ``changes`` (``dataclasses.replace``)."""
        return replace(self, **changes)
