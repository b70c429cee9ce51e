"""benchmarks/utility_frontier.py at a tiny size: its results' structure, the baseline as the
ceiling of every private arm, resuming, and the readability rule of its tables."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
ARMS = ["RR", "DP-SGD", "alpha=0.5", "paper-v1"]
# legacy: columns of at most 5,000 values, so that 3,200 training rows can teach a model
# something; epsilon 0.01: every private arm is close to a coin, the baseline is not.
# DP-SGD for 5 epochs (10 noisy steps), not the template's 10: on 800 held-out rows (about 40
# conversions) seed 0's baseline reaches only AUC 0.53, and at 20 steps that seed's noise-only
# DP-SGD model happened to score 0.61, past the baseline's tolerance, which the frontier rightly
# refuses. The test is of the frontier's bookkeeping, not of the template's epochs.
ARGV = ["--rows", "4000", "--shapes", "legacy", "--epsilons", "0.01", "--arms", ",".join(ARMS), "--seeds", "2",
        "--device", "cpu", "--name", "tiny", "--dpsgd-batch", "2048", "--dpsgd-epochs", "5"]
# Smaller hashed tables for 4,000 rows (a vocabulary of values seen 16 times keeps little),
# through the frontier's one place for overrides.
TRAINING = {"hash_bins_nonsensitive": 4096, "hash_bins_sensitive": 4096, "nonsensitive_encoding": "hash"}
# 20 epochs, the best on a validation split large enough to tell (30% of 4,000 rows).
BASELINE = {"validation_fraction": 0.3, "patience": 20, "weight_decay": 0.0}


def _frontier():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    if "_benchmark_utility_frontier" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_benchmark_utility_frontier", BENCH / "utility_frontier.py")
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules["_benchmark_utility_frontier"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny frontier run."""
    uf = _frontier()
    out = tmp_path_factory.mktemp("frontier")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(uf, "TRAINING", TRAINING)
        mp.setattr(uf, "BASELINE", BASELINE)
        state = uf.main([*ARGV, "--out", str(out)])
    return uf, out, state


def test_every_cell_and_baseline_is_there(tiny):
    uf, out, state = tiny
    assert state["complete"]
    assert sorted(state["baselines"]) == ["legacy|0", "legacy|1"]
    assert sorted(state["cells"]) == sorted(f"legacy|{s}|0.01|{a}" for s in (0, 1) for a in ARMS)
    for c in state["cells"].values():
        assert c["split"] == uf.ARMS[c["arm"]][0] and c["dataset_size"] == state["baselines"][f"legacy|{c['seed']}"][
            "dataset_size"]
        assert 0 < c["calibration_ratio"] and 0 <= c["auc"] <= 1
    alphas = {c["arm"]: c["alpha"] for c in state["cells"].values()}
    assert alphas["RR"] == 1 and alphas["DP-SGD"] == 0 and alphas["alpha=0.5"] == pytest.approx(0.5)
    assert alphas["paper-v1"] == pytest.approx(0.6)  # eps1 = min(0.6 eps, 3)
    assert json.loads((out / "tiny.json").read_text()) == json.loads(json.dumps(state))
    assert (out / "tiny_legacy.png").stat().st_size > 0


def test_the_baseline_is_the_ceiling(tiny):
    _, _, state = tiny
    for key, b in state["baselines"].items():
        assert b["nonsensitive"]["auc"] < b["all"]["auc"], key  # the truncated model is below all features
        assert b["nonsensitive"]["relative_auc_loss"] > 0
        for c in state["cells"].values():
            if f"{c['shape']}|{c['seed']}" == key:
                # 800 held-out rows, ~40 conversions: an AUC's standard error is ~0.05, so "below the
                # baseline" is the trainer's test against that error, not the raw order
                assert c["beats_baseline"] is False, c["arm"]


def test_the_table_reports_loss_and_calibration_with_spread(tiny):
    uf, out, state = tiny
    summary = uf.summarise(state)["legacy"]
    cell = summary["cells"][0.01]["RR"]
    losses = [c["relative_auc_loss"] for c in state["cells"].values() if c["arm"] == "RR"]
    assert cell["n"] == 2 and cell["loss_mean"] == pytest.approx(sum(losses) / 2)
    assert cell["loss_std"] == pytest.approx(abs(losses[0] - losses[1]) / 2 ** 0.5)
    assert cell["cal_std"] is not None and set(cell["readable"]) == {"main/loss", "main/cal", "grid/loss", "grid/cal"}
    text = (out / "tiny.md").read_text()
    for heading in ("Arms: relative AUC loss (%)", "Arms: calibration ratio", "Alpha grid (eps1 = alpha eps): "
                    "relative AUC loss (%)", "non-sensitive features only (the RR ceiling)"):
        assert heading in text
    assert f"{cell['loss_mean']:.2f} +- {cell['loss_std']:.2f}" in text
    assert uf.h.settings_markdown(state["settings"]) in text


