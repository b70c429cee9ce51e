"""account(): every path, the DOMAIN reference values, and the peer-library pitfalls."""

import math

import pytest

from budgetplan import (
    AccountingError,
    Composition,
    GaussianRelease,
    InvalidParameterError,
    PoissonDPSGD,
    PrivacyUnit,
    RandomizedResponse,
    TruncatedPoissonDPSGD,
    UnsupportedError,
    account,
    account_phases,
)
from budgetplan.accounting.guarantee import Guarantee

Q_CRITEO = 16384 / 32e6


def dpsgd(sigma, q, steps):
    return PoissonDPSGD(noise_multiplier=sigma, sampling_rate=q, steps=steps)


# DOMAIN.md section 3 (dp-accounting 0.6.0): (q, sigma, steps, delta) -> (RDP, PLD pessimistic)
REFERENCE = [
    ((256 / 60000, 1.1, 14063, 1e-5), 2.597, 2.382),
    ((0.04, 1.5, 2250, 1e-5), 7.329, 6.769),
    ((Q_CRITEO, 1.0, int(3 * 32e6 / 16384), 1e-7), 0.982, 0.2385),
    ((Q_CRITEO, 0.6, int(64 * 32e6 / 16384), 1e-7), 5.385, 4.594),
]


@pytest.mark.parametrize("args, rdp, pld", REFERENCE)
def test_reference_values(args, rdp, pld):
    q, sigma, steps, delta = args
    decimals = len(str(pld).split(".")[1])
    g_pld = account(dpsgd(sigma, q, steps), delta=delta, adjacency="add-remove", method="pld")
    g_rdp = account(dpsgd(sigma, q, steps), delta=delta, adjacency="add-remove", method="rdp")
    assert round(g_pld.epsilon, decimals) == pld
    assert round(g_rdp.epsilon, 3) == rdp
    assert g_pld.bound == "upper" and g_pld.discretization == 1e-4
    assert "arXiv:2004.00010" in g_rdp.conversion


def test_prv_band_contains_pld():
    g_prv = account(dpsgd(1.1, 256 / 60000, 14063), delta=1e-5, adjacency="add-remove", method="prv")
    g_pld = account(dpsgd(1.1, 256 / 60000, 14063), delta=1e-5, adjacency="add-remove", method="pld")
    low, up = g_prv.epsilon_range
    assert low <= g_pld.epsilon <= up + 1e-3
    assert g_prv.epsilon == up


def test_guarantee_carries_everything():
    g = account(dpsgd(1.0, 0.01, 100), delta=1e-6, adjacency="add-remove")
    assert isinstance(g, Guarantee)
    assert g.adjacency.value == "add-remove" and g.unit == PrivacyUnit.example()
    versions = dict(g.versions)
    assert versions["dp-accounting"] == "0.6.0" and versions["prv-accountant"] == "0.2.0"
    assert Guarantee.from_dict(g.to_dict()) == g


# ------------------------------------------------------------------- RR


def test_rr_exact_pld_rdp_agree():
    rr = RandomizedResponse(epsilon=0.5)
    unit = PrivacyUnit.capped(4)
    exact = account(rr, delta=1e-6, adjacency="replace-one", unit=unit)
    pld = account(rr, delta=1e-6, adjacency="replace-one", unit=unit, method="pld")
    rdp = account(rr, delta=1e-6, adjacency="replace-one", unit=unit, method="rdp")
    assert exact.bound == "exact" and exact.epsilon <= 2.0
    # pessimistic rounding moves each copy's loss up by at most one grid step (1e-4)
    assert exact.epsilon <= pld.epsilon <= exact.epsilon + 4 * 1e-4 + 1e-6
    assert exact.epsilon <= rdp.epsilon
    assert account(rr, delta=0.0, adjacency="replace-one", unit=unit).epsilon == pytest.approx(2.0)


def test_rr_is_label_dp_only():
    with pytest.raises(UnsupportedError, match="replace-one"):
        account(RandomizedResponse(epsilon=1.0), delta=0.0, adjacency="add-remove")


# ------------------------------------------------------------- Gaussian


