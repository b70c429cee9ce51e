"""Execute a plan, or a non-private baseline, and return its run record.

``execute_plan`` refuses, before anything is written and before the first private draw:
a plan that does not verify; a plan without a feature spec; a device that does not exist;
a run directory that already holds a record or cannot be written; data (and the eval
data, which is read and encoded up front) that is missing, unreadable, without the
plan's columns, with labels outside {0, 1} (eval: without both classes), NaN features or
missing unit ids; data whose row count after capping differs from the plan's N (unless
that N is a DP count: refusing would reveal the true count). Every privacy-relevant
number (flip probabilities, cap, N) is read from the plan; ``TrainSettings`` holds only
what cannot change a guarantee.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from budgetplan.errors import InvalidParameterError, PlanMismatchError, UnsupportedError
from budgetplan.plan.phases import CalibrationPhase, CountPhase, DPSGDPhase, RRPhase, WALRPhase
from budgetplan.record.records import PRIVATE_DIR, RunRecord
from trainers.threads import torch_threads

__all__ = ["TrainSettings", "WALRSettings", "execute_plan", "run_baseline", "INITIAL_MODEL"]

INITIAL_MODEL = "initial_model.pt"  # under private/, with keep_initial


# The phase sequences a trainer can execute: RR, DP-SGD, Hybrid (RR then DP-SGD), WALR. A
# count phase is not executed: the DP count of N was released before the plan was made; a
# calibration phase runs after the training phases (``trainers.calibration``).
_EXECUTABLE = {(RRPhase,), (DPSGDPhase,), (RRPhase, DPSGDPhase), (WALRPhase,)}
# The seed stream of the capping choice shared by the ranks of a run over several processes
# (ranks draw from streams 0, 1, ...: this one is far beyond any world size).
_CAPPING_STREAM = 2**32


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
        from budgetplan import limits
        from budgetplan.util import validate

        for name in ("rr_checks_per_epoch", "rr_patience"):
            validate.at_most(name, validate.positive_int(name, getattr(self, name)), limits.MAX_EPOCHS)

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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Prepared:
    data: object
    data_info: dict
    encoding: dict
    unit_counts: np.ndarray | None
    timings: dict = field(default_factory=dict)
    table: object = None
    vocabulary: dict | None = None
    rows: np.ndarray | None = None  # with several processes: this rank's row numbers in the capped data
    holdout: np.ndarray | None = None  # the RR phase's held-out rows (a mask over this rank's rows), if any


_DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]+)?)$")


def resolve_device(name: str):
    import torch

    if not isinstance(name, str) or not _DEVICE.match(name):
        raise InvalidParameterError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InvalidParameterError(f"--device {name!r} requested but no CUDA device is available")
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise InvalidParameterError(f"--device {name!r}: there are {torch.cuda.device_count()} CUDA devices "
                                    f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return device


@contextlib.contextmanager
def _reproducible_kernels(device, seeded: bool):
    """A seeded run on CUDA with torch's deterministic kernels; the caller's mode restored after.

    CUDA's default kernels add in whatever order the threads finish (index_add_, the sums of
    a scatter), so two runs from one seed drift apart in the last bits and then in the model.
    cuBLAS needs its workspace fixed for the same reason (``CUBLAS_WORKSPACE_CONFIG``, set
    here only when the user has not set it). CPU kernels are already deterministic, and a
    CSPRNG run is not meant to repeat: both are left as they are.
    """
    import os

    import torch

    if not seeded or device.type != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def _prepare(path, spec, settings: TrainSettings, device, *, cap: int, capping: str | None, expected_rows,
             randomness, vocabulary: dict | None = None, key: bytes | None = None, collective=None,
             whole_units: bool = False, holdout: float | None = None) -> _Prepared:
    """Read, cap and encode the data; with ``key``, fingerprint the data as read (before capping).

    ``collective``: this rank's place in a run over several processes: the rows are capped
    and counted whole, then only this rank's share is encoded (``trainers.ranks.rank_rows``:
    a contiguous block, or with ``whole_units`` the rows of a block of whole units; a
    vocabulary is still built from every rank's rows, so that all ranks encode alike).

    ``holdout``: the RR phase's validation fraction: the units held out are chosen on the
    capped rows, before they are shared out, by ``trainers.baseline.validation_split`` (a
    keyed hash of the unit id, or of the row number without one: never the labels).
    """
    from trainers.data.capping import cap_units, unit_ids
    from trainers.data.columns import parquet_source
    from trainers.data.encode import build_vocabulary, encode
    from trainers.data.fingerprint import fingerprint
    from trainers.data.loaders import read_table
    from trainers.data.prepared import reconcile, verified_cap

    t0 = time.perf_counter()
    manifest = reconcile(path, cap=cap, expected_rows=expected_rows)  # None unless a prepared directory
    # Parquet is read a column at a time (never the whole table); other formats whole.
    table = parquet_source(path, settings.data_format, list(spec.columns))
    if table is None:
        table = read_table(path, format=settings.data_format, columns=list(spec.columns))
    rows_in = table.num_rows
    info: dict = {"path": str(path), "format": settings.data_format, "rows_in": rows_in, "capping": None}
    if manifest is not None:
        info["prepared"] = {k: manifest[k] for k in ("kind", "rows", "rows_in", "cap", "rule", "key_id", "engine")}
    if key is not None:
        # The file as given, before capping: the auditor can recompute it whatever rows capping kept.
        info["fingerprint"] = fingerprint(table, list(spec.columns), key)
    unit_counts = unit_index = None
    units_in_all = 0
    if cap > 1:
        if spec.unit_id is None or spec.unit_id not in table.column_names:
            raise InvalidParameterError(f"the plan caps each unit at {cap} examples but the data has no unit id "
                                        f"column {spec.unit_id!r}")
        units = unit_ids(table, spec.unit_id)
        if manifest is not None and manifest["cap"] is not None:  # capped ahead of training: verified, not again
            kept, cap_info = np.arange(table.num_rows), verified_cap(units, cap, manifest, path)
        else:
            kept, cap_info = cap_units(np.asarray(units), cap, rule=capping, rng=randomness.generator())
            table = table.take(kept)
        info["capping"] = cap_info
        _, unit_index, counts = np.unique(np.asarray(units)[kept], return_inverse=True, return_counts=True)
        unit_counts, units_in_all = counts[unit_index], int(counts.size)
    info["rows_used"] = table.num_rows
    if expected_rows is not None and table.num_rows != expected_rows:
        dropped = rows_in - table.num_rows
        raise InvalidParameterError(
            f"the data has {table.num_rows} rows" + (f" after capping ({rows_in} before, {dropped} dropped)"
                                                     if cap > 1 else "")
            + f"; the plan accounts N = {expected_rows}: re-plan with this N or supply the planned data")
    held = None
    if holdout is not None:
        from trainers.baseline import validation_split

        held, _, _ = validation_split(table, spec.unit_id, holdout, what="[rr].validation_fraction")
    mine = None
    if collective is not None:
        from trainers.ranks import rank_rows

        if settings.nonsensitive_encoding == "vocab" and vocabulary is None:
            vocabulary = build_vocabulary(table, spec, settings.vocab_threshold)
        mine = rank_rows(collective.world_size, collective.rank, rows=table.num_rows,
                         units=unit_index if whole_units else None)
        table = table.take(mine)
        unit_counts = None if unit_counts is None else unit_counts[mine]
        held = None if held is None else held[mine]
    t1 = time.perf_counter()
    data, encoding = encode(table, spec, nonsensitive_encoding=settings.nonsensitive_encoding,
                            hash_bins_nonsensitive=settings.hash_bins_nonsensitive,
                            hash_bins_sensitive=settings.hash_bins_sensitive, vocab_threshold=settings.vocab_threshold,
                            vocabulary=vocabulary, device=device)
    t2 = time.perf_counter()
    if mine is not None and unit_index is not None:
        encoding["units"] = units_in_all  # every rank's (its own share's count is local)
    vocab = encoding.pop("vocabulary", None)  # kept beside the model, not in the record
    return _Prepared(data, info, encoding, unit_counts, {"load_seconds": t1 - t0, "encode_seconds": t2 - t1}, table,
                     vocab, mine, held)


def _prepare_eval(path, spec, settings, device, vocabulary=None) -> _Prepared | None:
    """The held-out data read and encoded up front: a bad eval file fails before any privacy is spent."""
    if path is None:
        return None
    t0 = time.perf_counter()
    prep = _prepare(path, spec, settings, device, cap=1, capping=None, expected_rows=None, randomness=None,
                    vocabulary=vocabulary)
    positives = int(prep.data.label.sum().item())
    if not 0 < positives < len(prep.data):
        raise InvalidParameterError(f"eval data {path}: {positives} positives of {len(prep.data)} rows; AUC and "
                                    "calibration need both classes")
    prep.timings = {"eval_prepare_seconds": time.perf_counter() - t0}
    return prep


def _eval(model, prep: _Prepared, path, *, truncated: bool) -> tuple[dict, float]:
    from trainers.fit import predict
    from trainers.metrics import evaluate_model

    t0 = time.perf_counter()
    p = predict(model, prep.data, truncated=truncated)
    y = prep.data.label.cpu().numpy()
    metrics = evaluate_model(y, p)
    metrics["rows"] = int(y.size)
    metrics["path"] = str(path)
    return metrics, prep.timings["eval_prepare_seconds"] + time.perf_counter() - t0


def _model(prep, settings: TrainSettings, seed: int):
    import torch

    from trainers.models import build_model

    torch.manual_seed(seed)
    d = prep.data
    shape = dict(ns_vocab=d.ns_vocab, n_ns_cat=d.ns_cat.shape[1], n_ns_num=d.ns_num.shape[1], s_vocab=d.s_vocab,
                 n_s_cat=d.s_cat.shape[1], n_s_num=d.s_num.shape[1], embedding_dim=settings.embedding_dim)
    if settings.model == "mlp":
        shape.update(tower_hidden=settings.tower_hidden, common_hidden=tuple(settings.common_hidden))
    return build_model(settings.model, **shape)


def _check_out(out_dir) -> Path | None:
    from budgetplan.util.fileio import check_writable

    if out_dir is None:
        return None
    if not str(out_dir).strip():
        raise InvalidParameterError("--out is empty: name the run directory to create")
    out = Path(out_dir)
    if (out / "run.json").exists():
        raise InvalidParameterError(f"{out} already holds a run record; choose a new --out")
    if out.exists() and not out.is_dir():
        raise InvalidParameterError(f"--out {out} exists and is not a directory")
    check_writable(out)
    return out


def _key(fingerprint_key: bytes | None) -> tuple[bytes, bytes | None]:
    """(the data owner's fingerprint key, the same key if it was made here and must be saved)."""
    from trainers.data.fingerprint import new_key

    if fingerprint_key is not None:
        return fingerprint_key, None
    key = new_key()
    return key, key


def _finish(record: RunRecord, state: dict, out: Path | None, vocabulary: dict | None = None,
            new_key: bytes | None = None) -> RunRecord:
    """Write the model, the key, the private then the public record (last): a directory with run.json is complete."""
    if out is not None:
        import json

        import torch

        from budgetplan.util.fileio import atomic_output, write_atomic
        from trainers.data.fingerprint import write_key

        out.mkdir(parents=True, exist_ok=True)
        with atomic_output(out / "model.pt") as tmp:
            torch.save(state, tmp)
        if vocabulary is not None:  # non-sensitive values only: needed to encode new data alike
            write_atomic(out / "vocabulary.json", json.dumps(vocabulary, sort_keys=True) + "\n")
        if new_key is not None:
            (out / PRIVATE_DIR).mkdir(exist_ok=True)
            write_key(out / PRIVATE_DIR / "fingerprint.key", new_key)
        record.write(out)
    return record


def _save_initial(model, out: Path) -> None:
    import torch

    from budgetplan.util.fileio import atomic_output

    (out / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
    with atomic_output(out / PRIVATE_DIR / INITIAL_MODEL) as tmp:
        torch.save(model.state_dict(), tmp)


def _trainable(model, plan, phase_index: int) -> list:
    """What DP-SGD updates: everything, or (Hybrid, tower frozen) all but the non-sensitive tower."""
    phase = plan.phases[phase_index]
    frozen = isinstance(phase, DPSGDPhase) and phase.params.nonsensitive_tower == "frozen" and phase_index > 0
    out = []
    for name, p in model.named_parameters():
        keep = not (frozen and model.tower_of(name) == "nonsensitive")
        p.requires_grad_(keep)
        if keep:
            out.append(p)
    return out


def execute_plan(plan, data_path, *, eval_path=None, out_dir=None, settings: TrainSettings | None = None,
                 dpsgd_settings=None, walr_settings=None, seed: int | None = None, baseline_auc: float | None = None,
                 baseline_tolerance: float | None = None, progress: bool = False, resume: bool = False,
                 checkpoint_every: int = 200, fingerprint_key: bytes | None = None,
                 threads: int | str = "auto", nproc: int = 1, collective=None,
                 keep_initial: bool = False) -> RunRecord | None:
    """Train ``plan`` on ``data_path``; returns the run record (also written to ``out_dir``).

    Phases run in the plan's order: RR (labels randomised once, the truncated model trained
    on them), then DP-SGD on the full model warm-started from it (Hybrid), or either alone;
    a WALR plan releases its noisy aggregate once and fits on it. With ``out_dir`` the run
    keeps a write-ahead ledger and checkpoints there; ``resume=True`` continues an
    interrupted run with the ledger's step count and fresh randomness.

    ``fingerprint_key`` is the data owner's key for the data fingerprint in the private
    record; without one a fresh key is made and saved as ``private/fingerprint.key``.

    ``baseline_auc`` (the non-private baseline's eval AUC) adds the relative AUC loss to the
    eval metrics; with ``baseline_tolerance`` (``trainers.baseline.reference``) also the flag
    ``beats_baseline``, set when this run's AUC exceeds the baseline's by more than it.

    ``threads``: torch's CPU threads for the run (``trainers.threads``: ``"auto"`` does not
    oversubscribe a shared machine), restored afterwards; the count goes in the record's
    timings. With ``nproc`` processes they are shared out between them.

    ``keep_initial``: also write the model as initialised, before any phase, to
    ``private/initial_model.pt`` (drawn independently of the data: a one-run audit scores a
    canary by how far training moved its logit from there, ``trainers.canary``).

    ``nproc``: run the phases in that many local processes (``trainers.distributed``, gloo),
    each on its share of the rows (``trainers.ranks.rank_rows``: whole units when units are
    sampled), with the guarantee of one process: Poisson sampling at q on every rank's rows
    (or units), one all-reduce of the clipped sums, the noise drawn once by rank 0; each
    label randomised once by the rank holding it; the calibration's exact vectors summed
    before its one noise draw. Rank 0 keeps the ledger, evaluates and writes the record.
    ``collective``: this process's place in a group already formed (``torchrun``:
    ``trainers.distributed.from_environment``); ranks other than 0 return None.
    """
    from budgetplan.verify import verify_plan
    from trainers.baseline import compare
    from trainers.calibration import calibrate_if_planned
    from trainers.dpsgd import DPSGDSettings, run_dpsgd
    from trainers.randomness import Randomness
    from trainers.record import build_record, dpsgd_entry, rr_entry
    from trainers.rr_phase import run_rr_phase
    from trainers.session import NullSession, Session

    if collective is None and nproc != 1:
        from trainers.ranks import launch_plan

        return launch_plan(plan, data_path, nproc, threads, dict(
            eval_path=eval_path, out_dir=out_dir, settings=settings, dpsgd_settings=dpsgd_settings,
            walr_settings=walr_settings, seed=seed, baseline_auc=baseline_auc, baseline_tolerance=baseline_tolerance,
            progress=progress, resume=resume, checkpoint_every=checkpoint_every, fingerprint_key=fingerprint_key))
    lead = collective is None or collective.rank == 0  # the process that keeps the ledger and writes the record
    with torch_threads(threads) as n_threads, contextlib.ExitStack() as scope:
        settings = (settings or TrainSettings()).for_plan(plan)
        out = _check_out(out_dir)
        report = verify_plan(plan)
        if not report.ok:
            raise PlanMismatchError(f"the plan does not verify: {report.problems[0]}", report.problems)
        spec = plan.scenario.features
        if spec is None:
            raise InvalidParameterError("the plan's scenario has no [features] table: the trainer needs the label, "
                                        "unit id and feature columns")
        kinds = tuple(type(p) for p in plan.phases if not isinstance(p, (CountPhase, CalibrationPhase)))
        if kinds not in _EXECUTABLE:
            raise UnsupportedError(f"no executor for the phases {[p.name for p in plan.phases]}")
        if resume and out is None:
            raise InvalidParameterError("resume needs the run directory (--out) of the interrupted run")
        if settings.nonsensitive_encoding == "vocab" and not plan.nonsensitive_fixed:
            raise UnsupportedError(
                f"--encoding vocab counts values in the training data; under this plan's {plan.adjacency.value} "
                f"{plan.scenario.algorithm} adjacency the non-sensitive columns are protected too, so a vocabulary "
                "built from them would be data-dependent preprocessing no plan accounts for: use --encoding hash")
        if plan.tuning is not None and "grid" in plan.tuning:  # every configuration, then the selection
            from trainers.tune import execute_grid

            return execute_grid(plan, data_path, eval_path=eval_path, out=out, settings=settings,
                                dpsgd_settings=dpsgd_settings, seed=seed, progress=progress,
                                fingerprint_key=fingerprint_key, baseline_auc=baseline_auc, resume=resume)
        if collective is not None:
            from trainers.ranks import check_distributable, note_shard

            check_distributable(plan)
        rnd = Randomness(seed, stream=0 if collective is None else collective.rank)
        device = resolve_device(settings.device)
        scope.enter_context(_reproducible_kernels(device, seeded=seed is not None))
        dpsgd_settings = dpsgd_settings or DPSGDSettings.for_device(device)
        t0 = time.perf_counter()
        key, new_key = _key(fingerprint_key)
        size_private = plan.count is not None
        # Capping must keep the same rows on every rank: one secret seed, drawn by rank 0.
        # (a stream of its own: rank 0's privacy draws stay those of one process from the same seed)
        capping_rnd = rnd if collective is None else Randomness(collective.broadcast_object(
            Randomness(seed, stream=_CAPPING_STREAM).torch_seed()))
        prep = _prepare(data_path, spec, settings, device, cap=plan.unit.cap, capping=plan.unit.capping,
                        expected_rows=None if size_private else plan.dataset_size, randomness=capping_rnd,
                        key=key if lead else None, collective=collective,
                        whole_units=plan.dpsgd is not None and plan.dpsgd.params.samples_units,
                        holdout=plan.rr.params.validation_fraction if plan.rr is not None else None)
        prep.timings["torch_threads"] = n_threads  # where it ran, beside the device
        if collective is not None:
            note_shard(prep, collective)
            prep.timings["processes"] = collective.world_size
        if kinds == (WALRPhase,) and plan.walr.params.encoding is None:
            _check_walr_columns(spec)
        eval_prep = _prepare_eval(eval_path, spec, settings, device, prep.vocabulary) if lead else None
        if plan.dpsgd is not None and plan.dpsgd.params.samples_units:
            # another M is refused here, before a Hybrid's RR phase spends anything
            from trainers.dpsgd import check_unit_count, count_units

            check_unit_count(plan.dpsgd.params, count_units(plan.dpsgd.params, prep.data, collective)[0])
        # Every refusal is behind us: only now does the run directory come into being.
        session = Session(out, plan, resume=resume, checkpoint_every=checkpoint_every,
                          rows=prep.data_info["rows_used"]) if out and lead else NullSession()
        try:
            if kinds == (WALRPhase,):
                record, state = _execute_walr(plan, prep, spec, settings, walr_settings, rnd, device, eval_prep, t0,
                                              session, collective)
                if not lead:
                    return None  # rank 0 evaluates and writes the record
                return _finish(record, state, out, new_key=new_key if out else None)
            model = _model(prep, settings, rnd.torch_seed()).to(device)
            if keep_initial and out is not None and lead:
                _save_initial(model, out)
            ckpt = session.load_checkpoint()
            if collective is not None:
                ckpt = collective.broadcast_object(ckpt)  # rank 0's run directory holds it
            if ckpt is not None:
                model.load_state_dict(ckpt["model"])
            entries: list = []
            timings = dict(prep.timings)
            for i, phase in enumerate(plan.phases):
                if isinstance(phase, (CountPhase, CalibrationPhase)):
                    continue
                if isinstance(phase, RRPhase):
                    if ckpt is not None and ckpt.get("phase") in ("rr-done", "dpsgd"):
                        rr = ckpt["rr_result"]  # trained in an earlier session
                    else:
                        rr = run_rr_phase(model, prep.data, phase, unit_counts=prep.unit_counts, loss=settings.loss,
                                          lr=settings.lr, optimizer=settings.optimizer, batch_size=settings.batch_size,
                                          randomness=rnd, session=session,
                                          progress="RR phase" if progress and lead else None, collective=collective,
                                          rows=prep.rows, holdout=prep.holdout, patience=settings.rr_patience,
                                          checks_per_epoch=settings.rr_checks_per_epoch,
                                          weight_decay=settings.rr_weight_decay)
                        if len(plan.phases) > 1:
                            session.save_checkpoint({"phase": "rr-done", "model": model.state_dict(), "rr_result": rr})
                    timings["rr_phase_seconds"] = rr.seconds
                    entries.append(rr_entry(rr))
                elif isinstance(phase, DPSGDPhase):
                    taken = session.dpsgd_steps_taken()
                    if collective is not None:
                        taken = collective.broadcast_object(taken)  # rank 0's ledger counts
                    resumed_from = ckpt.get("step", 0) if ckpt is not None and ckpt.get("phase") == "dpsgd" else 0
                    rr_result = ckpt.get("rr_result") if ckpt is not None else None
                    if rr_result is None and plan.rr is not None:
                        rr_result = rr
                    if plan.rr is not None and not resumed_from and settings.hybrid_start == "rr-model":
                        model.match_truncated()  # a fresh DP-SGD phase (a resumed one has its checkpoint)

                    def save(step_done, opt_state, rr_result=rr_result):
                        session.save_checkpoint({"phase": "dpsgd", "step": step_done, "model": model.state_dict(),
                                                 "optimizer": opt_state, "rr_result": rr_result})

                    sgd = run_dpsgd(model, prep.data, phase.params, trainable=_trainable(model, plan, i),
                                    randomness=rnd, settings=dpsgd_settings,
                                    progress="DP-SGD phase" if progress and lead else None, ledger=session,
                                    start_step=taken, checkpoint=save if out and lead else None,
                                    checkpoint_every=session.checkpoint_every if lead else 0,
                                    optimizer_state=ckpt.get("optimizer") if resumed_from else None,
                                    size_private=size_private, collective=collective)
                    timings["dpsgd_phase_seconds"] = sgd.seconds
                    entries.append(dpsgd_entry(sgd, session.ledger_view(),
                                               nonsensitive_tower=phase.params.nonsensitive_tower,
                                               sizes_ledger=session.sizes_view() if size_private else None,
                                               withhold=size_private))
            entries += calibrate_if_planned(plan, model, prep.data, randomness=rnd, session=session,
                                            rr_result=rr if plan.rr is not None else None, collective=collective)
            if not lead:
                return None  # rank 0 evaluates and writes the record
            truncated = kinds == (RRPhase,)
            metrics = {}
            if eval_prep is not None:
                metrics["eval"], timings["eval_seconds"] = _eval(model, eval_prep, eval_path, truncated=truncated)
                if baseline_auc is not None:
                    compare(metrics["eval"], baseline_auc, baseline_tolerance)
            timings["total_seconds"] = time.perf_counter() - t0
            record = build_record(
                plan=plan, entries=entries, data=prep.data_info, metrics=metrics, encoding=prep.encoding,
                seeds=rnd.record(),
                model={"kind": settings.model, "config": model.config(), "final": "truncated" if truncated else "full"},
                training={**settings.to_dict(),
                          "dpsgd": dpsgd_settings.to_dict() if plan.dpsgd is not None else None},
                ledger=session.ledger_view(), timings=timings, device=_device_name(device),
                sizes_ledger=session.sizes_view() if size_private else None)
            return _finish(record, model.state_dict(), out, prep.vocabulary, new_key=new_key if out else None)
        finally:
            session.close()


def _check_walr_columns(spec) -> None:
    if spec.nonsensitive_categorical or spec.sensitive_categorical:
        raise InvalidParameterError("WALR is a logistic regression on numeric features: drop the categorical "
                                    "columns from [features]")


def _execute_walr(plan, prep, spec, settings, walr_settings, rnd, device, eval_prep, t0, session, collective=None):
    import torch

    from trainers.distributed import release_once
    from trainers.walr import predict, prepare_rows, run_walr

    ws = walr_settings or WALRSettings()
    par = plan.phases[0].params
    d = prep.data
    weights = None
    if spec.weight is not None:
        weights = torch.as_tensor(prep.table.column(spec.weight).to_numpy(zero_copy_only=False),
                                  dtype=torch.float64, device=device)
    if par.encoding == "one-hot":
        return _execute_walr_onehot(plan, prep, weights, rnd, device, eval_prep, t0, session, collective)

    def persist(draw):
        def as_array():
            drawn = draw()  # None on a rank other than 0: rank 0 noises the summed release
            return None if drawn is None else (drawn[0].cpu().numpy(), drawn[1])
        return release_once(collective, session, "walr", as_array)

    theta, res = run_walr(torch.cat([d.ns_num, d.s_num], 1).double(), d.label.double(), weights, par, rnd,
                          steps=ws.steps, minibatch=ws.minibatch, lr=ws.lr, persist=persist, collective=collective)
    if collective is not None and collective.rank != 0:
        return None, None

    def eval_scores(ev):
        xe, _, _ = prepare_rows(torch.cat([ev.data.ns_num, ev.data.s_num], 1).double(),
                                row_norm_bound=par.row_norm_bound, expected_features=par.features)
        return predict(theta, xe)

    record = _walr_record(plan, prep, res, rnd, eval_prep, eval_scores, t0, session, device,
                          model_config={"features": par.features}, training=ws.to_dict())
    return record, {"theta": theta.cpu()}


def _walr_record(plan, prep, res, rnd, eval_prep, eval_scores, t0, session, device, *, model_config: dict,
                 training: dict):
    """A WALR run's record: the release entry, the fit's and evaluation's timings, the held-out
    metrics from ``eval_scores(eval_prep)`` (the model's predictions on the evaluation rows)."""
    from trainers.metrics import evaluate_model
    from trainers.record import build_record, walr_entry

    timings = dict(prep.timings, walr_fit_seconds=res.fit_seconds)
    metrics = {}
    if eval_prep is not None:
        t2 = time.perf_counter()
        metrics["eval"] = evaluate_model(eval_prep.data.label.cpu().numpy(), eval_scores(eval_prep).cpu().numpy())
        metrics["eval"]["rows"] = len(eval_prep.data)
        timings["eval_seconds"] = eval_prep.timings["eval_prepare_seconds"] + time.perf_counter() - t2
    timings["total_seconds"] = time.perf_counter() - t0
    return build_record(
        plan=plan, entries=[walr_entry(res, release_sha256=res.release_sha256)], data=prep.data_info,
        metrics=metrics, encoding=prep.encoding, seeds=rnd.record(),
        model={"kind": "logistic-regression", "config": model_config, "final": "walr"},
        training={"walr": training}, ledger=session.ledger_view(), timings=timings, device=_device_name(device))


def _execute_walr_onehot(plan, prep, weights, rnd, device, eval_prep, t0, session, collective=None):
    """WALR on every feature column (``trainers.walr_onehot``): one-hot categoricals, scaled numerics."""
    import torch

    from trainers.distributed import release_once
    from trainers.walr_onehot import encode_rows, predict, run_walr_onehot

    par = plan.walr.params

    def persist(draw):
        return release_once(collective, session, "walr", draw)

    model, res = run_walr_onehot(prep.data, prep.data.label.double(), weights, par, rnd, persist=persist,
                                 collective=collective)
    if collective is not None and collective.rank != 0:
        return None, None

    def eval_scores(ev):
        rows, _ = encode_rows(ev.data, model.lo, model.hi, row_norm_bound=par.row_norm_bound)
        return predict(model.theta, rows)

    record = _walr_record(plan, prep, res, rnd, eval_prep, eval_scores, t0, session, device,
                          model_config={"features": model.k, "encoding": "one-hot",
                                        "numeric_range": [model.lo, model.hi], "l2": model.l2},
                          training={"encoding": "one-hot", "fit": "L-BFGS", "l2": model.l2})
    return record, {"theta": model.theta.cpu(), "numeric_lo": torch.tensor(model.lo, dtype=torch.float64),
                    "numeric_hi": torch.tensor(model.hi, dtype=torch.float64)}


def run_baseline(plan, data_path, *, eval_path=None, out_dir=None, settings: TrainSettings | None = None,
                 baseline=None, seed: int | None = None, truncated: bool = False, progress: bool = False,
                 fingerprint_key: bytes | None = None, threads: int | str = "auto") -> RunRecord:
    """The non-private baseline on the plan's feature spec: clean labels, trained to convergence.

    The same model and encoding as the DP arms (``settings``), trained with early stopping
    on a validation split of the training data (``baseline``, a ``BaselineSettings``; see
    ``trainers.baseline``). With ``truncated=True`` it trains the truncated model
    (non-sensitive features only): the ceiling an RR-only model can reach, since RR may not
    use sensitive features. ``threads`` as for ``execute_plan``.
    """
    import torch

    from trainers.baseline import BaselineSettings, train_baseline, validation_split
    from trainers.fit import FitSettings
    from trainers.randomness import Randomness
    from trainers.record import baseline_entry, build_record

    with torch_threads(threads) as n_threads, contextlib.ExitStack() as scope:
        settings = (settings or TrainSettings()).for_plan(plan)
        baseline = baseline or BaselineSettings()
        out = _check_out(out_dir)
        spec = plan.scenario.features
        if spec is None:
            raise InvalidParameterError("the plan's scenario has no [features] table")
        rnd = Randomness(seed)
        device = resolve_device(settings.device)
        scope.enter_context(_reproducible_kernels(device, seeded=seed is not None))
        t0 = time.perf_counter()
        key, new_key = _key(fingerprint_key)
        prep = _prepare(data_path, spec, settings, device, cap=1, capping=None, expected_rows=None, randomness=rnd,
                        key=key)
        prep.timings["torch_threads"] = n_threads
        held, split, units = validation_split(prep.table, spec.unit_id, baseline.validation_fraction)
        eval_prep = _prepare_eval(eval_path, spec, settings, device, prep.vocabulary)
        mask = torch.from_numpy(held).to(device)
        train, validation = prep.data.take(~mask), prep.data.take(mask)
        model = _model(prep, settings, rnd.torch_seed()).to(device)
        gen = torch.Generator().manual_seed(rnd.torch_seed())
        fit_settings = FitSettings(epochs=baseline.max_epochs, batch_size=settings.batch_size, lr=settings.lr,
                                   optimizer=settings.optimizer, weight_decay=baseline.weight_decay)
        history = train_baseline(model, train, validation, fit_settings, baseline, truncated=truncated, generator=gen,
                                 progress="baseline" if progress else None)
        metrics, timings = {}, dict(prep.timings)
        if eval_prep is not None:
            metrics["eval"], timings["eval_seconds"] = _eval(model, eval_prep, eval_path, truncated=truncated)
        timings["train_seconds"] = history["seconds"]
        timings["total_seconds"] = time.perf_counter() - t0
        final = "truncated" if truncated else "full"
        record = build_record(
            plan=None, algorithm="non-private",
            entries=[baseline_entry(history, baseline, batch_size=fit_settings.batch_size, model=final, split=split,
                                    train_rows=len(train), validation_rows=len(validation), validation_units=units)],
            data=prep.data_info, metrics=metrics, encoding=prep.encoding, seeds=rnd.record(),
            model={"kind": settings.model, "config": model.config(), "final": final},
            training={**settings.to_dict(), "fit": fit_settings.to_dict(), "baseline": baseline.to_dict()}, ledger=None,
            timings=timings, device=_device_name(device),
            notes=("non-private: no privacy guarantee applies to this run",))
        return _finish(record, model.state_dict(), out, prep.vocabulary, new_key=new_key if out else None)