def test_a_killed_run_resumes_where_it_stopped(tiny, monkeypatch):
    uf, out, state = tiny
    monkeypatch.setattr(uf, "TRAINING", TRAINING)
    monkeypatch.setattr(uf, "BASELINE", BASELINE)
    dropped = "legacy|1|0.01|paper-v1"
    partial = json.loads(json.dumps(state))
    del partial["cells"][dropped]
    partial["complete"] = False
    (out / "tiny.json").write_text(json.dumps(partial))
    resumed = uf.main([*ARGV, "--out", str(out), "--arms", ",".join(ARMS)])
    assert sorted(resumed["cells"]) == sorted(state["cells"]) and resumed["complete"]
    for key, cell in state["cells"].items():
        if key != dropped:
            assert resumed["cells"][key] == cell  # kept, not trained again
    assert resumed["baselines"] == state["baselines"]


def test_parallel_jobs_give_the_same_results(tiny, tmp_path, monkeypatch):
    import torch

    if torch.cuda.is_initialized():
        # autograd's CUDA threads do not survive fork; the benchmark's own parent process
        # never trains, so its forked workers are safe where this test process is not
        pytest.skip("this process has used CUDA: forked workers could not run autograd")
    uf, _, state = tiny
    monkeypatch.setattr(uf, "TRAINING", TRAINING)
    monkeypatch.setattr(uf, "BASELINE", BASELINE)
    parallel = uf.run(uf.parse_args([*ARGV, "--out", str(tmp_path), "--jobs", "2"]))
    assert parallel["complete"] and sorted(parallel["cells"]) == sorted(state["cells"])
    assert parallel["settings"]["values"] == state["settings"]["values"]  # --jobs is no setting of the results
    for key, cell in state["cells"].items():  # seeded runs: the same models, up to one thread's summation order
        assert parallel["cells"][key]["auc"] == pytest.approx(cell["auc"], abs=2e-3), key
        assert parallel["cells"][key]["plan_sha256"] == cell["plan_sha256"]
    assert json.loads((tmp_path / "tiny.json").read_text())["cells"] == parallel["cells"]


def test_a_run_with_other_settings_is_refused(tiny, monkeypatch):
    uf, out, _ = tiny
    monkeypatch.setattr(uf, "TRAINING", TRAINING)
    monkeypatch.setattr(uf, "BASELINE", BASELINE)
    # the RR cap alone would carry cells (below); beside another setting it is refused
    before = (out / "tiny.json").read_text()
    with pytest.raises(SystemExit, match=r"\(these differ: scenario.dpsgd.clipping_norm, scenario.rr.epochs\)"):
        uf.main([*ARGV, "--out", str(out), "--rr-epochs", "4", "--clipping-norm", "3"])
    assert (out / "tiny.json").read_text() == before


def test_a_new_shape_extends_a_run_and_a_dropped_one_is_refused(tiny, monkeypatch):
    uf, out, state = tiny
    monkeypatch.setattr(uf, "TRAINING", TRAINING)
    monkeypatch.setattr(uf, "BASELINE", BASELINE)
    path = out / "tiny.json"
    before = json.loads(path.read_text())
    wider = uf.settings(uf.parse_args([*ARGV, "--shapes", "legacy,nonsensitive"]))
    extended = uf._load_state(path, wider, fresh=False)
    assert extended["cells"] == before["cells"] and extended["baselines"] == before["baselines"]
    assert set(extended["settings"]["values"]["shapes"]) == {"legacy", "nonsensitive"}
    path.write_text(json.dumps(extended))
    with pytest.raises(SystemExit, match=r"these differ: shapes.nonsensitive"):
        uf._load_state(path, state["settings"], fresh=False)  # a run without a shape it had
    path.write_text(json.dumps(before))