def test_gaussian_sensitivity_is_stated_not_doubled():
    """dp_accounting pitfall: REPLACE_ONE treats a GaussianDpEvent as sensitivity 2.

    nm=1, delta=1e-5: dp_accounting reports 9.997 under REPLACE_ONE; a WALR label change of
    sensitivity 1 costs 4.377 under either relation.
    """
    import dp_accounting as dpa
    from dp_accounting.pld import pld_privacy_accountant as pa

    acc = pa.PLDAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.GaussianDpEvent(1.0))
    assert acc.get_epsilon(1e-5) == pytest.approx(9.997, abs=1e-3)
    release = GaussianRelease(noise_std=1.0, sensitivity=1.0)
    for adjacency in ("replace-one", "add-remove"):
        for method in ("exact", "pld", "rdp"):
            g = account(release, delta=1e-5, adjacency=adjacency, method=method)
            assert g.epsilon == pytest.approx(4.377, abs=0.005 if method != "rdp" else 0.6)
            assert g.epsilon < 9.0


def test_gaussian_unit_scales_sensitivity_exactly():
    release = GaussianRelease(noise_std=10.0, sensitivity=0.5)
    unit = account(release, delta=1e-6, adjacency="replace-one", unit=PrivacyUnit.capped(4))
    same = account(GaussianRelease(noise_std=10.0, sensitivity=2.0), delta=1e-6, adjacency="replace-one")
    assert unit.epsilon == same.epsilon


def test_classical_is_flagged_outside_its_validity():
    low_noise = account(GaussianRelease(noise_std=1.0, sensitivity=1.0), delta=1e-5,
                        adjacency="replace-one", method="classical")
    assert low_noise.epsilon >= 1 and low_noise.bound == "invalid"
    assert any("NOT a guarantee" in n for n in low_noise.notes)
    high_noise = account(GaussianRelease(noise_std=10.0, sensitivity=1.0), delta=1e-5,
                         adjacency="replace-one", method="classical")
    assert high_noise.epsilon < 1 and high_noise.bound == "upper"


# ---------------------------------------------------------- user level


def test_mixture_beats_group_privacy_reference():
    # DOMAIN.md section 2: sigma=1, 3 epochs, q=5.12e-4, K=8: 2.18 instead of 15.9 (group over RDP)
    mech = dpsgd(1.0, Q_CRITEO, 5859)
    unit = PrivacyUnit.capped(8)
    mog = account(mech, delta=1e-7, adjacency="add-remove", unit=unit)
    grp = account(mech, delta=1e-7, adjacency="add-remove", unit=unit, method="rdp", unit_accounting="group")
    assert mog.method == "mixture-of-gaussians(pld)" and round(mog.epsilon, 2) == 2.18
    assert grp.method == "group(rdp)" and round(grp.epsilon, 1) == 15.9


def test_mixture_with_k1_is_example_level():
    mech = dpsgd(1.2, 0.01, 200)
    one = account(mech, delta=1e-6, adjacency="add-remove", unit=PrivacyUnit.capped(1))
    ex = account(mech, delta=1e-6, adjacency="add-remove")
    assert one.epsilon == pytest.approx(ex.epsilon, rel=1e-9)


def test_user_level_refusals_name_the_alternative():
    mech = dpsgd(1.0, 0.01, 10)
    unit = PrivacyUnit.capped(3)
    with pytest.raises(UnsupportedError, match="unit_accounting 'group'"):
        account(mech, delta=1e-6, adjacency="add-remove", unit=unit, method="rdp")
    for method in ("rdp", "prv"):
        with pytest.raises(UnsupportedError, match="add-remove only"):
            account(mech, delta=1e-6, adjacency="replace-one", unit=unit, method=method)
    grp = account(mech, delta=1e-6, adjacency="replace-one", unit=unit, unit_accounting="group")
    assert grp.method == "group(pld)" and math.isfinite(grp.epsilon)


# ---------------------------------------------------------- adjacency


def test_replace_one_dpsgd_costs_more_and_only_pld_does_it():
    mech = dpsgd(1.0, 0.01, 500)
    ar = account(mech, delta=1e-6, adjacency="add-remove")
    ro = account(mech, delta=1e-6, adjacency="replace-one")
    assert ro.epsilon > ar.epsilon
    for method in ("rdp", "prv"):
        with pytest.raises(UnsupportedError, match="add-remove only"):
            account(mech, delta=1e-6, adjacency="replace-one", method=method)


def test_truncated_poisson_close_to_poisson_when_truncation_is_rare():
    n, q = 100_000, 0.001
    plain = account(dpsgd(1.0, q, 300), delta=1e-5, adjacency="add-remove")
    trunc = account(TruncatedPoissonDPSGD(noise_multiplier=1.0, sampling_rate=q, steps=300, dataset_size=n,
                                          max_batch_size=200), delta=1e-5, adjacency="add-remove")
    assert trunc.epsilon == pytest.approx(plain.epsilon, rel=0.02)
    with pytest.raises(UnsupportedError, match="method 'rdp' does not apply"):
        account(TruncatedPoissonDPSGD(noise_multiplier=1.0, sampling_rate=q, steps=3, dataset_size=n,
                                      max_batch_size=200), delta=1e-5, adjacency="add-remove", method="rdp")


