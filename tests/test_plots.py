"""Plots: the data behind them, the PNGs, and the CLI."""

import json

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.report.plots import epsilon_curve, plot_epsilon_curve


def test_epsilon_curve_rows_and_order():
    rows = epsilon_curve(noise_multipliers=[1.0], sampling_rate=0.01, steps_per_epoch=100, epochs=[1, 2, 3, 4],
                         delta=1e-6, accountants=("pld", "rdp", "prv"), prv_points=2)
    by = {}
    for r in rows:
        by.setdefault(r["accountant"], []).append(r)
    assert [r["epochs"] for r in by["pld"]] == [1, 2, 3, 4] and len(by["prv"]) == 2
    pld = [r["epsilon"] for r in by["pld"]]
    assert pld == sorted(pld)  # more epochs never cost less
    for p, r in zip(by["pld"], by["rdp"]):
        assert p["epsilon"] <= r["epsilon"]  # RDP is the looser bound
    for r in by["prv"]:
        assert r["epsilon_low"] <= r["epsilon"] == r["epsilon_high"]


def test_png_only_and_written(tmp_path):
    rows = epsilon_curve(noise_multipliers=[1.2], sampling_rate=0.01, steps_per_epoch=10, epochs=[1, 2],
                         delta=1e-6, accountants=("pld",))
    out = plot_epsilon_curve(rows, tmp_path / "c.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InvalidParameterError, match="must end in .png"):
        plot_epsilon_curve(rows, tmp_path / "c.pdf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.png"]


def test_cli_curve(runner, tmp_path):
    from budgetplan.cli import cli

    out = runner.invoke(cli, ["plot", "curve", "--noise-multiplier", "1.0", "--dataset-size", "10000",
                              "--batch-size", "100", "--max-epochs", "2", "--points", "2", "--delta", "1e-6",
                              "--accountant", "pld", "--accountant", "rdp", "-o", str(tmp_path / "c.png"), "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["rows"]) == 4 and (tmp_path / "c.png").exists()
    bad = runner.invoke(cli, ["plot", "curve", "--noise-multiplier", "nan", "--dataset-size", "10", "--batch-size",
                              "1", "--max-epochs", "1", "--delta", "1e-6", "-o", str(tmp_path / "d.png")])
    assert bad.exit_code == 2 and "--noise-multiplier must be a finite number > 0, got nan" in bad.stderr