def test_a_change_to_the_rr_phases_settings_alone_carries_what_does_not_read_them(tiny):
    """Only the cells that train an RR phase are trained again; the plain DP-SGD cells and the
    baselines are carried, each cell marked with the commit it came from. Any other change is
    refused as before."""
    import copy

    uf, out, _ = tiny
    path = out / "tiny.json"
    before = json.loads(path.read_text())
    today = copy.deepcopy(before["settings"])
    today["values"]["training"]["rr_average"] = 0.3
    today["values"]["training"]["rr_select"] = "auc" if before["settings"]["values"]["training"]["rr_select"] \
        != "auc" else "log_loss"
    today["commit"] = "f" * 40
    carried = uf._load_state(path, today, fresh=False)
    assert carried["settings"] == today and not carried["complete"] and carried["seconds"] == 0.0
    assert carried["baselines"] == before["baselines"]
    dpsgd = {k: c for k, c in before["cells"].items() if c["arm"] == "DP-SGD"}
    assert dpsgd and sorted(carried["cells"]) == sorted(dpsgd)
    commit = before["settings"].get("commit") or "unknown"
    for key, cell in carried["cells"].items():
        assert cell == {**dpsgd[key], "carried_from": commit}
    assert "rr_average" in carried["carried"]["why"] and "rr_select" in carried["carried"]["why"]
    assert carried["carried"]["commits"] == [commit]
    today["values"]["training"]["lr"] = 0.5  # the DP-SGD arm reads the model's settings: no carrying
    with pytest.raises(SystemExit, match="these differ: training.lr"):
        uf._load_state(path, today, fresh=False)
    assert json.loads(path.read_text()) == before  # loading writes nothing


def test_a_change_to_the_dpsgd_phases_settings_alone_carries_the_rr_cells(tiny):
    """The template's [dpsgd] table, the batch rule and the DP-SGD optimiser are read by every cell
    with a DP-SGD phase; RR alone (alpha 1) and the baselines are carried, the rest trained again."""
    import copy

    uf, out, _ = tiny
    path = out / "tiny.json"
    before = json.loads(path.read_text())
    today = copy.deepcopy(before["settings"])
    today["values"]["scenario"]["dpsgd"]["epochs"] = 10.0
    today["values"]["dpsgd_settings"]["cosine_decay"] = not today["values"]["dpsgd_settings"]["cosine_decay"]
    carried = uf._load_state(path, today, fresh=False)
    rr = {k: c for k, c in before["cells"].items() if c["arm"] == "RR"}
    assert rr and sorted(carried["cells"]) == sorted(rr) and carried["baselines"] == before["baselines"]
    commit = before["settings"].get("commit") or "unknown"
    assert all(cell == {**rr[key], "carried_from": commit} for key, cell in carried["cells"].items())
    assert carried["carried"]["arms"] == ["RR", "the non-private baselines"]
    assert "DP-SGD phase's" in carried["carried"]["why"] and "scenario.dpsgd.epochs" in carried["carried"]["why"]
    today["values"]["scenario"]["rr"]["batch_size"] = 7  # the RR arm reads it: no carrying
    differ = "these differ: dpsgd_settings.cosine_decay, scenario.dpsgd.epochs, scenario.rr.batch_size"
    with pytest.raises(SystemExit, match=differ):
        uf._load_state(path, today, fresh=False)
    assert json.loads(path.read_text()) == before  # loading writes nothing


def test_a_change_to_the_baselines_settings_alone_carries_every_cell_and_rescores_it(tiny, monkeypatch):
    """No cell reads how the baselines are trained: every cell is carried, the baselines are trained
    again, and each cell's relative loss is against the new ones. Any other change is refused."""
    import copy

    uf, out, _ = tiny
    path = out / "tiny.json"
    before = json.loads(path.read_text())
    today = copy.deepcopy(before["settings"])
    today["values"]["baselines"]["settings"]["patience"] += 1
    carried = uf._load_state(path, today, fresh=False)
    assert carried["settings"] == today and not carried["complete"] and carried["baselines"] == {}
    commit = before["settings"].get("commit") or "unknown"
    assert carried["cells"] == {k: {**c, "carried_from": commit} for k, c in before["cells"].items()}
    assert carried["carried"]["arms"] == [a for a in ARMS if any(c["arm"] == a for c in before["cells"].values())]
    assert "patience" in carried["carried"]["why"] and "trained again" in carried["carried"]["why"]
    # rescored against whatever baselines the run trains: here one 0.01 AUC better than before
    carried["baselines"] = {k: {**b, "all": {**b["all"], "auc": b["all"]["auc"] + 0.01}}
                            for k, b in before["baselines"].items()}
    uf.rescore_carried(carried)
    from trainers.metrics import relative_auc_loss

    for key, cell in carried["cells"].items():
        base = carried["baselines"][f"{cell['shape']}|{cell['seed']}"]["all"]["auc"]
        assert cell["relative_auc_loss"] == pytest.approx(relative_auc_loss(cell["auc"], base))
        assert cell["relative_auc_loss"] > before["cells"][key]["relative_auc_loss"]
    today["values"]["training"]["lr"] = 0.5  # read by the cells: no carrying
    with pytest.raises(SystemExit, match="these differ: "):
        uf._load_state(path, today, fresh=False)
    assert json.loads(path.read_text()) == before  # loading writes nothing