# --------------------------------------------------------- composition


def hybrid(eps1=1.5, sigma=1.0, steps=300):
    return Composition(phases=(RandomizedResponse(epsilon=eps1), dpsgd(sigma, 0.01, steps)))


def test_hybrid_basic_composition_adds():
    h = hybrid()
    phases = account_phases(h, delta=1e-6, adjacency="replace-one")
    basic = account(h, delta=1e-6, adjacency="replace-one", method="basic")
    assert phases[0].epsilon == 1.5 and phases[0].delta == 0.0
    assert phases[1].delta == 1e-6
    assert basic.epsilon == pytest.approx(phases[0].epsilon + phases[1].epsilon)
    assert basic.delta == 1e-6


def test_hybrid_pld_composition_is_tighter_than_basic():
    h = hybrid()
    basic = account(h, delta=1e-6, adjacency="replace-one", method="basic")
    pld = account(h, delta=1e-6, adjacency="replace-one", method="pld")
    assert pld.epsilon < basic.epsilon


def test_pld_composition_needs_one_adjacency():
    with pytest.raises(UnsupportedError, match="replace-one"):
        account(hybrid(), delta=1e-6, adjacency="add-remove", method="pld")


# ---------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta=math.nan), "delta must be in"),
    (dict(delta=1.0), "delta must be in"),
    (dict(delta=-1e-9), "delta must be in"),
    (dict(delta=1e-5, method="moments"), "method must be one of"),
    (dict(delta=1e-5, method="exact"), "method 'exact' does not apply to PoissonDPSGD"),
    (dict(delta=1e-5, discretization=0.0), "discretization must be"),
])
def test_bad_input_is_refused_before_any_accounting(kwargs, match):
    with pytest.raises((InvalidParameterError, UnsupportedError), match=match):
        account(dpsgd(1.0, 0.01, 10), adjacency="add-remove", **kwargs)


def test_nan_never_reaches_rdp():
    """dp_accounting pitfall: RdpAccountant returns eps = 0 for a NaN noise multiplier or delta."""
    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(math.nan)), 100))
    assert acc.get_epsilon(1e-5) == 0  # the peer's silent failure
    with pytest.raises(InvalidParameterError, match="noise_multiplier must be a finite number > 0, got nan"):
        dpsgd(math.nan, 0.01, 100)
    with pytest.raises(InvalidParameterError, match="delta must be in"):
        account(dpsgd(1.0, 0.01, 100), delta=math.nan, adjacency="add-remove", method="rdp")


def test_prv_failures_become_one_line_accounting_errors():
    """prv_accountant raises at some settings; we report one line, never a traceback."""
    with pytest.raises(AccountingError, match="prv_accountant failed") as err:
        account(dpsgd(0.3, 0.1, 1000), delta=1e-5, adjacency="add-remove", method="prv")
    assert "\n" not in str(err.value)
    with pytest.raises(AccountingError, match="prv_accountant failed"):
        account(dpsgd(2.0, 0.01, 100), delta=1e-15, adjacency="add-remove", method="prv", prv_eps_error=0.01)


def test_pessimistic_not_optimistic():
    """dp_accounting's optimistic PLD estimate collapses to 0 at many steps; ours never does."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    optimistic = pld.from_gaussian_mechanism(1.0, sampling_prob=Q_CRITEO, pessimistic_estimate=False)
    assert optimistic.self_compose(5859).get_epsilon_for_delta(1e-7) == 0.0
    g = account(dpsgd(1.0, Q_CRITEO, 5859), delta=1e-7, adjacency="add-remove")
    assert g.bound == "upper" and g.epsilon == pytest.approx(0.2385, abs=1e-4)


def test_library_versions_agree_with_the_installed_metadata():
    """numpy's and scipy's versions are read from the loaded modules (no metadata scan); they must be
    what the installed distributions say, and the libraries not loaded are still looked up."""
    import importlib.metadata

    import numpy
    import scipy

    from budgetplan.accounting.guarantee import library_versions

    versions = dict(library_versions())
    assert versions["numpy"] == numpy.__version__ == importlib.metadata.version("numpy")
    assert versions["scipy"] == scipy.__version__ == importlib.metadata.version("scipy")
    assert versions["dp-accounting"] == importlib.metadata.version("dp-accounting")
