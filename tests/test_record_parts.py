"""The typed parts of run records: each reads its JSON object strictly and writes it back unchanged."""

import json
import pickle
from pathlib import Path

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.record.parts import CodeHashes, DataSummary, Fingerprint, LedgerHead, ModelInfo, Seeds
from budgetplan.record.records import PRIVATE_DIR, Selection, TunedRun, TuningRecord, load_record
from budgetplan.util.frozen import FrozenMap, freeze
from budgetplan.util.typed import from_json_object, to_json_object

H1, H2 = "a" * 64, "0123456789abcdef" * 4
DPSGD_ENTRY = {
    "name": "dpsgd", "steps_planned": 2, "steps_executed": 2, "steps_this_session": 2, "sessions": 1,
    "steps_lost_to_interruptions": 0, "batch_sizes_observed": 2, "batch_size_expected": 10.0, "batch_size_sum": 21,
    "batch_size_sumsq": 221, "batch_size_min": 10, "batch_size_max": 11, "batches_truncated": 0, "truncated": False,
    "noise_std": 1.5, "noise_multiplier": 1.5, "clipping_norm": 1.0, "sampling_rate": 0.01, "noise_draws": 20,
    "trainable_parameters": 10, "model": "full", "nonsensitive_tower": None, "chunks": 2, "padded_size": 16,
    "settings": {"lr": 0.1, "optimizer": "adam"}, "seconds": 0.5, "peak_memory": {"bytes": 1, "kind": "rss"}}
FINGERPRINT = {"hmac_sha256": H1, "key_id": "k1", "columns": ["label", "user_id"], "rows": 100}

# (type, a JSON object as records hold it)
CASES = [
    (Seeds, {"policy": "csprng", "seed": None, "note": "privacy noise drawn from os.urandom"}),
    (Seeds, {"policy": "seeded", "seed": 7, "note": "debugging only"}),
    (ModelInfo, {"kind": "mlp", "config": {"common_hidden": [16, 8], "towers": {"a": 1}}, "final": "full"}),
    (LedgerHead, {"head": H1, "lines": 12}),
    (CodeHashes, {"budgetplan": H1, "trainers": H2}),
    (Fingerprint, FINGERPRINT),
    (DataSummary, {"path": "d.parquet", "format": "auto", "rows_in": 120, "rows_used": 100,
                   "capping": {"rows_dropped": 20}, "fingerprint": FINGERPRINT}),
    (DataSummary, {"path": None, "format": "tensors", "rows_in": 100, "rows_used": 100, "capping": None,
                   "fingerprint": FINGERPRINT, "prepared": {"kind": "capped", "cap": 2}, "rank_rows": [50, 50],
                   "timings": {"load_seconds": 0.25, "torch_threads": 2}, "sizes_ledger": {"head": H2, "lines": 3}}),
    (Selection, {"phase": "selection", "mechanism": "report-noisy-max", "noise": "gumbel", "epsilon": 0.2,
                 "gumbel_scale": 69.1, "candidates": 2, "selected": 1}),
    (TunedRun, {"index": 0, "phases": [DPSGD_ENTRY], "dpsgd_learning_rate": None}),
    (TuningRecord, {"configurations": 2, "training_rows": 90,
                    "runs": [{"index": i, "phases": [DPSGD_ENTRY], "dpsgd_learning_rate": 0.1} for i in (0, 1)],
                    "selection": {"phase": "selection", "mechanism": "report-noisy-max", "noise": "gumbel",
                                  "epsilon": 0.2, "gumbel_scale": 69.1, "candidates": 2, "selected": 0}}),
]
IDS = [f"{cls.__name__}-{i}" for i, (cls, _) in enumerate(CASES)]


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(("cls", "data"), CASES, ids=IDS)
def test_json_to_type_to_json_is_identical(cls, data):
    value = from_json_object(cls, data, "x")
    assert canonical(to_json_object(value)) == canonical(data)
    assert from_json_object(cls, to_json_object(value), "x") == value
    with pytest.raises(AttributeError):  # frozen
        value.__setattr__(next(iter(data)), None)


