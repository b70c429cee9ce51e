"""The non-private baseline trained to convergence: the ceiling every DP arm is measured against.

A relative AUC loss means something only against a baseline that is as good as the model
class allows; an undertrained one makes DP arms look better than they are, and a DP arm
that beats its own ceiling is the symptom. So the baseline:

- holds out a validation split from the *training* data (never the evaluation file): a fixed
  fraction of the privacy units, chosen by a keyed blake2b hash of the unit id, so no unit
  has rows on both sides (rows of one user are correlated, and a split by row would let the
  model be validated on users it has seen); without a unit id column, a fixed fraction of
  rows chosen by a fixed-seed generator. Both depend on the ids (or row count) alone, never
  on labels, features or the run's seed, so every baseline of the same data validates on
  the same rows;
- trains up to ``max_epochs``, scores the validation split after each epoch (or every
  ``check_every`` batches), keeps the state with the lowest validation log loss and stops
  after ``patience`` checks without improvement;
- keeps that best state, trained on the rows outside the validation split.

Selecting on log loss, not AUC: it is a proper scoring rule, so it rewards the calibrated
probabilities an ads model is used for (bids are priced on them), and it is smooth, while
the AUC of a validation split of a few thousand positives moves by its standard error from
one check to the next for no reason at all.

A DP arm is flagged when its evaluation AUC exceeds the baseline's by more than
:data:`TOLERANCE_Z` Hanley-McNeil standard errors of the baseline's evaluation AUC
(:func:`reference`, :func:`compare`). The two runs score the same evaluation rows, so what
separates two equally good models is training noise; the Hanley-McNeil error stands in for
it because it is of the same size: on ``budgetplan data synth`` data (200k training rows,
100k evaluation rows) the converged baseline's AUC has a standard deviation of 0.0027 over
8 seeds, its Hanley-McNeil error is 0.0034, so an arm exactly as good as the baseline, and
as noisy, is flagged in about 4% of runs. Far above that the ceiling is undertrained, or the
two runs are not comparable.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from budgetplan import limits
from budgetplan.errors import InvalidParameterError
from budgetplan.util import typed, validate
from trainers import losses
from trainers.data.capping import unit_ids
from trainers.fit import fit, predict
from trainers.metrics import auc, auc_standard_error, log_loss, relative_auc_loss

__all__ = ["BaselineSettings", "validation_split", "train_baseline", "convergence_note", "NOT_CONVERGED",
           "MODEL_SETTINGS", "reference", "check_comparable", "compare", "TOLERANCE_Z"]

# How a baseline's note that it may not have converged begins (``convergence_note``): the CLI warns with it.
NOT_CONVERGED = "not converged:"
# The split's hash key: fixed, so that the same unit is on the same side in every baseline.
SPLIT_KEY = b"budgetplan baseline validation"
# How many eval-AUC standard errors a DP arm may exceed the baseline by before it is flagged.
TOLERANCE_Z = 2.0
# The TrainSettings that define the model and its encoding: a baseline and a DP arm compared
# against it must agree on every one of them.
MODEL_SETTINGS = ("model", "embedding_dim", "tower_hidden", "common_hidden", "hash_bins_nonsensitive",
                  "hash_bins_sensitive", "nonsensitive_encoding", "vocab_threshold")


@dataclass(frozen=True, kw_only=True)
class BaselineSettings:
    """How the baseline is trained to convergence (optimisation only; see the module docstring).

    Attributes:
        max_epochs: the most passes over the training rows.
        patience: validation checks without a lower validation log loss before stopping.
        validation_fraction: the share of units (or rows, without unit ids) held out.
        weight_decay: Adam's L2 penalty on every parameter.
        check_every: batches between validation checks; None: once per epoch.

    The defaults, on ``budgetplan data synth`` data (200k rows): 4 to 6 epochs run, the
    2nd to 4th kept, over 8 seeds; weight decay 0, 1e-5, 1e-4, 1e-3 gave eval AUC 0.7514,
    0.7529, 0.7553, 0.7493 (one seed).

    Patience 5 (was 2): a model can sit on a plateau for a few epochs before it learns an
    interaction of two high-cardinality columns. On 1M rows of data from a generator outside
    this project (an 80,000-value column crossed with a 5,000-value one), patience 2 stopped
    one seed at epoch 6 (best epoch 4, eval AUC 0.7851); patience 5 ran 19 epochs and kept
    the 14th (0.8134), where another seed's data had gone on to 0.8121 at patience 2. On the
    project's own frontier shapes (1M rows) patience 5 keeps the same state as 2 did (eval
    AUC within 1e-4), at 3 more epochs of training.
    """

    max_epochs: int = 20
    patience: int = 5
    validation_fraction: float = 0.1
    weight_decay: float = 1e-4
    check_every: int | None = None

    def __post_init__(self):
        validate.at_most("--baseline-epochs", validate.positive_int("--baseline-epochs", self.max_epochs),
                          limits.MAX_EPOCHS)
        validate.at_most("--patience", validate.positive_int("--patience", self.patience), limits.MAX_EPOCHS)
        fraction = validate.open_unit("--validation-fraction", self.validation_fraction)
        if fraction > 0.5:
            raise InvalidParameterError(f"--validation-fraction must be at most 0.5 (the baseline trains on the "
                                        f"rest), got {fraction!r}")
        validate.at_most("--weight-decay", validate.non_negative("--weight-decay", self.weight_decay),
                          limits.MAX_WEIGHT_DECAY)
        typed.optional(validate.positive_int, "check_every", self.check_every)

    def to_dict(self) -> dict:
        return asdict(self)


def validation_split(table, unit_column: str | None, fraction: float, what: str = "--validation-fraction",
                     key: bytes = SPLIT_KEY) -> tuple[np.ndarray, str, int | None]:
    """(a boolean mask of the validation rows, "unit" or "row": what was split, the units held out).

    A unit is in the validation split when the keyed blake2b-64 hash of its id's string
    form, as a fraction of 2^64, is below ``fraction``; each distinct id is hashed once.

    Raises:
        InvalidParameterError: either side of the split is empty.
    """
    if unit_column is None:
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(),
                                                                 "little")))
        held, unit, units = rng.random(table.num_rows) < fraction, "row", None
    else:

        unit_ids(table, unit_column, why="to be held out whole")  # refuses missing ids
        column = table.column(unit_column)
        if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
            column = pc.cast(column, pa.string())
        encoded = pc.dictionary_encode(column).combine_chunks()
        limit = fraction * 2.0**64
        by_unit = np.fromiter(
            (int.from_bytes(hashlib.blake2b(v.encode(), digest_size=8, key=key).digest(), "little") < limit
             for v in encoded.dictionary.to_pylist()), dtype=bool, count=len(encoded.dictionary))
        held, unit, units = by_unit[encoded.indices.to_numpy(zero_copy_only=False)], "unit", int(by_unit.sum())
    kept = int(held.sum())
    if kept == 0 or kept == held.size:
        side = "no" if kept == 0 else "every"
        raise InvalidParameterError(f"{what} {fraction!r} puts {side} {unit} of the training data "
                                    f"({held.size} rows) in the validation split: training needs rows on "
                                    "both sides")
    return held, unit, units


def _scores(model, data, truncated: bool) -> tuple[float | None, float | None]:
    """(log loss, AUC) on ``data``; None where a prediction is not finite or (AUC) a class is missing."""

    p = predict(model, data, truncated=truncated)
    if not np.all(np.isfinite(p)):
        return None, None
    y = data.label.cpu().numpy()
    both = 0 < y.sum() < y.size
    return log_loss(y, p), auc(y, p) if both else None


def train_baseline(model, train, validation, fit_settings, settings: BaselineSettings, *, truncated: bool,
                   generator, progress: str | None = None) -> dict:
    """Train ``model`` on ``train`` with early stopping on ``validation``; leave it in its best state.

    Args:
        train, validation: ``EncodedData`` (disjoint rows of the training file).
        fit_settings: a ``FitSettings`` whose ``epochs`` is the maximum.

    Returns:
        the fit history with the validation curve: ``checked_at`` (epochs done at each check),
        ``train_loss`` (since the previous check), ``validation_log_loss``, ``validation_auc``,
        ``best`` (the index of the kept check, None if none was finite), ``stopped``
        ("patience" or "max_epochs") and ``validation_positives``.
    """
    curve: dict = {"checked_at": [], "train_loss": [], "validation_log_loss": [], "validation_auc": []}
    best = {"loss": float("inf"), "index": None, "state": None}

    def check(epochs_done: float, train_loss: float) -> bool:
        loss, area = _scores(model, validation, truncated)
        curve["checked_at"].append(epochs_done)
        curve["train_loss"].append(train_loss)
        curve["validation_log_loss"].append(loss)
        curve["validation_auc"].append(area)
        index = len(curve["checked_at"]) - 1
        if loss is not None and loss < best["loss"]:
            best.update(loss=loss, index=index, state=copy.deepcopy(model.state_dict()))
        return index - (best["index"] if best["index"] is not None else -1) >= settings.patience

    history = fit(model, train, train.label, losses.bce, fit_settings, truncated=truncated, generator=generator,
                  progress=progress, check=check, check_every=settings.check_every)
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    # With no finite validation loss at any check the model diverged: the last state stays, and
    # the evaluation reports it as diverged.
    return {**history, **curve, "best": best["index"], "validation_positives": int(validation.label.sum().item()),
            "stopped": "patience" if history["stopped_early"] else "max_epochs"}


def convergence_note(history: dict, settings: BaselineSettings) -> str | None:
    """A note for a baseline that ran every epoch it was allowed before its patience ran out (None otherwise).

    Such a baseline stopped while its validation loss had improved within the last
    ``patience`` checks, so it may not have converged: an undertrained ceiling makes every
    relative loss against it look better than it is.
    """
    if history["stopped"] != "max_epochs" or history["best"] is None:
        return None
    checks = len(history["checked_at"])
    return (f"{NOT_CONVERGED} the baseline ran all {settings.max_epochs} epochs (--baseline-epochs) and its lowest "
            f"validation log loss was at check {history['best'] + 1} of {checks}, within --patience "
            f"{settings.patience} of the end; relative losses against it may flatter the private arms: raise "
            "--baseline-epochs")


def reference(record) -> tuple[float, float]:
    """(the baseline's eval AUC, the tolerance a DP arm may exceed it by) from a baseline's run record.

    The tolerance is :data:`TOLERANCE_Z` times the Hanley-McNeil standard error of that AUC
    on the baseline's evaluation rows and positives.

    Raises:
        InvalidParameterError: the record is not a non-private baseline, or has no eval AUC.
    """

    if record.algorithm != "non-private":
        raise InvalidParameterError(f"it is a {record.algorithm} run, not a non-private baseline (train one with "
                                    "--non-private)")
    ev = record.metrics.get("eval") or {}
    if ev.get("auc") is None:
        raise InvalidParameterError("it has no eval AUC (train the baseline with --eval)")
    positives = ev["positives"]
    return ev["auc"], TOLERANCE_Z * auc_standard_error(ev["auc"], positives, ev["n"] - positives)


def check_comparable(record, settings, *, full_model: bool) -> None:
    """Refuse a baseline of another model or encoding than the run's, or a truncated one for a full model.

    Args:
        record: the baseline's run record.
        settings: the DP run's ``TrainSettings``.
        full_model: the DP run's final model uses sensitive features (DP-SGD, Hybrid).
    """
    ours = settings.to_dict()
    for key in MODEL_SETTINGS:
        theirs = typed.to_json(record.training.get(key))  # the record's table is frozen: compare JSON with JSON
        if theirs != typed.to_json(ours[key]):
            raise InvalidParameterError(f"the baseline was trained with {key} = {theirs!r}, this run uses "
                                        f"{ours[key]!r}: a ceiling must be the same model and encoding")
    if full_model and record.model.final == "truncated":
        raise InvalidParameterError("the baseline is the truncated model (non-sensitive features only): it is RR's "
                                    "ceiling, not that of a model trained on every feature")


def compare(metrics: dict, auc: float, tolerance: float | None) -> None:
    """Add the baseline's AUC, the relative AUC loss and the beats-the-ceiling flag to eval ``metrics``."""

    metrics["baseline_auc"] = auc
    own = metrics["auc"]
    metrics["relative_auc_loss"] = None if own is None else relative_auc_loss(own, auc)
    if tolerance is not None:
        metrics["baseline_auc_tolerance"] = tolerance
        metrics["beats_baseline"] = own is not None and own - auc > tolerance
