"""benchmarks/walr_utility.py at its quick size: every cell, both arms on one encoding, settings that round-trip."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
EPSILONS = (1.0, 8.0)


def _script():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    name = "_benchmark_walr_utility"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCH / "walr_utility.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    bench = _script()
    out = tmp_path_factory.mktemp("walr-utility")
    argv = ["--quick", "--epsilons", ",".join(f"{e:g}" for e in EPSILONS), "--out", str(out)]
    return bench, out, argv, bench.main(argv)


def test_every_cell_is_there_against_the_non_private_model_on_the_same_rows(quick):
    from trainers.metrics import relative_auc_loss

    _, _, _, result = quick
    assert [(b["shape"], b["seed"]) for b in result["baselines"]] == [("mixed", 0)]
    (base,) = result["baselines"]
    assert base["encoding"]["nonsensitive"]["encoding"] == "vocab"  # label DP: the features are public
    cells = sorted(result["cells"], key=lambda c: c["epsilon"])
    assert [(c["shape"], c["seed"], c["epsilon"]) for c in cells] == [("mixed", 0, e) for e in EPSILONS]
    for c in cells:
        assert c["k"] == base["k"] and c["dataset_size"] == base["dataset_size"]  # one encoding, one set of rows
        assert 0 <= c["auc"] <= 1 and 0 < c["calibration_ratio"] and c["non_private_auc"] == base["auc"]
        assert c["relative_auc_loss"] == pytest.approx(relative_auc_loss(c["auc"], base["auc"]))
        assert c["auc"] <= base["auc"] + 0.02  # the noise does not help, beyond chance
    assert 0.5 < base["auc"] <= 1
    assert cells[0]["noise_std"] > cells[1]["noise_std"]  # more epsilon, less noise


def test_the_results_record_settings_that_round_trip(quick):
    bench, out, argv, result = quick
    import harness as h

    stored = json.loads((out / "walr_utility_quick.json").read_text())
    assert stored == json.loads(json.dumps(result))
    recorded = stored["settings"]
    assert recorded["script"] == "walr_utility.py" and recorded["argv"] == argv
    assert h.settings_differences(recorded, bench.settings(bench.parse_args(recorded["argv"]))) == []
    values = recorded["values"]
    assert values["rows"] == 20_000 and values["seeds"] == 1 and values["epsilons"] == list(EPSILONS)
    assert values["scenario"]["walr"]["encoding"] == "one-hot" and values["non_private"]["l2"] == 10.0
    assert h.settings_markdown(recorded) in (out / "walr_utility_quick.md").read_text()
