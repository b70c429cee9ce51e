"""``budgetplan export --to opacus``: the plan's sigma, C and steps, Opacus's sample rate
(never above the plan's q, so never less private: checked with dp_accounting), the caveats,
and the plans Opacus cannot execute refused in one line."""

from __future__ import annotations

import json
import math
import re

import pytest

from budgetplan.errors import UnsupportedError
from budgetplan.planning.planner import build_plan
from budgetplan.report.export import opacus_settings
from budgetplan.scenario import examples, parse_scenario


def load_example(name):
    return parse_scenario(examples.text(name))


def _dpsgd(*, n=10_007, batch=100, steps=300, extra="", privacy='unit = "impression"', data_extra=""):
    return build_plan(parse_scenario(f"""name = "export"
[budget]
epsilon = 3.0
delta = 1e-6
[privacy]
adjacency = "add-remove"
{privacy}
[data]
dataset_size = {n}
{data_extra}
[algorithm]
name = "dpsgd"
[dpsgd]
batch_size = {batch}
steps = {steps}
clipping_norm = 2.0
{extra}
[calibration]  # off: the export's DP-SGD phase alone, at the plan's whole delta
share = 0
"""))


def test_the_plans_noise_clipping_and_steps_are_exported():
    plan = _dpsgd()
    p = plan.dpsgd.params
    out = opacus_settings(plan)
    assert out["make_private"] == {"noise_multiplier": p.noise_multiplier, "max_grad_norm": 2.0,
                                   "poisson_sampling": True}
    assert out["max_steps"] == 300 and out["data_loader"]["batch_size"] == 100
    assert out["data_loader"]["batches_per_epoch"] == math.ceil(10_007 / 100) == 101
    assert out["opacus_sample_rate"] == 1 / 101 < out["plan_sampling_rate"] == p.sampling_rate
    assert out["epochs"] == pytest.approx(300 / 101)
    assert out["phase_guarantee"]["epsilon"] == plan.dpsgd.guarantee.epsilon
    assert any("below the plan's" in c for c in out["caveats"])
    assert not any("below the plan's" in c for c in opacus_settings(_dpsgd(n=10_000))["caveats"])  # B divides N


def test_opacus_sample_rate_is_never_less_private_than_the_plan():
    """An independent check of the export's claim: dp_accounting's PLD of Poisson-subsampled
    Gaussian steps at Opacus's rate 1/ceil(N/B) is at most the epsilon at the plan's q."""
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pa

    out = opacus_settings(_dpsgd())
    sigma, steps = out["make_private"]["noise_multiplier"], out["max_steps"]

    def eps(q):
        acc = pa.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
                               value_discretization_interval=1e-4)
        acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
        return acc.get_epsilon(1e-6)

    at_opacus, at_plan = eps(out["opacus_sample_rate"]), eps(out["plan_sampling_rate"])
    assert at_opacus <= at_plan
    assert at_plan == pytest.approx(out["phase_guarantee"]["epsilon"], rel=2e-3)  # and the plan's figure holds


def test_hybrid_caveats_name_the_frozen_tower_the_rr_phase_and_the_calibration():
    plan = build_plan(load_example("synthetic-hybrid"))
    out = opacus_settings(plan)
    text = " ".join(out["caveats"])
    assert out["trainable"] == "all but the non-sensitive tower" and "requires_grad=False" in text
    assert "phase 2 of Hybrid" in text and "calibration" in text
    assert out["plan_guarantee"]["epsilon"] == plan.guarantee.epsilon > out["phase_guarantee"]["epsilon"]


def test_a_capped_unit_is_a_caveat():
    import dataclasses

    plan = _dpsgd()  # a capped plan's accounting is slow to plan: the export reads the cap from the phase
    phase = dataclasses.replace(plan.dpsgd, params=dataclasses.replace(plan.dpsgd.params, cap=4, capping="random"))
    plan = dataclasses.replace(plan, phases=(phase,))
    assert any("K = 4" in c and "(random)" in c for c in opacus_settings(plan)["caveats"])


def _truncated():
    """A plan whose DP-SGD phase samples by truncated Poisson (its accounting is slow to plan:
    the export reads the phase's parameters only)."""
    import dataclasses
    from types import SimpleNamespace

    plan = _dpsgd()
    params = dataclasses.replace(plan.dpsgd.params, sampling="truncated-poisson", max_batch_size=150)
    return SimpleNamespace(dpsgd=SimpleNamespace(params=params), count=None, tuning=None, scenario=plan.scenario)


def _units_split():
    from tests.test_units_split import plan_of

    return plan_of()


@pytest.mark.parametrize("plan, what", [
    (lambda: build_plan(load_example("rr-impression")), "no DP-SGD phase"),
    (lambda: _truncated(), "truncated-poisson"),
    (lambda: _dpsgd(data_extra="size_release_epsilon = 0.1"), "DP count"),
    (lambda: _dpsgd(extra="[tuning]\nconfigurations = 4"), "[tuning]"),
    (lambda: _units_split(), "splits the units"),
])
def test_what_opacus_cannot_execute_is_refused(plan, what):
    with pytest.raises(UnsupportedError, match=re.escape(what)):
        opacus_settings(plan())


def test_cli_export(tmp_path, runner):
    from budgetplan.cli import cli

    path = tmp_path / "plan.json"
    path.write_text(_dpsgd().to_json())
    human = runner.invoke(cli, ["export", str(path)])
    assert human.exit_code == 0, human.output
    assert "noise_multiplier=" in human.stdout and "poisson_sampling=True" in human.stdout
    as_json = runner.invoke(cli, ["export", str(path), "--to", "opacus", "--json"])
    assert json.loads(as_json.stdout)["max_steps"] == 300
    rr = tmp_path / "rr.json"
    rr.write_text(build_plan(load_example("rr-impression")).to_json())
    bad = runner.invoke(cli, ["export", str(rr)])
    assert bad.exit_code == 2 and "no DP-SGD phase" in bad.stderr and bad.stderr.strip().count("\n") == 0
