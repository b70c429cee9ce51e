"""What a guarantee means to an attacker: TPR at a false-positive rate, against closed forms."""

import json
import math

import pytest
from click.testing import CliRunner
from scipy import stats

from budgetplan.accounting.tradeoff import ALPHAS, mechanism_tradeoff, tpr_from_pair
from budgetplan.cli import cli
from budgetplan.errors import InvalidParameterError
from budgetplan.mechanisms import GaussianRelease, RandomizedResponse
from budgetplan.planning.composition import plan_tradeoff
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario import examples, load_scenario

ALPHA_GRID = (1e-4, 1e-3, 1e-2, 0.1, 0.5)


def gdp_tpr(alpha: float, mu: float) -> float:
    """mu-GDP's trade-off (Dong, Roth and Su, arXiv:1905.02383): TPR = Phi(Phi^-1(alpha) + mu)."""
    return float(stats.norm.cdf(stats.norm.ppf(alpha) + mu))


def rr_tpr(alpha: float, eps: float) -> float:
    """Randomized response at eps is exactly eps-DP, and its trade-off is the eps-DP one."""
    return min(math.exp(eps) * alpha, 1 - math.exp(-eps) * (1 - alpha))


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.0, 4.0])
def test_gaussian_matches_gdp(mu):
    # a label change moves WALR's sum by the sensitivity: noise std 1/mu per unit of it is mu-GDP
    got = mechanism_tradeoff(GaussianRelease(noise_std=1.0 / mu, sensitivity=1.0), adjacency="replace-one",
                             alphas=ALPHA_GRID)
    for a, tpr in zip(ALPHA_GRID, got):
        exact = gdp_tpr(a, mu)
        assert exact <= tpr + 1e-9          # the pessimistic PLD never under-states the attacker
        assert tpr <= exact * 1.01 + 1e-4   # and is close to exact


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_randomized_response_matches_its_closed_form(eps):
    got = mechanism_tradeoff(RandomizedResponse(epsilon=eps), adjacency="replace-one", alphas=ALPHA_GRID)
    for a, tpr in zip(ALPHA_GRID, got):
        assert tpr == pytest.approx(rr_tpr(a, eps), rel=2e-3)
        assert tpr >= rr_tpr(a, eps) - 1e-12


def test_one_pair_gives_the_line():
    assert tpr_from_pair(1.0, 1e-5, (1e-3,)) == [pytest.approx(math.e * 1e-3 + 1e-5)]
    assert tpr_from_pair(0.0, 0.0, (0.2,)) == [pytest.approx(0.2)]  # no information: a coin
    assert tpr_from_pair(math.inf, 1e-5, (1e-3,)) == [1.0]
    with pytest.raises(InvalidParameterError, match="alpha"):
        tpr_from_pair(1.0, 1e-5, (0.0,))


def test_walr_plan_is_its_gaussian():
    plan = build_plan(load_scenario(examples.path("walr")))
    (phase,) = plan.phases
    mech = phase.mechanism
    res = plan_tradeoff(plan)
    assert res["from"] == "pld" and res["alphas"] == list(ALPHAS)
    for a, tpr in zip(ALPHAS, res["tpr"]):
        exact = gdp_tpr(a, mech.sensitivity / mech.noise_std)
        assert exact <= tpr <= exact * 1.01 + 1e-4
    # the composed curve is tighter than the one (eps, delta) pair the plan states
    pair = tpr_from_pair(plan.guarantee.epsilon, plan.guarantee.delta)
    assert all(t <= p for t, p in zip(res["tpr"], pair))


def test_statement_says_what_an_attacker_can_do():
    plan = build_plan(load_scenario(examples.path("rr-impression")))
    text = " ".join(render_statement(plan).split())
    res = plan_tradeoff(plan)
    assert "What the guarantee means to an attacker:" in text
    # RR at eps 4 is 4-DP exactly: TPR = e^4 alpha below the kink
    assert res["tpr"][0] == pytest.approx(rr_tpr(1e-3, plan.guarantee.epsilon), rel=1e-3)
    assert f"(false-positive rate 0.001) is right about at most {100 * res['tpr'][0]:.3g}%" in text
    assert f"at a false-positive rate of 0.01, at most {100 * res['tpr'][1]:.3g}%" in text


def test_statement_json(tmp_path):
    made = CliRunner().invoke(cli, ["plan", "example:walr", "-o", str(tmp_path / "plan.json")])
    assert made.exit_code == 0, made.output
    out = CliRunner().invoke(cli, ["statement", str(tmp_path / "plan.json"), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["attacker"]["alphas"] == list(ALPHAS) and data["attacker"]["from"] == "pld"
    assert 0 < data["attacker"]["tpr"][0] < data["attacker"]["tpr"][1] < 1
    assert "What the guarantee means to an attacker" in data["text"]