def test_a_change_of_the_rr_cap_alone_carries_the_cells_whose_rr_phase_stopped_before_it(tiny):
    """A cell without an RR phase, or whose RR phase stopped itself before the smaller of the two caps,
    trained what it would train under either (tests/trainers/test_rr_validation.py shows it): it is
    carried with the baselines; a cell whose RR phase ran to the old cap is trained again. Any other
    change beside it is refused."""
    import copy

    uf, out, _ = tiny
    path = out / "tiny.json"
    before = json.loads(path.read_text())
    cap = before["settings"]["values"]["scenario"]["rr"]["epochs"]
    edited = copy.deepcopy(before)
    with_rr = sorted(k for k, c in edited["cells"].items() if c["rr"] is not None)
    assert len(with_rr) >= 2
    for i, key in enumerate(with_rr):  # half stopped themselves just before the cap, half ran to it
        edited["cells"][key]["rr"]["epochs_run"] = cap - 0.25 if i % 2 else float(cap)
    path.write_text(json.dumps(edited))
    try:
        for new_cap in (cap + 5, cap + 1, max(1, cap - 1)):
            today = copy.deepcopy(before["settings"])
            today["values"]["scenario"]["rr"]["epochs"] = new_cap
            carried = uf._load_state(path, today, fresh=False)
            low = min(cap, new_cap)
            expect = {k for k, c in edited["cells"].items() if c["rr"] is None or c["rr"]["epochs_run"] < low}
            assert set(carried["cells"]) == expect and carried["baselines"] == before["baselines"]
            dpsgd = {k for k, c in before["cells"].items() if c["arm"] == "DP-SGD"}
            assert dpsgd and dpsgd <= set(carried["cells"])  # no RR phase: always carried
            assert (expect & set(with_rr)) == ({k for i, k in enumerate(with_rr) if i % 2} if low == cap else set())
            commit = before["settings"].get("commit") or "unknown"
            assert all(c == {**edited["cells"][k], "carried_from": commit} for k, c in carried["cells"].items())
            assert f"before epoch {low}" in carried["carried"]["why"] and not carried["complete"]
        today["values"]["scenario"]["rr"]["batch_size"] = 7  # read by every RR phase: no carrying
        with pytest.raises(SystemExit, match="these differ: scenario.rr.batch_size, scenario.rr.epochs"):
            uf._load_state(path, today, fresh=False)
    finally:
        path.write_text(json.dumps(before))


def test_an_rr_only_plan_is_the_same_whatever_the_dpsgd_table_says():
    """What carrying the RR cells rests on: the template's RR arm plans the same phases at 5 and 10
    DP-SGD epochs (only the scenario the plan embeds differs)."""
    from budgetplan.planning.planner import build_plan
    from budgetplan.scenario.examples import adapted, set_key
    from budgetplan.scenario.model import parse_scenario
    from trainers.data.synth import get_shape

    text = adapted("synthetic-hybrid", epsilon=3, dataset_size=797_268, split="alpha=1",
                   features=get_shape("mixed").features)
    plans = [json.loads(build_plan(parse_scenario(set_key(text, "dpsgd", "epochs", e))).to_json()) for e in (5, 10)]
    assert plans[0]["phases"] == plans[1]["phases"] and [p["name"] for p in plans[0]["phases"]] == ["rr"]
    assert {k for k in plans[0] if plans[0][k] != plans[1][k]} == {"scenario", "sha256"}
    # nor whatever the composition: one phase has nothing to compose
    pld = json.loads(build_plan(parse_scenario(text + '\n[accounting]\ncomposition = "pld"\n')).to_json())
    assert pld["phases"] == plans[1]["phases"] and pld["run_budget"] == plans[1]["run_budget"]


