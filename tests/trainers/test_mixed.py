"""The mixed shapes: cross-group interactions, heavy users, and knobs that do what they say."""

from __future__ import annotations

import re

import numpy as np
import pytest

from budgetplan.errors import InvalidParameterError
from trainers.data import mixed
from trainers.data.mixed import MIXED, MixedShape, adjusted
from trainers.data.shapes import draw_criteo_like, heavy_tailed_users
from trainers.data.synth import SHAPES, oracle_aucs, synthesize


@pytest.mark.parametrize("name", sorted(MIXED))
def test_each_preset_converts_at_its_base_rate(name):
    table = synthesize(100_000, 20_000, 3, name)
    assert table.column("label").to_numpy().mean() == pytest.approx(MIXED[name].base_rate, abs=0.004)
    assert SHAPES[name] is MIXED[name]


def test_the_shares_are_the_shares_of_the_logit_variance():
    shape = adjusted(MIXED["mixed"], nonsensitive_share=0.3, cross_share=0.4, signal_std=1.1)
    cols = draw_criteo_like(np.random.default_rng(5), 100_000, 20_000, user_sigma=shape.user_sigma,
                            max_user_rows=shape.max_user_rows)
    sd_ns, sd_s, sd_x, s_ns, s_s, s_x, _ = shape._calibrated()
    z_ns, z_s, z_x = mixed._parts(cols)
    parts = [z_ns * s_ns / sd_ns, z_s * s_s / sd_s, z_x * s_x / sd_x]
    variances = np.array([p.var() for p in parts])
    assert variances.sum() == pytest.approx(1.1**2, rel=0.08)
    assert variances / variances.sum() == pytest.approx([0.6 * 0.3, 0.6 * 0.7, 0.4], abs=0.02)
    assert shape.name == "mixed(cross_share=0.4,nonsensitive_share=0.3,signal_std=1.1)"


def test_more_cross_or_sensitive_signal_lowers_the_non_sensitive_oracle():
    losses = {name: oracle_aucs(synthesize(60_000, 12_000, 1, name), name, draws=4)["relative_auc_loss"]
              for name in ("mixed-ns", "mixed", "mixed-s")}
    assert losses["mixed-ns"] < losses["mixed"] < losses["mixed-s"]


def test_without_cross_terms_the_non_sensitive_oracle_is_exact():
    shape = adjusted(MIXED["mixed"], cross_share=0.0)
    table = synthesize(40_000, 8_000, 2, shape)
    assert oracle_aucs(table, shape)["nonsensitive_method"] == "exact"
    assert oracle_aucs(table, MIXED["mixed"])["nonsensitive_method"].startswith("monte carlo")


def test_users_are_capped_and_the_default_draw_is_unchanged():
    user, _ = heavy_tailed_users(np.random.default_rng(0), 200_000, 20_000, sigma=2.6, max_rows=500)
    counts = np.bincount(user)
    assert counts.max() == 500 and counts.sum() == 200_000 and counts.min() >= 1
    a = heavy_tailed_users(np.random.default_rng(4), 5_000, 900)
    b = heavy_tailed_users(np.random.default_rng(4), 5_000, 900, sigma=1.8, max_rows=None)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(InvalidParameterError, match="cannot hold"):
        heavy_tailed_users(np.random.default_rng(0), 1_000, 10, max_rows=50)


def test_same_seed_same_rows():
    a, b = synthesize(5_000, 1_000, 9, "mixed-s"), synthesize(5_000, 1_000, 9, "mixed-s")
    assert a.equals(b)


@pytest.mark.parametrize("knob, value, message", [
    ("nonsensitive_share", 1.5, "nonsensitive_share must be in [0, 1]"),
    ("cross_share", 1.0, "cross_share must be in [0, 1)"),
    ("base_rate", 0.7, "base_rate must be at most 0.5"),
    ("signal_std", float("nan"), "signal_std must be a finite number"),
    ("user_sigma", -1.0, "user_sigma must be a finite number > 0"),
    ("max_user_rows", 0, "max_user_rows must be an integer >= 1"),
])
def test_bad_knobs_are_refused(knob, value, message):
    with pytest.raises(InvalidParameterError, match=re.escape(message)):
        MixedShape(name="x", description="", **{knob: value})


def test_cli_knobs_reach_the_data(runner, tmp_path):
    import json

    from budgetplan.cli import cli

    out = tmp_path / "d.parquet"
    result = runner.invoke(cli, ["data", "synth", "--rows", "30000", "--users", "6000", "--out", str(out), "--shape",
                                 "mixed-ns", "--base-rate", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["shape"] == "mixed-ns(base_rate=0.1)" and summary["conversion_rate"] == pytest.approx(0.1, abs=0.01)
    bad = runner.invoke(cli, ["data", "synth", "--rows", "100", "--users", "10", "--out", str(out), "--shape",
                              "legacy", "--user-sigma", "2"])
    assert bad.exit_code == 2 and "applies to the mixed shapes" in bad.output