@pytest.mark.parametrize(("cls", "data"), CASES, ids=IDS)
def test_an_unknown_field_is_refused_by_name(cls, data):
    with pytest.raises(InvalidParameterError, match="x has an unknown field 'surplus'"):
        from_json_object(cls, {**data, "surplus": 1}, "x")


@pytest.mark.parametrize(("cls", "data"), CASES, ids=IDS)
def test_each_missing_required_field_is_refused_by_name(cls, data):
    import dataclasses

    required = [f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert required
    for name in required:
        with pytest.raises(InvalidParameterError, match=f"x is missing the field '{name}'"):
            from_json_object(cls, {k: v for k, v in data.items() if k != name}, "x")


@pytest.mark.parametrize(("where", "cls", "data", "message"), [
    ("ledger", LedgerHead, {"head": "xyz", "lines": 1}, "ledger.head must be a sha256 hex digest"),
    ("seeds", Seeds, {"policy": "seeded", "seed": None, "note": ""}, "seeds.seed is None under the 'seeded'"),
    ("seeds", Seeds, {"policy": "urandom", "seed": None, "note": ""}, "seeds.policy must be one of"),
    ("data", DataSummary, {"path": None, "format": "auto", "rows_in": 1, "rows_used": 1, "capping": None,
                           "fingerprint": {**FINGERPRINT, "rows": -1}}, "data.fingerprint.rows must be"),
    ("data", DataSummary, {"path": None, "format": "auto", "rows_in": 1, "rows_used": 1, "capping": None,
                           "fingerprint": {**FINGERPRINT, "extra": 1}}, r"data\.fingerprint has an unknown field "
                                                                        "'extra'"),
    ("data", DataSummary, {"path": None, "format": "auto", "rows_in": 1, "rows_used": 1, "capping": None,
                           "fingerprint": FINGERPRINT, "timings": {"load_seconds": "slow"}},
     "data.timings.load_seconds must be a number"),
    ("tuning", TunedRun, {"index": 0, "phases": [{**DPSGD_ENTRY, "name": "sgd"}], "dpsgd_learning_rate": None},
     r"tuning\.phases\[0\]\.name must be one of"),
])
def test_a_malformed_value_is_refused_naming_it(where, cls, data, message):
    with pytest.raises(InvalidParameterError, match=message):
        from_json_object(cls, data, where)


def test_frozen_map_is_read_only_hashable_and_pickles():
    m = freeze({"b": [1, {"c": 2}], "a": 1.5})
    assert m == {"b": (1, FrozenMap({"c": 2})), "a": 1.5} and isinstance(m["b"][1], FrozenMap)
    with pytest.raises(TypeError):
        m["a"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        m._items = {}  # type: ignore[misc]
    assert hash(m) == hash(freeze({"a": 1.5, "b": [1, {"c": 2}]}))
    assert pickle.loads(pickle.dumps(m)) == m


GOLDEN = Path(__file__).parent / "golden" / "records"


@pytest.mark.parametrize("name", ["baseline", "canary", "count", "tuned"])
def test_records_written_before_the_typed_parts_keep_their_bytes(name):
    """Records written when these parts were dicts (a baseline, a canary run with its one-run audit, a DP-count N
    with private timings and batch-size ledger, a tuned grid): read and written again, byte for byte."""
    rec = load_record(GOLDEN / name, private=True)
    assert rec.private_part is not None
    assert rec.to_json() == (GOLDEN / name / "run.json").read_text()
    assert rec.private_part.to_json() == (GOLDEN / name / PRIVATE_DIR / "record.json").read_text()
    assert isinstance(rec.seeds, Seeds) and isinstance(rec.code, CodeHashes)
    assert isinstance(rec.private_part.data.fingerprint, Fingerprint)