def test_the_composition_option_reaches_every_plan_and_reads_as_a_dpsgd_setting():
    uf = _frontier()
    from trainers.data.synth import get_shape

    args = uf.parse_args([*ARGV, "--composition", "basic"])
    text = uf.scenario(args, epsilon=3.0, split="alpha=0.5", n=100_000, spec=get_shape("legacy").features)
    from budgetplan.scenario.model import parse_scenario

    assert parse_scenario(text).composition == "basic"
    assert "composition" not in uf.settings(args)["values"]["scenario"]  # basic: as plans without the key
    # the template's default ("auto") is recorded as the planner resolves it for the Hybrid template
    assert uf.settings(uf.parse_args(ARGV))["values"]["scenario"]["composition"] == "pld"
    assert uf.settings(uf.parse_args([*ARGV, "--composition", "pld"]))["values"]["scenario"]["composition"] == "pld"
    assert uf._dpsgd_only("scenario.composition") and not uf._dpsgd_only("scenario.rr.epochs")


def test_cells_of_another_run_with_the_same_settings_are_taken(tiny, tmp_path):
    """--cells-from: a cell this run lacks is taken from a results file made with the same settings
    (its arms, shapes and epsilons may differ) where that file's baseline for the cell is this run's;
    anything else is refused or left to train."""
    import copy

    uf, out, _ = tiny
    before = json.loads((out / "tiny.json").read_text())
    args = uf.parse_args([*ARGV, "--out", str(tmp_path)])
    other = copy.deepcopy(before)  # an experiment on one arm: the arms differ, nothing else
    other["settings"]["values"]["arms"] = {"DP-SGD": before["settings"]["values"]["arms"]["DP-SGD"]}
    other["cells"] = {k: c for k, c in before["cells"].items() if c["arm"] == "DP-SGD"}
    (tmp_path / "other.json").write_text(json.dumps(other))

    state = uf._new_state(before["settings"])
    state["baselines"] = copy.deepcopy(before["baselines"])
    state["cells"] = {k: c for k, c in before["cells"].items() if c["arm"] != "DP-SGD"}
    assert uf.take_cells(state, tmp_path / "other.json", args) == len(other["cells"]) > 0
    assert set(state["cells"]) == set(before["cells"])
    commit = before["settings"].get("commit") or "unknown"
    assert all(state["cells"][k] == {**c, "carried_from": commit} for k, c in other["cells"].items())
    assert "DP-SGD from other.json" in state["carried"]["why"] and state["carried"]["arms"] == ["DP-SGD"]
    assert uf.take_cells(state, tmp_path / "other.json", args) == 0  # nothing left to take

    moved = uf._new_state(before["settings"])  # a baseline of another run: its cells would score otherwise
    moved["baselines"] = copy.deepcopy(before["baselines"])
    first = sorted(moved["baselines"])[0]
    moved["baselines"][first]["all"]["auc"] += 0.01
    assert uf.take_cells(moved, tmp_path / "other.json", args) == len(other["cells"]) // 2

    replanned = uf._new_state(before["settings"])  # a cell whose plan is not today's: trained again
    replanned["baselines"] = copy.deepcopy(before["baselines"])
    stale = sorted(other["cells"])[0]
    other["cells"][stale]["plan_sha256"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(other))
    assert uf.take_cells(replanned, tmp_path / "other.json", args) == len(other["cells"]) - 1
    assert stale not in replanned["cells"]

    other["settings"]["values"]["rows"] = 5000
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="made with other settings \\(these differ: rows\\)"):
        uf.take_cells(uf._new_state(before["settings"]), tmp_path / "other.json", args)


@pytest.mark.parametrize("argv, what", [(["--shapes", "nope"], "--shapes"), (["--arms", "RR,X"], "--arms"),
                                        (["--epsilons", "1,inf"], "--epsilons"), (["--rows", "0"], "--rows"),
                                        (["--jobs", "0"], "--jobs")])
def test_bad_options_are_refused_in_one_line(argv, what, capsys):
    with pytest.raises(SystemExit) as exc:
        _frontier().parse_args(argv)
    assert exc.value.code == 2 and what in capsys.readouterr().err.splitlines()[-1]


def _arm(mean, std):
    return {"loss_mean": mean, "loss_std": std, "readable": {}}


