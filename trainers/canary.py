"""Train a plan once with canaries and audit the trained model in that one run.

The game of Steinke, Nasr and Jagielski (arXiv:2305.08846), tested by the f-DP analysis of
Mahloujifar, Melis and Chaudhuri (arXiv:2410.22235). ``canary_audit`` replaces m rows of
the training data by canaries, runs ``execute_plan`` on it (the real trainer, whatever is
installed), queries the model it wrote on each canary and records the one-run audit
(``budgetplan.audit.canary``: do the guesses refute the plan's trade-off curve, and the
plan with how much of its noise removed do they refute) in the private record, where
``budgetplan audit`` recomputes it and fails a refuted plan.

The canaries match the adjacency the plans here protect. Plans are replace-one: one row's
label (label DP), or its label and sensitive features (semi-sensitive DP), or all of it may
change, and N stays what the plan says. So a canary is not a row present or absent (that
would change N and is not a neighbour under replace-one) but a row whose *label* is the
secret bit S_i, drawn by a fair coin from the CSPRNG; everything else about it is the same in
both worlds, so each coin moves the data to a neighbour under every one of these relations.
Add-remove plans are refused: a label change is two of their steps, not one.

A canary is made memorable, as the paper's input-space canaries are: every categorical
column holds a value of its own that no other row has (a fresh random tag, so that no real
value collides with it) and its numeric columns are 0. It keeps the unit of the row it
replaces, so that every unit keeps its size and capping keeps the plan's N; under a
user-level plan, flipping one canary's label changes one unit's data, still a neighbour (a
canary that capping drops is simply never seen: the bound stays valid, with less power). The model then
meets each canary's values only through that canary, and its logit on the canary is what
the training pushed towards S_i plus the noise. The score is that logit minus the initial
model's (the run keeps its initial weights, ``execute_plan(keep_initial=True)``; they are
drawn independently of the data, so the difference is a post-processing of the release and
of randomness the bits never touched): a canary's own hashed rows start as N(0, 0.01^2)
noise that would otherwise drown what its label moved. In hashed tables each canary value is
drawn until its row is one no real value and no other canary holds (``insert_canaries``'s
``hash_bins``; the choice reads the data's values, never the bits): a canary on a real
value's row would score that value's weight. A non-sensitive vocabulary maps every canary
value to the column's out-of-vocabulary row (seen once, below any threshold), so only the
sensitive columns then carry it. An RR-only plan's model reads non-sensitive columns only.

Power (``benchmarks/one_run_audit.py``, 3 seeds): a canary's two labels move the model 2C
apart, the replace-one sensitivity, only when both labels' gradients are clipped (C small
against the per-example gradient) and its own parameters hold most of it (a factorization
machine: one linear weight per value; the default MLP spreads it over shared layers and
never refutes the halved noise), and the optimiser keeps the score linear in the noisy sum (SGD; Adam's
per-coordinate steps keep little more than its sign). Per-example clipping switched off is
refuted in every run. The DP-SGD noise halved is refuted under SGD in all 6 runs at 20,000
canaries (plans at 2 and 4) and in 5 of 6 at 5,000; under Adam in 2 of 6 at 20,000. Honest
runs refute at most the plan with its noise divided by 0.71. The score separation is near
what a black-box query can have: 1.22 for the mutant against the plan at 4, where the
final model's sum of updates, with the bias taking its share of each clipped gradient,
allows about 1.36. Steinke et al.'s (eps, delta) bound could not catch the halved noise at
any of these counts (2.4-2.6 against 4 at 5,000; 3.6 at a million): it tests one point of
the curve, at delta 1e-8 little more than pure DP, where the plan's curve is Gaussian-like.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from budgetplan.audit.canary import DEFAULT_CONFIDENCE, GUESS_FRACTIONS, bound_from_scores
from budgetplan.audit.fdp import plan_family
from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.plan.phases import DPSGDPhase, RRPhase
from budgetplan.record.parts import VOCABULARY_FILE, json_table
from budgetplan.record.records import PRIVATE_DIR, RunRecord
from budgetplan.units import Adjacency
from budgetplan.util import validate
from budgetplan.util.fileio import atomic_output, file_sha256
from budgetplan.util.typed import to_json
from trainers.data.encode import encode, hash_value
from trainers.data.loaders import read_table
from trainers.fit import model_logits
from trainers.models import build_model
from trainers.outputs import CANARY_DATA, INITIAL_MODEL, check_out
from trainers.randomness import Randomness
from trainers.run import execute_plan
from trainers.settings import RunOptions, TrainSettings

__all__ = ["CANARY_DATA", "audit_scenario", "canary_audit", "insert_canaries", "score_canaries",
           "check_canary_plan"]

SCORE = ("the model's logit on the canary minus the initial model's (a query of the released model; the "
         "initialisation is drawn independently of the data)")


def audit_scenario(*, epsilon: float, delta: float, dataset_size: int, batch_size: int, epochs: int,
                   clipping_norm: float, spec) -> str:
    """The TOML of a plan the one-run audit has power at: DP-SGD alone under semi-sensitive DP.

    Hybrid with alpha = 0 (every step DP-SGD, the non-sensitive features fixed by the
    adjacency), Poisson batches, a large sampling rate and few steps: each canary joins most
    steps, so what its label pushes the model by adds up over few noise draws.
    """
    return f"""name = "one-run-audit"
