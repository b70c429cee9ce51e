"""``budgetplan split --proxy``: the alpha grid trained on proxy data, the best split written with its evidence."""

from __future__ import annotations

import json

import pytest

from budgetplan.errors import InvalidParameterError
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.examples import adapted
from budgetplan.scenario.model import load_scenario, parse_scenario
from trainers.data.synth import get_shape, write_synthetic
from trainers.proxy import proxy_scenario


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("proxy")
    write_synthetic(root / "proxy.parquet", 8_000, 1_600, seed=3, shape="mixed")
    (root / "mine.toml").write_text(adapted("synthetic-hybrid", epsilon=4, dataset_size=2_000_000,
                                            features=get_shape("mixed").features, scenario_name="mine"))
    return root


def test_the_proxy_plan_keeps_epsilon_epochs_and_q():
    s = parse_scenario(adapted("synthetic-hybrid", epsilon=4, dataset_size=2_000_000))
    p = proxy_scenario(s, 50_000, 0.25)
    assert (p.epsilon, p.dataset_size, p.split, p.dpsgd.epochs) == (4.0, 50_000, "alpha=0.25", s.dpsgd.epochs)
    assert p.dpsgd.batch_size / p.dataset_size == pytest.approx(s.dpsgd.batch_size / s.dataset_size, rel=1e-3)
    assert build_plan(p).dpsgd.params.sampling_rate == pytest.approx(1 / 50, rel=1e-3)


def test_cli_writes_the_best_split_and_the_statement_quotes_where_it_came_from(files, runner, allocator_calls):
    from budgetplan.cli import cli

    result = runner.invoke(cli, ["split", "--proxy", str(files / "proxy.parquet"), "--scenario",
                                 str(files / "mine.toml"), "--alphas", "0,1", "--seed", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert allocator_calls == [1]
    out = json.loads(result.stdout)
    cells = {c["alpha"]: c for c in out["cells"]}
    assert set(cells) == {0.0, 1.0} and out["best_alpha"] == max(cells, key=lambda a: cells[a]["auc"])
    assert out["best_rule"] == f"alpha={out['best_alpha']:g}"
    written = load_scenario(files / "mine-proxy.toml")
    assert written.split == out["best_rule"] and written.split_evidence == out["evidence"]
    assert out["proxy_sha256"][:16] in written.split_evidence
    assert (files / "mine-proxy" / "frontier.png").stat().st_size > 0
    mine = load_scenario(files / "mine.toml")
    assert (written.epsilon, written.dataset_size) == (mine.epsilon, mine.dataset_size)  # only the split moved
    text = " ".join(render_statement(build_plan(written)).split())
    assert "was chosen on other data: budgetplan split --proxy on proxy.parquet" in text
    assert "if it is, the choice spent privacy this plan does not account" in text


def test_a_units_split_keeps_the_q_the_private_plan_gives_it():
    text = adapted("synthetic-hybrid", epsilon=4, dataset_size=2_000_000).replace(
        'split = "alpha-by-eps"', 'split = "units=0.75"')
    s = parse_scenario(text)  # "N/50" over the DP-SGD part's 500,000 rows
    p = proxy_scenario(s, 40_000, "units=0.75")
    assert (p.split, p.dataset_size, p.dpsgd.batch_size) == ("units=0.75", 40_000, 200)  # 1/50 of 10,000
    assert build_plan(p).dpsgd.params.sampling_rate == pytest.approx(build_plan(s).dpsgd.params.sampling_rate)
    # an alpha analog of the same private scenario keeps that q over every row
    assert proxy_scenario(s, 40_000, 0.5).dpsgd.batch_size == 800


def test_cli_tries_the_units_split_beside_the_alphas(files, runner, allocator_calls, tmp_path):
    from budgetplan.cli import cli

    result = runner.invoke(cli, ["split", "--proxy", str(files / "proxy.parquet"), "--scenario",
                                 str(files / "mine.toml"), "--alphas", "1", "--units", "0.75", "--seed", "1",
                                 "--out", str(tmp_path / "frontier"), "--write", str(tmp_path / "chosen.toml"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    cells = {c["rule"]: c for c in out["cells"]}
    assert set(cells) == {"alpha=1", "units=0.75"} and cells["units=0.75"]["alpha"] is None
    assert out["best_rule"] == max(cells, key=lambda r: cells[r]["auc"])
    assert out["best_alpha"] == cells[out["best_rule"]]["alpha"]
    written = load_scenario(tmp_path / "chosen.toml")
    assert written.split == out["best_rule"] and "units=0.75: " in written.split_evidence
    assert (tmp_path / "frontier" / "frontier.png").stat().st_size > 0


@pytest.mark.parametrize("extra, message", [
    (["--epsilon", "3"], "--epsilon does not go with --proxy"),
    (["--write", "{mine}"], "would overwrite the scenario it reads"),
    (["--units", "1"], "--units shares must be strictly between 0 and 1"),
])
def test_cli_refusals_are_one_line(files, runner, extra, message):
    from budgetplan.cli import cli

    extra = [e.format(mine=files / "mine.toml") for e in extra]
    result = runner.invoke(cli, ["split", "--proxy", str(files / "proxy.parquet"), "--scenario",
                                 str(files / "mine.toml"), *extra])
    assert result.exit_code == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_only_a_hybrid_scenario_with_features_gets_a_proxy_split(files, runner, tmp_path):
    from budgetplan.cli import cli
    from budgetplan.scenario.examples import path

    rr = runner.invoke(cli, ["split", "--proxy", str(files / "proxy.parquet"), "--scenario",
                             str(path("rr-impression"))])
    assert rr.exit_code == 2 and "the scenario's algorithm is 'rr'" in rr.stderr
    alone = runner.invoke(cli, ["split", "--scenario", str(files / "mine.toml")])
    assert alone.exit_code == 2 and "--proxy and --scenario go together" in alone.stderr
    with pytest.raises(InvalidParameterError, match="split_evidence"):
        parse_scenario(adapted("rr-impression").replace('name = "rr"', 'name = "rr"\nsplit_evidence = "x"'))
