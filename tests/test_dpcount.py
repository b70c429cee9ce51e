"""A DP count of N: its sampler, its accounting, the count phase of a plan, and the CLI release."""

import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from budgetplan.accounting import account
from budgetplan.accounting.backends import reference_discrete_laplace_epsilon
from budgetplan.audit.verify import verify_plan
from budgetplan.dpcount import (
    discrete_laplace,
    discrete_laplace_pmf,
    discrete_laplace_variance,
    release_count,
)
from budgetplan.errors import InvalidParameterError, UnsupportedError
from budgetplan.mechanisms import DiscreteLaplaceCount, mechanism_from_dict, mechanism_to_dict
from budgetplan.plan import Plan, canonical_json
from budgetplan.plan.phases import CountPhase, DPSGDPhase, phase_from_dict, phase_to_dict
from budgetplan.planning.planner import build_plan
from budgetplan.report.statement import render_statement
from budgetplan.scenario.model import parse_scenario
from budgetplan.units import PrivacyUnit


def scenario(*, eps=4.0, release=0.1, n=100_003, adjacency="add-remove", cap=1, extra="", dpsgd_extra=""):
    unit = 'unit = "impression"' if cap == 1 else f'unit = "user"\ncap = {cap}'
    data = f"dataset_size = {n}" + (f"\nsize_release_epsilon = {release!r}" if release is not None else "")
    return parse_scenario(f"""name = "dp-count"
[budget]
epsilon = {eps!r}
delta = 1e-6
[privacy]
adjacency = "{adjacency}"
{unit}
[data]
{data}
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = 1000
steps = 20
clipping_norm = 1.0
{dpsgd_extra}
{extra}
[calibration]  # off: these tests plan the training phases alone
share = 0
""")


@pytest.fixture(scope="module")
def plan():
    return build_plan(scenario())


# ------------------------------------------------------------------------- the sampler


@pytest.mark.parametrize("epsilon, k", [(0.1, 1), (1.0, 1), (0.5, 4), (3.0, 2)])
def test_sampler_matches_the_exact_pmf(epsilon, k):
    """Chi-square against tanh(a/2) e^{-a|z|}, a = eps/K, on bins of at least 20 expected draws."""
    n = 200_000
    z = discrete_laplace(np.random.default_rng(20260511), epsilon=epsilon, sensitivity=k, size=n)
    a = epsilon / k
    width = int(math.ceil(math.log(n * math.tanh(a / 2) / 20) / a))  # where the expected count falls to 20
    support = np.arange(-width, width + 1)
    expected = n * discrete_laplace_pmf(support, epsilon=epsilon, sensitivity=k)
    tail = n - expected.sum()  # both tails, |z| > width
    observed = np.array([np.count_nonzero(z == v) for v in support])
    chi, p = stats.chisquare(np.append(observed, n - observed.sum()), np.append(expected, tail))
    assert p > 1e-4, (chi, p)
    # the variance 2 e^{-a} / (1 - e^{-a})^2, to five standard errors (fourth moment of the pmf)
    var = discrete_laplace_variance(epsilon=epsilon, sensitivity=k)
    grid = np.arange(-60 * int(1 / a + 1), 60 * int(1 / a + 1) + 1)
    pmf = discrete_laplace_pmf(grid, epsilon=epsilon, sensitivity=k)
    assert math.isclose(pmf.sum(), 1.0, rel_tol=1e-12) and math.isclose((grid**2 * pmf).sum(), var, rel_tol=1e-9)
    se = math.sqrt(((grid**4 * pmf).sum() - var**2) / n)
    assert abs(np.var(z) - var) < 5 * se
    assert abs(np.mean(z)) < 5 * math.sqrt(var / n)


def test_the_chi_square_catches_a_sampler_with_half_the_noise():
    """The mutant draws with parameter 2a (the scale of K/2): the same test must reject it."""
    n, epsilon = 200_000, 0.5
    z = discrete_laplace(np.random.default_rng(7), epsilon=2 * epsilon, sensitivity=1, size=n)
    support = np.arange(-40, 41)
    expected = n * discrete_laplace_pmf(support, epsilon=epsilon, sensitivity=1)
    observed = np.array([np.count_nonzero(z == v) for v in support])
    _, p = stats.chisquare(np.append(observed, n - observed.sum()), np.append(expected, n - expected.sum()))
    assert p < 1e-12


def test_ks_against_the_exact_cdf():
    n, epsilon, k = 50_000, 0.2, 3
    z = discrete_laplace(np.random.default_rng(11), epsilon=epsilon, sensitivity=k, size=n)
    grid = np.arange(-2000, 2001)
    cdf = np.cumsum(discrete_laplace_pmf(grid, epsilon=epsilon, sensitivity=k))
    empirical = np.searchsorted(np.sort(z), grid, side="right") / n
    d = np.max(np.abs(empirical - cdf))
    assert d < 1.63 / math.sqrt(n)  # the KS critical value at alpha = 1% (discrete: conservative)


