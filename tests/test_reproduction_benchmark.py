"""benchmarks/reproduction.py's comparison of two run directories: what must repeat is compared, what need
not is left out, and a planted difference anywhere else is found. (Its whole run is a smoke test:
tests/test_benchmark_smoke.py.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _script():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    name = "_benchmark_reproduction"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / "reproduction.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


RECORD = {"seeds": {"policy": "seeded", "seed": 7}, "model": {"sha256": "aa", "parameters": 10},
          "phases": [{"name": "dpsgd", "noise_std": 1.5, "seconds": 1.0, "peak_memory": {"kind": "x", "bytes": 5}},
                     {"name": "calibration", "seconds": 0.1}],
          "timings": {"total_seconds": 3.0}, "sha256": "r1", "private_sha256": "p1"}
PRIVATE = {"data": {"fingerprint": {"hmac_sha256": "h1", "key_id": "k1", "rows": 100}}, "sha256": "s1"}


def _run(root: Path, *, record=RECORD, private=PRIVATE, key=b"key-1", ledger=b'{"seq":0}\n', weight=None) -> Path:
    (root / "private").mkdir(parents=True)
    (root / "run.json").write_text(json.dumps(record))
    (root / "private" / "record.json").write_text(json.dumps(private))
    (root / "private" / "fingerprint.key").write_bytes(key)
    (root / "ledger.jsonl").write_bytes(ledger)
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7, "b": torch.zeros(3)}
    if weight is not None:
        state["w"] = weight
    torch.save(state, root / "model.pt")
    return root


def _changed(value: dict, path: tuple, new) -> dict:
    out = json.loads(json.dumps(value))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return out


def test_what_need_not_repeat_is_left_out_and_the_rest_is_compared(tmp_path):
    bench = _script()
    a = _run(tmp_path / "a")
    # timings, memory peaks, the fresh fingerprint key and every hash over them: all different
    record = _changed(_changed(_changed(RECORD, ("timings", "total_seconds"), 9.0), ("phases", 0, "seconds"), 2.0),
                      ("phases", 0, "peak_memory", "bytes"), 6)
    record = {**record, "sha256": "r2", "private_sha256": "p2"}
    private = _changed(_changed(PRIVATE, ("data", "fingerprint", "hmac_sha256"), "h2"), ("sha256",), "s2")
    private = _changed(private, ("data", "fingerprint", "key_id"), "k2")
    b = _run(tmp_path / "b", record=record, private=private, key=b"key-2")
    out = bench.compare_runs(a, b)
    assert out["differences"] == [] and not out["model_differs"]
    assert out["compared"] == {"tensors": 2, "files": 4, "fields": 8}  # seeds 2, model 2, phases 3, private rows 1


def test_the_model_digest_must_repeat(tmp_path):
    bench = _script()
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", record={**RECORD, "model": {**RECORD["model"], "sha256": "bb"}})
    assert bench.compare_runs(a, b)["differences"] == ["run.json: model.sha256"]


@pytest.mark.parametrize(("what", "change", "found"), [
    ("a record field", lambda r: _run(r, record=_changed(RECORD, ("phases", 0, "noise_std"), 1.25)),
     "run.json: phases[0].noise_std"),
    ("a field one record lacks", lambda r: _run(r, record={**RECORD, "extra": 1}), "run.json: extra"),
    ("the private record's rows", lambda r: _run(r, private=_changed(PRIVATE, ("data", "fingerprint", "rows"), 99)),
     "private/record.json: data.fingerprint.rows"),
    ("the seed", lambda r: _run(r, record=_changed(RECORD, ("seeds", "seed"), 8)), "run.json: seeds.seed"),
    ("the ledger", lambda r: _run(r, ledger=b'{"seq":1}\n'), "ledger.jsonl: bytes differ"),
    ("one weight by one ulp", lambda r: _run(r, weight=torch.nextafter(
        torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7, torch.tensor(1.0))), "model.pt: w"),
    ("a weight's dtype", lambda r: _run(r, weight=(torch.arange(6).reshape(2, 3) / 7).double()), "model.pt: w"),
])
def test_a_planted_difference_is_found(tmp_path, what, change, found):
    bench = _script()
    a = _run(tmp_path / "a")
    out = bench.compare_runs(a, change(tmp_path / "b"))
    assert out["differences"] == [found], what
    assert out["model_differs"] == found.startswith("model.pt")


def test_a_file_in_one_run_only_is_a_difference(tmp_path):
    bench = _script()
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    (b / "vocabulary.json").write_text("{}")
    assert bench.compare_runs(a, b)["differences"] == ["vocabulary.json: in one run only"]


def test_only_whole_names_are_left_out():
    bench = _script()
    assert bench.unrepeatable("run.json", "timings.total_seconds") and bench.unrepeatable("run.json", "sha256")
    assert bench.unrepeatable("run.json", "phases[3].peak_memory.bytes")
    assert not bench.unrepeatable("run.json", "timings_note")  # a prefix of a name is not the name
    assert not bench.unrepeatable("run.json", "phases[0].noise_std")
    assert not bench.unrepeatable("private/record.json", "timings.total_seconds")  # per file


def test_bad_arguments_are_refused_in_one_line(capsys):
    bench = _script()
    for argv, needle in ((["--device", "gpu"], "--device must be cpu, cuda or cuda:N, got 'gpu'"),
                         (["--rows", "3"], "--rows must be at least 5"), (["--smoke"], "--smoke needs --out DIR")):
        with pytest.raises(SystemExit) as stop:
            bench.parse_args(argv)
        assert stop.value.code == 2 and needle in capsys.readouterr().err


def test_a_missing_gpu_ends_the_run_before_anything_is_written(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    bench = _script()
    work = tmp_path / "work"
    with pytest.raises(SystemExit, match=r"^reproduction: .*cuda"):
        bench.run(bench.parse_args(["--device", "cuda", "--work", str(work), "--out", str(tmp_path / "out")]))
    assert not work.exists() and not (tmp_path / "out").exists()