description = "DP-SGD under semi-sensitive DP, where a one-run canary audit has power."

[budget]
epsilon = {epsilon!r}
delta = {delta!r}

[privacy]
adjacency = "replace-one"
unit = "impression"

[data]
dataset_size = {dataset_size}

[algorithm]
name = "hybrid"
split = "alpha=0"
tower = "fine-tune"

[dpsgd]
batch_size = {batch_size}
epochs = {epochs}
clipping_norm = {clipping_norm!r}
sampling = "poisson"

[calibration]  # off: the audit tests the DP-SGD phase alone
share = 0

{spec.to_toml()}"""


def check_canary_plan(plan) -> None:
    if plan.adjacency is not Adjacency.REPLACE_ONE:
        raise UnsupportedError("canaries here are rows whose label differs between the two worlds, a replace-one "
                               f"change; this plan is {plan.adjacency.value}, where it is two changes")
    if plan.tuning is not None:
        raise UnsupportedError("a plan with a tuning grid trains many configurations; audit one configuration's plan")
    if plan.dpsgd is not None and plan.dpsgd.params.samples_units:
        raise UnsupportedError("canaries here are single rows, each its own unit; a plan that samples units would "
                               "need whole canary units (not built): audit an example-sampled plan")
    if not any(isinstance(p, (RRPhase, DPSGDPhase)) for p in plan.phases):
        raise UnsupportedError(f"canaries audit a trained neural model; this plan has "
                               f"{' + '.join(p.name for p in plan.phases)}")
    spec = plan.scenario.features
    if spec is None:
        raise InvalidParameterError("the plan's scenario has no [features] table")
    if not (spec.nonsensitive_categorical or spec.sensitive_categorical):
        raise UnsupportedError("canaries are told apart by categorical values of their own; the plan's features "
                               "have no categorical column")


def insert_canaries(table, spec, m: int, *, randomness=None, hash_bins: dict[str, int] | None = None):
    """(the table with m rows replaced by canaries, the canaries' row positions, their secret labels).

    Rows keep their order; the replaced positions are drawn uniformly and the labels by
    independent fair coins, both from ``randomness`` (a ``trainers.randomness.Randomness``;
    default a fresh CSPRNG one). Categorical columns become strings (the encoders hash and
    sort a value's string form, so the other rows encode as before).

    ``hash_bins``: the rows of the hashed tables the run will use (``{"sensitive": B_s,
    "nonsensitive": B_ns}``, a table left out is not hashed). Each canary value is then one
    whose row no real value of that table and no other canary holds (a canary hashed onto a
    real value's row would score that value's weight, not its own training), so every
    canary's parameters are its own. The choice of values depends on the data's values, never
    on the secret labels.
    """
    rnd = randomness or Randomness()
    n = table.num_rows
    m = validate.positive_int("canaries", m)
    if m > n:
        raise InvalidParameterError(f"canaries must be at most the data's {n} rows, got {m}")
    positions = np.sort(rnd.generator().choice(n, size=m, replace=False))
    bits = rnd.bernoulli(0.5, m).astype(np.int8)
    tag = f"{int(rnd.generator().integers(2**48)):012x}"  # fresh values no real row holds (a seed reproduces them)
    values_of = _canary_values(table, spec, m, tag, hash_bins or {})
    columns = {}
    for name in spec.columns:
        col = table.column(name)
        if name == spec.label:
            values = col.to_numpy(zero_copy_only=False).copy()
            values[positions] = bits
            columns[name] = pa.array(values, type=col.type)
        elif name in values_of:
            values = col.cast(pa.string()).to_numpy(zero_copy_only=False).copy()
            values[positions] = values_of[name]
            columns[name] = pa.array(values, type=pa.string())
        elif name == spec.unit_id:
            # the replaced row's unit: every unit keeps its row count, so capping keeps the plan's N
            columns[name] = col
        else:  # numeric (and a weight column): 0, the same for every canary in both worlds
            values = col.to_numpy(zero_copy_only=False).astype(np.float64)
            values[positions] = 0.0
            columns[name] = pa.array(values, type=col.type, from_pandas=True)
    return pa.table(columns), positions, bits


def _canary_values(table, spec, m: int, tag: str, hash_bins: dict[str, int]) -> dict[str, np.ndarray]:
    """Each categorical column's m canary values, on rows of their own in the hashed tables."""

    out: dict[str, np.ndarray] = {}
    for group, names in (("nonsensitive", spec.nonsensitive_categorical), ("sensitive", spec.sensitive_categorical)):
        bins = hash_bins.get(group)
        taken: set[int] = set()
        if bins is not None:
            for name in names:
                real = table.column(name).cast("string").unique().to_pylist()
                taken.update(hash_value(name, v, bins) for v in real)
            if len(taken) + 2 * m * len(names) > bins:
                raise InvalidParameterError(
                    f"{m} canaries need rows of their own in the {group} hashed table: use hash bins of at least "
                    f"{len(taken) + 2 * m * len(names):,} (2 x canaries x columns + the data's values), got {bins:,}")
        for name in names:
            values, i = [], 0
            while len(values) < m:
                value = f"{name}:canary-{tag}-{i}"
                i += 1
                if bins is not None:
                    row = hash_value(name, value, bins)
                    if row in taken:
                        continue
                    taken.add(row)
                values.append(value)
            out[name] = np.asarray(values, dtype=object)
    return out


def score_canaries(run_dir, canaries_table, spec, record: RunRecord) -> np.ndarray:
    """The logits of the model in ``run_dir`` on the canary rows, encoded as the run encoded its data,
    minus the initial model's where the run kept it (``execute_plan(keep_initial=True)``)."""
    run_dir = Path(run_dir)
    training = record.training
    model = build_model(record.model.kind, to_json(record.model.config))
    model.load_state_dict(torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True))
    vocabulary = _vocabulary(run_dir, record)
    data, _ = encode(canaries_table, spec, nonsensitive_encoding=training["nonsensitive_encoding"],
                     hash_bins_nonsensitive=training["hash_bins_nonsensitive"],
                     hash_bins_sensitive=training["hash_bins_sensitive"],
                     vocab_threshold=training["vocab_threshold"], vocabulary=vocabulary)
    truncated = record.model.final == "truncated"
    model.eval()
    with torch.no_grad():
        logits = model_logits(model, data, torch.arange(len(data)), truncated).double()
        initial = run_dir / PRIVATE_DIR / INITIAL_MODEL
        if initial.exists():
            # where the training moved each logit from: the initial weights of a canary's own
            # rows are noise its label never touched
            model.load_state_dict(torch.load(initial, map_location="cpu", weights_only=True))
            logits = logits - model_logits(model, data, torch.arange(len(data)), truncated).double()
    return logits.numpy()


def _vocabulary(run_dir: Path, record: RunRecord) -> dict | None:
    """The run's ``vocabulary.json``, refused unless it is the one the record names (``model.vocabulary_sha256``)."""
    path, named = run_dir / VOCABULARY_FILE, record.model.vocabulary_sha256
    if named is not None and (not path.is_file() or file_sha256(path) != named):
        raise PlanMismatchError(f"{path} is not the vocabulary the run record names (sha256 {named[:12]}...): the "
                                "canaries cannot be encoded as the run encoded its data")
    return json.loads(path.read_text()) if path.exists() else None


def canary_audit(plan, data_path, options: RunOptions | None = None, *, canaries: int,
                 confidence: float = DEFAULT_CONFIDENCE, fractions: tuple[float, ...] = GUESS_FRACTIONS,
                 canary_randomness=None) -> RunRecord:
    """Train ``plan`` once on ``data_path`` with ``canaries`` rows replaced by canaries; audit the model.

    The data with its canaries is written to ``out_dir/private/canary_data.parquet`` (the
    data owner's side: it holds the owner's rows) and trained on by ``execute_plan`` with
    ``options`` (its ``RunOptions``: ``out_dir``, which is required, ``settings``, ``seed``, ...);
    then each canary is scored by the model's logit, the k highest guessed label 1 and the k
    lowest label 0, and the lower bound on epsilon (``budgetplan.audit.canary``, at the
    plan's delta, compared with its epsilon) goes into the private record's ``one_run``.
    The public record notes that the run was trained with canaries.

    ``canary_randomness``: a ``Randomness`` for the canaries' places and labels (default a
    fresh CSPRNG one; the coins must be unpredictable to the trainer).

    Returns:
        The run record, with ``private_part.one_run``.
    """
    options = options or RunOptions()
    check_canary_plan(plan)
    out = check_out(options.out_dir)
    if out is None:
        raise InvalidParameterError("canaries need the run directory (--out): the model is audited from it")
    validate.open_unit("confidence", confidence)
    if options.nproc != 1 or options.collective is not None or options.resume:
        raise UnsupportedError("a canary run is one fresh process (no --nproc, torchrun or --resume)")
    spec = plan.scenario.features
    settings = options.settings or TrainSettings()
    table = read_table(data_path, format=settings.data_format, columns=list(spec.columns))
    resolved = settings.for_plan(plan)
    bins = {"sensitive": resolved.hash_bins_sensitive}
    if resolved.nonsensitive_encoding == "hash":
        bins["nonsensitive"] = resolved.hash_bins_nonsensitive
    audited, positions, bits = insert_canaries(table, spec, canaries, randomness=canary_randomness, hash_bins=bins)
    created = out if not out.exists() else None
    try:
        (out / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
        with atomic_output(out / CANARY_DATA) as tmp:
            pq.write_table(audited, tmp)
        record = execute_plan(plan, out / CANARY_DATA, replace(options, out_dir=out, keep_initial=True,
                                                               settings=replace(settings, data_format="parquet")))
    except BaseException:
        # a refusal leaves nothing behind; a run that began (its ledger exists) keeps its evidence
        if not (out / "ledger.jsonl").exists():
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            else:
                (out / CANARY_DATA).unlink(missing_ok=True)
        raise
    assert record is not None and record.private_part is not None
    scores = score_canaries(out, audited.take(positions), spec, record)
    result = bound_from_scores(scores, bits, family=plan_family(plan), confidence=confidence, fractions=fractions)
    result.update(planned_epsilon=plan.guarantee.epsilon, score=SCORE,
                  canary="a row of its own values whose label is the secret bit (replace-one)",
                  rows=int(table.num_rows))
    private = replace(record.private_part, one_run=json_table("one_run", result))
    record = replace(record, private_sha256=private.sha256, private_part=private,
                     notes=record.notes + (f"trained with {canaries} canaries in place of as many rows of the data "
                                           "(a one-run audit, arXiv:2410.22235: the private record holds its test)",))
    record.write(out)
    return record
