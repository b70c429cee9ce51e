"""The CLI of issue #3: plan, show, verify, statement, examples, split."""

import json

import pytest

from budgetplan.cli import cli


def run(runner, *args):
    return runner.invoke(cli, [str(a) for a in args])


def test_examples_list_and_print(runner):
    out = run(runner, "examples", "--json")
    names = [e["name"] for e in json.loads(out.stdout)["examples"]]
    assert {"criteo-pctr-hybrid", "walr", "rr-impression", "criteo-attribution-user-k1",
            "criteo-attribution-user-k10"} <= set(names)
    toml = run(runner, "examples", "walr")
    assert toml.exit_code == 0 and "[walr]" in toml.stdout
    missing = run(runner, "examples", "nope")
    assert missing.exit_code == 2 and "no example scenario named 'nope'" in missing.stderr


def test_plan_show_verify_statement(runner, tmp_path):
    plan_path = tmp_path / "plan.json"
    made = run(runner, "plan", "example:criteo-pctr-hybrid", "-o", plan_path, "--json")
    assert made.exit_code == 0, made.output
    summary = json.loads(made.stdout)
    assert {"epsilon", "delta", "accountant", "adjacency", "sha256"} <= summary.keys()
    assert summary["epsilon"] <= 8.0 and [p["name"] for p in summary["phases"]] == ["rr", "dpsgd", "calibration"]
    assert json.loads(plan_path.read_text())["sha256"] == summary["sha256"]

    shown = run(runner, "show", plan_path)
    assert shown.exit_code == 0 and "Phase 2: dpsgd" in shown.stdout
    verified = run(runner, "verify", plan_path)
    assert verified.exit_code == 0 and "verified" in verified.stdout
    stmt = run(runner, "statement", plan_path)
    assert stmt.exit_code == 0 and stmt.stdout.startswith("PRIVACY STATEMENT - criteo-pctr-hybrid")
    out_file = tmp_path / "statement.txt"
    assert run(runner, "statement", plan_path, "-o", out_file).exit_code == 0
    assert out_file.read_text() == stmt.stdout


def test_plan_to_stdout(runner, tmp_path):
    out = run(runner, "plan", "example:rr-impression")
    assert out.exit_code == 0
    assert json.loads(out.stdout)["schema_version"] == 1