def test_release_holds_no_true_count_and_clamps_at_one():
    out = release_count(10, epsilon=0.01, sensitivity=5, seed=1)
    assert set(out) == {"noisy_count", "dataset_size", "epsilon", "sensitivity", "noise_std", "randomness"}
    assert out["randomness"] == {"policy": "seeded", "seed": 1}
    assert out["dataset_size"] == max(out["noisy_count"], 1)
    again = release_count(10, epsilon=0.01, sensitivity=5, seed=1)
    assert again == out  # reproducible when seeded
    private = release_count(10, epsilon=0.5, sensitivity=1)
    assert private["randomness"] == {"policy": "csprng", "seed": None}
    with pytest.raises(InvalidParameterError, match="epsilon"):
        release_count(10, epsilon=float("nan"), sensitivity=1)
    with pytest.raises(InvalidParameterError, match="true_count"):
        release_count(-1, epsilon=1.0, sensitivity=1)


# ------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("epsilon, k", [(0.05, 1), (0.3, 8), (2.0, 3)])
def test_count_is_exactly_epsilon_zero(epsilon, k):
    unit = PrivacyUnit(name="user", cap=k, capping="random" if k > 1 else None) if k > 1 else PrivacyUnit.example()
    for delta in (0.0, 1e-9, 1e-3):
        g = account(DiscreteLaplaceCount(epsilon=epsilon, sensitivity=k), delta=delta, adjacency="add-remove",
                    unit=unit)
        assert g.epsilon == epsilon and g.delta == delta and g.method == "exact" and g.bound == "exact"
    # dp_accounting's own PLD of DiscreteLaplaceDpEvent agrees
    assert math.isclose(reference_discrete_laplace_epsilon(epsilon=epsilon, sensitivity=k, delta=0.0), epsilon,
                        rel_tol=1e-9)
    # and the definition: the largest log ratio of the pmfs of counts K apart is epsilon, attained
    z = np.arange(-50 * k, 50 * k + 1)
    ratio = np.log(discrete_laplace_pmf(z, epsilon=epsilon, sensitivity=k)
                   / discrete_laplace_pmf(z - k, epsilon=epsilon, sensitivity=k))
    assert math.isclose(np.max(np.abs(ratio)), epsilon, rel_tol=1e-9)


def test_a_count_drawn_for_one_row_costs_k_times_for_a_unit_of_k():
    g = account(DiscreteLaplaceCount(epsilon=0.2, sensitivity=1), delta=0.0, adjacency="add-remove",
                unit=PrivacyUnit(name="user", cap=5, capping="random"))
    assert math.isclose(g.epsilon, 1.0)
    with pytest.raises(UnsupportedError, match="does not apply"):
        account(DiscreteLaplaceCount(epsilon=0.2, sensitivity=1), delta=0.0, adjacency="add-remove", method="pld")


def test_mechanism_round_trips_and_validates():
    m = DiscreteLaplaceCount(epsilon=0.25, sensitivity=4)
    assert mechanism_from_dict(mechanism_to_dict(m)) == m and m.noise_parameter == 0.0625
    for bad in (dict(epsilon=0.0, sensitivity=1), dict(epsilon=math.inf, sensitivity=1),
                dict(epsilon=1.0, sensitivity=0), dict(epsilon=1.0, sensitivity=1.5)):
        with pytest.raises(InvalidParameterError):
            DiscreteLaplaceCount(**bad)


# ------------------------------------------------------------------------------ plans


def test_plan_accounts_the_count_first_and_trains_on_the_rest(plan):
    count, sgd = plan.phases
    assert isinstance(count, CountPhase) and isinstance(sgd, DPSGDPhase) and plan.count is count
    assert (count.guarantee.epsilon, count.guarantee.delta) == (0.1, 0.0) and count.params.dataset_size == 100_003
    assert sgd.target_epsilon == plan.run_epsilon and plan.run_epsilon + 0.1 <= 4.0
    assert plan.total.epsilon == math.fsum([0.1, sgd.guarantee.epsilon]) <= 4.0
    assert plan.total.delta == sgd.guarantee.delta <= 1e-6
    assert plan.total_pld.epsilon < plan.total.epsilon and plan.total_pld.delta == 1e-6
    assert sgd.params.sampling_rate == 1000 / 100_003  # q from the DP count
    assert verify_plan(plan).ok