def test_cells_the_seeds_cannot_order_are_marked():
    _frontier()
    import frontier_report as uf
    by_arm = {"RR": _arm(10.0, 1.0), "DP-SGD": _arm(5.0, 1.0), "Hybrid": _arm(5.5, 1.0)}
    uf._readable(by_arm, list(by_arm), "main", "loss")
    # RR is 4.5 away from its nearest arm (std 1): ordered; DP-SGD and Hybrid are 0.5 apart: not
    assert [by_arm[a]["readable"]["main/loss"] for a in by_arm] == [True, False, False]
    by_arm["Hybrid"]["loss_std"] = 6.0  # the larger std of a pair decides: RR against Hybrid too
    uf._readable(by_arm, list(by_arm), "main", "loss")
    assert by_arm["RR"]["readable"]["main/loss"] is False
    assert uf._cell({**by_arm["RR"], "diverged": 0, "n": 3}, "main", "loss") == "~10.00 +- 1.00"
    one_seed = {"RR": _arm(10.0, None), "DP-SGD": _arm(5.0, None)}
    uf._readable(one_seed, list(one_seed), "main", "loss")
    assert one_seed["RR"]["readable"]["main/loss"] is None  # no spread: no judgement either way


def test_a_dp_arm_beyond_its_baseline_fails_the_benchmark(tiny):
    uf, _, state = tiny
    assert not any(c["beats_baseline"] for c in state["cells"].values())
    uf.check_ceiling(state)  # the tiny run's arms stay below their ceiling
    beaten = json.loads(json.dumps(state))
    beaten["cells"]["legacy|0|0.01|RR"]["beats_baseline"] = True
    with pytest.raises(SystemExit, match=r"in 1 cells \(legacy\|0\|0.01\|RR\): the baseline is no ceiling"):
        uf.check_ceiling(beaten)


def test_a_run_of_one_arm_has_no_regret_table(tiny):
    """An experiment on one arm (``--arms DP-SGD``) compares no split: the report says so instead of
    printing a regret of 0 against itself and checks of the defaults it did not train."""
    _frontier()
    import frontier_report

    _, _, state = tiny
    full = frontier_report.render(state, "tiny")
    assert "## Which split: regret of each rule" in full and "## The defaults against their targets" in full
    one = json.loads(json.dumps(state))
    one["cells"] = {k: c for k, c in one["cells"].items() if c["arm"] == "DP-SGD"}
    text = frontier_report.render(one, "tiny")
    assert "regret of each rule" not in text and "against their targets" not in text
    assert "One arm of the alpha grid only" in text


def test_a_fine_tune_arm_gets_its_regret_row_and_an_extended_run_names_its_runs(tiny):
    """The fine-tuned tower is a rule of its own (its loss above the grid's best), and the cells of a
    file extended by a later run (a new arm) are said to be the file's own runs', not the last run's."""
    _frontier()
    import frontier_report

    _, _, state = tiny
    extended = json.loads(json.dumps(state))
    for key, c in list(extended["cells"].items()):
        if c["arm"] == "alpha=0.5":  # the tower's cells: alpha 0.5's, 2 points worse
            extended["cells"][key.replace("alpha=0.5", "fine-tune")] = {
                **c, "arm": "fine-tune", "tower": "fine-tune", "relative_auc_loss": c["relative_auc_loss"] + 2.0}
    summary = frontier_report.summarise(extended)
    table = frontier_report.regret(summary, ["alpha=0.5", "fine-tune"], None)
    assert table["fine-tune"]["legacy"][0.01] == pytest.approx(table["alpha=0.5"]["legacy"][0.01] + 2.0)
    assert "| fine-tune | 0.01 |" in frontier_report.render(extended, "tiny")

    taken = next(iter(extended["cells"]))
    extended["cells"][taken]["carried_from"] = "a" * 40
    extended["carried"] = {"arms": ["RR"], "from_commit": "a" * 12, "commits": ["a" * 40], "why": "nothing changed"}
    total = len(extended["cells"])
    assert f"{total - 1} of the {total} cells were trained in this run." in frontier_report.render(extended, "tiny")
    extended["commits"] = ["b" * 40, "c" * 40]  # two earlier runs of this file, each extended by the next
    assert (f"{total - 1} of the {total} cells were trained by this file's own runs (the earlier ones at commits "
            f"{'b' * 12} and {'c' * 12})." in frontier_report.render(extended, "tiny"))