def test_verify_fails_on_a_flipped_byte(runner, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert run(runner, "plan", "example:walr", "-o", plan_path).exit_code == 0
    text = plan_path.read_text()
    plan_path.write_text(text.replace('"features": 20', '"features": 21'))
    out = run(runner, "verify", plan_path)
    assert out.exit_code == 1 and "sha256 mismatch" in out.stderr
    as_json = run(runner, "verify", plan_path, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["ok"] is False
    assert run(runner, "statement", plan_path).exit_code == 1
    assert run(runner, "show", plan_path).exit_code == 1


def scenario(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


GOOD = """
[budget]
epsilon = 2.0
delta = 1e-8
[privacy]
adjacency = "add-remove"
unit = "impression"
[data]
dataset_size = 100000
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = 1000
epochs = 2
clipping_norm = 1.0
"""


@pytest.mark.parametrize("edit, code, fragment", [
    (("epsilon = 2.0", "epsilon = nan"), 2, "[budget].epsilon must be a finite number > 0, got nan"),
    (("[data]", "[data]\nrows = 3"), 2, "unknown key [data].rows"),
    (("clipping_norm = 1.0", ""), 2, "missing required key [dpsgd].clipping_norm"),
    (('unit = "impression"', 'unit = "user x time"'), 2, "needs [privacy].cap"),
    (("epochs = 2", "epochs = 2\nnoise_multiplier = 0.8"), 1, "use noise_multiplier >="),
    (("epochs = 2", "epochs = 2\nmax_noise_multiplier = 0.85"), 1, "max_noise_multiplier"),
])
def test_bad_scenarios_write_nothing(runner, tmp_path, edit, code, fragment):
    src = scenario(tmp_path, GOOD.replace(*edit))
    target = tmp_path / "plan.json"
    target.write_text("previous plan")
    out = run(runner, "plan", src, "-o", target)
    assert out.exit_code == code, out.output
    assert fragment in out.stderr and out.stderr.strip().count("\n") == 0
    assert target.read_text() == "previous plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "s.toml"]


def test_split_paper_v1(runner):
    out = run(runner, "split", "--epsilon", "8", "--delta", "1e-7", "--dataset-size", "32000000", "--batch-size",
              "16384", "--epochs", "3", "--rule", "paper-v1", "--json")
    assert out.exit_code == 0, out.output
    cell = json.loads(out.stdout)
    assert cell["epsilon1"] == 3.0 and cell["epsilon2"] == 5.0
    assert cell["flip_probability"] == pytest.approx(0.0474259, abs=1e-7)
    assert cell["noise_multiplier"] > 0 and cell["dpsgd_epsilon"] <= 5.0
    assert "warning: delta=1e-07 is not below 1/N" in out.stderr
    human = run(runner, "split", "--epsilon", "8", "--delta", "1e-9", "--dataset-size", "32000000", "--batch-size",
                "16384", "--epochs", "3")
    assert human.exit_code == 0 and "alpha-by-eps" in human.stdout  # the planner's default rule


def test_split_grid(runner):
    out = run(runner, "split", "--rule", "grid", "--epsilons", "1,8", "--alphas", "0,0.5,1", "--delta", "1e-6",
              "--dataset-size", "60000", "--batch-size", "600", "--epochs", "2", "--json")
    assert out.exit_code == 0, out.output
    cells = json.loads(out.stdout)["results"]
    assert len(cells) == 6
    by = {(c["epsilon"], c["rule"]): c for c in cells}
    assert by[(8.0, "alpha=1")]["noise_multiplier"] is None and by[(8.0, "alpha=1")]["epsilon1"] == 8.0
    assert by[(8.0, "alpha=0")]["flip_probability"] is None
    # eps2 = 4 in both (8, 0.5) and ... more budget for DP-SGD means less noise
    assert by[(8.0, "alpha=0")]["noise_multiplier"] < by[(8.0, "alpha=0.5")]["noise_multiplier"]


@pytest.mark.parametrize("args, fragment", [
    (["--epsilon", "8", "--rule", "alpha=1.5"], "alpha must be in [0, 1], got 1.5"),
    (["--epsilon", "8", "--rule", "thirds"], "--rule must be"),
    (["--epsilon", "8", "--rule", "eps1=9"], "split eps1 must be below the total epsilon 8"),
    (["--rule", "grid", "--epsilons", "1,x"], "--epsilons must be comma-separated numbers"),
    (["--epsilon", "8", "--adjacency", "add-remove"], "cannot account Hybrid's RR phase"),
])
def test_split_errors(runner, args, fragment):
    base = ["split", "--delta", "1e-9", "--dataset-size", "60000", "--batch-size", "600", "--epochs", "1"]
    out = run(runner, *base, *args)
    assert out.exit_code == 2 and fragment in out.stderr


def test_plan_into_a_fifo_a_symlink_and_dev_null(runner, tmp_path):
    # -o never replaces what it names: a FIFO and /dev/null are written through, a symlink's
    # target is replaced atomically and the link stays; a name ending in / is refused
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    out = run(runner, "plan", "example:rr-impression", "-o", fifo)
    reader.join(timeout=30)
    assert out.exit_code == 0, out.output
    assert json.loads(got[0])["sha256"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "target.json").write_text("old")
    (tmp_path / "link.json").symlink_to("target.json")
    assert run(runner, "plan", "example:rr-impression", "-o", tmp_path / "link.json").exit_code == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "target.json").read_text())["sha256"]
    assert run(runner, "plan", "example:rr-impression", "-o", "/dev/null").exit_code == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    slash = run(runner, "plan", "example:rr-impression", "-o", f"{tmp_path}/newdir/")
    assert slash.exit_code == 2 and "ends in '/'" in slash.stderr and not (tmp_path / "newdir").exists()
    assert sorted(os.listdir(tmp_path)) == ["link.json", "pipe", "target.json"]