@pytest.mark.parametrize("release", [0.1, 0.5, 1.5])
def test_pld_total_matches_dp_accounting_composing_the_discrete_laplace(release):
    """The count's losses mixed exactly into the fast PLD against dp_accounting's own composition."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    p = build_plan(scenario(release=release))
    m = p.dpsgd.mechanism
    ref = pld.from_gaussian_mechanism(m.noise_multiplier, sampling_prob=m.sampling_rate,
                                      value_discretization_interval=1e-4).self_compose(m.steps)
    ref = ref.compose(pld.from_discrete_laplace_mechanism(parameter=release, sensitivity=1,
                                                          value_discretization_interval=1e-4))
    want = ref.get_epsilon_for_delta(1e-6)
    # the same composition to 1e-5; ours is the pessimistic side (its FFT rounding is bounded and added)
    assert p.total_pld.method == "pld" and want * (1 - 1e-9) <= p.total_pld.epsilon <= want * (1 + 1e-5)
    assert p.dpsgd.guarantee.epsilon < p.total_pld.epsilon < p.total.epsilon


def test_pld_total_of_a_user_level_count_lies_between_its_parts():
    p = build_plan(scenario(cap=4))
    assert p.dpsgd.guarantee.epsilon < p.total_pld.epsilon < p.total.epsilon <= 4.0
    # the same epsilon for a unit of 4 rows needs 4 times the noise scale of a count of rows
    one = build_plan(scenario(cap=1))
    assert p.phases[0].guarantee.epsilon == one.phases[0].guarantee.epsilon == 0.1
    assert p.phases[0].params.sensitivity == 4 and p.phases[0].mechanism.noise_parameter == 0.1 / 4


@settings(max_examples=12, deadline=None)
@given(eps=st.floats(0.5, 8.0), share=st.floats(0.001, 0.5), cap=st.sampled_from([1, 3]))
def test_any_count_plan_meets_its_budget(eps, share, cap):
    p = build_plan(scenario(eps=eps, release=eps * share, cap=cap))
    assert p.phases[0].guarantee.epsilon == eps * share
    assert p.total.epsilon <= eps and p.guarantee.epsilon <= eps  # no slack needed: the split rounds down
    assert p.total_pld.epsilon <= p.total.epsilon


def test_plans_without_a_count_are_unchanged():
    p = build_plan(scenario(release=None))
    assert p.count is None and "size_release_epsilon" not in p.to_json()
    assert [type(x) for x in p.phases] == [DPSGDPhase] and p.run_epsilon == 4.0


@pytest.mark.parametrize("kwargs, error, fragment", [
    (dict(adjacency="replace-one"), InvalidParameterError, "N is public"),
    (dict(release=4.0), InvalidParameterError, "must be below [budget].epsilon"),
    (dict(release=-0.1), InvalidParameterError, "size_release_epsilon"),
    (dict(release=float("nan")), InvalidParameterError, "size_release_epsilon"),
])
def test_bad_size_release_is_refused(kwargs, error, fragment):
    with pytest.raises(error, match=r"size_release_epsilon") as exc:
        scenario(**kwargs)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_rr_under_replace_one_refuses_a_dp_count():
    from budgetplan.scenario import examples

    text = open(examples.path("rr-impression")).read()
    with pytest.raises(InvalidParameterError, match="add-remove adjacency only"):
        parse_scenario(text.replace("[data]\n", "[data]\nsize_release_epsilon = 0.1\n"))


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(extra="[tuning]\nconfigurations = 4\n"), "[tuning]"),
    (dict(dpsgd_extra='sampling = "truncated-poisson"\nmax_batch_size = 1500'), "exact N"),
])
def test_what_needs_the_exact_n_is_unsupported(kwargs, fragment):
    with pytest.raises(UnsupportedError) as exc:
        build_plan(scenario(**kwargs))
    assert fragment in str(exc.value)


def test_plan_json_round_trips_with_its_count_phase(plan):
    data = json.loads(plan.to_json())
    assert data["phases"][0]["name"] == "count" and data["scenario"]["size_release_epsilon"] == 0.1
    assert data["phases"][0]["mechanism"] == {"type": "DiscreteLaplaceCount", "epsilon": 0.1, "sensitivity": 1}
    again = Plan.from_json(plan.to_json())
    assert again.sha256 == plan.sha256 and again.count == plan.count
    entry = phase_to_dict(plan.count)
    assert phase_from_dict(entry) == plan.count
    with pytest.raises(InvalidParameterError, match="unknown field"):
        phase_from_dict({**entry, "parameters": {**entry["parameters"], "true_count": 5}})
    with pytest.raises(InvalidParameterError, match="pure DP"):
        phase_from_dict({**entry, "target_delta": 1e-9})


def _rehash(data: dict) -> Plan:
    body = {k: v for k, v in data.items() if k != "sha256"}
    body["sha256"] = hashlib.sha256(canonical_json(body).encode("ascii")).hexdigest()
    return Plan.from_json(json.dumps(body, sort_keys=True, indent=2, ensure_ascii=True) + "\n")


def _edit(plan, edit) -> list[str]:
    data = json.loads(plan.to_json())
    edit(data)
    return verify_plan(_rehash(data)).problems


def test_verify_detects_an_edited_count_phase(plan):
    def cheaper_mechanism(d):
        d["phases"][0]["mechanism"]["epsilon"] = 0.05

    def cheaper_everywhere_but_the_scenario(d):
        c = d["phases"][0]
        c["mechanism"]["epsilon"] = c["parameters"]["epsilon"] = c["target_epsilon"] = 0.05
        c["guarantee"]["epsilon"] = 0.05
        c["parameters"]["noise_std"] = math.sqrt(2 * math.exp(-0.05)) / -math.expm1(-0.05)

    def count_dropped(d):
        d["phases"] = d["phases"][1:]
        d["total"]["basic"] = d["phases"][0]["guarantee"]

    def other_n(d):
        d["phases"][0]["parameters"]["dataset_size"] += 1

    def count_guarantee(d):
        d["phases"][0]["guarantee"]["epsilon"] = 0.01

    for edit, fragment in ((cheaper_mechanism, "mechanism.epsilon"),
                           (cheaper_everywhere_but_the_scenario, "vs scenario"),
                           (count_dropped, "first phase"),
                           (other_n, "dataset_size"),
                           (count_guarantee, "guarantee.epsilon")):
        problems = _edit(plan, edit)
        assert any(fragment in p for p in problems), (edit.__name__, problems)


def test_a_count_phase_without_a_scenario_count_is_refused(plan):
    def scenario_forgets(d):
        del d["scenario"]["size_release_epsilon"]
    assert any("states no [data].size_release_epsilon" in p for p in _edit(plan, scenario_forgets))


def test_statement_says_n_is_a_dp_count(plan):
    text = render_statement(plan)
    flat = " ".join(text.split())
    assert "N = 100003 is a differentially private count" in flat
    assert "exp(-0.1 |z| / 1)" in flat and "Planned to (0.1, 0); accounted (0.1, 0) by exact" in flat
    assert "is a DP estimate of the row count" in flat and "so the model reveals only N" in flat
    assert "is treated as public" not in flat and "no run record has an entry for it" in flat
    assert "private/ledger.jsonl" in flat
    public = " ".join(render_statement(build_plan(scenario(release=None))).split())
    assert "is treated as public" in public and "differentially private count" not in public


# ---------------------------------------------------------------------------------- CLI


def test_cli_plan_json_shows_the_count_phase(runner, tmp_path):
    from budgetplan.cli import cli

    path = tmp_path / "s.toml"
    path.write_text('[budget]\nepsilon = 2.0\ndelta = 1e-6\n[privacy]\nadjacency = "add-remove"\n[data]\n'
                    'dataset_size = 5000\nsize_release_epsilon = 0.25\n[algorithm]\nname = "dpsgd"\n[dpsgd]\n'
                    'batch_size = 100\nsteps = 10\nclipping_norm = 1.0\n')
    out = runner.invoke(cli, ["plan", str(path), "--output", str(tmp_path / "plan.json"), "--json"])
    assert out.exit_code == 0, out.output
    written = json.loads((tmp_path / "plan.json").read_text())
    assert [p["name"] for p in written["phases"]] == ["count", "dpsgd", "calibration"]  # calibrated by default
    assert written["phases"][0]["guarantee"]["epsilon"] == 0.25
    human = runner.invoke(cli, ["show", str(tmp_path / "plan.json")])
    assert human.exit_code == 0 and "Phase 1: count" in human.stdout and "noise std" in human.stdout
    from budgetplan.plan import load_plan
    from budgetplan.report.plots import arm_of

    assert arm_of(load_plan(tmp_path / "plan.json")) == ("DP-SGD", None)
    path.with_name("r.toml").write_text(path.read_text().replace("add-remove", "replace-one"))
    bad = runner.invoke(cli, ["plan", str(path.with_name("r.toml"))])
    assert bad.exit_code == 2 and "size_release_epsilon" in bad.stderr and bad.stderr.strip().count("\n") == 0


def test_an_epsilon_whose_noise_outgrows_any_dataset_is_refused():
    from budgetplan.dpcount import min_epsilon

    with pytest.raises(InvalidParameterError, match="epsilon must be at least K / 1e"):
        release_count(100, epsilon=1e-300, sensitivity=2)
    assert release_count(100, epsilon=min_epsilon(2), sensitivity=2, seed=1)["noise_std"] > 1e11
